#!/usr/bin/env bash
# Runs one fuzz target for longer than the test suite does (which gives each
# target FLEETFS_FUZZ_SECONDS, 10 s): configures and builds build-fuzz with
# clang when needed, then fuzzes from the seed corpus.
#
#   bash tests/fuzz/run.sh TARGET SECONDS [libFuzzer flags...]
#   bash tests/fuzz/run.sh admin_request 600
#   bash tests/fuzz/run.sh config 3600 -jobs=2 -workers=2
#
# TARGET is a name under tests/fuzz/corpus/ (admin_request, config,
# slot_range, owner_id, duration, tenant_id, fleet_name, wal,
# replica_object, log_object). New interesting inputs go to
# build-fuzz/tests/fuzz/corpus/TARGET, crashes to build-fuzz/tests/fuzz/crashes/;
# see README.md for how a crash becomes a regression input.
set -euo pipefail
if [ $# -lt 2 ]; then
  sed -n '2,15p' "$0" >&2
  exit 2
fi
target=$1 seconds=$2
shift 2
cd "$(dirname "$0")/../.."
if [ ! -d "tests/fuzz/corpus/$target" ]; then
  echo "run.sh: no target '$target'; the targets are: $(ls tests/fuzz/corpus | tr '\n' ' ')" >&2
  exit 2
fi
if [ ! -f build-fuzz/build.ninja ]; then
  CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DFLEETFS_FUZZ=ON >/dev/null
fi
cmake --build build-fuzz --target "${target}_fuzz" -- -j"$(nproc)"
work=build-fuzz/tests/fuzz/corpus/$target
crashes=build-fuzz/tests/fuzz/crashes
mkdir -p "$work" "$crashes"
dict=()
if [ -f "tests/fuzz/$target.dict" ]; then dict=("-dict=tests/fuzz/$target.dict"); fi
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
exec "build-fuzz/tests/fuzz/${target}_fuzz" -max_total_time="$seconds" -timeout=25 \
  -rss_limit_mb=2048 -print_final_stats=1 "${dict[@]}" -artifact_prefix="$crashes/$target-" \
  "$@" "$work" "tests/fuzz/corpus/$target"
