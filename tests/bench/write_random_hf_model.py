#!/usr/bin/env python3
"""Writes a Llama-3-8B-shaped model with random bf16 weights to OUT_DIR in
the Hugging Face layout (config.json, sharded *.safetensors with their
index, generation_config.json), as transformers' save_pretrained writes it:
what tessera-worker --model loads. The weights are initialised on the GPU
(transformers' own init, normal with std 0.02) and written shard by shard.

A directory that already holds a complete model of these shapes (a marker
file written last) is left as it is, so reruns skip the ~16 GB write.

Usage: write_random_hf_model.py OUT_DIR   (GPU machine: torch, transformers)
"""
import json
import os
import sys
import time

import torch
import transformers

MARKER = "tessera_random_llama3_8b.json"
SHAPES = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
              num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=128256,
              max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0,
              rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
              tie_word_embeddings=False, bos_token_id=128000, eos_token_id=128001)


def main(out):
    marker = os.path.join(out, MARKER)
    if os.path.exists(marker) and json.load(open(marker)).get("shapes") == SHAPES:
        print(f"{out}: already written")
        return 0
    t0 = time.time()
    os.makedirs(out, exist_ok=True)
    cfg = transformers.LlamaConfig(**SHAPES)
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"), torch.no_grad():
        model = transformers.LlamaForCausalLM(cfg)
    model.save_pretrained(out, max_shard_size="5GB")
    params = sum(p.numel() for p in model.parameters())
    with open(marker, "w") as f:
        json.dump({"shapes": SHAPES, "parameters": params, "transformers": transformers.__version__,
                   "seconds": time.time() - t0}, f)
    print(f"{out}: {params} parameters written in {time.time() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: write_random_hf_model.py OUT_DIR")
    sys.exit(main(sys.argv[1]))
