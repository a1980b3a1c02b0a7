#!/usr/bin/env bash
# Bundles the built binaries and the non-system shared libraries they need
# (from ldd) into .gpu/bundle/, so they run on the GPU machine (another
# distribution) with LD_LIBRARY_PATH=.gpu/bundle/lib. Binaries are stripped
# of debug info to keep the bundle small.
# Usage: scripts/gpu-bundle.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${1:-build}
out=.gpu/bundle
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib"
bins=(
  "$BUILD_DIR/services/cli/tessera"
  "$BUILD_DIR/services/worker/tessera-worker"
  "$BUILD_DIR/services/router/tessera-router"
  "$BUILD_DIR/services/drafter/tessera-drafter"
)
for b in "${bins[@]}"; do
  strip --strip-debug -o "$out/bin/$(basename "$b")" "$b"
done
# Every library except the C runtime and the loader, which the target has.
for b in "${bins[@]}"; do
  ldd "$b" | awk '/=> \// {print $3}'
done | sort -u | grep -v -E '/(libc|libm|libpthread|libdl|librt|ld-linux[^/]*|libgcc_s)\.so' |
  while read -r lib; do cp -L "$lib" "$out/lib/"; done
strip --strip-debug "$out"/lib/*.so* 2>/dev/null || true
du -sh "$out"
