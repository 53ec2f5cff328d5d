#!/usr/bin/env bash
# Puts promtool, Prometheus's rule checker, where the tests look for it, without installing the
# Prometheus server: Debian 12's `prometheus` package is the only one that ships promtool, and
# installing it would also start a server under systemd. This fetches that package with
# `apt-get download` (no root needed, nothing installed) and extracts only /usr/bin/promtool.
#
#   deploy/monitoring/fetch-promtool.sh [DEST]     default DEST: .cache/promtool in the repo
#
# Prints the path of the promtool it leaves in DEST (or of one already on PATH, which it prefers).
# Needs apt's package lists: as root it runs `apt-get update` itself when the download fails.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
DEST=${1:-$ROOT/.cache/promtool}

say() { echo "fetch-promtool: $*" >&2; }

if command -v promtool >/dev/null 2>&1; then
  say "using $(command -v promtool) from PATH"
  command -v promtool
  exit 0
fi
if [[ -x $DEST/promtool ]] && "$DEST/promtool" --version >/dev/null 2>&1; then
  echo "$DEST/promtool"
  exit 0
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# apt's download sandbox user must be able to write here, or apt warns and downloads as root.
chmod 0777 "$work"
download() { (cd "$work" && apt-get download prometheus >&2); }
if ! download; then
  # Package lists that were never fetched (a fresh image) or are out of date: as root, refresh
  # them once and try again.
  if [[ $(id -u) -ne 0 ]] || ! apt-get update >&2 || ! download; then
    say "apt-get download prometheus failed: run \`apt-get update\` as root (or put promtool on PATH)"
    exit 1
  fi
fi
mkdir -p "$DEST"
dpkg-deb --fsys-tarfile "$work"/prometheus_*.deb | tar -xO ./usr/bin/promtool >"$work/promtool"
chmod 0755 "$work/promtool"
"$work/promtool" --version >&2
mv "$work/promtool" "$DEST/promtool"
echo "$DEST/promtool"
