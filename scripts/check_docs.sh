#!/usr/bin/env bash
# Fails when a Markdown file of the tree links to, or names in backticks, a
# repository path that does not exist. Run by scripts/test.sh; takes well
# under a second. What counts as a path:
#   [text](target)  a relative link (not http:, mailto:, #anchor), resolved
#                   against the Markdown file's folder;
#   `a/b/c`         a backticked word with a slash whose first part is a
#                   top-level entry of the tree or a folder beside the
#                   Markdown file. Skipped: globs and placeholders (* ? < >
#                   { } $ ...), build outputs (build*/), absolute paths, and
#                   text inside ``` fences. A program named after its
#                   source (`tests/bench/foo_bench` for foo_bench.cc) counts
#                   as existing;
#   `name.h`        in a folder's README.md, a backticked bare file name with
#                   a source extension (.h .cc .cu .cuh .py .sh .inc .proto)
#                   must exist in that folder or below it (the entry points
#                   a README lists).
# Usage: scripts/check_docs.sh [ROOT]   (default: this checkout). Prints
# FILE:LINE: PATH for each broken reference and exits 1 if there is one.
set -euo pipefail
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$root"
exec python3 - <<'PY'
import os, re, subprocess, sys

listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"],
                        check=True, capture_output=True, text=True).stdout.split("\n")
listed = [f for f in listed if f and "node_modules/" not in f and os.path.isfile(f)]
files = sorted(f for f in listed if f.endswith(".md"))
by_name = {}
for g in listed:
    by_name.setdefault(os.path.basename(g), []).append(g)
bare_re = re.compile(r"^[A-Za-z0-9_.+-]+\.(h|cc|cu|cuh|py|sh|inc|proto)$")
top = set(os.listdir("."))
link_re = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
tick_re = re.compile(r"`([^`\s]+)`")
placeholder = set("*?<>{}$|,;=()[]'\"")
program_sources = (".cc", ".cu", ".py", ".sh")


def exists(path):
    path = os.path.normpath(path)
    if os.path.exists(path) or any(os.path.isfile(path + ext) for ext in program_sources):
        return True
    # Paths the build or the scripts create (git-ignored: caches, build
    # trees) are named in docs without existing in a clean clone.
    return any(subprocess.run(["git", "check-ignore", "-q", p]).returncode == 0
               for p in (path, path + "/"))


bad = []
for f in files:
    base = os.path.dirname(f)
    fenced = False
    with open(f, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if line.lstrip().startswith("```"):
                fenced = not fenced
                continue
            if fenced:
                continue
            for target in link_re.findall(line):
                if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("#"):
                    continue
                path = target.split("#", 1)[0]
                if path and not exists(os.path.join(base, path)):
                    bad.append(f"{f}:{n}: link ({target})")
            for word in tick_re.findall(line):
                if ("/" not in word and bare_re.match(word) and base and
                        os.path.basename(f) == "README.md" and not f.startswith("docs/")):
                    if not any(g.startswith(base + "/") for g in by_name.get(word, [])):
                        bad.append(f"{f}:{n}: `{word}` (not in {base}/)")
                    continue
                if "/" not in word or word[0] in "/-~." or "://" in word:
                    continue
                if any(c in placeholder for c in word):
                    continue
                word = re.sub(r":[0-9]+$", "", word).rstrip(".:")
                first = word.split("/", 1)[0]
                beside = bool(base) and os.path.isdir(os.path.join(base, first))
                if first.startswith("build") or not (first in top or beside):
                    continue
                if not (exists(word) or (beside and exists(os.path.join(base, word)))):
                    bad.append(f"{f}:{n}: `{word}`")

for b in bad:
    print(b)
if bad:
    print(f"check_docs: {len(bad)} reference(s) to paths that do not exist "
          f"(fix the path, or write it as a placeholder)")
    sys.exit(1)
print(f"check_docs: {len(files)} Markdown files; every path they name exists")
PY
