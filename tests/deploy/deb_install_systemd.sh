#!/usr/bin/env bash
# deb_install.sh where systemd is PID 1, on a machine where it is not (a CI runner, a build
# container): boots systemd in a systemd-nspawn container whose root is a copy-on-write overlay of
# this machine's own, and runs deb_install.sh in it, so that the package is installed, started
# and stopped with systemctl, used and purged under systemd. This machine is left as it was:
# every write lands in a tmpfs that is thrown away.
#
#   tests/deploy/deb_install_systemd.sh DEB_DIR VERSION
#
# Like deb_install.sh it runs only as root with CI=true (or DISPATCHD_TEST_DEB_INSTALL=1), and it
# exits 77 (skipped) where systemd already is PID 1 (deb_install.sh covers that) or where this
# machine cannot give a container its root (no systemd-nspawn, no overlayfs).
set -euo pipefail

deb_dir=${1:?deb dir}
version=${2:?version}
test_name=deb_install_systemd
# shellcheck source=tests/deploy/deb_common.sh
source "$(dirname "$0")/deb_common.sh"
require_consent "it boots a container"
if [[ -d /run/systemd/system ]]; then
  skip "systemd is PID 1 here: deb_install runs under it already"
fi
command -v systemd-nspawn >/dev/null ||
  skip "no systemd-nspawn (package systemd-container; deploy/install-deps.sh installs it)"
deb_dir=$(cd "$deb_dir" && pwd)
scripts=$(cd "$(dirname "$0")" && pwd)

top=$(mktemp -d /tmp/dispatchd-nspawn.XXXXXX)
nspawn_pid=
leader=
cleanup() {
  local rc=$?
  if [[ -n $nspawn_pid ]] && kill -0 "$nspawn_pid" 2>/dev/null; then
    # systemd-nspawn asks the container's systemd to power off, and waits for it.
    kill -TERM "$nspawn_pid" 2>/dev/null || true
    for _ in $(seq 1 300); do kill -0 "$nspawn_pid" 2>/dev/null || break; sleep 0.1; done
    # Killing its PID 1 kills everything in the container's PID namespace.
    if [[ -n $leader ]]; then kill -KILL "$leader" 2>/dev/null || true; fi
    kill -KILL "$nspawn_pid" 2>/dev/null || true
  fi
  if [[ -n $nspawn_pid ]]; then wait "$nspawn_pid" 2>/dev/null || true; fi
  umount "$top/root" 2>/dev/null || umount -l "$top/root" 2>/dev/null || true
  umount "$top" 2>/dev/null || umount -l "$top" 2>/dev/null || true
  # Never a recursive delete through a mount that is still there (the overlay is all of /).
  if ! mountpoint -q "$top"; then rm -rf --one-file-system "$top"; fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 143' TERM INT

# The upper layer on a tmpfs of its own: overlayfs refuses an upper directory inside its lower.
mount -t tmpfs -o size=4g,mode=0700 tmpfs "$top" || skip "cannot mount a tmpfs on $top"
mkdir "$top/upper" "$top/work" "$top/root"
mount -t overlay overlay -o "lowerdir=/,upperdir=$top/upper,workdir=$top/work" "$top/root" ||
  skip "cannot mount an overlay of / (a root that is an overlay itself cannot be a lower layer)"
# A machine id of its own, so that its journal and D-Bus are its own.
systemd-id128 new >"$top/root/etc/machine-id"

# basic.target: the system is up, but none of this machine's own services (a database server, an
# SSH server) start beside it, on the network namespace it shares with this machine.
systemd-nspawn --quiet -D "$top/root" --machine="dispatchd-deb-$$" --register=no --keep-unit \
  --console=passive --bind-ro="$deb_dir" --bind-ro="$scripts" -b -- systemd.unit=basic.target \
  >"$top/nspawn.log" 2>&1 &
nspawn_pid=$!

# The container's PID 1 as this machine sees it (the child of systemd-nspawn running systemd),
# then its boot: until its bus is up systemctl cannot ask, then --wait waits for the boot to end.
# One deadline for both, well inside ctest's timeout, so that the script always cleans up itself.
state=
deadline=$((SECONDS + 90))
while ((SECONDS < deadline)) && kill -0 "$nspawn_pid" 2>/dev/null; do
  [[ -n $leader ]] || leader=$(pgrep -P "$nspawn_pid" -x systemd || true)
  if [[ -n $leader ]]; then
    state=$(timeout "$((deadline - SECONDS + 1))" nsenter -t "$leader" -a \
      systemctl is-system-running --wait 2>/dev/null || true)
    [[ -z $state || $state == offline ]] || break
  fi
  sleep 0.2
done
case $state in
  running | degraded) ;;
  "" | offline)
    cat "$top/nspawn.log" >&2 || true
    skip "systemd did not come up in a systemd-nspawn container here (its output is above)"
    ;;
  *)
    cat "$top/nspawn.log" >&2 || true
    fail "the container's system is $state"
    ;;
esac
inside() { nsenter -t "$leader" -a "$@"; }
echo "deb_install_systemd: container up: systemd $(inside systemctl --version | head -1 |
  cut -d' ' -f2) as PID 1, system $state"

rc=0
timeout 240 nsenter -t "$leader" -a env CI=true DISPATCHD_TEST_DEB_INSTALL=1 \
  PATH=/usr/sbin:/usr/bin:/sbin:/bin bash "$scripts/deb_install.sh" "$deb_dir" "$version" || rc=$?
case $rc in
  0) echo "deb_install_systemd: ok" ;;
  77) skip "deb_install.sh skipped itself in the container (see above)" ;;
  124) fail "deb_install.sh did not finish within 240 s under systemd" ;;
  *) fail "deb_install.sh failed under systemd (exit $rc)" ;;
esac
