#!/usr/bin/env bash
# Verifies the systemd units in deploy/systemd with systemd-analyze and checks
# the settings the deployment guide relies on.
#
# systemd-analyze 252 "verify" works without systemd as PID 1, but it insists
# that ExecStart= binaries exist and it exits 0 on parse warnings (unknown
# keys, bad values are "ignored"). So the units are copied to a temporary
# directory with ExecStart pointed at /usr/bin/true, and any diagnostic output
# counts as a failure. A deliberately broken copy must produce a diagnostic,
# proving the check can fail.
set -u
SA=/usr/bin/systemd-analyze
SRC=${1:?usage: check_units.sh DEPLOY_SYSTEMD_DIR}
if [[ ! -x $SA ]]; then
  echo "FAIL: $SA not found (install the systemd package: scripts/install-deps.sh)" >&2
  exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0

verify() {  # verify UNIT_PATH -> 0 when clean
  local out
  out=$(cd "$(dirname "$1")" && SYSTEMD_LOG_COLOR=0 "$SA" verify --man=no "./$(basename "$1")" 2>&1)
  local rc=$?
  if [[ $rc -ne 0 || -n $out ]]; then
    echo "$out"
    return 1
  fi
  return 0
}

for unit in tessera-router.service tessera-drafter.service tessera-worker@.service; do
  if [[ ! -f $SRC/$unit ]]; then
    echo "FAIL: $SRC/$unit missing"; fail=1; continue
  fi
  grep -q '^ExecStart=/usr/local/bin/tessera-' "$SRC/$unit" \
    || { echo "FAIL: $unit: ExecStart is not /usr/local/bin/tessera-*"; fail=1; }
  name=${unit/@./@test.}
  sed 's#^ExecStart=/usr/local/bin/tessera-[a-z]*#ExecStart=/usr/bin/true#' "$SRC/$unit" > "$tmp/$name"
  if verify "$tmp/$name"; then echo "ok: systemd-analyze verify $unit"; else
    echo "FAIL: systemd-analyze verify $unit"; fail=1; fi
  for want in '^Type=notify$' '^NotifyAccess=main$' '^WatchdogSec=30$' '^Restart=on-failure$' \
      '^StartLimitIntervalSec=' '^StartLimitBurst=' '^KillSignal=SIGTERM$' \
      '^NoNewPrivileges=yes$' '^ProtectSystem=strict$' '^ProtectHome=yes$' '^PrivateTmp=yes$' \
      '^DynamicUser=no$' '^User=tessera$' '^CapabilityBoundingSet=$' \
      '^RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX' '^SystemCallFilter=@system-service$' \
      '^EnvironmentFile=/etc/tessera/'; do
    grep -q -- "$want" "$SRC/$unit" || { echo "FAIL: $unit lacks $want"; fail=1; }
  done
  stop=$(sed -n 's/^TimeoutStopSec=\([0-9]*\)$/\1/p' "$SRC/$unit")
  deadline=$(sed -n 's/^Environment=TESSERA_DRAIN_DEADLINE=\([0-9]*\)s$/\1/p' "$SRC/$unit")
  if [[ -z $stop || -z $deadline || $stop -lt $((deadline + 10)) ]]; then
    echo "FAIL: $unit: TimeoutStopSec ($stop) must be >= drain deadline ($deadline s) + grace margin"
    fail=1
  fi
  ex=$SRC/$(sed -e 's/^tessera-//' -e 's/@\?\.service$//' <<<"$unit").env.example
  [[ -f $ex ]] || { echo "FAIL: example environment file $ex missing"; fail=1; }
done

# The certificate restart path unit and its service.
for unit in tessera-cert-restart@.path tessera-cert-restart@.service; do
  [[ -f $SRC/$unit ]] || { echo "FAIL: $SRC/$unit missing"; fail=1; continue; }
  cp "$SRC/$unit" "$tmp/${unit/@./@tessera-worker\\x40test.}"
done
if verify "$tmp/tessera-cert-restart@tessera-worker\x40test.path" &&
   verify "$tmp/tessera-cert-restart@tessera-worker\x40test.service"; then
  echo "ok: systemd-analyze verify tessera-cert-restart@.path and .service"
else
  echo "FAIL: systemd-analyze verify tessera-cert-restart@"; fail=1
fi
grep -q '^ExecStart=/usr/bin/systemctl try-restart %I$' "$SRC/tessera-cert-restart@.service" ||
  { echo "FAIL: tessera-cert-restart@.service does not try-restart %I"; fail=1; }

# Router and drafter: IP and Unix sockets only.
for unit in tessera-router.service tessera-drafter.service; do
  grep -q '^RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX$' "$SRC/$unit" ||
    { echo "FAIL: $unit: RestrictAddressFamilies is not AF_INET AF_INET6 AF_UNIX"; fail=1; }
