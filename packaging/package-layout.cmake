# CPack pre-build script (CPACK_PRE_BUILD_SCRIPTS): the install put the
# configuration and the unit under the prefix (/usr/etc, /usr/lib/systemd);
# a Debian package has them at /etc/fleetfs (the conffile) and
# /lib/systemd/system.
set(root "${CPACK_TEMPORARY_INSTALL_DIRECTORY}")
foreach(pair "usr/etc/fleetfs:etc/fleetfs" "usr/lib/systemd:lib/systemd")
  string(REPLACE ":" ";" pair "${pair}")
  list(GET pair 0 from)
  list(GET pair 1 to)
  if(NOT EXISTS "${root}/${from}")
    message(FATAL_ERROR "package-layout: ${root}/${from} was not installed")
  endif()
  get_filename_component(parent "${root}/${to}" DIRECTORY)
  file(MAKE_DIRECTORY "${parent}")
  file(RENAME "${root}/${from}" "${root}/${to}")
endforeach()
file(REMOVE_RECURSE "${root}/usr/etc")  # empty now
file(GLOB left "${root}/usr/lib/*")
if(NOT left)
  file(REMOVE_RECURSE "${root}/usr/lib")
endif()
