// Parity tests of the wgmma prefill attention (prefill_attention_sm90.h)
// against the CPU reference (kernels/cpu/reference_ops.h), with the portable
// PagedAttentionPrefill run on the same data as a control. Random bf16
// q/K/V (the reference sees the same bf16 values widened to fp32), shuffled
// block tables whose unused entries hold out-of-range block ids (a read past
// a sequence's blocks faults), padded q/out token strides whose padding must
// stay untouched. Tolerance (as the portable kernel's test): the output is
// bf16 and P is rounded to bf16 before the P.V product, so
// |gpu - ref| <= 2^-7 * max|v| + 1e-3.
//
// The kernel's mbarrier waits give up after 4 s and those threads write NaN
// rows, so a broken barrier protocol shows as mismatches after a few
// seconds rather than a hang.
//
// On a mismatch the test prints the first few bad elements with their
// coordinates in the kernel's tiling (128-row query tile, warpgroup, warp,
// row inside the warp's 16, 64-column block of head_dim) and a count of the
// bad elements per coordinate, so a layout or descriptor error can be told
// from one run. TESSERA_SM90_TEST_VERBOSE=1 prints up to 40 elements.
//
// The kernel tests skip unless the device is SM 9.0 and this binary carries
// the sm_90a image; the validation tests run anywhere.
//
// Thread-safety: single-threaded test code.
#include "kernels/cuda/prefill_attention_sm90.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cpu/op_args.h"
#include "kernels/cpu/reference_ops.h"
#include "kernels/cuda/attention_test_util.h"
#include "kernels/cuda/paged_attention.h"

namespace tessera::kernels::cuda {
namespace {

using attention_testing::DeviceArray;
using attention_testing::ExpectGraphReplayMatches;
using attention_testing::FromBf16;
using attention_testing::kSentinel;
using attention_testing::MakeProblem;
using attention_testing::Problem;
using attention_testing::ProblemShape;
using attention_testing::ToBf16;

// Empty when the wgmma kernel can run here, else why not.
std::string SkipReason() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) return absl::StrCat("no CUDA device: ", cudaGetErrorString(err));
  if (count == 0) return "no CUDA device on this machine";
  if (cudaSetDevice(0) != cudaSuccess) return "cudaSetDevice(0) failed";
  std::string why;
  if (!PrefillAttentionSm90Available(&why)) return why;
  return "";
}

#define SKIP_UNLESS_SM90A()                      \
  do {                                           \
    const std::string reason = SkipReason();     \
    if (!reason.empty()) GTEST_SKIP() << reason; \
  } while (0)

bool Verbose() {
  const char* v = std::getenv("TESSERA_SM90_TEST_VERBOSE");
  return v != nullptr && v[0] != '\0' && v[0] != '0';
}

struct Case : ProblemShape {
  std::string name;
  bool via_graph = false;  // also replay the call from a captured CUDA graph
};
// q_range (ProblemShape) 0: every score equal (isolates P.V and the masking).

