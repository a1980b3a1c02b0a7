#!/usr/bin/env python3
"""Turns one `scripts/gpu-run.sh OUT` folder into the result files under
tests/bench/results/, each with the command that produced it:

  gpu_decode_h200.json        decode vs the HBM roofline (GEMV and cuBLASLt-only
                              skinny GEMMs), the 4k-token prefill, and
                              transformers eager `generate` from the same run
  paged_attention_h200.json   decode/prefill attention kernels, prefill next
                              to torch SDPA on the same shapes
  cuda_ops_h200.json          kernel microbenchmarks
  moe_kernels_h200.json       the CUDA MoE kernels at Qwen3-30B-A3B shapes
  gpu_tp_h200x2.json          TP=1 vs TP=2 per all-reduce backend (2 GPUs)
  gpu_tp_trace_h200x2.json    the same steps kernel by kernel (CUPTI trace)
  gpu_tp_tuning_h200x2.json   what GEMM autotuning adds to a batch's first step
  gpu_tp_sampling_h200x2.json sampled decode, tokens drawn on the GPUs vs the host
  gpu_tp_shard_h200x2.json    TP=1, one TP=2 rank's shard alone (no collectives) and,
                              with two GPUs, TP=2; with and without the preflight
  gpu_decode_qwen3_h200.json  Qwen3-8B-shaped decode, RoPE and q/k norms inside
                              decode attention vs the Rope kernel before it
  spec_decode_h200.json       speculative decoding with the trained pair
  spec_decode_h200_trees.json the same with token trees
  router_route_decision_live_h200_host.json
                              route-decision latency at ~1,000 in flight
  cuda_generate_parity_h200.json
                              `tessera generate --device=cuda` vs the fixtures
  cuda_generate_parity_tp2_h200x2.json
                              the same with --tensor_parallel_size=2
  doctor_h200.txt             `tessera doctor`

Usage: tests/bench/collect_gpu_results.py OUT_DIR [RESULTS_DIR]
Files whose inputs are missing from OUT_DIR are left as they are.
"""
import json
import os
import shutil
import sys

BUNDLE = "TESSERA_CUDA_ARCHS=sm_90a bash scripts/gpu-bundle.sh build-lead  (build machine)"


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def write(results, name, obj):
    path = os.path.join(results, name)
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")
    print("wrote", path)


def decode(out, results):
    tessera = load(os.path.join(out, "bench/gpu_decode.json"))
    cublaslt = load(os.path.join(out, "bench/gpu_decode_cublaslt.json"))
    peer = load(os.path.join(out, "bench/hf_decode_peer.json"))
    if tessera is None:
        return
    hf = {r["batch"]: r for r in (peer or {}).get("results", [])}
    summary = []
    for r in tessera["results"]:
        row = {
            "batch": r["batch"],
            "tessera_decode_tokens_per_second": round(r["decode_tokens_per_second"], 1),
            "roofline_tokens_per_second": round(r["roofline_tokens_per_second"], 1),
            "tessera_roofline_fraction": round(r["roofline_fraction"], 4),
            "host_overhead_fraction": round(r.get("host_overhead_fraction", 0.0), 4),
        }
        if r["batch"] in hf:
            t = hf[r["batch"]]["decode_tokens_per_second"]
            row["transformers_eager_decode_tokens_per_second"] = round(t, 1)
            row["speedup_vs_transformers"] = round(r["decode_tokens_per_second"] / t, 2)
        summary.append(row)
    write(results, "gpu_decode_h200.json", {
        "benchmark": "decode tokens/s, Llama-3-8B shapes, random bf16 weights, 128-token "
                     "prompts, one H200; Tessera and transformers eager generate in the same run",
        "command": BUNDLE + "; bash scripts/gpu-run.sh OUT  (GPU machine): "
                   "tests/bench/gpu_decode_bench and tests/gpu/hf_decode_peer.py; "
                   "tests/bench/collect_gpu_results.py OUT",
        "hbm_roofline_note": "roofline = batch x 4.27e12 B/s / bytes a step reads (layers, LM "
                             "head, one embedding row per token, KV at the mean context: "
                             "step_bytes, decode_step_bytes.h); host_overhead_fraction = "
                             "1 - GPU-only time per step (graph replayed back to back at the longest context) / wall time per "
                             "step; negative = within measurement noise",
        "summary": summary,
        "long_prefill": tessera.get("long_prefill"),
        "tessera": tessera,
        "tessera_cublaslt_only": cublaslt,
        "transformers": peer,
    })


