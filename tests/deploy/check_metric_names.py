#!/usr/bin/env python3
"""Checks that deploy/ only uses metrics that exist.

Extracts every tessera_* metric name used in the Prometheus rules and the
Grafana dashboard and checks that each is documented in docs/metrics.md's
tables (rows starting with "| `tessera_..."). Histogram series may carry the
_bucket, _sum or _count suffix. Also checks the dashboard is valid JSON with
unique panel ids and that every target has an expression.

usage: check_metric_names.py REPO_ROOT
       check_metric_names.py --self-test REPO_ROOT   (must reject a bogus name)
"""
import json
import re
import sys

NAME = re.compile(r"\btessera_[a-z0-9_]*[a-z0-9]")
HIST_SUFFIXES = ("_bucket", "_sum", "_count")


def documented(readme_text):
    """Returns {metric name: type} from the metrics tables of docs/metrics.md."""
    out = {}
    for line in readme_text.splitlines():
        m = re.match(r"\|\s*`(tessera_[a-z0-9_]+)(?:\{[^}]*\})?`\s*\|\s*(\w+)\s*\|", line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def unknown_names(used, docs):
    bad = []
    for name in sorted(used):
        if name in docs:
            continue
        base = next((name[: -len(s)] for s in HIST_SUFFIXES if name.endswith(s)), None)
        if base is not None and docs.get(base) == "histogram":
            continue
        bad.append(name)
    return bad


def dashboard_exprs(path, errors):
    with open(path) as f:
        dash = json.load(f)
    ids, exprs = set(), []
    for p in dash.get("panels", []):
        if p["id"] in ids:
            errors.append(f"dashboard: duplicate panel id {p['id']}")
        ids.add(p["id"])
        if p.get("type") == "row":
            continue
        if not p.get("targets"):
            errors.append(f"dashboard: panel {p.get('title')!r} has no targets")
        for t in p.get("targets", []):
            if not t.get("expr", "").strip():
                errors.append(f"dashboard: panel {p.get('title')!r} has an empty expression")
            exprs.append(t.get("expr", ""))
    for v in dash.get("templating", {}).get("list", []):
        q = v.get("query")
        exprs.append(q.get("query", "") if isinstance(q, dict) else str(q or ""))
    if len(exprs) < 10:
        errors.append(f"dashboard: only {len(exprs)} expressions found")
    return exprs


def main(argv):
    self_test = "--self-test" in argv
    args = [a for a in argv[1:] if a != "--self-test"]
    if len(args) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    root = args[0]
    with open(f"{root}/docs/metrics.md") as f:
        docs = documented(f.read())
    if len(docs) < 20:
        print(f"FAIL: found only {len(docs)} metrics in docs/metrics.md's tables; did its format change?")
        return 1

    errors = []
    sources = {}
    with open(f"{root}/deploy/prometheus/tessera-rules.yml") as f:
        rules = f.read()
    # Only expressions matter; annotations are prose.
    sources["rules"] = [l for l in rules.splitlines() if not re.match(r"\s*(summary|description):", l)]
    sources["rules"] = "\n".join(sources["rules"])
    sources["dashboard"] = "\n".join(dashboard_exprs(f"{root}/deploy/grafana/tessera-dashboard.json", errors))
    if self_test:
        sources["rules"] += "\nrate(tessera_router_no_such_metric_total[5m])"

    total = 0
    for what, text in sources.items():
        used = set(NAME.findall(text))
        total += len(used)
        if not used:
            errors.append(f"{what}: no tessera_* metric found")
        for name in unknown_names(used, docs):
            errors.append(f"{what}: {name} is not in docs/metrics.md's tables")
        print(f"{what}: {len(used)} metric names checked")

    if self_test:
        if any("tessera_router_no_such_metric_total" in e for e in errors):
            print("self-test ok: an undocumented name is rejected")
            return 0
        print("FAIL: self-test: an undocumented name was accepted")
        return 1
    for e in errors:
        print("FAIL:", e)
    if not errors:
        print(f"all {total} metric names are documented")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
