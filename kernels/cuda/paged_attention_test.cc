// Parity tests of the CUDA paged attention kernels against the CPU
// reference (kernels/cpu/reference_ops.h): random bf16 q/K/V (the reference
// sees the same bf16 values widened to fp32), shuffled block tables whose
// unused entries hold out-of-range block ids (so any read past a
// sequence's blocks faults), and padded q/out token strides whose padding
// must stay untouched. Tolerance: the output is bf16 and P is rounded to
// bf16 before the P.V product, so |gpu - ref| <= 2^-7 * max|v| + 1e-3.
// Two cases also replay the call from a captured CUDA graph (bitwise equal).
// Token trees: each tree token's reference is the CPU reference run on a
// one-token sequence whose cache holds just its context and its ancestor
// path (root first), as the CPU runner's tree attention reads them.
// The parameter validation tests run without a GPU; the kernel tests skip
// when no CUDA device is present.
//
// Thread-safety: single-threaded test code.
#include "kernels/cuda/paged_attention.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cpu/op_args.h"
#include "kernels/cpu/reference_ops.h"
#include "kernels/cuda/attention_test_util.h"

namespace tessera::kernels::cuda {
namespace {

using attention_testing::DeviceArray;
using attention_testing::ExpectGraphReplayMatches;
using attention_testing::kSentinel;
using attention_testing::MakeProblem;
using attention_testing::Problem;
using attention_testing::ProblemShape;

std::string NoDeviceReason() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    return absl::StrCat("no CUDA device: cudaGetDeviceCount says ", cudaGetErrorString(err));
  }
  if (count == 0) return "no CUDA device on this machine";
  return "";
}

#define SKIP_WITHOUT_DEVICE()                    \
  do {                                           \
    const std::string reason = NoDeviceReason(); \
    if (!reason.empty()) GTEST_SKIP() << reason; \
  } while (0)

struct Case : ProblemShape {
  std::string name;
  bool decode = false;
  bool decode_with_query_start_loc = false;
  int max_seq_len_extra = 0;  // host bound above the true maximum (graph buckets)
  bool via_graph = false;     // also replay the call from a captured CUDA graph
  // Token trees (prefill): per sequence, empty = plain causal, else each
  // chunk token's parent (-1 = the cached context). Any tree sets the masks.
  std::vector<std::vector<int>> parents;
  // Per sequence (missing = 0): the trunk P passed as tree_prefix, a chain
  // prefix of the chunk that every token descends from.
  std::vector<int> trunks;
  bool reference_only = false;  // stop after the CPU references (no device)
};

// The 64-bit masks of a tree with trunk P: all ones for trunk tokens, else
// bit j set when chunk token P + j is the token or one of its ancestors.
std::vector<uint64_t> AncestorMasks(const std::vector<int>& parents, int trunk) {
  std::vector<uint64_t> masks(parents.size());
  for (size_t j = 0; j < parents.size(); ++j) {
    const int p = parents[j];
    masks[j] = static_cast<int>(j) < trunk
                   ? ~uint64_t{0}
                   : (p < trunk ? 0 : masks[p]) | (uint64_t{1} << (static_cast<int>(j) - trunk));
  }
  return masks;
}

