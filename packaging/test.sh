#!/usr/bin/env bash
# Builds fleetfs and runs every test, then builds it again with
# AddressSanitizer and UndefinedBehaviorSanitizer and runs every test again,
# then builds the fuzz targets with clang and runs each for 10 s.
# Installs what it needs first. This is what CI runs (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
bash packaging/install-deps.sh

echo "== build and test"
bash packaging/build.sh
(cd build && ctest --output-on-failure -j "$(nproc)" --timeout 600)

echo "== build and test under AddressSanitizer and UndefinedBehaviorSanitizer"
bash packaging/build.sh --sanitize
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
(cd build-asan && ctest --output-on-failure -j "$(nproc)" --timeout 900)

echo "== fuzz targets (clang, libFuzzer): each replays its corpus, then fuzzes 10 s"
# Longer runs of one target: bash tests/fuzz/run.sh TARGET SECONDS (tests/fuzz/README.md).
CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DFLEETFS_FUZZ=ON >/dev/null
ninja -C build-fuzz -j "$(nproc)"
(cd build-fuzz && ctest --output-on-failure -j "$(nproc)" --timeout 300)
