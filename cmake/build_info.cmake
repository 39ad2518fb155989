# Writes agent/build_info.h (fleetfs_build_info in /metrics) at build time:
#   cmake -DSOURCE_DIR=... -DOUTPUT=... -DTEMPLATE=... -DVERSION=... -DCOMPILER=...
#         [-DGIT_EXECUTABLE=git] -P build_info.cmake
# Run on every build (a custom target), not at configure time, so a commit
# followed by an incremental build is not reported as the commit before it.
# The header is rewritten only when its text changes (configure_file), so an
# unchanged commit rebuilds nothing.
#
# The commit is HEAD's short hash, with "-dirty" when tracked files differ
# from it (untracked files do not count: build dirs live in the tree), or
# "unknown" when SOURCE_DIR is not the top of a git checkout of its own (a
# release tarball, even one unpacked inside another repository).
# safe.directory=*: a checkout owned by another user (a root build of a
# user's tree, a CI container) is still ours to describe; git would refuse
# it otherwise and the build would say "unknown".
if(NOT GIT_EXECUTABLE)
  set(GIT_EXECUTABLE git)
endif()
set(FLEETFS_COMMIT "unknown")
execute_process(COMMAND ${GIT_EXECUTABLE} -c safe.directory=* rev-parse --show-toplevel --short HEAD
  WORKING_DIRECTORY ${SOURCE_DIR} RESULT_VARIABLE git_rc
  OUTPUT_VARIABLE git_out OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(git_rc EQUAL 0)
  string(REPLACE "\n" ";" git_lines "${git_out}")
  list(LENGTH git_lines git_count)
  if(git_count EQUAL 2)
    list(GET git_lines 0 git_top)
    list(GET git_lines 1 git_commit)
    file(REAL_PATH "${git_top}" git_top)
    file(REAL_PATH "${SOURCE_DIR}" source_top)
    if(git_top STREQUAL source_top)
      set(FLEETFS_COMMIT "${git_commit}")
      execute_process(COMMAND ${GIT_EXECUTABLE} -c safe.directory=* status --porcelain --untracked-files=no
        WORKING_DIRECTORY ${SOURCE_DIR} RESULT_VARIABLE status_rc
        OUTPUT_VARIABLE status_out OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
      if(NOT status_rc EQUAL 0)
        set(FLEETFS_COMMIT "${git_commit}-unknown")
      elseif(NOT status_out STREQUAL "")
        set(FLEETFS_COMMIT "${git_commit}-dirty")
      endif()
    endif()
  endif()
endif()
set(PROJECT_VERSION "${VERSION}")
set(FLEETFS_COMPILER "${COMPILER}")
configure_file(${TEMPLATE} ${OUTPUT} @ONLY)
