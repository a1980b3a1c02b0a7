#!/usr/bin/env python3
"""Recomputes the decode roofline of result files written before
tests/bench/decode_step_bytes.h counted only the bytes a step reads.

gpu_decode_bench used to divide by every weight plus the KV cache
(bytes_per_step = weight_bytes + KV) for dense models: that counts the whole
embedding table (1.05 GB for Llama-3-8B), of which a step reads one row per
token. Each result row keeps what the fraction needs (batch, prompt_len,
decode_steps, decode_tokens_per_second, gpu_ms_per_step, the run's
hbm_bytes_per_second and model), so the fraction is recomputed here with the
count of decode_step_bytes.cc, part by part:

  step bytes = layer matrices (bf16) + norms (fp32) + LM head
               + one embedding row per token + KV read at the mean context
  mean context = prompt_len + 1 + (decode_steps + 1) / 2   (as the bench)

Rows whose step_bytes already hold that count (the MoE runs) are left as
they are. A recomputed row keeps the old figures as *_all_weights and its
run gets a "roofline_recomputed" note. Idempotent.

Usage:
  recompute_roofline.py [FILE.json ...]   # default: the H200 decode results
  recompute_roofline.py --check           # the count against the C++ test's
"""
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_FILES = [
    "results/gpu_decode_h200.json",
    "results/gpu_decode_qwen3_h200.json",
    "results/runner_restructure_ab_h200.json",
    "results/moe_decode_qwen3_30b_a3b_h200.json",
]
# The run's "model" description -> the config header gpu_decode_bench used.
MODELS = [
    ("Qwen3-30B-A3B shapes", "qwen3_30b_a3b_config.h"),
    ("Qwen3-8B shapes", "qwen3_8b_config.h"),
    ("Llama-3-8B shapes", "llama3_8b_config.h"),
]
NOTE = ("roofline recomputed by tests/bench/recompute_roofline.py from the bytes a step reads "
        "(tests/bench/decode_step_bytes.h: layers, LM head, one embedding row per token, KV at "
        "the mean context; step_bytes has the parts); the figures of the all-weights count it "
        "replaced are kept as *_all_weights")


def load_config(header):
    text = open(os.path.join(HERE, header)).read()
    return json.loads(re.search(r'R"\((.*?)\)"', text, re.S).group(1))


def step_bytes(c, batch, mean_ctx, w=2.0, kv_elem=2.0):
    """decode_step_bytes.cc's DecodeStepBytes, for the configs above."""
    H, L, D = c["hidden_size"], c["num_hidden_layers"], c["head_dim"]
    Q, K = c["num_attention_heads"] * D, c["num_key_value_heads"] * D
    qk_norm = c["model_type"] in ("qwen3", "qwen3_moe")
    E = c.get("num_experts", 0)
    if c.get("shared_expert_intermediate_size") or c.get("n_shared_experts"):
        raise ValueError("shared experts are not handled here; use decode_step_bytes.cc")
    per_layer = E * (1 - (1 - c.get("num_experts_per_tok", 0) / E) ** batch) if E else 0.0
    b = dict(attention_weights=0.0, routers=0.0, selected_experts=0.0,
             selected_experts_per_layer=per_layer, dense_and_shared_mlp=0.0, norms=4.0 * H)
    step = c.get("decoder_sparse_step", 1)
    dense_only = set(c.get("mlp_only_layers", []))
    for l in range(L):
        b["attention_weights"] += w * (H * (Q + 2 * K) + Q * H)
        b["norms"] += 4.0 * (2 * H + (2 * D if qk_norm else 0))
        sparse = E > 0 and l not in dense_only and (l + 1) % step == 0
        if not sparse:
            b["dense_and_shared_mlp"] += w * 3 * H * c["intermediate_size"]
            continue
        b["routers"] += w * E * H
        b["selected_experts"] += per_layer * w * 3 * H * c["moe_intermediate_size"]
    b["lm_head"] = w * H * c["vocab_size"]
    b["embedding_rows"] = w * H * batch
    b["kv_cache"] = batch * mean_ctx * L * 2 * K * kv_elem
    b["extra"] = 0.0
    b["total"] = sum(v for k, v in b.items() if k != "selected_experts_per_layer")
    return b


def config_of(model_description):
    for prefix, header in MODELS:
        if model_description and model_description.startswith(prefix):
            return load_config(header)
    return None


