"""Replication against untrusted local users and a busy agent, through real
mounts: lookups of absent names, buckets a restore makes, a scrape during a
large snapshot."""
import os
import random
import sqlite3
import string
import subprocess
import threading
import time
import unittest

from harness import MountTest, slots, tenants_in, wait_for

TTL_S = 3
SYNC_S = 0.2
NOBODY = 65534
# The large tenant of the snapshot test: its copy must outlast a lease.
BIG_BYTES = 6 << 30


def as_user(uid, code, *args):
    """Runs Python `code` with `args` as uid/gid `uid`; returns the completed process."""
    return subprocess.run(
        ["python3", "-c", code, *args], capture_output=True, text=True, timeout=60,
        preexec_fn=lambda: (os.setgroups([]), os.setgid(uid), os.setuid(uid)))


def random_names(count, seed):
    rng = random.Random(seed)
    return ["".join(rng.choice(string.ascii_lowercase) for _ in range(12)) for _ in range(count)]


def lookup_paths(mount, names):
    """The mount paths of tenants `names` (each in its own bucket)."""
    return [os.path.join(mount, row["tenant_path"]) for row in slots(*names).values()]


def backing_entries(backing):
    """Everything in the backing directory but the agent's own .fleetfs."""
    found = []
    for top, dirs, files in os.walk(backing):
        rel = os.path.relpath(top, backing)
        if rel == ".fleetfs" or rel.startswith(".fleetfs" + os.sep):
            continue
        found += [os.path.normpath(os.path.join(rel, n)) for n in dirs + files
                  if not (rel == "." and n == ".fleetfs")]
    return found


WRITE_AS_NOBODY = """
import sqlite3, sys
path, mode = sys.argv[1], sys.argv[2]
db = sqlite3.connect(path, isolation_level=None)
db.execute(f"PRAGMA journal_mode={mode}")
db.execute("CREATE TABLE IF NOT EXISTS t(id INTEGER PRIMARY KEY, v TEXT)")
before = db.execute("SELECT count(*) FROM t").fetchone()[0]
for i in range(20):
    db.execute("INSERT INTO t(v) VALUES ('x')")
assert db.execute("SELECT count(*) FROM t").fetchone()[0] == before + 20
assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
db.close()
print("ok")
"""


