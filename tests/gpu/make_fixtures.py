#!/usr/bin/env python3
"""Creates the tiny random reference models and their expected outputs.

Runs where torch and transformers are installed (the GPU machine; the work
itself runs on its CPU in float32 so the numbers are reproducible). For each
architecture it builds a tiny model with transformers' own classes, saves it
in Hugging Face format, and records transformers' logits for a few prompts
and its greedy 32-token continuations. Tessera's CPU forward pass must
reproduce them (tests in worker/model).

Output (default tests/fixtures/models/<name>/):
  config.json, model.safetensors (or shards + model.safetensors.index.json)
  expected_logits.safetensors   logits_<i>: float32 [prompt_len, vocab]
  expected.json                 prompts, greedy continuations, provenance

Usage: python3 tests/gpu/make_fixtures.py [--out tests/fixtures/models]
"""
import argparse
import json
import os
import sys

import torch
import transformers
from safetensors.torch import save_file

SEED = 20261129
VOCAB = 384
PROMPT_LENGTHS = (5, 19, 45)
NEW_TOKENS = 32


def common(**kw):
    base = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        initializer_range=0.15,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        use_cache=True,
    )
    base.update(kw)
    return base


def specs():
    return [
        # Llama 3 style: llama3 RoPE scaling with a small original context so
        # the scaled and unscaled frequency bands both occur.
        ("llama3_tiny", transformers.LlamaConfig, transformers.LlamaForCausalLM,
         common(rope_theta=500000.0,
                rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                  high_freq_factor=4.0, original_max_position_embeddings=32),
                tie_word_embeddings=False), torch.float32, None),
        # Qwen2: q/k/v biases, tied embeddings, sharded checkpoint.
        ("qwen2_tiny", transformers.Qwen2Config, transformers.Qwen2ForCausalLM,
         common(rope_theta=1000000.0, tie_word_embeddings=True), torch.float32, "60KB"),
        # Qwen3: q/k RMSNorm, head_dim different from hidden/heads.
        ("qwen3_tiny", transformers.Qwen3Config, transformers.Qwen3ForCausalLM,
         common(rope_theta=1000000.0, head_dim=32, tie_word_embeddings=False),
         torch.float32, None),
        # Qwen3 with bf16 weights: logits recorded with the bf16 weights
        # upcast to float32 (what a float32-compute backend must match).
        ("qwen3_tiny_bf16", transformers.Qwen3Config, transformers.Qwen3ForCausalLM,
         common(rope_theta=1000000.0, head_dim=32, tie_word_embeddings=True),
         torch.bfloat16, None),
        # Mistral: Llama layout under its own architecture name.
        ("mistral_tiny", transformers.MistralConfig, transformers.MistralForCausalLM,
         common(rope_theta=10000.0, sliding_window=None, tie_word_embeddings=False),
         torch.float32, None),
    ]


def perturb_norms(model, gen):
    """Random RMSNorm weights, so a backend that ignores them fails."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/fixtures/models")
    args = ap.parse_args()
    torch.set_num_threads(4)
    torch.backends.cuda.matmul.allow_tf32 = False
    os.makedirs(args.out, exist_ok=True)
    for name, config_cls, model_cls, cfg_kw, dtype, shard in specs():
        torch.manual_seed(SEED)
        gen = torch.Generator().manual_seed(SEED + 1)
        config = config_cls(**cfg_kw)
        config._attn_implementation = "eager"
        model = model_cls(config).eval()
        perturb_norms(model, gen)
        out_dir = os.path.join(args.out, name)
        os.makedirs(out_dir, exist_ok=True)
        saved = model.to(dtype)
        if shard:
            saved.save_pretrained(out_dir, max_shard_size=shard)
        else:
            saved.save_pretrained(out_dir)
        # Reload what was saved, so the expectations are of the files on
        # disk, and compute in float32 on the CPU.
        ref = model_cls.from_pretrained(out_dir, attn_implementation="eager").float().eval()
        # Greedy continuations run the full length: EOS does not stop them
        # (Tessera's side uses ignore_eos), and no logits processor is added.
        ref.generation_config.eos_token_id = None
        ref.generation_config.pad_token_id = 0
        prompts = [torch.randint(3, VOCAB, (n,), generator=gen).tolist() for n in PROMPT_LENGTHS]
        tensors = {}
        continuations = []
        with torch.no_grad():
            for i, p in enumerate(prompts):
                ids = torch.tensor([p])
                logits = ref(input_ids=ids).logits[0].float().contiguous()
                tensors[f"logits_{i}"] = logits
                out = ref.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                   max_new_tokens=NEW_TOKENS)
                continuations.append(out[0, len(p):].tolist())
        save_file(tensors, os.path.join(out_dir, "expected_logits.safetensors"))
        with open(os.path.join(out_dir, "expected.json"), "w") as f:
            json.dump({
                "architecture": config.architectures[0] if config.architectures else model_cls.__name__,
                "weights_dtype": str(dtype).replace("torch.", ""),
                "compute": "float32 on CPU, eager attention",
                "prompts": prompts,
                "greedy_continuations": continuations,
                "new_tokens": NEW_TOKENS,
                "transformers_version": transformers.__version__,
                "torch_version": torch.__version__,
                "seed": SEED,
            }, f, indent=1)
        size = sum(os.path.getsize(os.path.join(out_dir, x)) for x in os.listdir(out_dir))
        print(f"{name}: {sum(p.numel() for p in model.parameters())} params, {size} bytes, "
              f"continuation[0][:8]={continuations[0][:8]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
