#!/usr/bin/env bash
# The cluster benchmark on the GPU machine, in one command: a Llama-3-8B-
# shaped random model saved with transformers, served by a real
# tessera-worker behind tessera-router under `tessera bench` (closed loop at
# concurrency 1, 8 and 64, then open loop at 80% of the peak), with
# gpu_decode_bench and the PyTorch peer (tests/gpu/torch_decode_peer.py) in
# the same run; OUT_DIR/cluster_bench.json has every figure and the checks
# (tests/bench/cluster_bench.py says what each step does). About 6-8
# minutes on one H200; a rerun keeps the model (in /tmp).
#
# Binaries: BIN_DIR when given, else the bundle of scripts/gpu-bundle.sh
# (.gpu/bundle.tar.xz, unpacked to /tmp/tessera-bundle as gpu-run.sh does).
# Further arguments go to cluster_bench.py (e.g. --device=cuda:<bus id>,
# --max_num_batched_tokens=N, --skip=peer).
#
# Usage: bash scripts/cluster_bench.sh OUT_DIR [BIN_DIR] [cluster_bench.py flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: cluster_bench.sh OUT_DIR [BIN_DIR] [flags...]}
shift
BIN=
if [[ $# -gt 0 && "$1" != --* ]]; then BIN=$1; shift; fi
if [[ -z "$BIN" ]]; then
  [[ -f .gpu/bundle.tar.xz ]] ||
    { echo "cluster_bench: no BIN_DIR and no .gpu/bundle.tar.xz (scripts/gpu-bundle.sh)" >&2; exit 1; }
  B=/tmp/tessera-bundle
  rm -rf "$B" && mkdir -p "$B" && tar -C "$B" -xJf .gpu/bundle.tar.xz
  BIN=$B/bundle/bin
  export LD_LIBRARY_PATH="$B/bundle/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
command -v python3 >/dev/null || { echo "cluster_bench: python3 is required" >&2; exit 1; }
python3 -c 'import torch, transformers' 2>/dev/null ||
  { echo "cluster_bench: python3 needs torch and transformers (the GPU machine has them)" >&2; exit 1; }
mkdir -p "$OUT"
export TESSERA_SOURCE_DIR=$PWD
exec timeout --signal=TERM --kill-after=60 900 \
  python3 tests/bench/cluster_bench.py --bin_dir="$BIN" --out="$OUT" "$@"