def attention(out, results):
    pa = load(os.path.join(out, "bench/paged_attention.json"))
    sdpa = load(os.path.join(out, "bench/sdpa_reference.json"))
    if pa is None:
        return
    ratios = []
    ref = {r["tokens"]: r for r in (sdpa or {}).get("results", [])}
    for r in pa.get("prefill", []):
        if r["tokens"] in ref:
            s = ref[r["tokens"]]["tflop_per_s"]
            row = {"tokens": r["tokens"], "torch_sdpa_tflop_per_s": round(s, 1),
                   "portable_tflop_per_s": r["tflop_per_s"],
                   "portable_ratio": round(r["tflop_per_s"] / s, 3)}
            if r.get("sm90a_tflop_per_s"):
                # The wgmma kernel with its default schedule: what the
                # registry picks on SM 9.0.
                row["sm90a_tflop_per_s"] = r["sm90a_tflop_per_s"]
                row["sm90a_ratio"] = round(r["sm90a_tflop_per_s"] / s, 3)
            ratios.append(row)
    obj = {"command": "bash scripts/gpu-run.sh OUT (tests/bench/paged_attention_bench, "
                      "tests/gpu/sdpa_reference.py, same run); "
                      "tests/bench/collect_gpu_results.py OUT",
           "prefill_vs_sdpa": ratios}
    obj.update(pa)
    obj["sdpa_reference"] = sdpa
    write(results, "paged_attention_h200.json", obj)


def wrap(out, results, src, name, command, notes=None, drop=()):
    """Copies OUT/src to RESULTS/name with `command` (and notes) first."""
    data = load(os.path.join(out, src))
    if data is None:
        return
    obj = {"command": command + "; tests/bench/collect_gpu_results.py OUT"}
    obj.update(notes or {})
    obj.update({k: v for k, v in data.items() if k not in drop})
    write(results, name, obj)


def ops(out, results):
    wrap(out, results, "bench/cuda_ops.json", "cuda_ops_h200.json",
         "bash scripts/gpu-run.sh OUT (tests/bench/cuda_ops_bench)")


def moe_kernels(out, results):
    wrap(out, results, "bench/moe_kernels.json", "moe_kernels_h200.json",
         "bash scripts/gpu-run.sh OUT (tests/bench/moe_kernel_bench)")


def gemm_search(out, results):
    wrap(out, results, "bench/gemm_search.json", "gemm_search_h200.json",
         "bash scripts/gpu-run.sh OUT (tests/bench/gemm_search_bench)")


def tensor_parallel(out, results):
    wrap(out, results, "bench/gpu_tp.json", "gpu_tp_h200x2.json",
         "GPU machine with 2 GPUs: bash scripts/gpu-run.sh OUT (tests/bench/gpu_tp_bench "
         "--staged_gemv=1,0)",
         {"note": "NCCL_NVLS_ENABLE=0. Every configuration runs with the staged GEMV "
                  "(staged_gemv true, the default: kernels/cuda/gemv.h GemvStagedBf16 for the "
                  "one-token projections GemmContext::StagedTakes accepts) and then without it; "
                  "speedup_vs_tp1 is against the TP=1 row with the same setting. "
                  "TP=2 runs once per all-reduce backend: nccl (every "
                  "all-reduce through NCCL) and p2p (the registry's choice with peer access: "
                  "kernels/cuda/p2p_all_reduce.h for bf16 messages up to 1 MiB, each fused "
                  "with the residual add and RMSNorm that follow it; NCCL for the fp32 "
                  "embedding reduce). The all-reduce of one decode step's activation (hidden x "
                  "batch bf16) is also timed alone, eager and inside a CUDA graph, with both, "
                  "and the p2p all-reduce + residual add + RMSNorm kernel inside a graph "
                  "(p2p_all_reduce_add_rmsnorm_us_in_graph); p2p_all_reduce_correct checks the "
                  "sum of known values on every element and that no rank timed out. "
                  "graph_ms_per_step: the last step's CUDA graphs replayed back to back on "
                  "every rank at once (no host work, no argmax); host_ms_per_step: the step "
                  "time minus that"})


