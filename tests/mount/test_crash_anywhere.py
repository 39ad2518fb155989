"""Crash anywhere (issue 10): the serving agent is killed with SIGKILL at a
random moment under a mixed load, then restarted or failed over to the other
agent; every time, each tenant's restored state must be exactly a prefix of
what its writers saw commit, hold every commit acknowledged more than one
sync interval before the kill, and pass integrity_check.

Two agents share one control database and one file:// replica, each on its
own backing directory, so a failover really restores from the replica. The
load: tenants in WAL and in each rollback-journal mode, synchronous FULL and
NORMAL, two writer processes per tenant, with checkpoints, WAL restarts and
reconnects (the last connection's close deletes the WAL) forced now and then.

FLEETFS_CRASH_ROUNDS sets the rounds (20 by default; 200 for a soak, see the
README), FLEETFS_CRASH_SEED replays a run's choices."""
import bisect
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
import unittest

from harness import MountTest, slots, tenants_in, wait_for

TTL_S = 3
SYNC_S = 1.0  # the agent's default sync interval, which the agents run with
# A commit is captured by the round at most one sync interval after it; the
# round's upload must also land. This is that upload's allowance on a loaded
# 2-core machine, stated once.
UPLOAD_SLACK_S = 0.5
# Under AddressSanitizer (its stage exports ASAN_OPTIONS) the agent runs two
# to three times slower, and so does the round's copy, compression and
# checksums: a CI run lost commits 1.51-1.62 s old with the plain slack. The
# prefix rule (no hole, nothing invented) is checked the same either way.
if "ASAN_OPTIONS" in os.environ:
    UPLOAD_SLACK_S = 1.5
WINDOW_S = SYNC_S + UPLOAD_SLACK_S
ROUNDS = int(os.environ.get("FLEETFS_CRASH_ROUNDS", "20"))
SEED = int(os.environ.get("FLEETFS_CRASH_SEED", str(int(time.time() * 1000) % 1_000_000)))
# Each tenant's journal mode and synchronous setting: WAL and each way a
# rollback journal finishes a transaction (delete, truncate, zeroed header).
TENANTS = [("wal", "FULL"), ("wal", "NORMAL"), ("delete", "NORMAL"), ("truncate", "FULL"),
           ("persist", "NORMAL")]
WRITERS_PER_TENANT = 2

# One writer process: inserts (w, n, r), n counting up from its start, r the
# round, one transaction at a time; each also rewrites a ballast row with
# random bytes (up to a few pages, and the database does not grow with them).
# Before BEGIN it logs "b n t", after COMMIT returns "a n t" (t: the machine's
# monotonic clock, the same in every process); on any error "e t message",
# and it stops: the fate of that n is unknown, so it must be the writer's
# last. Now and then it forces a checkpoint, a WAL restart or a reconnect.
WRITER = r'''
import random, sqlite3, sys, time
path, mode, sync, log, w, n, round_, seed = sys.argv[1:9]
w, n, round_, rng = int(w), int(n), int(round_), random.Random(int(seed))
out = open(log, "a", buffering=1)

def connect():
    db = sqlite3.connect(f"file:{path}?mode=rw", uri=True, timeout=20, isolation_level=None)
    db.execute(f"PRAGMA journal_mode={mode}")
    db.execute(f"PRAGMA synchronous={sync}")
    return db

try:
    db = connect()
    while True:
        out.write(f"b {n} {time.monotonic():.6f}\n")
        db.execute("BEGIN IMMEDIATE")
        db.execute("INSERT INTO t(w, n, r) VALUES (?, ?, ?)", (w, n, round_))
        db.execute("UPDATE ballast SET pad = randomblob(?) WHERE id = ?",
                   (rng.choice((40, 400, 3000, 9000)), rng.randrange(16)))
        db.execute("COMMIT")
        out.write(f"a {n} {time.monotonic():.6f}\n")
        n += 1
        # A pause between transactions, as applications have: without it a
        # writer that holds the lock in a tight loop starves the other one,
        # whose busy handler sleeps in growing steps.
        time.sleep(rng.uniform(0, 0.004))
        r = rng.random()
        if mode == "wal" and r < 0.03:
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        elif mode == "wal" and r < 0.06:
            db.execute("PRAGMA wal_checkpoint(RESTART)").fetchall()
        elif r < 0.08:
            db.close()  # the last connection's close checkpoints and deletes the WAL
            db = connect()
except BaseException as e:
    out.write(f"e {time.monotonic():.6f} {type(e).__name__}: {e}\n")
'''


