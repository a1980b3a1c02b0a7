#!/usr/bin/env bash
# On the GPU machine: the worker pod of a Kubernetes overlay, started with
# the flags and environment the manifests render (tests/deploy/pod_flags.py
# wrote POD_DIR from `kubectl kustomize`, scripts/gpu-bundle.sh carries it):
# the drafter sidecar with drafter.flags, the worker with worker.flags
# (--device=cuda, its tensor-parallel size, --drafter=127.0.0.1:50071), and
# a router with router.flags finding the worker through --workers_dns. Only
# what the machine differs in is overridden, after the flag file: the model
# (models/target for /models/default), loopback ports for gRPC and metrics
# except the drafter's gRPC port the worker is pointed at, the DNS name
# (localhost for the headless Service), the CUDA cache path. Checks: the
# rendered worker flags say --device=cuda; the worker's ranks are CUDA
# runners; a greedy request for each fixture prompt through the router
# gives transformers' continuation up to the first near tie (as
# cluster_on_gpu.sh); the worker heard from its drafter; all stop cleanly.
# Usage: tests/gpu/pod_on_gpu.sh BIN_DIR POD_DIR
set -euo pipefail
bin=$1
pod=$2
run=$(mktemp -d)
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done' EXIT
grep -qx -- '--device=cuda' "$pod/worker.flags" || { echo "the rendered worker flags lack --device=cuda"; exit 1; }
tp=$(grep -- '^--tensor_parallel_size=' "$pod/worker.flags" | tail -1 | cut -d= -f2)
echo "rendered worker: --device=cuda --tensor_parallel_size=$tp; env: $(tr '\n' ' ' <"$pod/worker.env")"
while IFS='=' read -r k v; do [[ -n $k ]] && export "$k=$v"; done <"$pod/worker.env"
export CUDA_CACHE_PATH=$run/cuda-cache   # the pod's path is an emptyDir mount
port_of() {  # port_of FILE KEY PID
  for _ in $(seq 3000); do
    [[ -f $1 ]] && { sed -n "s/^$2=//p" "$1"; return 0; }
    kill -0 "$3" 2>/dev/null || return 1
    sleep 0.2
  done
  return 1
}
"$bin/tessera-drafter" --flagfile="$pod/drafter.flags" --metrics_listen=127.0.0.1:0 \
  --port_file="$run/drafter.port" >"$run/drafter.log" 2>&1 &
pids+=($!)
port_of "$run/drafter.port" grpc_port $! >/dev/null || { cat "$run/drafter.log"; exit 1; }
"$bin/tessera-worker" --flagfile="$pod/worker.flags" --model=models/target \
  --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 --port_file="$run/worker.port" >"$run/worker.log" 2>&1 &
wpid=$!
pids+=($wpid)
wport=$(port_of "$run/worker.port" grpc_port $wpid) || { cat "$run/worker.log"; exit 1; }
wmetrics=$(port_of "$run/worker.port" metrics_port $wpid)
"$bin/tessera" health --target="127.0.0.1:$wport" --service=tessera.v1.Worker --wait=600s ||
  { cat "$run/worker.log"; exit 1; }
ranks=$(grep -c "cuda runner ready" "$run/worker.log" || true)
echo "worker ready; cuda runners: $ranks"
[[ $ranks -eq $tp ]] || { echo "expected $tp CUDA runners"; cat "$run/worker.log"; exit 1; }
"$bin/tessera-router" --flagfile="$pod/router.flags" --workers_dns="localhost:$wport" \
  --tokenizer=models/target --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 \
  --port_file="$run/router.port" >"$run/router.log" 2>&1 &
rpid=$!
pids+=($rpid)
rport=$(port_of "$run/router.port" grpc_port $rpid) || { cat "$run/router.log"; exit 1; }
"$bin/tessera" health --target="127.0.0.1:$rport" --service=tessera.v1.Inference --wait=60s
grep -m1 'workers from DNS' "$run/router.log"
python3 - "$bin/tessera" "127.0.0.1:$rport" <<'PY'
import json, subprocess, sys, time
tessera, router = sys.argv[1], sys.argv[2]
cases = json.load(open("models/fixtures/target_expected.json"))["cases"]
compared = 0
for i, c in enumerate(cases):
    want, margins = c["greedy_ids"], c["greedy_top2_margins"]
    n = 0
    while n < len(want) and margins[n] >= 0.25:
        n += 1
    for attempt in range(100):  # the first until the router has seen the worker SERVING
        out = subprocess.run([tessera, "generate", f"--generate_target={router}", "--temperature=0",
                              "--ignore_eos", f"--max_tokens={len(want)}",
                              "--prompt_ids=" + ",".join(map(str, c["prompt_ids"]))],
                             capture_output=True, text=True, timeout=120)
        if out.returncode == 0 or i > 0:
            break
        time.sleep(0.1)
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
rtt=$(python3 -c "import urllib.request,sys; print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())" \
  "http://127.0.0.1:$wmetrics/metrics" | sed -n 's/^tessera_spec_decode_drafter_rtt_seconds_count\({[^}]*}\)\? //p' | head -1)
echo "worker: drafter round trips answered: ${rtt:-none}"
[[ -n $rtt && ${rtt%.*} -gt 0 ]] || { echo "the worker never heard from its drafter sidecar"; exit 1; }
kill -TERM $rpid; wait $rpid
kill -TERM $wpid; wait $wpid
echo "pod stopped cleanly"
