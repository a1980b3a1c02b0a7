#!/usr/bin/env python3
"""Decode speed of Hugging Face transformers (eager attention, `generate`) on a
model with random bf16 weights: the peer that tests/bench/gpu_decode_bench is
compared with, on the same shapes. --model picks them: llama3_8b (Llama-3-8B)
or qwen3_30b_a3b (Qwen3-30B-A3B: 48 layers, 128 experts, top-8); for the
mixture-of-experts model --experts_implementation picks transformers' expert
backend (grouped_mm, the fastest it offers on the GPU, by default).

Per batch size B: B prompts of --prompt_len random tokens, greedy `generate`
of exactly --new_tokens tokens (min_new_tokens = max_new_tokens, EOS ignored).
decode tokens/s = B * (new_tokens - 1) / (generate time - time of a 1-token
generate on the same prompts), i.e. the prefill is taken out.

--prefill_len N (default 0: skipped) also times one forward pass over N
tokens (batch 1, logits of the last token only), the best of three.

Runs only on the GPU machine (torch, transformers). Prints JSON; --out writes it.
"""
import argparse
import json
import time

import torch
import transformers


def build_config(name):
    if name == "llama3_8b":
        return transformers.LlamaConfig(
            hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
            num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=128256,
            max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0,
            rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
            tie_word_embeddings=False, attn_implementation="eager"), transformers.LlamaForCausalLM
    if name == "qwen3_30b_a3b":
        return transformers.Qwen3MoeConfig(
            hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
            num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
            vocab_size=151936, num_experts=128, num_experts_per_tok=8, norm_topk_prob=True,
            decoder_sparse_step=1, mlp_only_layers=[], max_position_embeddings=40960,
            rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=False,
            attn_implementation="eager"), transformers.Qwen3MoeForCausalLM
    raise SystemExit(f"unknown --model {name}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch_sizes", default="1,8,64")
    p.add_argument("--prompt_len", type=int, default=128)
    p.add_argument("--new_tokens", type=int, default=64)
    p.add_argument("--model", default="llama3_8b")
    p.add_argument("--experts_implementation", default="grouped_mm")
    p.add_argument("--prefill_len", type=int, default=0)
    p.add_argument("--out", default="")
    a = p.parse_args()
    torch.manual_seed(0)
    cfg, model_cls = build_config(a.model)
    moe = hasattr(cfg, "num_experts")
    if moe:
        cfg._experts_implementation = a.experts_implementation
    # Built on the meta device in bf16, so no float32 copy (122 GB for the
    # MoE model) is ever materialised.
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("meta"):
        model = model_cls(cfg)
    torch.set_default_dtype(torch.float32)
    model = model.to_empty(device="cuda").to(torch.bfloat16)
    # to_empty leaves buffers uninitialised: rebuild the rotary embedding
    # (its inverse frequencies) off the meta device.
    model.model.rotary_emb = type(model.model.rotary_emb)(cfg).to("cuda")
    with torch.no_grad():
        for t in model.parameters():
            t.uniform_(-0.03, 0.03)
        for name, t in model.named_parameters():
            if "norm" in name:
                t.fill_(1.0)
    model.eval()
    model.generation_config.pad_token_id = 0
    weight_bytes = sum(t.numel() * t.element_size() for t in model.parameters())
    results = []
    for b in [int(x) for x in a.batch_sizes.split(",")]:
        ids = torch.randint(0, cfg.vocab_size, (b, a.prompt_len), device="cuda")
        mask = torch.ones_like(ids)

        def gen(n):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            with torch.no_grad():
                out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                                     max_new_tokens=n, min_new_tokens=n)
            torch.cuda.synchronize()
            assert out.shape[1] == a.prompt_len + n, out.shape
            return time.perf_counter() - t0

        gen(2)  # warm-up
        t_one = min(gen(1) for _ in range(2))
        t_all = gen(a.new_tokens)
        decode_s = max(t_all - t_one, 1e-9)
        r = {"batch": b, "prompt_len": a.prompt_len, "new_tokens": a.new_tokens,
             "generate_seconds": t_all, "decode_tokens_per_second": b * (a.new_tokens - 1) / decode_s}
        print(json.dumps(r), flush=True)
        results.append(r)
    prefill = None
    if a.prefill_len > 0:
        ids = torch.randint(0, cfg.vocab_size, (1, a.prefill_len), device="cuda")

        def forward():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            with torch.no_grad():
                model(input_ids=ids, logits_to_keep=1)
            torch.cuda.synchronize()
            return time.perf_counter() - t0

        forward()  # warm-up
        prefill = {"tokens": a.prefill_len, "seconds": min(forward() for _ in range(3))}
        print(json.dumps(prefill), flush=True)
    out = {"peer": "transformers eager generate", "model": a.model,
           "experts_implementation": getattr(cfg, "_experts_implementation", None) if moe else None,
           "prefill": prefill, "transformers": __import__("transformers").__version__,
           "torch": torch.__version__, "device": torch.cuda.get_device_name(0),
           "weight_bytes": weight_bytes, "results": results}
    print(json.dumps(out, indent=2))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