def recompute_run(run):
    """One gpu_decode_bench output (a dict with model, hbm and results)."""
    c = config_of(run.get("model"))
    if c is None or "hbm_bytes_per_second" not in run:
        return False
    hbm = run["hbm_bytes_per_second"]
    changed = False
    for r in run.get("results", []):
        if "bytes_per_step" not in r:
            continue
        mean_ctx = r["prompt_len"] + 1 + (r["decode_steps"] + 1) / 2.0
        b = step_bytes(c, r["batch"], mean_ctx)
        old = r.get("step_bytes")
        if old and abs(old.get("total", -1) - b["total"]) < 1:
            continue  # counted part by part already
        r.setdefault("bytes_per_step_all_weights", r["bytes_per_step"])
        r.setdefault("roofline_fraction_all_weights", r["roofline_fraction"])
        if "gpu_only_roofline_fraction" in r:
            r.setdefault("gpu_only_roofline_fraction_all_weights", r["gpu_only_roofline_fraction"])
        roofline = r["batch"] * hbm / b["total"]
        r["step_bytes"] = b
        r["bytes_per_step"] = b["total"]
        r["roofline_tokens_per_second"] = roofline
        r["roofline_fraction"] = r["decode_tokens_per_second"] / roofline
        if "gpu_ms_per_step" in r:
            r["gpu_only_roofline_fraction"] = r["batch"] / (r["gpu_ms_per_step"] * 1e-3) / roofline
        changed = True
    if changed:
        run["roofline_recomputed"] = NOTE
    return changed


def walk(node):
    """Recomputes every run inside a result file; returns whether any changed."""
    changed = False
    if isinstance(node, dict):
        if "results" in node and "model" in node:
            changed |= recompute_run(node)
        for v in node.values():
            changed |= walk(v)
    elif isinstance(node, list):
        for v in node:
            changed |= walk(v)
    return changed


def fix_summary(doc):
    """gpu_decode_h200.json's summary rows (collect_gpu_results.py) from its runs."""
    if "summary" not in doc or "tessera" not in doc:
        return
    by_batch = {r["batch"]: r for r in doc["tessera"]["results"]}
    for s in doc["summary"]:
        r = by_batch.get(s["batch"])
        if r is None:
            continue
        s.setdefault("roofline_tokens_per_second_all_weights", s["roofline_tokens_per_second"])
        s.setdefault("tessera_roofline_fraction_all_weights", s["tessera_roofline_fraction"])
        s["roofline_tokens_per_second"] = round(r["roofline_tokens_per_second"], 1)
        s["tessera_roofline_fraction"] = round(r["roofline_fraction"], 4)
    if "hbm_roofline_note" in doc:
        doc["hbm_roofline_note"] = (
            "roofline = batch x 4.27e12 B/s / bytes a step reads (layers, LM head, one embedding "
            "row per token, KV at the mean context: step_bytes); host_overhead_fraction = 1 - "
            "GPU-only time per step (graph replayed back to back at the longest context) / wall "
            "time per step; negative = within measurement noise. " + NOTE)


def check():
    """The same figures decode_step_bytes_test.cc pins for the C++ count."""
    llama = step_bytes(load_config("llama3_8b_config.h"), 1, 0)
    moe = step_bytes(load_config("qwen3_30b_a3b_config.h"), 1, 193.5)
    ok = llama["total"] == 15010390016.0 and moe["total"] == 6103183360.0
    print(f"llama3_8b batch 1 ctx 0: {llama['total']:.0f} (want 15010390016); "
          f"qwen3_30b_a3b batch 1 ctx 193.5: {moe['total']:.0f} (want 6103183360)")
    return 0 if ok else 1


def main(argv):
    if argv[1:] == ["--check"]:
        return check()
    files = argv[1:] or [os.path.join(HERE, f) for f in DEFAULT_FILES]
    for path in files:
        text = open(path).read()
        doc = json.loads(text)
        indent = 2 if text.startswith('{\n  "') else 1  # keep the file's layout
        changed = walk(doc)
        if changed:
            fix_summary(doc)
            with open(path, "w") as f:
                json.dump(doc, f, indent=indent)
                f.write("\n")
        print(f"{path}: {'recomputed' if changed else 'unchanged'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
