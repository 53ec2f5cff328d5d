#!/usr/bin/env bash
# Builds the unit and store tests with AddressSanitizer (and LeakSanitizer) and
# UndefinedBehaviorSanitizer in a build tree of their own, and runs them: `ctest -L 'unit|store'`,
# the store tests against the private PostgreSQL of the `pg` fixture. Fails on a failing test and
# on any sanitizer report, including one from a child process a test starts (dispatchctl,
# dispatch-worker) or from gtest's test listing at build time.
#
#   tests/sanitize.sh [--no-install] [CTEST_ARGS...]     e.g. tests/sanitize.sh -R Config
#
# Environment:
#   SANITIZE_BUILD_DIR  build tree, relative to the repository root (default build-asan)
#   JOBS                compile jobs (default: all cores)
# clang-14 -O0 -g1. clang builds this tree in about three quarters of g++'s time, and its UBSan
# also checks each call through a function pointer against the type of the function it reaches
# (-fsanitize=function), which g++'s does not. The tests, mostly waiting on PostgreSQL and child
# processes, barely run slower at -O0. The g++ build is the one tests/run-all.sh tests.
# Only the test executables of tests/unit and tests/store are built (and what they run), not the
# daemon: so systemd_units_verify, a `unit` test that only reads the unit files, and
# bench_ceiling_scripts, a `store` test of bench/ceiling's SQL that needs the daemon to migrate
# its database, are left out, and so is python_nvml, a `unit` test of the Python SDK's NVML
# reader: it needs the built Python package, and has no C++ of ours for the sanitizers to watch.
# gRPC, protobuf, yaml-cpp and libpqxx come uninstrumented from Debian; ASan still sees what our
# code does with their memory. Reports are written under <tree>/sanitizer-reports, then printed.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
BUILD_DIR=${SANITIZE_BUILD_DIR:-build-asan}
JOBS=${JOBS:-$(nproc)}

install=1
ctest_args=()
for arg in "$@"; do
  case $arg in
    --no-install) install=0 ;;
    --help)
      sed -n '2,23p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
      exit 0
      ;;
    *) ctest_args+=("$arg") ;;
  esac
done

start=$SECONDS
if ((install)); then bash deploy/install-deps.sh; fi
command -v clang++-14 >/dev/null || {
  echo "sanitize: clang++-14 not found; run deploy/install-deps.sh" >&2
  exit 1
}

# CMake cannot switch a tree to another compiler in place: a sanitizer tree made with g++ (as
# this script made them before) is made afresh. Any other tree there is left alone, and refused.
cache=$BUILD_DIR/CMakeCache.txt
if [[ -f $cache ]] && ! grep -q '^CMAKE_CXX_COMPILER:.*clang++-14$' "$cache"; then
  if ! grep -q '^CMAKE_CXX_FLAGS:.*-fsanitize=address' "$cache"; then
    echo "sanitize: $BUILD_DIR holds another build tree; set SANITIZE_BUILD_DIR" >&2
    exit 1
  fi
  rm -rf "${BUILD_DIR:?}"
fi

reports=$ROOT/$BUILD_DIR/sanitizer-reports
mkdir -p "$BUILD_DIR"
rm -rf "$reports"
mkdir -p "$reports"
# Every process writes its report to a file of its own (log_path), so that a report from a child
# process or a test that expects a non-zero exit is not lost; halt at the first one.
common="halt_on_error=1:print_stacktrace=1:log_path=$reports/report"
export ASAN_OPTIONS="$common:detect_leaks=1:detect_stack_use_after_return=1"
export UBSAN_OPTIONS="$common"
if [[ -f tests/lsan.supp ]]; then
  export LSAN_OPTIONS="suppressions=$ROOT/tests/lsan.supp:print_suppressions=0"
fi

finish() {
  local rc=$?
  if compgen -G "$reports/report*" >/dev/null; then
    echo "sanitize: sanitizer reports:" >&2
    for f in "$reports"/report*; do
      echo "--- $f" >&2
      cat "$f" >&2
    done
    ((rc != 0)) || rc=1
  fi
  echo "sanitize: total $((SECONDS - start))s"
  if ((rc == 0)); then echo "sanitize: PASSED"; else echo "sanitize: FAILED (exit $rc)" >&2; fi
  exit "$rc"
}
trap finish EXIT

echo "sanitize: === build ($BUILD_DIR) ==="
flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
# FMT_CONSTEVAL empty: clang 14 destroys some temporaries of a consteval call too late, which ASan
# reports as a use after scope (tests/fuzz/run.sh says more).
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_COMPILER=clang++-14 -DCMAKE_CXX_FLAGS="$flags" \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O0 -g1 -DNDEBUG -DFMT_CONSTEVAL=" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" \
  -DDISPATCHD_BUILD_TESTS=ON -DDISPATCHD_BUILD_BENCH=OFF -DDISPATCHD_TCMALLOC=OFF >/dev/null
ninja -C "$BUILD_DIR" -j "$JOBS" tests/unit/all tests/store/all
build_s=$((SECONDS - start))
echo "sanitize: build took ${build_s}s"

echo "sanitize: === test ==="
ctest --test-dir "$BUILD_DIR" -L 'unit|store' -E '^(systemd_units_verify|bench_ceiling_scripts|python_nvml)$' --output-on-failure \
  --no-tests=error -j2 "${ctest_args[@]}"
echo "sanitize: tests took $((SECONDS - start - build_s))s"
