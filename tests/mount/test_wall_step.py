"""A `date -s` either way under two agents that share one SQLite control
database (DESIGN 2: no wall clock takes part in safety).

Agent A serves a tenant with a writer committing through its mount; agent B,
configured for the same range, waits with a writer of its own through its
mount. Both agents read the wall clock through FLEETFS_TEST_WALL_OFFSET_FILE
(the test-only offset: nothing else moves one process's CLOCK_REALTIME), so
the test steps their wall clock without touching the machine's. The observer
checks that no two hosts acknowledged writes for the tenant at once.
"""
import json
import os
import shutil
import signal
import sqlite3
import tempfile
import subprocess
import time
import unittest

from harness import BINARY, MountTest, slots, tenants_in, wait_for
from observer import LoopWriter, Observer

TTL_S = 3  # the shortest lease: the test waits in multiples of it
REFRESH_S = TTL_S / 3
SYNC_S = 0.2
# Scheduling and restore slack on a loaded 2-core machine, stated once.
SLACK_S = 1.0
HOUR_MS = 3_600_000


class WallStep(MountTest):
    TIME_LIMIT = 120

    def setUp(self):
        super().setUp()
        self.offset_file = os.path.join(self.root, "wall-offset")
        self.observer = Observer()
        self.writers = []
        self.addCleanup(self._stop_writers)

    def _stop_writers(self):
        for w in self.writers:
            w.stop()

    def step_wall(self, ms):
        """Moves both agents' wall clock to real time + ms (by rename: atomic)."""
        with open(self.offset_file + ".new", "w") as f:
            f.write(f"{ms}\n")
        os.rename(self.offset_file + ".new", self.offset_file)

    def lease_ls(self):
        out = subprocess.run([BINARY, "lease", "ls", "--store", self.store, "--json"],
                             capture_output=True, text=True, timeout=30,
                             env={**os.environ, "FLEETFS_TEST_WALL_OFFSET_FILE": self.offset_file})
        self.assertEqual(out.returncode, 0, out.stderr)
        return json.loads(out.stdout)

    def start_pair(self, ttl_a=TTL_S):
        """A serves a tenant under a writer; B waits for the same range, its
        writer retrying through B's mount. Returns (a, b, tenant, rel)."""
        env = {"FLEETFS_TEST_WALL_OFFSET_FILE": self.offset_file}
        extra = ["--replica", f"file://{self.root}/replica",
                 "--sync-interval", f"{int(SYNC_S * 1000)}ms"]
        tenant = tenants_in(0, 16383, 1, prefix="wall")[0]
        rel = slots(tenant)[tenant]["tenant_path"]
        a = self.agent("a", ttl=f"{ttl_a}s", extra=extra, env=env).start()
        a.wait_states("serving")
        db = sqlite3.connect(os.path.join(a.mount, rel), isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, host TEXT)")
        db.close()
        b = self.agent("b", ttl=f"{TTL_S}s", extra=extra, env=env).start()
        b.wait_states("waiting")
        self.writers.append(LoopWriter(self.observer, "a", tenant,
                                       os.path.join(a.mount, rel)).start())
        self.writers.append(LoopWriter(self.observer, "b", tenant, os.path.join(b.mount, rel),
                                       id_base=1_000_000).start())
        wait_for(lambda: len(self.observer.acks(host="a")) >= 20, 20,
                 "A's writer to commit 20 times", on_fail=a.log_tail)
        return a, b, tenant, rel

    def test_a_wall_step_forward_lets_no_waiting_agent_claim_while_the_holder_renews(self):
        # A renews every 4 s, B tries to claim every 1 s; the step comes just
        # after one of A's renewals, so B's claims come first: a store that
        # read the wall clock would see A's lease an hour past its end and
        # grant B's next claim (about 3 s before A learns it lost the range).
        ttl_a = 4 * TTL_S
        a, b, tenant, _ = self.start_pair(ttl_a=ttl_a)
        epoch = a.status()["ranges"][0]["epoch"]
        refreshes = a.status()["refreshes"]
        wait_for(lambda: a.status()["refreshes"] > refreshes, ttl_a / 3 + SLACK_S,
                 "a renewal of A", poll=0.002, on_fail=a.log_tail)
        self.step_wall(+HOUR_MS)
        stepped = time.monotonic()
        refreshes = a.status()["refreshes"]
        # One lease of A's: it renews three times; B tries to claim twelve.
        # Seen, not failed at once: the writers run on, so the observer
        # judges what a split brain did to them.
        b_served, a_stopped = [], []
        while time.monotonic() < stepped + ttl_a:
            if b.states() == ["serving"]:
                b_served.append(time.monotonic())
            if a.states() != ["serving"]:
                a_stopped.append(time.monotonic())
            time.sleep(0.05)
        for w in self.writers:
            w.stop()
        self.writers = []
        self.observer.assert_no_overlap()
        self.assertEqual(b_served, [], "B claimed a range whose holder was alive and renewing")
        self.assertEqual(a_stopped, [], "A stopped serving")
        self.assertGreaterEqual(a.status()["refreshes"], refreshes + 2, "A stopped renewing")
        late = [x for x in self.observer.acks(host="a") if x.acked > stepped + ttl_a - 1]
        self.assertTrue(late, "A's writer was not acknowledged after the step")
        self.assertEqual(self.observer.acks(host="b"), [], "B acknowledged writes")
        self.observer.assert_no_overlap()
        rows = self.lease_ls()["rows"]
        self.assertEqual([(r["owner"], r["epoch"], r["lapsed"]) for r in rows],
                         [("host-a", epoch, False)])
        # Shown on the stepped wall clock (display only).
        self.assertGreater(rows[0]["lease_expires_ms"], time.time() * 1000 + HOUR_MS - 2000)

    def test_a_wall_step_back_does_not_delay_failover_after_kill_9(self):
        a, b, tenant, rel = self.start_pair()
        self.step_wall(-HOUR_MS)
        # A renews under the stepped clock (two refreshes end after the step).
        refreshes = a.status()["refreshes"]
        wait_for(lambda: a.status()["refreshes"] >= refreshes + 2, 3 * REFRESH_S + SLACK_S,
                 "A to renew twice after the step", on_fail=a.log_tail)
        a.kill9()
        killed = time.monotonic()
        # When A's store lease ends, on the monotonic clock: left_ms is the
        # store's own (its frame, not the wall's).
        asked = time.monotonic()
        rows = self.lease_ls()["rows"]
        self.assertEqual(rows[0]["owner"], "host-a")
        expiry = asked + rows[0]["left_ms"] / 1000
        last_renewal = expiry - TTL_S
        served = wait_for(lambda: b.states() == ["serving"], TTL_S + REFRESH_S + 2 * SLACK_S,
                          "B to serve after A's lease ended", poll=0.005, on_fail=b.log_tail)
        print(f"\nB served {(served - last_renewal) * 1000:.0f} ms after A's last renewal "
              f"(ttl {TTL_S * 1000} ms), {(served - killed) * 1000:.0f} ms after the kill")
        self.assertGreaterEqual(served, expiry - 0.05, "B served before A's store lease ended")
        self.assertLessEqual(served - last_renewal, TTL_S + REFRESH_S + SLACK_S)
        # B restored A's commits and serves the tenant: its writer is acknowledged.
        wait_for(lambda: len(self.observer.acks(host="b")) >= 10, 10 + SLACK_S,
                 "B's writer to commit 10 times", on_fail=b.log_tail)
        for w in self.writers:
            w.stop()
        writer_a = self.writers[0]
        self.writers = []
        self.observer.assert_no_overlap()
        self.assertEqual([t.host for t in self.observer.tenures(tenant)], ["a", "b"])
        self.assertIn("restored", b.log())
        due = {row for row, ack in zip(writer_a.ids(), self.observer.acks(host="a"))
               if ack.acked <= killed - SYNC_S - SLACK_S}
        db = sqlite3.connect(f"file:{os.path.join(b.mount, rel)}?mode=ro", uri=True)
        on_b = {r[0] for r in db.execute("SELECT id FROM t WHERE host = 'a'")}
        db.close()
        self.assertTrue(due)
        self.assertFalse(due - on_b, f"{len(due - on_b)} of A's {len(due)} commits made before "
                         "the last sync interval are not on B")


