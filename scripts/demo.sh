#!/usr/bin/env bash
# The main job: installs, builds, starts a local cluster on loopback with
# `tessera up` (2 workers serving a model, a drafter, a router), streams a
# generation through the router, prints the services' metrics endpoints and
# stops the cluster cleanly (SIGINT → graceful drain of every service).
#
# MODEL (default: the tiny Qwen3 reference model in tests/fixtures, which has
# no tokenizer, so the request goes in and out as token ids); PROMPT is text
# when the model directory has a tokenizer.json.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh >/dev/null
BUILD_DIR=${BUILD_DIR:-build}
tessera="$BUILD_DIR/services/cli/tessera"
MODEL=${MODEL:-tests/fixtures/models/qwen3_tiny}
PROMPT=${PROMPT:-def fibonacci(n):}
run_dir=$(mktemp -d)

"$tessera" up --workers=2 --up_model="$MODEL" --run_dir="$run_dir" >"$run_dir/up.out" 2>&1 &
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
if [ -f "$MODEL/tokenizer.json" ]; then
  echo "streaming a completion through the router:"
  "$tessera" generate --generate_target="$router" --prompt="$PROMPT" --max_tokens=64
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
echo
echo "stopping (graceful drain)"
kill -INT $up_pid
trap - EXIT
wait $up_pid && echo "all services exited cleanly"
