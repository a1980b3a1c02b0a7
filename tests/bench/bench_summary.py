#!/usr/bin/env python3
"""Ratio table of a cpu_ops_bench JSON run (Google Benchmark format).

Usage: tests/bench/bench_summary.py tests/bench/results/cpu_ops.json

Prints, from that one run: the memory-bandwidth ceilings, every GEMV's
effective bandwidth against them, and each optimized op's speed-up over the
reference. All numbers use wall-clock (real) time; with repetitions, the
fastest repetition.
"""
import json
import re
import sys


def main(path):
    with open(path) as f:
        run = json.load(f)
    # With repetitions: the fastest repetition (least disturbed by other work
    # on a shared machine), its rates rescaled from the median row (a rate is
    # work / time, and the work per iteration is fixed). Else the single runs.
    def by_name(kind):
        return {b["run_name"].removesuffix("/real_time"): b for b in run["benchmarks"]
                if b.get("aggregate_name") == kind}
    mins, medians = by_name("min"), by_name("median")
    rows = {}
    if mins:
        for name, best in mins.items():
            row = dict(best)
            med = medians[name]
            for counter in ("GB/s", "GFLOP/s"):
                if counter in med:
                    row[counter] = med[counter] * med["real_time"] / best["real_time"]
            rows[name] = row
    else:
        for b in run["benchmarks"]:
            if b.get("run_type") == "iteration":
                rows[b["run_name"].removesuffix("/real_time")] = b
    rows = dict(sorted(rows.items()))
    ctx = run["context"]
    print(f"Machine: {ctx.get('cpu_brand', '?')}, {ctx.get('num_cpus')} CPUs; "
          f"features: {ctx.get('cpu_features', '?')}; optimized ISA: {ctx.get('opt_isa', '?')}")
    print(f"Command: {ctx.get('command', '?')}\n")

    def gbps(name):
        return rows[name]["GB/s"] if name in rows else None

    # Ceilings per thread count: the best read rate (over 1 and 8 streams)
    # and the memcpy rate (bytes copied per second).
    def ceiling(kind, threads):
        rates = [gbps(n) for n in rows if n.startswith(f"memory/{kind}") and n.endswith(f"/t{threads}")]
        return max(rates, default=None)

    print("| ceiling | GB/s |\n|---|---|")
    for n in rows:
        if n.startswith("memory/"):
            print(f"| {n} | {gbps(n):.1f} |")
    print()

    print("| GEMV | threads | time (us) | GB/s | vs read ceiling | vs memcpy |")
    print("|---|---|---|---|---|---|")
    for n, b in rows.items():
        m = re.match(r"gemv/(.*)/opt_t(\d)/(.*)", n)
        if not m:
            continue
        threads = int(m.group(2))
        g, read, copy = gbps(n), ceiling("read", threads), ceiling("memcpy", threads)
        ratio = lambda c: f"{g / c:.0%}" if c else "-"
        print(f"| {m.group(1)} {m.group(3)} | {threads} | {b['real_time']:.0f} | {g:.1f} | "
              f"{ratio(read)} | {ratio(copy)} |")
    print()

    print("| op | reference (us) | optimized (us) | speed-up | opt GB/s | opt GFLOP/s |")
    print("|---|---|---|---|---|---|")
    for n, b in rows.items():
        m = re.match(r"(.*)/opt_t(\d)/(.*)", n)
        if not m:
            continue
        ref = rows.get(f"{m.group(1)}/ref/{m.group(3)}")
        speedup = f"{ref['real_time'] / b['real_time']:.1f}x" if ref else "-"
        ref_time = f"{ref['real_time']:.0f}" if ref else "-"
        flops = f"{b['GFLOP/s']:.1f}" if "GFLOP/s" in b else "-"
        gb = f"{b['GB/s']:.1f}" if "GB/s" in b else "-"
        print(f"| {m.group(1)}/{m.group(3)} t{m.group(2)} | {ref_time} | {b['real_time']:.1f} | "
              f"{speedup} | {gb} | {flops} |")


if __name__ == "__main__":
    main(sys.argv[1])
