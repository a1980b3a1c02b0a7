#!/usr/bin/env bash
# Builds what the GPU machine runs and bundles it: the service binaries, the
# CUDA tests and the GPU benchmarks, stripped, plus the non-system shared
# libraries they need (from ldd), packed into .gpu/bundle.tar.xz (git-ignored)
# to carry there. CUDA's own libraries (cuBLAS, NCCL, cudart) are not
# bundled: the GPU machine has the same CUDA 13 toolkit in /usr/local/cuda.
# On the GPU machine, `bash scripts/gpu-run.sh OUT_DIR` unpacks and runs it.
#
# Usage: scripts/gpu-bundle.sh [BUILD_DIR]   (default build-gpu; configured
#        with CUDA on and TESSERA_CUDA_ARCHS from the environment or the default)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${1:-build-gpu}
archs=()
if [[ -n "${TESSERA_CUDA_ARCHS:-}" ]]; then archs=(-DTESSERA_CUDA_ARCHS="$TESSERA_CUDA_ARCHS"); fi
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTESSERA_CUDA=ON "${archs[@]}" >/dev/null
bins=(
  services/cli/tessera
  services/worker/tessera-worker
  services/router/tessera-router
  services/drafter/tessera-drafter
  kernels/arch/arch_test
  kernels/cuda_selection_test
  kernels/cuda/cuda_ops_test
  kernels/cuda/cuda_gemm_test
  kernels/cuda/cuda_gemv_test
  kernels/cuda/cuda_sampling_test
  kernels/cuda/cuda_decode_rope_test
  kernels/cuda/cuda_p2p_all_reduce_test
  kernels/cuda/paged_attention_test
  kernels/cuda/prefill_attention_sm90_test
  worker/runner/cuda_model_runner_test
  kernels/cuda/cuda_ops_bench
  kernels/cuda/gemm_search_bench
  kernels/cuda/paged_attention_bench
  tests/bench/gpu_decode_bench
  worker/parallel/cuda_tensor_parallel_test
  tests/bench/gpu_tp_bench
  router/router_route_bench
  tests/bench/spec_decode_bench
)
targets=()
for b in "${bins[@]}"; do targets+=("$(basename "$b")"); done
cmake --build "$BUILD_DIR" -j "$(nproc)" --target "${targets[@]}"

out=.gpu/bundle
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib"
for b in "${bins[@]}"; do
  strip --strip-all -o "$out/bin/$(basename "$b")" "$BUILD_DIR/$b"
done
# Every library except the C runtime, the loader and CUDA's (present there).
for b in "${bins[@]}"; do
  ldd "$BUILD_DIR/$b" | awk '/=> \// {print $3}'
done | sort -u |
  grep -v -E '/(libc|libm|libpthread|libdl|librt|ld-linux[^/]*|libgcc_s)\.so' |
  grep -v -E '/(libcublas|libcublasLt|libnccl|libcudart)\.so' |
  while read -r lib; do cp -L "$lib" "$out/lib/"; done
strip --strip-unneeded "$out"/lib/*.so* 2>/dev/null || true
tar -C .gpu -cf - bundle | xz -9e -T2 >.gpu/bundle.tar.xz
du -sh "$out" .gpu/bundle.tar.xz