void RunCase(const Case& c, uint32_t seed) {
  SCOPED_TRACE(c.name);
  std::mt19937 rng(seed);
  ProblemShape shape = c;
  int longest = 0;
  for (int len : c.seq_lens) longest = std::max(longest, len);
  shape.min_table_blocks = (longest + c.max_seq_len_extra + c.block_size - 1) / c.block_size;
  Problem pr;
  ASSERT_NO_FATAL_FAILURE(MakeProblem(shape, rng, &pr));
  const int num_seqs = static_cast<int>(c.seq_lens.size());
  const int d = c.head_dim;

  // Token trees: masks for the GPU (all ones = causal for sequences without
  // a tree), and each tree token's reference over its context + path.
  bool tree = false;
  std::vector<uint64_t> masks(static_cast<size_t>(pr.tokens), ~uint64_t{0});
  std::vector<int32_t> trunks(num_seqs, 0);
  for (int s = 0; s < static_cast<int>(c.parents.size()); ++s) {
    const std::vector<int>& par = c.parents[s];
    if (par.empty()) continue;
    ASSERT_EQ(static_cast<int>(par.size()), c.q_lens[s]) << "test setup";
    tree = true;
    trunks[s] = s < static_cast<int>(c.trunks.size()) ? c.trunks[s] : 0;
    for (int j = 0; j < c.q_lens[s]; ++j) {  // the trunk: a chain every token descends from
      int a = j;
      while (a >= trunks[s]) a = par[a];
      ASSERT_TRUE(j < trunks[s] ? par[j] == j - 1 : a == trunks[s] - 1) << "test setup: trunk";
    }
    const std::vector<uint64_t> m = AncestorMasks(par, trunks[s]);
    std::copy(m.begin(), m.end(), masks.begin() + pr.qsl[s]);
    const int ctx = c.seq_lens[s] - c.q_lens[s];
    const int64_t row = int64_t{c.num_kv_heads} * d;
    for (int j = 0; j < c.q_lens[s]; ++j) {
      std::vector<int> path;  // logical cache indices this token sees
      for (int a = j; a >= 0; a = par[a]) path.push_back(ctx + a);
      for (int k = ctx - 1; k >= 0; --k) path.push_back(k);
      std::reverse(path.begin(), path.end());
      const int len = static_cast<int>(path.size());
      const int nb = (len + c.block_size - 1) / c.block_size;
      std::vector<float> pk(static_cast<size_t>(nb) * c.block_size * row, 0.f), pv(pk.size(), 0.f);
      for (int r = 0; r < len; ++r) {
        const int idx = path[r];
        const int64_t slot =
            int64_t{pr.table_ref[s * pr.table_stride + idx / c.block_size]} * c.block_size +
            idx % c.block_size;
        std::copy_n(pr.k_f.begin() + slot * row, row, pk.begin() + int64_t{r} * row);
        std::copy_n(pr.v_f.begin() + slot * row, row, pv.begin() + int64_t{r} * row);
      }
      std::vector<int32_t> one_qsl = {0, 1}, one_len = {len}, one_table(nb);
      std::iota(one_table.begin(), one_table.end(), 0);
      cpu::PagedAttentionArgs a = pr.args;
      a.q = pr.q_f.data() + int64_t{pr.qsl[s] + j} * pr.q_stride;
      a.cache.k = pk.data();
      a.cache.v = pv.data();
      a.cache.num_blocks = nb;
      a.query_start_loc = one_qsl;
      a.seq_lens = one_len;
      a.block_tables = one_table;
      a.block_table_stride = nb;
      float* row_out = pr.ref.data() + int64_t{pr.qsl[s] + j} * c.num_heads * d;
      std::vector<float> causal(row_out, row_out + int64_t{c.num_heads} * d);
      a.out = row_out;
      ASSERT_TRUE(cpu::reference::PagedAttention(a).ok());
      // A token whose ancestors are all the chunk pr.tokens before it sees
      // what the causal reference gave it.
      bool chain = true;
      for (int k = 0; k <= j; ++k) chain &= par[k] == k - 1;
      for (int64_t i = 0; chain && i < int64_t{c.num_heads} * d; ++i) {
        ASSERT_NEAR(row_out[i], causal[i], 1e-5f) << "tree reference, token " << j;
      }
    }
  }
  if (c.reference_only) return;

  // GPU.
  DeviceArray<uint16_t> dq(pr.q_bf), dk(pr.k_bf), dv(pr.v_bf);
  DeviceArray<int32_t> dtable(pr.table_gpu), dseq(pr.seq_lens), dqsl(pr.qsl);
  DeviceArray<uint64_t> dmasks(masks);
  DeviceArray<int32_t> dtrunks(trunks);
  DeviceArray<uint16_t> dout(
      std::vector<uint16_t>(static_cast<size_t>(pr.tokens) * pr.out_stride, kSentinel));
  PagedAttentionParams p;
  p.q = dq.get();
  p.q_token_stride = pr.q_stride;
  p.k_cache = dk.get();
  p.v_cache = dv.get();
  p.block_tables = dtable.get();
  p.block_table_stride = pr.table_stride;
  p.seq_lens = dseq.get();
  p.query_start_loc = (!c.decode || c.decode_with_query_start_loc) ? dqsl.get() : nullptr;
  p.num_seqs = num_seqs;
  p.num_heads = c.num_heads;
  p.num_kv_heads = c.num_kv_heads;
  p.head_dim = d;
  p.block_size = c.block_size;
  p.scale = pr.args.scale;
  p.max_seq_len = *std::max_element(c.seq_lens.begin(), c.seq_lens.end()) + c.max_seq_len_extra;
  p.max_query_len = *std::max_element(c.q_lens.begin(), c.q_lens.end());
  p.out = dout.get();
  p.out_token_stride = pr.out_stride;
  p.tree_ancestors = tree ? dmasks.get() : nullptr;
  p.tree_prefix = tree && !c.trunks.empty() ? dtrunks.get() : nullptr;
  // Bucketing may round max_seq_len up past the table; keep the table wide enough.
  ASSERT_GE(pr.table_stride, (p.max_seq_len + c.block_size - 1) / c.block_size) << "test setup";

  const size_t ws_bytes =
      c.decode ? PagedAttentionDecodeWorkspaceBytes(num_seqs, c.num_heads, d, p.max_seq_len) : 0;
  DeviceArray<uint8_t> dws(std::vector<uint8_t>(ws_bytes, 0xff));  // NaN-filled floats
  p.workspace = ws_bytes > 0 ? dws.get() : nullptr;
  p.workspace_bytes = ws_bytes;

  const absl::Status status =
      c.decode ? PagedAttentionDecode(p, nullptr) : PagedAttentionPrefill(p, nullptr);
  ASSERT_TRUE(status.ok()) << status;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << cudaGetErrorString(cudaGetLastError());
  const std::vector<uint16_t> out = dout.ToHost();

  const float tol = std::ldexp(pr.max_abs_v, -7) + 1e-3f;
  int bad = 0;
  float worst = 0.f;
  for (int t = 0; t < pr.tokens; ++t) {
    for (int64_t i = 0; i < pr.out_stride; ++i) {
      const uint16_t got_bits = out[t * pr.out_stride + i];
      if (i >= int64_t{c.num_heads} * d) {
        if (got_bits != kSentinel && ++bad <= 5) {
          ADD_FAILURE() << "token " << t << " padding element " << i << " was overwritten";
        }
        continue;
      }
      const float got = attention_testing::FromBf16(got_bits);
      const float want = pr.ref[t * int64_t{c.num_heads} * d + i];
      const float err = std::fabs(got - want);
      if (!(err <= tol)) {
        if (++bad <= 5) {
          ADD_FAILURE() << "token " << t << " head " << i / d << " dim " << i % d << ": got " << got
                        << " want " << want << " (tol " << tol << ")";
        }
      } else {
        worst = std::max(worst, err);
      }
    }
  }
  EXPECT_EQ(bad, 0) << "mismatches (worst passing error " << worst << ")";

  if (c.via_graph) {
    // The same call captured in a CUDA graph on a non-blocking stream and
    // replayed twice gives bitwise the same output.
    const std::vector<uint16_t> fresh(static_cast<size_t>(pr.tokens) * pr.out_stride, kSentinel);
    ASSERT_EQ(cudaMemcpy(dout.get(), fresh.data(), fresh.size() * sizeof(uint16_t),
                         cudaMemcpyHostToDevice),
              cudaSuccess);
    ExpectGraphReplayMatches(
        [&](cudaStream_t stream) {
          return c.decode ? PagedAttentionDecode(p, stream) : PagedAttentionPrefill(p, stream);
        },
        dout, out);
  }
}

