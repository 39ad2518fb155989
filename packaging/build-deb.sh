#!/usr/bin/env bash
# Builds the Debian package fleetfs_<version>_amd64.deb: /usr/bin/fleetfs,
# /etc/fleetfs/agent.toml (a conffile), fleetfs(1) and the systemd unit
# fleetfs.service; Depends from the shared libraries the binary links
# (dpkg-shlibdeps). Prints the package's path.
#
# Usage: packaging/build-deb.sh [--build-dir DIR] [--out DIR]
#   (default)        a build of its own in build-deb/ (RelWithDebInfo: -O2,
#                    the flags the tests run with; GCC 12's -O3 of Release
#                    trips -Wrestrict false positives; the package is
#                    stripped), the .deb in the source tree's top
#   --build-dir DIR  package an existing build tree instead (configured by
#                    CMake with help2man present; its build type is kept):
#                    the packaging test uses the tree it tests
#   --out DIR        where the .deb goes
set -euo pipefail
# Relative --build-dir and --out are the caller's, resolved before the cd.
top="$(realpath "$(dirname "$0")/..")"
build_dir=""
out="$top"
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) build_dir="$(realpath "$2")"; shift 2 ;;
    --out) out="$(realpath -m "$2")"; shift 2 ;;
    *) echo "build-deb: unknown argument '$1'; usage: build-deb.sh [--build-dir DIR] [--out DIR]" >&2; exit 2 ;;
  esac
done

cd "$top"

for tool in help2man dpkg-shlibdeps cpack; do
  command -v "$tool" >/dev/null || {
    echo "build-deb: $tool is missing; run packaging/install-deps.sh (as root)" >&2; exit 1; }
done

if [ -z "$build_dir" ]; then
  build_dir="$top/build-deb"
  cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
fi
[ -f "$build_dir/CPackConfig.cmake" ] || {
  echo "build-deb: $build_dir is not a configured fleetfs build tree (no CPackConfig.cmake)" >&2; exit 1; }
# Only what goes in the package, not the tests.
cmake --build "$build_dir" --target fleetfs fleetfs_man -- -j "$(nproc)"

mkdir -p "$out"
staging="$(mktemp -d "$out/.build-deb.XXXXXX")"
trap 'rm -rf "$staging"' EXIT
(cd "$build_dir" && cpack -G DEB -B "$staging" >"$staging/cpack.log") || {
  cat "$staging/cpack.log" >&2; echo "build-deb: cpack failed" >&2; exit 1; }
debs=("$staging"/fleetfs_*_amd64.deb)
[ -f "${debs[0]}" ] || { cat "$staging/cpack.log" >&2; echo "build-deb: cpack made no fleetfs_*_amd64.deb" >&2; exit 1; }
mv "${debs[0]}" "$out/"
echo "$out/$(basename "${debs[0]}")"
