#!/usr/bin/env bash
# The real worker under the sandbox settings of deploy/systemd's
# tessera-worker@.service, with the flags its ExecStart renders from
# worker.env.example (changed only where CI differs: the CPU, 2 tensor-
# parallel ranks, a fixture model, loopback ports, no TLS, no drafter):
#
#   where systemd is PID 1 this would be `systemd-run -p`; CI has no
#   systemd as PID 1, so unit_sandbox.py applies the same settings with the
#   kernel mechanisms systemd uses (seccomp from systemd-analyze's own
#   syscall groups, address families, namespaces, realtime; no new
#   privileges, an empty capability bounding set, an unprivileged user,
#   rlimits, umask; a read-only file system with private /tmp and a minimal
#   /dev through bubblewrap). See unit_sandbox.py for what it does not.
#
# Controls first, to show the sandbox enforces what it claims: a denied
# system call (chroot) kills the process with SIGSYS; unshare of a user
# namespace is refused; the interface list that NCCL's getifaddrs needs
# works with the unit's families and fails once AF_NETLINK is removed.
# Then the worker must start (the engine's warm-up runs through both
# ranks before readiness), serve a request through a router, and drain to
# exit 0 on SIGTERM: any denied call would have killed it or failed it.
#
# Exit 77 (SKIPPED) when bubblewrap, python3-seccomp or user-level
# namespaces are unavailable. Usage: check_worker_sandbox.sh BUILD_DIR
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "${here}/../.." && pwd)"
build=$(cd "${1:?usage: check_worker_sandbox.sh BUILD_DIR}" && pwd)
unit=${repo}/deploy/systemd/tessera-worker@.service
fail() { echo "FAIL: $*" >&2; exit 1; }
skip() { echo "SKIPPED: $*"; exit 77; }
[[ -x /usr/bin/bwrap ]] || skip "/usr/bin/bwrap not installed (scripts/install-deps.sh installs bubblewrap)"
/usr/bin/python3 -c 'import seccomp' 2>/dev/null ||
  skip "python3-seccomp not installed (scripts/install-deps.sh installs it)"
[[ -x /usr/bin/systemd-analyze ]] || skip "systemd-analyze not installed (its syscall groups are the filter)"
/usr/bin/bwrap --ro-bind / / -- /bin/true 2>/dev/null || skip "bwrap cannot create a mount namespace here"
for b in worker/tessera-worker router/tessera-router cli/tessera; do
  [[ -x ${build}/services/${b} ]] || fail "${build}/services/${b} is not built"
done

# The service user (uid 65534) must reach the worker and the model, and a
# checkout may sit in a folder only its owner can enter (a mktemp clone):
# both are staged in a folder of their own, kept visible read-only.
work=$(mktemp -d /tmp/tessera-sandbox.XXXXXX)
chmod 0755 "$work"
mkdir -m 0777 "$work/rw"
mkdir -m 0755 "$work/stage" "$work/stage/model"
cp "${build}/services/worker/tessera-worker" "$work/stage/"
cp -r "${repo}/tests/fixtures/models/qwen3_tiny/." "$work/stage/model/"
chmod -R a+rX "$work/stage"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

# worker.env.example, changed where CI differs.
sed -e "s#^TESSERA_MODEL=.*#TESSERA_MODEL=${work}/stage/model#" \
    -e 's#^TESSERA_DEVICE=.*#TESSERA_DEVICE=cpu#' -e 's#^TESSERA_TP=.*#TESSERA_TP=2#' \
    -e 's#^TESSERA_LISTEN=.*#TESSERA_LISTEN=127.0.0.1:0#' \
    -e 's#^TESSERA_METRICS_LISTEN=.*#TESSERA_METRICS_LISTEN=127.0.0.1:0#' \
    -e 's#^TESSERA_KV_CACHE_BLOCKS=.*#TESSERA_KV_CACHE_BLOCKS=64#' \
    -e 's#^TESSERA_CPU_THREADS=.*#TESSERA_CPU_THREADS=1#' \
    -e 's#^TESSERA_MAX_MODEL_LEN=.*#TESSERA_MAX_MODEL_LEN=256#' \
    -e 's#^TESSERA_DRAFTER=.*#TESSERA_DRAFTER=#' \
    -e 's#^TESSERA_TLS_\(CERT\|KEY\|CLIENT_CA\)=.*#TESSERA_TLS_\1=#' \
    -e "s#^TESSERA_EXTRA_ARGS=.*#TESSERA_EXTRA_ARGS=--port_file=${work}/rw/port#" \
    "${repo}/deploy/systemd/worker.env.example" >"$work/worker.env"
grep -q '^TESSERA_TP=2$' "$work/worker.env" || fail "worker.env.example has no TESSERA_TP= line to set"
sandbox=(/usr/bin/python3 "${here}/unit_sandbox.py" run --unit "$unit" --instance ci
         --env-file "$work/worker.env" --writable "$work/rw" --expose "$work/stage")

