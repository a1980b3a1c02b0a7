#!/usr/bin/env bash
# The main job: installs, builds, starts a local cluster (router, worker,
# drafter) on loopback, checks that every service is healthy, prints their
# metrics endpoints, and stops them cleanly with SIGTERM.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh >/dev/null
BUILD_DIR=${BUILD_DIR:-build}
bin="$BUILD_DIR/services"
run_dir=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT

start() {  # name binary service
  local name=$1 binary=$2
  "$binary" --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 --drain_grace=200ms \
    --port_file="$run_dir/$name.ports" >"$run_dir/$name.log" 2>&1 &
  pids+=("$!")
  for _ in $(seq 100); do [ -s "$run_dir/$name.ports" ] && break; sleep 0.1; done
  [ -s "$run_dir/$name.ports" ] || { echo "$name did not start:"; cat "$run_dir/$name.log"; exit 1; }
}
port() { grep "^$2=" "$run_dir/$1.ports" | cut -d= -f2; }

start worker "$bin/worker/tessera-worker"
start drafter "$bin/drafter/tessera-drafter"
start router "$bin/router/tessera-router"

for svc in "worker tessera.v1.Worker" "drafter tessera.v1.Drafter" "router tessera.v1.Inference"; do
  set -- $svc
  "$bin/cli/tessera" health --target="127.0.0.1:$(port "$1" grpc_port)" --service="$2" --wait=10s
done
echo
echo "metrics endpoints:"
for name in router worker drafter; do
  url="http://127.0.0.1:$(port $name metrics_port)/metrics"
  printf '  %-8s %s  (%s)\n' "$name" "$url" \
    "$(curl -fsS "$url" | grep -c '^tessera_' ) tessera_* samples"
done
echo
echo "stopping (SIGTERM, graceful drain)"
status=0
for i in "${!pids[@]}"; do
  kill -TERM "${pids[$i]}"
  wait "${pids[$i]}" || status=$?
done
pids=()
[ "$status" -eq 0 ] && echo "all services exited cleanly" || { echo "a service exited with $status"; exit 1; }