def tensor_parallel_trace(out, results):
    wrap(out, results, "bench/gpu_tp_trace.json", "gpu_tp_trace_h200x2.json",
         "GPU machine with 2 GPUs: bash scripts/gpu-run.sh OUT (tests/bench/gpu_tp_bench "
         "--all_reduce_backends=p2p --kernel_trace_steps=16 --decode_steps=16)",
         {"note": "kernel_trace: 16 decode steps per row under a CUPTI activity trace "
                  "(tests/bench/kernel_trace.h), per device: busy time, gaps between kernels "
                  "(short: inside the step's graph; long: host), and every kernel's time per "
                  "step. Tracing slows launches and stretches the gaps, so the step times of "
                  "this file are not throughput figures (gpu_tp_h200x2.json has those)"})


SAMPLING_NOTE = ("sampled_step_ms_on_gpu: decode steps drawing every token with temperature 1 "
                 "and top-p 0.9 through ForwardSample (the rows split among the ranks, each "
                 "rank copying the peers' slices of its rows over NVLink and drawing them with "
                 "kernels/cuda/sampling.h; only token ids reach the host); "
                 "sampled_step_ms_on_gpu_one_rank (TP > 1): the same with every row drawn on "
                 "rank 0, which copies the peers' whole slices, as ForwardSample did before; "
                 "sampled_step_ms_on_host: the same steps through Forward (every rank's logits "
                 "copied to the host) and worker/sampling's sampler, which is how a "
                 "tensor-parallel worker drew its tokens before ForwardSample existed. Wall "
                 "time per step, after one untimed step; decode_ms_per_step is the greedy "
                 "path (ForwardGreedy) of the same configuration")
TUNING_NOTE = ("first_step_ms: a batch's first decode step (eager, with GEMM autotuning when "
               "gemm_autotune is true, then the capture of its graph); second_step_ms: the "
               "next step, which only captures the other context bucket's graph. The "
               "difference between the gemm_autotune false and true rows of one TP size and "
               "batch is what tuning adds to a worker's start-up, once per batch bucket")


def tensor_parallel_tuning(out, results):
    wrap(out, results, "bench/gpu_tp_tuning.json", "gpu_tp_tuning_h200x2.json",
         "GPU machine with 2 GPUs: bash scripts/gpu-run.sh OUT (tests/bench/gpu_tp_bench "
         "--all_reduce_backends=p2p --gemm_autotune=0,1)",
         {"note": TUNING_NOTE})


def tensor_parallel_sampling(out, results):
    wrap(out, results, "bench/gpu_tp_sampling.json", "gpu_tp_sampling_h200x2.json",
         "GPU machine with 2 GPUs: bash scripts/gpu-run.sh OUT (tests/bench/gpu_tp_bench "
         "--all_reduce_backends=p2p --sample_steps=8)",
         {"note": SAMPLING_NOTE})


SHARD_NOTE = ("shard_of_tp 2: one rank's shard of TP=2 (16 of 32 heads, 4 of 8 KV heads, "
              "half the MLP and of the vocabulary; hidden size whole) run alone on one GPU as "
              "a TP=1 model: no all-reduce and no waiting for a peer. Its speedup_vs_tp1 is "
              "what TP=2 would reach with the rank kernels of this build if its collectives "
              "and the waits between the ranks cost nothing; the TP=2 row of the same run "
              "beside it when the machine has two GPUs. Every row ran in a process of its "
              "own; preflight_in_child true: the worker's kernel preflight ran in a child "
              "process before the runner, as tessera-worker runs it; preflight true and "
              "preflight_in_child false: in the runner's process, as tessera-worker ran it "
              "before; preflight false: not at all (speedups compare rows of the same setting)")


def tensor_parallel_shard(out, results):
    wrap(out, results, "bench/gpu_tp_shard.json", "gpu_tp_shard_h200x2.json",
         "GPU machine with 2 GPUs: bash scripts/gpu-run.sh OUT (tests/bench/gpu_tp_bench "
         "--tp_sizes=1,2s,2 --all_reduce_backends=p2p --preflight=2,1,0)",
         {"note": SHARD_NOTE})