std::vector<int> Repeat(int value, int n) { return std::vector<int>(n, value); }

// --- Decode -----------------------------------------------------------------

TEST(PagedAttentionDecode, ContextsBatchesAndGroupRatios) {
  SKIP_WITHOUT_DEVICE();
  const int contexts[] = {1, 15, 16, 17, 100, 1000, 4097};
  uint32_t seed = 1;
  for (int head_dim : {64, 128}) {
    for (int ratio : {1, 4, 8}) {
      for (int batch : {1, 2, 7, 33}) {
        Case c;
        c.decode = true;
        c.head_dim = head_dim;
        c.num_kv_heads = 2;
        c.num_heads = 2 * ratio;
        for (int s = 0; s < batch; ++s) {
          // Batch 1 takes the longest context; larger batches cycle through all.
          c.seq_lens.push_back(batch == 1 ? 4097 : contexts[(s + batch) % 7]);
        }
        c.q_lens = Repeat(1, batch);
        c.name = absl::StrCat("decode d", head_dim, " ratio ", ratio, " batch ", batch);
        RunCase(c, seed++);
      }
    }
  }
}

TEST(PagedAttentionDecode, EachContextAlone) {
  SKIP_WITHOUT_DEVICE();
  uint32_t seed = 100;
  for (int ctx : {1, 15, 16, 17, 100, 1000, 4097}) {
    Case c;
    c.decode = true;
    c.num_heads = 32;
    c.num_kv_heads = 8;
    c.seq_lens = {ctx};
    c.q_lens = {1};
    c.name = absl::StrCat("decode h32/kv8 d128 ctx ", ctx);
    RunCase(c, seed++);
  }
}

