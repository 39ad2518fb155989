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
     Measured at sync 1 s and --requests-intervals' others (default 10 s);
     with the monthly request cost at AWS S3 list prices for 10,000 tenants
     each committing once per second, measured intervals beside computed
     ones (one create per interval);
  5. (with 4) the periodic snapshot and its retention pass, scaled down (a
     snapshot every 10 s, retention 60 s): the requests per object removed,
     from which 4's cost adds the hourly snapshot and its pass at the
     defaults (1 h, 72 h).

--replica-kind s3 runs the same workloads with the replicas in a bucket of
the test S3 server (tests/s3/s3_fixture.py: s3rver on loopback), and
--s3-latency-ms N puts the fault proxy in front of it, delaying every
request by N ms (a remote store's round trip). Workload 4 always goes
through the proxy there, which counts the requests on the wire by HTTP
method beside the agent's own counts. s3rver on loopback is not AWS: the
request counts and the cost carry over, throughput and latency do not.

Not a test: it asserts nothing about speed. Usage (as root):
  python3 tests/bench/bench_replication.py --binary build/agent/fleetfs
  python3 tests/bench/bench_replication.py --binary build/agent/fleetfs --only requests
  python3 tests/bench/bench_replication.py --binary build/agent/fleetfs --replica-kind s3 \
      [--s3-latency-ms 20]
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
import sys
import tempfile
import threading
import time
import urllib.request

from bench_mount import free_port, inserts  # the same workload as the mount benchmark

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "s3"))
from s3_fixture import FaultProxy, S3Server  # noqa: E402

# AWS S3 Standard request prices, us-east-1, as listed on
# https://aws.amazon.com/s3/pricing/ and quoted by issue 12 (2026-12-02):
# PUT, COPY, POST and LIST $0.005 per 1,000; GET, SELECT and every other
# request $0.0004 per 1,000; DELETE free. A month is AWS's 730 hours.
PRICES_AS_OF = "2026-12-02"
PRICE_PUT_LIST = 0.005 / 1000
PRICE_GET_OTHER = 0.0004 / 1000
HOURS_PER_MONTH = 730
FLEET_TENANTS = 10_000
# The destination's request kinds by S3 price class (fleet/replica/
# counting_destination.h): a create or put is a PUT (If-None-Match: * for a
# create), a list or clean_temps a LIST, a probe a PUT (and a free DELETE);
# get, head (a ranged GET of the header) and size (HEAD) are GETs and others;
# remove is a DELETE.
PUT_LIST_KINDS = ("create", "put", "list", "probe", "clean_temps")
GET_OTHER_KINDS = ("get", "head", "size")


def duration_s(text):
    for unit, scale in (("ms", 0.001), ("s", 1), ("m", 60), ("h", 3600)):
        if text.endswith(unit) and text[:-len(unit)].replace(".", "", 1).isdigit():
            return float(text[:-len(unit)]) * scale
    raise ValueError(f"{text!r} is not a duration (1s, 10s, 500ms, 1m)")


class Replicas:
    """Where the agents' replicas go: directories under the run's root
    (file), or prefixes of one bucket in the test S3 server (s3), reached
    directly or through a fault proxy that delays each request by
    latency_ms. Every agent and restore gets its own name."""

    def __init__(self, kind, root, latency_ms):
        self.kind = kind
        self.root = root
        self.latency_ms = latency_ms
        self.server = None
        self.proxies = []
        self.proxy = None
        if kind == "s3":
            self.server = S3Server(conditional=True)
            if latency_ms > 0:
                self.proxy = self.new_proxy()

    def new_proxy(self):
        """A fault proxy in front of the server, at the run's latency."""
        proxy = FaultProxy(self.server.endpoint)
        self.proxies.append(proxy)
        if self.latency_ms > 0:
            proxy.set_mode("latency", ms=self.latency_ms)
        return proxy

    def args(self, name, proxy=None):
        """--replica and its endpoint for the replica `name`; `proxy` (or
        the run's latency proxy) in front of the server when given."""
        if self.kind == "file":
            return ["--replica", f"file://{self.root}/replica-{name}"]
        via = proxy or self.proxy
        endpoint = via.endpoint if via else self.server.endpoint
        return ["--replica", f"s3://{self.server.bucket}/{name}", "--replica-endpoint", endpoint]

    def env(self):
        if self.kind == "file":
            return dict(os.environ)
        return {**os.environ, **self.server.env()}

    def stored_files(self, name):
        """The files holding the replica `name`, to warm the page cache."""
        top = (os.path.join(self.root, f"replica-{name}") if self.kind == "file"
               else self.server.data_dir)
        return [os.path.join(dp, f) for dp, _, fs in os.walk(top) for f in fs]

    def describe(self):
        if self.kind == "file":
            return "file:// (a directory on the same disk)"
        via = (f", through a fault proxy adding {self.latency_ms} ms to every request"
               if self.latency_ms > 0 else "")
        return f"s3:// (s3rver on loopback{via})"

    def close(self):
        for p in self.proxies:
            p.stop()
        self.proxies.clear()
        if self.server is not None:
            self.server.stop()
            self.server = None


