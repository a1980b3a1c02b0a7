#!/usr/bin/env python3
"""Creates the tiny random mixture-of-experts reference models.

Runs where torch and transformers are installed (the GPU machine), on its CPU
in float32. Like make_fixtures.py, it builds each model with transformers'
own classes, saves it in Hugging Face format (transformers writes one tensor
per expert: model.layers.N.mlp.experts.E.{gate,up,down}_proj.weight), and
records, for a few prompts, the logits and the greedy 32-token continuation.
It also records what each MoE layer's router chose for every prompt token,
read from the router module's own output, so the routing test compares
Tessera's experts and weights with the reference's, token by token.

Fixtures:
  qwen3_moe_tiny  Qwen3MoeForCausalLM: softmax -> top-2 of 8 -> renormalised;
                  layer 1 is dense (mlp_only_layers), q/k norm.
  glm4_moe_tiny   Glm4MoeForCausalLM: sigmoid + e_score_correction_bias
                  (random, so it changes the choice) -> 2 of 4 groups ->
                  top-4 of 16, renormalised, x 2.5, one shared expert;
                  layer 0 dense (first_k_dense_replace), partial RoPE 0.5,
                  attention bias, q/k norm.
  qwen3_moe_d64, glm4_moe_d64  the same with head_dim 64 (the CUDA attention
                  kernels run 64, 128 and 256, not 32).

Output (default tests/fixtures/models/<name>/): config.json,
model.safetensors, expected_logits.safetensors, expected.json (as
make_fixtures.py) and expected_routing.safetensors:
  routing_<prompt>_<layer>_logits   float32 [prompt_len, experts]
  routing_<prompt>_<layer>_experts  int32   [prompt_len, top_k] (as returned)
  routing_<prompt>_<layer>_weights  float32 [prompt_len, top_k]

Usage: python3 tests/gpu/make_moe_fixtures.py [--out tests/fixtures/models]
"""
import argparse
import json
import os
import sys

import torch
import transformers
from safetensors.torch import save_file

SEED = 20261202
VOCAB = 384
PROMPT_LENGTHS = (5, 19, 45)
NEW_TOKENS = 32


def specs():
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=160,
                  moe_intermediate_size=32, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=32, max_position_embeddings=256,
                  initializer_range=0.15, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                  tie_word_embeddings=False, use_cache=True)
    out = [
        ("qwen3_moe_tiny", transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM,
         dict(common, rms_norm_eps=1e-6, rope_theta=1000000.0, num_experts=8,
              num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1,
              mlp_only_layers=[1])),
        ("glm4_moe_tiny", transformers.Glm4MoeConfig, transformers.Glm4MoeForCausalLM,
         dict(common, rms_norm_eps=1e-5, rope_theta=10000.0, partial_rotary_factor=0.5,
              n_routed_experts=16, n_group=4, topk_group=2, num_experts_per_tok=4,
              n_shared_experts=1, routed_scaling_factor=2.5, norm_topk_prob=True,
              first_k_dense_replace=1, attention_bias=True, use_qk_norm=True,
              num_nextn_predict_layers=0)),
    ]
    # The same two with head_dim 64, a size the CUDA attention kernels run.
    for name, config_cls, model_cls, kw in list(out):
        out.append((name.replace("_tiny", "_d64"), config_cls, model_cls, dict(kw, head_dim=64)))
    return out


def randomize(model, gen, std):
    """Every weight random (routers included: transformers starts some at
    zero), RMSNorm weights near 1, biases small, and a correction bias big
    enough to change which experts are chosen."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(std * torch.randn(p.shape, generator=gen))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.05 * torch.randn(b.shape, generator=gen))


def router_modules(model):
    """Layer index -> the router of each sparse layer."""
    return {i: layer.mlp.gate for i, layer in enumerate(model.model.layers)
            if hasattr(layer.mlp, "experts")}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/fixtures/models")
    args = ap.parse_args()
    torch.set_num_threads(4)
    os.makedirs(args.out, exist_ok=True)
    for name, config_cls, model_cls, cfg_kw in specs():
        torch.manual_seed(SEED)
        gen = torch.Generator().manual_seed(SEED + 1)
        config = config_cls(**cfg_kw)
        config._attn_implementation = "eager"
        model = model_cls(config).eval()
        randomize(model, gen, cfg_kw["initializer_range"])
        out_dir = os.path.join(args.out, name)
        os.makedirs(out_dir, exist_ok=True)
        model.save_pretrained(out_dir)
        ref = model_cls.from_pretrained(out_dir, attn_implementation="eager").float().eval()
        ref.generation_config.eos_token_id = None
        ref.generation_config.pad_token_id = 0
        routers = router_modules(ref)
        captured = {}
        for i, m in routers.items():
            m.register_forward_hook(lambda mod, inp, out, i=i: captured.__setitem__(i, out))
        prompts = [torch.randint(3, VOCAB, (n,), generator=gen).tolist() for n in PROMPT_LENGTHS]
        tensors, routing, continuations = {}, {}, []
        with torch.no_grad():
            for p_i, p in enumerate(prompts):
                ids = torch.tensor([p])
                captured.clear()
                tensors[f"logits_{p_i}"] = ref(input_ids=ids).logits[0].float().contiguous()
                for layer, (logits, weights, experts) in sorted(captured.items()):
                    routing[f"routing_{p_i}_{layer}_logits"] = logits.float().contiguous()
                    routing[f"routing_{p_i}_{layer}_experts"] = experts.to(torch.int32).contiguous()
                    routing[f"routing_{p_i}_{layer}_weights"] = weights.float().contiguous()
                out = ref.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                   max_new_tokens=NEW_TOKENS)
                continuations.append(out[0, len(p):].tolist())
        save_file(tensors, os.path.join(out_dir, "expected_logits.safetensors"))
        save_file(routing, os.path.join(out_dir, "expected_routing.safetensors"))
        with open(os.path.join(out_dir, "expected.json"), "w") as f:
            json.dump({
                "architecture": config.architectures[0] if config.architectures else model_cls.__name__,
                "weights_dtype": "float32",
                "compute": "float32 on CPU, eager attention",
                "prompts": prompts,
                "greedy_continuations": continuations,
                "new_tokens": NEW_TOKENS,
                "moe_layers": sorted(routers),
                "transformers_version": transformers.__version__,
                "torch_version": torch.__version__,
                "seed": SEED,
            }, f, indent=1)
        size = sum(os.path.getsize(os.path.join(out_dir, x)) for x in os.listdir(out_dir))
        print(f"{name}: {sum(p.numel() for p in model.parameters())} params, {size} bytes, "
              f"moe layers {sorted(routers)}, continuation[0][:8]={continuations[0][:8]}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
