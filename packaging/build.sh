#!/usr/bin/env bash
# Configures and builds fleetfs. Usage: packaging/build.sh [--sanitize]
#   (default)    build/        RelWithDebInfo
#   --sanitize   build-asan/   with AddressSanitizer and UndefinedBehaviorSanitizer
set -euo pipefail
cd "$(dirname "$0")/.."
dir=build
flags=()
if [ "${1:-}" = "--sanitize" ]; then
  dir=build-asan
  flags=(-DFLEETFS_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug)
fi
cmake -S . -B "$dir" -G Ninja "${flags[@]}" >/dev/null
ninja -C "$dir" -j "$(nproc)"
