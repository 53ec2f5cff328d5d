# Sourced by the package tests that change the machine (deb_install.sh, deb_install_systemd.sh),
# after they set `test_name`: their messages, and the guard that keeps them off a machine that did
# not ask for it.

# Reports the test skipped (ctest's SKIP_RETURN_CODE) and exits.
skip() {
  echo "$test_name: skipped: $*"
  exit 77
}

fail() {
  echo "$test_name: $*" >&2
  exit 1
}

# Skips unless running as root with CI=true (as .ci/run does) or DISPATCHD_TEST_DEB_INSTALL=1.
# $1 says what the test does to the machine, e.g. "it installs a package".
require_consent() {
  if [[ $(id -u) != 0 ]]; then skip "$1: run as root with CI=true"; fi
  if [[ ${CI:-} != true && ${DISPATCHD_TEST_DEB_INSTALL:-} != 1 ]]; then
    skip "$1 on this machine: set CI=true or DISPATCHD_TEST_DEB_INSTALL=1"
  fi
}
