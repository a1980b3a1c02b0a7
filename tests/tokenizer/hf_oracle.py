#!/usr/bin/env python3
"""Second reference for the tokenizer parity test: Hugging Face transformers
(and its Rust `tokenizers` backend), for machines that have them installed.

Writes the same JSON as oracle/oracle.js, so tokenizer_parity_test can read
it through TESSERA_TOKENIZER_ORACLE:

  python3 tests/tokenizer/hf_oracle.py --corpus tests/tokenizer/corpus.jsonl \\
      --model qwen3=/path/to/qwen3/models --model llama3=/path/to/llama3/models \\
      --out hf_expected.json

Each model directory holds tokenizer.json and tokenizer_config.json (the npm
packages' models/ folders work). Loads local files only.
"""

import argparse
import json
import os
import unicodedata

import tokenizers
import transformers


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--corpus", required=True)
    parser.add_argument("--model", action="append", required=True, help="name=directory")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    with open(args.corpus, encoding="utf-8") as f:
        corpus = [json.loads(line) for line in f if line.strip()]

    out = {
        "oracle": "transformers %s / tokenizers %s" % (transformers.__version__,
                                                       tokenizers.__version__),
        "corpus_size": len(corpus),
        "models": [],
    }
    for spec in args.model:
        name, directory = spec.split("=", 1)
        tok = transformers.AutoTokenizer.from_pretrained(directory, local_files_only=True)
        cases = []
        for row in corpus:
            text = row["text"]
            ids = tok.encode(text, add_special_tokens=False)
            cases.append({
                "cat": row["cat"],
                "text": text,
                "nfc": unicodedata.normalize("NFC", text),
                "ids": ids,
                "ids_add_special": tok.encode(text, add_special_tokens=True),
                "decoded": tok.decode(ids, clean_up_tokenization_spaces=False),
                "decoded_skip_special": tok.decode(ids, skip_special_tokens=True,
                                                   clean_up_tokenization_spaces=False),
            })
            # transformers 5 refuses to clean up BPE output; where its
            # clean-up function exists, apply it to the plain decode.
            if hasattr(tok, "clean_up_tokenization"):
                cases[-1]["decoded_clean_up"] = tok.clean_up_tokenization(cases[-1]["decoded"])
        out["models"].append({
            "name": name,
            "package": "%s (%s)" % (directory, type(tok).__name__),
            "tokenizer_json": os.path.join(directory, "tokenizer.json"),
            "tokenizer_config": os.path.join(directory, "tokenizer_config.json"),
            "cases": cases,
        })
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False)
    print("hf_oracle.py: %s; %d strings x %d tokenizers -> %s" %
          (out["oracle"], len(corpus), len(out["models"]), args.out))


if __name__ == "__main__":
    main()
