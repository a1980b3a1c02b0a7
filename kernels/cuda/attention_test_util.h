// Test support for the CUDA paged attention tests (paged_attention_test,
// prefill_attention_sm90_test): host bf16 conversion, a device copy of a
// host vector, a random paged problem with its CPU reference, a CUDA-graph
// replay check, parameters that pass the host-side checks and the errors
// those checks refuse. Plain C++ and the CUDA
// runtime: the attention library's tests do not link the other CUDA
// kernels.
//
// A problem has random bf16 q/K/V (the reference sees the same bf16 values
// widened to fp32), a shuffled block table whose unused entries hold
// out-of-range block ids in the device copy (a read past a sequence's
// blocks faults), and q/out token strides padded by the given amounts (q
// padding holds kSentinel).
//
// Thread-safety: single-threaded test code.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "kernels/cpu/op_args.h"
#include "kernels/cpu/reference_ops.h"
#include "kernels/cuda/paged_attention.h"

namespace tessera::kernels::cuda::attention_testing {

inline uint16_t ToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  bits += 0x7fffu + ((bits >> 16) & 1u);  // round to nearest even (inputs are finite)
  return static_cast<uint16_t>(bits >> 16);
}

inline float FromBf16(uint16_t h) {
  const uint32_t bits = uint32_t{h} << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// A NaN pattern the kernels never write: marks padding that must stay.
inline constexpr uint16_t kSentinel = 0x7fc1;

// Device copy of a host vector, freed on destruction.
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(const std::vector<T>& host) : size_(host.size()) {
    EXPECT_EQ(cudaMalloc(&ptr_, std::max<size_t>(1, size_) * sizeof(T)), cudaSuccess);
    Upload(host);
  }
  ~DeviceArray() { cudaFree(ptr_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  void Upload(const std::vector<T>& host) {
    if (size_ > 0) {
      EXPECT_EQ(cudaMemcpy(ptr_, host.data(), size_ * sizeof(T), cudaMemcpyHostToDevice),
                cudaSuccess);
    }
  }
  T* get() const { return static_cast<T*>(ptr_); }
  std::vector<T> ToHost() const {
    std::vector<T> host(size_);
    if (size_ > 0) {
      EXPECT_EQ(cudaMemcpy(host.data(), ptr_, size_ * sizeof(T), cudaMemcpyDeviceToHost),
                cudaSuccess);
    }
    return host;
  }

 private:
  void* ptr_ = nullptr;
  size_t size_;
};

struct ProblemShape {
  int num_heads = 8;
  int num_kv_heads = 2;
  int head_dim = 128;
  int block_size = 16;
  std::vector<int> q_lens;    // per sequence
  std::vector<int> seq_lens;  // per sequence, >= q_len
  int q_stride_pad = 0;       // extra elements per q token (a fused qkv buffer)
  int out_stride_pad = 0;     // extra elements per out token
  int min_table_blocks = 0;   // the block table is at least this wide
  float q_range = 2.0f;       // q values uniform in [-q_range, q_range]
};

struct Problem {
  std::vector<int32_t> qsl;  // query_start_loc
  std::vector<int32_t> seq_lens;
  int tokens = 0;
  int num_blocks = 0;
  int max_len = 0;  // the longest sequence
  int64_t q_stride = 0, out_stride = 0, table_stride = 0;
  std::vector<int32_t> table_ref, table_gpu;  // the device copy: unused entries out of range
  std::vector<uint16_t> q_bf, k_bf, v_bf;
  std::vector<float> q_f, k_f, v_f;
  float max_abs_v = 0.f;
  cpu::PagedAttentionArgs args;  // the reference's arguments (out: ref)
  std::vector<float> ref;        // the causal reference output [tokens, heads, head_dim]
};

// Builds a random problem of shape `s` from `rng` and runs the causal CPU
// reference on it (fatal gtest failure if the reference refuses).
inline void MakeProblem(const ProblemShape& s, std::mt19937& rng, Problem* pr) {
  const int num_seqs = static_cast<int>(s.seq_lens.size());
  const int d = s.head_dim;
  pr->qsl.assign(num_seqs + 1, 0);
  for (int i = 0; i < num_seqs; ++i) pr->qsl[i + 1] = pr->qsl[i] + s.q_lens[i];
  pr->tokens = pr->qsl.back();
  pr->q_stride = int64_t{s.num_heads} * d + s.q_stride_pad;
  pr->out_stride = int64_t{s.num_heads} * d + s.out_stride_pad;

  // Block tables: a shuffled permutation of all blocks, plus spare blocks.
  int max_blocks = 1;
  int total_blocks = 0;
  pr->max_len = 0;
  for (int len : s.seq_lens) {
    const int nb = (len + s.block_size - 1) / s.block_size;
    max_blocks = std::max(max_blocks, nb);
    total_blocks += nb;
    pr->max_len = std::max(pr->max_len, len);
  }
  pr->num_blocks = total_blocks + 3;
  std::vector<int32_t> perm(pr->num_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  pr->table_stride = std::max(max_blocks + 2, s.min_table_blocks);
  pr->table_ref.assign(num_seqs * pr->table_stride, 0);
  pr->table_gpu.assign(num_seqs * pr->table_stride, 1 << 30);  // unused: out of range
  int next = 0;
  for (int i = 0; i < num_seqs; ++i) {
    const int nb = (s.seq_lens[i] + s.block_size - 1) / s.block_size;
    for (int b = 0; b < nb; ++b) {
      pr->table_ref[i * pr->table_stride + b] = pr->table_gpu[i * pr->table_stride + b] =
          perm[next++];
    }
  }

  std::uniform_real_distribution<float> qdist(-s.q_range, s.q_range);
  std::uniform_real_distribution<float> kvdist(-1.f, 1.f);
  pr->q_bf.assign(static_cast<size_t>(pr->tokens) * pr->q_stride, kSentinel);
  pr->q_f.assign(pr->q_bf.size(), 0.f);
  for (int t = 0; t < pr->tokens; ++t) {
    for (int64_t i = 0; i < int64_t{s.num_heads} * d; ++i) {
      const uint16_t h = ToBf16(s.q_range == 0.f ? 0.f : qdist(rng));
      pr->q_bf[t * pr->q_stride + i] = h;
      pr->q_f[t * pr->q_stride + i] = FromBf16(h);
    }
  }
  const size_t cache_elems =
      static_cast<size_t>(pr->num_blocks) * s.block_size * s.num_kv_heads * d;
  pr->k_bf.resize(cache_elems);
  pr->v_bf.resize(cache_elems);
  pr->k_f.resize(cache_elems);
  pr->v_f.resize(cache_elems);
  pr->max_abs_v = 0.f;
  for (size_t i = 0; i < cache_elems; ++i) {
    pr->k_bf[i] = ToBf16(kvdist(rng));
    pr->v_bf[i] = ToBf16(kvdist(rng));
    pr->k_f[i] = FromBf16(pr->k_bf[i]);
    pr->v_f[i] = FromBf16(pr->v_bf[i]);
    pr->max_abs_v = std::max(pr->max_abs_v, std::fabs(pr->v_f[i]));
  }

  pr->seq_lens.assign(s.seq_lens.begin(), s.seq_lens.end());
  pr->ref.assign(static_cast<size_t>(pr->tokens) * s.num_heads * d, 0.f);
  cpu::PagedAttentionArgs& args = pr->args;
  args.q = pr->q_f.data();
  args.q_token_stride = pr->q_stride;
  args.num_heads = s.num_heads;
  args.cache.k = pr->k_f.data();
  args.cache.v = pr->v_f.data();
  args.cache.num_blocks = pr->num_blocks;
  args.cache.block_size = s.block_size;
  args.cache.num_kv_heads = s.num_kv_heads;
  args.cache.head_dim = d;
  args.query_start_loc = pr->qsl;
  args.seq_lens = pr->seq_lens;
  args.block_tables = pr->table_ref;
  args.block_table_stride = pr->table_stride;
  args.scale = 1.0f / std::sqrt(static_cast<float>(d));
  args.out = pr->ref.data();
  ASSERT_TRUE(cpu::reference::PagedAttention(args).ok());
}

// `call` (an attention call that writes dout) captured into a CUDA graph on
// a fresh stream and replayed twice: dout must end bitwise equal to `want`
// (what the direct call wrote).
inline void ExpectGraphReplayMatches(const std::function<absl::Status(cudaStream_t)>& call,
                                     const DeviceArray<uint16_t>& dout,
                                     const std::vector<uint16_t>& want) {
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  const absl::Status captured = call(stream);
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(stream, &graph);
  ASSERT_TRUE(captured.ok()) << captured;
  ASSERT_EQ(end, cudaSuccess) << cudaGetErrorString(end);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int rep = 0; rep < 2; ++rep) ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_TRUE(dout.ToHost() == want) << "graph replay differs from the direct call";
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// Parameters that pass every host-side check (pointers to static dummies,
// never dereferenced by a validation test): tests change one field.
inline PagedAttentionParams ValidLookingParams() {
  alignas(16) static uint16_t dummy16[64];
  alignas(16) static int32_t dummy32[64];
  PagedAttentionParams p;
  p.q = dummy16;
  p.k_cache = dummy16;
  p.v_cache = dummy16;
  p.out = dummy16;
  p.block_tables = dummy32;
  p.seq_lens = dummy32;
  p.query_start_loc = dummy32;
  p.num_seqs = 1;
  p.num_heads = 8;
  p.num_kv_heads = 2;
  p.head_dim = 128;
  p.block_size = 16;
  p.q_token_stride = 8 * 128;
  p.out_token_stride = 8 * 128;
  p.block_table_stride = 8;
  p.max_seq_len = 128;
  p.max_query_len = 128;
  p.scale = 0.088f;
  return p;
}

// A parameter error and the text its INVALID_ARGUMENT must contain.
struct BadParams {
  std::function<void(PagedAttentionParams&)> change;  // applied to ValidLookingParams()
  std::string needle;
};

// The errors every attention entry point refuses through the shared host
// checks (attention_detail::ValidateAttentionParams).
inline std::vector<BadParams> CommonBadParams() {
  return {
      {[](PagedAttentionParams& p) { p.num_kv_heads = 3; }, "num_kv_heads 3"},
      {[](PagedAttentionParams& p) { p.block_size = 24; }, "block_size 24"},
      {[](PagedAttentionParams& p) { p.k_cache = nullptr; }, "non-null"},
      {[](PagedAttentionParams& p) {
         p.q = reinterpret_cast<const uint16_t*>(reinterpret_cast<uintptr_t>(p.q) + 2);
       },
       "16-byte aligned"},
      {[](PagedAttentionParams& p) { p.q_token_stride = 8 * 128 - 8; }, "q_token_stride"},
      {[](PagedAttentionParams& p) { p.out_token_stride = 8 * 128 + 4; }, "out_token_stride"},
      {[](PagedAttentionParams& p) { p.block_table_stride = 7; }, "block_table_stride 7"},
      {[](PagedAttentionParams& p) { p.scale = std::nanf(""); }, "scale"},
  };
}

}  // namespace tessera::kernels::cuda::attention_testing
