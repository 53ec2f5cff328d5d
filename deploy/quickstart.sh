#!/usr/bin/env bash
# Sets up and runs dispatchd on this machine, from the root of a fresh clone on Debian 12:
#   1. installs the Debian packages (deploy/install-deps.sh; needs root or sudo),
#   2. builds dispatchd, dispatchctl and dispatch-worker (deploy/build.sh),
#   3. writes a config to $STATE/dispatchd.yaml and starts dispatchd with an embedded PostgreSQL
#      under $STATE/pg,
#   4. starts one reference worker for the `echo` type (`dispatch-worker --exec cat`),
#   5. runs a demo job with `dispatchctl run` and shows it with `dispatchctl status`,
#   6. keeps the daemon and the worker running until Ctrl-C, then stops both cleanly.
#
#   deploy/quickstart.sh [--no-install] [--demo-only] [--port N] [--build-dir DIR]
#
#   --no-install     do not check or install the Debian packages
#   --demo-only      stop everything and exit 0 after the demo job
#   --port N         gRPC port on 127.0.0.1 (default 7411)
#   --build-dir DIR  build directory (default: $BUILD_DIR or build)
#
# Environment: STATE, the state directory (default: .quickstart in the repository; as root,
# /var/tmp/dispatchd-quickstart, which the `postgres` user running the embedded server can reach).
# Exits non-zero with a message on any failure.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

READY_TIMEOUT=120  # seconds; the first start runs initdb
DEMO_TIMEOUT=60s
STOP_TIMEOUT=30    # seconds per process before SIGKILL

say() { echo "quickstart: $*"; }
die() {
  echo "quickstart: error: $*" >&2
  exit 1
}
usage() {
  sed -n '2,20p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
}

