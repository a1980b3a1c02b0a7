# Sourced by the oracle runners (tests/chat/run_oracle.sh,
# tests/tokenizer/run_oracle.sh): installs npm packages pinned by a lock
# file into a work directory, once.
#
#   npm_install_pinned <label> <dir with package.json + lock> <work dir> <file>...
#
# `npm ci` (integrity-checked against the lock, npm's cache in
# tests/.npm-cache) runs when the lock file changed since the last install
# or one of the <file>s (paths under <work dir>/node_modules) is missing;
# otherwise the installed node_modules is reused. Any failure is fatal and
# says why, prefixed "FATAL: <label>:": a parity test must not pass silently
# without its oracle.

npm_oracle_fail() {
  echo "FATAL: $1: $2" >&2
  exit 1
}

npm_install_pinned() {
  local label="$1" pins="$2" work="$3"
  shift 3
  local repo
  repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
  command -v node >/dev/null || npm_oracle_fail "${label}" "node is not installed (needed to run the reference)"
  command -v npm >/dev/null || npm_oracle_fail "${label}" "npm is not installed (needed to fetch the reference)"
  mkdir -p "${work}"
  local lock_sum stamp installed=1 file
  lock_sum="$(sha256sum "${pins}/package-lock.json" | cut -d' ' -f1)"
  stamp="${work}/installed.sha256"
  [[ -f "${stamp}" && "$(cat "${stamp}")" == "${lock_sum}" ]] || installed=0
  for file in "$@"; do
    [[ -f "${work}/node_modules/${file}" ]] || installed=0
  done
  if [[ "${installed}" == 1 ]]; then
    echo "${label}: reusing ${work}/node_modules"
    return 0
  fi
  rm -f "${stamp}"
  cp "${pins}/package.json" "${pins}/package-lock.json" "${work}/"
  echo "${label}: npm ci in ${work} (cache: ${repo}/tests/.npm-cache)"
  if ! (cd "${work}" && npm ci --cache "${repo}/tests/.npm-cache" --prefer-offline \
          --no-audit --no-fund --loglevel=error); then
    npm_oracle_fail "${label}" "npm ci could not fetch the packages of ${pins}/package.json (is the npm registry reachable?)"
  fi
  echo "${lock_sum}" > "${stamp}"
}