class TimeNamespace(unittest.TestCase):
    """Two claimers of one host sharing a SQLite control file, one of them in
    a time namespace whose boot clock is shifted: the boot id is the same in
    both, so the store must measure both on the host's boot clock."""

    def setUp(self):
        self.root = tempfile.mkdtemp(prefix="fleetfs-timens-", dir="/tmp")
        self.addCleanup(shutil.rmtree, self.root, ignore_errors=True)
        self.store = f"sqlite://{self.root}/control.db"

    def claim(self, owner, shift=None):
        argv = [BINARY, "lease", "claim", "--store", self.store, "--owner", owner,
                "--range", "0-100", "--ttl", "60s"]
        if shift is not None:
            argv = ["unshare", "-T", "--boottime", str(shift), *argv]
        return subprocess.run(argv, capture_output=True, text=True, timeout=30)

    def test_a_claim_from_a_shifted_time_namespace_never_takes_a_live_lease(self):
        for shift in (-600, +86400):
            first, second = f"x{shift}", f"y{shift}"
            ran = self.claim(first, shift=shift)
            self.assertEqual(ran.returncode, 0, ran.stderr)
            ran = self.claim(second)
            self.assertEqual(ran.returncode, 3, f"shift {shift}: {first}'s 60 s lease is live, "
                             f"yet {second} got: {ran.stdout}{ran.stderr}")
            ls = json.loads(subprocess.run([BINARY, "lease", "ls", "--store", self.store,
                                            "--json"], capture_output=True, text=True,
                                           check=True).stdout)
            left = ls["rows"][0]["left_ms"]
            self.assertTrue(50_000 <= left <= 60_000,
                            f"shift {shift}: the lease has {left} ms left, not about 60 s")
            # Release it for the next shift.
            epoch = ls["rows"][0]["epoch"]
            subprocess.run([BINARY, "lease", "release", "--store", self.store, "--owner", first,
                            "--range", "0-100", "--epoch", str(epoch)], check=True,
                           capture_output=True)


if __name__ == "__main__":
    unittest.main()
