#!/usr/bin/env python3
"""Prefill-attention ceiling measured in the same GPU run as
tests/bench/paged_attention_bench: torch's scaled_dot_product_attention,
causal, bf16, one sequence of 2048 and of 8192 tokens, 32 query heads with
8 KV heads (GQA, as the bench's shapes) and head_dim 128.

TFLOP/s count 2 * 2 * S * S * H * D / 2 (causal), the bench's formula.
Each length: 3 warm-up calls, then the mean of calls timed by CUDA events
over at least 200 ms. Also reports which backend torch picked when the
flash/cudnn/efficient selection API is available.

Runs only on the GPU machine (torch). Prints JSON; --out writes it too.
"""
import argparse
import json

import torch
import torch.nn.functional as F


def time_ms(fn, min_ms=200.0):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)
    iters = 5
    while True:
        start.record()
        for _ in range(iters):
            fn()
        stop.record()
        stop.synchronize()
        ms = start.elapsed_time(stop)
        if ms >= min_ms or iters >= 5000:
            return ms / iters
        iters = min(5000, int(iters * max(2.0, 1.2 * min_ms / max(ms, 0.01))))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--lengths", default="2048,8192")
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv_heads", type=int, default=8)
    p.add_argument("--head_dim", type=int, default=128)
    p.add_argument("--out", default="")
    a = p.parse_args()
    torch.manual_seed(0)
    dev = torch.device("cuda")
    results = []
    for s in [int(x) for x in a.lengths.split(",")]:
        q = torch.randn(1, a.heads, s, a.head_dim, device=dev, dtype=torch.bfloat16)
        k = torch.randn(1, a.kv_heads, s, a.head_dim, device=dev, dtype=torch.bfloat16)
        v = torch.randn(1, a.kv_heads, s, a.head_dim, device=dev, dtype=torch.bfloat16)
        gqa = a.kv_heads != a.heads
        try:
            def run():
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
            run()
            mode = "enable_gqa"
        except TypeError:  # torch < 2.5: expand K/V to every query head
            rep = a.heads // a.kv_heads
            ke = k.repeat_interleave(rep, dim=1)
            ve = v.repeat_interleave(rep, dim=1)

            def run():
                return F.scaled_dot_product_attention(q, ke, ve, is_causal=True)
            mode = "expanded_kv"
        ms = time_ms(run)
        flops = 2.0 * 2.0 * s * s * a.heads * a.head_dim / 2.0
        r = {"tokens": s, "heads": a.heads, "kv_heads": a.kv_heads, "head_dim": a.head_dim,
             "gqa_mode": mode, "us": ms * 1e3, "tflop_per_s": flops / (ms * 1e-3) * 1e-12}
        print(json.dumps(r), flush=True)
        results.append(r)
    out = {"benchmark": "sdpa_reference", "torch": torch.__version__,
           "device": torch.cuda.get_device_name(0), "results": results}
    text = json.dumps(out, indent=2)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
