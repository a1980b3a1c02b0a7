#!/usr/bin/env bash
# The decisions of scripts/demo.sh (GPU or not, CUDA or not, which code
# images, where the workers run) with a fake nvidia-smi and a fake nvcc on
# PATH, through DEMO_PLAN_ONLY=1, and the nvidia-smi → code image mapping of
# TESSERA_CUDA_ARCHS=native in cmake/TesseraCuda.cmake, through cmake -P.
# Nothing is built or installed. Usage: demo_plan_test.sh SOURCE_DIR
set -uo pipefail
src=$(cd "${1:?usage: demo_plan_test.sh SOURCE_DIR}" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/bin"
# nvidia-smi as the driver answers: FAKE_SMI_RC (exit status), FAKE_SMI_GPUS
# (pci.bus_id,name lines) and FAKE_SMI_CAPS (compute_cap lines).
cat >"$work/bin/nvidia-smi" <<'SMI'
#!/usr/bin/env bash
[ "${FAKE_SMI_RC:-0}" = 0 ] || { echo "No devices were found" >&2; exit "$FAKE_SMI_RC"; }
case "$*" in
  *--query-gpu=pci.bus_id,name*) printf '%b' "${FAKE_SMI_GPUS:-}" ;;
  *--query-gpu=compute_cap*) printf '%b' "${FAKE_SMI_CAPS:-}" ;;
  *) echo "fake nvidia-smi: unexpected arguments: $*" >&2; exit 2 ;;
esac
SMI
printf '#!/bin/sh\nexit 0\n' >"$work/bin/nvcc"
chmod +x "$work/bin/nvidia-smi" "$work/bin/nvcc"
export PATH="$work/bin:/usr/bin:/bin"
h200='00000000:18:00.0, NVIDIA H200\n00000000:2A:00.0, NVIDIA H200\n'

failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# plan NAME EXPECTED... -- runs demo.sh's plan with the current environment
# and checks each key=value it is given.
plan() {
  local name=$1; shift
  local out
  out=$(env -u TESSERA_CUDA -u TESSERA_CUDA_ARCHS -u BUILD_DIR "${envs[@]}" \
        DEMO_PLAN_ONLY=1 bash "$src/scripts/demo.sh" 2>&1)
  local rc=$?
  [ $rc = 0 ] || { fail "$name: demo.sh exited $rc: $out"; return; }
  for want in "$@"; do
    grep -qxF -- "$want" <<<"$out" || fail "$name: want '$want' in:"$'\n'"$out"
  done
}

envs=(FAKE_SMI_RC=6 CUDACXX="$work/bin/nvcc")
plan "no GPU (nvidia-smi fails)" gpu=none cuda=OFF archs=default build_dir=build-demo device=cpu \
  worker_args=--kv_cache_memory_mb=64 note=
envs=(FAKE_SMI_GPUS= CUDACXX="$work/bin/nvcc")
plan "no GPU (nvidia-smi lists none)" gpu=none cuda=OFF build_dir=build-demo device=cpu
envs=(FAKE_SMI_GPUS="$h200" CUDACXX="$work/bin/nvcc")
plan "GPU and nvcc" gpu=00000000:18:00.0 cuda=ON archs=native build_dir=build-demo-cuda \
  device=cuda:00000000:18:00.0 \
  worker_args=--device=cuda:00000000:18:00.0,--gpu_memory_fraction=0.3 note=
envs=(FAKE_SMI_GPUS="$h200" CUDACXX="$work/bin/nvcc" TESSERA_CUDA_ARCHS='sm_90a;compute_90a')
plan "GPU, archs given" cuda=ON 'archs=sm_90a;compute_90a' device=cuda:00000000:18:00.0
envs=(FAKE_SMI_GPUS="$h200" CUDACXX="$work/nvcc-missing")
plan "GPU without nvcc" cuda=OFF device=cpu build_dir=build-demo \
  'note=a GPU is here (NVIDIA H200) but no CUDA compiler (nvcc on PATH, /usr/local/cuda or $CUDACXX): building for the CPU'
envs=(FAKE_SMI_GPUS="$h200" CUDACXX="$work/bin/nvcc" TESSERA_CUDA=OFF)
plan "GPU, CUDA off" cuda=OFF device=cpu build_dir=build-demo
envs=(FAKE_SMI_RC=6 CUDACXX="$work/bin/nvcc" TESSERA_CUDA=ON)
plan "no GPU, CUDA on" cuda=ON archs=default device=cpu build_dir=build-demo-cuda \
  worker_args=--kv_cache_memory_mb=64
envs=(FAKE_SMI_GPUS="$h200" CUDACXX="$work/bin/nvcc" BUILD_DIR=/tmp/elsewhere)
plan "build dir given" build_dir=/tmp/elsewhere
out=$(env TESSERA_CUDA=maybe DEMO_PLAN_ONLY=1 bash "$src/scripts/demo.sh" 2>&1)
[ $? = 2 ] || fail "TESSERA_CUDA=maybe: want exit 2, got: $out"

# native → images: cmake -P on a script that includes TesseraCuda.cmake.
cat >"$work/native.cmake" <<CM
include("$src/cmake/TesseraCuda.cmake")
tessera_native_cuda_archs(images)
message("images=\${images}")
CM
native() {  # native CAPS EXPECTED ("fatal" = a configure error)
  local out
  out=$(FAKE_SMI_CAPS="$1" cmake -P "$work/native.cmake" 2>&1)
  local rc=$?
  if [ "$2" = fatal ]; then
    [ $rc != 0 ] && grep -q 'TESSERA_CUDA_ARCHS=native' <<<"$out" ||
      fail "caps '$1': want a configure error naming TESSERA_CUDA_ARCHS=native, got: $out"
  else
    [ $rc = 0 ] && grep -qxF "images=$2" <<<"$out" || fail "caps '$1': want images=$2, got: $out"
  fi
}
native '9.0\n' 'sm_90a'
native '9.0\n9.0\n' 'sm_90a'
native '10.0\n12.0\n' 'sm_100a;sm_120'
native '8.0\n8.6\n8.9\n' 'sm_80;sm_86;sm_89'
native '12.1\n' 'sm_121'
native '10.3\n' 'sm_103'
native '' fatal
native '[N/A]\n' fatal
out=$(FAKE_SMI_RC=9 cmake -P "$work/native.cmake" 2>&1)
[ $? != 0 ] && grep -q 'failed' <<<"$out" || fail "nvidia-smi failing: want a configure error, got: $out"

if [ $failures -gt 0 ]; then echo "$failures failure(s)"; exit 1; fi
echo "demo plan and native code images: all cases pass"
