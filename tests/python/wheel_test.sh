#!/usr/bin/env bash
# The Python SDK as a user installs it: builds the wheel (client/python/build-wheel.sh), installs
# it into a fresh venv that sees Debian's python3-grpcio and python3-protobuf
# (--system-site-packages), offline, and runs the SDK's tests against that installed copy.
#
#   tests/python/wheel_test.sh DIST_DIR [UNITTEST_ARGS...]
#
# The wheel is left in DIST_DIR. The tests run from a scratch directory with neither the source
# tree nor the build tree on sys.path (PYTHONPATH holds only the tests' own reflection modules),
# so `import dispatchd` finds the installed package; this is checked before they run.
# Environment: as the python_client test, and PYTHON (default /usr/bin/python3).
set -euo pipefail
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

if (($# < 1)); then
  echo "usage: $0 DIST_DIR [UNITTEST_ARGS...]" >&2
  exit 2
fi
dist=$1
shift
python=${PYTHON:-/usr/bin/python3}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

wheel=$("$repo/client/python/build-wheel.sh" "$dist" "$python")
echo "wheel_test: built $wheel"

work=$(mktemp -d "${TMPDIR:-/tmp}/dispatchd-venv.XXXXXX")
trap 'rm -rf "$work"' EXIT
"$python" -m venv --system-site-packages "$work/venv"
venv_python=$work/venv/bin/python
# With its dependencies (no --no-deps) but no index: Debian's grpcio and protobuf must satisfy
# what the wheel declares, or this fails.
"$venv_python" -m pip install --quiet --no-index "$wheel"
"$work/venv/bin/dispatch-worker-py" --help >/dev/null

cd "$work"
"$venv_python" - "$work/venv" <<'PY'
import os, sys
import dispatchd, dispatchd.aio, dispatchd.v1.worker_service_pb2_grpc
where = os.path.realpath(dispatchd.__file__)
venv = os.path.realpath(sys.argv[1])
if not where.startswith(venv + os.sep):
    sys.exit(f"wheel_test: dispatchd imported from {where}, not the venv {venv}")
for typed in ("py.typed", "v1/job_pb2.pyi"):
    if not os.path.exists(os.path.join(os.path.dirname(where), typed)):
        sys.exit(f"wheel_test: the installed package has no {typed}")
print(f"wheel_test: dispatchd {where}")
PY
tests=$repo/client/python/tests
"$venv_python" -m unittest discover -s "$tests" -t "$tests" "$@"
