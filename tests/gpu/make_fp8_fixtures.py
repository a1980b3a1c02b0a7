#!/usr/bin/env python3
"""Creates tiny random FP8 reference models in both checkpoint formats.

Runs where torch (with torch.float8_e4m3fn) and transformers are installed
(the GPU machine), on its CPU in float32. Transformers' own fine-grained FP8
path needs the `kernels` package, and compressed-tensors needs the
`compressed-tensors` package; neither is installed there, so this script
quantizes the checkpoints itself, following each format's documented layout,
and computes the reference as:

  1. the saved FP8 checkpoint dequantized exactly (e4m3 * scale, in float32)
     and saved as a plain float32 checkpoint in a temporary directory;
  2. that checkpoint loaded by transformers (from_pretrained, float32, eager
     attention), with every quantized nn.Linear's input passed through our
     PyTorch emulation of the format's activation quantization (below) -
     the arithmetic of kernels/cpu/fp8_linear.h.

Formats written (weights e4m3fn [out, in]):
  fine-grained ("quant_method": "fp8", weight_block_size [128, 128],
      activation_scheme dynamic): <module>.weight_scale_inv float32
      [ceil(out/128), ceil(in/128)], multiplied in;
      activations per token and group of 128: s = max(amax, 1e-10) / 448.
  compressed-tensors "float-quantized":
      tensor  : weight_scale bf16 [1], input_scale float32 [1] (static,
                from a calibration pass: amax over calibration prompts / 448)
      channel : weight_scale bf16 [out, 1], activations dynamic per token
      block   : weight_scale float32 [ceil(out/128), ceil(in/128)],
                activations dynamic per group of 128
  lm_head, embeddings and norms stay bf16 (lm_head in modules_to_not_convert
  / ignore). Quantized values: q = e4m3(clamp(x / s, -448, 448)) with torch's
  round-to-nearest-even cast.

Fixtures (hidden 320 = 2.5 blocks and intermediate 448 = 3.5 blocks, so the
last block of every grid is partial; head_dim 64 for the CUDA kernels):
  llama3_fp8_block    LlamaForCausalLM, fine-grained
  qwen3_fp8_block     Qwen3ForCausalLM, fine-grained
  qwen3_ct_tensor     Qwen3ForCausalLM, compressed-tensors tensor + static
  llama3_ct_channel   LlamaForCausalLM, compressed-tensors channel + dynamic token
  qwen3_ct_block      Qwen3ForCausalLM, compressed-tensors block + dynamic group

Output (default tests/fixtures/models/<name>/): config.json (with
quantization_config), model.safetensors (FP8), expected_logits.safetensors
(logits_<p> float32 [prompt_len, vocab]) and expected.json (prompts,
greedy_continuations of 32 tokens, greedy_margins: the reference's
top-1 minus top-2 logit at each generated step, for the near-tie rule of
worker/runner/fp8_fixture_parity_test.cc).

Usage: python3 tests/gpu/make_fp8_fixtures.py [--out tests/fixtures/models]
"""
import argparse
import json
import os
import sys
import tempfile

import torch
import transformers
from safetensors.torch import load_file, save_file

SEED = 20261203
VOCAB = 384
PROMPT_LENGTHS = (7, 23, 61)
NEW_TOKENS = 32
BLOCK = 128
E4M3_MAX = 448.0
AMAX_FLOOR = 1e-10
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def specs():
    common = dict(vocab_size=VOCAB, hidden_size=320, intermediate_size=448, num_hidden_layers=2,
                  num_attention_heads=5, num_key_value_heads=1, head_dim=64,
                  max_position_embeddings=512, initializer_range=0.08, bos_token_id=1,
                  eos_token_id=2, pad_token_id=0, tie_word_embeddings=False, use_cache=True)
    llama = (transformers.LlamaConfig, transformers.LlamaForCausalLM,
             dict(common, rms_norm_eps=1e-5, rope_theta=500000.0))
    qwen3 = (transformers.Qwen3Config, transformers.Qwen3ForCausalLM,
             dict(common, rms_norm_eps=1e-6, rope_theta=1000000.0))
    return [
        ("llama3_fp8_block", *llama, ("fine-grained", None)),
        ("qwen3_fp8_block", *qwen3, ("fine-grained", None)),
        ("qwen3_ct_tensor", *qwen3, ("compressed-tensors", "tensor")),
        ("llama3_ct_channel", *llama, ("compressed-tensors", "channel")),
        ("qwen3_ct_block", *qwen3, ("compressed-tensors", "block")),
    ]


def randomize(model, gen, std):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(std * torch.randn(p.shape, generator=gen))