class Agent:
    def __init__(self, binary, root, name, extra, env=None):
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
            stdout=self.log, stderr=subprocess.STDOUT, env=env)
        deadline = time.time() + 20
        while time.time() < deadline:
            try:
                with open(os.path.join(self.mount, ".fleetfs", "status.json")) as f:
                    if all(r["state"] == "serving" for r in json.load(f)["ranges"]):
                        return
            except (OSError, ValueError):
                pass
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.proc.kill()
        self.proc.wait()
        self.log.close()
        with open(os.path.join(self.dir, "agent.log"), errors="replace") as f:
            tail = "".join(f.readlines()[-20:])
        raise RuntimeError(f"agent {name} did not start serving; its log ends:\n{tail}")

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
        try:
            self.proc.wait(60)
        finally:
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


def requests_per_hour(binary, root, agents, replicas, seconds, idle, interval):
    """One tenant committing once per second: requests to the destination in
    steady state (after the tenant's creation, first snapshot and the claim's
    warm-up listing), extrapolated to an hour; and the shipper's visits per
    round, with `idle` other tenants written once before the window. With an
    s3:// replica the agent reaches the server through a fault proxy of its
    own, which counts the requests on the wire."""
    name = f"requests-{interval}"
    proxy = replicas.new_proxy() if replicas.kind == "s3" else None
    a = Agent(binary, root, name, [*replicas.args(name, proxy), "--sync-interval", interval],
              env=replicas.env())
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
    wait_shipped(a, timeout=300)
    # The claim's warm-up lists the range's buckets in the background: start
    # once the counts stand still.
    before = requests(a)
    for _ in range(20):
        time.sleep(0.5)
        now = requests(a)
        if now == before:
            break
        before = now
    wire_before = proxy.counts() if proxy else {}
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
    wait_shipped(a, timeout=300)
    window = time.perf_counter() - window_started
    visits = a.metrics()["fleetfs_replication_tenant_visits_total"] - visits_before
    after = requests(a)
    wire_after = proxy.counts() if proxy else {}
    db.close()
    a.stop()
    agents.remove(a)
    per_hour = 3600 / seconds
    return {
        "interval": interval,
        "seconds": seconds,
        "per_hour": {k: (after[k] - before[k]) * per_hour for k in REQUEST_KINDS + ("failures",)},
        "wire_per_hour": {m: (wire_after.get(m, 0) - wire_before.get(m, 0)) * per_hour
                          for m in sorted(set(wire_after) | set(wire_before))},
        "commits": commits,
        "creates": after["create"] - before["create"],
        "visits": visits,
        "window": window,
        "idle": idle,
    }


def commit_every_second(db, seconds):
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
    return commits


