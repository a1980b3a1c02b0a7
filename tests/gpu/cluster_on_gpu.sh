#!/usr/bin/env bash
# End to end on the GPU machine: `tessera up` with a worker on the GPU
# (tessera-worker --device=<dev>, the trained target) behind a router; a
# greedy request for each fixture prompt through the router must give
# transformers' continuation up to the first near tie (top-2 margin < 0.25,
# the bf16 tolerance of cuda_model_runner_test); the worker's /metrics must
# answer; the cluster must stop cleanly on SIGINT. EXTRA_WORKER_ARGS (comma
# separated) go to the worker as well, e.g. --tensor_parallel_size=2 with
# DEVICE cuda for a worker whose two ranks sample on the GPUs.
# Usage: tests/gpu/cluster_on_gpu.sh BIN_DIR DEVICE [EXTRA_WORKER_ARGS]
set -euo pipefail
bin=$1
dev=$2
extra=${3:+,$3}
run=$(mktemp -d)
"$bin/tessera" up --bin_dir="$bin" --workers=1 --up_model=models/target --run_dir="$run" \
  --worker_args="--device=$dev,--kv_cache_blocks=512$extra" >"$run/up.out" 2>&1 &
up=$!
trap 'kill -INT $up 2>/dev/null || true' EXIT
for _ in $(seq 900); do
  grep -q '^router=' "$run/up.out" && break
  kill -0 $up 2>/dev/null || { cat "$run/up.out" "$run"/*.log; exit 1; }
  sleep 0.2
done
router=$(grep '^router=' "$run/up.out" | cut -d= -f2)
[ -n "$router" ] || { echo "cluster did not start"; cat "$run/up.out"; exit 1; }
grep -h "cuda runner ready" "$run"/worker-0.log | head -1 || true
if [[ "$extra" =~ tensor_parallel_size=([0-9]+) ]]; then  # one runner per rank
  ranks=$(grep -c "cuda runner ready" "$run"/worker-0.log || true)
  echo "worker ranks ready: $ranks"
  [ "$ranks" -eq "${BASH_REMATCH[1]}" ] || { echo "expected ${BASH_REMATCH[1]} ranks"; exit 1; }
fi
python3 - "$bin/tessera" "$router" <<'PY'
import json, subprocess, sys
tessera, router = sys.argv[1], sys.argv[2]
cases = json.load(open("models/fixtures/target_expected.json"))["cases"]
compared = 0
for c in cases:
    want, margins = c["greedy_ids"], c["greedy_top2_margins"]
    n = 0
    while n < len(want) and margins[n] >= 0.25:
        n += 1
    out = subprocess.run([tessera, "generate", f"--generate_target={router}", "--temperature=0",
                          "--ignore_eos", f"--max_tokens={len(want)}",
                          "--prompt_ids=" + ",".join(map(str, c["prompt_ids"]))],
                         capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        sys.exit(f"generate failed: {out.stderr[-1500:]}")
    got = [int(t) for t in out.stdout.split()]
    print(f"prompt of {len(c['prompt_ids'])} tokens: {n} compared, "
          f"{'match' if got[:n] == want[:n] else 'MISMATCH'}")
    if got[:n] != want[:n]:
        sys.exit(f"got {got}\nwant {want}")
    compared += n
if compared < 3:
    sys.exit("fewer than 3 tokens compared")
PY
port=$(grep '^  worker-0' "$run/up.out" | grep -o 'metrics http://127.0.0.1:[0-9]*' | grep -o '[0-9]*$')
samples=$(python3 -c "import urllib.request,sys; print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())" \
  "http://127.0.0.1:$port/metrics" | grep -c '^tessera_worker_')
echo "worker /metrics: $samples tessera_worker_* samples"
[ "$samples" -gt 0 ]
kill -INT $up
trap - EXIT
wait $up
echo "cluster stopped cleanly"