def to_e4m3(x, scale):
    return (x / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def expand_blocks(grid, out, inp):
    return grid.repeat_interleave(BLOCK, 0)[:out].repeat_interleave(BLOCK, 1)[:, :inp]


def quantize_weight(w, strategy):
    """w float32 [out, in] -> (e4m3 weight, stored scale tensor)."""
    out, inp = w.shape
    if strategy == "block":
        rows, cols = -(-out // BLOCK), -(-inp // BLOCK)
        grid = torch.zeros(rows, cols)
        for i in range(rows):
            for j in range(cols):
                blk = w[i * BLOCK:(i + 1) * BLOCK, j * BLOCK:(j + 1) * BLOCK]
                grid[i, j] = blk.abs().max().clamp_min(AMAX_FLOOR) / E4M3_MAX
        return to_e4m3(w, expand_blocks(grid, out, inp)), grid.float()
    if strategy == "channel":
        s = (w.abs().amax(dim=1, keepdim=True).clamp_min(AMAX_FLOOR) / E4M3_MAX).bfloat16()
        return to_e4m3(w, s.float()), s
    s = (w.abs().max().clamp_min(AMAX_FLOOR) / E4M3_MAX).reshape(1).bfloat16()
    return to_e4m3(w, s.float()), s


def dequantize(q, scale, strategy):
    out, inp = q.shape
    s = scale.float()
    if strategy == "block":
        s = expand_blocks(s, out, inp)
    return q.float() * s


def qdq_activations(x, mode, static_scale=None):
    """Our emulation of the activation quantization (fp8_linear.h)."""
    x = x.float()
    if mode == "none":
        return x
    if mode == "static":
        s = static_scale
        return (x / s).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).float() * s
    group = BLOCK if mode == "group" else x.shape[-1]
    parts = []
    for part in torch.split(x, group, dim=-1):
        s = part.abs().amax(dim=-1, keepdim=True).clamp_min(AMAX_FLOOR) / E4M3_MAX
        parts.append((part / s).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).float() * s)
    return torch.cat(parts, dim=-1)


def quantization_config(fmt, strategy):
    if fmt == "fine-grained":
        return {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                "weight_block_size": [BLOCK, BLOCK], "modules_to_not_convert": ["lm_head"]}
    weights = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": False,
               "strategy": strategy, "group_size": None, "observer": "minmax",
               "block_structure": [BLOCK, BLOCK] if strategy == "block" else None}
    act = {"num_bits": 8, "type": "float", "symmetric": True, "observer": None}
    if strategy == "tensor":
        act.update(dynamic=False, strategy="tensor", observer="minmax")
    elif strategy == "channel":
        act.update(dynamic=True, strategy="token")
    else:
        act.update(dynamic=True, strategy="group", group_size=BLOCK)
    return {"quant_method": "compressed-tensors", "format": "float-quantized",
            "quantization_status": "compressed",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights,
                                          "input_activations": act, "output_activations": None,
                                          "format": "float-quantized"}},
            "ignore": ["lm_head"], "kv_cache_scheme": None}


def activation_mode(fmt, strategy):
    if fmt == "fine-grained" or strategy == "block":
        return "group"
    return "static" if strategy == "tensor" else "token"


def linear_modules(model):
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and name.split(".")[-1] in LINEARS:
            yield name, module


def calibrate(model, gen):
    """Static input scales: amax of each linear's input over 4 random prompts / 448."""
    amax, hooks = {}, []
    for name, m in linear_modules(model):
        def hook(mod, inp, name=name):
            amax[name] = max(amax.get(name, 0.0), inp[0].abs().max().item())
        hooks.append(m.register_forward_pre_hook(hook))
    with torch.no_grad():
        for n in (16, 40, 64, 9):
            model(input_ids=torch.randint(3, VOCAB, (1, n), generator=gen))
    for h in hooks:
        h.remove()
    return {k: torch.tensor([max(v, AMAX_FLOOR) / E4M3_MAX], dtype=torch.float32)
            for k, v in amax.items()}


def write_checkpoint(model, out_dir, fmt, strategy, input_scales):
    """The FP8 checkpoint and, in memory, its exact dequantization."""
    quantized = {name for name, _ in linear_modules(model)}
    tensors, dequant = {}, {}
    for name, p in model.state_dict().items():
        module = name.rsplit(".", 1)[0]
        if module in quantized and name.endswith(".weight"):
            w_strategy = "block" if fmt == "fine-grained" else strategy
            q, scale = quantize_weight(p.detach().float(), w_strategy)
            suffix = "weight_scale_inv" if fmt == "fine-grained" else "weight_scale"
            tensors[name] = q.contiguous()
            tensors[f"{module}.{suffix}"] = scale.contiguous()
            if fmt == "compressed-tensors" and strategy == "tensor":
                tensors[f"{module}.input_scale"] = input_scales[module]
            dequant[name] = dequantize(q, scale, w_strategy)
        else:
            tensors[name] = p.detach().bfloat16().contiguous()
            dequant[name] = tensors[name].float()
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    config["torch_dtype"] = "bfloat16"
    config.pop("dtype", None)
    config["quantization_config"] = quantization_config(fmt, strategy)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    return dequant, quantized


