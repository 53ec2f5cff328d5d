#!/usr/bin/env bash
# Configures and builds dispatchd with CMake and Ninja, on all cores.
#
#   deploy/build.sh [EXTRA_CMAKE_ARGS...]      e.g. deploy/build.sh -DDISPATCHD_WERROR=ON
#
# Environment:
#   BUILD_DIR      build directory, relative to the repository root (default: build)
#   BUILD_TARGETS  space-separated Ninja targets (default: everything), e.g. "dispatchd dispatchctl"
#   JOBS           parallel compile jobs (default: the number of cores)
#
# Idempotent: a second run reconfigures in place and rebuilds only what changed. Outputs:
# $BUILD_DIR/server/daemon/dispatchd, $BUILD_DIR/client/cpp/dispatchctl and
# $BUILD_DIR/client/cpp/dispatch-worker.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}

die() {
  echo "build: error: $*" >&2
  exit 1
}

for tool in cmake ninja; do
  command -v "$tool" >/dev/null 2>&1 || die "$tool not found; run deploy/install-deps.sh first"
done

# A build directory made with another generator cannot be switched to Ninja in place.
if [[ -f $BUILD_DIR/CMakeCache.txt ]]; then
  generator=$(sed -n 's/^CMAKE_GENERATOR:INTERNAL=//p' "$BUILD_DIR/CMakeCache.txt")
  if [[ -n $generator && $generator != Ninja ]]; then
    die "$BUILD_DIR was configured with the \"$generator\" generator; remove it or set BUILD_DIR"
  fi
fi

cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@"
read -r -a targets <<<"${BUILD_TARGETS:-}"
ninja -C "$BUILD_DIR" -j "$JOBS" "${targets[@]}"
