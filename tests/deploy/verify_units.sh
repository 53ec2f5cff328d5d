#!/usr/bin/env bash
# Checks deploy/'s systemd units with `systemd-analyze verify`: syntax, known directives and values,
# and that ExecStart's program exists. The units name the installed paths
# (/usr/local/bin/dispatchd, /usr/local/bin/dispatch-worker); this build's binaries stand in for
# them, in copies of the units, so the check needs no installation and no running systemd.
#
#   tests/deploy/verify_units.sh SOURCE_DIR BUILD_DIR
#
# Fails when systemd-analyze is missing (deploy/install-deps.sh installs it), exits non-zero, or
# prints anything about the units; and when the daemon unit's TimeoutStopSec does not leave 20s
# above the stop_grace of config/dispatchd.yaml (a stop that waits out its grace is not killed).
set -euo pipefail

src=${1:?source dir}
build=$(cd "${2:?build dir}" && pwd)
command -v systemd-analyze >/dev/null || {
  echo "verify_units: systemd-analyze not found (apt-get install systemd)" >&2
  exit 1
}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

sed "s|/usr/local/bin/dispatchd|$build/server/daemon/dispatchd|g" \
  "$src/deploy/dispatchd.service" >"$work/dispatchd.service"
sed "s|/usr/local/bin/dispatch-worker|$build/client/cpp/dispatch-worker|g" \
  "$src/deploy/dispatch-worker@.service" >"$work/dispatch-worker@.service"
if grep -h '^ExecStart=/usr/local' "$work"/*.service; then
  echo "verify_units: an ExecStart path was not replaced" >&2
  exit 1
fi

fail=0
# TimeoutStopSec and stop_grace, both in whole seconds ("60", "60s", "1m", "30s").
seconds() {
  case $1 in
    *m) echo $((${1%m} * 60)) ;;
    *s) echo "${1%s}" ;;
    *) echo "$1" ;;
  esac
}
stop_timeout=$(sed -n 's/^TimeoutStopSec=//p' "$src/deploy/dispatchd.service")
grace=$(sed -n 's/^stop_grace: *//p' "$src/config/dispatchd.yaml")
if ! [[ $(seconds "$stop_timeout") =~ ^[0-9]+$ && $(seconds "$grace") =~ ^[0-9]+$ ]]; then
  echo "verify_units: cannot read TimeoutStopSec ($stop_timeout) or stop_grace ($grace)" >&2
  fail=1
elif (($(seconds "$stop_timeout") < $(seconds "$grace") + 20)); then
  echo "verify_units: TimeoutStopSec=$stop_timeout leaves less than 20s above stop_grace $grace" >&2
  fail=1
else
  echo "verify_units: TimeoutStopSec=$stop_timeout covers stop_grace $grace: ok"
fi
# A template is verified through an instance of it.
for unit in dispatchd.service dispatch-worker@gpu0.service; do
  out=$(cd "$work" && SYSTEMD_LOG_LEVEL=notice systemd-analyze verify "$work/$unit" 2>&1) || {
    echo "verify_units: $unit: systemd-analyze verify failed:" >&2
    echo "$out" >&2
    fail=1
    continue
  }
  if grep -E "dispatchd\.service|dispatch-worker@" <<<"$out"; then
    echo "verify_units: $unit: systemd-analyze verify reported the lines above" >&2
    fail=1
    continue
  fi
  echo "verify_units: $unit: ok"
done
exit "$fail"
