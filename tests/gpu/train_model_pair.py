#!/usr/bin/env python3
"""Trains Tessera's test model pair: a small Qwen3 target and a smaller draft.

Both models share one byte-level BPE tokenizer built the way Qwen2/Qwen3 build
theirs (a Split pre-tokenizer with the Qwen2 regex, then ByteLevel without its
own regex). The corpus is the Python standard library's own sources on the
machine that runs this (PSF License). Everything is seeded; training stops on a
wall-clock budget, an epoch cap or early stopping on a validation split,
whichever comes first.

Outputs (under --out):
  target/, draft/     config.json, model.safetensors (bf16), generation_config.json,
                      tokenizer.json, tokenizer_config.json
  fixtures/           <model>_logits.safetensors, <model>_expected.json,
                      tokenizer_expected.json
  MODEL_CARD.md, training_log.json (and CORPUS_LICENSE.txt when the stdlib has one)

Run `--smoke` first: every stage at toy size in well under a minute.
See tests/gpu/README.md.
"""

import time

T0 = time.time()  # The global time guard counts from here, imports included.

import argparse  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import random  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import sysconfig  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import tokenizers  # noqa: E402
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers  # noqa: E402
import transformers  # noqa: E402
from transformers import Qwen3Config, Qwen3ForCausalLM  # noqa: E402
import safetensors  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

# The pre-tokenizer regex of Qwen2/Qwen2.5/Qwen3's tokenizer.json.
QWEN2_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
EOS_TOKEN = "<|endoftext|>"
SPECIAL_TOKENS = [EOS_TOKEN, "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SIZE_LIMIT_BYTES = 48_000_000  # Whole output folder.

# Everything that differs between the real run and the smoke run.
PROFILES = {
    "full": {
        "corpus_cap_bytes": 60_000_000,
        "max_file_bytes": 400_000,
        "test_frac": 0.025,
        "val_frac": 0.025,
        "vocab_size": 4096,
        "seq_len": 512,
        "batch_size": 64,
        "target": {"hidden_size": 384, "num_hidden_layers": 8, "num_attention_heads": 8,
                   "num_key_value_heads": 4, "head_dim": 64, "intermediate_size": 1024},
        "draft": {"hidden_size": 256, "num_hidden_layers": 3, "num_attention_heads": 4,
                  "num_key_value_heads": 2, "head_dim": 64, "intermediate_size": 640},
        "rope_theta": 1000000.0,
        "max_position_embeddings": 2048,
        "target_lr": 1.5e-3,
        "draft_lr": 2.5e-3,
        "min_lr_ratio": 0.1,
        "weight_decay": 0.1,
        "warmup_steps": 100,
        "measure_from": 5,   # steps before this are warm-up for the timer
        "plan_at": 25,       # step at which the total step count is fixed
        "log_every": 25,
        "evals_per_run": 24,
        "min_eval_every": 25,
        "patience": 5,       # evaluations without a new best before stopping
        # The stdlib gives ~2.3M training tokens: the target starts to overfit after
        # about 7 passes, so the epoch cap (with early stopping) ends training long
        # before the wall-clock budgets do.
        "target_max_epochs": 12.0,
        "draft_max_epochs": 12.0,
        "val_windows": 64,
        "test_windows": 128,
        "eval_batch": 32,
        "prompt_lengths": [20, 60, 130],
        "greedy_tokens": 32,
        "tokenizer_cases": 200,
        "post_reserve_s": 60.0,   # eval + save + fixtures + card after training
        "target_minutes": 5.5,
        "draft_minutes": 2.5,
    },
    "smoke": {
        "corpus_cap_bytes": 2_000_000,
        "max_file_bytes": 100_000,
        "test_frac": 0.04,
        "val_frac": 0.03,
        "vocab_size": 1024,
        "seq_len": 128,
        "batch_size": 8,
        "target": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                   "num_key_value_heads": 1, "head_dim": 32, "intermediate_size": 128},
        "draft": {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                  "num_key_value_heads": 1, "head_dim": 16, "intermediate_size": 64},
        "rope_theta": 1000000.0,
        "max_position_embeddings": 2048,
        "target_lr": 3e-3,
        "draft_lr": 3e-3,
        "min_lr_ratio": 0.1,
        "weight_decay": 0.1,
        "warmup_steps": 5,
        "measure_from": 2,
        "plan_at": 6,
        "log_every": 5,
        "evals_per_run": 4,
        "min_eval_every": 5,
        "patience": 3,
        "target_max_epochs": 8.0,
        "draft_max_epochs": 12.0,
        "val_windows": 4,
        "test_windows": 8,
        "eval_batch": 4,
        "prompt_lengths": [20, 60, 130],
        "greedy_tokens": 32,
        "tokenizer_cases": 40,
        "post_reserve_s": 8.0,
        "target_minutes": 0.05,
        "draft_minutes": 0.04,
    },
}


def log(msg):
    print(f"[{time.time() - T0:7.1f}s] {msg}", flush=True)


def fail(msg):
    print(f"[{time.time() - T0:7.1f}s] ERROR: {msg}", flush=True)
    sys.exit(2)


class Stage:
    """Prints a stage's start and its elapsed time; records it in `times`."""

    def __init__(self, name, times):
        self.name = name
        self.times = times

    def __enter__(self):
        self.start = time.time()
        log(f"=== {self.name}")
        return self

    def __exit__(self, exc_type, exc, tb):
        dt = time.time() - self.start
        self.times[self.name] = round(dt, 2)
        if exc_type is None:
            log(f"=== {self.name}: done in {dt:.1f}s")
        return False


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--smoke", action="store_true", help="every stage at toy size")
    p.add_argument("--target_minutes", type=float, default=None,
                   help="wall-clock budget for the target's training (default 5.5)")
    p.add_argument("--draft_minutes", type=float, default=None,
                   help="wall-clock budget for the draft's training (default 2.5)")
    p.add_argument("--max_total_minutes", type=float, default=None,
                   help="the whole run ends before this (default 9.5; smoke 1.0)")
    p.add_argument("--target_epochs", type=float, default=None,
                   help="cap on passes over the train split for the target (default 12)")
    p.add_argument("--draft_epochs", type=float, default=None,
                   help="cap on passes over the train split for the draft (default 12)")
    p.add_argument("--seed", type=int, default=1234)
    return p.parse_args()


def write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")


def folder_bytes(path):
    total = 0
    for dirpath, _, filenames in os.walk(path):
        for fn in filenames:
            total += os.path.getsize(os.path.join(dirpath, fn))
    return total


# ---------------------------------------------------------------- corpus


