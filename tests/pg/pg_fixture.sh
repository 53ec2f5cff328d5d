#!/usr/bin/env bash
# Starts and stops the private PostgreSQL 15 server that the store and e2e tests share: one server
# per ctest run (the `pg` fixture), on a free 127.0.0.1 port, run by an unprivileged user, with
# durability switched off (fsync, synchronous_commit) because the data is thrown away.
#
#   pg_fixture.sh start STATE_DIR   writes STATE_DIR/url, datadir, user, tmpdir, port
#   pg_fixture.sh stop STATE_DIR    stops that server and removes its temporary directory
#   pg_fixture.sh restart STATE_DIR restarts that server (fast shutdown: sessions are cut) on the
#                                   same port and data, and returns once it accepts connections
#
# The data lives in a fresh `mktemp -d /tmp/dispatchd-test-pg.XXXXXX` directory rather than under
# the build tree, which may sit where the server's user cannot enter (e.g. /root). A server that a
# previous, interrupted run recorded in STATE_DIR is stopped before a new one starts.
# Environment: DISPATCHD_PG_BIN overrides the server binaries' directory; DISPATCHD_PG_DURABLE=1
# keeps PostgreSQL's durable defaults (fsync, synchronous_commit, full_page_writes on), as a
# production server runs, for benchmarks; DISPATCHD_PG_OPTIONS adds server options (`-c name=value`
# ...), e.g. the libraries a profile loads; DISPATCHD_PG_LOCALE=LOCALE makes the server's
# databases sort and classify text by LOCALE (e.g. en_US.UTF-8, as many production servers are
# set up) instead of "C".
set -euo pipefail

PG_BIN=${DISPATCHD_PG_BIN:-/usr/lib/postgresql/15/bin}

die() {
  echo "pg_fixture: $*" >&2
  exit 1
}

usage() { die "usage: $0 start|stop|restart STATE_DIR"; }

