#!/usr/bin/env bash
# Fails when a source file breaks the module layout (docs/architecture.md):
#   - dependencies run one way: services -> router / worker -> text /
#     kernels -> base; router/ and worker/ never include each other, and
#     nothing below includes what sits above it;
#   - only kernels/cuda (and tests/, whose GPU tests and benchmarks drive
#     the kernels directly) include CUDA, cuBLAS, NCCL or CUPTI headers.
# Prints every offending line. Usage: scripts/check_layout.sh [repo root]
set -uo pipefail
root="${1:-$(cd "$(dirname "$0")/.." && pwd)}"
cd "$root" || exit 2
sources() { find "$@" -type f \( -name '*.h' -o -name '*.cc' -o -name '*.cu' -o -name '*.cuh' \) 2>/dev/null; }
bad=0
# forbid <folder> <include prefix...>: files under <folder> may not include
# headers under any of the prefixes.
forbid() {
  local folder="$1"; shift
  local alternation
  alternation=$(IFS='|'; echo "$*")
  local hits
  hits=$(sources "$folder" | xargs -r grep -nE "^[[:space:]]*#[[:space:]]*include[[:space:]]+\"(${alternation})/" || true)
  if [[ -n "$hits" ]]; then
    echo "check_layout: $folder/ must not include $*:"
    echo "$hits"
    bad=1
  fi
}
forbid router worker services
forbid worker router services
forbid text worker router services kernels
forbid kernels worker router services text
forbid base worker router services text kernels
# CUDA headers: product code outside kernels/cuda stays free of them.
cuda_hits=$(sources base kernels text worker router services |
  grep -v '^kernels/cuda/' |
  xargs -r grep -nE '^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"](cuda|cuda_runtime|cuda_runtime_api|cuda_bf16|cuda_fp16|cuda_fp8|cublas|cublasLt|cublas_v2|nccl|cupti|nvrtc|cub/|thrust/)[^>"]*[>"]' || true)
if [[ -n "$cuda_hits" ]]; then
  echo "check_layout: CUDA headers outside kernels/cuda:"
  echo "$cuda_hits"
  bad=1
fi
if [[ $bad -eq 0 ]]; then echo "check_layout: ok"; fi
exit $bad
