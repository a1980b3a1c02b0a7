#!/usr/bin/env bash
# The first thing to run: installs the dependencies, builds the four
# binaries, starts a local cluster on loopback with `tessera up` (2 workers
# serving a model, a drafter, a router), streams a generation through the
# router, prints the services' metrics endpoints and stops the cluster
# cleanly (SIGINT → graceful drain of every service).
#
# Where it runs: with a GPU (nvidia-smi reports one) and the CUDA toolkit
# (nvcc), it builds the CUDA backend for that GPU's code images only
# (TESSERA_CUDA_ARCHS=native) into build-demo-cuda/ and runs the workers on
# the first GPU (--device=cuda:<PCI bus id>). Otherwise it builds without
# CUDA into build-demo/ and runs the workers on the CPU. Neither touches
# build/, the development build.
#
# Defaults: the workers serve models/target (the trained 15.7M-parameter
# Qwen3 test model, see models/MODEL_CARD.md), the router tokenizes with its
# tokenizer, and the demo streams, as text, the greedy completion (64 tokens)
# of a Python prompt. Environment overrides:
#   TESSERA_CUDA        AUTO (default: on with a GPU and nvcc), ON or OFF
#   TESSERA_CUDA_ARCHS  code images to build (default: native with a GPU,
#                       else CMake's full list)
#   BUILD_DIR           build directory (default build-demo or build-demo-cuda)
#   BUILD_TYPE          CMake build type (default Release)
#   MODEL               model directory the workers serve (default models/target)
#   TOKENIZER           tokenizer directory for the router (default: $MODEL)
#   DRAFT_MODEL         draft model the drafter runs for speculative decoding
#                       (default models/draft; empty = no speculation)
#   PROMPT              prompt text (default: the start of a Python function)
#   MAX_TOKENS          tokens to generate (default 64)
#   DEMO_PLAN_ONLY=1    print the plan (key=value lines) and exit: no
#                       install, no build (tests/scripts/demo_plan_test.sh)
# A model directory without tokenizer.json (e.g. tests/fixtures/models/
# qwen3_tiny) is demonstrated with token ids in and out instead.
set -euo pipefail
cd "$(dirname "$0")/.."

# ---- The plan: is there a GPU, a CUDA compiler, and what to build. ----
gpu_bus_id=""
gpu_name=""
if command -v nvidia-smi >/dev/null 2>&1; then
  # All of it, then the first line (a pipe into head could cut nvidia-smi off).
  first=$(nvidia-smi --query-gpu=pci.bus_id,name --format=csv,noheader 2>/dev/null) || first=""
  first=${first%%$'\n'*}
  if [[ "$first" == *:*,* ]]; then  # a bus id such as 00000000:18:00.0, then the name
    gpu_bus_id=$(tr -d '[:space:]' <<<"${first%%,*}")
    gpu_name=$(sed 's/^ *//' <<<"${first#*,}")
  fi
fi
nvcc=""
if [ -n "${CUDACXX:-}" ]; then candidates=("$CUDACXX")  # CMake's own override
else candidates=("$(command -v nvcc || true)" /usr/local/cuda/bin/nvcc); fi
for c in "${candidates[@]}"; do
  if [ -n "$c" ] && [ -x "$c" ]; then nvcc=$c; break; fi
done

note=""
case "${TESSERA_CUDA:-AUTO}" in
  ON) cuda=ON ;;
  OFF) cuda=OFF ;;
  AUTO)
    if [ -n "$gpu_bus_id" ] && [ -n "$nvcc" ]; then cuda=ON; else cuda=OFF; fi
    if [ -n "$gpu_bus_id" ] && [ -z "$nvcc" ]; then
      note="a GPU is here ($gpu_name) but no CUDA compiler (nvcc on PATH, /usr/local/cuda or"
      note+=" \$CUDACXX): building for the CPU"
    fi ;;
  *) echo "demo: TESSERA_CUDA=${TESSERA_CUDA} is not AUTO, ON or OFF" >&2; exit 2 ;;
esac
archs=""
device=cpu
worker_args=--kv_cache_memory_mb=64
if [ "$cuda" = ON ]; then
  archs=${TESSERA_CUDA_ARCHS:-}
  if [ -n "$gpu_bus_id" ]; then
    archs=${archs:-native}
    device="cuda:$gpu_bus_id"
    # Both workers share the GPU: each sizes its KV cache as a share of the
    # memory it finds free (--kv_cache_memory_mb is the CPU's budget).
    worker_args="--device=$device,--gpu_memory_fraction=0.3"
  fi
fi
BUILD_DIR=${BUILD_DIR:-$([ "$cuda" = ON ] && echo build-demo-cuda || echo build-demo)}
if [ "${DEMO_PLAN_ONLY:-0}" = 1 ]; then
  printf 'gpu=%s\ncuda=%s\narchs=%s\nbuild_dir=%s\ndevice=%s\nworker_args=%s\nnote=%s\n' \
    "${gpu_bus_id:-none}" "$cuda" "${archs:-default}" "$BUILD_DIR" "$device" "$worker_args" "$note"
  exit 0
fi

bash scripts/install-deps.sh
[ -z "$note" ] || echo "demo: $note"

# ---- Build: only the binaries the demo runs (scripts/build.sh builds everything). ----
# Release: no debug info, so the first build compiles and links faster.
cmake_args=(-S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-Release}"
  -DTESSERA_CUDA="$cuda")
