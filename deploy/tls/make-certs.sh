#!/usr/bin/env bash
# Makes a private CA and the certificates of Tessera's mutual TLS between
# router and workers, in OUT_DIR:
#   ca.crt, ca.key                  the CA (keep ca.key off the service hosts)
#   worker.crt, worker.key          server certificate naming every WORKER_NAME
#   router-client.crt, router-client.key   the router's client certificate
#
# Usage: deploy/tls/make-certs.sh OUT_DIR WORKER_NAME...
#   WORKER_NAME: a name the router checks a worker's certificate for: the
#   host of the worker's address (gpu-host-1.example.internal, or
#   tessera-worker-0.tessera-worker for a Kubernetes workers list), or the
#   router's --upstream_tls_target_name (tessera-worker.tessera.svc when it
#   finds the workers by DNS). List each name: gRPC accepts a wildcard only
#   over a name of two or more labels (*.tessera-worker.tessera.svc), and
#   never "*.tessera-worker" ("Invalid toplevel subdomain"), so this script
#   refuses single-label wildcards.
# Renewal: run it again with the same CA (it keeps an existing ca.key) and
# restart the services (deploy/README.md, "TLS between services").
set -euo pipefail
out=${1:?usage: make-certs.sh OUT_DIR WORKER_NAME...}
shift
[[ $# -ge 1 ]] || { echo "make-certs.sh: give at least one WORKER_NAME" >&2; exit 2; }
sans=()
for name in "$@"; do
  if [[ $name == \*.* && ${name#\*.} != *.* ]]; then
    echo "make-certs.sh: $name: gRPC rejects a wildcard over a single label; list the names" >&2
    exit 2
  fi
  sans+=("DNS:$name")
done
mkdir -p "$out"
cd "$out"
umask 077
if [[ ! -f ca.key ]]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 825 \
    -subj "/CN=tessera-ca" -keyout ca.key -out ca.crt 2>/dev/null
fi
issue() {  # issue NAME EXTENSIONS
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
    -subj "/CN=$1" -keyout "$1.key" -out "$1.csr" 2>/dev/null
  openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial \
    -days 365 -extfile <(printf '%s\n' "$2") -out "$1.crt" 2>/dev/null
  rm -f "$1.csr"
}
issue worker "subjectAltName=$(IFS=,; echo "${sans[*]}")
extendedKeyUsage=serverAuth"
issue router-client "subjectAltName=DNS:tessera-router
extendedKeyUsage=clientAuth"
chmod 0644 ca.crt worker.crt router-client.crt
chmod 0640 worker.key router-client.key
openssl x509 -in worker.crt -noout -ext subjectAltName
