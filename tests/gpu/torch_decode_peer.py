#!/usr/bin/env python3
"""A strong PyTorch decode peer in the style of gpt-fast: our own ~150-line
Llama with a static KV cache, the one-token decode step compiled with
torch.compile(mode="reduce-overhead") (Inductor kernels replayed as CUDA
graphs), and SDPA with grouped-query attention (enable_gqa). Random bf16
weights on Llama-3-8B shapes: speed does not depend on their values.

Per batch size B: B random prompts of --prompt_len tokens are prefilled
(eager), then --warmup compiled decode steps, then --steps timed ones.
decode tokens/s = B * steps / time of the timed steps (synchronized).

Runs only on the GPU machine (torch >= 2.5). Prints JSON; --out writes it.
"""
import argparse
import json
import math
import time

import torch
import torch.nn.functional as F
from torch import nn

LLAMA3_8B = dict(dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, head_dim=128, hidden=14336,
                 vocab=128256, eps=1e-5, rope_base=500000.0)


def llama3_freqs(head_dim, base, max_len, device):
    """RoPE frequencies with Llama 3's scaling (factor 8, low/high 1/4, 8192)."""
    freqs = 1.0 / (base ** (torch.arange(0, head_dim, 2, device=device).float() / head_dim))
    factor, low, high, old = 8.0, 1.0, 4.0, 8192
    wavelen = 2 * math.pi / freqs
    smooth = (old / wavelen - low) / (high - low)
    scaled = torch.where(wavelen > old / low, freqs / factor, freqs)
    mid = (wavelen <= old / low) & (wavelen >= old / high)
    scaled = torch.where(mid, (1 - smooth) * freqs / factor + smooth * freqs, scaled)
    t = torch.arange(max_len, device=device).float()
    angles = torch.outer(t, scaled)
    return torch.stack([angles.cos(), angles.sin()], dim=-1)  # [max_len, head_dim / 2, 2]


def apply_rope(x, rope):  # x [B, S, H, D], rope [B, S, D/2, 2] (gpt-fast's layout)
    xs = x.float().reshape(*x.shape[:-1], -1, 2)
    rope = rope.unsqueeze(2)
    out = torch.stack([xs[..., 0] * rope[..., 0] - xs[..., 1] * rope[..., 1],
                       xs[..., 1] * rope[..., 0] + xs[..., 0] * rope[..., 1]], -1)
    return out.flatten(3).type_as(x)