TEST(PagedAttentionDecode, LargeGroupsHeadDim256AndOtherBlockSizes) {
  SKIP_WITHOUT_DEVICE();
  Case mqa;  // 20 query heads on one kv head: two 16-row blocks, the second partial
  mqa.decode = true;
  mqa.num_heads = 20;
  mqa.num_kv_heads = 1;
  mqa.seq_lens = {1, 300, 2000};
  mqa.q_lens = Repeat(1, 3);
  mqa.name = "decode mqa 20 heads";
  RunCase(mqa, 7);

  Case d256;
  d256.decode = true;
  d256.head_dim = 256;
  d256.num_heads = 8;
  d256.num_kv_heads = 2;
  d256.seq_lens = {5, 700, 3000};
  d256.q_lens = Repeat(1, 3);
  d256.name = "decode d256";
  RunCase(d256, 8);

  for (int bs : {1, 8, 32, 64}) {
    Case c;
    c.decode = true;
    c.block_size = bs;
    c.seq_lens = {1, 33, 513, 1500};
    c.q_lens = Repeat(1, 4);
    c.name = absl::StrCat("decode block_size ", bs);
    RunCase(c, 9 + bs);
  }
}

// A grid of more CTAs than any GPU holds at once with 64-key tiles (400
// sequences x 8 kv heads): the launch takes the 32-key tiles. Contexts of
// every length mod 32 around the one-split limit.
TEST(PagedAttentionDecode, GridsBeyondOneWaveTakeSmallTiles) {
  SKIP_WITHOUT_DEVICE();
  uint32_t seed = 40;
  for (int head_dim : {64, 128}) {
    Case c;
    c.decode = true;
    c.head_dim = head_dim;
    c.num_heads = 32;
    c.num_kv_heads = 8;
    for (int s = 0; s < 400; ++s) c.seq_lens.push_back(120 + (s * 7) % 140);
    c.q_lens = Repeat(1, 400);
    c.name = absl::StrCat("decode 400 sequences d", head_dim);
    RunCase(c, seed++);
  }
}

TEST(PagedAttentionDecode, StridesQueryStartLocAndBucketedMaxSeqLen) {
  SKIP_WITHOUT_DEVICE();
  Case c;
  c.decode = true;
  c.decode_with_query_start_loc = true;
  c.q_stride_pad = 2 * 2 * 128;  // q inside a fused qkv row
  c.out_stride_pad = 8;
  c.max_seq_len_extra = 60;  // bound above every actual length
  c.seq_lens = {3, 1024, 1025, 200, 4000};
  c.q_lens = Repeat(1, 5);
  c.name = "decode strides + query_start_loc + bucketed bound";
  c.via_graph = true;
  RunCase(c, 21);
}

