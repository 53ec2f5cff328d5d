#!/usr/bin/env bash
# Checks deploy/monitoring with promtool: the alert rules load (`promtool check rules`), their unit
# tests pass (`promtool test rules`), and every query of the Grafana dashboard is valid PromQL (each
# is checked as the expression of a recording rule, with the dashboard's variables filled in).
#
#   tests/deploy/check_monitoring.sh SOURCE_DIR
#
# promtool is $PROMTOOL, else SOURCE_DIR/.cache/promtool/promtool (where
# deploy/monitoring/fetch-promtool.sh puts it), else the one on PATH. Fails, saying how to get it,
# when there is none.
set -euo pipefail

src=$(cd "${1:?source dir}" && pwd)
monitoring=$src/deploy/monitoring
promtool=${PROMTOOL:-}
if [[ -z $promtool && -x $src/.cache/promtool/promtool ]]; then promtool=$src/.cache/promtool/promtool; fi
if [[ -z $promtool ]]; then promtool=$(command -v promtool || true); fi
if [[ -z $promtool ]]; then
  echo "check_monitoring: promtool not found: run deploy/monitoring/fetch-promtool.sh" \
    "(tests/run-all.sh does)" >&2
  exit 1
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$promtool" check rules "$monitoring/dispatchd-alerts.yml"
(cd "$monitoring" && "$promtool" test rules dispatchd-alerts.test.yml)

# The dashboard's queries as recording rules, Grafana's variables replaced by values.
python3 - "$monitoring/dispatchd-dashboard.json" "$work/dashboard-rules.yml" <<'EOF'
import json
import sys

dashboard = json.load(open(sys.argv[1]))
exprs = []
def walk(panels):
    for p in panels:
        walk(p.get("panels", []))
        for t in p.get("targets", []):
            exprs.append((p["title"], t["expr"]))
walk(dashboard["panels"])
if not exprs:
    sys.exit("check_monitoring: the dashboard has no queries")
with open(sys.argv[2], "w") as out:
    out.write("groups:\n  - name: dashboard\n    rules:\n")
    for i, (title, expr) in enumerate(exprs):
        expr = (expr.replace("$__rate_interval", "5m").replace("$job", "dispatchd")
                .replace("$type", ".*"))
        if "$" in expr:
            sys.exit(f"check_monitoring: panel {title!r}: unknown variable in {expr}")
        out.write(f"      - record: dashboard_query_{i}\n        expr: {json.dumps(expr)}\n")
print(f"dashboard: {len(exprs)} queries")
EOF
"$promtool" check rules "$work/dashboard-rules.yml"