def decode_qwen3(out, results):
    wrap(out, results, "bench/gpu_decode_qwen3.json", "gpu_decode_qwen3_h200.json",
         "bash scripts/gpu-run.sh OUT (tests/bench/gpu_decode_bench --model=qwen3_8b "
         "--rope_in_attention=1,0,1,0 --batch_sizes=1,64 --decode_steps=64 --long_prefill=0)",
         {"note": "rope_in_attention true: decode attention normalizes q and the new k "
                  "per head, rotates them and writes K/V to the cache "
                  "(kernels/cuda/paged_attention.h DecodeRope); false: the Rope kernel does "
                  "that before attention (one launch more per layer). Alternating rows of one "
                  "process on one H200"})


def speculative(out, results):
    wrap(out, results, "bench/spec_decode_h200.json", "spec_decode_h200.json",
         "GPU machine: bash scripts/gpu-run.sh OUT (spec_decode_bench --device=cuda:<bus id> "
         "--draft_device=cuda:<bus id> --batch=16 --requests=16)",
         {"machine_note": "one H200 (target and draft model on the GPU, n-gram/suffix sources "
                          "on the host). The trained pair is tiny, so a GPU step is bound by "
                          "kernel launches, not memory. Chains here; spec_decode_h200_trees.json "
                          "has the same run with token trees",
          "identity_note": "On the GPU the kernels are not batch-invariant (different kernels "
                           "for 1 vs k+1 tokens round differently in bf16), so greedy outputs "
                           "can part from plain decoding at near ties; on the CPU backend "
                           "speculation reproduces plain decoding exactly"})


def speculative_trees(out, results):
    wrap(out, results, "bench/spec_decode_h200_trees.json", "spec_decode_h200_trees.json",
         "GPU machine: bash scripts/gpu-run.sh OUT (spec_decode_bench --device=cuda:<bus id> "
         "--draft_device=cuda:<bus id> --batch=16 --requests=16 --tree_branching=3 "
         "--tree_depth=2)",
         {"machine_note": "one H200 (target and draft model on the GPU, n-gram/suffix sources "
                          "on the host); token trees verified in one forward pass with the "
                          "tree attention mask of the CUDA prefill kernel",
          "identity_note": "On the GPU the kernels are not batch-invariant, so greedy outputs "
                           "can part from plain decoding at near ties; on the CPU backend "
                           "speculation reproduces plain decoding exactly"})


def router(out, results):
    r = load(os.path.join(out, "bench/router_route_decision_live.json"))
    if r is None:
        return
    r["command"] = ("GPU machine's host: bash scripts/gpu-run.sh OUT (PARTS=latency "
                    "tests/bench/run_router_bench.sh with the bundled binaries); "
                    "tests/bench/collect_gpu_results.py OUT")
    write(results, "router_route_decision_live_h200_host.json", r)


def generate_parity(out, results):
    wrap(out, results, "tests/generate_parity.json", "cuda_generate_parity_h200.json",
         "bash scripts/gpu-run.sh OUT (tests/gpu/check_generate.py with the bundled tessera)",
         drop=("command",))
    wrap(out, results, "tests/generate_parity_tp2.json", "cuda_generate_parity_tp2_h200x2.json",
         "GPU machine with 2 GPUs: bash scripts/gpu-run.sh OUT (tests/gpu/check_generate.py "
         "with the bundled tessera, --device=cuda --tensor_parallel_size=2)",
         drop=("command",))


def doctor(out, results):
    src = os.path.join(out, "doctor.txt")
    if os.path.exists(src):
        shutil.copy(src, os.path.join(results, "doctor_h200.txt"))
        print("wrote", os.path.join(results, "doctor_h200.txt"))


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    results = sys.argv[2] if len(sys.argv) > 2 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "results")
    for step in (decode, attention, ops, moe_kernels, gemm_search, tensor_parallel, tensor_parallel_trace,
                 tensor_parallel_tuning, tensor_parallel_sampling, tensor_parallel_shard,
                 decode_qwen3, speculative,
                 speculative_trees, router, generate_parity, doctor):
        step(out, results)


if __name__ == "__main__":
    main()
