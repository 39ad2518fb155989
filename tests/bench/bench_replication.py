#!/usr/bin/env python3
"""fleetfs replication benchmark, in one run:

  1. write throughput through the mount with replication on versus off
     (two agents, interleaved rounds, medians; single-row insert
     transactions, WAL with synchronous=NORMAL and FULL, rollback journal);
  2. replication lag p50 and p99 (commit to shipped, as the agent measures it
     and exports it in /metrics) under a steady writer, at sync intervals 1 s
     and 100 ms;
  3. restore throughput of a database of --restore-mb (default 1024) versus
     `cp` of the same file (both from a warm page cache, to a new file, synced);
  4. requests to the destination per tenant per hour, by kind (what S3
     bills), for one tenant committing once per second at the default sync
     interval (1 s), from the agent's fleetfs_replica_requests_total: the goal
     is one create per round with something to ship and no list; beside it
     --idle-tenants tenants written once and shipped before the window, and
     the tenants the shipper visits per round meanwhile
     (fleetfs_replication_tenant_visits_total): the goal is the one written.

Not a test: it asserts nothing about speed. Usage (as root):
  python3 tests/bench/bench_replication.py --binary build/agent/fleetfs
  python3 tests/bench/bench_replication.py --binary build/agent/fleetfs --only requests
"""
import argparse
import json
import os
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import tempfile
import threading
import time
import urllib.request

from bench_mount import free_port, inserts  # the same workload as the mount benchmark


