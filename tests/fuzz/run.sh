#!/usr/bin/env bash
# Builds the libFuzzer targets (clang-14, ASan + UBSan, a build tree of their own) and runs each
# for a bounded time on its committed seed corpus (tests/fuzz/corpus/<target>, read only) plus a
# scratch corpus of the inputs it finds. Fails if any target crashes, leaks, hangs, runs out of
# memory or trips a sanitizer, and prints where the input that did it was kept.
#
#   tests/fuzz/run.sh [--no-install] [TARGET...]     default: every target
#
# Environment:
#   FUZZ_SECONDS    seconds per target (default 60)
#   FUZZ_BUILD_DIR  build tree, relative to the repository root (default build-fuzz); each target
#                   keeps its scratch corpus, log and failing inputs in <tree>/fuzz-out/<target>
#   JOBS            compile jobs (default: all cores)
# The targets run at the same time, one per core. Needs the packages of deploy/install-deps.sh
# (which it runs unless --no-install) and installs nothing else.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
BUILD_DIR=${FUZZ_BUILD_DIR:-build-fuzz}
SECONDS_PER_TARGET=${FUZZ_SECONDS:-60}
JOBS=${JOBS:-$(nproc)}
ALL_TARGETS=(fuzz_submit_spec fuzz_config fuzz_token_file fuzz_worker_stream)

install=1
targets=()
for arg in "$@"; do
  case $arg in
    --no-install) install=0 ;;
    --help)
      sed -n '2,16p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
      exit 0
      ;;
    -*) echo "fuzz: unknown option $arg" >&2 && exit 2 ;;
    *) targets+=("$arg") ;;
  esac
done
((${#targets[@]} > 0)) || targets=("${ALL_TARGETS[@]}")

start=$SECONDS
if ((install)); then bash deploy/install-deps.sh; fi
for tool in clang++-14 cmake ninja; do
  command -v "$tool" >/dev/null || {
    echo "fuzz: $tool not found; run deploy/install-deps.sh" >&2
    exit 1
  }
done

echo "fuzz: === build ($BUILD_DIR) ==="
# Only what the targets link: no tests, benchmarks or daemon. -O1 and line tables, as OSS-Fuzz
# builds, with the standard library's bounds checks on.
#
# FMT_CONSTEVAL empty: fmt checks format strings at run time instead of in a consteval
# constructor. clang 14 destroys the temporaries of a full-expression that holds an immediate
# (consteval) call at the end of the enclosing block instead: for `Log(...)->info("...", ...)` in
# one case of a switch, the logger's shared_ptr is destroyed on every path out of the switch,
# constructed or not (ASan: stack-use-after-scope in ~shared_ptr; found by fuzz_worker_stream in
# Dispatcher::WorkerMessage). g++ builds are not affected.
CC=clang-14 CXX=clang++-14 cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only -D_GLIBCXX_ASSERTIONS -DFMT_CONSTEVAL=" \
  -DDISPATCHD_FUZZ=ON -DDISPATCHD_BUILD_TESTS=OFF -DDISPATCHD_BUILD_BENCH=OFF \
  -DDISPATCHD_TCMALLOC=OFF >/dev/null
ninja -C "$BUILD_DIR" -j "$JOBS" "${targets[@]}"
echo "fuzz: build took $((SECONDS - start))s"

# A report stops the run at once, with a symbolized stack (file:line).
symbolizer=$(command -v llvm-symbolizer-14 || true)
sym_opt=${symbolizer:+:external_symbolizer_path=$symbolizer}
export ASAN_OPTIONS="halt_on_error=1:detect_leaks=1$sym_opt${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1$sym_opt${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"

echo "fuzz: === run: ${targets[*]}, ${SECONDS_PER_TARGET}s each ==="
pids=()
for target in "${targets[@]}"; do
  out=$BUILD_DIR/fuzz-out/$target
  mkdir -p "$out/corpus"
  rm -f "$out"/crash-* "$out"/leak-* "$out"/timeout-* "$out"/oom-* "$out/fuzz.log"
  args=(-max_total_time="$SECONDS_PER_TARGET" -print_final_stats=1 -detect_leaks=1 -timeout=25
        -rss_limit_mb=2048 -artifact_prefix="$out/")
  if [[ -f tests/fuzz/$target.dict ]]; then args+=(-dict="tests/fuzz/$target.dict"); fi
  # New inputs go to the first directory only: the committed seeds are read, never written.
  timeout --kill-after=30 $((SECONDS_PER_TARGET + 300)) \
    "$BUILD_DIR/tests/fuzz/$target" "${args[@]}" "$out/corpus" "tests/fuzz/corpus/$target" \
    >"$out/fuzz.log" 2>&1 &
  pids+=($!)
done

failed=0
for i in "${!targets[@]}"; do
  target=${targets[$i]}
  out=$BUILD_DIR/fuzz-out/$target
  status=0
  wait "${pids[$i]}" || status=$?
  # libFuzzer's final stats (-print_final_stats=1).
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$out/fuzz.log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$out/fuzz.log" | tail -1)
  grep -E '^(Done [0-9]+ runs|stat::)' "$out/fuzz.log" | sed "s|^|fuzz: $target: |" || true
  corpus=$(find "$out/corpus" -type f | wc -l)
  # Belt and braces: a sanitizer report fails the target even if the exit status did not say so.
  if grep -qE '^==[0-9]+==ERROR: |^SUMMARY: [A-Za-z]+Sanitizer|runtime error: ' "$out/fuzz.log"; then
    ((status != 0)) || status=1
  fi
  if ((status == 0)); then
    echo "fuzz: $target: ok: ${runs:-?} runs (${rate:-?}/s), scratch corpus $corpus inputs"
    continue
  fi
  failed=1
  echo "fuzz: $target: FAILED (exit $status) after ${runs:-?} runs; the end of $out/fuzz.log:" >&2
  tail -n 60 "$out/fuzz.log" | grep -v '^#\|^"' >&2 || true
  for input in "$out"/crash-* "$out"/leak-* "$out"/timeout-* "$out"/oom-*; do
    [[ -e $input ]] || continue
    echo "fuzz: $target: failing input kept at $input" >&2
    echo "fuzz: reproduce with: $BUILD_DIR/tests/fuzz/$target $input" >&2
  done
done
echo "fuzz: total $((SECONDS - start))s"
if ((failed)); then
  echo "fuzz: FAILED" >&2
  exit 1
fi
echo "fuzz: PASSED"
