#!/usr/bin/env bash
# Installs the package deb_package.sh built, with apt-get, on this machine; starts the daemon the
# way its unit does (systemctl where systemd is PID 1, else the unit's ExecStart as its User= with
# its UMask=); checks that it serves from its packaged config (embedded PostgreSQL, health,
# a job run by the packaged dispatch-worker); stops it; then purges the package and any package
# apt installed with it, so that the machine is left as it was.
#
#   tests/deploy/deb_install.sh DEB_DIR VERSION
#
# It changes the machine, so it runs only as root with CI=true (as .ci/run does) or
# DISPATCHD_TEST_DEB_INSTALL=1, and never where dispatchd is installed or its users exist;
# otherwise it exits 77, which ctest reports as skipped.
set -euo pipefail

deb_dir=${1:?deb dir}
version=${2:?version}
test_name=deb_install
# shellcheck source=tests/deploy/deb_common.sh
source "$(dirname "$0")/deb_common.sh"
require_consent "it installs a package"
if dpkg-query -W -f='${db:Status-Status}' dispatchd 2>/dev/null | grep -qv '^not-installed$'; then
  skip "a dispatchd package is installed here already; it is left alone"
fi
for user in dispatchd dispatch-worker; do
  if getent passwd "$user" >/dev/null || getent group "$user" >/dev/null; then
    skip "the user or group $user exists already; the package's purge would delete it"
  fi
done
if [[ -e /var/lib/dispatchd || -e /etc/dispatchd ]]; then
  skip "/var/lib/dispatchd or /etc/dispatchd exists already"
fi
debs=("$deb_dir"/dispatchd_*.deb)
[[ -f ${debs[0]} ]] || fail "no package in $deb_dir (deb_package.sh builds it)"
deb=$(cd "$(dirname "${debs[0]}")" && pwd)/$(basename "${debs[0]}")
# The packaged config listens on 127.0.0.1:7411.
if (exec 3<>/dev/tcp/127.0.0.1/7411) 2>/dev/null; then
  fail "127.0.0.1:7411, the packaged config's listen address, is in use"
fi

export DEBIAN_FRONTEND=noninteractive
before=$(dpkg-query -W -f='${Package}\n' | sort)
work=$(mktemp -d)
daemon_pid=
worker_pid=
systemd=0
if [[ -d /run/systemd/system ]]; then systemd=1; fi

