#!/usr/bin/env bash
# Builds fleetfs and runs the agent on the embedded default: a SQLite control
# database and a demo volume under /var/lib/fleetfs/demo, every slot owned by
# this host, a file:// replica beside the volume (every commit ships there),
# the fleet root mounted at /mnt/fleet. Runs in the foreground
# until Ctrl-C (or SIGTERM), which stops the agent cleanly.
set -euo pipefail
cd "$(dirname "$0")/.."
bash packaging/install-deps.sh
bash packaging/build.sh >/dev/null
fleetfs=$PWD/build/agent/fleetfs

demo=/var/lib/fleetfs/demo
mount=/mnt/fleet
admin=127.0.0.1:7878
mkdir -p "$demo/volume" "$mount"
# Any local user may create tenants in the demo; each file belongs to its creator.
chmod 1777 "$demo/volume"

# The agent logs to this terminal. Ctrl-C reaches it directly (SIGINT); a
# SIGTERM to this script is passed on.
"$fleetfs" mount --backing "$demo/volume" --mount "$mount" \
  --store "sqlite://$demo/control.db" --owner "$(hostname)" --ranges 0-16383 \
  --ttl 30s --admin "$admin" --replica "file://$demo/replica" --sync-interval 1s &
agent=$!
trap 'kill -TERM "$agent" 2>/dev/null; wait "$agent"; exit 0' TERM
trap 'wait "$agent"; exit 0' INT

for _ in $(seq 1 100); do
  if [ -r "$mount/.fleetfs/status.json" ] &&
     grep -q '"state": "serving"' "$mount/.fleetfs/status.json" 2>/dev/null; then
    break
  fi
  if ! kill -0 "$agent" 2>/dev/null; then
    echo "demo: the agent did not start (see its messages above)" >&2
    exit 1
  fi
  sleep 0.1
done

tenant_path=$("$fleetfs" slot --mode tenant acme | awk 'NR==2 {print $NF}')
cat <<MSG

== fleetfs is serving every slot at $mount (backing $demo/volume)
$("$fleetfs" status "$mount")

Open a tenant through the mount with any SQLite client, for example:
  sqlite3 $mount/$tenant_path "PRAGMA journal_mode=WAL; CREATE TABLE IF NOT EXISTS notes(t); INSERT INTO notes VALUES ('hello'); SELECT * FROM notes;"
  python3 -c "import sqlite3; print(sqlite3.connect('$mount/$tenant_path').execute('SELECT * FROM notes').fetchall())"
Where a tenant lives:   $fleetfs slot --mode tenant globex
Agent state:            $fleetfs status $mount    (or: curl http://$admin/health /status /metrics)
Use the mount only: nothing else may touch $demo/volume while the agent runs.
Every commit ships to file://$demo/replica; see it with
  $fleetfs replica ls acme --replica file://$demo/replica
  $fleetfs restore acme --replica file://$demo/replica -o /tmp/acme-copy.db

Ctrl-C stops the agent: it fences open files, releases its slots and unmounts.
MSG
wait "$agent"
