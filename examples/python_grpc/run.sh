#!/usr/bin/env bash
# Generates the Python stubs of proto/tessera/v1 with protoc and its gRPC
# Python plugin (Debian: protobuf-compiler, protobuf-compiler-grpc) into a
# temporary folder, then runs client.py (python3-grpcio, python3-protobuf)
# against TESSERA_GRPC. Arguments go to client.py (e.g. --check).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "${here}/../.." && pwd)"
fail() { echo "FATAL: python gRPC example: $*" >&2; exit 1; }
command -v protoc >/dev/null || fail "protoc is not installed (apt: protobuf-compiler)"
plugin="$(command -v grpc_python_plugin || true)"
[[ -n "${plugin}" ]] || fail "grpc_python_plugin is not installed (apt: protobuf-compiler-grpc)"
# Debian's python3-grpcio lives in the system interpreter's dist-packages;
# a python3 earlier on PATH (pyenv, a venv) may not see it.
py="${PYTHON:-/usr/bin/python3}"
[[ -x "${py}" ]] || py="$(command -v python3)"
"${py}" -c "import grpc, google.protobuf" 2>/dev/null ||
  fail "python3-grpcio / python3-protobuf are not installed (scripts/install-deps.sh)"
out="$(mktemp -d)"
trap 'rm -rf "${out}"' EXIT
protoc -I "${repo}/proto" --python_out="${out}" --grpc_python_out="${out}" \
  --plugin=protoc-gen-grpc_python="${plugin}" \
  "${repo}"/proto/tessera/v1/{common,inference}.proto
touch "${out}/tessera/__init__.py" "${out}/tessera/v1/__init__.py"
PYTHONPATH="${out}" "${py}" "${here}/client.py" "$@"