// --- Prefill ----------------------------------------------------------------

TEST(PagedAttentionPrefill, SinglePrompts) {
  SKIP_WITHOUT_DEVICE();
  uint32_t seed = 200;
  for (int head_dim : {64, 128}) {
    for (int len : {1, 2, 15, 16, 17, 63, 64, 65, 100, 127, 128, 129, 300}) {
      Case c;
      c.head_dim = head_dim;
      c.seq_lens = {len};
      c.q_lens = {len};
      c.name = absl::StrCat("prefill d", head_dim, " prompt ", len);
      RunCase(c, seed++);
    }
  }
}

TEST(PagedAttentionPrefill, ChunksWithEarlierContext) {
  SKIP_WITHOUT_DEVICE();
  struct Chunk {
    int context, q_len;
  };
  uint32_t seed = 300;
  for (const Chunk& ch : {Chunk{17, 1}, Chunk{16, 16}, Chunk{100, 50}, Chunk{1000, 129},
                          Chunk{63, 200}, Chunk{256, 64}, Chunk{5, 3}}) {
    Case c;
    c.seq_lens = {ch.context + ch.q_len};
    c.q_lens = {ch.q_len};
    c.name = absl::StrCat("prefill chunk ctx ", ch.context, " q ", ch.q_len);
    RunCase(c, seed++);
  }
}

TEST(PagedAttentionPrefill, MixedBatches) {
  SKIP_WITHOUT_DEVICE();
  Case c;  // prompts, chunks, a decode-like token and an empty sequence together
  c.q_lens = {1, 5, 64, 130, 0, 77, 1};
  c.seq_lens = {1, 20, 64, 400, 33, 77, 900};
  c.q_stride_pad = 2 * 2 * 128;
  c.out_stride_pad = 16;
  c.name = "prefill mixed gqa4 d128";
  c.via_graph = true;
  RunCase(c, 400);

  Case mha = c;
  mha.num_heads = 4;
  mha.num_kv_heads = 4;
  mha.head_dim = 64;
  mha.block_size = 32;
  mha.q_stride_pad = 0;
  mha.via_graph = false;
  mha.name = "prefill mixed mha d64 bs32";
  RunCase(mha, 401);

  Case d256;
  d256.head_dim = 256;
  d256.num_heads = 4;
  d256.num_kv_heads = 1;
  d256.q_lens = {3, 70, 33};
  d256.seq_lens = {3, 100, 200};
  d256.name = "prefill mixed d256 gqa4";
  RunCase(d256, 402);

  Case gqa8;
  gqa8.num_heads = 16;
  gqa8.num_kv_heads = 2;
  gqa8.block_size = 8;
  gqa8.q_lens = {300, 2, 90};
  gqa8.seq_lens = {300, 1002, 150};
  gqa8.name = "prefill mixed gqa8 bs8";
  RunCase(gqa8, 403);
}

// --- Token trees ------------------------------------------------------------

// A chain of n tokens (parent j - 1), a star (every token on the context),
// and a deep branch: a 24-token trunk with side branches hanging off it.
std::vector<int> Chain(int n) {
  std::vector<int> p(n);
  for (int j = 0; j < n; ++j) p[j] = j - 1;
  return p;
}
std::vector<int> Star(int n) { return std::vector<int>(n, -1); }
std::vector<int> DeepBranch() {
  std::vector<int> p = Chain(24);
  for (int j = 24; j < 40; ++j) p.push_back(j == 24 ? 10 : (j % 4 == 0 ? j - 1 : 2 * (j - 24)));
  return p;
}
// A random 64-node tree (each parent a random earlier node or the root).
std::vector<int> RandomTree(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int> p(n);
  for (int j = 0; j < n; ++j) p[j] = static_cast<int>(rng() % (j + 1)) - 1;
  return p;
}

