#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root, after
# scripts/gpu-bundle.sh made .gpu/bundle.tar.xz here: every GPU test and
# benchmark, results into OUT_DIR (one folder; also packed as
# OUT_DIR/gpu-results.tar.gz). Exit status: the number of failed steps.
#
#   OUT_DIR/doctor.txt               `tessera doctor` (devices, images, backend table, preflight)
#   OUT_DIR/tests/<test>.json|.log   gtest results of the CUDA tests
#   OUT_DIR/bench/*.json             kernel microbenchmarks, TP=1 vs TP=2 (and a
#                                    kernel-by-kernel trace of their steps, sampled decode
#                                    on the GPUs and on the host, and what GEMM autotuning
#                                    adds to start-up), torch SDPA's prefill
#                                    attention on the bench's shapes, decode vs the
#                                    roofline (with GPU-only time per step), and
#                                    transformers' decode on the same shapes
#   OUT_DIR/summary.txt              one line per step
#   OUT_DIR/deploy_pod_on_gpu.log    the worker pod started with the flags the
#                                    Kubernetes overlays render (8 GPUs: single-node,
#                                    fewer: single-gpu), serving the fixtures on CUDA
#   OUT_DIR/proc-devices.txt         /proc/devices (the names the systemd unit's
#                                    DeviceAllow= entries match)
#
# Usage: bash scripts/gpu-run.sh OUT_DIR [--quick|--deploy]
#   --quick: tests only; --deploy: only the deployment step (a bundle from
#   `scripts/gpu-bundle.sh --deploy-only BUILD_DIR` suffices)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: gpu-run.sh OUT_DIR [--quick]}
QUICK=${2:-}
mkdir -p "$OUT/tests" "$OUT/bench"
B=/tmp/tessera-bundle
rm -rf "$B" && mkdir -p "$B" && tar -C "$B" -xJf .gpu/bundle.tar.xz
export LD_LIBRARY_PATH="$B/bundle/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export TESSERA_SOURCE_DIR=$PWD
export NCCL_NVLS_ENABLE=0
BIN=$B/bundle/bin
failed=0
step() {  # step NAME TIMEOUT_S CMD...: runs, logs, records the outcome
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc $((SECONDS - t0))s" | tee -a "$OUT/summary.txt"
  [[ $rc -eq 0 ]] || failed=$((failed + 1))
}
step_json() {  # step_json NAME TIMEOUT_S CMD...: stdout is the JSON result
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.json" 2>"$OUT/$name.log"
  local rc=$?
  echo "$name rc=$rc $((SECONDS - t0))s" | tee -a "$OUT/summary.txt"
  [[ $rc -eq 0 ]] || failed=$((failed + 1))
}
nvidia-smi --query-gpu=name,pci.bus_id,driver_version,memory.total --format=csv >"$OUT/nvidia-smi.txt" 2>&1
cp /proc/devices "$OUT/proc-devices.txt"
# The worker pod of the Kubernetes manifests, as they render it: the
# reference 8-GPU pod where there are 8 GPUs, else the single-GPU overlay.
if [[ "$(nvidia-smi -L 2>/dev/null | wc -l)" -ge 8 ]]; then POD=single-node; else POD=single-gpu; fi
step deploy_pod_on_gpu 600 bash tests/gpu/pod_on_gpu.sh "$BIN" "$B/bundle/pod/$POD"
if [[ "$QUICK" == "--deploy" ]]; then
  echo "failed steps: $failed" | tee -a "$OUT/summary.txt"
  exit "$failed"
fi
step doctor 120 "$BIN/tessera" doctor
cp "$OUT/doctor.log" "$OUT/doctor.txt"
GPUS=$(nvidia-smi -L 2>/dev/null | wc -l)
# A test's arguments as its ctest entry has them (a GPU test's entry leaves
# out its host cases, which run as <test>_host; some of those test the
# no-device path and skip where a GPU is present).
ctest_args() {
  python3 -c 'import json,sys
for t in json.load(open(sys.argv[2]))["tests"]:
    if t["name"] == sys.argv[1] and t["command"][1:]: print("\n".join(t["command"][1:]))' \
    "$1" "$B/bundle/ctest.json"
}
# Here every case should run: a skip fails the step (TESSERA_REQUIRE_GPU,
# tests/gpu_test_main.cc). The two-GPU tests run where there are two GPUs.
for t in arch_test cuda_selection_test cuda_ops_test cuda_gemm_test cuda_gemv_test cuda_sampling_test \
         cuda_decode_rope_test paged_attention_test prefill_attention_sm90_test \
         cuda_moe_routing_test cuda_moe_experts_test cuda_model_runner_test; do
  mapfile -t args < <(ctest_args "$t")
  step "tests/$t" 300 env TESSERA_REQUIRE_GPU=1 "$BIN/$t" "${args[@]}" \
    --gtest_output="json:$OUT/tests/$t.json"
done
for t in cuda_tensor_parallel_test cuda_p2p_all_reduce_test; do
  if [[ "$GPUS" -ge 2 ]]; then
    mapfile -t args < <(ctest_args "$t")
    step "tests/$t" 300 env TESSERA_REQUIRE_GPU=1 "$BIN/$t" "${args[@]}" \
      --gtest_output="json:$OUT/tests/$t.json"
  else
    echo "tests/$t skipped: needs 2 GPUs, $GPUS here" | tee -a "$OUT/summary.txt"
  fi