def collect_corpus(P):
    root = sysconfig.get_paths()["stdlib"]
    if not root or not os.path.isdir(root):
        fail(f"standard library folder not found: {root!r}")
    skip_dirs = {"site-packages", "dist-packages", "__pycache__"}
    paths = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in skip_dirs)
        for fn in filenames:
            if fn.endswith(".py"):
                full = os.path.join(dirpath, fn)
                rel = os.path.relpath(full, root).replace(os.sep, "/")
                paths.append((rel, full))
    paths.sort()
    stats = {"py_files_found": len(paths), "skipped_too_large": 0, "skipped_not_utf8": 0,
             "skipped_empty": 0, "skipped_codec_tables": 0, "skipped_over_cap": 0}
    docs = []
    total = 0
    for rel, full in paths:
        try:
            if not os.path.isfile(full):
                continue
            size = os.path.getsize(full)
            if size > P["max_file_bytes"]:
                stats["skipped_too_large"] += 1
                continue
            with open(full, "rb") as f:
                raw = f.read()
        except OSError:
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            stats["skipped_not_utf8"] += 1
            continue
        if not text.strip():
            stats["skipped_empty"] += 1
            continue
        if "gencodec.py" in text[:400]:
            # encodings/cp*.py, iso8859_*.py, mac_*.py...: near-identical generated
            # tables that a small model memorizes and that skew held-out losses.
            stats["skipped_codec_tables"] += 1
            continue
        if total + len(raw) > P["corpus_cap_bytes"]:
            stats["skipped_over_cap"] += 1
            continue
        docs.append((rel, text))
        total += len(raw)
    if len(docs) < 10:
        fail(f"too few usable .py files under {root} ({len(docs)})")
    stats["files_used"] = len(docs)
    stats["bytes_used"] = total
    return root, docs, stats


def split_docs(docs, P):
    """Split by file: files in sha256(path) order fill test, then val, rest train."""
    total = sum(len(t) for _, t in docs)
    keyed = sorted(docs, key=lambda d: hashlib.sha256(d[0].encode("utf-8")).hexdigest())
    test, val, train = [], [], []
    test_chars = val_chars = 0
    for rel, text in keyed:
        if test_chars < P["test_frac"] * total:
            test.append((rel, text))
            test_chars += len(text)
        elif val_chars < P["val_frac"] * total:
            val.append((rel, text))
            val_chars += len(text)
        else:
            train.append((rel, text))
    if not train or not val or not test:
        fail("corpus split left an empty part")
    return sorted(train), sorted(val), sorted(test)


# ---------------------------------------------------------------- tokenizer


def train_tokenizer(train_texts, vocab_size):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(train_texts, trainer=trainer, length=len(train_texts))
    tok.add_special_tokens(list(SPECIAL_TOKENS))  # no-op if the trainer already did
    return tok


def match_qwen2_flags(path):
    """Set the offset-only ByteLevel flags to the values in Qwen2's tokenizer.json.

    They change offsets, never ids; this only makes the file read like Qwen2's.
    """
    with open(path, encoding="utf-8") as f:
        d = json.load(f)
    for step in (d.get("pre_tokenizer") or {}).get("pretokenizers") or []:
        if step.get("type") == "ByteLevel":
            step["trim_offsets"] = False
    pp = d.get("post_processor")
    if isinstance(pp, dict) and pp.get("type") == "ByteLevel":
        pp.update({"add_prefix_space": False, "trim_offsets": False, "use_regex": False})
    write_json(path, d)


def tokenizer_config_json(tok, max_len):
    added = {}
    for s in SPECIAL_TOKENS:
        added[str(tok.token_to_id(s))] = {
            "content": s, "lstrip": False, "normalized": False, "rstrip": False,
            "single_word": False, "special": True,
        }
    return {
        "add_bos_token": False,
        "add_eos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "bos_token": None,
        "eos_token": EOS_TOKEN,
        "pad_token": EOS_TOKEN,
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_len,
        "split_special_tokens": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": CHAT_TEMPLATE,
    }


def check_tokenizer(tok, texts, eos_id):
    ids = tok.encode(EOS_TOKEN).ids
    if ids != [eos_id]:
        fail(f"{EOS_TOKEN!r} encodes to {ids}, expected [{eos_id}]")
    for text in texts:
        got = tok.decode(tok.encode(text).ids, skip_special_tokens=False)
        if got != text:
            fail("tokenizer round trip changed a text (first 80 chars: %r)" % text[:80])


def tokenize_stream(tok, texts, eos_id):
    """All documents as one int64 array, each followed by <|endoftext|>."""
    encode = getattr(tok, "encode_batch_fast", None) or tok.encode_batch  # same ids, no offsets
    flat = []
    for i in range(0, len(texts), 256):
        for enc in encode(texts[i:i + 256]):
            flat.extend(enc.ids)
            flat.append(eos_id)
    return np.asarray(flat, dtype=np.int64)


EDGE_CASES = [
    "", " ", "  ", "\n", "\n\n", "\r\n", "\t", "   \n   \n", "trailing spaces   ",
    "    return x\n", "def f(a, b):\n    return a+b\n", "don't I'LL we've THEY'RE",
    "x = 12345678 + 3.14159", "héllo wörld", "e\u0301 (combining accent)", "\u00a0non-breaking space",
    "日本語のテキスト", "emoji 🎉🐍 done", "Ελληνικά και русский", EOS_TOKEN,
    "a<|im_start|>b<|im_end|>c", "<|im_start|>user\nhello<|im_end|>\n",
]