TEST(PagedAttentionPrefillTree, TreesWithContextGqaAndPlainSequences) {
  SKIP_WITHOUT_DEVICE();
  uint32_t seed = 500;
  struct Shape {
    int heads, kv_heads, head_dim, block_size;
  };
  for (const Shape& sh : {Shape{8, 2, 128, 16}, Shape{16, 2, 64, 8}, Shape{4, 1, 256, 32}}) {
    Case c;
    c.num_heads = sh.heads;
    c.num_kv_heads = sh.kv_heads;
    c.head_dim = sh.head_dim;
    c.block_size = sh.block_size;
    // chain, star, deep branch, 64-node tree, a plain 130-token chunk (no
    // tree, longer than 64), a tree on an empty context, a decode-like token.
    c.parents = {
        Chain(9), Star(7), DeepBranch(), RandomTree(64, seed), {}, RandomTree(20, seed + 1), {}};
    c.q_lens = {9, 7, 40, 64, 130, 20, 1};
    c.seq_lens = {100 + 9, 37 + 7, 300 + 40, 1000 + 64, 200 + 130, 20, 77};
    c.q_stride_pad = sh.head_dim == 128 ? 2 * 2 * 128 : 0;
    c.out_stride_pad = 8;
    c.name = absl::StrCat("tree batch h", sh.heads, "/kv", sh.kv_heads, " d", sh.head_dim, " bs",
                          sh.block_size);
    c.via_graph = sh.head_dim == 128;  // the mask pointer is a plain kernel argument
    RunCase(c, seed++);
  }
}

// A root and 64 nodes below it (trunk 1: 65 chunk tokens, as a speculative
// step with 64 draft nodes sends), a 3-token trunk above a 40-node tree,
// and a tree without trunk in the same batch.
TEST(PagedAttentionPrefillTree, TreesBelowATrunk) {
  SKIP_WITHOUT_DEVICE();
  std::vector<int> rooted = {-1}, trunk3 = Chain(3);
  for (int p : RandomTree(64, 700)) rooted.push_back(p + 1);
  for (int p : RandomTree(40, 701)) trunk3.push_back(p < 0 ? 2 : p + 3);
  Case c;
  c.parents = {rooted, trunk3, Star(5), {}};
  c.trunks = {1, 3, 0, 0};
  c.q_lens = {65, 43, 5, 70};
  c.seq_lens = {65 + 200, 43 + 17, 5 + 64, 70 + 3};
  c.name = "trees below a trunk";
  RunCase(c, 702);
  Case d64 = c;
  d64.head_dim = 64;
  d64.num_heads = 16;
  d64.num_kv_heads = 4;
  d64.name = "trees below a trunk d64";
  RunCase(d64, 703);
}

TEST(PagedAttentionPrefillTree, ChainMasksEqualCausalAndSingleTree) {
  SKIP_WITHOUT_DEVICE();
  // A 64-token chain with masks must match the causal reference (the
  // reference here is the plain causal one for the chain's own rows too).
  Case chain;
  chain.parents = {Chain(64)};
  chain.q_lens = {64};
  chain.seq_lens = {64 + 500};
  chain.name = "tree: 64-chain";
  RunCase(chain, 600);

  Case star;  // no context: each token sees only itself
  star.parents = {Star(33)};
  star.q_lens = {33};
  star.seq_lens = {33};
  star.name = "tree: star without context";
  RunCase(star, 601);
}

// The tree references and test trees themselves (no device needed): a
// chain's tree reference is the causal one, and the trunks are valid.
TEST(PagedAttentionPrefillTree, ReferencesOfChainsAreCausal) {
  std::vector<int> rooted = {-1};
  for (int p : RandomTree(64, 700)) rooted.push_back(p + 1);
  Case c;
  c.parents = {Chain(12), DeepBranch(), rooted, Star(4)};
  c.trunks = {0, 3, 1, 0};  // DeepBranch: a side branch hangs off chunk token 2
  c.q_lens = {12, 40, 65, 4};
  c.seq_lens = {12 + 30, 40 + 5, 65 + 100, 4};
  c.reference_only = true;
  c.name = "tree references";
  RunCase(c, 800);
}

// --- Validation (no device needed) --------------------------------------------

PagedAttentionParams ValidLooking() { return attention_testing::ValidLookingParams(); }

