#!/usr/bin/env bash
# scripts/check_docs.sh on a small tree of its own: every kind of broken
# reference is reported with its file and line, and everything it must let
# pass passes. Usage: check_docs_test.sh SOURCE_DIR
set -uo pipefail
src=$(cd "${1:?usage: check_docs_test.sh SOURCE_DIR}" && pwd)
tree=$(mktemp -d)
trap 'rm -rf "$tree"' EXIT
cd "$tree"
git init -q .
mkdir -p docs kernels/cuda tests/bench
touch kernels/cuda/gemv.cu tests/bench/foo_bench.cc docs/kernels.md
cat >README.md <<'MD'
# A tree
See [the kernels](docs/kernels.md#tiles), [the web](https://example.com), [here](#a-tree),
`kernels/cuda/gemv.cu`, `tests/bench/foo_bench`, `build/bin/tessera`, `kernels/*.cu`,
`cuda:<bus id>`, `tessera.v1.Inference`, `/usr/local/cuda`, `kernels/cuda/gemv.cu:12`.
```
docs/in_a_fence.md is not checked
```
MD
cat >kernels/README.md <<'MD'
Beside this file: `cuda/gemv.cu`; at the top: `docs/kernels.md`; below: `gemv.cu`.
MD
echo 'In docs/ bare names are not checked: `config.h`.' >docs/kernels.md
failures=0
if ! out=$(bash "$src/scripts/check_docs.sh" "$tree" 2>&1); then
  echo "FAIL: a clean tree was refused:"; echo "$out"; failures=$((failures + 1))
fi
cat >>README.md <<'MD'
A [dead link](docs/gone.md) and `docs/gone_too.md`,
MD
cat >>kernels/README.md <<'MD'
`cuda/gone.cu` beside, and `tests/bench/gone_bench`, and `gone.h`.
MD
out=$(bash "$src/scripts/check_docs.sh" "$tree" 2>&1)
rc=$?
[ $rc = 1 ] || { echo "FAIL: want exit 1 for broken references, got $rc"; failures=$((failures + 1)); }
for want in "README.md:8: link (docs/gone.md)" "README.md:8: \`docs/gone_too.md\`" \
    "kernels/README.md:2: \`cuda/gone.cu\`" "kernels/README.md:2: \`tests/bench/gone_bench\`" \
    "kernels/README.md:2: \`gone.h\` (not in kernels/)"; do
  grep -qxF -- "$want" <<<"$out" || { echo "FAIL: want '$want' in:"; echo "$out"; failures=$((failures + 1)); }
done
[ "$(grep -c ': ' <<<"$out")" = 6 ] ||  # the five above and the summary
  { echo "FAIL: want exactly five reports:"; echo "$out"; failures=$((failures + 1)); }
[ $failures = 0 ] || exit 1
echo "check_docs: every case passes"