# Controls.
"${sandbox[@]}" -- /usr/bin/python3 -c 'import os; os.chroot("/")' 2>/dev/null
rc=$?
[[ $rc == 159 ]] || fail "control: chroot under the filter exited $rc, not 159 (SIGSYS): the syscall filter is not applied"
echo "ok: control: a call outside @system-service (chroot) is killed with SIGSYS"
out=$("${sandbox[@]}" -- /usr/bin/python3 -c '
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
rc = libc.unshare(0x10000000)  # CLONE_NEWUSER
print(rc, os.strerror(ctypes.get_errno()), os.getuid())' 2>/dev/null)
[[ $out == "-1 Operation not permitted 65534" ]] ||
  fail "control: unshare(CLONE_NEWUSER) as the service user gave '$out', not '-1 Operation not permitted 65534'"
echo "ok: control: RestrictNamespaces refuses unshare, as uid 65534"
"${sandbox[@]}" -- /usr/bin/python3 -c 'import socket; assert socket.if_nameindex()' 2>"$work/netlink.err" ||
  { cat "$work/netlink.err"; fail "the interface list (netlink, as NCCL's getifaddrs) fails under the unit's families"; }
if "${sandbox[@]}" --drop-family AF_NETLINK -- /usr/bin/python3 -c 'import socket; socket.if_nameindex()' 2>/dev/null; then
  fail "control: the interface list worked without AF_NETLINK: the family filter is not applied"
fi
echo "ok: the interface list works with the unit's RestrictAddressFamilies and fails without AF_NETLINK"

# The worker, as the unit starts it.
cmd=$("${sandbox[@]}" --print) || fail "cannot render the unit's ExecStart"
cmd=${cmd/\/usr\/local\/bin\/tessera-worker/${work}/stage/tessera-worker}
echo "worker: ${cmd}"
read -ra argv <<<"$cmd"
# Control: the same worker under a copy of the unit without AF_INET must
# fail to start (its listen is refused): the check sees what the worker
# needs and is denied.
sed 's/^RestrictAddressFamilies=.*/RestrictAddressFamilies=AF_UNIX AF_NETLINK/' "$unit" >"$work/no-inet.service"
if /usr/bin/python3 "${here}/unit_sandbox.py" run --unit "$work/no-inet.service" --instance ci \
     --env-file "$work/worker.env" --writable "$work/rw" --expose "$work/stage" -- "${argv[@]}" \
     >"$work/no-inet.log" 2>&1; then
  fail "control: the worker started under a unit without AF_INET"
fi
grep -qi "listen\|address family\|bind" "$work/no-inet.log" ||
  { cat "$work/no-inet.log"; fail "control: the worker without AF_INET failed, but not on listening"; }
rm -f "$work/rw/port" "$work/rw/sandbox.pid"
echo "ok: control: the worker fails to start under a unit without AF_INET ($(grep -m1 -io 'error=.*' "$work/no-inet.log" | cut -c1-80))"
"${sandbox[@]}" -- "${argv[@]}" >"$work/worker.log" 2>&1 &
sb=$!
pids+=($sb)
port=""
for _ in $(seq 1200); do
  [[ -f $work/rw/port ]] && { port=$(sed -n 's/^grpc_port=//p' "$work/rw/port"); break; }
  kill -0 $sb 2>/dev/null || break
  sleep 0.05
done
[[ -n $port ]] || { cat "$work/worker.log"; fail "the worker did not start under the sandbox"; }
"${build}/services/cli/tessera" health --target="127.0.0.1:${port}" --service=tessera.v1.Worker --wait=60s \
  >"$work/health.out" 2>&1 || { cat "$work/worker.log"; fail "the worker did not become ready under the sandbox"; }
grep -q 'msg=ready.*tensor_parallel_size=2' "$work/worker.log" ||
  { cat "$work/worker.log"; fail "the worker's ready line does not show 2 tensor-parallel ranks"; }
echo "ok: the worker is ready with 2 CPU tensor-parallel ranks under the sandbox"

"${build}/services/router/tessera-router" --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 \
  --workers="127.0.0.1:${port}" --port_file="$work/router.port" >"$work/router.log" 2>&1 &
pids+=($!)
rport=""
for _ in $(seq 600); do
  [[ -f $work/router.port ]] && { rport=$(sed -n 's/^grpc_port=//p' "$work/router.port"); break; }
  sleep 0.05
done
[[ -n $rport ]] || { cat "$work/router.log"; fail "the router did not start"; }
"${build}/services/cli/tessera" health --target="127.0.0.1:${rport}" --service=tessera.v1.Inference \
  --wait=30s >/dev/null 2>&1 || fail "the router did not become ready"
gen=""
for _ in $(seq 200); do  # until the router has seen the worker SERVING
  gen=$("${build}/services/cli/tessera" generate --generate_target="127.0.0.1:${rport}" \
        --prompt_ids=1,2,3,4,5 --max_tokens=6 --temperature=0 --ignore_eos 2>/dev/null | head -1) && 
    [[ $(wc -w <<<"$gen") -eq 6 ]] && break
  gen=""
  sleep 0.05
done
[[ -n $gen ]] || { cat "$work/worker.log"; fail "no generation through the router from the sandboxed worker"; }
echo "ok: generated through the sandboxed worker: $gen"

wpid=$(cat "$work/rw/sandbox.pid")
kill -TERM "$wpid"
wait $sb
rc=$?
[[ $rc == 0 ]] || {
  tail -20 "$work/worker.log"
  [[ $rc == 159 ]] && fail "the worker was killed by SIGSYS: it made a call the unit's SystemCallFilter denies"
  fail "the worker exited $rc after SIGTERM under the sandbox, not 0 (a clean drain)"
}
grep -q 'msg=stopped clean=true' "$work/worker.log" || fail "the worker's drain was not clean"
grep -i "unit_sandbox: note" "$work/worker.log" || true
echo "ok: the worker drained and exited 0 under the sandbox; nothing it needs was denied"
