#!/usr/bin/env bash
# Router benchmarks, one command:
#
#   policies  prefix-aware routing vs round-robin and least-loaded on a
#             shared-prefix multi-tenant workload, with simulated workers whose
#             cost is time (each uncached prompt token costs PREFILL_US of
#             prefill, each decode step DECODE_US), a fresh cluster per policy.
#             -> tests/bench/results/router_prefix_vs_round_robin.json
#   latency   route-decision latency with ~1,000 requests in flight, from the
#             live router's histogram tessera_router_route_decision_seconds
#             (what the service observes around every RouteAndAssign), next to
#             the in-process figure of router_route_bench on the same machine.
#             -> tests/bench/results/router_route_decision_live.json
#
# Usage:
#   tests/bench/run_router_bench.sh [BUILD_DIR]      binaries of a build tree
#   TESSERA_BIN_DIR=DIR tests/bench/run_router_bench.sh
#       a bundle: DIR holds tessera, tessera-router, tessera-worker,
#       tessera-drafter and router_route_bench
#   or name each: TESSERA=... TESSERA_ROUTER=... TESSERA_WORKER=...
#       TESSERA_DRAFTER=... ROUTE_BENCH=...
# Environment:
#   PARTS="policies latency"   which parts to run (default both)
#   MACHINE="..."              description of the host, stored in the JSON
#                              (default: CPU model and core count from /proc)
#   RESULTS_DIR                where the JSON goes (default tests/bench/results)
#   LAT_RATE, LAT_REQUESTS, LAT_DECODE_US, LAT_WORKERS  the latency run's open
#                              loop: in flight ~= LAT_RATE x 32 x LAT_DECODE_US
#                              (defaults 300/s, 6000, 100 ms, 8: ~1,000 in
#                              flight for 20 s; on a 2-core machine use
#                              LAT_RATE=100 LAT_DECODE_US=300000 LAT_WORKERS=4)
# The default run takes about 2.5 minutes on a 16-core host.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
BUILD_DIR=${1:-build}
case "$BUILD_DIR" in /*) ;; *) BUILD_DIR="$repo/$BUILD_DIR" ;; esac
if [ -n "${TESSERA_BIN_DIR:-}" ]; then
  TESSERA=${TESSERA:-$TESSERA_BIN_DIR/tessera}
  TESSERA_ROUTER=${TESSERA_ROUTER:-$TESSERA_BIN_DIR/tessera-router}
  TESSERA_WORKER=${TESSERA_WORKER:-$TESSERA_BIN_DIR/tessera-worker}
  TESSERA_DRAFTER=${TESSERA_DRAFTER:-$TESSERA_BIN_DIR/tessera-drafter}
  ROUTE_BENCH=${ROUTE_BENCH:-$TESSERA_BIN_DIR/router_route_bench}
fi
TESSERA=${TESSERA:-$BUILD_DIR/services/cli/tessera}
TESSERA_ROUTER=${TESSERA_ROUTER:-$BUILD_DIR/services/router/tessera-router}
TESSERA_WORKER=${TESSERA_WORKER:-$BUILD_DIR/services/worker/tessera-worker}
TESSERA_DRAFTER=${TESSERA_DRAFTER:-$BUILD_DIR/services/drafter/tessera-drafter}
ROUTE_BENCH=${ROUTE_BENCH:-$BUILD_DIR/tests/bench/router_route_bench}
PARTS=${PARTS:-policies latency}
RESULTS_DIR=${RESULTS_DIR:-$repo/tests/bench/results}
for b in "$TESSERA" "$TESSERA_ROUTER" "$TESSERA_WORKER" "$TESSERA_DRAFTER"; do
  [ -x "$b" ] || { echo "error: $b is not an executable (set TESSERA_BIN_DIR or BUILD_DIR)" >&2; exit 2; }
done
if [[ " $PARTS " == *" latency "* ]] && [ ! -x "$ROUTE_BENCH" ]; then
  echo "error: $ROUTE_BENCH is not an executable (set ROUTE_BENCH)" >&2
  exit 2
fi
if [ -z "${MACHINE:-}" ]; then
  MACHINE="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(nproc) cores"
fi
export MACHINE

WORKERS=${WORKERS:-8}
TENANTS=${TENANTS:-32}
SYSTEM=${SYSTEM:-2048}
REQUESTS=${REQUESTS:-512}
CONCURRENCY=${CONCURRENCY:-32}
PREFILL_US=${PREFILL_US:-50}
DECODE_US=${DECODE_US:-4000}
KV_BLOCKS=${KV_BLOCKS:-1024}
SIM="vocab=32000,context=16384,prefill_us_per_token=$PREFILL_US,decode_step_us=$DECODE_US,decode_us_per_seq=20"
LAT_RATE=${LAT_RATE:-300}
LAT_REQUESTS=${LAT_REQUESTS:-6000}
LAT_DECODE_US=${LAT_DECODE_US:-100000}
LAT_WORKERS=${LAT_WORKERS:-8}
LAT_MIN_IN_FLIGHT=${LAT_MIN_IN_FLIGHT:-900}

# `tessera up` finds the service binaries in one folder: link them there.
bin_dir=$(mktemp -d)
out_dir=$(mktemp -d)
echo "logs and raw results: $out_dir" >&2
up_pid=""
sampler_pid=""
cleanup() {
  [ -n "$sampler_pid" ] && kill "$sampler_pid" 2>/dev/null || true
  [ -n "$up_pid" ] && kill -INT "$up_pid" 2>/dev/null && wait "$up_pid" 2>/dev/null || true
  rm -rf "$bin_dir"
}
trap cleanup EXIT
abs() { case "$1" in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }
ln -s "$(abs "$TESSERA")" "$bin_dir/tessera"
ln -s "$(abs "$TESSERA_ROUTER")" "$bin_dir/tessera-router"
ln -s "$(abs "$TESSERA_WORKER")" "$bin_dir/tessera-worker"
ln -s "$(abs "$TESSERA_DRAFTER")" "$bin_dir/tessera-drafter"

# Starts a cluster: run_dir workers sim kv_blocks max_num_seqs policy. Sets
# $up_pid, $router and $metrics_port.
start_cluster() {
  local run=$1 workers=$2 sim=$3 kv=$4 seqs=$5 policy=$6
  mkdir -p "$run"
  : >"$run/up.out"
  "$TESSERA" up --bin_dir="$bin_dir" --workers="$workers" --up_simulate="$sim" --run_dir="$run" \
    --worker_args="--kv_cache_blocks=$kv,--max_num_seqs=$seqs,--max_waiting=4096" \
    --router_args="--policy=$policy,--max_in_flight=4096" >"$run/up.out" 2>&1 &
  up_pid=$!
  for _ in $(seq 600); do grep -q '^router=' "$run/up.out" && break; sleep 0.2; done
  router=$(grep '^router=' "$run/up.out" | cut -d= -f2)
  [ -n "$router" ] || { echo "error: the cluster did not start:" >&2; cat "$run/up.out" >&2; exit 1; }
  metrics_port=$(grep '^  router' "$run/up.out" | grep -o 'metrics http://127.0.0.1:[0-9]*' |
    grep -o '[0-9]*$')
}

stop_cluster() {
  kill -INT "$up_pid"
  wait "$up_pid" || true
  up_pid=""
}

run_policy() {  # policy
  local policy=$1
  local run="$out_dir/$policy"
  start_cluster "$run" "$WORKERS" "$SIM" "$KV_BLOCKS" 256 "$policy"
  "$TESSERA" bench --target="$router" --requests="$REQUESTS" --concurrency="$CONCURRENCY" \
    --tenants="$TENANTS" --system_prompt_tokens="$SYSTEM" --prompt_len=32:128 --output_len=32 \
    --vocab=32000 --seed=7 --channels=8 --out="$run/bench.json" >"$run/bench.log" 2>&1
  stop_cluster
  echo "$run"
}

loadavg() { cut -d' ' -f1-3 /proc/loadavg; }

if [[ " $PARTS " == *" policies "* ]]; then
  LOAD_START=$(loadavg)
  cost=$(run_policy cost)
  rr=$(run_policy round_robin)
  ll=$(run_policy least_loaded)
  WORKERS=$WORKERS KV_BLOCKS=$KV_BLOCKS SIM=$SIM COMMAND="$0 $*" LOAD_START=$LOAD_START \
  LOAD_END=$(loadavg) \
  python3 - "$cost" "$rr" "$ll" >"$RESULTS_DIR/router_prefix_vs_round_robin.json" <<'PY'
import json, os, sys
cost, rr, ll = sys.argv[1:4]
def load(d): return json.load(open(d + "/bench.json"))
def summary(d):
    b = load(d)
    return {"output_token_throughput": b["output_token_throughput"],
            "request_throughput": b["request_throughput"],
            "ttft_ms": {k: b["ttft_ms"][k] for k in ("p50", "p90", "p99")},
            "e2e_ms": {k: b["e2e_ms"][k] for k in ("p50", "p90")},
            "cached_fraction": b["tokens"]["cached_fraction"],
            "succeeded": b["requests"]["succeeded"], "failed": b["requests"]["failed"]}
c, r, l = summary(cost), summary(rr), summary(ll)
print(json.dumps({
  "what": "prefix-aware (cost) routing vs round-robin and least-loaded, shared-prefix multi-tenant "
          "workload on simulated workers; fresh cluster per policy",
  "machine": os.environ["MACHINE"],
  "load_average_1_5_15m": {"start": os.environ["LOAD_START"], "end": os.environ["LOAD_END"]},
  "command": os.environ["COMMAND"],
  "workload": load(cost)["config"],
  "cluster": {"workers": int(os.environ["WORKERS"]), "kv_cache_blocks_per_worker": int(os.environ["KV_BLOCKS"]),
              "block_size": 16, "simulated_worker": os.environ["SIM"]},
  "cost": c, "round_robin": r, "least_loaded": l,
  "throughput_ratio_cost_vs_round_robin": c["output_token_throughput"] / r["output_token_throughput"],
  "ttft_p90_ratio_round_robin_vs_cost": r["ttft_ms"]["p90"] / c["ttft_ms"]["p90"],
}, indent=2))
PY
  cat "$RESULTS_DIR/router_prefix_vs_round_robin.json"
fi

if [[ " $PARTS " == *" latency "* ]]; then
  # Live: an open loop at LAT_RATE/s with slow decoding keeps ~1,000 requests
  # in flight; KV and batch limits are high enough that they run (not queue).
  # A sampler scrapes the router's metrics every 0.25 s; the decisions taken
  # while at least LAT_MIN_IN_FLIGHT requests were in flight are the
  # difference of two scrapes.
  LOAD_START=$(loadavg)
  run="$out_dir/latency"
  lat_sim="vocab=32000,context=16384,prefill_us_per_token=5,decode_step_us=$LAT_DECODE_US,decode_us_per_seq=0"
  start_cluster "$run" "$LAT_WORKERS" "$lat_sim" 65536 1024 cost
  python3 - "http://127.0.0.1:$metrics_port/metrics" "$run/samples.jsonl" <<'PY' &
import json, re, sys, time, urllib.request
url, path = sys.argv[1:3]
name = "tessera_router_route_decision_seconds"
with open(path, "w") as out:
    while True:
        try:
            text = urllib.request.urlopen(url, timeout=2).read().decode()
        except Exception:
            time.sleep(0.25)
            continue
        buckets, count, in_flight = [], 0.0, 0.0
        for line in text.splitlines():
            m = re.match(name + r'_bucket\{le="([^"]+)"\} (\S+)', line)
            if m: buckets.append([m.group(1), float(m.group(2))])
            m = re.match(name + r'_count (\S+)', line)
            if m: count = float(m.group(1))
            m = re.match(r'tessera_router_requests_in_flight(\{\})? (\S+)', line)
            if m: in_flight = float(m.group(2))
        out.write(json.dumps({"t": time.time(), "in_flight": in_flight, "count": count,
                              "buckets": buckets}) + "\n")
        out.flush()
        time.sleep(0.25)
PY
  sampler_pid=$!
  "$TESSERA" bench --target="$router" --requests="$LAT_REQUESTS" --rate="$LAT_RATE" \
    --max_in_flight=2000 --tenants="$TENANTS" --system_prompt_tokens="$SYSTEM" \
    --prompt_len=32:128 --output_len=32 --vocab=32000 --seed=7 --channels=8 \
    --out="$run/bench.json" >"$run/bench.log" 2>&1
  sleep 0.5
  kill "$sampler_pid" 2>/dev/null || true
  wait "$sampler_pid" 2>/dev/null || true
  sampler_pid=""
  python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())' \
    "http://127.0.0.1:$metrics_port/metrics" >"$run/router.metrics" || true
  stop_cluster
  # In process: the routing core alone, same machine, same build.
  "$ROUTE_BENCH" --benchmark_filter='route_and_assign/cost/feeder:1' \
    --benchmark_out="$run/route_bench.json" --benchmark_out_format=json >"$run/route_bench.log" 2>&1
  LAT_RATE=$LAT_RATE LAT_DECODE_US=$LAT_DECODE_US LAT_WORKERS=$LAT_WORKERS SIM="$lat_sim" \
  LAT_MIN_IN_FLIGHT=$LAT_MIN_IN_FLIGHT COMMAND="$0 $*" LOAD_START=$LOAD_START LOAD_END=$(loadavg) \
  python3 - "$run" >"$RESULTS_DIR/router_route_decision_live.json" <<'PY'
import json, os, sys
run = sys.argv[1]
samples = [json.loads(l) for l in open(run + "/samples.jsonl") if l.strip()]
def le(b): return float("inf") if b == "+Inf" else float(b)
def quantiles(buckets, total):
    # Upper bound of the bucket holding the quantile, and a linear
    # interpolation inside it (as Prometheus' histogram_quantile).
    def q(p):
        prev_le, prev_c = 0.0, 0.0
        for b, c in buckets:
            if c >= p * total and total > 0:
                hi = le(b)
                if hi == float("inf"): return {"upper_bound_us": None, "interpolated_us": prev_le * 1e6}
                frac = (p * total - prev_c) / (c - prev_c) if c > prev_c else 1.0
                return {"upper_bound_us": hi * 1e6, "interpolated_us": (prev_le + frac * (hi - prev_le)) * 1e6}
            prev_le, prev_c = le(b), c
        return None
    at_100 = next((c for b, c in buckets if abs(le(b) - 1e-4) < 1e-12), None)
    return {"decisions": total, "p50": q(0.50), "p90": q(0.90), "p99": q(0.99),
            "fraction_le_100us": (at_100 / total) if total and at_100 is not None else None,
            "buckets_s": [[b, c] for b, c in buckets]}
thr = float(os.environ["LAT_MIN_IN_FLIGHT"])
steady = [i for i, s in enumerate(samples) if s["in_flight"] >= thr]
window = None
if len(steady) >= 2:
    a, b = samples[steady[0]], samples[steady[-1]]
    diff = [[x[0], y[1] - x[1]] for x, y in zip(a["buckets"], b["buckets"])]
    inf = [samples[i]["in_flight"] for i in range(steady[0], steady[-1] + 1)]
    window = {"seconds": b["t"] - a["t"], "in_flight_min": min(inf), "in_flight_max": max(inf),
              "in_flight_mean": sum(inf) / len(inf), **quantiles(diff, b["count"] - a["count"])}
last = samples[-1]
bench = json.load(open(run + "/bench.json"))
rb = json.load(open(run + "/route_bench.json"))
in_process = {}
for r in rb["benchmarks"]:
    in_process[r["name"]] = {k: r[k] for k in ("p50_us", "p90_us", "p99_us", "p999_us", "max_us",
                                              "le_100us_fraction", "decisions", "in_flight")
                             if k in r}
print(json.dumps({
  "what": "route-decision latency (tessera_router_route_decision_seconds: hashing, index match, "
          "policy and assignment bookkeeping, lock waits included) with ~1,000 requests in flight "
          "on the live router with simulated workers, and the routing core in process "
          "(router_route_bench) on the same machine",
  "machine": os.environ["MACHINE"],
  "load_average_1_5_15m": {"start": os.environ["LOAD_START"], "end": os.environ["LOAD_END"]},
  "command": os.environ["COMMAND"],
  "live": {
    "cluster": {"workers": int(os.environ["LAT_WORKERS"]), "simulated_worker": os.environ["SIM"],
                "policy": "cost"},
    "load": {"rate_per_s": float(os.environ["LAT_RATE"]), "requests": bench["config"]["requests"],
             "succeeded": bench["requests"]["succeeded"], "failed": bench["requests"]["failed"],
             "in_flight_peak": max(s["in_flight"] for s in samples)},
    "at_1000_in_flight": window,
    "min_in_flight": thr,
    "whole_run": quantiles(last["buckets"], last["count"]),
  },
  "in_process": in_process,
}, indent=2))
PY
  cat "$RESULTS_DIR/router_route_decision_live.json"
fi