class Agent:
    def __init__(self, binary, root, name, extra):
        self.dir = os.path.join(root, name)
        self.backing = os.path.join(self.dir, "backing")
        self.mount = os.path.join(self.dir, "mnt")
        os.makedirs(self.backing)
        os.makedirs(self.mount)
        self.port = free_port()
        self.log = open(os.path.join(self.dir, "agent.log"), "wb")
        self.proc = subprocess.Popen(
            [binary, "mount", "--backing", self.backing, "--mount", self.mount,
             "--store", f"sqlite://{self.dir}/control.db", "--owner", name, "--ttl", "30s",
             "--admin", f"127.0.0.1:{self.port}", *extra],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 20
        while time.time() < deadline:
            try:
                with open(os.path.join(self.mount, ".fleetfs", "status.json")) as f:
                    if all(r["state"] == "serving" for r in json.load(f)["ranges"]):
                        return
            except (OSError, ValueError):
                pass
            time.sleep(0.05)
        raise RuntimeError(f"agent {name} did not start serving")

    def metrics(self):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as r:
            out = {}
            for line in r.read().decode().splitlines():
                if not line.startswith("#") and " " in line:
                    key, value = line.rsplit(" ", 1)
                    out[key] = float(value)
            return out

    def status(self):
        with open(os.path.join(self.mount, ".fleetfs", "status.json")) as f:
            return json.load(f)

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(60)
        self.log.close()


def tenant_path(binary, name):
    out = subprocess.run([binary, "slot", "--json", name], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)[0]["tenant_path"]


def steady_writer(path, rate, seconds):
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("CREATE TABLE IF NOT EXISTS t(id INTEGER PRIMARY KEY, v TEXT)")
    period = 1.0 / rate
    next_at = time.perf_counter()
    end = next_at + seconds
    while next_at < end:
        db.execute("INSERT INTO t(v) VALUES (?)", ("y" * 200,))
        next_at += period
        delay = next_at - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
    db.close()


def timed(fn):
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


REQUEST_KINDS = ("create", "put", "list", "get", "head", "size", "remove", "probe", "clean_temps")


def requests(agent):
    m = agent.metrics()
    counts = {k: m[f'fleetfs_replica_requests_total{{kind="{k}"}}'] for k in REQUEST_KINDS}
    counts["failures"] = m["fleetfs_replica_request_failures_total"]
    return counts


def wait_shipped(agent, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        st = agent.status()
        if st["replication"]["tenants_unshipped"] == 0 and all(
                r["replication_lag_s"] == 0 for r in st["ranges"]):
            return
        time.sleep(0.05)
    raise RuntimeError("the agent did not ship everything in time")


def requests_per_hour(binary, root, agents, seconds, idle):
    """One tenant committing once per second: requests to the destination in
    steady state (after the tenant's creation, first snapshot and the claim's
    warm-up listing), extrapolated to an hour; and the shipper's visits per
    round, with `idle` other tenants written once before the window."""
    a = Agent(binary, root, "requests",
              ["--replica", f"file://{root}/replica-requests", "--sync-interval", "1s"])
    agents.append(a)
    for n in range(idle):
        other = sqlite3.connect(os.path.join(a.mount, tenant_path(binary, f"idle-{n}")),
                                isolation_level=None)
        other.execute("PRAGMA journal_mode=WAL")
        other.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)")
        other.execute("INSERT INTO t(v) VALUES ('once')")
        other.close()
    rel = tenant_path(binary, "requests-tenant")
    db = sqlite3.connect(os.path.join(a.mount, rel), isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)")
    wait_shipped(a)
    # The claim's warm-up lists the range's buckets in the background: start
    # once the counts stand still.
    before = requests(a)
    for _ in range(20):
        time.sleep(0.5)
        now = requests(a)
        if now == before:
            break
        before = now
    visits_before = a.metrics()["fleetfs_replication_tenant_visits_total"]
    window_started = time.perf_counter()
    commits = 0
    next_at = time.perf_counter()
    end = next_at + seconds
    while next_at < end:
        db.execute("INSERT INTO t(v) VALUES (?)", ("z" * 200,))
        commits += 1
        next_at += 1.0
        delay = next_at - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
    wait_shipped(a)
    window = time.perf_counter() - window_started
    visits = a.metrics()["fleetfs_replication_tenant_visits_total"] - visits_before
    after = requests(a)
    db.close()
    a.stop()
    agents.remove(a)
    per_hour = 3600 / seconds
    print(f"4. requests to the destination per tenant per hour: one tenant committing once per "
          f"second for {seconds:.0f} s, sync 1s (the default), in steady state; per hour = the "
          f"window's count x{per_hour:g} (an extrapolation: the hourly snapshot and the "
          f"retention pass after it fall outside the window)")
    for kind in REQUEST_KINDS + ("failures",):
        n = after[kind] - before[kind]
        print(f"   {kind:12} {n:6.0f} in the window   {n * per_hour:9.0f} per hour")
    creates = after["create"] - before["create"]
    print(f"   {commits} commits, {creates:.0f} creates: creates/commits "
          f"{creates / commits:.2f} (the goal: 1 per round with something to ship, no list)")
    print(f"   tenants visited per round: {visits / window:.2f} (visits {visits:.0f} over "
          f"{window:.0f} s), with {idle} other tenants written once before the window "
          f"(the goal: the one written)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--count", type=int, default=10000, help="transactions per throughput run")
    ap.add_argument("--lag-seconds", type=float, default=15)
    ap.add_argument("--lag-rate", type=float, default=200, help="transactions per second")
    ap.add_argument("--restore-mb", type=int, default=1024)
    ap.add_argument("--requests-seconds", type=float, default=60,
                    help="length of the requests-per-hour window (one commit per second)")
    ap.add_argument("--idle-tenants", type=int, default=1000,
                    help="tenants written once before the requests window (workload 4)")
    ap.add_argument("--only", choices=("throughput", "lag", "restore", "requests"),
                    help="run one workload")
    ap.add_argument("--dir", default="/var/tmp")
    args = ap.parse_args()
    want = lambda name: args.only in (None, name)
    root = tempfile.mkdtemp(prefix="fleetfs-bench-repl-", dir=args.dir)
    os.chmod(root, 0o755)
    replica = f"file://{root}/replica"
    agents = []
    try:
        # 1. throughput, replication off and on, interleaved.
        if want("throughput"):
            off = Agent(args.binary, root, "off", ["--replica", "off"])
            on = Agent(args.binary, root, "on", ["--replica", replica, "--sync-interval", "1s"])
            agents += [off, on]
            workloads = [("wal", "NORMAL"), ("wal", "FULL"), ("delete", "FULL")]
            rates = {(w, a): [] for w in workloads for a in ("off", "on")}
            for r in range(args.rounds):
                for w in workloads:
                    for name, agent in (("off", off), ("on", on)):
                        rel = tenant_path(args.binary, f"tp-{w[0]}-{w[1]}-{r}")
                        rates[(w, name)].append(
                            inserts(os.path.join(agent.mount, rel), w[0], w[1], args.count))
            print("1. write throughput through the mount, replication on (sync 1s) vs off, "
                  f"median of {args.rounds} rounds of {args.count} single-row transactions")
            for w in workloads:
                o = statistics.median(rates[(w, "off")])
                n = statistics.median(rates[(w, "on")])
                print(f"   {w[0]:6} {w[1]:6}  off {o:8.0f} txn/s   on {n:8.0f} txn/s   on/off {n / o:.2f}")
            m = on.metrics()
            print(f"   shipped {m['fleetfs_replication_snapshots_total']:.0f} snapshots and "
                  f"{m['fleetfs_replication_transactions_shipped_total']:.0f} transactions in segments, "
                  f"{m['fleetfs_replication_bytes_shipped_total'] / 2**20:.1f} MiB")
            on.stop()
            off.stop()
            agents.clear()

        # 2. lag at two sync intervals.
        if want("lag"):
            print(f"2. replication lag under a steady writer ({args.lag_rate:.0f} txn/s for "
                  f"{args.lag_seconds:.0f} s), commit to shipped")
            for interval in ("1s", "100ms"):
                a = Agent(args.binary, root, f"lag{interval}",
                          ["--replica", f"file://{root}/replica-{interval}", "--sync-interval", interval])
                agents.append(a)
                rel = tenant_path(args.binary, f"lag-{interval}")
                steady_writer(os.path.join(a.mount, rel), args.lag_rate, args.lag_seconds)
                time.sleep(1.5)  # the last round ships
                m = a.metrics()
                p50 = m['fleetfs_replication_lag_seconds{quantile="0.5"}']
                p99 = m['fleetfs_replication_lag_seconds{quantile="0.99"}']
                print(f"   sync {interval:6}  p50 {p50:.3f} s   p99 {p99:.3f} s")
                a.stop()
                agents.remove(a)

        # 3. restore of a large database versus cp.
        if want("restore"):
            a = Agent(args.binary, root, "big", ["--replica", replica, "--sync-interval", "1s"])
            agents.append(a)
            rel = tenant_path(args.binary, "bigtenant")
            db = sqlite3.connect(os.path.join(a.mount, rel), isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB)")
            rows = args.restore_mb * 1024 // 4  # 4 KiB rows: 3 KiB random, 1 KiB text
            batch = 2000
            for start in range(0, rows, batch):
                db.execute("BEGIN")
                db.execute("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?)"
                           " INSERT INTO t(v) SELECT randomblob(3072) || zeroblob(1024) FROM n",
                           (min(batch, rows - start),))
                db.execute("COMMIT")
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            db.close()
            a.stop()  # ships everything; the first ship of this run is a snapshot of the whole file
            agents.remove(a)
            local = os.path.join(a.backing, rel)
            size = os.path.getsize(local)
            # Warm both sources the same way: read each once.
            for path in [local] + [os.path.join(dp, f) for dp, _, fs in os.walk(f"{root}/replica") for f in fs]:
                with open(path, "rb") as f:
                    while f.read(1 << 24):
                        pass
            def cp():
                out = os.path.join(root, "cp.db")
                subprocess.run(["cp", local, out], check=True)
                subprocess.run(["sync", out], check=True)
                os.unlink(out)
            def restore():
                out = os.path.join(root, "restored.db")
                subprocess.run([args.binary, "restore", "bigtenant", "--replica", replica, "-o", out],
                               check=True, capture_output=True)
                os.unlink(out)
            cps, restores = [], []
            for _ in range(5):  # interleaved: the disk's mood affects both alike
                cps.append(timed(cp))
                restores.append(timed(restore))
            c, r = statistics.median(cps), statistics.median(restores)
            print(f"3. restore of a {size / 2**20:.0f} MiB database (median of 5): restore {r:.2f} s "
                  f"({size / 2**20 / r:.0f} MiB/s), cp {c:.2f} s ({size / 2**20 / c:.0f} MiB/s), "
                  f"restore/cp throughput {c / r:.2f}")

        # 4. requests to the destination per tenant per hour.
        if want("requests"):
            requests_per_hour(args.binary, root, agents, args.requests_seconds, args.idle_tenants)
    finally:
        for a in agents:
            try:
                a.stop()
            except Exception:
                a.proc.kill()
        for d in os.listdir(root):
            subprocess.run(["umount", "-l", os.path.join(root, d, "mnt")], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
