#!/usr/bin/env python3
"""fleetfs at fleet scale: one host, a large fleet of small tenant files of
which a few are active. For each fleet size it measures, in one run:
  - time to serve after start, and the agent's resident memory and CPU per
    second while idle;
  - lookup (stat) and open (connect + first query) latency p50/p99 of
    tenants nobody touched yet, through the mount and direct on the backing
    disk (the baseline, same run);
  - the agent's memory and CPU per second while the active tenants commit
    (writers round-robin over them), and the commits per second;
  - `fleetfs ls --json` over the served fleet: time and lines.
The claim to check: memory and per-second work follow the active tenants,
not the fleet's size. So the same active set runs on a small fleet
(--compare) and on the large one, and the ratios are printed.

Not a test: it asserts nothing about speed. Usage (as root):
  python3 tests/bench/bench_scale.py --binary build/agent/fleetfs \
      --tenants 1000000 --active 10000 --compare 20000
Needs about 4.5 KiB of disk and one inode per tenant (1M: ~4.5 GB).
"""
import argparse
import json
import multiprocessing
import os
import random
import resource
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tenant_paths(binary, keys, chunk=20000):
    """The product's own mapping (fleetfs slot), in chunks of keys."""
    out = []
    for i in range(0, len(keys), chunk):
        r = subprocess.run([binary, "slot", "--json", *keys[i:i + chunk]],
                           capture_output=True, text=True, check=True)
        out.extend(k["tenant_path"] for k in json.loads(r.stdout))
    if len(out) != len(keys):
        raise RuntimeError(f"fleetfs slot gave {len(out)} paths for {len(keys)} keys")
    return out


def template_bytes(root):
    """A small SQLite database (512-byte pages, rollback journal, one table)."""
    path = os.path.join(root, "template.db")
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA page_size=512")
    db.execute("PRAGMA journal_mode=DELETE")
    db.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)")
    db.execute("INSERT INTO t(v) VALUES ('born')")
    db.close()
    with open(path, "rb") as f:
        data = f.read()
    os.unlink(path)
    return data


