"""A paused agent (SIGSTOP longer than the lease) never acknowledges a write
after its local lease ended (issue 9 item 7): when it resumes, what its
writer had in flight is answered ESTALE, never success, however the pause
fell. Two agents share the store; each pause hands the range to the other."""
import os
import random
import signal
import subprocess
import sys
import time
import unittest

from harness import MountTest, slots, tenants_in, wait_for

TTL_S = 3
ROUNDS = 3

# Commits in a loop through one mount and logs each acknowledged commit with
# the machine's monotonic clock (the same clock in every process).
WRITER = r'''
import sqlite3, sys, time
path, log = sys.argv[1], sys.argv[2]
out = open(log, "a", buffering=1)
n = 0
while True:
    db = None
    try:
        db = sqlite3.connect(path, timeout=0.2, isolation_level=None)
        # WAL with FULL sync: a commit's last file operation is the fsync of
        # the -wal, the longest one, so a pause most often falls inside it.
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.execute("CREATE TABLE IF NOT EXISTS t(x)")
        while True:
            db.execute("BEGIN IMMEDIATE")
            db.execute("INSERT INTO t VALUES (?)", (n,))
            db.execute("COMMIT")
            out.write(f"ack {time.monotonic():.6f}\n")
            n += 1
    except Exception as e:
        out.write(f"err {time.monotonic():.6f} {e}\n")
        if db is not None:
            try:
                db.close()
            except Exception:
                pass
        time.sleep(0.02)
'''


def acks(path, after=0.0):
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return []
    times = []
    for line in lines:
        parts = line.split(" ")
        if len(parts) >= 2 and parts[0] == "ack":
            try:
                t = float(parts[1])
            except ValueError:
                continue  # a line cut short
            if t > after:
                times.append(t)
    return times


class Pause(MountTest):
    TIME_LIMIT = 150

    def test_an_agent_paused_past_its_lease_acknowledges_no_write_after_the_other_took_over(self):
        a = self.agent("a", ttl=f"{TTL_S}s").start()
        a.wait_states("serving")
        b = self.agent("b", ttl=f"{TTL_S}s").start()
        b.wait_states("waiting")
        tenant = tenants_in(0, 16383, 1, prefix="pause")[0]
        rel = slots(tenant)[tenant]["tenant_path"]
        writers, logs = {}, {}
        for agent in (a, b):
            logs[agent.name] = os.path.join(self.root, f"writer-{agent.name}.log")
            writers[agent.name] = subprocess.Popen(
                [sys.executable, "-c", WRITER, os.path.join(agent.mount, rel), logs[agent.name]])
            self.addCleanup(lambda p=writers[agent.name]: (p.kill(), p.wait()))
        rng = random.Random(os.getpid())
        server, other = a, b
        round_, repeated = 0, 0
        while round_ < ROUNDS:
            since = time.monotonic()
            wait_for(lambda: acks(logs[server.name], since), 15, f"{server.name}'s writer to commit",
                     on_fail=server.log_tail)
            time.sleep(rng.uniform(0.05, 1.0))  # a random moment of the writer's loop
            stopped = time.monotonic()
            log_before = len(other.log())
            server.proc.send_signal(signal.SIGSTOP)
            try:
                # The other claims once the store lease ends, and its writer commits.
                try:
                    wait_for(lambda: acks(logs[other.name], stopped), 20,
                             f"{other.name}'s writer to commit after the takeover",
                             on_fail=other.log_tail)
                except AssertionError:
                    # A pause that fell inside the paused agent's store
                    # transaction keeps the SQLite control file locked: the
                    # other cannot claim until it resumes (a limit of the
                    # one-host SQLite store, whose calls then time out). The
                    # round says nothing about fencing: it is repeated.
                    if repeated < 3 and "the store call timed out" in other.log()[log_before:]:
                        repeated += 1
                        print(f"\nround {round_ + 1}: {server.name} was paused inside its store "
                              f"transaction (the SQLite store stayed locked); repeating it")
                        server.proc.send_signal(signal.SIGCONT)
                        wait_for(lambda: any(s == "serving" for s in (server.states() or []))
                                 or any(s == "serving" for s in (other.states() or [])),
                                 30, "someone to serve again", on_fail=other.log_tail)
                        if any(s == "serving" for s in (other.states() or [])):
                            server, other = other, server
                        continue
                    raise
                time.sleep(rng.uniform(0.0, 1.0))
                paused = time.monotonic() - stopped
            finally:
                server.proc.send_signal(signal.SIGCONT)
            resumed = time.monotonic()
            first_other = min(acks(logs[other.name], stopped))
            # What the paused agent had in flight is answered now: give it time.
            wait_for(lambda: server.states() and all(s != "serving" for s in server.states()),
                     15, f"{server.name} to stop serving", on_fail=server.log_tail)
            time.sleep(1.0)
            late = [t for t in acks(logs[server.name], stopped) if t > first_other]
            print(f"\nround {round_ + 1}: {server.name} paused {paused:.1f} s; "
                  f"{other.name} acknowledged first {first_other - stopped:.2f} s after the pause; "
                  f"{server.name} acknowledged {len(acks(logs[server.name], stopped))} commits "
                  f"after the pause began ({len(late)} after {other.name}'s first)")
            self.assertEqual(late, [], f"{server.name} acknowledged commits after {other.name} "
                             f"took over (resumed {resumed - stopped:.2f} s after the pause)\n"
                             + server.log_tail())
            self.assertTrue(server.running(), server.log_tail())
            server.wait_states("waiting", timeout=15)
            server, other = other, server
            round_ += 1


if __name__ == "__main__":
    unittest.main()