def retention_cycles(binary, root, agents, replicas, snapshot_s, retention_s, cycles):
    """The periodic snapshot and the retention pass after it, scaled down:
    one tenant committing once per second at sync 1 s, a snapshot every
    `snapshot_s` and `retention_s` of retention (the agent's minimum is 60 s),
    counted over `cycles` snapshot cycles once the log holds more than the
    retention. What one cycle costs besides its segments is what the hourly
    snapshot and its pass cost at the defaults, but for the log's length."""
    name = "retention"
    proxy = replicas.new_proxy() if replicas.kind == "s3" else None
    a = Agent(binary, root, name,
              [*replicas.args(name, proxy), "--sync-interval", "1s",
               "--snapshot-interval", f"{snapshot_s}s", "--retention", f"{retention_s}s"],
              env=replicas.env())
    agents.append(a)
    db = sqlite3.connect(os.path.join(a.mount, tenant_path(binary, "retention-tenant")),
                         isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)")
    commit_every_second(db, retention_s + 2 * snapshot_s)  # the log outgrows the retention
    before = requests(a)
    snaps_before = a.metrics()["fleetfs_replication_snapshots_total"]
    wire_before = proxy.counts() if proxy else {}
    commit_every_second(db, cycles * snapshot_s)
    wait_shipped(a, timeout=300)
    after = requests(a)
    snaps = a.metrics()["fleetfs_replication_snapshots_total"] - snaps_before
    wire_after = proxy.counts() if proxy else {}
    db.close()
    a.stop()
    agents.remove(a)
    per_cycle = {k: (after[k] - before[k]) / cycles for k in REQUEST_KINDS + ("failures",)}
    wire = {m: (wire_after.get(m, 0) - wire_before.get(m, 0)) / cycles
            for m in sorted(set(wire_after) | set(wire_before))}
    snaps /= cycles
    segments = per_cycle["create"] - snaps
    # On the wire a LIST is a GET: what the GETs hold beyond the agent's
    # gets, header reads and lists are listings inside other calls.
    # (Means of counts: a tiny negative difference is rounding, not a count.)
    hidden_lists = (max(0.0, wire.get("GET", 0) - per_cycle["get"] - per_cycle["head"]
                        - per_cycle["list"]) if proxy else 0.0)
    removed = per_cycle["remove"]
    lines = [
        f"5. the snapshot and its retention pass, scaled down: one tenant committing once per "
        f"second, sync 1s, a snapshot every {snapshot_s} s, retention {retention_s} s, replica "
        f"{replicas.describe()}; per snapshot cycle, mean of {cycles} once the log outgrew the "
        f"retention (measured)",
        f"   snapshots {snaps:.1f}   segment creates {segments:.1f}   "
        + "   ".join(f"{k} {per_cycle[k]:.1f}" for k in REQUEST_KINDS if k != "create")
        + f"   failures {per_cycle['failures']:.1f}"]
    if proxy:
        lines.append(
            "   on the wire (the fault proxy's count by HTTP method): "
            + "   ".join(f"{m} {n:.1f}" for m, n in wire.items())
            + f"; LISTs beyond the agent's lists: {hidden_lists:.1f} per cycle, "
            f"{hidden_lists / removed if removed else 0:.2f} per object removed")
    return {"lines": lines, "list_per_remove": hidden_lists / removed if removed else 0.0,
            "head_per_remove": per_cycle["head"] / removed if removed else 1.0}


def monthly_cost(per_hour):
    """Dollars a month of requests for the fleet, from one tenant's requests per hour."""
    put_list = sum(per_hour.get(k, 0) for k in PUT_LIST_KINDS)
    get_other = sum(per_hour.get(k, 0) for k in GET_OTHER_KINDS)
    hourly = put_list * PRICE_PUT_LIST + get_other * PRICE_GET_OTHER
    return FLEET_TENANTS * HOURS_PER_MONTH * hourly, FLEET_TENANTS * (put_list + get_other)


