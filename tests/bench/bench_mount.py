#!/usr/bin/env python3
"""fleetfs mount benchmark: the same SQLite workloads direct on the backing
disk, through a minimal write-through passthrough (the floor any FUSE file
system pays) on /dev/fuse and on io_uring, and through fleetfs on each
transport (/dev/fuse, io_uring), in one run, interleaved; prints rates,
ratios (higher is better) and the FUSE requests each transaction costs.

Not a test: it asserts nothing about speed. Usage (as root):
  python3 tests/bench/bench_mount.py --binary build/agent/fleetfs \
      --passthrough build/tests/min_passthrough [--rounds 5]

Transport switches (issue 14): --passthrough-args gives the minpt side
min_passthrough's options; each --passthrough-variant NAME:ARGS adds one more
min_passthrough side with ARGS, run interleaved with the others; without
--binary fleetfs is not run; --only picks workloads (wal-full, wal-normal,
delete-full, delete-normal, reads).
"""
import argparse
import json
import os
import random
import shlex
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metrics(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    ops = {}
    for line in text.splitlines():
        if line.startswith("fleetfs_fuse_operations_total{"):
            op = line.split('"')[1]
            ops[op] = int(line.split()[-1])
    return ops


def inserts(path, journal_mode, synchronous, count):
    """Single-row insert transactions per second."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute(f"PRAGMA journal_mode={journal_mode}")
    db.execute(f"PRAGMA synchronous={synchronous}")
    db.execute("CREATE TABLE IF NOT EXISTS t(id INTEGER PRIMARY KEY, v TEXT)")
    started = time.perf_counter()
    for i in range(count):
        db.execute("INSERT INTO t(v) VALUES (?)", ("x" * 100,))
    took = time.perf_counter() - started
    db.close()
    return count / took


def build_big(path, megabytes):
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("CREATE TABLE big(id INTEGER PRIMARY KEY, pad BLOB)")
    rows = megabytes * 1000
    db.execute("BEGIN")
    for i in range(rows):
        db.execute("INSERT INTO big(pad) VALUES (randomblob(1000))")
    db.execute("COMMIT")
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    return rows


def drop_caches():
    subprocess.run(["sync"])
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def point_selects(path, rows, count, cold):
    if cold:
        drop_caches()
    db = sqlite3.connect(path)
    db.execute("PRAGMA cache_size=-1024")  # 1 MB: the pages are not in SQLite's cache
    rng = random.Random(7)
    started = time.perf_counter()
    for _ in range(count):
        db.execute("SELECT length(pad) FROM big WHERE id=?", (rng.randint(1, rows),)).fetchone()
    took = time.perf_counter() - started
    db.close()
    return count / took


def full_scan(path, cold):
    if cold:
        drop_caches()
    db = sqlite3.connect(path)
    db.execute("PRAGMA cache_size=-1024")
    size = os.path.getsize(path)
    started = time.perf_counter()
    db.execute("SELECT sum(length(pad)) FROM big").fetchone()
    took = time.perf_counter() - started
    db.close()
    return size / took / 1e6  # MB/s


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--binary", help="the fleetfs binary (without it, fleetfs is not run)")
    ap.add_argument("--passthrough", required=True, help="the min_passthrough binary")
    ap.add_argument("--passthrough-args", default="",
                    help="min_passthrough options for the minpt side, e.g. \"--clone-fd\"")
    ap.add_argument("--passthrough-variant", action="append", default=[], metavar="NAME:ARGS",
                    help="one more min_passthrough side with ARGS (repeatable)")
    ap.add_argument("--transports", default="dev_fuse,io_uring",
                    help="fleetfs sides, one agent per transport (default: dev_fuse,io_uring)")
    ap.add_argument("--no-uring-passthrough", action="store_true",
                    help="leave out the minpt-uring side (min_passthrough --transport io_uring)")
    ap.add_argument("--only", help="comma-separated workloads: wal-full, wal-normal, "
                    "delete-full, delete-normal, reads (default: all)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--megabytes", type=int, default=100)
    ap.add_argument("--dir", default="/var/tmp", help="where to make the work directory "
                    "(the same disk for both sides)")
    args = ap.parse_args()

    only = set(args.only.split(",")) if args.only else None
    root = tempfile.mkdtemp(prefix="fleetfs-bench-", dir=args.dir)
    direct = os.path.join(root, "direct")
    backing = os.path.join(root, "backing")
    os.makedirs(direct)
    # The min_passthrough sides: minpt (with --passthrough-args), then the variants.
    pt_sides = [("minpt", args.passthrough_args)]
    if not args.no_uring_passthrough:
        pt_sides.append(("minpt-uring", "--transport io_uring"))
    if not args.no_uring_passthrough or "io_uring" in args.transports:
        # FUSE over io_uring is off in the kernel until root turns it on.
        with open("/sys/module/fuse/parameters/enable_uring", "w") as f:
            f.write("Y\n")
    for v in args.passthrough_variant:
        name, _, vargs = v.partition(":")
        pt_sides.append((name, vargs))
    pt_mounts, passthroughs = [], []
    for i, (_, pt_args) in enumerate(pt_sides):
        suffix = "" if i == 0 else f"-{i}"
        pt_backing = os.path.join(root, "pt-backing" + suffix)
        pt_mount = os.path.join(root, "pt-mnt" + suffix)
        os.makedirs(pt_backing)
        os.makedirs(pt_mount)
        for b in range(256):
            os.makedirs(os.path.join(pt_backing, f"{b:03d}"))
        passthroughs.append(subprocess.Popen([args.passthrough, *shlex.split(pt_args),
                                              pt_backing, pt_mount]))
        pt_mounts.append(pt_mount)
    # The fleetfs sides: one agent per transport asked for.
    agents = []  # (name, process, port, mount)
    if args.binary:
        for transport in [t for t in args.transports.split(",") if t]:
            name = "fleetfs" if transport == "dev_fuse" else f"fleetfs-{transport.replace('_', '')}"
            a_backing = os.path.join(root, f"backing-{transport}")
            a_mount = os.path.join(root, f"mnt-{transport}")
            os.makedirs(a_backing)
            os.makedirs(a_mount)
            port = free_port()
            log = open(os.path.join(root, f"agent-{transport}.log"), "wb")
            proc = subprocess.Popen([args.binary, "mount", "--backing", a_backing, "--mount",
                                     a_mount, "--store", f"sqlite://{root}/control-{transport}.db",
                                     "--owner", "bench", "--ttl", "30s", "--admin",
                                     f"127.0.0.1:{port}", "--transport", transport],
                                    stdout=log, stderr=subprocess.STDOUT)
            agents.append((name, proc, port, a_mount, log.name))
    names = ["direct"] + [n for n, _ in pt_sides] + [a[0] for a in agents]
    try:
        for name, proc, port, a_mount, log_name in agents:
            deadline = time.monotonic() + 20
            while True:
                try:
                    with open(os.path.join(a_mount, ".fleetfs", "status.json")) as f:
                        if json.load(f)["ranges"][0]["state"] == "serving":
                            break
                except (OSError, ValueError, KeyError):
                    pass
                if time.monotonic() > deadline or proc.poll() is not None:
                    sys.exit(f"{name} did not start serving; see " + log_name)
                time.sleep(0.05)
        def paths(name):
            # One tenant per workload and round, at its own bucket path.
            if agents:
                r = json.loads(subprocess.run([args.binary, "slot", "--json", name],
                                              capture_output=True, text=True,
                                              check=True).stdout)[0]["tenant_path"]
            else:
                r = f"{sum(name.encode()) % 256:03d}/{name}.db"
            os.makedirs(os.path.join(direct, r.split("/")[0]), exist_ok=True)
            return ([os.path.join(direct, r)] + [os.path.join(m, r) for m in pt_mounts] +
                    [os.path.join(a[3], r) for a in agents])

        for pt_mount in pt_mounts:
            while not os.path.ismount(pt_mount):
                time.sleep(0.05)
        results = []
        workloads = [
            ("WAL, synchronous=FULL, 1-row insert txn/s", "wal", "FULL", 1500),
            ("WAL, synchronous=NORMAL, 1-row insert txn/s", "wal", "NORMAL", 8000),
            ("rollback journal, synchronous=FULL, 1-row insert txn/s", "delete", "FULL", 600),
            ("rollback journal, synchronous=NORMAL, 1-row insert txn/s", "delete", "NORMAL", 1500),
        ]
        for title, mode, sync, count in workloads:
            if only and f"{mode}-{sync.lower()}" not in only:
                continue
            rates, requests = [[] for _ in names], {}
            first_agent = len(names) - len(agents)
            for r in range(args.rounds):
                where = paths(f"w-{mode}-{sync.lower()}-{r}")
                for side in range(len(names)):
                    if side < first_agent:
                        rates[side].append(inserts(where[side], mode, sync, count))
                        continue
                    port = agents[side - first_agent][2]
                    before = metrics(port)
                    rates[side].append(inserts(where[side], mode, sync, count))
                    after = metrics(port)
                    if side == first_agent:  # requests are the same on every transport
                        for op in after:
                            requests.setdefault(op, []).append((after[op] - before.get(op, 0)) / count)
            per_txn = {op: statistics.median(v) for op, v in requests.items()
                       if statistics.median(v) >= 0.05}
            results.append((title, [statistics.median(x) for x in rates], per_txn))

        # Reads on a 100 MB database whose pages are not in SQLite's cache.
        big = paths("big") if not only or "reads" in only else []
        rows = build_big(big[0], args.megabytes) if big else 0
        for path in big[1:]:
            build_big(path, args.megabytes)
        for title, fn in [] if not big else [
            ("point selects/s, page cache warm", lambda p: point_selects(p, rows, 20000, False)),
            ("point selects/s, page cache dropped", lambda p: point_selects(p, rows, 3000, True)),
            ("full scan MB/s, page cache warm", lambda p: full_scan(p, False)),
            ("full scan MB/s, page cache dropped", lambda p: full_scan(p, True)),
        ]:
            rates = [[] for _ in names]
            for _ in range(args.rounds):
                for side in range(len(names)):
                    rates[side].append(fn(big[side]))
            results.append((title, [statistics.median(x) for x in rates], {}))

        print(f"fleetfs mount benchmark: {args.rounds} interleaved rounds, medians; "
              f"{os.cpu_count()} CPUs; kernel {os.uname().release}; SQLite {sqlite3.sqlite_version}")
        for name, pt_args in pt_sides:
            print(f"  {name}: min_passthrough {pt_args or '(no options)'}")
        width = max(8, *(len(n) for n in names))
        print(f"{'workload':56} " + " ".join(f"{n:>{width}}" for n in names) + "  " +
              " ".join(f"{n + '/d':>{len(n) + 2}}" for n in names[1:]))
        for title, medians, per_txn in results:
            d = medians[0]
            print(f"{title:56} " + " ".join(f"{x:{width}.0f}" for x in medians) + "  " +
                  " ".join(f"{x / d:{len(n) + 2}.2f}"
                           for n, x in zip(names[1:], medians[1:])))
        if agents:
            print("\nFUSE requests per transaction through fleetfs (median):")
        for title, _, per_txn in results:
            if per_txn:
                ops = ", ".join(f"{op} {n:.1f}" for op, n in sorted(per_txn.items(),
                                                                   key=lambda kv: -kv[1]))
                print(f"  {title}: {sum(per_txn.values()):.1f} = {ops}")
    finally:
        for name, proc, port, a_mount, log_name in agents:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                subprocess.run(["umount", "-l", a_mount])
        for pt_mount, passthrough in zip(pt_mounts, passthroughs):
            subprocess.run(["umount", pt_mount])
            try:
                passthrough.wait(10)
            except subprocess.TimeoutExpired:
                passthrough.kill()
                subprocess.run(["umount", "-l", pt_mount])
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