def tokenizer_cases(tok, test_docs, other_docs, n, rng):
    texts = list(EDGE_CASES)
    # Lines with non-ASCII characters (docstrings, comments), held-out files first.
    unicode_lines = []
    for docs in (test_docs, other_docs):
        seen = set()
        for _, text in docs:
            for line in text.splitlines(keepends=True):
                if any(ord(c) > 127 for c in line) and line not in seen and len(line) < 400:
                    seen.add(line)
                    unicode_lines.append(line)
        if len(unicode_lines) >= 25:
            break
    want_unicode = min(25, len(unicode_lines))
    for i in range(want_unicode):
        texts.append(unicode_lines[(i * len(unicode_lines)) // want_unicode])
    lengths = [1, 2, 3, 5, 8, 13, 21, 40, 80, 160, 320, 640, 1280, 2500]
    pool = [t for _, t in test_docs if t]
    i = 0
    while len(texts) < n:
        length = lengths[i % len(lengths)]
        i += 1
        doc = pool[rng.randrange(len(pool))]
        start = rng.randrange(max(1, len(doc) - length))
        texts.append(doc[start:start + length])
    return [{"text": t, "ids": tok.encode(t).ids} for t in texts[:n]]


def pick_prompts(tok, test_docs, lengths):
    """Whole lines from held-out files until the prompt has about `length` tokens.

    The ids are the encoding of the text itself, so text and ids agree.
    """
    candidates = [t for _, t in test_docs if len(t) > 3000] or [t for _, t in test_docs]
    prompts = []
    for k, want in enumerate(lengths):
        doc = candidates[(k * len(candidates)) // len(lengths)]  # different files (given 3+)
        lines = doc.splitlines(keepends=True)
        start = 0
        for j, line in enumerate(lines):  # start at a definition when there is one
            if line.startswith(("def ", "class ")) and j >= k:
                start = j
                break
        text = ""
        ids = []
        for line in lines[start:]:
            prev_text, prev_ids = text, ids
            text += line
            ids = tok.encode(text).ids
            if len(ids) >= want:
                if prev_ids and want - len(prev_ids) < len(ids) - want:
                    text, ids = prev_text, prev_ids  # the shorter one is closer
                break
        if len(ids) > want * 1.5 + 8:  # one very long line: cut it on a token boundary
            ids = ids[:want]
            text = tok.decode(ids, skip_special_tokens=False)
            ids = tok.encode(text).ids
        if not ids:
            fail("could not build a fixture prompt")
        prompts.append({"text": text, "ids": ids})
    return prompts


# ---------------------------------------------------------------- models


def param_count(arch, vocab, tied=True):
    h, L = arch["hidden_size"], arch["num_hidden_layers"]
    nh, nkv, hd, inter = (arch["num_attention_heads"], arch["num_key_value_heads"],
                          arch["head_dim"], arch["intermediate_size"])
    per_layer = (h * nh * hd + 2 * h * nkv * hd + nh * hd * h  # q, k, v, o
                 + 2 * hd                                      # q_norm, k_norm
                 + 3 * h * inter                               # gate, up, down
                 + 2 * h)                                      # two RMSNorms
    return vocab * h * (1 if tied else 2) + L * per_layer + h


def make_config(arch, vocab, eos_id, P, attn):
    cfg = Qwen3Config(
        vocab_size=int(vocab),
        hidden_size=int(arch["hidden_size"]),
        intermediate_size=int(arch["intermediate_size"]),
        num_hidden_layers=int(arch["num_hidden_layers"]),
        num_attention_heads=int(arch["num_attention_heads"]),
        num_key_value_heads=int(arch["num_key_value_heads"]),
        head_dim=int(arch["head_dim"]),
        hidden_act="silu",
        max_position_embeddings=int(P["max_position_embeddings"]),
        initializer_range=0.02,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        rope_theta=float(P["rope_theta"]),
        attention_bias=False,
        use_sliding_window=False,
        attention_dropout=0.0,
        bos_token_id=None,
        eos_token_id=int(eos_id),
        pad_token_id=int(eos_id),
        attn_implementation=attn,
    )
    # transformers 5 keeps theta in rope_parameters, 4.x in rope_theta; make sure it took.
    rp = getattr(cfg, "rope_parameters", None)
    if isinstance(rp, dict):
        if float(rp.get("rope_theta", -1.0)) != float(P["rope_theta"]):
            rp["rope_theta"] = float(P["rope_theta"])
            rp.setdefault("rope_type", "default")
    elif float(getattr(cfg, "rope_theta", -1.0)) != float(P["rope_theta"]):
        cfg.rope_theta = float(P["rope_theta"])
    if not cfg.tie_word_embeddings:
        fail("config did not keep tie_word_embeddings=True")
    return cfg


def unique_params(model):
    seen = set()
    n = 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            n += p.numel()
    return n


def make_windows(stream, seq_len, max_windows, device):
    """Non-overlapping windows of seq_len+1 tokens spread evenly over a stream."""
    n = min(max_windows, (len(stream) - 1) // seq_len)
    if n < 1:
        fail(f"held-out stream too short for one window ({len(stream)} tokens)")
    last = len(stream) - seq_len - 1
    starts = [(i * last) // max(1, n - 1) for i in range(n)] if n > 1 else [0]
    rows = [stream[s: s + seq_len + 1] for s in starts]
    return torch.from_numpy(np.stack(rows)).to(device)


def autocast(device):
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


@torch.no_grad()
def eval_loss(model, windows, batch, device):
    was_training = model.training
    model.eval()
    total = 0.0
    count = 0
    for i in range(0, windows.shape[0], batch):
        w = windows[i:i + batch]
        with autocast(device):
            logits = model(input_ids=w[:, :-1], use_cache=False).logits
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                               w[:, 1:].reshape(-1), reduction="sum")
        total += float(loss.item())
        count += w[:, 1:].numel()
    if was_training:
        model.train()
    return total / count


@torch.no_grad()
def greedy_agreement(a, b, windows, batch, device):
    a.eval()
    b.eval()
    same = 0
    count = 0
    for i in range(0, windows.shape[0], batch):
        x = windows[i:i + batch, :-1]
        with autocast(device):
            pa = a(input_ids=x, use_cache=False).logits.argmax(-1)
            pb = b(input_ids=x, use_cache=False).logits.argmax(-1)
        same += int((pa == pb).sum().item())
        count += pa.numel()
    return same / count


def stage_budget(name, wanted_s, available_s):
    """The wanted budget, cut to what the global guard leaves (but never below 5 s)."""
    if available_s >= wanted_s:
        return wanted_s
    budget = max(available_s, min(5.0, wanted_s))
    log(f"WARNING: the time guard cuts {name}'s training from {wanted_s:.0f}s to {budget:.0f}s")
    return budget


def make_optimizer(model, lr, weight_decay):
    decay, no_decay = [], []
    for _, p in model.named_parameters():
        if p.requires_grad:
            (decay if p.dim() >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    kwargs = {"lr": lr, "betas": (0.9, 0.95), "eps": 1e-8}
    if next(model.parameters()).is_cuda:
        try:
            return torch.optim.AdamW(groups, fused=True, **kwargs), "AdamW (fused)"
        except (TypeError, RuntimeError, ValueError):
            pass
    return torch.optim.AdamW(groups, **kwargs), "AdamW"


def train_model(name, arch, stream, val_windows, vocab, eos_id, P, lr, max_epochs,
                budget_s, seed, device, attn):
    torch.manual_seed(seed)
    cfg = make_config(arch, vocab, eos_id, P, attn)
    model = Qwen3ForCausalLM(cfg).to(device)
    model.train()
    n_params = unique_params(model)
    expected = param_count(arch, vocab)
    log(f"{name}: {n_params:,} parameters (formula {expected:,}), "
        f"attention {getattr(model.config, '_attn_implementation', '?')}")
    if n_params != expected:
        log(f"WARNING: {name} parameter count differs from the formula")
    opt, opt_name = make_optimizer(model, lr, P["weight_decay"])

    B, T = P["batch_size"], P["seq_len"]
    data = torch.from_numpy(stream).to(device)
    max_start = data.numel() - (T + 1)
    if max_start < 1:
        fail(f"training stream too short ({data.numel()} tokens)")
    offsets = torch.arange(T + 1, device=device)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed + 1000)
    warmup = P["warmup_steps"]
    min_lr = lr * P["min_lr_ratio"]
    epoch_cap_steps = max(1, math.ceil(max_epochs * len(stream) / (B * T)))

    def lr_at(step, planned):
        if step < warmup:
            return lr * (step + 1) / warmup
        if planned is None or planned <= warmup:
            return lr
        progress = min(1.0, (step - warmup) / max(1, planned - warmup))
        return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * progress))

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    history = []
    evals = []
    best = {"loss": float("inf"), "step": 0, "state": None}
    bad_evals = 0
    planned = None
    eval_every = None
    sec_per_step = None
    stop_reason = "planned steps done"
    step = 0
    loss_sum = torch.zeros((), device=device)
    loss_n = 0
    sync()
    t_start = time.time()
    stop_at = t_start + budget_s
    t_measure = None

    def do_eval(step):
        nonlocal bad_evals
        v = eval_loss(model, val_windows, P["eval_batch"], device)
        evals.append({"step": step, "tokens": step * B * T,
                      "elapsed_s": round(time.time() - t_start, 2), "val_loss": round(v, 5)})
        if v < best["loss"] - 1e-4:
            best["loss"] = v
            best["step"] = step
            best["state"] = {k: t.detach().clone() for k, t in model.state_dict().items()}
            bad_evals = 0
        else:
            bad_evals += 1
        log(f"{name}: step {step} val_loss {v:.4f} (best {best['loss']:.4f} at {best['step']})")

    while True:
        if planned is not None and step >= planned:
            break
        if time.time() >= stop_at:
            stop_reason = "time budget"
            break
        cur_lr = lr_at(step, planned)
        for g in opt.param_groups:
            g["lr"] = cur_lr
        starts = torch.randint(0, max_start + 1, (B,), generator=gen, device=device)
        batch = data[starts[:, None] + offsets]
        with autocast(device):
            logits = model(input_ids=batch[:, :-1], use_cache=False).logits
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                               batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        loss_sum += loss.detach()
        loss_n += 1

        if step == P["measure_from"]:
            sync()
            t_measure = time.time()
        if step == P["plan_at"] and t_measure is not None:
            sync()
            now = time.time()
            sec_per_step = (now - t_measure) / (P["plan_at"] - P["measure_from"])
            time_steps = step + int(0.93 * max(0.0, stop_at - now) / max(sec_per_step, 1e-6))
            planned = max(step + 1, min(time_steps, epoch_cap_steps))
            eval_every = max(P["min_eval_every"], planned // P["evals_per_run"])
            log(f"{name}: {sec_per_step * 1000:.1f} ms/step, {B * T / sec_per_step:,.0f} tokens/s; "
                f"planned {planned} steps (time allows {time_steps}, epoch cap {epoch_cap_steps}), "
                f"eval every {eval_every}")
        if step % P["log_every"] == 0:
            mean = float((loss_sum / max(1, loss_n)).item())
            history.append({"step": step, "tokens": step * B * T,
                            "elapsed_s": round(time.time() - t_start, 2),
                            "lr": round(cur_lr, 7), "train_loss": round(mean, 5)})
            log(f"{name}: step {step} loss {mean:.4f} lr {cur_lr:.2e}")
            if not math.isfinite(mean):
                fail(f"{name}: training loss is not finite at step {step}")
            loss_sum.zero_()
            loss_n = 0
        if eval_every is not None and step % eval_every == 0:
            do_eval(step)
            if bad_evals >= P["patience"]:
                stop_reason = f"early stop: no new best validation loss in {P['patience']} evaluations"
                break

    sync()
    train_time = time.time() - t_start
    if not evals or evals[-1]["step"] != step:
        do_eval(step)
    final_val = evals[-1]["val_loss"]
    if best["state"] is not None and best["step"] != step:
        model.load_state_dict(best["state"])
        log(f"{name}: restored the weights of step {best['step']} (val {best['loss']:.4f}, "
            f"last {final_val:.4f})")
    best["state"] = None
    model.eval()
    info = {
        "parameters": n_params,
        "optimizer": opt_name,
        "peak_lr": lr,
        "min_lr": min_lr,
        "warmup_steps": warmup,
        "weight_decay": P["weight_decay"],
        "grad_clip": 1.0,
        "batch_size": B,
        "seq_len": T,
        "tokens_per_step": B * T,
        "budget_s": round(budget_s, 1),
        "planned_steps": planned,
        "epoch_cap": max_epochs,
        "steps": step,
        "tokens_seen": step * B * T,
        "epochs_seen": round(step * B * T / len(stream), 3),
        "train_time_s": round(train_time, 1),
        "ms_per_step": round(sec_per_step * 1000, 2) if sec_per_step else None,
        "stop_reason": stop_reason,
        "selected_step": best["step"] if best["step"] else step,
        "selected_val_loss": round(min(best["loss"], final_val), 5),
        "last_val_loss": final_val,
        "seed": seed,
        "data_seed": seed + 1000,
        "loss_curve": history,
        "val_curve": evals,
    }
    return model, info


def save_model(model, out_dir, tok_dir, eos_id):
    os.makedirs(out_dir, exist_ok=True)
    model = model.to("cpu").to(torch.bfloat16)
    model.save_pretrained(out_dir)
    st = os.path.join(out_dir, "model.safetensors")
    if not os.path.isfile(st):
        fail(f"save_pretrained wrote no model.safetensors in {out_dir}: {sorted(os.listdir(out_dir))}")
    for extra in sorted(os.listdir(out_dir)):
        if extra.endswith(".bin") or extra.endswith(".index.json"):
            fail(f"unexpected file from save_pretrained: {extra}")
    # config.json: make sure the dtype is recorded.
    cfg_path = os.path.join(out_dir, "config.json")
    with open(cfg_path, encoding="utf-8") as f:
        cfg = json.load(f)
    if cfg.get("dtype") != "bfloat16" and cfg.get("torch_dtype") != "bfloat16":
        cfg["torch_dtype"] = "bfloat16"
        write_json(cfg_path, cfg)
    if cfg.get("tie_word_embeddings") is not True:
        fail(f"{cfg_path}: tie_word_embeddings is not true")
    write_json(os.path.join(out_dir, "generation_config.json"), {
        "bos_token_id": None,
        "eos_token_id": eos_id,
        "pad_token_id": eos_id,
        "do_sample": False,
        "transformers_version": transformers.__version__,
    })
    for fn in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(os.path.join(tok_dir, fn), os.path.join(out_dir, fn))
    tensors = {}
    with safe_open(st, framework="pt") as f:
        for k in f.keys():
            t = f.get_slice(k)
            tensors[k] = (t.get_dtype(), t.get_shape())
    if "lm_head.weight" in tensors:  # tied to model.embed_tokens.weight: keep one copy
        with safe_open(st, framework="pt") as f:
            kept = {k: f.get_tensor(k) for k in f.keys() if k != "lm_head.weight"}
        save_file(kept, st, metadata={"format": "pt"})
        del tensors["lm_head.weight"]
        log(f"{st}: dropped lm_head.weight (tied to the embeddings)")
    bad = [k for k, (dt, _) in tensors.items() if dt not in ("BF16", "bf16")]
    if bad:
        fail(f"{st}: tensors not in bf16: {bad[:5]}")
    log(f"saved {out_dir}: {len(tensors)} tensors, {os.path.getsize(st):,} bytes")
    return cfg, len(tensors)


# ---------------------------------------------------------------- fixtures


@torch.no_grad()
def make_model_fixtures(name, model_dir, prompts, n_new, fix_dir, check_window, gpu_loss):
    model = Qwen3ForCausalLM.from_pretrained(model_dir, attn_implementation="eager")
    model = model.float().eval()
    attn = getattr(model.config, "_attn_implementation", "?")
    if attn != "eager":
        log(f"WARNING: {name} fixture model runs {attn} attention, not eager")
    # Reload sanity check: the fresh float32 model scores one held-out window
    # about as well as the trained model did on the GPU.
    w = check_window.unsqueeze(0)
    logits = model(input_ids=w[:, :-1], use_cache=False).logits
    cpu_loss = float(F.cross_entropy(logits[0].float(), w[0, 1:]).item())
    log(f"{name}: reloaded float32 loss on window 0: {cpu_loss:.4f} (GPU bf16: {gpu_loss:.4f})")
    if not abs(cpu_loss - gpu_loss) < 0.15:
        fail(f"{name}: the reloaded checkpoint does not match the trained model")

    tensors = {}
    cases = []
    for i, p in enumerate(prompts):
        ids = torch.tensor([p["ids"]], dtype=torch.long)
        lg = model(input_ids=ids, use_cache=False).logits[0].float().contiguous()
        tensors[f"logits_{i}"] = lg
        seq = list(p["ids"])
        new_ids = []
        margins = []
        for _ in range(n_new):
            last = model(input_ids=torch.tensor([seq], dtype=torch.long),
                         use_cache=False).logits[0, -1].float()
            top2 = torch.topk(last, 2).values
            nxt = int(torch.argmax(last).item())
            margins.append(round(float(top2[0] - top2[1]), 5))
            new_ids.append(nxt)
            seq.append(nxt)
        cases.append({
            "logits_tensor": f"logits_{i}",
            "prompt_text": p["text"],
            "prompt_ids": p["ids"],
            "prompt_len": len(p["ids"]),
            "greedy_ids": new_ids,
            "greedy_text": None,  # filled by the caller (needs the tokenizer)
            "greedy_top2_margins": margins,
        })
        log(f"{name}: prompt {i}: {len(p['ids'])} tokens, min top-2 margin {min(margins):.4f}")
    save_file(tensors, os.path.join(fix_dir, f"{name}_logits.safetensors"),
              metadata={"model": name, "dtype": "float32",
                        "shapes": ";".join(f"{k}={list(v.shape)}" for k, v in tensors.items())})
    del model
    return cases, cpu_loss


def check_transformers_tokenizer(model_dir, cases):
    """Informational: does AutoTokenizer load the folder and agree with `tokenizers`?"""
    try:
        from transformers import AutoTokenizer
        t = AutoTokenizer.from_pretrained(model_dir)
        bad = 0
        for c in cases:
            if list(t.encode(c["text"], add_special_tokens=False)) != c["ids"]:
                bad += 1
        return {"loaded": True, "class": type(t).__name__, "mismatches": bad, "checked": len(cases)}
    except Exception as e:  # noqa: BLE001 - report, never fail the run on this
        return {"loaded": False, "error": f"{type(e).__name__}: {e}"[:300]}


# ---------------------------------------------------------------- model card


def psf_notice(license_path):
    """The exact PSF copyright notice from the stdlib's license file, if there is one."""
    default = "Copyright (c) 2001 Python Software Foundation; All Rights Reserved"
    if not license_path or not os.path.isfile(license_path):
        return default
    with open(license_path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    m = re.search(r"Copyright\s+\(c\)\s+[0-9][0-9,\s-]*Python\s+Software\s+Foundation;"
                  r"\s+All\s+Rights\s+Reserved", text)
    return " ".join(m.group(0).split()) if m else default


def arch_rows(cfg_t, cfg_d, info_t, info_d):
    keys = ["hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "head_dim", "intermediate_size", "vocab_size", "max_position_embeddings",
            "tie_word_embeddings", "rms_norm_eps", "hidden_act"]
    rows = ["| | target | draft |", "| --- | --- | --- |"]
    for k in keys:
        rows.append(f"| {k} | {cfg_t.get(k)} | {cfg_d.get(k)} |")
    theta_t = cfg_t.get("rope_theta") or (cfg_t.get("rope_parameters") or {}).get("rope_theta")
    theta_d = cfg_d.get("rope_theta") or (cfg_d.get("rope_parameters") or {}).get("rope_theta")
    rows.append(f"| rope_theta | {theta_t} | {theta_d} |")
    rows.append(f"| parameters (tied embeddings counted once) | {info_t['parameters']:,} | "
                f"{info_d['parameters']:,} |")
    return "\n".join(rows)


def write_model_card(path, R):
    c, t, d, e = R["corpus"], R["target"], R["draft"], R["eval"]
    tk = R["tokenizer"]

    def train_rows():
        keys = [("steps", "steps"), ("planned_steps", "planned steps"),
                ("tokens_seen", "tokens seen"), ("epochs_seen", "epochs over the train split"),
                ("train_time_s", "training time (s)"), ("ms_per_step", "ms per step"),
                ("batch_size", "batch (sequences)"), ("seq_len", "sequence length"),
                ("peak_lr", "peak learning rate"), ("min_lr", "final learning rate"),
                ("warmup_steps", "warm-up steps"), ("weight_decay", "weight decay"),
                ("optimizer", "optimizer"), ("epoch_cap", "epoch cap"),
                ("stop_reason", "stopped by"), ("selected_step", "weights kept from step"),
                ("seed", "init seed"), ("data_seed", "batch-sampling seed")]
        def fmt(v):
            if isinstance(v, bool) or v is None or isinstance(v, str):
                return str(v)
            if isinstance(v, int):
                return f"{v:,}"
            return f"{v:g}"

        rows = ["| | target | draft |", "| --- | --- | --- |"]
        for k, label in keys:
            rows.append(f"| {label} | {fmt(t['training'].get(k))} | {fmt(d['training'].get(k))} |")
        return "\n".join(rows)

    text = f"""# Tessera test model pair: Qwen3 target and draft trained on the Python standard library

Generated by `tests/gpu/train_model_pair.py`{" in **smoke** mode (toy sizes; not for use)" if R["smoke"] else ""}.
Two small causal language models in Hugging Face format (`Qwen3ForCausalLM`, bf16
safetensors) that share one tokenizer, made for Tessera's parity tests and for
speculative decoding (the draft proposes, the target verifies). They are tiny and
trained briefly: they write plausible-looking Python, not correct Python.

Command: `{R["command"]}`

## Corpus

- What: the `.py` sources of the Python {c["python_version"]} standard library found at
  `{c["stdlib_path"]}` on the training machine ({c["files_used"]} files, {c["bytes_used"]:,} bytes;
  files over {c["max_file_bytes"]:,} bytes or not UTF-8 skipped; `site-packages` excluded; the
  {c["skipped_codec_tables"]} character-map tables generated by `gencodec.py` (`encodings/cp*.py` and the like)
  excluded as near-duplicates; cap {c["cap_bytes"]:,} bytes). Paths are read in sorted order.
- Split by file: files ordered by sha256 of their relative path fill the test split
  (~{c["test_frac"] * 100:.1f}% of characters), then validation (~{c["val_frac"] * 100:.1f}%),
  the rest is train.

| split | files | characters | tokens (with one `<|endoftext|>` per file) |
| --- | --- | --- | --- |
| train | {c["train_files"]} | {c["train_chars"]:,} | {c["train_tokens"]:,} |
| validation (early stopping, weight selection) | {c["val_files"]} | {c["val_chars"]:,} | {c["val_tokens"]:,} |
| test (reported loss, fixtures) | {c["test_files"]} | {c["test_chars"]:,} | {c["test_tokens"]:,} |

- Documents are joined into one token stream, each followed by `<|endoftext|>`; training
  samples random windows of the train stream.
- License: the Python standard library is "{c["psf_notice"]}", and is distributed under
  the PSF License Agreement Version 2
  (https://docs.python.org/3/license.html), which allows derived works to be used and
  distributed provided the PSF copyright notice and license are kept with them.
  {"`CORPUS_LICENSE.txt` next to this card is the license file from that installation. " if c["license_copied"] else ""}Summary of
  changes: the sources were tokenized and used to fit these models' weights; the
  fixtures hold short verbatim excerpts of held-out files.

## Tokenizer

Byte-level BPE trained with the Hugging Face `tokenizers` library {tk["tokenizers_version"]} on the train
split, built like Qwen2/Qwen3's: no normalizer; pre-tokenizer `Sequence[Split(Qwen2 regex,
isolated), ByteLevel(add_prefix_space=false, use_regex=false)]`; `ByteLevel` decoder and
post-processor; BPE model without `unk_token` or byte fallback; the 256 byte symbols as initial
alphabet, so every byte sequence is representable.

- Vocabulary: {tk["vocab_size"]} tokens, special tokens (also in `added_tokens`):
  {", ".join(f"`{k}` = {v}" for k, v in tk["special_ids"].items())}.
- `<|endoftext|>` is the end-of-document token and the EOS; there is no BOS (`add_bos_token` false).
- Test split: {tk["test_bytes_per_token"]:.3f} bytes per token.
- `tokenizer_config.json` also carries a ChatML chat template (`<|im_start|>`, `<|im_end|>`); the
  models were never trained on chat data.

## Architectures

Both are `Qwen3ForCausalLM` (RMSNorm, SwiGLU MLP, RoPE, grouped-query attention with
per-head q/k RMSNorm, no biases, tied input/output embeddings).

{arch_rows(R["target"]["config"], R["draft"]["config"], t["training"], d["training"])}

## Training

AdamW (betas 0.9/0.95, decay on matrices only), linear warm-up then cosine decay to 10% of
the peak, gradient clipping at 1.0, bf16 autocast with float32 master weights, PyTorch SDPA
attention, TF32 allowed. The step count is fixed after the first steps from the measured speed:
whichever is smaller of the wall-clock budget and the epoch cap. Validation loss is measured
{R["profile"]["evals_per_run"]} times per run; training stops early after
{R["profile"]["patience"]} evaluations without a new best, and the weights with the best
validation loss are the ones saved. GPU kernels are not bitwise deterministic and the step count
depends on the measured speed, so a rerun gives close, not identical, weights.

{train_rows()}

Seeds: `--seed {R["seed"]}` (Python, NumPy and torch seeded with it; target init seed {t["training"]["seed"]},
draft init seed {d["training"]["seed"]}, batch sampling as listed).

## Held-out results

Loss in nats per token on {e["test_windows"]} windows of {e["window_tokens"]} predicted tokens spread evenly over the test split
(bf16 weights as saved, bf16 autocast on the GPU).

| | loss (nats/token) | perplexity |
| --- | --- | --- |
| target | {e["target_test_loss"]:.4f} | {math.exp(e["target_test_loss"]):.2f} |
| draft | {e["draft_test_loss"]:.4f} | {math.exp(e["draft_test_loss"]):.2f} |
| unigram (train-split token frequencies, add-one) | {e["unigram_test_loss"]:.4f} | {math.exp(e["unigram_test_loss"]):.2f} |
| uniform guess, ln({tk["vocab_size"]}) | {e["uniform_loss"]:.4f} | {tk["vocab_size"]} |

Greedy agreement (draft's top-1 equals target's top-1) on the same positions: {e["greedy_agreement"] * 100:.1f}%.

## Files

- `target/`, `draft/`: `config.json`, `model.safetensors` (bf16), `generation_config.json`,
  `tokenizer.json`, `tokenizer_config.json` (the same tokenizer in both).
- `fixtures/<model>_logits.safetensors`: float32 logits `[prompt_len, vocab]` of each fixture prompt,
  tensors `logits_0`, `logits_1`, `logits_2`.
- `fixtures/<model>_expected.json`: the prompts (text and ids; the ids are the tokenizer's
  encoding of the text), the {R["profile"]["greedy_tokens"]}-token greedy continuations (EOS does not stop them) and the
  top-1/top-2 logit margin at each greedy step (a small margin means a near tie).
  Computed by transformers {R["versions"]["transformers"]} on the CPU from the saved bf16 weights upcast to float32,
  eager attention, no KV cache (each step recomputes the whole sequence).
- `fixtures/tokenizer_expected.json`: `[{{"text", "ids"}}]` for {tk["cases"]} texts (edge cases,
  lines with non-ASCII characters, random held-out snippets of 1 to 2500 characters), encoded by
  `tokenizers` {tk["tokenizers_version"]}.
- `training_log.json`: loss curves, validation curves, timings, everything in this card.

## Environment

Python {R["versions"]["python"]}, torch {R["versions"]["torch"]}, transformers {R["versions"]["transformers"]},
tokenizers {R["versions"]["tokenizers"]}, safetensors {R["versions"]["safetensors"]}, numpy {R["versions"]["numpy"]};
device: {R["versions"]["device"]}. Total run time {R["total_time_s"]:.0f} s; stage times in `training_log.json`.
"""
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


# ---------------------------------------------------------------- main


def main():
    args = parse_args()
    P = dict(PROFILES["smoke" if args.smoke else "full"])
    if args.target_epochs is not None:
        P["target_max_epochs"] = args.target_epochs
    if args.draft_epochs is not None:
        P["draft_max_epochs"] = args.draft_epochs
    target_minutes = args.target_minutes if args.target_minutes is not None else P["target_minutes"]
    draft_minutes = args.draft_minutes if args.draft_minutes is not None else P["draft_minutes"]
    max_total = args.max_total_minutes if args.max_total_minutes is not None else (
        1.0 if args.smoke else 9.5)
    deadline = T0 + max_total * 60.0
    times = {}
    out = os.path.abspath(args.out)
    command = "python3 " + " ".join([os.path.relpath(sys.argv[0]) if not os.path.isabs(sys.argv[0])
                                     else sys.argv[0]] + sys.argv[1:])
    log(f"{command}")
    log(f"mode {'smoke' if args.smoke else 'full'}; budgets: target {target_minutes} min, "
        f"draft {draft_minutes} min, whole run {max_total} min")

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    if torch.cuda.is_available():
        device = torch.device("cuda")
        torch.cuda.manual_seed_all(args.seed)
        torch.set_float32_matmul_precision("high")  # TF32 for any float32 matmul
        dev_name = torch.cuda.get_device_name(0)
    elif args.smoke:
        device = torch.device("cpu")
        dev_name = "cpu"
        log("WARNING: no CUDA device; smoke mode runs on the CPU")
    else:
        fail("no CUDA device (use --smoke to try the stages on the CPU)")
    versions = {
        "python": platform.python_version(), "torch": torch.__version__,
        "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
        "safetensors": getattr(safetensors, "__version__", "?"), "numpy": np.__version__,
        "device": dev_name,
    }
    log(f"versions: {versions}")

    os.makedirs(out, exist_ok=True)
    for sub in ("target", "draft", "fixtures", "tokenizer"):
        shutil.rmtree(os.path.join(out, sub), ignore_errors=True)
    for fn in ("MODEL_CARD.md", "training_log.json", "CORPUS_LICENSE.txt"):
        if os.path.exists(os.path.join(out, fn)):
            os.remove(os.path.join(out, fn))
    fix_dir = os.path.join(out, "fixtures")
    os.makedirs(fix_dir)
    tok_dir = os.path.join(out, "tokenizer")  # scratch; copied into each model folder, then removed
    os.makedirs(tok_dir)

    # 1. Corpus.
    with Stage("corpus", times):
        stdlib, docs, cstats = collect_corpus(P)
        train_docs, val_docs, test_docs = split_docs(docs, P)
        log(f"stdlib {stdlib}: {cstats}")
        log(f"split: train {len(train_docs)} files, val {len(val_docs)}, test {len(test_docs)}")
        license_copied = False
        for cand in ("LICENSE.txt", "LICENSE"):
            lp = os.path.join(stdlib, cand)
            if os.path.isfile(lp):
                shutil.copyfile(lp, os.path.join(out, "CORPUS_LICENSE.txt"))
                license_copied = True
                break

    # 2. Tokenizer.
    with Stage("tokenizer", times):
        tok = train_tokenizer([t for _, t in train_docs], P["vocab_size"])
        vocab = tok.get_vocab_size(with_added_tokens=True)
        special_ids = {s: tok.token_to_id(s) for s in SPECIAL_TOKENS}
        if any(v is None for v in special_ids.values()):
            fail(f"special tokens missing from the vocabulary: {special_ids}")
        eos_id = special_ids[EOS_TOKEN]
        log(f"vocabulary {vocab} (asked {P['vocab_size']}), special ids {special_ids}")
        if vocab != P["vocab_size"]:
            log("WARNING: the trained vocabulary is smaller than asked (small corpus?)")
        check_tokenizer(tok, [t for _, t in test_docs[:50]] + EDGE_CASES, eos_id)
        tok.save(os.path.join(tok_dir, "tokenizer.json"))
        match_qwen2_flags(os.path.join(tok_dir, "tokenizer.json"))
        write_json(os.path.join(tok_dir, "tokenizer_config.json"),
                   tokenizer_config_json(tok, P["max_position_embeddings"]))
        # Load the saved file back: the oracle and the models use exactly what is on disk.
        tok = Tokenizer.from_file(os.path.join(tok_dir, "tokenizer.json"))
        check_tokenizer(tok, [t for _, t in test_docs[:10]], eos_id)

    with Stage("tokenize corpus", times):
        train_stream = tokenize_stream(tok, [t for _, t in train_docs], eos_id)
        val_stream = tokenize_stream(tok, [t for _, t in val_docs], eos_id)
        test_stream = tokenize_stream(tok, [t for _, t in test_docs], eos_id)
        test_chars = sum(len(t) for _, t in test_docs)
        test_bytes = sum(len(t.encode("utf-8")) for _, t in test_docs)
        log(f"tokens: train {len(train_stream):,}, val {len(val_stream):,}, test {len(test_stream):,}; "
            f"test {test_bytes / max(1, len(test_stream) - len(test_docs)):.3f} bytes/token")

    with Stage("fixture inputs", times):
        rng = random.Random(args.seed)
        tok_cases = tokenizer_cases(tok, test_docs, val_docs + train_docs, P["tokenizer_cases"], rng)
        write_json(os.path.join(fix_dir, "tokenizer_expected.json"), tok_cases)
        prompts = pick_prompts(tok, test_docs, P["prompt_lengths"])
        log(f"{len(tok_cases)} tokenizer cases; prompt lengths {[len(p['ids']) for p in prompts]}")

    # Size check before spending the GPU time.
    pt = param_count(P["target"], vocab)
    pd = param_count(P["draft"], vocab)
    prompt_rows = sum(len(p["ids"]) for p in prompts)
    estimate = (2 * (pt + pd) + 2 * 4 * vocab * prompt_rows + 4 * os.path.getsize(
        os.path.join(tok_dir, "tokenizer.json")) + folder_bytes(fix_dir) + 300_000)
    log(f"estimated output size {estimate:,} bytes (limit {SIZE_LIMIT_BYTES:,}); "
        f"target {pt:,} params, draft {pd:,}")
    if estimate > SIZE_LIMIT_BYTES:
        fail("the planned models and fixtures would not fit the size limit")

    attn = "sdpa"
    val_windows = make_windows(val_stream, P["seq_len"], P["val_windows"], device)
    test_windows = make_windows(test_stream, P["seq_len"], P["test_windows"], device)

    # 3. Training. Each budget leaves room for what comes after it.
    with Stage("train target", times):
        budget = stage_budget("target", target_minutes * 60.0,
                              deadline - time.time() - draft_minutes * 60.0 - P["post_reserve_s"])
        target, info_t = train_model("target", P["target"], train_stream, val_windows, vocab, eos_id,
                                     P, P["target_lr"], P["target_max_epochs"], budget,
                                     args.seed + 1, device, attn)
        target.to(torch.bfloat16)
    with Stage("train draft", times):
        budget = stage_budget("draft", draft_minutes * 60.0,
                              deadline - time.time() - P["post_reserve_s"])
        draft, info_d = train_model("draft", P["draft"], train_stream, val_windows, vocab, eos_id,
                                    P, P["draft_lr"], P["draft_max_epochs"], budget,
                                    args.seed + 2, device, attn)
        draft.to(torch.bfloat16)

    # 4. Held-out evaluation of the weights as they will be saved (bf16).
    with Stage("evaluate", times):
        t_loss = eval_loss(target, test_windows, P["eval_batch"], device)
        d_loss = eval_loss(draft, test_windows, P["eval_batch"], device)
        t_w0 = eval_loss(target, test_windows[:1], 1, device)
        d_w0 = eval_loss(draft, test_windows[:1], 1, device)
        agree = greedy_agreement(target, draft, test_windows, P["eval_batch"], device)
        counts = np.bincount(train_stream, minlength=vocab).astype(np.float64) + 1.0
        logp = np.log(counts / counts.sum())
        tw = test_windows[:, 1:].reshape(-1).cpu().numpy()
        unigram = float(-logp[tw].mean())
        uniform = math.log(vocab)
        log(f"test loss: target {t_loss:.4f}, draft {d_loss:.4f}, unigram {unigram:.4f}, "
            f"uniform {uniform:.4f}; greedy agreement {agree * 100:.1f}%")
        if not (t_loss < uniform and d_loss < uniform):
            log("WARNING: a model is no better than the uniform guess")

    with Stage("save models", times):
        cfg_t, _ = save_model(target, os.path.join(out, "target"), tok_dir, eos_id)
        cfg_d, _ = save_model(draft, os.path.join(out, "draft"), tok_dir, eos_id)
        del target, draft
        if device.type == "cuda":
            torch.cuda.empty_cache()

    # 5. Fixtures from the saved checkpoints: float32 eager attention on the CPU.
    with Stage("fixtures", times):
        torch.set_float32_matmul_precision("highest")
        check_window = test_windows[0].cpu()
        fixture_info = {}
        for name, gpu_loss in (("target", t_w0), ("draft", d_w0)):
            mdir = os.path.join(out, name)
            cases, cpu_loss = make_model_fixtures(name, mdir, prompts, P["greedy_tokens"], fix_dir,
                                                  check_window, gpu_loss)
            for c in cases:
                c["greedy_text"] = tok.decode(c["greedy_ids"], skip_special_tokens=False)
            write_json(os.path.join(fix_dir, f"{name}_expected.json"), {
                "model": name,
                "model_dir": name,
                "logits_file": f"{name}_logits.safetensors",
                "vocab_size": vocab,
                "eos_token_id": eos_id,
                "weights_dtype": "bfloat16",
                "compute": "float32 on CPU (bf16 weights upcast), eager attention, no KV cache",
                "greedy": {"max_new_tokens": P["greedy_tokens"], "do_sample": False,
                           "stop_on_eos": False},
                "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
                "cases": cases,
            })
            fixture_info[name] = {"reload_check_cpu_fp32_loss": round(cpu_loss, 5),
                                  "reload_check_gpu_bf16_loss": round(gpu_loss, 5)}
        fixture_info["transformers_tokenizer"] = check_transformers_tokenizer(
            os.path.join(out, "target"), tok_cases)
        log(f"transformers tokenizer check: {fixture_info['transformers_tokenizer']}")
        shutil.rmtree(tok_dir, ignore_errors=True)

    # 6. Card and log.
    corpus = {
        "python_version": platform.python_version(), "stdlib_path": stdlib,
        "cap_bytes": P["corpus_cap_bytes"], "max_file_bytes": P["max_file_bytes"],
        "test_frac": P["test_frac"], "val_frac": P["val_frac"],
        "train_files": len(train_docs), "val_files": len(val_docs), "test_files": len(test_docs),
        "train_chars": sum(len(t) for _, t in train_docs),
        "val_chars": sum(len(t) for _, t in val_docs), "test_chars": test_chars,
        "train_tokens": int(len(train_stream)), "val_tokens": int(len(val_stream)),
        "test_tokens": int(len(test_stream)), "license_copied": license_copied,
        "psf_notice": psf_notice(os.path.join(out, "CORPUS_LICENSE.txt") if license_copied else None),
        "test_files_list": [r for r, _ in test_docs], "val_files_list": [r for r, _ in val_docs],
        **cstats,
    }
    R = {
        "smoke": bool(args.smoke),
        "command": command,
        "seed": args.seed,
        "versions": versions,
        "profile": {k: v for k, v in P.items()},
        "budgets_minutes": {"target": target_minutes, "draft": draft_minutes, "total": max_total},
        "corpus": corpus,
        "tokenizer": {
            "vocab_size": vocab, "special_ids": special_ids, "cases": len(tok_cases),
            "tokenizers_version": tokenizers.__version__,
            "test_bytes_per_token": test_bytes / max(1, len(test_stream) - len(test_docs)),
            "pre_tokenizer_pattern": QWEN2_PATTERN,
        },
        "target": {"config": cfg_t, "training": info_t},
        "draft": {"config": cfg_d, "training": info_d},
        "eval": {
            "target_test_loss": t_loss, "draft_test_loss": d_loss, "unigram_test_loss": unigram,
            "uniform_loss": uniform, "greedy_agreement": agree,
            "test_windows": int(test_windows.shape[0]), "window_tokens": P["seq_len"],
        },
        "fixtures": {"prompt_lengths": [len(p["ids"]) for p in prompts], **fixture_info},
        "stage_times_s": times,
    }
    R["total_time_s"] = time.time() - T0
    write_model_card(os.path.join(out, "MODEL_CARD.md"), R)
    write_json(os.path.join(out, "training_log.json"), R)

    # Size check of everything written.
    total = folder_bytes(out)
    log("output files:")
    for dirpath, _, filenames in sorted(os.walk(out)):
        for fn in sorted(filenames):
            full = os.path.join(dirpath, fn)
            log(f"  {os.path.relpath(full, out):45s} {os.path.getsize(full):>12,}")
    log(f"total {total:,} bytes (limit {SIZE_LIMIT_BYTES:,}); run time {time.time() - T0:.1f}s")
    if total > SIZE_LIMIT_BYTES:
        fail(f"output is {total:,} bytes, over the {SIZE_LIMIT_BYTES:,} limit")
    if time.time() > deadline:
        log(f"WARNING: the run went past its {max_total} min guard")
    log("OK")


if __name__ == "__main__":
    main()