class ReplicationFaults(MountTest):
    TIME_LIMIT = 480

    @property
    def replica(self):
        return f"file://{self.root}/replica"

    def ragent(self, name, ttl_s=TTL_S, **kwargs):
        extra = ["--replica", self.replica, "--sync-interval", f"{int(SYNC_S * 1000)}ms",
                 *kwargs.pop("extra", ())]
        return self.agent(name, ttl=f"{ttl_s}s", extra=extra, **kwargs)

    def make_tenant(self, agent, tenant, rows=10):
        rel = slots(tenant)[tenant]["tenant_path"]
        db = sqlite3.connect(os.path.join(agent.mount, rel), isolation_level=None)
        db.execute("PRAGMA journal_mode=wal")
        db.execute("CREATE TABLE IF NOT EXISTS t(id INTEGER PRIMARY KEY, pad BLOB)")
        for i in range(rows):
            db.execute("INSERT INTO t(id, pad) VALUES (?, x'00')", (i,))
        db.close()
        return rel

    def wait_shipped(self, agent, timeout=15):
        wait_for(lambda: agent.status()["replication"]["tenants_unshipped"] == 0 and all(
            r["replication_lag_s"] == 0 for r in agent.status()["ranges"]), timeout,
            f"{agent.name}: everything shipped", poll=0.05, on_fail=agent.log_tail)

    def shipped_only(self, tenant):
        """Makes `tenant` through agent a, ships it and stops a: the tenant is
        then only in the replica. Returns its path inside a bucket."""
        a = self.ragent("a").start()
        a.wait_states("serving")
        rel = self.make_tenant(a, tenant)
        self.wait_shipped(a)
        self.assertEqual(a.stop(), 0)
        return rel

    # Item 3: a lookup of an absent name makes nothing and costs one listing.
    def test_lookups_of_absent_names_make_no_bucket_and_no_file(self):
        b = self.ragent("b").start()
        b.wait_states("serving")
        replica_dir = os.path.join(self.root, "replica")
        before = sorted(os.listdir(replica_dir)) if os.path.isdir(replica_dir) else []
        paths = lookup_paths(b.mount, random_names(2000, seed=3))
        for p in paths:
            with self.assertRaises(FileNotFoundError):
                os.stat(p)
        self.assertEqual(backing_entries(b.backing), [],
                         "a lookup of an absent name made something in the backing directory")
        after = sorted(os.listdir(replica_dir)) if os.path.isdir(replica_dir) else []
        self.assertEqual(after, before, "a lookup wrote to the replica")
        self.assertTrue(b.running())
        self.assertEqual(b.states(), ["serving"])

    # Item 3: a flood of absent lookups does not hold back a real first open.
    def test_a_real_first_open_goes_through_a_flood_of_absent_lookups(self):
        tenant = tenants_in(0, 16383, 1, prefix="real")[0]
        rel = self.shipped_only(tenant)
        b = self.ragent("b").start()
        b.wait_states("serving", timeout=TTL_S * 3)
        # The warm-up restores it; removed again behind the agent's back (no
        # lookup saw it), it is in the replica only, and the lookup restores it.
        wait_for(lambda: os.path.exists(os.path.join(b.backing, rel)), 15, "the warm-up",
                 on_fail=b.log_tail)
        os.unlink(os.path.join(b.backing, rel))
        for suffix in ("-wal", "-shm"):
            if os.path.exists(os.path.join(b.backing, rel + suffix)):
                os.unlink(os.path.join(b.backing, rel + suffix))

        stop = threading.Event()
        counts = [0] * 4

        def flood(n):
            paths = lookup_paths(b.mount, random_names(3000, seed=100 + n))
            while not stop.is_set():
                for p in paths:
                    if stop.is_set():
                        return
                    try:
                        os.stat(p)
                    except FileNotFoundError:
                        pass
                    counts[n] += 1
        threads = [threading.Thread(target=flood, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        try:
            wait_for(lambda: sum(counts) > 500, 30, "the flood under way")
            started = time.monotonic()
            db = sqlite3.connect(os.path.join(b.mount, rel), timeout=30)
            n = db.execute("SELECT count(*) FROM t").fetchone()[0]
            took = time.monotonic() - started
            db.close()
        finally:
            stop.set()
            for t in threads:
                t.join(60)
        print(f"\nfirst open through {sum(counts)} absent lookups: {took:.2f}s", flush=True)
        self.assertEqual(n, 10)
        # A liveness bound, not a timing assertion.
        self.assertLess(took, 10, f"the first open waited {took:.1f}s behind absent lookups")
        # Restored twice: by the warm-up, then by the lookup.
        wait_for(lambda: b.log().count("restored " + rel) == 2, 5, "the lookup's restore",
                 on_fail=b.log_tail)

    # Item 5: buckets a restore makes keep the backing root's mode.
    def test_nobody_writes_in_a_bucket_a_restore_made_and_in_a_fresh_one(self):
        tenant = tenants_in(0, 16383, 1, prefix="mode")[0]
        rel = self.shipped_only(tenant)
        bucket = rel.split("/")[0]
        b = self.ragent("b")
        os.chmod(b.backing, 0o1777)  # as the demo does: anyone may create tenants
        b.start()
        b.wait_states("serving", timeout=TTL_S * 3)
        wait_for(lambda: os.path.exists(os.path.join(b.backing, rel)), 15,
                 "the warm-up restores the tenant", on_fail=b.log_tail)
        # Two new tenants in the bucket the restore made, one per journal mode.
        first = int(bucket) * 64
        neighbours = tenants_in(first, first + 63, 2, prefix="nb")
        for neighbour, mode in zip(neighbours, ("wal", "delete")):
            path = os.path.join(b.mount, slots(neighbour)[neighbour]["tenant_path"])
            r = as_user(NOBODY, WRITE_AS_NOBODY, path, mode)
            self.assertEqual(r.returncode, 0, f"{mode} as nobody: {r.stderr}")
        self.assertEqual(os.stat(os.path.join(b.backing, bucket)).st_mode & 0o7777, 0o1777)
        # And a bucket nobody touched before: WAL, then the rollback journal.
        fresh = next(row for row in slots(*random_names(50, seed=5)).values()
                     if not os.path.exists(os.path.join(
                         b.backing, row["tenant_path"].split("/")[0])))
        path = os.path.join(b.mount, fresh["tenant_path"])
        for mode in ("wal", "delete"):
            r = as_user(NOBODY, WRITE_AS_NOBODY, path, mode)
            self.assertEqual(r.returncode, 0, f"{mode} as nobody in a fresh bucket: {r.stderr}")

    # Item 11: a scrape during the snapshot of a large tenant does not stall
    # the agent's loop; its ranges keep being renewed.
    def test_scrapes_during_a_large_snapshot_leave_the_lease_renewed(self):
        tenant = tenants_in(0, 16383, 1, prefix="big")[0]
        rel = slots(tenant)[tenant]["tenant_path"]
        # A 9 s lease renews every 3 s and serves 6 s past each renewal: a loop
        # that stalls behind the snapshot loses it, while the disk load of the
        # copy itself (which also slows the store's fsync) leaves room.
        ttl_s = 9
        a = self.ragent("a", ttl_s=ttl_s)
        # Written straight to the backing directory before the agent starts:
        # incompressible, and out of the page cache, so the snapshot's copy
        # reads the disk for seconds.
        os.makedirs(os.path.join(a.backing, rel.split("/")[0]))
        chunk = os.urandom(64 << 20)  # repeats beyond the compressor's window
        with open(os.path.join(a.backing, rel), "wb") as f:
            for _ in range(BIG_BYTES // len(chunk)):
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        a.start()
        a.wait_states("serving")
        epoch = a.status()["ranges"][0]["epoch"]
        # A size change with no journal and no WAL: the next shipment is a
        # snapshot. (A write so would make the tenant unshippable: with no
        # journal on disk, nothing marks a transaction's end.)
        os.truncate(os.path.join(a.mount, rel), BIG_BYTES)
        scrapes, lease_left, slowest = 0, [], 0.0
        deadline = time.monotonic() + 360  # under ASan the copy alone takes minutes
        while "ships a snapshot" not in a.log():
            self.assertLess(time.monotonic(), deadline, "the snapshot never shipped\n" +
                            a.log_tail())
            started = time.monotonic()
            code, _ = a.http("/metrics")  # a 5 s limit: a stalled loop fails it
            slowest = max(slowest, time.monotonic() - started)
            self.assertEqual(code, 200)
            scrapes += 1
            ranges = a.status()["ranges"]
            self.assertEqual([r["state"] for r in ranges], ["serving"], a.log_tail())
            lease_left.append((time.monotonic(), ranges[0]["lease_left_ms"]))
        left = [ms for _, ms in lease_left]
        span = lease_left[-1][0] - lease_left[0][0]
        renewals = sum(1 for x, y in zip(left, left[1:]) if y > x)
        print(f"\n{scrapes} scrapes over {span:.1f}s of snapshot; slowest {slowest:.2f}s; "
              f"lease left {min(left)}..{max(left)} ms; {renewals} renewals seen", flush=True)
        self.assertGreater(span, ttl_s, "the snapshot was too quick to test anything")
        self.assertEqual(a.status()["ranges"][0]["epoch"], epoch, "the range lapsed meanwhile")
        self.assertNotIn("stopped serving", a.log())
        # Renewed throughout: a lease not renewed for the span would have ended.
        self.assertGreater(min(left), 0, a.log_tail())
        self.assertGreaterEqual(renewals, int(span / ttl_s), a.log_tail())


if __name__ == "__main__":
    unittest.main()
