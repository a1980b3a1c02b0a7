#!/usr/bin/env python3
"""Creates the tiny random DeepSeek-V3 / Kimi K2 reference models (multi-head
latent attention, tests/fixtures/models/deepseek_v3_*, kimi_k2_tiny).

Runs where torch and transformers are installed (the GPU machine), on its CPU
in float32, like make_moe_fixtures.py: each model is built with transformers'
own DeepseekV3ForCausalLM, given realistic random weights, saved in Hugging
Face format, reloaded from disk in float32 and asked for the logits of every
prompt position and a greedy 32-token continuation with the top-1 minus
top-2 logit margin of every step (for the near-tie rule of the parity test).

Fixtures (all: hidden 64, 4 heads, kv_lora_rank 32, qk_nope 32, qk_rope 16,
v_head_dim 32, 16 routed experts in 4 groups, top-2 groups, top-4, one
shared expert, routed_scaling_factor 2.5, sigmoid + random correction bias,
YaRN RoPE factor 4 over original_max_position_embeddings 128 with
max_position_embeddings 512, and a 200-token prompt, past the original
length):
  deepseek_v3_tiny     q_lora_rank 24, rope_interleave, mscale 1 and
                       mscale_all_dim 0.707 (cos/sin scaled by their ratio,
                       softmax scale by mscale(4, 0.707)^2), layer 0 dense,
                       and one multi-token-prediction layer appended to the
                       checkpoint (num_nextn_predict_layers 1; Tessera skips it)
  deepseek_v3_tiny_bf16  the same weights saved in bfloat16 (reference: the
                       bf16 checkpoint upcast to float32)
  deepseek_v3_plain_q  q_lora_rank null (a plain q_proj), rope_interleave
                       false, mscale_all_dim absent (no softmax correction,
                       cos/sin x mscale(4)), layers 0 and 1 dense
  deepseek_v3_wide     kv_lora_rank 128, qk_rope 64, qk_nope 64, v 64,
                       hidden 128: sizes closer to the real ones for the
                       CUDA kernels to come
  kimi_k2_tiny         Kimi K2's routing (one group, 32 experts, top-4) and
                       YaRN (beta_fast = beta_slow = 1, mscale = mscale_all_dim
                       = 1); config.json rewritten to model_type "kimi_k2"
                       after the reference ran (transformers has no such type)

Output per fixture: config.json, model.safetensors,
expected_logits.safetensors (logits_<prompt> float32 [len, vocab], and
rope_inv_freq: the rotary table transformers built), expected.json (prompts,
greedy_continuations, greedy_margins, rope_attention_scaling,
softmax_scale, versions).

Usage: python3 tests/gpu/make_mla_fixtures.py [--out tests/fixtures/models]
"""
import argparse
import inspect
import json
import os
import sys

import torch
import transformers
from safetensors.torch import load_file, save_file

SEED = 20261203
VOCAB = 384
PROMPT_LENGTHS = (5, 19, 45, 200)
NEW_TOKENS = 32


def require_deepseek_v3():
    if not hasattr(transformers, "DeepseekV3ForCausalLM"):
        sys.exit(f"make_mla_fixtures.py: transformers {transformers.__version__} has no "
                 "DeepseekV3ForCausalLM (it arrived in transformers 4.51); install a newer "
                 "transformers on this machine to make the MLA fixtures")


def yarn(**kw):
    params = dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                  original_max_position_embeddings=128, beta_fast=32.0, beta_slow=1.0)
    params.update(kw)
    return {k: v for k, v in params.items() if v is not None}


