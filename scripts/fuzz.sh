#!/usr/bin/env bash
# Builds every libFuzzer target (tests/fuzz) with clang, ASan and UBSan in a
# build folder of its own, and runs each for a bounded time on its seed
# corpus. Any crash, leak or sanitizer report fails the script; the input
# that caused it is left in $FUZZ_DIR/artifacts-<target>/.
#
# Usage: scripts/fuzz.sh [SECONDS per target, default 30]
# Env: FUZZ_DIR (default build-fuzz), CXX/CC (default clang++/clang).
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH=${1:-30}
FUZZ_DIR=${FUZZ_DIR:-build-fuzz}
TARGETS=(safetensors config request)

mkdir -p "$FUZZ_DIR"
CC=${CC:-clang} CXX=${CXX:-clang++} cmake -S . -B "$FUZZ_DIR" -G Ninja -DTESSERA_FUZZ=ON \
  -DTESSERA_CUDA=OFF -DTESSERA_BUILD_TESTS=OFF -DTESSERA_BUILD_BENCHMARKS=OFF \
  > "$FUZZ_DIR/configure.log" || { cat "$FUZZ_DIR/configure.log"; exit 1; }
cmake --build "$FUZZ_DIR" -j "$(nproc)" --target "${TARGETS[@]/%/_fuzz}"

for t in "${TARGETS[@]}"; do
  corpus="$FUZZ_DIR/corpus-$t" artifacts="$FUZZ_DIR/artifacts-$t"
  mkdir -p "$corpus" "$artifacts"
  dict=()
  [ -f "tests/fuzz/$t.dict" ] && dict=(-dict="tests/fuzz/$t.dict")
  echo "fuzz.sh: $t for ${SECONDS_EACH}s"
  # New inputs go to the first corpus folder; the seeds stay as they are.
  "$FUZZ_DIR/tests/fuzz/${t}_fuzz" -max_total_time="$SECONDS_EACH" -max_len=4096 -timeout=10 \
    -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$artifacts/" "${dict[@]}" \
    "$corpus" "tests/fuzz/corpus/$t" 2>&1 | tail -n 12
  [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "fuzz.sh: $t found a crash (input in $artifacts)"; exit 1; }
done
echo "fuzz.sh: every target ran ${SECONDS_EACH}s without a finding"
