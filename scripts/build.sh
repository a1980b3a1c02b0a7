#!/usr/bin/env bash
# Configures and builds Tessera (Ninja, ccache when present). The CUDA
# backend is built when nvcc is found (TESSERA_CUDA=AUTO|ON|OFF).
# Usage: scripts/build.sh [extra cmake args...]; BUILD_DIR overrides ./build.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -G Ninja -DTESSERA_CUDA="${TESSERA_CUDA:-AUTO}" "$@"
# Ninja's progress line with the elapsed time: [done/total percent seconds].
NINJA_STATUS=${NINJA_STATUS:-"[%f/%t %p %es] "} cmake --build "$BUILD_DIR" -j "$(nproc)"