def specs():
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=160,
                  moe_intermediate_size=32, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=4, kv_lora_rank=32, qk_nope_head_dim=32,
                  qk_rope_head_dim=16, v_head_dim=32, n_routed_experts=16, n_group=4,
                  topk_group=2, num_experts_per_tok=4, n_shared_experts=1,
                  routed_scaling_factor=2.5, norm_topk_prob=True, first_k_dense_replace=1,
                  max_position_embeddings=512, rms_norm_eps=1e-6, initializer_range=0.15,
                  bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False,
                  attention_bias=False, use_cache=True)
    tiny = dict(common, q_lora_rank=24, rope_interleave=True,
                rope=yarn(mscale=1.0, mscale_all_dim=0.707), mtp=True)
    return [
        ("deepseek_v3_tiny", tiny, torch.float32, None),
        ("deepseek_v3_tiny_bf16", tiny, torch.bfloat16, None),
        ("deepseek_v3_plain_q", dict(common, q_lora_rank=None, rope_interleave=False,
                                     first_k_dense_replace=2, rope=yarn(mscale=1.0)),
         torch.float32, None),
        ("deepseek_v3_wide", dict(common, hidden_size=128, q_lora_rank=48, kv_lora_rank=128,
                                  qk_nope_head_dim=64, qk_rope_head_dim=64, v_head_dim=64,
                                  rope_interleave=True,
                                  rope=yarn(mscale=1.0, mscale_all_dim=1.0)),
         torch.float32, None),
        ("kimi_k2_tiny", dict(common, q_lora_rank=24, rope_interleave=True, n_routed_experts=32,
                              n_group=1, topk_group=1, routed_scaling_factor=2.827,
                              rope=yarn(beta_fast=1.0, beta_slow=1.0, mscale=1.0,
                                        mscale_all_dim=1.0)),
         torch.float32, "kimi_k2"),
    ]


def make_config(kw):
    kw = dict(kw)
    rope = kw.pop("rope")
    mtp = kw.pop("mtp", False)
    params = inspect.signature(transformers.DeepseekV3Config.__init__).parameters
    if "rope_parameters" in params:  # transformers 5
        kw["rope_parameters"] = rope
    else:  # transformers 4.x
        kw["rope_theta"] = rope["rope_theta"]
        kw["rope_scaling"] = {("type" if k == "rope_type" else k): v
                              for k, v in rope.items() if k != "rope_theta"}
    if mtp:
        kw["num_nextn_predict_layers"] = 1
    config = transformers.DeepseekV3Config(**kw)
    config._attn_implementation = "eager"
    return config, mtp