done

# The worker runs CUDA tensor-parallel ranks: the NVIDIA device groups of
# /proc/devices (driver 550+ names major 195 "nvidia" and "nvidiactl"; the
# GPU machine's driver 580 does), netlink for NCCL's getifaddrs, pinned
# memory, and the device and rank count as variables.
check_worker() {  # check_worker UNIT -> prints each failure, returns their count
  local w=$1 n=0 group pattern ok
  grep -q '^EnvironmentFile=/etc/tessera/worker-%i.env$' "$w" || { echo "FAIL: worker env file"; n=$((n + 1)); }
  grep -q '^DevicePolicy=closed$' "$w" || { echo "FAIL: worker lacks DevicePolicy=closed"; n=$((n + 1)); }
  for group in nvidia nvidiactl nvidia-uvm nvidia-caps; do
    ok=0
    # DeviceAllow=char-NAME matches /proc/devices names as a glob.
    while read -r pattern; do
      # shellcheck disable=SC2053
      [[ $group == $pattern ]] && ok=1
    done < <(sed -n 's/^DeviceAllow=char-\([^ ]*\) rwm\?$/\1/p' "$w")
    [[ $ok == 1 ]] || { echo "FAIL: worker: no DeviceAllow=char-... rw allows the device group $group"; n=$((n + 1)); }
  done
  grep -Eq '^RestrictAddressFamilies=(.* )?AF_NETLINK( |$)' "$w" ||
    { echo "FAIL: worker: RestrictAddressFamilies lacks AF_NETLINK (NCCL's getifaddrs)"; n=$((n + 1)); }
  grep -q '^LimitMEMLOCK=infinity$' "$w" || { echo "FAIL: worker lacks LimitMEMLOCK=infinity"; n=$((n + 1)); }
  grep -q -- '--device=${TESSERA_DEVICE}' "$w" || { echo "FAIL: worker: TESSERA_DEVICE does not feed --device"; n=$((n + 1)); }
  grep -q -- '--tensor_parallel_size=${TESSERA_TP}' "$w" ||
    { echo "FAIL: worker: TESSERA_TP does not feed --tensor_parallel_size"; n=$((n + 1)); }
  grep -q '^Environment=TESSERA_DEVICE=cuda$' "$w" || { echo "FAIL: worker: TESSERA_DEVICE does not default to cuda"; n=$((n + 1)); }
  return $n
}
check_worker "$SRC/tessera-worker@.service" || fail=1
# Negative control: the unit as it was (a device group drivers 550+ do not
# have, no netlink, TESSERA_EXTRA_ARGS only) must fail each check.
sed -e '/^DeviceAllow=char-nvidia\(ctl\)\? rw$/d' -e '/^DeviceAllow=char-nvidia-caps rw$/d' \
    -e 's/^RestrictAddressFamilies=.*/RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX/' \
    -e '/^LimitMEMLOCK=/d' -e '/--device=/d' -e '/--tensor_parallel_size=/d' \
    -e '/^Environment=TESSERA_DEVICE=/d' \
    "$SRC/tessera-worker@.service" > "$tmp/broken-worker.service"
out=$(check_worker "$tmp/broken-worker.service")
for want in "device group nvidia$" "device group nvidiactl" "device group nvidia-caps" "lacks AF_NETLINK" \
    "LimitMEMLOCK" "TESSERA_DEVICE does not feed" "TESSERA_TP does not feed" "does not default to cuda"; do
  grep -q -- "$want" <<<"$out" || { echo "FAIL: the worker checks missed a broken unit: no \"$want\""; fail=1; }
done
[[ $fail -eq 0 ]] && echo "ok: the worker checks reject the old unit ($(grep -c FAIL <<<"$out") failures)"

# Every variable an example env file sets must be used by its unit.
for ex in "$SRC"/*.env.example; do
  base=$(basename "$ex" .env.example)
  unit=$SRC/tessera-$base.service; [[ -f $unit ]] || unit=$SRC/tessera-$base@.service
  for var in $(sed -n 's/^#\? *\(TESSERA_[A-Z_]*\)=.*/\1/p' "$ex" | sort -u); do
    grep -Eq "\\\$\\{?$var\\}?" "$unit" || { echo "FAIL: $ex sets $var, unused by $(basename "$unit")"; fail=1; }
  done
done

# Negative control: a broken unit must be reported.
sed 's/^Type=notify$/Type=notfy/' "$tmp/tessera-router.service" > "$tmp/broken.service"
if verify "$tmp/broken.service" >/dev/null; then
  echo "FAIL: systemd-analyze verify did not report a broken unit; the check is blind"; fail=1
fi

[[ $fail -eq 0 ]] && echo "all unit checks passed"
exit $fail
