#!/usr/bin/env bash
# The checks that hold the code to its rules, each a failure of its own:
#   format  clang-format --dry-run -Werror over every C++ file git tracks (.clang-format)
#   tidy    clang-tidy (.clang-tidy, every finding an error) over the translation units of the
#           build's compile_commands.json (the daemon, libraries, SDKs, benches and test fakes, and
#           the tests that take a lock), with clang's -Wthread-safety as errors: a member
#           ABSL_GUARDED_BY a mutex or a thread role (lib/util/thread_role.h) touched without it,
#           or a function called without the capability it requires, fails the run
#
#   tests/lint.sh [--no-install] [format|tidy]... [FILE...]   default: both, on every file
#
# With FILEs (sources, relative to the repository root), each check looks at those alone: tidy
# needs a .cc file that the build compiles.
#
# Environment:
#   BUILD_DIR  the build tree whose compile_commands.json tidy reads (default: build); it must
#              have been built, as the generated protobuf headers are read from it
#   JOBS       clang-tidy processes at once (default: all cores)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}

install=1
steps=()
only=()
for arg in "$@"; do
  case $arg in
    --no-install) install=0 ;;
    format | tidy) steps+=("$arg") ;;
    --help)
      sed -n '2,18p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
      exit 0
      ;;
    -*) echo "lint: unknown option $arg" >&2 && exit 2 ;;
    *) only+=("$arg") ;;
  esac
done
((${#steps[@]} > 0)) || steps=(format tidy)

if ((install)); then bash deploy/install-deps.sh; fi
for tool in clang-format-14 clang-tidy-14; do
  command -v "$tool" >/dev/null || {
    echo "lint: $tool not found; run deploy/install-deps.sh" >&2
    exit 1
  }
done

format() {
  echo "lint: === format ==="
  local files
  if ((${#only[@]} > 0)); then
    files=("${only[@]}")
  else
    mapfile -t files < <(git ls-files '*.cc' '*.h')
  fi
  # (Functions called as `step || rc=1` run without errexit: every failure returns by hand.)
  clang-format-14 --dry-run -Werror "${files[@]}" || {
    echo "lint: format: the files above differ from .clang-format; run clang-format-14 -i on them" >&2
    return 1
  }
  echo "lint: format: ${#files[@]} files as .clang-format has them"
}

tidy() {
  echo "lint: === tidy ($BUILD_DIR/compile_commands.json) ==="
  local db=$BUILD_DIR/compile_commands.json
  [[ -f $db ]] || {
    echo "lint: $db not found; build first (deploy/build.sh)" >&2
    return 1
  }
  # The project's own sources, not the generated protobuf code under the build tree.
  local files=("${only[@]}")
  ((${#files[@]} > 0)) || mapfile -t files < <(python3 - "$db" "$ROOT" <<'EOF'
import json, os, re, sys
db, root = sys.argv[1], sys.argv[2]
seen = set()
for entry in json.load(open(db)):
    path = os.path.normpath(os.path.join(entry["directory"], entry["file"]))
    rel = os.path.relpath(path, root)
    top = rel.split("/", 1)[0]
    if top not in ("bench", "client", "lib", "proto", "server", "tests") or rel in seen:
        continue
    # A test's own code is checked where it takes a lock or names one: the thread-safety
    # analysis has nothing else to check there, and parsing each test costs 7 s.
    if top == "tests" and not rel.startswith("tests/testing/"):
        if not re.search(r"absl::Mutex|std::mutex|ABSL_[A-Z_]*(GUARDED|LOCK|CAPABILITY)",
                         open(path).read()):
            continue
    seen.add(rel)
    print(rel)
EOF
  )
  ((${#files[@]} > 0)) || {
    echo "lint: tidy: no translation units found in $db" >&2
    return 1
  }
  local start=$SECONDS
  # Headers are checked where a translation unit of the project includes them.
  local filter="^$ROOT/(bench|client|lib|proto|server|tests)/"
  local out=$BUILD_DIR/lint-tidy
  rm -rf "$out"
  mkdir -p "$out"
  printf '%s\n' "${files[@]}" | xargs -P "$JOBS" -I{} sh -c '
    log="$0/$(echo "$1" | tr / _).log"
    if ! clang-tidy-14 -p "$2" --quiet --header-filter="$3" \
        --extra-arg=-Wthread-safety --extra-arg=-Wno-unknown-warning-option "$1" >"$log" 2>&1; then
      mv "$log" "$log.failed"
    fi' "$out" {} "$BUILD_DIR" "$filter"
  local failed
  failed=$(find "$out" -name '*.failed' | sort)
  echo "lint: tidy: ${#files[@]} files in $((SECONDS - start))s"
  if [[ -n $failed ]]; then
    for f in $failed; do
      echo "--- $(basename "$f" .log.failed)"
      if grep -qE 'error:|warning:' "$f"; then
        grep -E 'error:|warning:' -A3 "$f" | head -60
      else
        tail -20 "$f"  # clang-tidy itself failed
      fi
    done
    echo "lint: tidy: $(echo "$failed" | wc -l) files with findings" >&2
    return 1
  fi
}

rc=0
for step in "${steps[@]}"; do
  "$step" || rc=1
done
exit "$rc"