def read_log(path):
    """(begins {n: t}, acks {n: t}, errors [(t, message)]); a line the kill cut
    short (no newline) is left out."""
    begins, acks, errors = {}, {}, []
    try:
        with open(path) as f:
            lines = f.read().split("\n")[:-1]
    except FileNotFoundError:
        return begins, acks, errors
    for line in lines:
        kind, rest = line[:1], line[2:].split(" ", 1)
        if kind == "b":
            begins[int(rest[0])] = float(rest[1])
        elif kind == "a":
            acks[int(rest[0])] = float(rest[1])
        elif kind == "e":
            errors.append((float(rest[0]), rest[1] if len(rest) > 1 else ""))
    return begins, acks, errors


class CrashAnywhere(MountTest):
    # Setup, then per round: the load (at most 3 s plus the writers' start),
    # a failover's lease wait (ttl plus a refresh), the checks and a standby's
    # restart, with room for a loaded machine.
    TIME_LIMIT = 90 + 20 * ROUNDS

    @property
    def replica(self):
        return f"file://{self.root}/replica"

    def ragent(self, name, sync=None):
        extra = ["--replica", self.replica] + (["--sync-interval", sync] if sync else [])
        return self.agent(name, ttl=f"{TTL_S}s", extra=extra)

    def serving(self):
        for agent in self.agents:
            if agent.running():
                try:
                    states = agent.states()
                except (OSError, ValueError):
                    continue
                if states and all(s == "serving" for s in states):
                    return agent
        return None

    def wait_shipped(self, agent, timeout=20):
        def done():
            return agent.status()["replication"]["tenants_unshipped"] == 0 and all(
                r["replication_lag_s"] == 0 for r in agent.status()["ranges"])
        wait_for(done, timeout, f"{agent.name}: everything shipped", poll=0.05,
                 on_fail=agent.log_tail)

    def read_tenant(self, agent, rel, timeout=20):
        """A fresh read-write connection through the agent's mount (it rolls a
        hot journal back, as any opener would): (integrity_check, {(w, n): r})."""
        path = os.path.join(agent.mount, rel)
        result, last_error = [], []

        def read():
            try:
                db = sqlite3.connect(f"file:{path}?mode=rw", uri=True, timeout=10,
                                     isolation_level=None)
                try:
                    check = db.execute("PRAGMA integrity_check").fetchall()
                    got = {(w, n): r for w, n, r in db.execute("SELECT w, n, r FROM t")}
                finally:
                    db.close()
            except sqlite3.Error as e:
                last_error[:] = [f"{type(e).__name__}: {e}"]
                return False
            result[:] = [check, got]
            return True
        wait_for(read, timeout, f"{rel} to open through {agent.name}'s mount", poll=0.1,
                 on_fail=lambda: f"last error: {last_error}\n{agent.log_tail()}")
        return result[0], result[1]

    def keep_evidence(self):
        """After a failure, with FLEETFS_KEEP_LOGS=DIR: the writers' logs, both
        backing directories, the replica and the control database, to replay
        what each side held (the harness keeps the agents' logs)."""
        keep = os.environ.get("FLEETFS_KEEP_LOGS")
        if self.finished or not keep:
            return
        dest = os.path.join(keep, f"crash-{os.getpid()}")
        for part in ("logs", "a/backing", "b/backing", "replica", "control.db"):
            src = os.path.join(self.root, part)
            if os.path.isdir(src):
                shutil.copytree(src, os.path.join(dest, part), dirs_exist_ok=True)
            elif os.path.exists(src):
                shutil.copy(src, dest)
        print(f"kept the writers' logs, backing directories and replica in {dest}")

    def test_every_crash_restores_a_prefix_with_every_commit_older_than_the_window(self):
        self.finished = False
        self.addCleanup(self.keep_evidence)  # before the teardown ends the agents
        rng = random.Random(SEED)
        print(f"\ncrash anywhere: {ROUNDS} rounds, seed {SEED} (FLEETFS_CRASH_SEED replays "
              f"its choices); window {WINDOW_S:.1f} s", flush=True)
        started = time.monotonic()
        logs = os.path.join(self.root, "logs")
        os.makedirs(logs)
        a, b = self.ragent("a"), self.ragent("b")
        a.start()
        a.wait_states("serving")
        b.start()
        b.wait_states("waiting")
        keys = tenants_in(0, 16383, len(TENANTS), prefix="crash")
        tenants = []  # (key, rel, journal mode, synchronous)
        for key, (mode, sync) in zip(keys, TENANTS):
            rel = slots(key)[key]["tenant_path"]
            db = sqlite3.connect(os.path.join(a.mount, rel), isolation_level=None)
            db.execute(f"PRAGMA journal_mode={mode}")
            db.execute("CREATE TABLE t(w INTEGER, n INTEGER, r INTEGER, PRIMARY KEY(w, n))")
            db.execute("CREATE TABLE ballast(id INTEGER PRIMARY KEY, pad BLOB)")
            db.executemany("INSERT INTO ballast VALUES (?, x'00')", [(i,) for i in range(16)])
            db.close()
            tenants.append((key, rel, mode, sync))
        self.wait_shipped(a)  # the tenants exist at the replica before the first kill
        # What each tenant held when last verified, and when: those rows were
        # committed by then, so they too must survive a kill one window later.
        base = {key: {w: -1 for w in range(WRITERS_PER_TENANT)} for key, *_ in tenants}
        # Which round wrote each writer's rows: [(first n, round)], sorted. A
        # row lost to a crash is written again by a later round, so a row of
        # an older round than this says a stale copy was exposed.
        written_in = {key: {w: [] for w in range(WRITERS_PER_TENANT)} for key, *_ in tenants}
        verified_at = time.monotonic()
        server = a
        totals = dict(acked=0, required=0, lost=0, restarts=0, failovers=0, raced=0)
        max_lost_age = 0.0

        for round_ in range(1, ROUNDS + 1):
            # The load, against the server's mount.
            procs, paths = [], {}
            for key, rel, mode, sync in tenants:
                for w in range(WRITERS_PER_TENANT):
                    paths[key, w] = os.path.join(logs, f"r{round_:03d}-{key}-w{w}.log")
                    first = base[key][w] + 1
                    written_in[key][w] = [(n, r) for n, r in written_in[key][w] if n < first]
                    written_in[key][w].append((first, round_))
                    err = open(paths[key, w] + ".stderr", "wb")
                    procs.append(subprocess.Popen(
                        [sys.executable, "-c", WRITER, os.path.join(server.mount, rel), mode,
                         sync, paths[key, w], str(w), str(first), str(round_),
                         str(rng.randrange(1 << 30))], stderr=err))
                    err.close()

            def every_writer_committed():
                for (key, w), path in paths.items():
                    begins, acks, errors = read_log(path)
                    if errors:
                        raise AssertionError(f"round {round_}: writer {w} of {key} failed while "
                                             f"{server.name} served: {errors}\n"
                                             + server.log_tail())
                    if not acks:
                        return False
                return True
            load_from = time.monotonic()
            wait_for(every_writer_committed, 30, f"round {round_}: every writer to commit",
                     poll=0.02, on_fail=server.log_tail)
            time.sleep(rng.uniform(0.5, 3.0))

            # The crash, then a restart of the same agent or the other's takeover.
            other = b if server is a else a
            action = rng.choice(("restart", "failover"))
            kill_at = time.monotonic()
            server.kill9()
            load = kill_at - load_from
            for p in procs:
                p.kill()
                p.wait(10)
            if action == "restart":
                server.start()
            new = None

            def someone_serves():
                nonlocal new
                new = self.serving()
                return new is not None
            served_at = wait_for(someone_serves, TTL_S * 3 + 10,
                                 f"round {round_}: an agent to serve after the kill",
                                 poll=0.02, on_fail=lambda: a.log_tail() + "\n" + b.log_tail())
            if action == "restart":
                totals["restarts"] += 1
                totals["raced"] += new is not server  # the other claimed first
            else:
                totals["failovers"] += 1

            # The checks, through a fresh connection on the new server's mount.
            summary = []
            round_lost, round_required, round_acked = 0, 0, 0
            for key, rel, mode, sync in tenants:
                check, got = self.read_tenant(new, rel)
                where = (f"round {round_} (seed {SEED}), tenant {key} ({mode}, {sync}): "
                         f"{server.name} killed {kill_at - load_from:.2f} s into the load, "
                         f"{action}, served by {new.name}")
                if check != [("ok",)]:
                    self.fail_with_logs(f"{where}: integrity_check says {check[:10]}")
                writers = {w for w, _ in got}
                if not writers <= set(range(WRITERS_PER_TENANT)):
                    self.fail_with_logs(f"{where}: rows of unknown writers {writers}")
                logs_of = {w: read_log(paths[key, w]) for w in range(WRITERS_PER_TENANT)}
                top = {}
                for w in range(WRITERS_PER_TENANT):
                    begins, acks, errors = logs_of[w]
                    early = [e for e in errors if e[0] < kill_at]
                    if early:
                        self.fail_with_logs(f"{where}: writer {w} failed before the kill: {early}")
                    ns = sorted(n for ww, n in got if ww == w)
                    firsts = [fn for fn, _ in written_in[key][w]]
                    for n in ns:
                        by = written_in[key][w][bisect.bisect_right(firsts, n) - 1][1]
                        if got[w, n] != by:
                            self.fail_with_logs(
                                f"{where}: writer {w}'s row {n} is the one round {got[w, n]} "
                                f"wrote, but a crash lost it and round {by} wrote it again: "
                                f"a stale copy of the tenant was exposed (rounds of writer "
                                f"{w}'s rows: {written_in[key][w][-6:]})")
                    k = ns[-1] if ns else -1
                    top[w] = k
                    if ns != list(range(k + 1)):
                        holes = sorted(set(range(k + 1)) - set(ns))
                        self.fail_with_logs(f"{where}: writer {w}'s rows are not a prefix: "
                                            f"up to {k}, missing {holes[:20]}")
                    attempted = max(begins, default=base[key][w])
                    if k > attempted:
                        self.fail_with_logs(f"{where}: writer {w} has row {k}, but never "
                                            f"began beyond {attempted}")
                    required = max((n for n, t in acks.items() if t <= kill_at - WINDOW_S),
                                   default=-1)
                    if verified_at <= kill_at - WINDOW_S:
                        required = max(required, base[key][w])
                    if k < required:
                        lost = [n for n in range(k + 1, required + 1)]
                        ages = [kill_at - acks[n] if n in acks else kill_at - verified_at
                                for n in lost]
                        self.fail_with_logs(
                            f"{where}: writer {w} lost {len(lost)} commits acknowledged more "
                            f"than {WINDOW_S:.1f} s before the kill: rows {k + 1}..{required} "
                            f"(acknowledged {max(ages):.2f} to {min(ages):.2f} s before the "
                            f"kill; base {base[key][w]}, verified {kill_at - verified_at:.2f} s "
                            f"before it; last acknowledged {max(acks, default=None)})")
                    # Commits lost inside the window, and how old the oldest was.
                    lost = [kill_at - t for n, t in acks.items() if n > k]
                    if k < base[key][w]:
                        lost += [kill_at - verified_at] * (base[key][w] - k)
                    round_lost += len(lost)
                    max_lost_age = max([max_lost_age, *lost])
                    round_acked += len(acks)
                    round_required += max(required - base[key][w], 0)
                # One prefix of the tenant's commit order, not one per writer:
                # a present row that began after another writer's commit was
                # acknowledged (or after the last verification) needs that commit.
                for w in range(WRITERS_PER_TENANT):
                    if top[w] <= base[key][w]:
                        continue  # no row of this round
                    began = logs_of[w][0][top[w]]
                    for v in range(WRITERS_PER_TENANT):
                        before = [n for n, t in logs_of[v][1].items() if t < began]
                        need = max([base[key][v], *before])
                        if top[v] < need:
                            self.fail_with_logs(
                                f"{where}: not a prefix of the commit order: writer {w}'s row "
                                f"{top[w]} (begun {kill_at - began:.3f} s before the kill) is "
                                f"there, but writer {v}'s row {need}, committed before it "
                                f"began, is not (writer {v} is up to {top[v]})")
                summary.append(f"{key}={sum(k + 1 for k in top.values())}")
                base[key] = top
            verified_at = time.monotonic()
            totals["acked"] += round_acked
            totals["required"] += round_required
            totals["lost"] += round_lost
            print(f"round {round_:3d}: {load:.2f} s of load, {round_acked} commits acknowledged; "
                  f"killed {server.name}, {action}: {new.name} served after "
                  f"{served_at - kill_at:.1f} s; {round_required} commits were due, "
                  f"{round_lost} lost inside the window; rows {' '.join(summary)}", flush=True)

            # The killed agent comes back as the standby of the new server.
            standby = other if new is server else server
            if not standby.running():
                standby.start()
            standby.wait_states("waiting", timeout=15)
            server = new

        print(f"crash anywhere: {ROUNDS} rounds in {time.monotonic() - started:.0f} s "
              f"({totals['restarts']} restarts, {totals['raced']} of them taken over by the "
              f"other agent, {totals['failovers']} failovers); {totals['acked']} commits "
              f"acknowledged, {totals['required']} due and kept, {totals['lost']} lost inside "
              f"the {WINDOW_S:.1f} s window (the oldest {max_lost_age:.2f} s before its kill)",
              flush=True)
        self.finished = True

    def test_a_failover_back_exposes_no_commit_the_first_failover_lost(self):
        """The sequence the rounds above found, made certain: A's last commits
        are unshipped when it is killed, so B's restore loses them (allowed);
        B serves commits and is killed before its first sync round, so the
        replica holds nothing of B's epoch; A takes over again. A's own file
        still holds the commits the first failover lost: exposing it would
        bring back commits the writers saw lost, and lose B's, a history that
        forks, never a prefix of what the writers saw commit."""
        self.finished = True  # nothing to keep beyond the agents' logs
        # No sync round falls inside the sequence: what ships is what a stop ships.
        a, b = self.ragent("a", sync="60s"), self.ragent("b", sync="60s")
        a.start()
        a.wait_states("serving")
        key = tenants_in(0, 16383, 1, prefix="back")[0]
        rel = slots(key)[key]["tenant_path"]

        def insert(agent, rows):
            db = sqlite3.connect(os.path.join(agent.mount, rel), isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("CREATE TABLE IF NOT EXISTS t(id INTEGER PRIMARY KEY)")
            for row in rows:
                db.execute("INSERT INTO t VALUES (?)", (row,))
            db.close()

        def ids(agent):
            check, got = None, None

            def read():
                nonlocal check, got
                db = sqlite3.connect(f"file:{os.path.join(agent.mount, rel)}?mode=rw",
                                     uri=True, timeout=10)
                try:
                    check = db.execute("PRAGMA integrity_check").fetchone()[0]
                    got = {r[0] for r in db.execute("SELECT id FROM t")}
                finally:
                    db.close()
                return True
            wait_for(read, 20, f"{rel} to open through {agent.name}", poll=0.1,
                     on_fail=agent.log_tail)
            self.assertEqual(check, "ok")
            return got

        insert(a, range(10))
        self.assertEqual(a.stop(), 0)  # ships rows 0..9
        a.start()  # the same owner takes its range back at once
        a.wait_states("serving")
        b.start()
        b.wait_states("waiting")
        insert(a, range(10, 20))  # acknowledged, never shipped
        a.kill9()
        b.wait_states("serving", timeout=TTL_S * 3)
        self.assertEqual(ids(b), set(range(10)), "B's restore is not what A shipped")
        insert(b, range(100, 110))  # acknowledged, never shipped
        b.kill9()
        a.start()
        a.wait_states("serving", timeout=TTL_S * 3)
        got = ids(a)
        # A prefix of the history the writers saw: rows 0..9, then B's, in order.
        history = list(range(10)) + list(range(100, 110))
        self.assertIn(got, [set(history[:i]) for i in range(10, len(history) + 1)],
                      f"A exposed {sorted(got - set(history))[:20]} (the commits the failover "
                      f"to B lost) and {len(got & set(range(100, 110)))} of B's 10 commits; "
                      f"the failover back is not a prefix of the history\n" + a.log_tail()
                      + "\n" + b.log_tail())


if __name__ == "__main__":
    unittest.main()