cleanup() {
  local rc=$?
  if ((systemd)); then
    systemctl stop 'dispatch-worker@*.service' dispatchd.service >/dev/null 2>&1 || true
  fi
  for pid in $worker_pid $daemon_pid; do
    if kill -TERM "$pid" 2>/dev/null; then wait "$pid" 2>/dev/null || true; fi
  done
  if dpkg-query -W dispatchd >/dev/null 2>&1; then
    apt-get purge -y -q dispatchd >"$work/purge.log" 2>&1 || {
      cat "$work/purge.log" >&2
      echo "deb_install: apt-get purge dispatchd failed" >&2
      rc=1
    }
  fi
  # What apt installed with the package (on a machine that had its Depends already: nothing).
  mapfile -t added < <(comm -13 <(echo "$before") <(dpkg-query -W -f='${Package}\n' | sort))
  if ((${#added[@]} > 0)); then
    echo "deb_install: purging what came with the package: ${added[*]}"
    apt-get purge -y -q "${added[@]}" >/dev/null 2>&1 || rc=1
  fi
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT

echo "deb_install: apt-get install $(basename "$deb")"
apt-get install -y -q --no-install-recommends "$deb" >"$work/install.log" 2>&1 || {
  cat "$work/install.log" >&2
  fail "apt-get install failed"
}
[[ $(dpkg-query -W -f='${Version}' dispatchd) == "${version}-1" ]] || fail "installed version"
got=$(/usr/bin/dispatchd --version)
[[ $got == "dispatchd $version" ]] || fail "/usr/bin/dispatchd --version printed \"$got\""
echo "deb_install: $got"
for user in dispatchd dispatch-worker; do
  getent passwd "$user" >/dev/null || fail "postinst did not create the user $user"
  [[ $(stat -c %U:%a "/var/lib/$user") == "$user:750" ]] ||
    fail "/var/lib/$user: $(stat -c %U:%a "/var/lib/$user"), expected $user:750"
done
dpkg-query -W -f='${Conffiles}\n' dispatchd | grep -q '^ /etc/dispatchd/dispatchd.yaml ' ||
  fail "/etc/dispatchd/dispatchd.yaml is not a conffile"

unit=/usr/lib/systemd/system/dispatchd.service
unit_value() { sed -n "s/^$1=//p" "$2" | tail -n 1; }
if ((systemd)); then
  echo "deb_install: systemd is PID 1: systemctl start dispatchd"
  systemctl start dispatchd.service || {
    journalctl -u dispatchd --no-pager -n 50 >&2 || true
    fail "systemctl start dispatchd failed"
  }
  systemctl is-enabled --quiet dispatchd.service || fail "postinst did not enable dispatchd.service"
  server=127.0.0.1:7411
else
  # The unit's ExecStart as its User=, with its UMask=, from / (no WorkingDirectory=). systemd
  # creates StateDirectory= itself; here postinst's /var/lib/dispatchd stands in for it.
  echo "deb_install: $(cat /proc/1/comm) is PID 1, not systemd: running the unit's ExecStart"
  user=$(unit_value User "$unit")
  read -r -a exec_start <<<"$(unit_value ExecStart "$unit")"
  [[ $user == dispatchd && ${exec_start[0]} == /usr/bin/dispatchd ]] ||
    fail "unexpected unit: User=$user ExecStart=${exec_start[*]}"
  ready=$work/ready
  chown dispatchd "$work"
  # setpriv execs the daemon in place, so that $daemon_pid is the daemon and gets the SIGTERM.
  (cd / && umask "$(unit_value UMask "$unit")" &&
    exec setpriv --reuid="$user" --regid="$user" --init-groups -- env HOME=/var/lib/dispatchd \
      "${exec_start[@]}" --ready-file "$ready") >"$work/daemon.log" 2>&1 &
  daemon_pid=$!
  for _ in $(seq 1200); do
    [[ -s $ready ]] && break
    kill -0 "$daemon_pid" 2>/dev/null || {
      cat "$work/daemon.log" >&2
      fail "dispatchd exited before serving"
    }
    sleep 0.1
  done
  [[ -s $ready ]] || {
    cat "$work/daemon.log" >&2
    fail "dispatchd did not serve within 120s (the unit's TimeoutStartSec)"
  }
  server=$(cat "$ready")
fi
echo "deb_install: dispatchd serves on $server"
[[ -d /var/lib/dispatchd/pg/data ]] || fail "no embedded PostgreSQL under /var/lib/dispatchd/pg"

export DISPATCHD_SERVER=$server
health=$(/usr/bin/dispatchctl health) || fail "dispatchctl health: $health (exit $?)"
[[ $health == SERVING ]] || fail "dispatchctl health printed \"$health\""
# A job of a type the packaged config declares, run by the packaged worker as its unit's user.
if ((systemd)); then
  systemctl start dispatch-worker@embed.text.service || fail "systemctl start dispatch-worker@embed.text"
else
  worker_unit=/usr/lib/systemd/system/dispatch-worker@.service
  [[ $(unit_value User "$worker_unit") == dispatch-worker ]] || fail "dispatch-worker@.service: User="
  (cd /var/lib/dispatch-worker && exec setpriv --reuid=dispatch-worker --regid=dispatch-worker \
    --init-groups -- env HOME=/var/lib/dispatch-worker /usr/bin/dispatch-worker \
    --id "$HOSTNAME-embed.text" --types embed.text) >"$work/worker.log" 2>&1 &
  worker_pid=$!
fi
result=$(/usr/bin/dispatchctl --timeout 60s run --type embed.text --payload hello-from-deb) || {
  cat "$work/daemon.log" "$work/worker.log" >&2 2>/dev/null || true
  fail "dispatchctl run failed (exit $?)"
}
[[ $result == hello-from-deb ]] || fail "the job's result is \"$result\", expected hello-from-deb"
echo "deb_install: a job ran through the packaged daemon and worker"

# Stop as systemd does (SIGTERM): a clean stop exits 0 and stops the embedded PostgreSQL.
if ((systemd)); then
  # systemd logs how the main process ended: a clean exit is "Deactivated successfully", a
  # non-zero status or a kill at TimeoutStopSec= is "Failed with result". Read only what this stop
  # logged (a persistent journal keeps earlier runs), once journald has it.
  cursor=$(journalctl -n 0 --show-cursor 2>/dev/null | sed -n 's/^-- cursor: //p')
  stop_started=$(date +%s%N)
  systemctl stop dispatch-worker@embed.text.service dispatchd.service
  stop_ms=$((($(date +%s%N) - stop_started) / 1000000))
  systemctl is-active --quiet dispatchd.service && fail "dispatchd still active after stop"
  journal=
  for _ in $(seq 50); do
    journal=$(journalctl -u dispatchd.service --no-pager -o cat ${cursor:+"--after-cursor=$cursor"})
    grep -Eq 'dispatchd.service: (Deactivated successfully|Failed with result)' <<<"$journal" && break
    sleep 0.1
  done
  grep -q 'dispatchd.service: Deactivated successfully' <<<"$journal" || {
    tail -n 30 <<<"$journal" >&2
    fail "systemctl stop dispatchd: the daemon did not exit cleanly"
  }
  echo "deb_install: systemctl stop took ${stop_ms} ms; dispatchd.service deactivated successfully"
else
  kill -TERM "$worker_pid"
  wait "$worker_pid" || fail "dispatch-worker exited $? after SIGTERM"
  worker_pid=
  kill -TERM "$daemon_pid"
  rc=0
  wait "$daemon_pid" || rc=$?
  daemon_pid=
  ((rc == 0)) || {
    cat "$work/daemon.log" >&2
    fail "dispatchd exited $rc after SIGTERM, expected 0"
  }
fi
# The embedded PostgreSQL goes with the daemon (its last processes within moments).
for _ in $(seq 100); do
  # A process that exits while find reads /proc is an error to find, not one to this test.
  left=$(find /proc -maxdepth 1 -name '[0-9]*' -user dispatchd 2>/dev/null || true)
  [[ -n $left ]] || break
  sleep 0.1
done
if [[ -n $left ]]; then
  for proc in $left; do tr '\0' ' ' <"$proc/cmdline" >&2 && echo >&2; done
  fail "processes of the user dispatchd are left 10s after the stop"
fi
echo "deb_install: stopped"

apt-get purge -y -q dispatchd >"$work/purge.log" 2>&1 || {
  cat "$work/purge.log" >&2
  fail "apt-get purge dispatchd failed"
}
for path in /usr/bin/dispatchd /usr/bin/dispatchctl /usr/bin/dispatch-worker /etc/dispatchd \
  /var/lib/dispatchd /var/lib/dispatch-worker "$unit"; do
  [[ ! -e $path ]] || fail "$path is left after apt-get purge"
done
for user in dispatchd dispatch-worker; do
  ! getent passwd "$user" >/dev/null || fail "the user $user is left after apt-get purge"
  ! getent group "$user" >/dev/null || fail "the group $user is left after apt-get purge"
done
echo "deb_install: purged; ok"