void ExpectInvalid(const PagedAttentionParams& p, const std::string& needle) {
  for (bool decode : {true, false}) {
    const absl::Status s =
        decode ? PagedAttentionDecode(p, nullptr) : PagedAttentionPrefill(p, nullptr);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(std::string(s.message()).find(needle), std::string::npos) << s;
  }
}

TEST(PagedAttentionValidation, RejectsBadParameters) {
  PagedAttentionParams p = ValidLooking();
  p.head_dim = 96;
  ExpectInvalid(p, "head_dim 96");
  for (const attention_testing::BadParams& bad : attention_testing::CommonBadParams()) {
    p = ValidLooking();
    bad.change(p);
    ExpectInvalid(p, bad.needle);
  }

  p = ValidLooking();
  p.query_start_loc = nullptr;
  const absl::Status s = PagedAttentionPrefill(p, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  p = ValidLooking();
  p.max_query_len = 129;
  EXPECT_EQ(PagedAttentionPrefill(p, nullptr).code(), absl::StatusCode::kInvalidArgument);
}

// DecodeRope (RoPE and the K/V write inside decode attention): every
// pointer, aligned buffers and a kv_token_stride of at least one row; and
// prefill refuses it.
TEST(PagedAttentionValidation, RejectsBadDecodeRope) {
  alignas(16) static uint16_t any16[64];
  alignas(16) static int64_t any64[8];
  PagedAttentionParams p = ValidLooking();
  DecodeRope rope;  // no pointers
  p.rope = &rope;
  absl::Status s = PagedAttentionDecode(p, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(std::string(s.message()).find("RoPE needs positions"), std::string::npos) << s;
  rope.positions = reinterpret_cast<const int32_t*>(any64);
  rope.inv_freq = reinterpret_cast<const float*>(any64);
  rope.k = rope.v = any16;
  rope.slots = any64;
  rope.k_cache = rope.v_cache = any16;
  rope.kv_token_stride = 2 * 128 - 8;  // below num_kv_heads * head_dim
  s = PagedAttentionDecode(p, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(std::string(s.message()).find("kv_token_stride"), std::string::npos) << s;
  rope.kv_token_stride = 2 * 128;
  rope.v = any16 + 2;  // not 16-byte aligned
  s = PagedAttentionDecode(p, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(std::string(s.message()).find("16-byte aligned"), std::string::npos) << s;
  rope.v = any16;
  // q/k norms need the normal order and a usable epsilon.
  rope.rope_order = true;
  rope.k_norm = reinterpret_cast<const float*>(any64);
  s = PagedAttentionDecode(p, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(std::string(s.message()).find("normal order"), std::string::npos) << s;
  rope.rope_order = false;
  rope.norm_eps = -1e-6f;
  s = PagedAttentionDecode(p, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(std::string(s.message()).find("norm_eps"), std::string::npos) << s;
  s = PagedAttentionPrefill(p, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(std::string(s.message()).find("decode only"), std::string::npos) << s;
}

TEST(PagedAttentionValidation, DecodeWorkspace) {
  // Short contexts need no split (no workspace); long ones do.
  EXPECT_EQ(PagedAttentionDecodeWorkspaceBytes(32, 32, 128, 200), 0u);
  const size_t bytes = PagedAttentionDecodeWorkspaceBytes(32, 32, 128, 4096);
  EXPECT_GT(bytes, 0u);
  EXPECT_GE(PagedAttentionDecodeWorkspaceBytes(32, 32, 128, 8192), bytes);

  PagedAttentionParams p = ValidLooking();
  p.num_seqs = 32;
  p.num_heads = 32;
  p.num_kv_heads = 8;
  p.q_token_stride = p.out_token_stride = 32 * 128;
  p.max_seq_len = 4096;
  p.block_table_stride = 256;
  p.workspace = nullptr;
  p.workspace_bytes = 0;
  absl::Status s = PagedAttentionDecode(p, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(std::string(s.message()).find("workspace"), std::string::npos) << s;
  alignas(16) static uint8_t small[64];
  p.workspace = small;
  p.workspace_bytes = bytes - 1;
  s = PagedAttentionDecode(p, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
}

}  // namespace
}  // namespace tessera::kernels::cuda
