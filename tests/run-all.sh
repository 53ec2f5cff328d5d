#!/usr/bin/env bash
# Sets up and runs the whole dispatchd test suite on a Debian 12 machine:
#   1. install the build and test dependencies (deploy/install-deps.sh, the npm packages of
#      tests/thirdparty/grpcjs, client/node and tests/browser with `npm ci`, and promtool with
#      deploy/monitoring/fetch-promtool.sh; skipped with --no-install),
#   2. build everything with warnings as errors (deploy/build.sh -DDISPATCHD_WERROR=ON),
#   3. run ctest: unit tests, then the store and e2e tests against a private PostgreSQL server that
#      ctest's `pg` fixture starts and stops by itself, and the chaos tests (`-L chaos`), each of
#      which starts and stops a PostgreSQL server of its own.
#
#   tests/run-all.sh [--no-install] [CTEST_ARGS...]
#   tests/run-all.sh -L unit                     # only the unit tests
#   tests/run-all.sh --no-install -R Dispatch    # tests whose name matches
#
# Environment: BUILD_DIR (default: build), JOBS (compile jobs, default: all cores). With CI=true
# (.ci/run) the build keeps line tables only (-g1, not -g): no debugger runs there, and full debug
# information costs about a fifth of each file's compile time. The package strips either.
# Exits with ctest's status (or the failing phase's). Prints how long each phase took.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
BUILD_DIR=${BUILD_DIR:-build}

install=1
ctest_args=()
for arg in "$@"; do
  case $arg in
    --no-install) install=0 ;;
    --help)
      sed -n '2,18p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
      exit 0
      ;;
    *) ctest_args+=("$arg") ;;
  esac
done

timings=()
finish() {
  local rc=$?
  if ((${#timings[@]} > 0)); then
    echo "run-all: phase timings:"
    printf '  %s\n' "${timings[@]}"
  fi
  if ((rc == 0)); then echo "run-all: PASSED"; else echo "run-all: FAILED (exit $rc)" >&2; fi
}
trap finish EXIT

# phase NAME COMMAND...: runs COMMAND, records its duration; returns its status.
phase() {
  local name=$1 start rc=0
  shift
  echo "run-all: === $name ==="
  start=$SECONDS
  "$@" || rc=$?
  timings+=("$(printf '%-8s %5ds%s' "$name" $((SECONDS - start)) "$( ((rc == 0)) || echo "  (exit $rc)")")")
  return "$rc"
}

if ((install)); then
  phase install bash deploy/install-deps.sh
  # The grpc-js client of tests/thirdparty and the Node worker of client/node, at the versions
  # their lock files pin.
  phase npm timeout 600 npm ci --prefix tests/thirdparty/grpcjs --no-audit --no-fund
  phase npm-node timeout 600 npm ci --prefix client/node --no-audit --no-fund
  # promtool, for the alert rules of deploy/monitoring (not the Prometheus server).
  phase promtool timeout 300 bash deploy/monitoring/fetch-promtool.sh
  # puppeteer-core for the console's browser test (tests/browser), also pinned by its lock file.
  phase npm-browser timeout 600 npm ci --prefix tests/browser --no-audit --no-fund
else
  echo "run-all: --no-install: not checking packages"
fi
# Set either way: the value stays in the tree's cache, and a tree made with CI=true gets -g back.
debug_info=-g
if [[ ${CI:-} == true ]]; then debug_info=-g1; fi
build_args=(-DDISPATCHD_WERROR=ON -DDISPATCHD_BUILD_TESTS=ON
            "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 $debug_info -DNDEBUG")
phase build env BUILD_DIR="$BUILD_DIR" bash deploy/build.sh "${build_args[@]}"
phase test ctest --test-dir "$BUILD_DIR" --output-on-failure --no-tests=error -j2 "${ctest_args[@]}"
