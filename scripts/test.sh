#!/usr/bin/env bash
# Installs the dependencies, builds everything and runs every test (unit,
# integration, end-to-end). This is what CI runs (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
bash scripts/install-deps.sh
# Module layout: one-way includes, CUDA headers only in kernels/cuda.
bash scripts/check_layout.sh
# Docs: every repository path a Markdown file links or names exists.
bash scripts/check_docs.sh
bash scripts/build.sh
BUILD_DIR=${BUILD_DIR:-build}
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$(nproc)" --timeout 900
# Every libFuzzer target for a bounded time (a clang build of its own).
bash scripts/fuzz.sh "${FUZZ_SECONDS:-30}"
echo "scripts/test.sh: build and tests took $(( $(date +%s) - start )) s"
