"""Generates worker/model/testdata from Hugging Face transformers.

Run where torch and transformers are installed:
    OUT=/some/dir python3 worker/model/testdata/make_reference.py
then copy $OUT/* into worker/model/testdata/. It writes:
  rope_inv_freq.json   transformers' RoPE inverse-frequency tables (float32)
                       for several configs (default, linear, llama3 scaling);
  tiny_<arch>/         tiny random models saved with save_pretrained
                       (config.json + safetensors, one of them sharded), and
                       tensors.json: per tensor dtype, shape, float64 sum and
                       the first values, read back through torch;
                       reference.json: input ids and the float32 logits of
                       every position, from the model in float32.
"""
import json
import os
import sys

import torch
import transformers
from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM,
                          Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

OUT = os.environ["OUT"]


def rope_tables():
    cases = {
        "llama_default_d128": (LlamaRotaryEmbedding,
                               LlamaConfig(hidden_size=4096, num_attention_heads=32,
                                           rope_theta=10000.0)),
        "llama_linear4_d128": (LlamaRotaryEmbedding,
                               LlamaConfig(hidden_size=4096, num_attention_heads=32,
                                           rope_theta=10000.0,
                                           rope_scaling={"type": "linear", "factor": 4.0})),
        "llama31_8b": (LlamaRotaryEmbedding,
                       LlamaConfig(hidden_size=4096, num_attention_heads=32, rope_theta=500000.0,
                                   max_position_embeddings=131072,
                                   rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                                 "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                 "original_max_position_embeddings": 8192})),
        "llama32_1b": (LlamaRotaryEmbedding,
                       LlamaConfig(hidden_size=2048, num_attention_heads=32, rope_theta=500000.0,
                                   max_position_embeddings=131072,
                                   rope_scaling={"rope_type": "llama3", "factor": 32.0,
                                                 "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                 "original_max_position_embeddings": 8192})),
        "qwen3_d128": (Qwen3RotaryEmbedding,
                       Qwen3Config(hidden_size=1024, num_attention_heads=16, head_dim=128,
                                   rope_theta=1000000.0)),
        "qwen2_d64": (LlamaRotaryEmbedding,
                      LlamaConfig(hidden_size=896, num_attention_heads=14, rope_theta=1000000.0)),
    }
    tables = {}
    for name, (cls, cfg) in cases.items():
        emb = cls(config=cfg)
        inv = emb.inv_freq.detach().to(torch.float32).cpu()
        tables[name] = {
            "config": {k: getattr(cfg, k, None) for k in
                       ("hidden_size", "num_attention_heads", "head_dim", "rope_theta",
                        "rope_scaling")},
            "head_dim": int(inv.numel() * 2),
            "inv_freq_bits": [int(x) for x in inv.view(torch.int32).tolist()],
            "attention_scaling": float(getattr(emb, "attention_scaling", 1.0)),
        }
    return tables


def tiny_models():
    common = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                  bos_token_id=1, eos_token_id=2)
    return {
        "tiny_llama": (LlamaForCausalLM,
                       LlamaConfig(**common, attention_bias=True, mlp_bias=True,
                                   rope_theta=500000.0,
                                   rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                                 "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                 "original_max_position_embeddings": 32}),
                       torch.bfloat16, None),
        "tiny_qwen2": (Qwen2ForCausalLM, Qwen2Config(**common, rope_theta=1000000.0,
                                                     tie_word_embeddings=True),
                       torch.float16, None),
        "tiny_qwen3": (Qwen3ForCausalLM, Qwen3Config(**common, head_dim=16, rope_theta=1000000.0),
                       torch.float32, "40KB"),
        "tiny_mistral": (MistralForCausalLM, MistralConfig(**common, sliding_window=64),
                         torch.bfloat16, None),
    }


def main():
    os.makedirs(OUT, exist_ok=True)
    info = {"transformers": transformers.__version__, "torch": torch.__version__}
    with open(os.path.join(OUT, "rope_inv_freq.json"), "w") as f:
        json.dump({"generated_by": info, "tables": rope_tables()}, f, indent=1)
    ids = [1, 5, 9, 33, 60, 2, 17]
    for name, (cls, cfg, dtype, shard) in tiny_models().items():
        torch.manual_seed(0)
        model = cls(cfg).eval()
        # Non-trivial norm weights so tests see distinct values.
        with torch.no_grad():
            for n, p in model.named_parameters():
                if n.endswith("norm.weight"):
                    p.copy_(1.0 + 0.1 * torch.randn_like(p))
                if n.endswith(".bias"):
                    p.copy_(0.05 * torch.randn_like(p))
        model = model.to(dtype)
        d = os.path.join(OUT, name)
        kwargs = {"safe_serialization": True}
        if shard:
            kwargs["max_shard_size"] = shard
        model.save_pretrained(d, **kwargs)
        stats = {}
        from safetensors.torch import load_file
        for fn in sorted(os.listdir(d)):
            if fn.endswith(".safetensors"):
                for tn, t in load_file(os.path.join(d, fn)).items():
                    stats[tn] = {"file": fn, "dtype": str(t.dtype).replace("torch.", ""),
                                 "shape": list(t.shape),
                                 "sum": float(t.to(torch.float64).sum()),
                                 "first": [float(x) for x in t.flatten()[:4].to(torch.float64)]}
        with open(os.path.join(d, "tensors.json"), "w") as f:
            json.dump(stats, f, indent=1, sort_keys=True)
        m32 = cls.from_pretrained(d, torch_dtype=torch.float32).eval()
        with torch.no_grad():
            logits = m32(torch.tensor([ids])).logits[0]
        with open(os.path.join(d, "reference.json"), "w") as f:
            json.dump({"generated_by": info, "input_ids": ids,
                       "note": "float32 forward of the saved weights (upcast)",
                       "logits": [[float(x) for x in row] for row in logits]}, f)
    print("done", info)


if __name__ == "__main__":
    sys.exit(main())
