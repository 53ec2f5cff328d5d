# The Debian package: `cpack -G DEB` in the build directory (or the `package` target, which builds
# everything first) writes dispatchd_<version>-<release>_<arch>.deb. It holds the binaries in
# /usr/bin, the systemd units in /usr/lib/systemd/system, the example config as the conffile
# /etc/dispatchd/dispatchd.yaml and the docs in /usr/share/doc/dispatchd; its maintainer scripts
# (deploy/deb) create the users the units run as. docs/operations.md, "Install from the .deb".
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME dispatchd)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "job-dispatch daemon for GPU fleets")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
# The binaries, and the system files that a plain `cmake --install` leaves out (deploy/).
set(CPACK_INSTALL_CMAKE_PROJECTS
    "${CMAKE_BINARY_DIR};${PROJECT_NAME};Unspecified;/"
    "${CMAKE_BINARY_DIR};${PROJECT_NAME};system;/")
# RelWithDebInfo binaries are mostly debug info; the package ships them stripped.
set(CPACK_STRIP_FILES ON)

set(DISPATCHD_PACKAGE_MAINTAINER "dispatchd maintainers <dispatchd@localhost>"
    CACHE STRING "Maintainer field of the Debian package")
set(DISPATCHD_PACKAGE_RELEASE 1 CACHE STRING "Debian revision of the package (the -N in 0.1.0-N)")
set(CPACK_DEBIAN_PACKAGE_MAINTAINER "${DISPATCHD_PACKAGE_MAINTAINER}")
set(CPACK_DEBIAN_PACKAGE_RELEASE ${DISPATCHD_PACKAGE_RELEASE})
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION net)
# The extended description; CPack puts the summary above it.
set(CPACK_DEBIAN_PACKAGE_DESCRIPTION
    "dispatchd takes jobs from clients over gRPC, keeps them in PostgreSQL and streams them to
the GPU worker processes that connect to it, in the order its scheduler picks (tier priority,
fair shares, model affinity) within caps and rate limits.

This package holds the daemon, the command-line client dispatchctl, the reference worker
dispatch-worker, their systemd units and an example configuration.")
# The libraries the binaries link, found by dpkg-shlibdeps; PostgreSQL 15's server binaries for
# the embedded database (postgres.bin_dir, /usr/lib/postgresql/15/bin by default); useradd and
# deb-systemd-helper for the maintainer scripts.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "postgresql-15, passwd, init-system-helpers")
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
    "${PROJECT_SOURCE_DIR}/deploy/deb/conffiles"
    "${PROJECT_SOURCE_DIR}/deploy/deb/postinst"
    "${PROJECT_SOURCE_DIR}/deploy/deb/prerm"
    "${PROJECT_SOURCE_DIR}/deploy/deb/postrm")
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)

include(CPack)
