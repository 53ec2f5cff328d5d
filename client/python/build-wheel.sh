#!/usr/bin/env bash
# Builds the Python SDK's wheel offline, as `pip wheel ./client/python` would, from a scratch copy
# of client/python and proto/ (so that setuptools' build/ and *.egg-info never go stale in the
# source tree).
#
#   client/python/build-wheel.sh OUT_DIR [PYTHON]
#
# OUT_DIR gets dispatchd-VERSION-py3-none-any.whl (any older dispatchd wheel there is removed);
# PYTHON (default /usr/bin/python3) needs pip, setuptools and wheel (Debian: python3-pip,
# python3-setuptools, python3-wheel): there is no build isolation, so nothing is downloaded.
# PROTOC and GRPC_PYTHON_PLUGIN name the generators when they are not on PATH (see setup.py).
set -euo pipefail
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

if (($# < 1 || $# > 2)); then
  echo "usage: $0 OUT_DIR [PYTHON]" >&2
  exit 2
fi
out=$1
python=${2:-/usr/bin/python3}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

scratch=$(mktemp -d "${TMPDIR:-/tmp}/dispatchd-wheel.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$scratch/client/python"
cp -R "$repo/proto" "$scratch/proto"
cp -R "$repo/client/python/dispatchd" "$repo/client/python/pyproject.toml" \
  "$repo/client/python/setup.py" "$repo/client/python/README.md" "$scratch/client/python/"
find "$scratch" -name __pycache__ -prune -exec rm -rf {} +

mkdir -p "$out"
rm -f "$out"/dispatchd-*.whl
"$python" -m pip wheel --quiet --no-build-isolation --no-deps --no-index --wheel-dir "$out" \
  "$scratch/client/python"
ls "$out"/dispatchd-*.whl