// Compares `out` with `ref`; returns the number of bad elements and prints
// diagnostics for the first ones.
int Compare(const Case& c, const std::vector<int32_t>& qsl, const std::vector<uint16_t>& out,
            const std::vector<float>& ref, int64_t out_stride, float tol, const char* who,
            float* worst_passing) {
  const int d = c.head_dim;
  const int num_seqs = static_cast<int>(c.seq_lens.size());
  const int tokens = qsl.back();
  const int show = Verbose() ? 40 : 6;
  int bad = 0;
  float worst = 0.f;
  std::map<std::string, int> histogram;
  for (int s = 0; s < num_seqs; ++s) {
    const int ctx = c.seq_lens[s] - c.q_lens[s];
    for (int tok = qsl[s]; tok < qsl[s + 1]; ++tok) {
      const int i_row = tok - qsl[s];
      for (int64_t i = 0; i < out_stride; ++i) {
        const uint16_t got_bits = out[tok * out_stride + i];
        if (i >= int64_t{c.num_heads} * d) {
          if (got_bits != kSentinel && ++bad <= show) {
            ADD_FAILURE() << who << ": token " << tok << " padding element " << i
                          << " was overwritten";
          }
          continue;
        }
        const float got = FromBf16(got_bits);
        const float want = ref[tok * int64_t{c.num_heads} * d + i];
        const float err = std::fabs(got - want);
        if (err <= tol) {
          worst = std::max(worst, err);
          continue;
        }
        const int head = static_cast<int>(i / d);
        const int dim = static_cast<int>(i % d);
        const int tile_row = i_row % 128;
        if (++bad <= show) {
          ADD_FAILURE() << who << ": seq " << s << " (ctx " << ctx << ", q_len " << c.q_lens[s]
                        << ") query row " << i_row << " (position " << ctx + i_row << "; q tile "
                        << i_row / 128 << ", warpgroup " << tile_row / 64 << ", warp "
                        << (tile_row % 64) / 16 << ", row-in-warp " << tile_row % 16 << ") head "
                        << head << " dim " << dim << " (col block " << dim / 64 << "): got " << got
                        << " want " << want << " (tol " << tol << ")";
        }
        ++histogram[absl::StrCat("col block ", dim / 64)];
        ++histogram[absl::StrCat("warpgroup ", tile_row / 64)];
        ++histogram[absl::StrCat("row-in-warp ", tile_row % 16 < 8 ? "0-7" : "8-15")];
        ++histogram[absl::StrCat("dim%8 ", dim % 8)];
        ++histogram[absl::StrCat("q tile ", std::min(i_row / 128, 3), i_row / 128 >= 3 ? "+" : "")];
        ++histogram[absl::StrCat("head ", head)];
        ++histogram[std::string(std::isnan(got) ? "got NaN" : got == 0.f ? "got 0" : "got finite")];
      }
    }
  }
  if (bad > 0) {
    std::string summary;
    for (const auto& [k, n] : histogram) absl::StrAppend(&summary, "\n  ", k, ": ", n);
    ADD_FAILURE() << who << ": " << bad << " bad elements of " << tokens * int64_t{out_stride}
                  << "; per coordinate:" << summary;
  }
  *worst_passing = worst;
  return bad;
}