def randomize(model, gen, std):
    """Every weight random (routers included), RMSNorm weights near 1, and a
    correction bias big enough to change which experts are chosen."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith("e_score_correction_bias"):
                p.copy_(0.05 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(std * torch.randn(p.shape, generator=gen))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.05 * torch.randn(b.shape, generator=gen))


def append_mtp_layer(out_dir, layers):
    """A multi-token-prediction layer as DeepSeek-V3 stores it: layer
    `layers` with a decoder layer's tensors plus eh_proj, enorm, hnorm and
    shared_head.norm (values irrelevant: it is skipped)."""
    path = os.path.join(out_dir, "model.safetensors")
    tensors = load_file(path)
    last = f"model.layers.{layers - 1}."
    extra = {k.replace(last, f"model.layers.{layers}."): v.clone()
             for k, v in tensors.items() if k.startswith(last)}
    hidden = tensors["model.norm.weight"].shape[0]
    dtype = tensors["model.norm.weight"].dtype
    extra[f"model.layers.{layers}.eh_proj.weight"] = torch.zeros(hidden, 2 * hidden, dtype=dtype)
    for n in ("enorm", "hnorm", "shared_head.norm"):
        extra[f"model.layers.{layers}.{n}.weight"] = torch.ones(hidden, dtype=dtype)
    tensors.update(extra)
    # A new file renamed over the old one: the reference model may still
    # map the old file's pages.
    save_file(tensors, path + ".tmp", metadata={"format": "pt"})
    os.replace(path + ".tmp", path)
    return len(extra)


def load_reference(out_dir):
    cls = transformers.DeepseekV3ForCausalLM
    try:
        ref = cls.from_pretrained(out_dir, dtype=torch.float32, attn_implementation="eager")
    except TypeError:
        ref = cls.from_pretrained(out_dir, torch_dtype=torch.float32, attn_implementation="eager")
    ref.eval()
    ref.generation_config.eos_token_id = None
    ref.generation_config.pad_token_id = 0
    return ref


def main():
    require_deepseek_v3()
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/fixtures/models")
    args = ap.parse_args()
    torch.set_num_threads(4)
    os.makedirs(args.out, exist_ok=True)
    for name, kw, save_dtype, model_type in specs():
        torch.manual_seed(SEED)
        gen = torch.Generator().manual_seed(SEED + 1)
        config, mtp = make_config(kw)
        model = transformers.DeepseekV3ForCausalLM(config).eval()
        randomize(model, gen, kw["initializer_range"])
        out_dir = os.path.join(args.out, name)
        os.makedirs(out_dir, exist_ok=True)
        model.to(save_dtype).save_pretrained(out_dir)
        # The reference runs on the checkpoint as saved (DESIGN.md: never on
        # a cast model object, whose rotary table would be rounded).
        ref = load_reference(out_dir)
        prompts = [torch.randint(3, VOCAB, (n,), generator=gen).tolist() for n in PROMPT_LENGTHS]
        tensors, continuations, margins = {}, [], []
        with torch.no_grad():
            for p_i, p in enumerate(prompts):
                ids = torch.tensor([p])
                tensors[f"logits_{p_i}"] = ref(input_ids=ids).logits[0].float().contiguous()
                out = ref.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                   max_new_tokens=NEW_TOKENS, output_scores=True,
                                   return_dict_in_generate=True)
                continuations.append(out.sequences[0, len(p):].tolist())
                step = []
                for scores in out.scores:
                    top = torch.topk(scores[0].float(), 2).values
                    step.append(float(top[0] - top[1]))
                margins.append(step)
        rotary = ref.model.rotary_emb
        tensors["rope_inv_freq"] = rotary.inv_freq.float().contiguous()
        save_file(tensors, os.path.join(out_dir, "expected_logits.safetensors"))
        # After the reference is done with the checkpoint.
        mtp_tensors = append_mtp_layer(out_dir, config.num_hidden_layers) if mtp else 0
        if model_type is not None:
            with open(os.path.join(out_dir, "config.json")) as f:
                saved = json.load(f)
            saved["model_type"] = model_type
            with open(os.path.join(out_dir, "config.json"), "w") as f:
                json.dump(saved, f, indent=2, sort_keys=True)
        with open(os.path.join(out_dir, "expected.json"), "w") as f:
            json.dump({
                "architecture": "DeepseekV3ForCausalLM",
                "model_type": model_type or "deepseek_v3",
                "weights_dtype": str(save_dtype).replace("torch.", ""),
                "compute": "float32 on CPU, eager attention, from the checkpoint on disk",
                "prompts": prompts,
                "greedy_continuations": continuations,
                "greedy_margins": margins,
                "new_tokens": NEW_TOKENS,
                "rope_attention_scaling": float(rotary.attention_scaling),
                "softmax_scale": float(ref.model.layers[0].self_attn.scaling),
                "mtp_tensors_appended": mtp_tensors,
                "transformers_version": transformers.__version__,
                "torch_version": torch.__version__,
                "seed": SEED,
            }, f, indent=1)
        size = sum(os.path.getsize(os.path.join(out_dir, x)) for x in os.listdir(out_dir))
        print(f"{name}: {sum(p.numel() for p in model.parameters())} params, {size} bytes, "
              f"softmax_scale {float(ref.model.layers[0].self_attn.scaling):.6g}, "
              f"attention_scaling {float(rotary.attention_scaling):.6g}, "
              f"min margin {min(min(m) for m in margins):.4g}, "
              f"continuation[0][:8]={continuations[0][:8]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
