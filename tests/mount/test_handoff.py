"""Planned handover (`fleetfs handoff`, `fleetfs drain`) through real mounts:
two agents on their own backing directories share one control database and
one file:// replica; writers follow the range from one mount to the other."""
import json
import multiprocessing
import os
import sqlite3
import statistics
import subprocess
import sys
import time

from harness import BINARY, MountTest, slots, tenants_in, wait_for

# The pause does not depend on the ttl (the target claims on the offer);
# FLEETFS_HANDOFF_TTL_S=30 measures it at the default ttl (docs/BENCHMARKS.md).
TTL_S = int(os.environ.get("FLEETFS_HANDOFF_TTL_S", "6"))
SYNC_S = 0.2
HANDOVERS = 20
ALL = "0-16383"


def follower(mounts, rel, journal_mode, log_path, stop_path, writer_id):
    """Inserts uniquely numbered rows into one tenant, a transaction at a
    time, through whichever mount serves it: on any error (ENOENT, EIO,
    ESTALE from a fence) it drops its connection and tries the other mount.
    After each COMMIT returns it appends "id time mount-index" to log_path;
    a row whose COMMIT failed is never logged (it may or may not be there)."""
    which, db, i = 0, None, 0
    with open(log_path, "a") as log:
        while not os.path.exists(stop_path):
            i += 1
            row = writer_id * 1_000_000 + i
            try:
                if db is None:
                    # mode=rw: never create a file on a mount that does not serve it.
                    db = sqlite3.connect(f"file:{os.path.join(mounts[which], rel)}?mode=rw",
                                         uri=True, timeout=10, isolation_level=None)
                    db.execute(f"PRAGMA journal_mode={journal_mode}")
                db.execute("BEGIN IMMEDIATE")
                db.execute("INSERT INTO t(id, who) VALUES (?, ?)", (row, writer_id))
                db.execute("COMMIT")
            except (sqlite3.Error, OSError) as e:
                log.write(f"# {row} {which} {type(e).__name__}: {e}\n")
                log.flush()
                try:
                    if db is not None:
                        db.close()
                except sqlite3.Error:
                    pass
                db = None
                which = 1 - which
                time.sleep(0.005)
                continue
            log.write(f"{row} {time.time()} {which}\n")
            log.flush()


def acknowledged(log_paths):
    """[(time, id, mount index)] of every acknowledged commit, by time; and
    the error lines."""
    acks, errors = [], []
    for path in log_paths:
        with open(path) as f:
            for line in f:
                if line.startswith("#"):
                    errors.append(line.strip())
                    continue
                row, t, which = line.split()
                acks.append((float(t), int(row), int(which)))
    acks.sort()
    return acks, errors


def percentile(values, p):
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, int(round(p / 100 * len(ordered) + 0.5)) - 1))
    return ordered[k]


