// The CUDA backend's place in the kernel registry: its candidates and the
// rules that decide whether they can run on a device. Plain C++ (no CUDA
// headers), so the rules are table-tested in CI with fake devices and fake
// builds; the kernels themselves live in kernels/cuda/.
//
// Candidates (ahead of the CPU ones):
//   gemm                      cublas   cuBLASLt bf16 GEMM, fp32 accumulate
//   attention_prefill         cuda-sm90a  wgmma flash attention
//                                      (kernels/cuda/prefill_attention_sm90.h) on SM 9.0
//                                      with this binary's sm_90a image; head_dim 64 and
//                                      128, the portable kernel for other shapes
//   fp8_gemm                  cublaslt-fp8-block, cuda-fp8-dequant
//                                      (kernels/cuda_fp8_backend.h)
//   every other op            cuda     Tessera's portable CUDA kernels (SM 8.0+)
//   all_reduce                p2p      peer-to-peer one-shot all-reduce (kernels/cuda/
//                                      p2p_all_reduce.h) for bf16 messages up to
//                                      kP2pAllReduceMaxBytes, NCCL for larger and fp32
//                                      ones; needs every pair of the group's GPUs to
//                                      reach each other's memory
//                             nccl     NCCL between the GPUs of a tensor-parallel group
//                             single_rank  a group of one rank (nothing to reduce)
//
// A candidate runs on a device only when: the device is a CUDA device; this
// binary was built with CUDA; the arch is at least SM 8.0; the driver can run
// this binary's runtime; the build carries a code image that runs on the
// arch (native SASS, or PTX the driver can JIT — chosen with a "degraded"
// note); and, when the device was probed, the runtime agrees. Candidates that
// need an arch-specific image (sm_90a wgmma, sm_100a tcgen05) add
// ArchSpecificRule().
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "kernels/arch/sm_arch.h"
#include "kernels/device.h"
#include "kernels/registry.h"

namespace tessera::kernels {

inline constexpr std::string_view kCudaBackend = "cuda";
// Prefill attention only, so it is not a value of --attention_backend (a
// flag's backend must cover its whole family); --attention_backend=cuda
// keeps prefill on the portable kernel.
inline constexpr std::string_view kCudaSm90aBackend = "cuda-sm90a";
inline constexpr std::string_view kCublasBackend = "cublas";
inline constexpr std::string_view kSingleRankBackend = "single_rank";
inline constexpr std::string_view kNcclBackend = "nccl";
inline constexpr std::string_view kP2pBackend = "p2p";
// Messages above this go through NCCL under the p2p candidate: up to here the
// one-shot kernel beat NCCL on 2 x H200 (tests/bench/results/gpu_tp_h200x2.json).
inline constexpr int64_t kP2pAllReduceMaxBytes = int64_t{1} << 20;
inline constexpr int kP2pMaxRanks = 8;

// Adds the CUDA candidates (see above) to `registry`.
void AddCudaCandidates(Registry* registry);

// Why Tessera's own CUDA kernels cannot run on `device`, or nullopt.
std::optional<std::string> CudaKernelsWhyNot(const DeviceDescription& device);

// Why cuBLAS cannot run on `device` (it brings its own kernels, so the
// build's images do not matter), or nullopt.
std::optional<std::string> CublasWhyNot(const DeviceDescription& device);

// For a kernel compiled only into an arch-specific image (e.g. sm_90a for
// wgmma, sm_100a for tcgen05): why it cannot run on `device`, or nullopt.
// `feature` names what needs it, for the message.
std::optional<std::string> ArchSpecificWhyNot(const DeviceDescription& device, arch::SmArch needs,
                                              char suffix, std::string_view feature);

// What the `cuda` candidate will run on `device`: "SASS sm_90a" or
// "PTX compute_120 JIT (degraded: ...)", plus a warning for an arch this
// build's capability table does not know.
std::string CudaBackendDetails(const DeviceDescription& device);

}  // namespace tessera::kernels
