#!/usr/bin/env bash
# Builds what the GPU machine runs and bundles it: the service binaries, the
# CUDA tests and the GPU benchmarks, stripped, plus the non-system shared
# libraries they need (from ldd), packed into .gpu/bundle.tar.xz (git-ignored)
# to carry there. CUDA's own libraries (cuBLAS, NCCL, cudart) are not
# bundled: the GPU machine has the same CUDA 13 toolkit in /usr/local/cuda.
# On the GPU machine, `bash scripts/gpu-run.sh OUT_DIR` unpacks and runs it.
#
# It also carries the worker pod's flags and environment as the Kubernetes
# overlays render them (bundle/pod/<overlay>/, from kubectl kustomize and
# tests/deploy/pod_flags.py), for gpu-run.sh's deploy_pod_on_gpu step.
#
# Usage: scripts/gpu-bundle.sh [BUILD_DIR]   (default build-gpu; configured
#        with CUDA on and TESSERA_CUDA_ARCHS from the environment or the default)
#        scripts/gpu-bundle.sh --deploy-only BUILD_DIR
#            only the four service binaries, from BUILD_DIR as it is
#            configured (it must have CUDA on), for `gpu-run.sh OUT --deploy`
set -euo pipefail
cd "$(dirname "$0")/.."
DEPLOY_ONLY=0
if [[ "${1:-}" == --deploy-only ]]; then DEPLOY_ONLY=1; shift; fi
BUILD_DIR=${1:-build-gpu}
archs=()
if [[ -n "${TESSERA_CUDA_ARCHS:-}" ]]; then archs=(-DTESSERA_CUDA_ARCHS="$TESSERA_CUDA_ARCHS"); fi
if [[ $DEPLOY_ONLY == 0 ]]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTESSERA_CUDA=ON "${archs[@]}" >/dev/null
else
  grep -q '^TESSERA_CUDA_ARCHS:' "$BUILD_DIR/CMakeCache.txt" ||
    { echo "gpu-bundle: $BUILD_DIR is not a configured CUDA build" >&2; exit 1; }
fi
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
  kernels/cuda/cuda_moe_routing_test
  kernels/cuda/cuda_moe_experts_test
  worker/sampling/cuda_sampling_test
  kernels/cuda/cuda_decode_rope_test
  kernels/cuda/cuda_p2p_all_reduce_test
  kernels/cuda/paged_attention_test
  kernels/cuda/prefill_attention_sm90_test
  worker/runner/cuda/cuda_model_runner_test
  tests/bench/cuda_ops_bench
  tests/bench/moe_kernel_bench
  tests/bench/gemm_search_bench
  tests/bench/paged_attention_bench
  tests/bench/gpu_decode_bench
  worker/parallel/cuda_tensor_parallel_test
  tests/bench/gpu_tp_bench
  tests/bench/router_route_bench
  tests/bench/spec_decode_bench
)
if [[ $DEPLOY_ONLY == 1 ]]; then bins=("${bins[@]:0:4}"); fi
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
# The tests' ctest entries (their arguments: a GPU test's filter), for gpu-run.sh.
ctest --test-dir "$BUILD_DIR" --show-only=json-v1 >"$out/ctest.json"
# The worker pod as the overlays render it: 8 GPUs (single-node, the base's
# reference node) and 1 GPU (single-gpu).
for overlay in single-node single-gpu; do
  kubectl kustomize "deploy/k8s/overlays/$overlay" 2>/dev/null >"$out/$overlay.yaml"
  for w in StatefulSet/tessera-worker Deployment/tessera-router; do
    /usr/bin/python3 tests/deploy/pod_flags.py "$w" "$out/pod/$overlay" <"$out/$overlay.yaml"
  done
  rm "$out/$overlay.yaml"
done
tar -C .gpu -cf - bundle | xz -9e -T2 >.gpu/bundle.tar.xz
du -sh "$out" .gpu/bundle.tar.xz
