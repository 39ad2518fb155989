#!/usr/bin/env bash
# Builds fleetfs and runs every test, then builds it again with
# AddressSanitizer and UndefinedBehaviorSanitizer and runs every test again.
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