def outside_window(interval_s, retention_s, cycle, snapshot_s=3600):
    """Per tenant per hour, computed: the periodic snapshot (one create) and
    the retention pass after it, which lists the whole log (one LIST per
    1,000 objects on S3), reads the header of each object it removes (a
    ranged GET; `cycle` has how many per object removed, measured) and
    removes it (a free DELETE, plus the LISTs per removal `cycle` measured on
    the wire). In steady state it removes an hour's objects: 3600/interval
    segments and the snapshot."""
    per_snapshot = 3600 / snapshot_s
    objects = retention_s / interval_s + retention_s / snapshot_s
    removed = 3600 / interval_s + per_snapshot
    return {"create": per_snapshot,
            "list": per_snapshot * -(-objects // 1000) + removed * cycle["list_per_remove"],
            "head": removed * cycle["head_per_remove"], "remove": removed}


def print_requests(runs, cost_intervals, replicas, retention_s, cycle):
    first = runs[0]
    print(f"4. requests to the destination per tenant per hour, replica {replicas.describe()}: one "
          f"tenant committing once per second, in steady state; a measured row is a window of "
          f"the given length x(3600/length) (the hourly snapshot and its retention pass fall "
          f"outside it); a computed row is one create per sync interval")
    kinds = REQUEST_KINDS + ("failures",)
    print("   sync   " + "".join(f"{k:>12}" for k in kinds) + "   creates/rounds  how")
    rows = []
    for r in runs:
        rounds = r["seconds"] / duration_s(r["interval"])
        rows.append((r["interval"], r["per_hour"],
                     f"{r['creates'] / rounds:14.2f}  measured ({r['seconds']:.0f} s window, "
                     f"{r['commits']} commits, {r['creates']:.0f} creates)"))
    measured = {r["interval"] for r in runs}
    for interval in cost_intervals:
        if interval not in measured:
            per_hour = {k: 0.0 for k in kinds}
            per_hour["create"] = 3600 / duration_s(interval)
            rows.append((interval, per_hour, f"{'':14}  computed"))
    rows.sort(key=lambda row: duration_s(row[0]))
    for interval, per_hour, how in rows:
        print(f"   {interval:6} " + "".join(f"{per_hour[k]:12.0f}" for k in kinds) + f" {how}")
    for r in runs:
        if r["wire_per_hour"]:
            wire = "  ".join(f"{m} {n:.0f}" for m, n in r["wire_per_hour"].items()) or "none"
            print(f"   on the wire (the fault proxy's count by HTTP method, per hour), sync "
                  f"{r['interval']}: {wire}")
    print(f"   tenants visited per round at sync {first['interval']}: "
          f"{first['visits'] / first['window'] * duration_s(first['interval']):.2f} (visits "
          f"{first['visits']:.0f} over {first['window']:.0f} s), with {first['idle']} other tenants "
          f"written once before the window (the goal: the one written)")
    print(f"   monthly request cost at AWS S3 Standard list prices (us-east-1, as of {PRICES_AS_OF}: "
          f"PUT/COPY/POST/LIST $0.005 per 1,000, GET and other $0.0004 per 1,000, DELETE free; "
          f"{HOURS_PER_MONTH} h a month) for {FLEET_TENANTS:,} tenants each committing once per "
          f"second; 'all' adds the hourly snapshot and its retention pass ({retention_s / 3600:.0f} h "
          f"retention), computed from workload 5's requests per object removed (header reads "
          f"{cycle['head_per_remove']:.2f}, LISTs inside removals {cycle['list_per_remove']:.2f})")
    for interval, per_hour, how in rows:
        cost, billed = monthly_cost(per_hour)
        extra = outside_window(duration_s(interval), retention_s, cycle)
        total = {k: per_hour.get(k, 0) + extra.get(k, 0) for k in set(per_hour) | set(extra)}
        all_cost, all_billed = monthly_cost(total)
        print(f"   sync {interval:6} (loses at most {interval} of commits)  {billed:13,.0f} billed requests/h "
              f"${cost:9,.0f} a month   all: {all_billed:13,.0f} billed requests/h ${all_cost:9,.0f} a month"
              f"   ({how.split()[-1] if 'computed' in how else 'measured'}; retention: "
              f"{extra['list']:.0f} LISTs and {extra['head']:.0f} GETs an hour)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--count", type=int, default=10000, help="transactions per throughput run")
    ap.add_argument("--lag-seconds", type=float, default=15)
    ap.add_argument("--lag-rate", type=float, default=200, help="transactions per second")
    ap.add_argument("--restore-mb", type=int, default=1024)
    ap.add_argument("--requests-seconds", type=float, default=60,
                    help="length of the requests-per-hour window (one commit per second); at "
                         "least 6 sync intervals are measured")
    ap.add_argument("--requests-intervals", default="1s,10s",
                    help="sync intervals workload 4 measures (the first also counts visits)")
    ap.add_argument("--cost-intervals", default="1s,10s,60s",
                    help="sync intervals the cost table shows; those not measured are computed")
    ap.add_argument("--retention-snapshot-s", type=int, default=10,
                    help="workload 5's snapshot interval (seconds; retention is 60 s)")
    ap.add_argument("--retention-cycles", type=int, default=6,
                    help="snapshot cycles workload 5 counts")
    ap.add_argument("--idle-tenants", type=int, default=1000,
                    help="tenants written once before the requests window (workload 4)")
    ap.add_argument("--replica-kind", choices=("file", "s3"), default="file",
                    help="file: a directory; s3: a bucket of the test S3 server (tests/s3)")
    ap.add_argument("--s3-latency-ms", type=int, default=0,
                    help="with --replica-kind s3: delay every request by this much (fault proxy)")
    ap.add_argument("--only", choices=("throughput", "lag", "restore", "requests"),
                    help="run one workload")
    ap.add_argument("--dir", default="/var/tmp")
    args = ap.parse_args()
    if args.s3_latency_ms and args.replica_kind != "s3":
        ap.error("--s3-latency-ms goes with --replica-kind s3")
    for text in args.requests_intervals.split(",") + args.cost_intervals.split(","):
        try:
            duration_s(text)
        except ValueError as e:
            ap.error(str(e))
    want = lambda name: args.only in (None, name)
    # A SIGTERM or SIGHUP unwinds like Ctrl-C: the finally below stops the
    # agents, unmounts, and stops the S3 server and proxies.
    def interrupted(signum, _frame):
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGHUP, interrupted)
    root = tempfile.mkdtemp(prefix="fleetfs-bench-repl-", dir=args.dir)
    os.chmod(root, 0o755)
    agents = []
    replicas = None
    try:
        replicas = Replicas(args.replica_kind, root, args.s3_latency_ms)
        env = replicas.env()
        print(f"replica: {replicas.describe()}")
        # 1. throughput, replication off and on, interleaved.
        if want("throughput"):
            off = Agent(args.binary, root, "off", ["--replica", "off"])
            agents.append(off)
            on = Agent(args.binary, root, "on", [*replicas.args("on"), "--sync-interval", "1s"], env=env)
            agents.append(on)
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
            agents.remove(on)
            off.stop()
            agents.remove(off)

        # 2. lag at two sync intervals.
        if want("lag"):
            print(f"2. replication lag under a steady writer ({args.lag_rate:.0f} txn/s for "
                  f"{args.lag_seconds:.0f} s), commit to shipped")
            for interval in ("1s", "100ms"):
                a = Agent(args.binary, root, f"lag{interval}",
                          [*replicas.args(f"lag-{interval}"), "--sync-interval", interval], env=env)
                agents.append(a)
                rel = tenant_path(args.binary, f"lag-{interval}")
                steady_writer(os.path.join(a.mount, rel), args.lag_rate, args.lag_seconds)
                wait_shipped(a, timeout=120)  # the last round ships
                m = a.metrics()
                p50 = m['fleetfs_replication_lag_seconds{quantile="0.5"}']
                p99 = m['fleetfs_replication_lag_seconds{quantile="0.99"}']
                print(f"   sync {interval:6}  p50 {p50:.3f} s   p99 {p99:.3f} s")
                a.stop()
                agents.remove(a)

        # 3. restore of a large database versus cp.
        if want("restore"):
            a = Agent(args.binary, root, "big", [*replicas.args("big"), "--sync-interval", "1s"], env=env)
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
            for path in [local] + replicas.stored_files("big"):
                with open(path, "rb") as f:
                    while f.read(1 << 24):
                        pass
            def cp():
                out = os.path.join(root, "cp.db")
                subprocess.run(["cp", local, out], check=True)
                subprocess.run(["sync", out], check=True)
                os.unlink(out)
            def restore(replica_args):
                out = os.path.join(root, "restored.db")
                subprocess.run([args.binary, "restore", "bigtenant", *replica_args, "-o", out],
                               check=True, capture_output=True, env=env)
                os.unlink(out)
            cps, restores = [], []
            for _ in range(5):  # interleaved: the disk's mood affects both alike
                cps.append(timed(cp))
                restores.append(timed(lambda: restore(replicas.args("big"))))
            c, r = statistics.median(cps), statistics.median(restores)
            print(f"3. restore of a {size / 2**20:.0f} MiB database (median of 5) from "
                  f"{replicas.describe()}: restore {r:.2f} s ({size / 2**20 / r:.0f} MiB/s), cp {c:.2f} s "
                  f"({size / 2**20 / c:.0f} MiB/s), restore/cp throughput {c / r:.2f}")
            if replicas.kind == "s3":
                # One more restore through a proxy of its own, to count its requests.
                proxy = replicas.new_proxy()
                took = timed(lambda: restore(replicas.args("big", proxy)))
                wire = "  ".join(f"{m} {n}" for m, n in sorted(proxy.counts().items()))
                print(f"   one restore's requests on the wire (through a counting proxy, "
                      f"{took:.2f} s): {wire}")

        # 4. requests to the destination per tenant per hour.
        if want("requests"):
            runs = []
            for n, interval in enumerate(args.requests_intervals.split(",")):
                seconds = max(args.requests_seconds, 6 * duration_s(interval))
                runs.append(requests_per_hour(args.binary, root, agents, replicas, seconds,
                                              args.idle_tenants if n == 0 else 0, interval))
            cycle = retention_cycles(args.binary, root, agents, replicas, args.retention_snapshot_s,
                                     60, args.retention_cycles)
            print_requests(runs, args.cost_intervals.split(","), replicas, 72 * 3600, cycle)
            print("\n".join(cycle["lines"]))
    finally:
        for a in agents:
            try:
                a.stop()
            except Exception:
                a.proc.kill()
        for d in os.listdir(root):
            subprocess.run(["umount", "-l", os.path.join(root, d, "mnt")], capture_output=True)
        if replicas is not None:
            replicas.close()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
