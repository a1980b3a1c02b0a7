// RandomFp8CudaWeights: a CudaWeightsFactory for FP8 decode/prefill
// benchmarks: RandomCudaWeights' bf16 model with every dense layer's
// q/k/v, o, gate/up and down replaced by one random e4m3 part with 128x128
// block scales (fine-grained FP8, activations per token group of 128), as
// UploadWeights lays out an FP8 checkpoint (worker/runner/cuda/cuda_linear.h).
// The embedding, norms and LM head stay bf16, as in FP8 checkpoints.
// Fp8ScaleBytes: the scale grids' bytes a decode step reads (every FP8
// linear's [ceil(out/128), ceil(in/128)] fp32 grid).
//
// Thread-safety: as RandomCudaWeights (the current device, one thread).
#pragma once

#include <cstdint>

#include "worker/model/config.h"
#include "worker/parallel/shard_plan.h"
#include "worker/runner/cuda/cuda_weights.h"

namespace tessera::bench {

// REQUIRES: a dense model (no MoE layers).
runner::CudaWeightsFactory RandomFp8CudaWeights(uint64_t seed, runner::CudaFp8Prefill prefill);

double Fp8ScaleBytes(const model::ModelConfig& c, const parallel::ShardPlan& plan);

}  // namespace tessera::bench
