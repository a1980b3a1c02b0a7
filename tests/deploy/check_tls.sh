#!/usr/bin/env bash
# Mutual TLS between router and worker with the certificates made exactly
# as docs/deployment.md says (its `deploy/tls/make-certs.sh certs ...` line,
# run as written), with the real binaries:
#   1. a router reaches a worker addressed as 127.0.0.1:PORT whose
#      certificate it checks for tessera-worker-0.tessera-worker (a pod's
#      name in a Kubernetes workers list), and generates through it;
#   2. the same for tessera-worker.tessera.svc (the name the multi-node-tls
#      overlay's router checks for the workers it finds by DNS), once with
#      the worker's address given and once found by --workers_dns;
#   3. negative controls: a name the certificate lacks, and the recipe this
#      replaced (subjectAltName=DNS:*.tessera-worker), must not reach the
#      worker: the router logs gRPC's rejection and counts it unhealthy;
#   4. make-certs.sh refuses a single-label wildcard.
# Synchronises on state: port files, the router's
# tessera_router_worker_healthy gauge, gRPC's log line.
# Usage: check_tls.sh BUILD_DIR
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "${here}/../.." && pwd)"
build=${1:?usage: check_tls.sh BUILD_DIR}
fail() { echo "FAIL: $*" >&2; exit 1; }
for b in worker/tessera-worker router/tessera-router cli/tessera; do
  [[ -x ${build}/services/${b} ]] || fail "${build}/services/${b} is not built"
done
command -v openssl >/dev/null || fail "openssl not found (scripts/install-deps.sh installs it)"
command -v curl >/dev/null || fail "curl not found (scripts/install-deps.sh installs it)"
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT

# The README's command, as written (brace expansion included).
recipe=$(grep -m1 '^ *deploy/tls/make-certs.sh certs ' "${repo}/docs/deployment.md" | sed 's/^ *//') ||
  fail "docs/deployment.md has no 'deploy/tls/make-certs.sh certs ...' line"
echo "recipe: ${recipe}"
(cd "$tmp" && mkdir deploy && ln -s "${repo}/deploy/tls" deploy/tls && bash -c "${recipe}") ||
  fail "the README's recipe failed"
certs=$tmp/certs

wait_port_file() {  # wait_port_file FILE PID -> prints grpc_port
  for _ in $(seq 600); do
    if [[ -f $1 ]]; then sed -n 's/^grpc_port=//p' "$1"; return 0; fi
    kill -0 "$2" 2>/dev/null || return 1
    sleep 0.05
  done
  return 1
}
metrics_port() { sed -n 's/^metrics_port=//p' "$1"; }

start_worker() {  # start_worker NAME CERT KEY -> sets wport
  "${build}/services/worker/tessera-worker" --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 \
    --simulate=vocab=1024,context=4096,prefill_us_per_token=1,decode_step_us=1000 \
    --kv_cache_blocks=256 --tls_cert="$2" --tls_key="$3" --tls_client_ca="${certs}/ca.crt" \
    --port_file="$tmp/$1.port" >"$tmp/$1.log" 2>&1 &
  pids+=($!)
  wport=$(wait_port_file "$tmp/$1.port" $!) || { cat "$tmp/$1.log"; fail "worker $1 did not start"; }
}

start_router() {  # start_router NAME WORKER_PORT TARGET_NAME -> sets rport rmetrics rpid
  # GRPC_VERBOSITY=INFO: gRPC logs why a handshake failed only at INFO.
  GRPC_VERBOSITY=INFO "${build}/services/router/tessera-router" --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 \
    "${WORKERS_FLAG:---workers=127.0.0.1:$2}" --upstream_tls_ca="${certs}/ca.crt" \
    --upstream_tls_cert="${certs}/router-client.crt" --upstream_tls_key="${certs}/router-client.key" \
    --upstream_tls_target_name="$3" --port_file="$tmp/$1.port" >"$tmp/$1.log" 2>&1 &
  rpid=$!
  pids+=($rpid)
  rport=$(wait_port_file "$tmp/$1.port" $rpid) || { cat "$tmp/$1.log"; fail "router $1 did not start"; }
  rmetrics=$(metrics_port "$tmp/$1.port")
}

