#!/usr/bin/env bash
# Builds the Debian package from this build tree with cpack and checks it without installing it:
# its control fields (name, version, Depends from dpkg-shlibdeps and PostgreSQL 15, the conffile,
# the maintainer scripts), that every promised file is in it, that the binaries extracted from it
# run (`--version`), and that its systemd units name the packaged binaries and config and pass
# `systemd-analyze verify`. With TCMALLOC (the library the build linked, DISPATCHD_TCMALLOC), also
# that the package depends on it and that the packaged daemon and worker allocate with it. Leaves
# the package in OUT_DIR for deb_install.sh.
#
#   tests/deploy/deb_package.sh BUILD_DIR OUT_DIR VERSION [TCMALLOC]
set -euo pipefail

build=$(cd "${1:?build dir}" && pwd)
out=${2:?output dir}
version=${3:?version}
tcmalloc=${4:-}
fail() {
  echo "deb_package: $*" >&2
  exit 1
}
for tool in cpack dpkg-deb dpkg-shlibdeps systemd-analyze; do
  command -v "$tool" >/dev/null || fail "$tool not found (deploy/install-deps.sh installs it)"
done

rm -rf "$out"
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cpack --config "$build/CPackConfig.cmake" -G DEB -B "$out" >"$work/cpack.log" 2>&1 || {
  cat "$work/cpack.log" >&2
  fail "cpack failed"
}
rm -rf "$out/_CPack_Packages"
debs=("$out"/dispatchd_*.deb)
[[ ${#debs[@]} == 1 && -f ${debs[0]} ]] || fail "expected one dispatchd_*.deb in $out, found: ${debs[*]}"
deb=${debs[0]}
arch=$(dpkg --print-architecture)
[[ $(basename "$deb") == "dispatchd_${version}-1_${arch}.deb" ]] ||
  fail "package file $(basename "$deb"), expected dispatchd_${version}-1_${arch}.deb"
echo "deb_package: built $(basename "$deb") ($(du -k "$deb" | cut -f1) KiB)"

# Control fields.
field() { dpkg-deb --field "$deb" "$1"; }
[[ $(field Package) == dispatchd ]] || fail "Package: $(field Package)"
[[ $(field Version) == "${version}-1" ]] || fail "Version: $(field Version), expected ${version}-1"
depends=$(field Depends)
for dep in postgresql-15 passwd init-system-helpers libc6 'libgrpc++' libprotobuf libpqxx libyaml-cpp \
  libsystemd0; do
  grep -q "\(^\|, \)${dep}[0-9.a-z-]*\( \|,\|$\)" <<<"$depends" || fail "Depends lacks $dep: $depends"
done
dpkg-deb --info "$deb" conffiles >"$work/conffiles"
[[ $(cat "$work/conffiles") == /etc/dispatchd/dispatchd.yaml ]] ||
  fail "conffiles: $(cat "$work/conffiles")"
for script in postinst prerm postrm; do
  dpkg-deb --info "$deb" "$script" >/dev/null 2>&1 || fail "no $script in the package"
done

# Every promised file, with its mode.
dpkg-deb --contents "$deb" | awk '{print $1, $6}' >"$work/contents"
expect() {
  grep -qxF -- "$1 ./$2" "$work/contents" || fail "missing or wrong mode ($1): /$2"
}
for bin in dispatchd dispatchctl dispatch-worker; do expect -rwxr-xr-x "usr/bin/$bin"; done
expect -rw-r--r-- usr/lib/systemd/system/dispatchd.service
expect -rw-r--r-- usr/lib/systemd/system/dispatch-worker@.service
expect -rw-r--r-- etc/dispatchd/dispatchd.yaml
for doc in README.md docs/operations.md docs/configuration.md docs/api.md docs/security.md; do
  expect -rw-r--r-- "usr/share/doc/dispatchd/$doc"
done
# Nothing else, apart from the directories above them.
promised='\./(usr/bin|usr/lib/systemd/system|usr/share/doc/dispatchd|etc/dispatchd)(/.*)?'
parents='\./(etc/|usr/|usr/lib/|usr/lib/systemd/|usr/share/|usr/share/doc/)?'
if grep -v -E " ($promised|$parents)\$" "$work/contents"; then
  fail "the lines above are outside the promised places"
fi

# The binaries run from the package.
root=$work/root
dpkg-deb --extract "$deb" "$root"
for bin in dispatchd dispatchctl dispatch-worker; do
  got=$("$root/usr/bin/$bin" --version)
  [[ $got == "$bin $version" ]] || fail "$bin --version printed \"$got\", expected \"$bin $version\""
  echo "deb_package: $got"
done
if [[ -n $tcmalloc ]]; then
  # dpkg-shlibdeps names the library's package; the dynamic linker binds malloc to it.
  grep -q "\(^\|, \)libtcmalloc-minimal4[0-9.a-z-]*\( \|,\|$\)" <<<"$depends" ||
    fail "Depends lacks libtcmalloc-minimal4: $depends"
  for bin in dispatchd dispatch-worker; do
    bindings=$(LD_DEBUG=bindings "$root/usr/bin/$bin" --version 2>&1 >/dev/null)
    grep -q "to [^ ]*/libtcmalloc_minimal[^ ]* \[0\]: normal symbol \`malloc'" <<<"$bindings" ||
      fail "$bin does not allocate with tcmalloc"
  done
  echo "deb_package: dispatchd and dispatch-worker allocate with tcmalloc"
fi
cmp "$root/etc/dispatchd/dispatchd.yaml" "$(dirname "$0")/../../config/dispatchd.yaml" ||
  fail "the packaged config is not config/dispatchd.yaml"

# The packaged units start the packaged binaries with the packaged config; systemd-analyze checks
# them with the extracted binaries standing in for /usr/bin.
units=$root/usr/lib/systemd/system
grep -qx 'ExecStart=/usr/bin/dispatchd --config /etc/dispatchd/dispatchd.yaml' "$units/dispatchd.service" ||
  fail "dispatchd.service: $(grep ExecStart= "$units/dispatchd.service")"
grep -q '^ExecStart=/usr/bin/dispatch-worker ' "$units/dispatch-worker@.service" ||
  fail "dispatch-worker@.service: $(grep ExecStart= "$units/dispatch-worker@.service")"
if grep -n '/usr/local' "$units"/*.service; then fail "a packaged unit names /usr/local"; fi
mkdir "$work/units"
for unit in dispatchd.service dispatch-worker@.service; do
  sed "s|/usr/bin/dispatch|$root/usr/bin/dispatch|g" "$units/$unit" >"$work/units/$unit"
done
for unit in dispatchd.service dispatch-worker@gpu0.service; do
  verify=$(cd "$work/units" && SYSTEMD_LOG_LEVEL=notice systemd-analyze verify "$work/units/$unit" 2>&1) || {
    echo "$verify" >&2
    fail "$unit: systemd-analyze verify failed"
  }
  if grep -E "dispatchd\.service|dispatch-worker@" <<<"$verify"; then
    fail "$unit: systemd-analyze verify reported the lines above"
  fi
  echo "deb_package: $unit: systemd-analyze verify ok"
done
echo "deb_package: ok"