done
# The first GPU by PCI bus id ("--device=cuda" is ambiguous on a multi-GPU host).
DEV="cuda:$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader | sort | head -1)"
step generate_parity 600 python3 tests/gpu/check_generate.py "$BIN/tessera" --device="$DEV" \
  --out="$OUT/tests/generate_parity.json"
if [[ "$(nvidia-smi -L 2>/dev/null | wc -l)" -ge 2 ]]; then
  # The same through two tensor-parallel ranks (tokens drawn on the GPUs).
  step generate_parity_tp2 600 python3 tests/gpu/check_generate.py "$BIN/tessera" --device=cuda \
    --tensor_parallel_size=2 --out="$OUT/tests/generate_parity_tp2.json"
fi
step cluster_on_gpu 400 bash tests/gpu/cluster_on_gpu.sh "$BIN" "$DEV"
if [[ "$(nvidia-smi -L 2>/dev/null | wc -l)" -ge 2 ]]; then
  # The same with a worker of two tensor-parallel ranks.
  step cluster_on_gpu_tp2 400 bash tests/gpu/cluster_on_gpu.sh "$BIN" cuda --tensor_parallel_size=2
fi
if [[ "$GPUS" -ge 2 ]]; then
  step bench/gpu_tp 500 "$BIN/gpu_tp_bench" --out="$OUT/bench/gpu_tp.json"
  # Where the time of a TP=1 and a TP=2 step goes, kernel by kernel (CUPTI).
  step bench/gpu_tp_trace 200 "$BIN/gpu_tp_bench" --all_reduce_backends=p2p \
    --kernel_trace_steps=16 --decode_steps=16 --out="$OUT/bench/gpu_tp_trace.json"
  # Sampled decode: tokens drawn on the GPUs against the host sampler.
  step bench/gpu_tp_sampling 300 "$BIN/gpu_tp_bench" --all_reduce_backends=p2p --sample_steps=8 \
    --out="$OUT/bench/gpu_tp_sampling.json"
  # What GEMM autotuning adds to each batch's first decode step.
  step bench/gpu_tp_tuning 300 "$BIN/gpu_tp_bench" --all_reduce_backends=p2p --gemm_autotune=0,1 \
    --out="$OUT/bench/gpu_tp_tuning.json"
fi
# One TP=2 rank's shard alone on one GPU (no collectives) between TP=1 and
# TP=2 (when there are two GPUs): what TP=2 would take if communication
# cost nothing; with the worker's preflight in a child process (as the worker
# runs it), in the runner's process, and without it.
step bench/gpu_tp_shard 300 "$BIN/gpu_tp_bench" --tp_sizes=1,2s,2 --all_reduce_backends=p2p \
  --preflight=2,1,0 --out="$OUT/bench/gpu_tp_shard.json"
if [[ "${ROUTER_BENCH:-1}" == 1 ]]; then
  # Route-decision latency at ~1,000 in flight on this many-core host.
  mkdir -p "$OUT/router_logs"  # the script's logs and raw results land here (TMPDIR)
  step bench/router_latency 300 env PARTS=latency RESULTS_DIR="$OUT/bench" TESSERA_BIN_DIR="$BIN" \
    TMPDIR="$OUT/router_logs" \
    bash tests/bench/run_router_bench.sh
fi
if [[ "$QUICK" != "--quick" ]]; then
  # Speculative decoding with the trained pair: target on the GPU, batch 1 and 16.
  step bench/spec_decode 400 "$BIN/spec_decode_bench" --device="$DEV" --draft_device="$DEV" \
    --batch=16 --requests=16 \
    --out="$OUT/bench/spec_decode_h200.json"
  # The same with token trees (branching 3; the draft model's runner-up
  # tokens as siblings at its first 2 positions).
  step bench/spec_decode_trees 400 "$BIN/spec_decode_bench" --device="$DEV" --draft_device="$DEV" \
    --batch=16 --requests=16 --tree_branching=3 --tree_depth=2 \
    --out="$OUT/bench/spec_decode_h200_trees.json"
  step_json bench/cuda_ops 120 "$BIN/cuda_ops_bench"
  step_json bench/moe_kernels 120 "$BIN/moe_kernel_bench"
  step_json bench/gemm_search 240 "$BIN/gemm_search_bench" --max_configs=3000 --bases=2
  step_json bench/paged_attention 120 "$BIN/paged_attention_bench"
  step bench/sdpa_reference 180 python3 tests/gpu/sdpa_reference.py --out="$OUT/bench/sdpa_reference.json"
  step bench/gpu_decode 300 "$BIN/gpu_decode_bench" --device="$DEV" --out="$OUT/bench/gpu_decode.json"
  # Qwen3-8B shapes: RoPE and the q/k norms inside decode attention, against
  # the Rope kernel before it (alternating, one process).
  step bench/gpu_decode_qwen3 300 "$BIN/gpu_decode_bench" --device="$DEV" --model=qwen3_8b \
    --batch_sizes=1,64 --decode_steps=64 --long_prefill=0 \
    --out="$OUT/bench/gpu_decode_qwen3.json"
  step bench/hf_decode_peer 400 python3 tests/gpu/hf_decode_peer.py --out="$OUT/bench/hf_decode_peer.json"
fi
tar -C "$OUT" -czf /tmp/gpu-results.tar.gz --exclude=gpu-results.tar.gz . && mv /tmp/gpu-results.tar.gz "$OUT/"
echo "failed steps: $failed" | tee -a "$OUT/summary.txt"
exit "$failed"