[ -z "$archs" ] || cmake_args+=(-DTESSERA_CUDA_ARCHS="$archs")
[ -z "$nvcc" ] || [ "$cuda" = OFF ] || cmake_args+=(-DCMAKE_CUDA_COMPILER="$nvcc")
mkdir -p "$BUILD_DIR"
echo "demo: configuring $BUILD_DIR (CUDA $cuda${archs:+, code images: $archs}; log in" \
  "$BUILD_DIR/demo-configure.log)"
if ! cmake "${cmake_args[@]}" >"$BUILD_DIR/demo-configure.log" 2>&1; then
  tail -n 40 "$BUILD_DIR/demo-configure.log"
  echo "demo: configuring failed; the whole log is $BUILD_DIR/demo-configure.log" >&2
  exit 1
fi
grep 'Tessera CUDA' "$BUILD_DIR/demo-configure.log" | sed 's/^-- /demo: /' || true
build_start=$(date +%s)
echo "demo: building tessera, tessera-worker, tessera-router, tessera-drafter with $(nproc)" \
  "jobs (a first CPU-only build took 6 minutes on 2 cores; later runs rebuild only what changed)"
# Ninja's own progress: one updating line on a terminal, a line per step
# in a log. [done/total percent elapsed].
NINJA_STATUS="[%f/%t %p %es] " cmake --build "$BUILD_DIR" -j "$(nproc)" --target tessera \
  tessera-worker tessera-router tessera-drafter
echo "demo: build done in $(( $(date +%s) - build_start )) s"

# ---- Run: a local cluster on loopback. ----
tessera="$BUILD_DIR/services/cli/tessera"
MODEL=${MODEL:-models/target}
TOKENIZER=${TOKENIZER:-$MODEL}
PROMPT=${PROMPT:-$'def fibonacci(n):\n    """Return the nth Fibonacci number."""\n    if n <= 1:\n        return n\n'}
MAX_TOKENS=${MAX_TOKENS:-64}
run_dir=$(mktemp -d)

up_args=(--workers=2 --up_model="$MODEL" --run_dir="$run_dir" --worker_args="$worker_args")
if [ -f "$TOKENIZER/tokenizer.json" ]; then
  up_args+=(--up_tokenizer="$TOKENIZER")
fi
# Speculative decoding: the drafter runs the 3.1M-parameter draft model
# (models/draft, same tokenizer) and the workers verify its proposals
# losslessly (greedy output is what the target alone would write).
# DRAFT_MODEL= (empty) turns it off.
DRAFT_MODEL=${DRAFT_MODEL-models/draft}
if [ -n "$DRAFT_MODEL" ] && [ -f "$DRAFT_MODEL/config.json" ]; then
  up_args+=(--up_draft_source=model --up_draft_model="$DRAFT_MODEL")
fi

echo "demo: starting 2 workers on ${device}${gpu_name:+ ($gpu_name)}, a drafter and a router"
"$tessera" up "${up_args[@]}" >"$run_dir/up.out" 2>&1 &
up_pid=$!
trap 'kill -INT $up_pid 2>/dev/null || true' EXIT
for _ in $(seq 600); do
  grep -q '^router=' "$run_dir/up.out" && break
  kill -0 $up_pid 2>/dev/null || { cat "$run_dir/up.out"; exit 1; }
  sleep 0.2
done
grep -q '^router=' "$run_dir/up.out" || { echo "cluster did not start"; cat "$run_dir/up.out"; exit 1; }
cat "$run_dir/up.out"
router=$(grep '^router=' "$run_dir/up.out" | cut -d= -f2)

echo
if [ -f "$TOKENIZER/tokenizer.json" ]; then
  echo "streaming a greedy completion of $MAX_TOKENS tokens through the router ($MODEL${DRAFT_MODEL:+, drafts from $DRAFT_MODEL}):"
  echo "----"
  "$tessera" generate --generate_target="$router" --prompt="$PROMPT" --max_tokens="$MAX_TOKENS" \
    --temperature=0
  echo "----"
else
  echo "streaming a completion (token ids; $MODEL has no tokenizer) through the router:"
  "$tessera" generate --generate_target="$router" --prompt_ids=33,110,269,364,168 --max_tokens=32 \
    --ignore_eos
fi
echo
for port in $(grep -o 'metrics http://127.0.0.1:[0-9]*' "$run_dir/up.out" | grep -o '[0-9]*$'); do
  printf '  http://127.0.0.1:%s/metrics: %s tessera_* samples\n' "$port" \
    "$(curl -fsS "http://127.0.0.1:$port/metrics" | grep -c '^tessera_')"
done
spec() {  # sum of one counter over every worker's /metrics
  for port in $(grep '^  worker' "$run_dir/up.out" | grep -o 'metrics http://127.0.0.1:[0-9]*' |
      grep -o '[0-9]*$'); do
    curl -fsS "http://127.0.0.1:$port/metrics" | awk -v m="$1" '$1 == m {print $2}'
  done | awk '{s += $1} END {printf "%d", s}'
}
if [ -n "$DRAFT_MODEL" ]; then
  echo "speculative decoding: $(spec tessera_spec_decode_accepted_tokens_total) of" \
    "$(spec tessera_spec_decode_draft_tokens_total) draft tokens accepted"
fi
echo
echo "stopping (graceful drain)"
kill -INT $up_pid
trap - EXIT
wait $up_pid && echo "all services exited cleanly"
