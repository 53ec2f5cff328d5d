# Runs at install time (deploy/CMakeLists.txt): installs the systemd unit DISPATCHD_UNIT_SOURCE
# into <prefix>/lib/systemd/system with ExecStart naming the binaries under the install prefix
# (/usr/bin in the Debian package) instead of /usr/local/bin, and without the header's manual
# install steps. DISPATCHD_UNIT_STAGED is where the rewritten copy is written first.
file(READ "${DISPATCHD_UNIT_SOURCE}" unit)
string(REGEX REPLACE "#\n# Install:\n(#   [^\n]*\n)+" "" unit "${unit}")
string(REPLACE "/usr/local/bin/" "${CMAKE_INSTALL_PREFIX}/bin/" unit "${unit}")
string(FIND "${unit}" "\nExecStart=${CMAKE_INSTALL_PREFIX}/bin/" exec_start)
if(exec_start EQUAL -1 OR unit MATCHES "# Install:")
  message(FATAL_ERROR "${DISPATCHD_UNIT_SOURCE}: could not rewrite it for ${CMAKE_INSTALL_PREFIX}")
endif()
file(WRITE "${DISPATCHD_UNIT_STAGED}" "${unit}")
file(INSTALL "${DISPATCHD_UNIT_STAGED}" DESTINATION "${CMAKE_INSTALL_PREFIX}/lib/systemd/system"
     PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ)
