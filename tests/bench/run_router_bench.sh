#!/usr/bin/env bash
# Prefix-aware routing vs round-robin (and least-loaded) on a shared-prefix
# multi-tenant workload, with simulated workers whose cost is time: each
# uncached prompt token costs PREFILL_US of prefill and each decode step
# DECODE_US, so many workers fit on one small machine. Every policy gets a
# fresh cluster (cold caches). Then a run at 1,000 requests in flight reads
# the router's route-decision latency histogram.
#
# Usage: tests/bench/run_router_bench.sh [BUILD_DIR]
# Writes tests/bench/results/router_prefix_vs_round_robin.json.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD_DIR=${1:-build}
tessera="$BUILD_DIR/services/cli/tessera"
WORKERS=${WORKERS:-8}
TENANTS=${TENANTS:-32}
SYSTEM=${SYSTEM:-2048}
REQUESTS=${REQUESTS:-512}
CONCURRENCY=${CONCURRENCY:-32}
PREFILL_US=${PREFILL_US:-50}
DECODE_US=${DECODE_US:-4000}
KV_BLOCKS=${KV_BLOCKS:-1024}
SIM="vocab=32000,context=16384,prefill_us_per_token=$PREFILL_US,decode_step_us=$DECODE_US,decode_us_per_seq=20"
out_dir=$(mktemp -d)

run_policy() {  # policy requests concurrency extra-bench-args...
  local policy=$1 requests=$2 concurrency=$3
  shift 3
  local run="$out_dir/$policy-$concurrency"
  mkdir -p "$run"
  : >"$run/up.out"
  "$tessera" up --workers="$WORKERS" --up_simulate="${RUN_SIM:-$SIM}" --run_dir="$run" \
    --worker_args="--kv_cache_blocks=$KV_BLOCKS,--max_num_seqs=256,--max_waiting=4096" \
    --router_args="--policy=$policy,--max_in_flight=4096" >"$run/up.out" 2>&1 &
  local up=$!
  for _ in $(seq 600); do grep -q '^router=' "$run/up.out" && break; sleep 0.2; done
  local router
  router=$(grep '^router=' "$run/up.out" | cut -d= -f2)
  local load="--concurrency=$concurrency"
  [ "$concurrency" = 0 ] && load=""
  "$tessera" bench --target="$router" --requests="$requests" $load \
    --tenants="$TENANTS" --system_prompt_tokens="$SYSTEM" --prompt_len=32:128 --output_len=32 \
    --vocab=32000 --seed=7 --channels=8 "$@" --out="$run/bench.json" >"$run/bench.log" 2>&1
  local metrics_port
  metrics_port=$(grep '^  router' "$run/up.out" | grep -o 'metrics http://127.0.0.1:[0-9]*' | grep -o '[0-9]*$')
  curl -fsS "http://127.0.0.1:$metrics_port/metrics" >"$run/router.metrics"
  kill -INT $up
  wait $up || true
  echo "$run"
}

cost=$(run_policy cost "$REQUESTS" "$CONCURRENCY")
rr=$(run_policy round_robin "$REQUESTS" "$CONCURRENCY")
ll=$(run_policy least_loaded "$REQUESTS" "$CONCURRENCY")
# Route-decision latency with about 1,000 requests in flight: slow decoding
# (100 ms a step) keeps each request ~3.5 s in flight; an open loop at 300/s
# holds ~1,000 there in the steady state.
RUN_SIM="vocab=32000,context=16384,prefill_us_per_token=5,decode_step_us=100000,decode_us_per_seq=0"
many=$(run_policy cost 3000 0 --rate=300 --max_in_flight=1500)

WORKERS=$WORKERS KV_BLOCKS=$KV_BLOCKS SIM=$SIM COMMAND="$0 $*" \
python3 - "$cost" "$rr" "$ll" "$many" <<'PY' | tee tests/bench/results/router_prefix_vs_round_robin.json
import json, os, sys, re
cost, rr, ll, many = sys.argv[1:5]
def load(d): return json.load(open(d + "/bench.json"))
def hist(d, name):
    buckets, count = [], 0
    for line in open(d + "/router.metrics"):
        m = re.match(name + r'_bucket\{le="([^"]+)"\} (\S+)', line)
        if m: buckets.append((float("inf") if m.group(1) == "+Inf" else float(m.group(1)), float(m.group(2))))
        m = re.match(name + r'_count (\S+)', line)
        if m: count = float(m.group(1))
    def q(p):
        for le, c in buckets:
            if c >= p * count: return le
    return {"count": count, "p50_upper_bound_s": q(0.5), "p99_upper_bound_s": q(0.99),
            "buckets": [[le if le != float("inf") else "+Inf", c] for le, c in buckets]}
def summary(d):
    b = load(d)
    return {"output_token_throughput": b["output_token_throughput"],
            "request_throughput": b["request_throughput"],
            "ttft_ms": {k: b["ttft_ms"][k] for k in ("p50", "p90", "p99")},
            "e2e_ms": {k: b["e2e_ms"][k] for k in ("p50", "p90")},
            "cached_fraction": b["tokens"]["cached_fraction"],
            "succeeded": b["requests"]["succeeded"], "failed": b["requests"]["failed"]}
c, r, l = summary(cost), summary(rr), summary(ll)
result = {
  "what": "prefix-aware (cost) routing vs round-robin and least-loaded, shared-prefix multi-tenant "
          "workload on simulated workers; fresh cluster per policy",
  "command": os.environ["COMMAND"],
  "workload": load(cost)["config"],
  "cluster": {"workers": int(os.environ["WORKERS"]), "kv_cache_blocks_per_worker": int(os.environ["KV_BLOCKS"]),
              "block_size": 16, "simulated_worker": os.environ["SIM"]},
  "cost": c, "round_robin": r, "least_loaded": l,
  "throughput_ratio_cost_vs_round_robin": c["output_token_throughput"] / r["output_token_throughput"],
  "ttft_p90_ratio_round_robin_vs_cost": r["ttft_ms"]["p90"] / c["ttft_ms"]["p90"],
  "route_decision_at_1000_in_flight": {"bench": summary(many),
      "router_histogram": hist(many, "tessera_router_route_decision_seconds")},
}
print(json.dumps(result, indent=2))
PY
