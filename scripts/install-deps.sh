#!/usr/bin/env bash
# Installs every Debian package that Tessera's build, tests and demo need.
# Idempotent: packages already present are skipped. Runs as root (or via sudo)
# on a fresh Debian 12 machine.
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config git
  clang libclang-rt-14-dev
  libgrpc++-dev libgrpc-dev protobuf-compiler protobuf-compiler-grpc libprotobuf-dev
  libabsl-dev
  prometheus-cpp-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libpcre2-dev nlohmann-json3-dev libssl-dev libboost-dev
  libxxhash0
  libsystemd-dev
  prometheus
  curl ca-certificates openssl
  nodejs npm
  python3 python3-seccomp util-linux bubblewrap
  python3-grpcio python3-protobuf
  yamllint kubernetes-client
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

# node/npm may come from elsewhere than Debian; accept any working install.
if command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1; then
  filtered=()
  for p in "${missing[@]}"; do
    [[ "$p" == nodejs || "$p" == npm ]] || filtered+=("$p")
  done
  missing=("${filtered[@]+"${filtered[@]}"}")
fi

# kubectl (for `kubectl kustomize`): Debian's kubernetes-client, unless a
# kubectl is already installed (another package owns /usr/bin/kubectl then).
if command -v kubectl >/dev/null 2>&1; then
  filtered=()
  for p in "${missing[@]+"${missing[@]}"}"; do
    [[ "$p" == kubernetes-client ]] || filtered+=("$p")
  done
  missing=("${filtered[@]+"${filtered[@]}"}")
fi

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
