#!/usr/bin/env bash
# Builds fleetfs and runs it on the embedded default: a SQLite control
# database under /var/lib/fleetfs/demo, with every slot claimed by this host.
# (The FUSE mount arrives with the next release; until then the demo is the
# ownership table itself.)
set -euo pipefail
cd "$(dirname "$0")/.."
bash packaging/install-deps.sh
bash packaging/build.sh >/dev/null
fleetfs=$PWD/build/agent/fleetfs

demo=/var/lib/fleetfs/demo
mkdir -p "$demo"
store="sqlite://$demo/control.db"
owner=$(hostname)

echo "== claim every slot for '$owner' on $store"
status=0
"$fleetfs" lease claim --store "$store" --owner "$owner" --range 0-16383 --ttl 60s || status=$?
if [ "$status" -eq 3 ]; then
  echo "(another owner holds the slots in this demo database; see the table below)"
elif [ "$status" -ne 0 ]; then
  exit "$status"
fi
echo
echo "== the ownership table"
"$fleetfs" lease ls --store "$store"
epoch=$("$fleetfs" lease ls --store "$store" --json |
  python3 -c 'import json,sys; rows=json.load(sys.stdin)["rows"]; print(rows[0]["epoch"] if rows else "N")')
echo
echo "== where tenants live"
"$fleetfs" slot acme globex '{user1000}.following'
cat <<MSG

fleetfs is built at $fleetfs. Try:
  $fleetfs --help
  $fleetfs lease ls --store $store --json
  $fleetfs lease renew --store $store --owner $owner --range 0-16383 --epoch $epoch
  $fleetfs lease release --store $store --owner $owner --range 0-16383 --epoch $epoch
MSG