[[ $# -eq 2 ]] || usage
cmd=$1
state=$2

# Runs "$@" as $run_user (PostgreSQL refuses to run as root), from a directory that user can enter.
run_as() {
  local dir=$1
  shift
  if [[ $run_user == "$(id -un)" ]]; then
    (cd "$dir" && "$@")
  else
    (cd "$dir" && runuser -u "$run_user" -- "$@")
  fi
}

pick_user() {
  if [[ $(id -u) -ne 0 ]]; then
    id -un
  elif id -u postgres >/dev/null 2>&1; then
    echo postgres
  elif id -u nobody >/dev/null 2>&1; then
    echo nobody
  else
    die "running as root and neither 'postgres' nor 'nobody' exists to run the server"
  fi
}

# A TCP port on 127.0.0.1 that nothing listens on right now.
free_port() {
  if command -v python3 >/dev/null 2>&1; then
    python3 -c 'import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])' && return 0
  fi
  local port tries
  for ((tries = 0; tries < 200; tries++)); do
    port=$((20000 + RANDOM % 30000))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      echo "$port"
      return 0
    fi
  done
  return 1
}

# Stops the server recorded in $state (if any) and removes its temporary directory.
stop_recorded() {
  local datadir="" tmpdir="" user=""
  [[ -f $state/datadir ]] && datadir=$(<"$state/datadir")
  [[ -f $state/tmpdir ]] && tmpdir=$(<"$state/tmpdir")
  [[ -f $state/user ]] && user=$(<"$state/user")
  if [[ -n $datadir && -f $datadir/postmaster.pid ]]; then
    local run_user=${user:-$(pick_user)}
    if run_as "${tmpdir:-/}" "$PG_BIN/pg_ctl" -D "$datadir" status >/dev/null 2>&1; then
      if ! run_as "${tmpdir:-/}" "$PG_BIN/pg_ctl" -D "$datadir" -m fast -w -t 60 stop >/dev/null; then
        echo "pg_fixture: fast shutdown failed for $datadir, trying immediate" >&2
        run_as "${tmpdir:-/}" "$PG_BIN/pg_ctl" -D "$datadir" -m immediate -w -t 30 stop >/dev/null ||
          die "cannot stop the PostgreSQL server in $datadir"
      fi
    fi
  fi
  if [[ -n $tmpdir && $tmpdir == /tmp/dispatchd-test-pg.* && -d $tmpdir ]]; then
    rm -rf -- "$tmpdir"
  fi
  rm -f -- "$state/url" "$state/datadir" "$state/user" "$state/tmpdir" "$state/port"
}

start() {
  mkdir -p "$state" || die "cannot create state directory $state"
  stop_recorded

  run_user=$(pick_user)
  [[ -x $PG_BIN/initdb && -x $PG_BIN/pg_ctl ]] ||
    die "PostgreSQL 15 server binaries not found in $PG_BIN (install postgresql-15)"

  local tmpdir datadir log port attempt
  tmpdir=$(mktemp -d /tmp/dispatchd-test-pg.XXXXXX) || die "mktemp failed"
  # Record the directory at once, so that `stop` cleans up after a start that fails midway.
  echo "$tmpdir" >"$state/tmpdir"
  datadir=$tmpdir/data
  log=$tmpdir/postgres.log
  chmod 0755 "$tmpdir"
  if [[ $run_user != "$(id -un)" ]]; then
    chown "$run_user" "$tmpdir" || die "cannot chown $tmpdir to $run_user"
  fi

  local locale=--no-locale
  [[ -n ${DISPATCHD_PG_LOCALE:-} ]] && locale=--locale=$DISPATCHD_PG_LOCALE
  if ! run_as "$tmpdir" "$PG_BIN/initdb" -D "$datadir" -U dispatchd --auth=trust -E UTF8 \
    "$locale" --no-sync >"$tmpdir/initdb.log" 2>&1; then
    tail -n 20 "$tmpdir/initdb.log" >&2 || true
    die "initdb failed (log: $tmpdir/initdb.log)"
  fi
  echo "$datadir" >"$state/datadir"
  echo "$run_user" >"$state/user"

  local durability="-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
  [[ ${DISPATCHD_PG_DURABLE:-0} == 1 ]] && durability=""
  # The port is free when picked but may be taken before the server binds it: retry on a new one.
  for ((attempt = 1; attempt <= 5; attempt++)); do
    port=$(free_port) || die "no free TCP port found on 127.0.0.1"
    if run_as "$tmpdir" "$PG_BIN/pg_ctl" -D "$datadir" -l "$log" -w -t 60 \
      -o "-c listen_addresses=127.0.0.1 -p $port -c unix_socket_directories=$datadir $durability -c max_connections=300 -c shared_buffers=128MB ${DISPATCHD_PG_OPTIONS:-}" \
      start >/dev/null; then
      echo "$port" >"$state/port"
      echo "postgresql://dispatchd@127.0.0.1:$port/postgres" >"$state/url.tmp"
      mv -f "$state/url.tmp" "$state/url"
      echo "pg_fixture: PostgreSQL listening on 127.0.0.1:$port (data $datadir, user $run_user)"
      return 0
    fi
    if ! grep -q "Address already in use" "$log" 2>/dev/null; then
      break
    fi
    echo "pg_fixture: port $port was taken, trying another" >&2
  done
  echo "pg_fixture: last lines of $log:" >&2
  tail -n 30 "$log" >&2 || true
  die "PostgreSQL failed to start"
}

# Restarts the server recorded in $state in place: `pg_ctl restart` reuses the options it was
# started with (port included), so clients reconnect to the same URL.
restart() {
  local datadir="" tmpdir="" user="" port="" tries
  [[ -f $state/datadir ]] && datadir=$(<"$state/datadir")
  [[ -f $state/tmpdir ]] && tmpdir=$(<"$state/tmpdir")
  [[ -f $state/user ]] && user=$(<"$state/user")
  [[ -f $state/port ]] && port=$(<"$state/port")
  [[ -n $datadir && -n $tmpdir && -n $port ]] || die "no server recorded in $state"
  run_user=${user:-$(pick_user)}
  if ! run_as "$tmpdir" "$PG_BIN/pg_ctl" -D "$datadir" -l "$tmpdir/postgres.log" -m fast -w \
    -t 60 restart >/dev/null; then
    tail -n 30 "$tmpdir/postgres.log" >&2 || true
    die "PostgreSQL failed to restart (data $datadir)"
  fi
  # `pg_ctl -w` returns once the server is up; also make sure TCP connections are accepted.
  for ((tries = 0; tries < 100; tries++)); do
    if run_as "$tmpdir" "$PG_BIN/pg_isready" -q -h 127.0.0.1 -p "$port" -U dispatchd -d postgres; then
      echo "pg_fixture: PostgreSQL restarted on 127.0.0.1:$port"
      return 0
    fi
    sleep 0.1
  done
  die "PostgreSQL on 127.0.0.1:$port does not accept connections after its restart"
}

case $cmd in
  start) start ;;
  restart) restart ;;
  stop)
    stop_recorded
    echo "pg_fixture: stopped"
    ;;
  *) usage ;;
esac