// Runs case `c` through the wgmma kernel.
void RunCase(const Case& c, uint32_t seed) {
  SCOPED_TRACE(c.name);
  std::mt19937 rng(seed);
  Problem pr;
  ASSERT_NO_FATAL_FAILURE(MakeProblem(c, rng, &pr));
  const int num_seqs = static_cast<int>(c.seq_lens.size());
  const int d = c.head_dim;

  DeviceArray<uint16_t> dq(pr.q_bf), dk(pr.k_bf), dv(pr.v_bf);
  DeviceArray<int32_t> dtable(pr.table_gpu), dseq(pr.seq_lens), dqsl(pr.qsl);
  const std::vector<uint16_t> fresh(static_cast<size_t>(pr.tokens) * pr.out_stride, kSentinel);
  DeviceArray<uint16_t> dout(fresh);
  PagedAttentionParams p;
  p.q = dq.get();
  p.q_token_stride = pr.q_stride;
  p.k_cache = dk.get();
  p.v_cache = dv.get();
  p.block_tables = dtable.get();
  p.block_table_stride = pr.table_stride;
  p.seq_lens = dseq.get();
  p.query_start_loc = dqsl.get();
  p.num_seqs = num_seqs;
  p.num_heads = c.num_heads;
  p.num_kv_heads = c.num_kv_heads;
  p.head_dim = d;
  p.block_size = c.block_size;
  p.scale = pr.args.scale;
  p.max_seq_len = pr.max_len;
  p.max_query_len = *std::max_element(c.q_lens.begin(), c.q_lens.end());
  p.out = dout.get();
  p.out_token_stride = pr.out_stride;

  const float tol = std::ldexp(pr.max_abs_v, -7) + 1e-3f;

  // Control: the portable kernel on the same inputs.
  ASSERT_TRUE(PagedAttentionPrefill(p, nullptr).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << cudaGetErrorString(cudaGetLastError());
  float worst_portable = 0.f;
  const int bad_portable =
      Compare(c, pr.qsl, dout.ToHost(), pr.ref, pr.out_stride, tol, "portable", &worst_portable);
  EXPECT_EQ(bad_portable, 0) << "the portable control kernel disagrees with the reference";

  dout.Upload(fresh);
  const absl::Status status = PrefillAttentionSm90(p, nullptr);
  ASSERT_TRUE(status.ok()) << status;
  const cudaError_t sync = cudaDeviceSynchronize();
  ASSERT_EQ(sync, cudaSuccess) << "kernel fault: " << cudaGetErrorString(sync);
  const std::vector<uint16_t> out = dout.ToHost();
  float worst = 0.f;
  const int bad = Compare(c, pr.qsl, out, pr.ref, pr.out_stride, tol, "sm90", &worst);
  EXPECT_EQ(bad, 0) << "mismatches (worst passing error " << worst << ", portable "
                    << worst_portable << ")";
  if (Verbose()) {
    std::printf("[%s] worst error sm90 %.3g portable %.3g (tol %.3g)\n", c.name.c_str(), worst,
                worst_portable, tol);
  }

  if (c.via_graph) {
    // The call captured in a CUDA graph and replayed twice: bitwise the same.
    dout.Upload(fresh);
    ExpectGraphReplayMatches([&](cudaStream_t stream) { return PrefillAttentionSm90(p, stream); },
                             dout, out);
  }
}

// --- Kernel parity (SM 9.0 with sm_90a code only) ------------------------------
// Ordered from the simplest data path to the most general, so the first
// failing test points at the broken piece.

class PrefillAttentionSm90Parity : public ::testing::Test {};

// q = 0: every score is 0, so the output is the mean of V over the visible
// keys. Exercises the K/V gather, the causal mask, the softmax bookkeeping
// and the P.V wgmma (V descriptor, transpose, column blocks), but not Q.K^T.
TEST_F(PrefillAttentionSm90Parity, UniformScoresIsolatePV) {
  SKIP_UNLESS_SM90A();
  uint32_t seed = 10;
  for (int head_dim : {128, 64}) {
    for (int len : {1, 8, 64, 65, 128, 129, 300}) {
      Case c;
      c.head_dim = head_dim;
      c.q_range = 0.f;
      c.seq_lens = {len};
      c.q_lens = {len};
      c.name = absl::StrCat("uniform d", head_dim, " prompt ", len);
      RunCase(c, seed++);
    }
  }
}

// One query tile against one key tile: the S = Q K^T wgmma and the register
// hand-off of P, before multi-tile pipelining matters.
TEST_F(PrefillAttentionSm90Parity, SingleTile) {
  SKIP_UNLESS_SM90A();
  uint32_t seed = 20;
  for (int head_dim : {128, 64}) {
    for (int len : {1, 2, 16, 63, 64, 100, 128}) {
      Case c;
      c.head_dim = head_dim;
      c.seq_lens = {len};
      c.q_lens = {len};
      c.name = absl::StrCat("single tile d", head_dim, " prompt ", len);
      RunCase(c, seed++);
    }
  }
}

TEST_F(PrefillAttentionSm90Parity, SinglePrompts) {
  SKIP_UNLESS_SM90A();
  uint32_t seed = 200;
  for (int head_dim : {128, 64}) {
    for (int len : {15, 17, 65, 127, 129, 255, 256, 257, 300, 383, 384, 385, 640, 1000, 1500}) {
      Case c;
      c.head_dim = head_dim;
      c.seq_lens = {len};
      c.q_lens = {len};
      c.name = absl::StrCat("prefill d", head_dim, " prompt ", len);
      RunCase(c, seed++);
    }
  }
}

TEST_F(PrefillAttentionSm90Parity, ChunksWithEarlierContext) {
  SKIP_UNLESS_SM90A();
  struct Chunk {
    int context, q_len;
  };
  uint32_t seed = 300;
  for (int block_size : {16, 32}) {
    for (int kv_heads : {2, 8}) {  // GQA 4 and plain multi-head (8 heads)
      for (const Chunk& ch : {Chunk{17, 1}, Chunk{16, 16}, Chunk{100, 50}, Chunk{1000, 129},
                              Chunk{63, 200}, Chunk{256, 64}, Chunk{5, 3}, Chunk{127, 1},
                              Chunk{128, 128}, Chunk{129, 383}, Chunk{700, 800}}) {
        Case c;
        c.block_size = block_size;
        c.num_kv_heads = kv_heads;
        c.seq_lens = {ch.context + ch.q_len};
        c.q_lens = {ch.q_len};
        c.name = absl::StrCat("chunk ctx ", ch.context, " q ", ch.q_len, " bs ", block_size,
                              " kv heads ", kv_heads);
        RunCase(c, seed++);
      }
    }
  }
}

TEST_F(PrefillAttentionSm90Parity, MixedBatches) {
  SKIP_UNLESS_SM90A();
  Case c;  // prompts, chunks, a decode-like token and an empty sequence together
  c.q_lens = {1, 5, 64, 130, 0, 77, 1, 260};
  c.seq_lens = {1, 20, 64, 400, 33, 77, 900, 1200};
  c.q_stride_pad = 2 * 2 * 128;  // a fused qkv buffer: k and v after q
  c.out_stride_pad = 16;
  c.name = "mixed gqa4 d128 padded strides";
  c.via_graph = true;
  RunCase(c, 400);

  Case mha = c;
  mha.num_heads = 4;
  mha.num_kv_heads = 4;
  mha.head_dim = 64;
  mha.block_size = 32;
  mha.q_stride_pad = 0;
  mha.via_graph = false;
  mha.name = "mixed mha d64 bs32";
  RunCase(mha, 401);

  Case gqa8;
  gqa8.num_heads = 16;
  gqa8.num_kv_heads = 2;
  gqa8.block_size = 8;
  gqa8.q_lens = {300, 2, 90, 129};
  gqa8.seq_lens = {300, 1002, 150, 129};
  gqa8.name = "mixed gqa8 bs8";
  RunCase(gqa8, 403);

  // Cache blocks smaller than a gather pass (one row per block) and larger
  // than a key tile.
  for (int block_size : {1, 4, 256}) {
    for (int head_dim : {128, 64}) {
      Case odd;
      odd.head_dim = head_dim;
      odd.block_size = block_size;
      odd.q_lens = {200, 1, 129};
      odd.seq_lens = {333, 300, 129};
      odd.name = absl::StrCat("mixed bs", block_size, " d", head_dim);
      RunCase(odd, 404 + block_size + head_dim);
    }
  }
}

// Larger q (scores spread wider): the online-softmax rescaling across tiles.
TEST_F(PrefillAttentionSm90Parity, SharpScores) {
  SKIP_UNLESS_SM90A();
  Case c;
  c.q_range = 8.f;
  c.num_heads = 4;
  c.num_kv_heads = 1;
  c.q_lens = {700, 130};
  c.seq_lens = {700, 500};
  c.name = "sharp scores gqa4";
  RunCase(c, 500);
}

// --- Validation (no device needed) -------------------------------------------

PagedAttentionParams ValidLooking() { return attention_testing::ValidLookingParams(); }

void ExpectInvalid(const PagedAttentionParams& p, const std::string& needle) {
  const absl::Status s = PrefillAttentionSm90(p, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(std::string(s.message()).find(needle), std::string::npos) << s;
}

TEST(PrefillAttentionSm90Validation, RejectsBadParameters) {
  PagedAttentionParams p = ValidLooking();
  p.head_dim = 256;
  EXPECT_FALSE(PrefillAttentionSm90Supports(p));
  ExpectInvalid(p, "head_dim 256");
  p.head_dim = 64;
  EXPECT_TRUE(PrefillAttentionSm90Supports(p));
  p.head_dim = 128;
  EXPECT_TRUE(PrefillAttentionSm90Supports(p));
  // The scale is folded into the exponent after the row maxima: positive only.
  for (float scale : {0.f, -0.088f}) {
    p.scale = scale;
    EXPECT_FALSE(PrefillAttentionSm90Supports(p)) << scale;
    ExpectInvalid(p, "is not positive");
  }
  // Cache blocks of 4 GiB and more: the gather's page strides are 32-bit.
  p = ValidLooking();
  p.num_heads = p.num_kv_heads = 16;
  p.q_token_stride = p.out_token_stride = 16 * 128;
  p.block_size = 1 << 20;
  EXPECT_FALSE(PrefillAttentionSm90Supports(p));
  ExpectInvalid(p, "4294967296 bytes");
  p.block_size = 1 << 19;
  EXPECT_TRUE(PrefillAttentionSm90Supports(p));
  for (const attention_testing::BadParams& bad : attention_testing::CommonBadParams()) {
    p = ValidLooking();
    bad.change(p);
    ExpectInvalid(p, bad.needle);
  }
  p = ValidLooking();
  p.query_start_loc = nullptr;
  ExpectInvalid(p, "non-null");
  p = ValidLooking();
  p.max_query_len = 129;
  ExpectInvalid(p, "max_query_len 129");
}

// Valid parameters on a machine where the kernel cannot run: a clear
// FAILED_PRECONDITION, never a launch.
TEST(PrefillAttentionSm90Validation, UnavailableDeviceIsAPreconditionError) {
  if (SkipReason().empty()) GTEST_SKIP() << "the kernel can run here";
  std::string why;
  EXPECT_FALSE(PrefillAttentionSm90Available(&why));
  EXPECT_FALSE(why.empty());
  const absl::Status s = PrefillAttentionSm90(ValidLooking(), nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
}

}  // namespace
}  // namespace tessera::kernels::cuda
