"""The agent on a bad day, as an operator meets it: a replica that stops
taking writes at shutdown, a restart right after kill -9, a backing volume
that fills up or turns read-only, configuration mistakes, and the limits the
agent starts with."""
import json
import os
import random
import resource
import sqlite3
import subprocess
import time
import unittest
import urllib.request

from harness import BINARY, MountTest, slots, wait_for

TTL = "6s"  # refresh every 2 s; the final flush may take 4 s


def cli(*args):
    return subprocess.run([BINARY, *args], capture_output=True, text=True, timeout=60)


class OperatorFaults(MountTest):
    TIME_LIMIT = 240

    def lease_rows(self):
        out = cli("lease", "ls", "--store", self.store, "--json")
        self.assertEqual(out.returncode, 0, out.stderr)
        return {r["range"]: r for r in json.loads(out.stdout)["rows"]}

    def write(self, agent, tenant, n, journal_mode="wal"):
        rel = slots(tenant)[tenant]["tenant_path"]
        db = sqlite3.connect(os.path.join(agent.mount, rel), isolation_level=None, timeout=10)
        db.execute(f"PRAGMA journal_mode={journal_mode}")
        db.execute("CREATE TABLE IF NOT EXISTS t(id INTEGER PRIMARY KEY, pad BLOB)")
        for _ in range(n):
            db.execute("INSERT INTO t(pad) VALUES (randomblob(200))")
        db.close()
        return rel

    def replica_agent(self):
        self.replica_dir = os.path.join(self.root, "replica")
        os.makedirs(self.replica_dir)
        a = self.agent("a", ttl=TTL, extra=["--replica", f"file://{self.replica_dir}",
                                             "--sync-interval", "200ms"])
        a.start()
        a.wait_states("serving")
        return a

    def break_replica(self):
        """A read-only file system over the replica: every upload fails."""
        subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", self.replica_dir],
                       check=True)
        self.addCleanup(subprocess.run, ["umount", "-l", self.replica_dir], capture_output=True)

    def agent_with_unshipped_commits(self):
        a = self.replica_agent()
        self.write(a, "acme", 5)
        wait_for(lambda: a.status()["replication"]["tenants_unshipped"] == 0, 20,
                 "the first commits shipped", on_fail=a.log_tail)
        self.break_replica()
        self.write(a, "acme", 5)
        wait_for(lambda: a.status()["replication"]["failing"] != "", 20,
                 "the replicator to report the failing replica", on_fail=a.log_tail)
        return a

    # ---- items 11 and 16: SIGTERM with commits that cannot ship ----

    def test_the_loop_keeps_renewing_while_the_final_flush_waits_for_the_replica(self):
        a = self.agent_with_unshipped_commits()
        a.proc.send_signal(15)
        time.sleep(0.3)  # a renewal sent before the signal has landed by now
        first = self.lease_rows()["0-16383"]["lease_expires_ms"]
        latest = first
        while a.proc.poll() is None:
            latest = max(latest, self.lease_rows()["0-16383"]["lease_expires_ms"])
            time.sleep(0.1)
        self.assertGreater(latest, first,
                           "no renewal landed while the flush ran\n" + a.log_tail())

    def test_sigterm_that_cannot_ship_every_commit_exits_5_and_says_why(self):
        a = self.agent_with_unshipped_commits()
        code = a.stop()
        self.assertEqual(code, 5, a.log_tail())
        log = a.log()
        self.assertIn("exiting with 5", log)
        self.assertIn("not all shipped to the replica", log)
        # The range was not released: it lapses on the store.
        row = self.lease_rows()["0-16383"]
        self.assertFalse(row["lapsed"])

    def test_sigterm_with_every_commit_shipped_releases_and_exits_0(self):
        a = self.replica_agent()
        self.write(a, "acme", 5)
        wait_for(lambda: a.status()["replication"]["tenants_unshipped"] == 0, 20,
                 "the commits shipped", on_fail=a.log_tail)
        self.assertEqual(a.stop(), 0, a.log_tail())
        self.assertTrue(self.lease_rows()["0-16383"]["lapsed"])

    # ---- item 14: a restart right after kill -9 ----

    def test_every_restart_right_after_kill_9_cleans_the_stale_mount_and_serves(self):
        a = self.agent("a")
        rng = random.Random(14)
        for round_ in range(10):
            a.start()
            a.wait_states("serving", timeout=20)
            # What a user does: the kernel caches the root's and a file's attributes.
            self.write(a, "acme", 1)
            os.stat(a.mount)
            os.listdir(a.mount)
            a.kill9()
            time.sleep(rng.uniform(0.2, 0.5))
            a.start()
            wait_for(lambda: a.running() and a.states() == ["serving"], 20,
                     f"round {round_}: the restarted agent to serve",
                     on_fail=lambda: f"exit {a.proc.poll()}\n" + a.log_tail())
            self.assertIn("cleaned up the stale mount", a.log())
            a.kill9()
            subprocess.run(["umount", "-l", a.mount], capture_output=True)

    # ---- item 2: the open-file limit ----

    def test_the_agent_raises_its_soft_open_file_limit_to_the_hard_limit(self):
        a = self.agent("a")

        def limits():
            resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 4096))
        log = open(a.log_path, "ab")
        a.proc = subprocess.Popen(a.argv(), stdout=log, stderr=subprocess.STDOUT,
                                  preexec_fn=limits)
        log.close()
        a.wait_states("serving")
        with open(f"/proc/{a.proc.pid}/limits") as f:
            line = next(l for l in f if l.startswith("Max open files"))
        self.assertEqual(line.split()[3:5], ["4096", "4096"], line)
        self.assertIn("raised the open-file limit from 1024 to 4096", a.log())


if __name__ == "__main__":
    unittest.main()