class KVCache(nn.Module):
    def __init__(self, batch, max_len, n_kv_heads, head_dim, dtype):
        super().__init__()
        shape = (batch, n_kv_heads, max_len, head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype), persistent=False)

    def update(self, pos, k, v):  # pos [S], k/v [B, Hkv, S, D]
        self.k.index_copy_(2, pos, k)
        self.v.index_copy_(2, pos, v)
        return self.k, self.v


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        q, kv = c["n_heads"] * c["head_dim"], c["n_kv_heads"] * c["head_dim"]
        self.wqkv = nn.Linear(c["dim"], q + 2 * kv, bias=False)
        self.wo = nn.Linear(q, c["dim"], bias=False)
        self.w13 = nn.Linear(c["dim"], 2 * c["hidden"], bias=False)  # gate and up, fused
        self.w2 = nn.Linear(c["hidden"], c["dim"], bias=False)
        self.attn_norm = nn.RMSNorm(c["dim"], eps=c["eps"])
        self.mlp_norm = nn.RMSNorm(c["dim"], eps=c["eps"])
        self.cache = None

    def forward(self, x, rope, pos, mask):
        c, (B, S, _) = self.c, x.shape
        H, Hkv, D = c["n_heads"], c["n_kv_heads"], c["head_dim"]
        q, k, v = self.wqkv(self.attn_norm(x)).split([H * D, Hkv * D, Hkv * D], dim=-1)
        q = apply_rope(q.view(B, S, H, D), rope).transpose(1, 2)
        k = apply_rope(k.view(B, S, Hkv, D), rope).transpose(1, 2)
        k, v = self.cache.update(pos, k, v.view(B, S, Hkv, D).transpose(1, 2))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        x = x + self.wo(y.transpose(1, 2).reshape(B, S, H * D))
        gate, up = self.w13(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.w2(F.silu(gate) * up)


class Transformer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.embed = nn.Embedding(c["vocab"], c["dim"])
        self.layers = nn.ModuleList(Block(c) for _ in range(c["n_layers"]))
        self.norm = nn.RMSNorm(c["dim"], eps=c["eps"])
        self.lm_head = nn.Linear(c["dim"], c["vocab"], bias=False)

    def setup_caches(self, batch, max_len):
        dev, dtype = self.lm_head.weight.device, self.lm_head.weight.dtype
        for layer in self.layers:
            layer.cache = KVCache(batch, max_len, self.c["n_kv_heads"], self.c["head_dim"],
                                  dtype).to(dev)
        self.rope = llama3_freqs(self.c["head_dim"], self.c["rope_base"], max_len, dev)
        self.causal = torch.tril(torch.ones(max_len, max_len, dtype=torch.bool, device=dev))

    def forward(self, idx, pos):  # idx [B, S], pos [S]
        mask = self.causal[None, None, pos]
        rope = self.rope[pos].unsqueeze(0).expand(idx.shape[0], -1, -1, -1)
        x = self.embed(idx)
        for layer in self.layers:
            x = layer(x, rope, pos, mask)
        return self.lm_head(self.norm(x[:, -1:]))


def decode_one_token(model, tok, pos):  # greedy: argmax on the GPU
    return model(tok, pos).argmax(dim=-1)


def run_batch(model, step, batch, prompt_len, warmup, steps):
    model.setup_caches(batch, prompt_len + warmup + steps + 1)
    dev = model.lm_head.weight.device
    prompt = torch.randint(0, model.c["vocab"], (batch, prompt_len), device=dev)
    with torch.inference_mode():
        tok = model(prompt, torch.arange(prompt_len, device=dev)).argmax(dim=-1)
        pos = prompt_len
        for _ in range(warmup):  # compiles, then records the CUDA graph
            tok = step(model, tok.clone(), torch.tensor([pos], device=dev)).clone()
            pos += 1
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(steps):
            tok = step(model, tok.clone(), torch.tensor([pos], device=dev)).clone()
            pos += 1
        torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
    return {"batch": batch, "prompt_len": prompt_len, "decode_steps": steps,
            "decode_ms_per_step": 1e3 * seconds / steps,
            "decode_tokens_per_second": batch * steps / seconds}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch_sizes", default="1,8,64")
    p.add_argument("--prompt_len", type=int, default=128)
    p.add_argument("--steps", type=int, default=128)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--out", default="")
    a = p.parse_args()
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = Transformer(LLAMA3_8B)
    for prm in model.parameters():  # gpt-fast's checkpoints are loaded; ours are random
        nn.init.normal_(prm, std=0.02)
    model.eval().requires_grad_(False)
    step = torch.compile(decode_one_token, mode="reduce-overhead", fullgraph=True)
    results = []
    t0 = time.perf_counter()
    for b in (int(x) for x in a.batch_sizes.split(",")):
        results.append(run_batch(model, step, b, a.prompt_len, a.warmup, a.steps))
        print(json.dumps(results[-1]), flush=True)
    out = {"benchmark": "torch_decode_peer (gpt-fast style: static KV cache, torch.compile "
                        "reduce-overhead one-token decode, SDPA with GQA), Llama-3-8B shapes, "
                        "random bf16",
           "torch": torch.__version__, "device": torch.cuda.get_device_name(),
           "seconds_with_compiles": time.perf_counter() - t0, "results": results}
    print(json.dumps(out, indent=2))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
