#!/usr/bin/env python3
"""The worker's engine on the GPU (`tessera generate --device=cuda`, the same
BuildLocalEngine path the worker serves with) reproduces transformers' greedy
continuations of the trained model pair's fixtures.

Tolerance: the GPU computes in bf16, so tokens are compared up to the first
step whose top-1/top-2 logit margin in the fixture is below 0.25 (a near tie
bf16 rounding may flip). Exit 0 when every compared token matches and at
least 3 tokens per model were compared.

With --tensor_parallel_size=N the engine runs the model as N tensor-parallel
ranks (`--device` then names the group: cuda = the first N GPUs), sampling
on the GPUs as a tensor-parallel worker does.

Usage: check_generate.py TESSERA_BIN [--device=cuda] [--tensor_parallel_size=N]
                         [--out=result.json]
"""
import json
import subprocess
import sys

NEAR_TIE = 0.25


def main():
    tessera = sys.argv[1]
    device = "cuda"
    out_path = ""
    tp = 1
    for a in sys.argv[2:]:
        if a.startswith("--device="):
            device = a.split("=", 1)[1]
        elif a.startswith("--tensor_parallel_size="):
            tp = int(a.split("=", 1)[1])
        elif a.startswith("--out="):
            out_path = a.split("=", 1)[1]
    report = {"device": device, "tensor_parallel_size": tp, "near_tie_margin": NEAR_TIE,
              "models": {}}
    ok = True
    for model in ("target", "draft"):
        expected = json.load(open(f"models/fixtures/{model}_expected.json"))
        compared_total = 0
        cases = []
        for case in expected["cases"]:
            want = case["greedy_ids"]
            margins = case["greedy_top2_margins"]
            n = 0
            while n < len(want) and margins[n] >= NEAR_TIE:
                n += 1
            cmd = [tessera, "generate", f"--model=models/{model}", f"--device={device}",
                   f"--tensor_parallel_size={tp}",
                   "--print_ids", "--ignore_eos", f"--max_tokens={len(want)}",
                   "--prompt_ids=" + ",".join(str(i) for i in case["prompt_ids"])]
            run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
            if run.returncode != 0:
                print(f"{model}: generate failed ({run.returncode}): {run.stderr[-2000:]}")
                ok = False
                continue
            got = [int(t) for t in run.stdout.split()]
            match = got[:n] == want[:n]
            ok &= match
            compared_total += n
            cases.append({"prompt_len": len(case["prompt_ids"]), "compared": n, "match": match,
                          "got": got, "want": want, "identical_all_32": got == want})
            print(f"{model} prompt {len(case['prompt_ids'])} tokens: compared {n}, "
                  f"{'match' if match else 'MISMATCH'}; full 32 identical: {got == want}")
        if compared_total < 3:
            ok = False
        report["models"][model] = {"compared_tokens": compared_total, "cases": cases}
    report["ok"] = ok
    if out_path:
        json.dump(report, open(out_path, "w"), indent=2)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
