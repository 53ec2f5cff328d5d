#!/usr/bin/env bash
# Runs the README's first command the way a new user would, in demo-only mode, on an existing
# build: it must start dispatchd on its embedded PostgreSQL, a reference worker, run the demo job,
# print its result and stop everything, exiting 0.
#   tests/e2e/quickstart_test.sh REPO_ROOT BUILD_DIR
set -euo pipefail
root=$1
build=$2
state=$(mktemp -d /tmp/dqs.XXXXXX)
chmod 755 "$state"
trap 'rm -rf "$state"' EXIT
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
out=$(cd "$root" && STATE=$state ./deploy/quickstart.sh --no-install --demo-only --port "$port" \
  --build-dir "$build" 2>&1) || { echo "$out"; echo "quickstart failed"; exit 1; }
echo "$out"
grep -q 'hello from dispatchd' <<<"$out" || { echo "demo result missing"; exit 1; }
grep -q 'SUCCEEDED' <<<"$out" || { echo "demo job status missing"; exit 1; }
# Nothing is left running.
if pgrep -f -- "--config $state/dispatchd.yaml" >/dev/null; then echo "dispatchd left running"; exit 1; fi
if pgrep -f -- "postgres -D $state" >/dev/null; then echo "PostgreSQL left running"; exit 1; fi
echo "quickstart demo: ok"