def reference_model(model_cls, config, dequant, quantized, mode, input_scales):
    """transformers in float32 from the dequantized checkpoint on disk, with
    the activation-quantization emulation on every quantized linear."""
    with tempfile.TemporaryDirectory() as tmp:
        plain = config.__class__.from_dict(config.to_dict())
        plain.save_pretrained(tmp)
        save_file({k: v.contiguous() for k, v in dequant.items()},
                  os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
        ref = model_cls.from_pretrained(tmp, dtype=torch.float32,
                                        attn_implementation="eager").eval()
    for name, m in linear_modules(ref):
        if name not in quantized:
            continue
        scale = input_scales.get(name, torch.ones(1)).item() if mode == "static" else None
        m.register_forward_pre_hook(
            lambda mod, inp, scale=scale: (qdq_activations(inp[0], mode, scale),))
    ref.generation_config.eos_token_id = None
    ref.generation_config.pad_token_id = 0
    return ref


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/fixtures/models")
    args = ap.parse_args()
    torch.set_num_threads(4)
    os.makedirs(args.out, exist_ok=True)
    for name, config_cls, model_cls, cfg_kw, (fmt, strategy) in specs():
        torch.manual_seed(SEED)
        gen = torch.Generator().manual_seed(SEED + 1)
        config = config_cls(**cfg_kw)
        config._attn_implementation = "eager"
        model = model_cls(config).eval()
        randomize(model, gen, cfg_kw["initializer_range"])
        mode = activation_mode(fmt, strategy)
        input_scales = calibrate(model, gen) if mode == "static" else {}
        out_dir = os.path.join(args.out, name)
        os.makedirs(out_dir, exist_ok=True)
        dequant, quantized = write_checkpoint(model, out_dir, fmt, strategy, input_scales)
        # The checkpoint round-trips through safetensors as F8_E4M3.
        saved = load_file(os.path.join(out_dir, "model.safetensors"))
        assert saved["model.layers.0.self_attn.q_proj.weight"].dtype == torch.float8_e4m3fn
        ref = reference_model(model_cls, config, dequant, quantized, mode, input_scales)
        prompts = [torch.randint(3, VOCAB, (n,), generator=gen).tolist() for n in PROMPT_LENGTHS]
        logits, continuations, margins = {}, [], []
        with torch.no_grad():
            for p_i, p in enumerate(prompts):
                ids = torch.tensor([p])
                logits[f"logits_{p_i}"] = ref(input_ids=ids).logits[0].float().contiguous()
                out = ref.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                   max_new_tokens=NEW_TOKENS, output_scores=True,
                                   return_dict_in_generate=True)
                continuations.append(out.sequences[0, len(p):].tolist())
                step_margins = []
                for scores in out.scores:
                    top = torch.topk(scores[0].float(), 2).values
                    step_margins.append(float(top[0] - top[1]))
                margins.append(step_margins)
        save_file(logits, os.path.join(out_dir, "expected_logits.safetensors"))
        with open(os.path.join(out_dir, "expected.json"), "w") as f:
            json.dump({
                "architecture": model_cls.__name__,
                "format": fmt,
                "weight_strategy": "block" if fmt == "fine-grained" else strategy,
                "activation_quantization": mode,
                "weights_dtype": "float8_e4m3fn (linears), bfloat16 (others)",
                "compute": "float32 on CPU, eager attention, from the dequantized checkpoint, "
                           "with the activation-quantization emulation of make_fp8_fixtures.py",
                "prompts": prompts,
                "greedy_continuations": continuations,
                "greedy_margins": margins,
                "new_tokens": NEW_TOKENS,
                "transformers_version": transformers.__version__,
                "torch_version": torch.__version__,
                "seed": SEED,
            }, f, indent=1)
        size = sum(os.path.getsize(os.path.join(out_dir, x)) for x in os.listdir(out_dir))
        print(f"{name}: {fmt}/{strategy or 'block'}, activations {mode}, {size} bytes, "
              f"continuation[0][:8]={continuations[0][:8]}, "
              f"min margin {min(min(m) for m in margins):.4g}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
