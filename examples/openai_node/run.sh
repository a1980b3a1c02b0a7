#!/usr/bin/env bash
# Installs the pinned `openai` client (package-lock.json, `npm ci`, npm's
# cache in tests/.npm-cache) into <work dir> and runs client.mjs (or the
# example named, e.g. seeded.mjs) against TESSERA_BASE_URL. Extra arguments
# go to the script (e.g. --check).
#
# Usage: run.sh <work dir> [script.mjs] [--check]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "${here}/../.." && pwd)"
work="${1:?usage: run.sh <work dir> [--check]}"
shift
fail() { echo "FATAL: openai example: $*" >&2; exit 1; }
command -v node >/dev/null || fail "node is not installed"
command -v npm >/dev/null || fail "npm is not installed"
mkdir -p "${work}"
lock_sum="$(sha256sum "${here}/package-lock.json" | cut -d' ' -f1)"
stamp="${work}/installed.sha256"
if [[ -f "${stamp}" && "$(cat "${stamp}")" == "${lock_sum}" && -d "${work}/node_modules/openai" ]]; then
  :
else
  rm -f "${stamp}"
  cp "${here}/package.json" "${here}/package-lock.json" "${work}/"
  (cd "${work}" && npm ci --cache "${repo}/tests/.npm-cache" --prefer-offline \
      --no-audit --no-fund --loglevel=error) || fail "npm ci could not fetch openai (is the npm registry reachable?)"
  echo "${lock_sum}" > "${stamp}"
fi
script=client.mjs
if [[ "${1:-}" == *.mjs ]]; then script="$1"; shift; fi
[[ -f "${here}/${script}" ]] || fail "no example ${script} in ${here}"
# The script runs from <work dir> so that `import "openai"` finds its node_modules.
cp "${here}/${script}" "${work}/${script}"
exec node "${work}/${script}" "$@"