class Handoff(MountTest):
    TIME_LIMIT = 600

    @property
    def replica(self):
        return f"file://{self.root}/replica"

    def ragent(self, name, **kwargs):
        extra = ["--replica", self.replica, "--sync-interval", f"{int(SYNC_S * 1000)}ms",
                 "--shutdown-grace", "1s", *kwargs.pop("extra", ())]
        return self.agent(name, ttl=f"{TTL_S}s", extra=extra, **kwargs)

    def cli(self, *args, user=None):
        prefix = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups"] if user else []
        return subprocess.run([*prefix, BINARY, *args], capture_output=True, text=True,
                              timeout=120)

    def pair(self):
        a = self.ragent("a").start()
        a.wait_states("serving")
        b = self.ragent("b").start()
        b.wait_states("waiting")
        return a, b

    def make_tenant(self, agent, tenant, journal_mode):
        rel = slots(tenant)[tenant]["tenant_path"]
        db = sqlite3.connect(os.path.join(agent.mount, rel), isolation_level=None)
        db.execute(f"PRAGMA journal_mode={journal_mode}")
        db.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, who INTEGER)")
        db.close()
        return rel

    def test_twenty_handovers_under_writers_lose_no_commit(self):
        a, b = self.pair()
        agents = [a, b]
        tenants = {t: self.make_tenant(a, t, mode) for t, mode in
                   zip(tenants_in(0, 16383, 2, prefix="handoff"), ("wal", "delete"))}
        modes = dict(zip(tenants, ("wal", "delete")))
        stop_path = os.path.join(self.root, "stop")
        logs, procs = [], []
        for n, (t, rel) in enumerate(tenants.items()):
            for k in range(2):  # two writers per tenant, so they contend
                log = os.path.join(self.root, f"writer-{n}-{k}.log")
                logs.append(log)
                p = multiprocessing.Process(target=follower, args=(
                    [a.mount, b.mount], rel, modes[t], log, stop_path, n * 10 + k + 1))
                p.start()
                procs.append(p)
        self.addCleanup(lambda: [p.kill() for p in procs if p.is_alive()])

        def acks_on(which, after):
            return sum(1 for t, _, w in acknowledged(logs)[0] if w == which and t > after)

        started, outcomes = [], []
        wait_for(lambda: acks_on(0, 0) >= 20, 30, "writes through A")
        for k in range(HANDOVERS):
            src, dst = k % 2, 1 - k % 2
            started.append(time.time())
            r = self.cli("handoff", ALL, "--to", agents[dst].owner, "--mount",
                         agents[src].mount, "--timeout", "60")
            self.assertEqual(r.returncode, 0, f"handover {k + 1}: {r.stdout}{r.stderr}\n" +
                             agents[src].log_tail() + "\n" + agents[dst].log_tail())
            self.assertIn(f"handed over to '{agents[dst].owner}'", r.stdout)
            outcomes.append(r.stdout.strip())
            # Every writer follows to the new host before the next handover.
            after = started[-1]
            wait_for(lambda: acks_on(dst, after) >= 8, 60,
                     f"writes through {agents[dst].name} after handover {k + 1}",
                     on_fail=lambda: agents[dst].log_tail())
        with open(stop_path, "w"):
            pass
        for p in procs:
            p.join(30)
            self.assertEqual(p.exitcode, 0, "a writer failed")
        acks, errors = acknowledged(logs)
        self.assertFalse([e for e in errors if "malformed" in e], errors[:20])

        # The write pause of each handover: the last acknowledged write on
        # the old host to the first on the new one.
        pauses = []
        for k, t0 in enumerate(started):
            src, dst = k % 2, 1 - k % 2
            first_new = min(t for t, _, w in acks if w == dst and t > t0)
            last_old = max((t for t, _, w in acks if w == src and t < first_new), default=t0)
            pauses.append((first_new - last_old) * 1000)
        report = (f"handoff write pause over {len(pauses)} handovers (ttl {TTL_S}s, "
                  f"sync {int(SYNC_S * 1000)} ms, 4 writers on 2 tenants): "
                  f"p50 {statistics.median(pauses):.0f} ms, p99 {percentile(pauses, 99):.0f} ms, "
                  f"max {max(pauses):.0f} ms; {len(acks)} commits acknowledged")
        print("\n" + report, file=sys.stderr)
        print("\n".join(outcomes), file=sys.stderr)

        # After an even number of handovers A serves again: every
        # acknowledged row is there, through its mount.
        final = agents[HANDOVERS % 2]
        final.wait_states("serving")
        for t, rel in tenants.items():
            db = sqlite3.connect(f"file:{os.path.join(final.mount, rel)}?mode=ro", uri=True)
            ids = {r[0] for r in db.execute("SELECT id FROM t")}
            self.assertEqual(db.execute("PRAGMA integrity_check").fetchone()[0], "ok")
            db.close()
            mine = {row for _, row, _ in acks if row // 1_000_000 in
                    {n * 10 + k + 1 for n, name in enumerate(tenants) if name == t
                     for k in range(2)}}
            self.assertFalse(mine - ids, f"{t}: acknowledged rows missing on the serving mount")
        # SIGTERM ships the last commits; then the replica alone has them all.
        self.assertEqual(b.stop(), 0, b.log_tail())
        self.assertEqual(a.stop(), 0, a.log_tail())
        for n, (t, rel) in enumerate(tenants.items()):
            out = os.path.join(self.root, f"restored-{t}.db")
            r = self.cli("restore", t, "--replica", self.replica, "-o", out)
            self.assertEqual(r.returncode, 0, r.stderr)
            db = sqlite3.connect(f"file:{out}?mode=ro", uri=True)
            ids = {r[0] for r in db.execute("SELECT id FROM t")}
            self.assertEqual(db.execute("PRAGMA integrity_check").fetchone()[0], "ok")
            db.close()
            writers = {n * 10 + k + 1 for k in range(2)}
            mine = {row for _, row, _ in acks if row // 1_000_000 in writers}
            self.assertTrue(mine, f"{t}: no commit acknowledged")
            self.assertFalse(mine - ids, f"{t}: acknowledged rows missing from the restore")

    def test_only_root_or_the_agents_user_may_send_requests(self):
        a, b = self.pair()
        control = os.path.join(a.mount, ".fleetfs", "control")
        # Another user: refused at open, with a log line naming the uid.
        r = self.cli("handoff", ALL, "--to", b.owner, "--mount", a.mount, user=65534)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("permission denied", r.stderr)
        wait_for(lambda: "refused an open of .fleetfs/control by uid 65534" in a.log(), 10,
                 "the refusal in the log", on_fail=a.log_tail)
        # A descriptor root opened, passed to another user: refused at write.
        fd = os.open(control, os.O_RDWR)
        pid = os.fork()
        if pid == 0:
            code = 3
            try:
                os.setgid(65534)
                os.setuid(65534)
                os.write(fd, f"handoff {ALL} to {b.owner}\n".encode())
                code = 0
            except PermissionError:
                code = 13
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        os.close(fd)
        self.assertEqual(os.waitstatus_to_exitcode(status), 13)
        wait_for(lambda: "refused a request on .fleetfs/control from uid 65534" in a.log(), 10,
                 "the write refusal in the log", on_fail=a.log_tail)
        # Nothing was handed off; the admin port takes no request either.
        self.assertEqual(a.states(), ["serving"])
        code, _ = a.http("/handoff", method="POST")
        self.assertEqual(code, 405)

    def test_bad_requests_are_refused_naming_the_thing_and_the_rule(self):
        a, b = self.pair()
        cases = [
            (["handoff", "9-1", "--to", b.owner], "9-1"),
            (["handoff", "0-16384", "--to", b.owner], "16384"),
            (["handoff", ALL, "--to", " host-b"], "white space"),
            (["handoff", ALL, "--to", ""], "--to"),
            (["handoff", "0-8191", "--to", b.owner],
             "is not one of this agent's configured ranges"),
            (["handoff", ALL, "--to", a.owner], "is this agent"),
        ]
        for args, expect in cases:
            r = self.cli(*args, "--mount", a.mount)
            self.assertEqual(r.returncode, 2, f"{args}: {r.stdout}{r.stderr}")
            self.assertIn(expect, r.stderr, args)
        # A request written by hand is parsed as strictly.
        with open(os.path.join(a.mount, ".fleetfs", "control"), "r+b", buffering=0) as f:
            with self.assertRaises(OSError):
                f.write(b"handoff  0-16383 to host-b\n")
            f.seek(0)
            self.assertIn(b"single spaces", f.read())
            # '-' is an owner like any other; no target is said 'release'.
            f.seek(0)
            with self.assertRaises(OSError):
                f.write(b"drain -\n")
            f.seek(0)
            self.assertIn(b"'release' for no target", f.read())
        self.assertEqual(a.states(), ["serving"])

    def test_drain_releases_and_stays_drained_until_undone(self):
        a, b = self.pair()
        r = self.cli("drain", "--mount", a.mount)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(a.states(), ["handed-off"])
        # B claims the released range at its next refresh; A does not take it back.
        b.wait_states("serving", timeout=TTL_S * 2)
        self.assertEqual(a.states(), ["handed-off"])
        # Drained, A takes nothing, not even a handoff back: the offer ends
        # with its window, and B, seeing it not taken, serves again.
        r = self.cli("handoff", ALL, "--to", a.owner, "--mount", b.mount, "--timeout", "1")
        self.assertEqual(r.returncode, 7, r.stdout + r.stderr)
        self.assertEqual(a.states(), ["handed-off"])
        b.wait_states("serving", timeout=TTL_S * 3)
        self.assertEqual(a.states(), ["handed-off"])
        r = self.cli("drain", "--undo", "--mount", a.mount)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        a.wait_states("waiting", timeout=TTL_S * 2)
        r = self.cli("handoff", ALL, "--to", a.owner, "--mount", b.mount)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)  # undone: a handoff is taken
        a.wait_states("serving")
        r = self.cli("drain", "--to", b.owner, "--mount", a.mount)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        b.wait_states("serving")
        r = self.cli("drain", "--undo", "--mount", a.mount)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        a.wait_states("waiting", timeout=TTL_S * 2)

    def test_an_offer_nobody_takes_holds_others_off_for_one_ttl_and_shows_in_the_store(self):
        a, b = self.pair()
        r = self.cli("handoff", ALL, "--to", "host-z", "--mount", a.mount, "--timeout", "0.5")
        self.assertEqual(r.returncode, 7, r.stdout + r.stderr)
        self.assertIn("'host-z' did not claim range 0-16383", r.stderr)
        # The CLI gave up at its timeout without knowing the offer was written.
        wait_for(lambda: "host-a (offered to host-z)" in
                 self.cli("lease", "ls", "--store", self.store).stdout,
                 TTL_S, "lease ls shows the offer", on_fail=a.log_tail)
        where = self.cli("where", "acme", "--store", self.store)
        self.assertEqual(where.returncode, 6, where.stdout + where.stderr)
        self.assertIn("(nobody: offered to host-z)", where.stdout)
        # B's next claim is refused naming the target: the offer is not its to take.
        wait_for(lambda: b.status()["ranges"][0].get("held_by", {}).get("owner") == "host-z",
                 TTL_S, "B refused, the range offered to host-z", on_fail=b.log_tail)
        self.assertEqual(b.states(), ["waiting"])
        # After the window (one ttl) nobody holds A off: A, seeing the offer
        # not taken, takes the range back (logged), unless B claims first.
        # Exactly one of them serves.
        # (If B claims first, A never sees its offer lapse and stays handed off.)
        wait_for(lambda: sorted(a.states() + b.states()) in (["serving", "waiting"],
                                                             ["handed-off", "serving"]),
                 TTL_S * 3, "one of A and B serves after the window",
                 on_fail=lambda: a.log_tail() + b.log_tail())
        if a.states() == ["serving"]:
            self.assertIn("nobody took the offer", a.log())
