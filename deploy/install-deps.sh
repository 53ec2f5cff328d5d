#!/usr/bin/env bash
# Installs the Debian 12 packages that dispatchd needs to build, test and run.
#
#   deploy/install-deps.sh
#
# Does nothing (and needs no privileges) when every package is already installed. Otherwise runs
# `apt-get update` and `apt-get install -y --no-install-recommends` as root, through sudo when not
# root. Non-interactive: safe to run in CI with no terminal.
set -euo pipefail

PACKAGES=(
  # Toolchain
  build-essential cmake ninja-build pkg-config
  # gRPC and protobuf
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  # Libraries
  libabsl-dev libspdlog-dev libfmt-dev libyaml-cpp-dev libpqxx-dev libpq-dev libcli11-dev
  libcpp-httplib-dev libsystemd-dev
  # The allocator dispatchd and dispatch-worker link (DISPATCHD_TCMALLOC)
  libtcmalloc-minimal4
  # Tests and benchmarks
  libgtest-dev libgmock-dev libbenchmark-dev
  # TLS and token digests (libssl-dev); test certificates (openssl)
  libssl-dev openssl
  # systemd-analyze, to verify the units in deploy/; systemd-nspawn, to test the package under
  # systemd where it is not PID 1 (deb_install_systemd)
  systemd systemd-container
  # Database server (embedded mode and the test fixture)
  postgresql-15
  # Python SDK; its package builds offline with Debian's setuptools and wheel, and its test
  # installs the wheel into a venv (python_wheel)
  python3 python3-grpcio python3-protobuf python3-pip python3-setuptools python3-wheel python3-venv
  # bench/bench.py's plots (bench/plots.py) and their test, with Debian's /usr/bin/python3
  python3-matplotlib
  # Node.js, for the grpc-js client test and the Node worker (tests/thirdparty, client/node; their
  # npm packages are pinned in each one's package-lock.json and installed with `npm ci`). npm: see
  # below.
  nodejs
  # Headless Chromium for the web console's browser test (tests/browser, driven by puppeteer-core
  # from tests/browser/package-lock.json)
  chromium
  # Fuzzing (tests/fuzz): clang, its sanitizer and libFuzzer runtimes (libclang-rt-14-dev is only
  # a recommendation of clang-14), and llvm-symbolizer for the stacks of sanitizer reports
  clang-14 libclang-rt-14-dev libfuzzer-14-dev llvm-14
  # The rules the code is held to (tests/lint.sh): formatting, clang-tidy and its thread-safety pass
  clang-format-14 clang-tidy-14
)

say() { echo "install-deps: $*"; }
die() {
  echo "install-deps: error: $*" >&2
  exit 1
}

if ! command -v dpkg-query >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1; then
  die "dpkg-query and apt-get not found: this script supports Debian 12 (bookworm) only"
fi

if [[ -r /etc/os-release ]]; then
  # shellcheck disable=SC1091
  os_id=$(. /etc/os-release && echo "${ID:-}:${VERSION_ID:-}")
  if [[ $os_id != debian:12 ]]; then
    say "warning: this is ${os_id}, not debian:12; package names may differ" >&2
  fi
fi

# Debian ships npm apart from nodejs, while NodeSource's nodejs package carries its own npm and
# conflicts with Debian's: ask for Debian's only where no npm command exists.
if ! command -v npm >/dev/null 2>&1; then
  PACKAGES+=(npm)
fi

# The packages dpkg reports as installed; a package dpkg does not know prints nothing here.
installed=$(dpkg-query -W -f='${Package} ${db:Status-Status}\n' "${PACKAGES[@]}" 2>/dev/null || true)
missing=()
for pkg in "${PACKAGES[@]}"; do
  if ! grep -qx "${pkg} installed" <<<"$installed"; then
    missing+=("$pkg")
  fi
done

if ((${#missing[@]} == 0)); then
  say "all ${#PACKAGES[@]} packages are installed"
  exit 0
fi
say "missing: ${missing[*]}"

as_root=()
if [[ $(id -u) -ne 0 ]]; then
  if command -v sudo >/dev/null 2>&1; then
    as_root=(sudo)
    say "not root: using sudo"
  else
    die "installing packages needs root, and sudo is not available. Run this script as root, or" \
      "install these packages yourself: ${missing[*]}"
  fi
fi

"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update ||
  die "apt-get update failed"
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
  "${PACKAGES[@]}" || die "apt-get install failed"
say "installed: ${missing[*]}"