healthy() {  # healthy METRICS_PORT WORKER_PORT -> 0 when the gauge is 1
  curl -fsS "http://127.0.0.1:$1/metrics" 2>/dev/null |
    grep -q "^tessera_router_worker_healthy{.*worker=\"127.0.0.1:$2\".*} 1"
}

expect_reaches() {  # expect_reaches NAME TARGET_NAME
  start_router "$1" "$wport" "$2"
  local ok=0
  for _ in $(seq 400); do
    if healthy "$rmetrics" "$wport"; then ok=1; break; fi
    sleep 0.05
  done
  [[ $ok == 1 ]] || { cat "$tmp/$1.log"; fail "$1: the router did not reach the worker checking for $2"; }
  out=$("${build}/services/cli/tessera" generate --generate_target="127.0.0.1:${rport}" \
        --prompt_ids=11,12,13,14 --max_tokens=4 --temperature=0 --ignore_eos 2>"$tmp/$1.gen.err") ||
    { cat "$tmp/$1.gen.err"; fail "$1: generate through the router failed"; }
  out=$(head -1 <<<"$out")
  [[ $(wc -w <<<"$out") -eq 4 ]] || fail "$1: expected 4 tokens, got: $out"
  echo "ok: $1: mTLS to a worker checked for $2; generated: $out"
  kill "$rpid"
}

expect_rejected() {  # expect_rejected NAME TARGET_NAME LOG_TEXT
  start_router "$1" "$wport" "$2"
  local seen=0
  for _ in $(seq 400); do
    if grep -q -- "$3" "$tmp/$1.log"; then seen=1; break; fi
    kill -0 "$rpid" 2>/dev/null || break
    sleep 0.05
  done
  [[ $seen == 1 ]] || { cat "$tmp/$1.log"; fail "$1: no \"$3\" in the router's log"; }
  if healthy "$rmetrics" "$wport"; then fail "$1: the router counts the worker healthy"; fi
  echo "ok: $1: rejected as expected ($(grep -m1 -o -- "$3.*" "$tmp/$1.log" | cut -c1-100))"
  kill "$rpid"
}

start_worker worker "${certs}/worker.crt" "${certs}/worker.key"
expect_reaches pod-name tessera-worker-0.tessera-worker
expect_reaches service-name tessera-worker.tessera.svc
# As the multi-node-tls overlay runs it: workers found through DNS (here
# localhost, which /etc/hosts answers with 127.0.0.1), checked for the
# Service's name.
WORKERS_FLAG="--workers_dns=localhost:${wport}" expect_reaches dns-discovery tessera-worker.tessera.svc
grep -q 'msg="workers from DNS".*127.0.0.1:'"${wport}" "$tmp/dns-discovery.log" ||
  fail "dns-discovery: the router did not log the workers it found through DNS"
expect_rejected other-name tessera-worker-9.tessera-worker "is not in peer certificate"

# The replaced recipe: a worker certificate naming *.tessera-worker.
(cd "$certs" && openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=worker \
   -keyout old.key -out old.csr 2>/dev/null &&
 openssl x509 -req -in old.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 1 \
   -extfile <(printf 'subjectAltName=DNS:*.tessera-worker') -out old.crt 2>/dev/null) ||
  fail "could not make the old recipe's certificate"
start_worker old-worker "${certs}/old.crt" "${certs}/old.key"
expect_rejected old-recipe tessera-worker-0.tessera-worker "Invalid toplevel subdomain"

if bash "${repo}/deploy/tls/make-certs.sh" "$tmp/refused" '*.tessera-worker' 2>/dev/null; then
  fail "make-certs.sh accepted *.tessera-worker"
fi
echo "ok: make-certs.sh refuses *.tessera-worker"
echo "all TLS checks passed"
