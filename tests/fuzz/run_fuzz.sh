#!/usr/bin/env bash
# Builds a libFuzzer target for the model-file parsers with clang
# (-fsanitize=fuzzer,address,undefined) and runs it for a bounded time on a
# copy of the checked-in seed corpus.
#
# Usage: tests/fuzz/run_fuzz.sh [TARGET] [SECONDS] [extra libFuzzer flags...]
#   TARGET   safetensors (default) or config
#   SECONDS  run time, default 60
# Env: CXX (default: clang++, else clang++-14), FUZZ_OUT (default: build-fuzz
# in the repository root; holds the binary, the grown corpus and crash files),
# FUZZ_JOBS (parallel fuzzing processes, default 1).
# Exit status: 0 when the run ended without a finding, non-zero otherwise.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
TARGET="${1:-safetensors}"
SECONDS_TO_RUN="${2:-60}"
shift $(( $# > 2 ? 2 : $# ))
case "${TARGET}" in
  safetensors|config) ;;
  *) echo "run_fuzz.sh: unknown target '${TARGET}' (safetensors or config)" >&2; exit 2 ;;
esac

CXX="${CXX:-}"
if [[ -z "${CXX}" ]]; then
  for candidate in clang++ clang++-14; do
    if command -v "${candidate}" >/dev/null; then CXX="${candidate}"; break; fi
  done
fi
if [[ -z "${CXX}" ]] || ! "${CXX}" --version 2>/dev/null | grep -qi clang; then
  echo "run_fuzz.sh: needs clang++ with libFuzzer (set CXX)" >&2
  exit 2
fi

OUT="${FUZZ_OUT:-${ROOT}/build-fuzz}"
mkdir -p "${OUT}/corpus-${TARGET}" "${OUT}/artifacts-${TARGET}"
BIN="${OUT}/${TARGET}_fuzz"

# The same sources tests/fuzz/CMakeLists.txt compiles.
MODEL_SOURCES=(checkpoint config deepseek_v3_config dtype quantization rope safetensors safetensors_writer tensor weights)
SOURCES=("${ROOT}/tests/fuzz/${TARGET}_fuzz.cc")
for s in "${MODEL_SOURCES[@]}"; do SOURCES+=("${ROOT}/worker/model/${s}.cc"); done
SOURCES+=("${ROOT}/base/json.cc" "${ROOT}/base/file.cc" "${ROOT}/base/log.cc")

ABSL_FLAGS="$(pkg-config --cflags --libs absl_status absl_statusor absl_strings \
  absl_flat_hash_map absl_flat_hash_set absl_hash absl_raw_hash_set)"
SAN="-fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined"
echo "building ${BIN} with ${CXX}"
# shellcheck disable=SC2086
"${CXX}" -std=c++20 -O1 -g ${SAN} -I"${ROOT}" "${SOURCES[@]}" ${ABSL_FLAGS} -o "${BIN}"

# Fresh inputs go to the first corpus directory; the seeds stay untouched.
# Parallel jobs write fuzz-N.log files into the current directory: run in OUT.
JOBS=()
if [[ "${FUZZ_JOBS:-1}" -gt 1 ]]; then JOBS=(-jobs="${FUZZ_JOBS}" -workers="${FUZZ_JOBS}"); fi
echo "fuzzing ${TARGET} for ${SECONDS_TO_RUN}s"
cd "${OUT}"
"${BIN}" -max_total_time="${SECONDS_TO_RUN}" -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
  -print_final_stats=1 "${JOBS[@]}" \
  -dict="${ROOT}/tests/fuzz/${TARGET}.dict" \
  -artifact_prefix="${OUT}/artifacts-${TARGET}/" \
  "$@" "${OUT}/corpus-${TARGET}" "${ROOT}/tests/fuzz/corpus/${TARGET}"
