#include "tests/bench/random_fp8_cuda_weights.h"

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/cuda/random_fill.h"
#include "tests/bench/random_cuda_weights.h"

namespace tessera::bench {
namespace {

namespace kcu = ::tessera::kernels::cuda;

constexpr int64_t kPoolBytes = int64_t{64} << 20;

int64_t Blocks(int64_t n) { return (n + kcu::kFp8Block - 1) / kcu::kFp8Block; }

// `pool` (random finite e4m3 codes on the device) tiled over `bytes`.
absl::StatusOr<kcu::DeviceBuffer> TiledBytes(const kcu::DeviceBuffer& pool, int64_t bytes,
                                             const std::string& what) {
  ASSIGN_OR_RETURN(kcu::DeviceBuffer b, runner::AllocateDevice(bytes, what));
  for (int64_t at = 0; at < bytes; at += kPoolBytes) {
    RETURN_IF_ERROR(kcu::CopyDeviceToDevice(b.as<uint8_t>() + at, pool.data(),
                                            std::min(kPoolBytes, bytes - at)));
  }
  return b;
}

absl::StatusOr<kcu::DeviceBuffer> Constant(int64_t n, float v, const std::string& what) {
  ASSIGN_OR_RETURN(kcu::DeviceBuffer b, runner::AllocateDevice(n * sizeof(float), what));
  RETURN_IF_ERROR(kcu::FillConstantF32(b.as<float>(), n, v, nullptr));
  return b;
}

// One block-scaled part of [out, in]; weights about +-0.03 (as the bf16 ones).
absl::Status MakeFp8(const kcu::DeviceBuffer& pool, int64_t out, int64_t in,
                     runner::CudaFp8Prefill prefill, const std::string& what, runner::CudaLinear* l,
                     runner::CudaFp8Workspace::Needs* needs, int64_t* bytes) {
  runner::CudaLinear fp8;
  fp8.out = out;
  fp8.in = in;
  runner::CudaFp8Part p;
  p.rows = out;
  p.in = in;
  p.prefill = prefill;
  const int64_t grid = Blocks(out) * Blocks(in);
  ASSIGN_OR_RETURN(p.weight, TiledBytes(pool, out * in, what));
  ASSIGN_OR_RETURN(p.scales, Constant(grid, 0.03f / 448, what + " scales"));
  if (prefill != runner::CudaFp8Prefill::kCublasLtBlock) {
    needs->max_dequant_elems = std::max(needs->max_dequant_elems, out * in);
    needs->qdq = true;
  }
  needs->max_in = std::max(needs->max_in, in);
  needs->max_out = std::max(needs->max_out, out);
  needs->cublaslt |= prefill == runner::CudaFp8Prefill::kCublasLtBlock;
  fp8.fp8.push_back(std::move(p));
  *bytes += out * in + grid * static_cast<int64_t>(sizeof(float)) -
            l->out * l->in * static_cast<int64_t>(sizeof(kcu::Bf16));
  *l = std::move(fp8);
  return absl::OkStatus();
}

}  // namespace

runner::CudaWeightsFactory RandomFp8CudaWeights(uint64_t seed, runner::CudaFp8Prefill prefill) {
  return [seed, prefill](const model::ModelConfig& c,
                         const parallel::ShardPlan& plan) -> absl::StatusOr<runner::CudaWeights> {
    if (c.moe) return absl::UnimplementedError("random FP8 weights: dense models only");
    ASSIGN_OR_RETURN(runner::CudaWeights w, RandomCudaWeights(seed)(c, plan));
    // Random finite e4m3 codes (0x7f / 0xff are NaN).
    std::mt19937_64 rng(seed);
    std::vector<uint8_t> host(kPoolBytes);
    for (uint8_t& b : host) {
      do {
        b = static_cast<uint8_t>(rng());
      } while ((b & 0x7f) == 0x7f);
    }
    ASSIGN_OR_RETURN(kcu::DeviceBuffer pool, runner::AllocateDevice(kPoolBytes, "e4m3 pool"));
    RETURN_IF_ERROR(kcu::CopyToDevice(pool.data(), host.data(), host.size()));
    w.qkv_rope_order = false;  // the bf16 GEMV epilogues are off for FP8
    w.gate_up_interleaved = false;
    runner::CudaFp8Workspace::Needs needs;
    for (size_t i = 0; i < w.layers.size(); ++i) {
      runner::CudaLayerWeights& l = w.layers[i];
      const std::string name = absl::StrCat("layer ", i);
      for (runner::CudaLinear* linear : {&l.qkv, &l.o, &l.gate_up, &l.down}) {
        RETURN_IF_ERROR(
            MakeFp8(pool, linear->out, linear->in, prefill, name, linear, &needs, &w.bytes));
      }
    }
    ASSIGN_OR_RETURN(w.fp8_workspace, runner::CudaFp8Workspace::Create(needs));
    for (runner::CudaLayerWeights& l : w.layers) {
      for (runner::CudaLinear* linear : {&l.qkv, &l.o, &l.gate_up, &l.down}) {
        linear->fp8_workspace = w.fp8_workspace.get();
      }
    }
    w.fp8_plan = absl::StrCat(
        "random fine-grained FP8 (128x128 blocks, activations per group "
        "of 128); decode: fp8 GEMV; prefill: ",
        std::string(runner::CudaFp8PrefillName(prefill)));
    RETURN_IF_ERROR(kcu::SynchronizeDevice());
    return w;
  };
}

double Fp8ScaleBytes(const model::ModelConfig& c, const parallel::ShardPlan& plan) {
  const int64_t H = c.hidden_size, D = c.head_dim;
  const int64_t Q = plan.q_heads.size * D, K = plan.kv_heads.size * D, I = plan.intermediate.size;
  const double per_layer = Blocks(Q + 2 * K) * Blocks(H) + Blocks(H) * Blocks(Q) +
                           Blocks(2 * I) * Blocks(H) + Blocks(H) * Blocks(I);
  return 4.0 * per_layer * static_cast<double>(c.num_hidden_layers);
}

}  // namespace tessera::bench
