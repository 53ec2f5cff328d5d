#!/usr/bin/env bash
# Prints the chaos suite's table (one row per fault) from the last ctest run in BUILD_DIR:
#
#   ctest --test-dir build -L chaos && bash tests/chaos/report.sh build
#
# Each row: jobs accepted, jobs lost, duplicate completions and jobs started twice at one attempt
# (all three must be 0), and the seconds the daemon took to settle every job the fault caught.
set -euo pipefail
build=${1:-build}
log=$build/Testing/Temporary/LastTest.log
[[ -f $log ]] || { echo "report: no ctest log at $log" >&2; exit 1; }
rows=$(grep -h '^chaos | fault=' "$log" | sort -u || true)
if [[ -z $rows ]]; then
  echo "report: the last ctest run in $build printed no chaos rows (run ctest -L chaos)" >&2
  exit 1
fi
printf '%-18s %9s %5s %22s %23s %11s  %s\n' fault accepted lost duplicate_completions \
  ran_twice_same_attempt recovery_s other
while IFS= read -r row; do
  declare -A f=()
  other=()
  IFS='|' read -r -a cells <<<"$row"
  for cell in "${cells[@]:1}"; do
    cell=$(echo "$cell" | xargs)
    key=${cell%%=*}
    case $key in
      fault | accepted | lost | duplicate_completions | ran_twice_same_attempt | recovery_s)
        f[$key]=${cell#*=} ;;
      takeover_s | refused | max_active_seen | submit_errors | reruns) other+=("$cell") ;;
    esac
  done
  printf '%-18s %9s %5s %22s %23s %11s  %s\n' "${f[fault]}" "${f[accepted]}" "${f[lost]}" \
    "${f[duplicate_completions]}" "${f[ran_twice_same_attempt]}" "${f[recovery_s]}" "${other[*]}"
  unset f
done <<<"$rows"