install=1
demo_only=0
port=7411
build_dir=${BUILD_DIR:-build}
while (($# > 0)); do
  case $1 in
    --no-install) install=0 ;;
    --demo-only) demo_only=1 ;;
    --port)
      (($# >= 2)) || die "--port needs a value"
      port=$2
      shift
      ;;
    --port=*) port=${1#--port=} ;;
    --build-dir)
      (($# >= 2)) || die "--build-dir needs a value"
      build_dir=$2
      shift
      ;;
    --build-dir=*) build_dir=${1#--build-dir=} ;;
    -h | --help)
      usage
      exit 0
      ;;
    *)
      usage >&2
      die "unknown argument: $1"
      ;;
  esac
  shift
done
if ! [[ $port =~ ^[0-9]{1,5}$ ]] || ((10#$port < 1 || 10#$port > 65535)); then
  die "--port: want 1-65535, got \"$port\""
fi
port=$((10#$port))
[[ $build_dir == /* ]] || build_dir=$ROOT/$build_dir

if [[ $(id -u) -eq 0 ]]; then
  STATE=${STATE:-/var/tmp/dispatchd-quickstart}
else
  STATE=${STATE:-$ROOT/.quickstart}
fi
[[ $STATE == /* ]] || STATE=$PWD/$STATE
# PostgreSQL's unix socket lives at $STATE/pg/run/.s.PGSQL.5432, which must fit in 107 bytes.
((${#STATE} <= 80)) || die "state directory path too long for PostgreSQL's unix socket: $STATE" \
  "(${#STATE} characters, at most 80); set STATE to a shorter path, e.g. STATE=/var/tmp/dq"

DAEMON=$build_dir/server/daemon/dispatchd
CTL=$build_dir/client/cpp/dispatchctl
WORKER=$build_dir/client/cpp/dispatch-worker
CONFIG=$STATE/dispatchd.yaml
READY=$STATE/ready
DAEMON_LOG=$STATE/dispatchd.log
WORKER_LOG=$STATE/worker-echo.log
ADDR=127.0.0.1:$port

daemon_pid=""
worker_pid=""

# stop PID NAME: SIGTERM, wait up to STOP_TIMEOUT seconds, then SIGKILL. Returns the exit status.
stop() {
  local pid=$1 name=$2 i rc=0
  [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < STOP_TIMEOUT * 10; i++)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$pid" 2>/dev/null; then
    echo "quickstart: $name did not stop within ${STOP_TIMEOUT}s; killing it" >&2
    kill -KILL "$pid" 2>/dev/null || true
  fi
  wait "$pid" 2>/dev/null || rc=$?
  return "$rc"
}

cleanup() {
  local rc=$? wrc=0 drc=0
  trap - EXIT INT TERM HUP
  if [[ -n $worker_pid || -n $daemon_pid ]]; then
    say "stopping the worker and the daemon"
    stop "$worker_pid" dispatch-worker || wrc=$?
    stop "$daemon_pid" dispatchd || drc=$?
    rm -f "$STATE/dispatchd.pid" "$STATE/worker-echo.pid"
    ((wrc == 0)) || echo "quickstart: dispatch-worker exited with status $wrc" >&2
    ((drc == 0)) || echo "quickstart: dispatchd exited with status $drc (log: $DAEMON_LOG)" >&2
    if ((rc == 0 && (wrc != 0 || drc != 0))); then rc=1; fi
    ((rc != 0)) || say "stopped"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'echo; exit 0' INT TERM HUP

log_tail() {
  echo "---- last lines of $1 ----" >&2
  tail -n 40 "$1" >&2 2>/dev/null || true
  echo "----" >&2
}

# A quickstart that was killed may have left its daemon or worker running: stop them.
stop_leftover() {
  local pidfile=$1 comm=$2 pid
  [[ -f $pidfile ]] || return 0
  pid=$(<"$pidfile")
  if [[ $pid =~ ^[0-9]+$ ]] && [[ $(cat "/proc/$pid/comm" 2>/dev/null) == "$comm" ]]; then
    say "stopping $comm (pid $pid) left running by an earlier quickstart"
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < STOP_TIMEOUT * 10; i++)); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$pidfile"
}

# --- 1. packages, 2. build ------------------------------------------------------------------

if ((install)); then
  bash deploy/install-deps.sh || die "installing the Debian packages failed"
fi
say "building dispatchd, dispatchctl and dispatch-worker in $build_dir"
BUILD_DIR=$build_dir BUILD_TARGETS="dispatchd dispatchctl dispatch-worker" bash deploy/build.sh ||
  die "the build failed"
for bin in "$DAEMON" "$CTL" "$WORKER"; do
  [[ -x $bin ]] || die "$bin was not built"
done
command -v python3 >/dev/null 2>&1 || die "python3 not found (it reads dispatchctl's JSON output)"
command -v setsid >/dev/null 2>&1 || die "setsid not found (util-linux)"

# --- 3. config and daemon ---------------------------------------------------------------------

if [[ $(id -u) -eq 0 ]] && ! id -u postgres >/dev/null 2>&1; then
  die "running as root, the embedded PostgreSQL runs as the 'postgres' user, which does not" \
    "exist; install postgresql-15 (deploy/install-deps.sh)"
fi
mkdir -p "$STATE" || die "cannot create the state directory $STATE"
stop_leftover "$STATE/worker-echo.pid" dispatch-worker
stop_leftover "$STATE/dispatchd.pid" dispatchd
if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
  die "something already listens on $ADDR (another dispatchd?); pick another port with --port N"
fi

cat >"$CONFIG" <<YAML
# dispatchd config written by deploy/quickstart.sh (rewritten on each run).
# Every key is described in docs/configuration.md; config/dispatchd.yaml is a production example.
listen: $ADDR
# Prometheus metrics on any free port: the daemon's log says which (metrics: serving http://...).
metrics:
  listen: 127.0.0.1:0
state_dir: $STATE
log_level: info
postgres:
  # Empty: the daemon runs its own PostgreSQL under state_dir/pg (unix socket only).
  url: ""
types:
  # The demo worker serves this one: the result is the payload.
  - name: echo
    timeout: 30s
  # For trying a simulated GPU worker: dispatch-worker --types demo.sleep --simulate ...
  - name: demo.sleep
    max_concurrency: 4
    timeout: 2m
    retry_backoff: 2s
YAML

[[ -f $DAEMON_LOG ]] && mv -f "$DAEMON_LOG" "$DAEMON_LOG.prev"
rm -f "$READY"
say "starting dispatchd on $ADDR (state: $STATE, log: $DAEMON_LOG)"
# setsid: Ctrl-C reaches this script only; it then stops the daemon and worker in order.
setsid "$DAEMON" --config "$CONFIG" --ready-file "$READY" >"$DAEMON_LOG" 2>&1 </dev/null &
daemon_pid=$!
echo "$daemon_pid" >"$STATE/dispatchd.pid"

for ((i = 0; i < READY_TIMEOUT * 10; i++)); do
  [[ -s $READY ]] && break
  if ! kill -0 "$daemon_pid" 2>/dev/null; then
    rc=0
    wait "$daemon_pid" || rc=$?
    daemon_pid=""
    log_tail "$DAEMON_LOG"
    die "dispatchd exited with status $rc before it was ready (log: $DAEMON_LOG)"
  fi
  sleep 0.1
done
if [[ ! -s $READY ]]; then
  log_tail "$DAEMON_LOG"
  die "dispatchd was not ready within ${READY_TIMEOUT}s (log: $DAEMON_LOG)"
fi
read -r ADDR <"$READY"
say "dispatchd is serving on $ADDR"

# --- 4. worker ----------------------------------------------------------------------------------

say "starting a reference worker for type echo (log: $WORKER_LOG)"
setsid "$WORKER" --server "$ADDR" --id quickstart-echo --types echo --slots 4 --exec cat \
  >"$WORKER_LOG" 2>&1 </dev/null &
worker_pid=$!
echo "$worker_pid" >"$STATE/worker-echo.pid"

# --- 5. demo job --------------------------------------------------------------------------------

say "running a demo job: dispatchctl run --type echo --payload 'hello from dispatchd'"
rc=0
job_json=$("$CTL" --server "$ADDR" --json --timeout "$DEMO_TIMEOUT" \
  run --type echo --payload 'hello from dispatchd') || rc=$?
if ((rc != 0)); then
  kill -0 "$worker_pid" 2>/dev/null || log_tail "$WORKER_LOG"
  [[ -z $job_json ]] || echo "$job_json" >&2
  die "the demo job did not succeed (dispatchctl exit $rc; logs: $DAEMON_LOG, $WORKER_LOG)"
fi
# The job as JSON: its id, and its result (base64, as JSON encodes bytes).
job_id=$(python3 -c 'import json, sys; print(json.load(sys.stdin)["id"])' <<<"$job_json") ||
  die "cannot read the job id from dispatchctl's output: $job_json"
result=$(python3 -c 'import base64, json, sys
print(base64.b64decode(json.load(sys.stdin).get("result", "")).decode("utf-8", "replace"))' \
  <<<"$job_json") || die "cannot read the result from dispatchctl's output: $job_json"
echo
echo "Job $job_id succeeded. Its result:"
echo "  $result"
echo
echo "\$ dispatchctl status $job_id"
"$CTL" --server "$ADDR" status "$job_id" || die "dispatchctl status failed"
echo

if ((demo_only)); then
  say "demo done (--demo-only)"
  exit 0
fi

# --- 6. what now --------------------------------------------------------------------------------

ctl_rel=${CTL#"$ROOT"/}
worker_rel=${WORKER#"$ROOT"/}
cat <<TEXT
dispatchd is running on $ADDR with an embedded PostgreSQL and one echo worker.
Try, in another terminal (from $ROOT):

  export DISPATCHD_SERVER=$ADDR
  $ctl_rel run --type echo --payload hi          # submit, wait, print the result
  $ctl_rel submit --type demo.sleep --payload x  # queue a job, print its id
  $ctl_rel watch JOB_ID                          # follow its state changes
  $ctl_rel status JOB_ID                         # or cancel JOB_ID
  $ctl_rel stats                                 # job counts per type and state
  $ctl_rel workers                               # connected workers
  $worker_rel --types demo.sleep --slots 2 --simulate '90%:1s-3s,10%:10s-20s'
                                                 # a simulated GPU worker for demo.sleep jobs

Config: $CONFIG
Logs:   $DAEMON_LOG, $WORKER_LOG, and PostgreSQL's in $STATE/pg/server.log
Docs:   README.md, docs/api.md, docs/operations.md

Press Ctrl-C to stop the daemon and the worker.
TEXT

# Wait for Ctrl-C (the INT trap exits, and cleanup stops both) or for either process to end.
rc=0
wait -n "$daemon_pid" "$worker_pid" || rc=$?
if ! kill -0 "$daemon_pid" 2>/dev/null; then
  daemon_pid=""
  log_tail "$DAEMON_LOG"
  die "dispatchd exited unexpectedly (status $rc)"
fi
worker_pid=""
log_tail "$WORKER_LOG"
die "the worker exited unexpectedly (status $rc)"