def make_fleet(backing, rels, data):
    for b in range(256):
        os.makedirs(os.path.join(backing, f"{b:03d}"), exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    for rel in rels:
        fd = os.open(os.path.join(backing, rel), flags, 0o644)
        os.write(fd, data)
        os.close(fd)


def proc_cpu_s(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


class Agent:
    def __init__(self, binary, root, backing, extra):
        self.mount = os.path.join(root, "mnt")
        os.makedirs(self.mount, exist_ok=True)
        self.port = free_port()
        self.log_path = os.path.join(root, "agent.log")
        self.log = open(self.log_path, "wb")
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(
            [binary, "mount", "--backing", backing, "--mount", self.mount,
             "--store", f"sqlite://{root}/control.db", "--owner", "scale", "--ttl", "30s",
             "--admin", f"127.0.0.1:{self.port}", *extra],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 600
        while time.time() < deadline:
            try:
                with open(os.path.join(self.mount, ".fleetfs", "status.json")) as f:
                    if all(r["state"] == "serving" for r in json.load(f)["ranges"]):
                        self.serving_s = time.perf_counter() - self.started
                        return
            except (OSError, ValueError):
                pass
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.proc.kill()
        self.proc.wait()
        with open(self.log_path, errors="replace") as f:
            tail = "".join(f.readlines()[-20:])
        raise RuntimeError(f"the agent did not start serving; its log ends:\n{tail}")

    def sample(self, seconds):
        """(RSS MiB at the end, max RSS MiB, CPU seconds per second) over `seconds`."""
        cpu0, t0 = proc_cpu_s(self.proc.pid), time.perf_counter()
        peak = proc_rss_mib(self.proc.pid)
        end = t0 + seconds
        while time.perf_counter() < end:
            time.sleep(0.25)
            peak = max(peak, proc_rss_mib(self.proc.pid))
        cpu = (proc_cpu_s(self.proc.pid) - cpu0) / (time.perf_counter() - t0)
        return proc_rss_mib(self.proc.pid), peak, cpu

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(120)
        finally:
            self.log.close()


def pct(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * p))]


def first_touch_latency(root, rels):
    """stat, then connect + first query, of tenants not touched before."""
    stat_s, open_s = [], []
    for rel in rels:
        path = os.path.join(root, rel)
        t0 = time.perf_counter()
        os.stat(path)
        t1 = time.perf_counter()
        db = sqlite3.connect(path)
        db.execute("SELECT count(*) FROM t").fetchone()
        db.close()
        t2 = time.perf_counter()
        stat_s.append(t1 - t0)
        open_s.append(t2 - t1)
    return stat_s, open_s


def writer(mount, rels, stop_at, counter):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    dbs = [sqlite3.connect(os.path.join(mount, rel), isolation_level=None) for rel in rels]
    done = 0
    while time.time() < stop_at:
        for db in dbs:
            db.execute("INSERT INTO t(v) VALUES ('active')")
            done += 1
            if time.time() >= stop_at:
                break
    for db in dbs:
        db.close()
    with counter.get_lock():
        counter.value += done


def run_fleet(args, count, root):
    print(f"\n== fleet of {count:,} tenants, {args.active:,} active ==", flush=True)
    keys = [f"t{i:07d}" for i in range(count)]
    rels = tenant_paths(args.binary, keys)
    backing = os.path.join(root, "backing")
    t0 = time.perf_counter()
    make_fleet(backing, rels, template_bytes(root))
    print(f"created {count:,} files in {time.perf_counter() - t0:.1f} s", flush=True)
    extra = []
    if args.replica == "file":
        replica = os.path.join(root, "replica")
        os.makedirs(replica)
        extra = ["--replica", f"file://{replica}", "--sync-interval", "1s"]
    agent = Agent(args.binary, root, backing, extra)
    out = {"tenants": count, "serving_s": agent.serving_s}
    try:
        rss, peak, cpu = agent.sample(args.idle)
        out.update(idle_rss=rss, idle_cpu=cpu)
        rng = random.Random(7)
        active = rels[:args.active]
        cold = rng.sample(rels[args.active:], args.samples * 2)
        stat_m, open_m = first_touch_latency(agent.mount, cold[:args.samples])
        stat_d, open_d = first_touch_latency(backing, cold[args.samples:])
        out.update(stat_mount=stat_m, open_mount=open_m, stat_direct=stat_d, open_direct=open_d)

        counter = multiprocessing.Value("q", 0)
        per = (len(active) + args.writers - 1) // args.writers
        stop_at = time.time() + args.seconds + 5
        procs = [multiprocessing.Process(target=writer, args=(
            agent.mount, active[i * per:(i + 1) * per], stop_at, counter))
            for i in range(args.writers)]
        for p in procs:
            p.start()
        time.sleep(5)  # the writers open their tenants first
        rss, peak, cpu = agent.sample(args.seconds)
        for p in procs:
            p.join()
        out.update(load_rss=rss, load_peak=peak, load_cpu=cpu,
                   commits_per_s=counter.value / (args.seconds + 5))

        t0 = time.perf_counter()
        r = subprocess.run([args.binary, "ls", agent.mount, "--json"], capture_output=True)
        out["ls_s"] = time.perf_counter() - t0
        out["ls_lines"] = r.stdout.count(b"\n") if r.returncode == 0 else None
        if r.returncode != 0:
            out["ls_error"] = r.stderr.decode(errors="replace").strip()[:200]
        out["ls_rss"] = proc_rss_mib(agent.proc.pid)
    finally:
        t0 = time.perf_counter()
        agent.stop()
        out["stop_s"] = time.perf_counter() - t0
    ms = lambda v: f"{v * 1000:.2f} ms"
    print(f"serving {out['serving_s']:.2f} s after start; stopped in {out['stop_s']:.2f} s")
    print(f"idle: RSS {out['idle_rss']:.1f} MiB, CPU {out['idle_cpu']:.3f} s/s")
    for what in ("stat", "open"):
        m, d = out[f"{what}_mount"], out[f"{what}_direct"]
        print(f"first {what} of an untouched tenant: mount p50 {ms(pct(m, .5))} "
              f"p99 {ms(pct(m, .99))}; direct p50 {ms(pct(d, .5))} p99 {ms(pct(d, .99))}")
    print(f"{args.active:,} active: {out['commits_per_s']:.0f} commits/s, agent RSS "
          f"{out['load_rss']:.1f} MiB (peak {out['load_peak']:.1f}), CPU {out['load_cpu']:.3f} s/s")
    if out["ls_lines"] is None:
        print(f"fleetfs ls failed: {out['ls_error']}")
    else:
        print(f"fleetfs ls --json: {out['ls_lines']:,} lines in {out['ls_s']:.2f} s; "
              f"agent RSS after {out['ls_rss']:.1f} MiB")
    sys.stdout.flush()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--binary", required=True)
    ap.add_argument("--tenants", type=int, default=1_000_000)
    ap.add_argument("--active", type=int, default=10_000)
    ap.add_argument("--compare", type=int, default=20_000,
                    help="a small fleet with the same active set (0: none)")
    ap.add_argument("--writers", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--idle", type=float, default=5)
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--replica", choices=("off", "file"), default="off")
    ap.add_argument("--root", default="/var/tmp", help="where the fleets are made")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench_scale: run as root (it mounts)")
    runs = []
    for count in ([args.compare] if args.compare else []) + [args.tenants]:
        root = tempfile.mkdtemp(prefix="fleetfs-scale-", dir=args.root)
        try:
            runs.append(run_fleet(args, count, root))
        finally:
            subprocess.run(["umount", "-l", os.path.join(root, "mnt")], capture_output=True)
            shutil.rmtree(root, ignore_errors=True)
    if len(runs) == 2:
        small, big = runs
        print(f"\n== {big['tenants']:,} vs {small['tenants']:,} tenants, same {args.active:,} "
              f"active (ratio big/small; 1.00 = follows the active set) ==")
        for label, key in (("idle RSS", "idle_rss"), ("idle CPU/s", "idle_cpu"),
                           ("load RSS", "load_rss"), ("load CPU/s", "load_cpu"),
                           ("commits/s", "commits_per_s")):
            ratio = big[key] / small[key] if small[key] else float("nan")
            print(f"{label:11s} {small[key]:10.3f} -> {big[key]:10.3f}   ratio {ratio:.2f}")
        for what in ("stat", "open"):
            print(f"{what} p50   {pct(small[what + '_mount'], .5) * 1000:8.3f} ms -> "
                  f"{pct(big[what + '_mount'], .5) * 1000:8.3f} ms")


if __name__ == "__main__":
    main()
