#!/usr/bin/env bash
# Installs what fleetfs needs to build, run and test, from Debian 12's
# packages. Safe to run again: it installs only what is missing.
set -euo pipefail

packages=(
  # build
  build-essential cmake ninja-build pkg-config
  # libraries (see README, "Dependencies")
  libsqlite3-dev libcli11-dev nlohmann-json3-dev libgtest-dev libgmock-dev
  libfuse3-dev libuv1-dev libspdlog-dev libtomlplusplus-dev libhttp-parser-dev
  libzstd-dev libxxhash-dev libcurl4-openssl-dev
  # the s3:// destination: XML answers, SHA-256 of request bodies
  libpugixml-dev libssl-dev
  # run time: the FUSE mount helper (fusermount3) and /etc/fuse.conf
  fuse3
  # tests: real clients and servers the tests drive
  sqlite3 python3 redis-server etcd-server openssl
  # tests: hosts as network namespaces (ip netns, veth pairs)
  iproute2
  # fuzz targets (tests/fuzz): clang 14 and its runtimes (libclang_rt.fuzzer,
  # the sanitizers' clang runtimes)
  clang libclang-rt-14-dev
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages are installed"
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps: missing ${missing[*]}; run as root to install them" >&2
  exit 1
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# The redis-server package starts a system service; the tests start their own.
# So does etcd-server. The tests start their own.
if command -v systemctl >/dev/null 2>&1; then
  systemctl disable --now redis-server >/dev/null 2>&1 || true
  systemctl disable --now etcd >/dev/null 2>&1 || true
fi
echo "install-deps: done"
