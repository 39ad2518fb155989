#!/usr/bin/env bash
# Installs what fleetfs needs to build, run and test, from Debian 12's
# packages. Safe to run again: it installs only what is missing.
set -euo pipefail

packages=(
  # build
  build-essential cmake ninja-build pkg-config
  # libraries (see README, "Dependencies")
  libsqlite3-dev libcli11-dev nlohmann-json3-dev libgtest-dev libgmock-dev
  libfuse3-dev liburing-dev libuv1-dev libspdlog-dev libtomlplusplus-dev libhttp-parser-dev
  libzstd-dev libxxhash-dev libcurl4-openssl-dev
  # the s3:// destination: XML answers, SHA-256 of request bodies
  libpugixml-dev libssl-dev
  # the agent as a systemd Type=notify service (sd_notify, the watchdog)
  libsystemd-dev
  # packaging/build-deb.sh: the man page from --help (help2man), the
  # package's Depends from the linked libraries (dpkg-shlibdeps), and
  # tests/packaging's man page check (man-db)
  help2man dpkg-dev man-db
  # tests/packaging: systemd-analyze verify of the unit (nothing is started)
  systemd
  # run time: the FUSE mount helper (fusermount3) and /etc/fuse.conf
  fuse3
  # tests: real clients and servers the tests drive
  sqlite3 python3 redis-server etcd-server openssl
  # tests: hosts as network namespaces (ip netns, veth pairs)
  iproute2
  # fuzz targets (tests/fuzz): clang 14 and its runtimes (libclang_rt.fuzzer,
  # the sanitizers' clang runtimes)
  clang libclang-rt-14-dev
  # tests: curl, the independent S3 client of tests/s3
  curl
)
# tests/s3's S3 server (s3rver, from npm) needs Node.js >= 20. A node already
# on PATH (NodeSource's nodejs, say) is kept: Debian's npm conflicts with it.
if ! command -v node >/dev/null 2>&1; then
  packages+=(nodejs npm)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -eq 0 ]; then
  apt_said="all ${#packages[@]} packages are installed"
else
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
  apt_said="installed ${#missing[@]} packages"
fi

# The S3-compatible server of the s3:// replica tests (tests/s3): the npm
# package @20minutes/s3rver, pinned, in a cache folder the tests look in.
# Test-only; nothing of it is in the fleetfs binary.
S3RVER_VERSION=4.0.4
s3rver_dir="${FLEETFS_CACHE:-/var/cache/fleetfs}/s3rver"
node_major="$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)"
if [ "$node_major" -lt 20 ]; then
  echo "install-deps: the S3 tests' server (s3rver $S3RVER_VERSION) needs Node.js >= 20;" \
       "node is $(node --version 2>/dev/null || echo missing) (Debian 12's nodejs is 18)." \
       "Install Node.js 20 (NodeSource's nodejs 20, or Debian 13's) and run this again." >&2
  exit 1
fi
if ! command -v npm >/dev/null 2>&1; then
  echo "install-deps: npm is missing beside node $(node --version); install the npm of that Node.js" >&2
  exit 1
fi
installed_version="$(node -p "require('$s3rver_dir/node_modules/@20minutes/s3rver/package.json').version" 2>/dev/null || true)"
if [ "$installed_version" = "$S3RVER_VERSION" ]; then
  echo "install-deps: $apt_said; s3rver $S3RVER_VERSION is in $s3rver_dir"
  exit 0
fi
mkdir -p "$s3rver_dir"
if ! (cd "$s3rver_dir" && npm install --no-audit --no-fund --silent "@20minutes/s3rver@$S3RVER_VERSION" >/dev/null); then
  echo "install-deps: npm install @20minutes/s3rver@$S3RVER_VERSION in $s3rver_dir failed" >&2
  exit 1
fi
echo "install-deps: $apt_said; installed s3rver $S3RVER_VERSION in $s3rver_dir"
