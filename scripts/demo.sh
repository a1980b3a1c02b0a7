#!/usr/bin/env bash
# The main job: installs, builds, starts a local cluster on loopback with
# `tessera up` (2 workers serving a model, a drafter, a router), streams a
# generation through the router, prints the services' metrics endpoints and
# stops the cluster cleanly (SIGINT → graceful drain of every service).
#
# Defaults: the workers serve models/target (the trained 15.7M-parameter
# Qwen3 test model, see models/MODEL_CARD.md), the router tokenizes with its
# tokenizer, and the demo streams, as text, the greedy completion (64 tokens)
# of a Python prompt. Environment overrides:
#   MODEL       model directory the workers serve (default models/target)
#   TOKENIZER   tokenizer directory for the router (default: $MODEL)
#   DRAFT_MODEL draft model the drafter runs for speculative decoding
#               (default models/draft; empty = no speculation)
#   PROMPT      prompt text (default: the start of a Python fibonacci function)
#   MAX_TOKENS  tokens to generate (default 64)
#   BUILD_DIR   build directory (default build)
# A model directory without tokenizer.json (e.g. tests/fixtures/models/
# qwen3_tiny) is demonstrated with token ids in and out instead.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
BUILD_DIR=${BUILD_DIR:-build}
# Only the binaries the demo runs (scripts/build.sh builds everything).
cmake -S . -B "$BUILD_DIR" -G Ninja -DTESSERA_CUDA="${TESSERA_CUDA:-AUTO}" >/dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)" --target tessera tessera-worker tessera-router \
  tessera-drafter >/dev/null
tessera="$BUILD_DIR/services/cli/tessera"
MODEL=${MODEL:-models/target}
TOKENIZER=${TOKENIZER:-$MODEL}
PROMPT=${PROMPT:-$'def fibonacci(n):\n    """Return the nth Fibonacci number."""\n    if n <= 1:\n        return n\n'}
MAX_TOKENS=${MAX_TOKENS:-64}
run_dir=$(mktemp -d)

up_args=(--workers=2 --up_model="$MODEL" --run_dir="$run_dir"
  --worker_args=--kv_cache_memory_mb=64)
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
