"""What operators see: fleetfs status, /health, /status, /metrics, in each state."""
import json
import os
import sqlite3
import subprocess
import time
import unittest

from harness import BINARY, MountTest, slots, tenants_in, wait_for


def fleetfs(*args):
    return subprocess.run([BINARY, *args], capture_output=True, text=True, timeout=30)


def metric(text, name):
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"metric {name} not in:\n{text}")


class OperatorView(MountTest):
    def test_status_health_and_metrics_show_serving_waiting_failed_and_lapsed(self):
        a = self.agent("a", ranges="0-8191,8192-16383", ttl="3s").start()
        a.wait_states("serving")
        tenant = tenants_in(0, 8191, 1, prefix="ops")[0]
        db = sqlite3.connect(os.path.join(a.mount, slots(tenant)[tenant]["tenant_path"]))
        db.execute("CREATE TABLE t(x)")
        db.commit()

        # Serving: the table, the JSON, the endpoints.
        table = fleetfs("status", a.mount)
        self.assertEqual(table.returncode, 0, table.stderr)
        self.assertIn("owner host-a", table.stdout)
        self.assertIn("ttl 3s", table.stdout)
        lines = {l.split()[0]: l.split() for l in table.stdout.splitlines() if l[:1].isdigit()}
        self.assertEqual(lines["0-8191"][2], "serving")
        self.assertEqual(lines["0-8191"][4], "1")  # one open file
        self.assertEqual(lines["8192-16383"][4], "0")
        doc = json.loads(fleetfs("status", a.mount, "--json").stdout)
        self.assertEqual([r["state"] for r in doc["ranges"]], ["serving", "serving"])
        self.assertIn("   transport " + doc["transport"], table.stdout)
        self.assertEqual(a.http("/health"), (200, "ok\n"))
        status, body = a.http("/status")
        self.assertEqual(status, 200)
        self.assertEqual(json.loads(body)["owner"], "host-a")
        status, metrics = a.http("/metrics")
        self.assertEqual(metric(metrics, "fleetfs_ranges_held"), 2)
        self.assertGreater(metric(metrics, 'fleetfs_range_epoch{range="0-8191"}'), 0)
        self.assertGreater(metric(metrics, 'fleetfs_range_lease_seconds_left{range="0-8191"}'), 0)
        self.assertEqual(metric(metrics, "fleetfs_open_handles"), 1)
        self.assertGreater(metric(metrics, 'fleetfs_fuse_operations_total{op="write"}'), 0)
        self.assertGreater(metric(metrics, 'fleetfs_refresh_outcomes_total{outcome="claimed"}'), 0)
        self.assertNotIn(tenant, metrics)  # no per-tenant labels
        self.assertEqual(a.http("/nothing")[0], 404)
        self.assertEqual(a.http("/health", method="POST")[0], 405)
        self.assertEqual(a.http("/health", method="HEAD"), (200, ""))
        with open(os.path.join(a.mount, ".fleetfs", "ranges")) as f:
            self.assertIn("0-8191 serving epoch", f.read())

        # Waiting: a second host on its own backing directory.
        b = self.agent("b", ranges="0-8191,8192-16383", ttl="3s").start()
        b.wait_states("waiting")
        table = fleetfs("status", b.mount).stdout
        self.assertIn("waiting", table)
        self.assertIn("held by host-a until", table)
        self.assertEqual(b.http("/health")[0], 200)

        # A second agent on A's backing directory is refused, naming A's pid.
        second = subprocess.run(
            [BINARY, "mount", "--backing", a.backing, "--mount", b.dir, "--store", self.store,
             "--admin", "off"], capture_output=True, text=True, timeout=30)
        self.assertEqual(second.returncode, 1)
        self.assertIn(f"in use by another fleetfs agent (pid {a.proc.pid}", second.stderr)
        # B has shown "waiting"; it must not claim A's ranges when the store
        # comes back below (a CI run under ASan held the store past A's ttl,
        # and B took them).
        self.assertEqual(b.stop(), 0)

        # Failed, then lapsed: the store stops answering.
        control = sqlite3.connect(os.path.join(self.root, "control.db"), isolation_level=None,
                                  timeout=5)
        control.execute("BEGIN IMMEDIATE")
        try:
            # The lapse and the call's time limit fall together (ttl/3 after the
            # last renewal was sent, ttl - ttl/3 before...), so either may show first.
            wait_for(lambda: a.http("/health")[0] == 503 and
                     "the store call failed" in a.http("/health")[1], 10,
                     "A's health to name the failed store call", on_fail=a.log_tail)
            wait_for(lambda: a.states() == ["lapsed", "lapsed"], 10, "A's ranges to lapse",
                     on_fail=a.log_tail)
            table = fleetfs("status", a.mount).stdout
            self.assertIn("lapsed", table)
            self.assertIn("FAILING", table)
            metrics = a.http("/metrics")[1]
            self.assertEqual(metric(metrics, "fleetfs_ranges_held"), 0)
            self.assertGreater(metric(metrics, 'fleetfs_refresh_outcomes_total{outcome="failed"}'), 0)
            self.assertGreater(metric(metrics, "fleetfs_fences_total"), 0)
        finally:
            control.execute("ROLLBACK")
            control.close()
        # The store answers again; A serves again (its own rows, or new
        # epochs if they ended on the store meanwhile: nobody else claims).
        a.wait_states("serving")
        wait_for(lambda: a.http("/health")[0] == 200, 10, "A's health to recover",
                 on_fail=a.log_tail)
        db.close()

    def test_a_range_taken_over_on_the_store_shows_as_lost_and_is_fenced(self):
        a = self.agent("a", ranges="0-16383", ttl="3s").start()
        a.wait_states("serving")
        epoch = a.status()["ranges"][0]["epoch"]
        tenant = tenants_in(0, 16383, 1, prefix="lost")[0]
        path = os.path.join(a.mount, slots(tenant)[tenant]["tenant_path"])
        fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
        # An operator ends A's lease on the store and another owner claims:
        # A's next renewal answers "lost".
        # A renewal of A's exact row may land between the two commands (a
        # renewal works after a release nobody used): then release again.
        for _ in range(20):
            done = fleetfs("lease", "release", "--store", self.store, "--range", "0-16383",
                           "--owner", "host-a", "--epoch", str(epoch))
            self.assertEqual(done.returncode, 0, done.stderr)
            done = fleetfs("lease", "claim", "--store", self.store, "--range", "0-16383",
                           "--owner", "host-c")
            if done.returncode != 3:  # 3: A's renewal landed in between
                break
        self.assertEqual(done.returncode, 0, done.stderr)
        a.wait_states("lost")
        with self.assertRaises(OSError):
            os.write(fd, b"after the loss")
        os.close(fd)
        self.assertFalse(os.path.exists(path))
        status, body = a.http("/health")
        self.assertEqual(status, 503)
        self.assertIn("range 0-16383 was lost", body)
        table = fleetfs("status", a.mount).stdout
        self.assertIn(" lost ", table)
        self.assertEqual(metric(a.http("/metrics")[1],
                                'fleetfs_refresh_outcomes_total{outcome="lost"}'), 1)

    def test_status_of_a_directory_that_is_no_mount_says_so(self):
        plain = os.path.join(self.root, "plain")
        os.makedirs(plain)
        result = fleetfs("status", plain)
        self.assertEqual(result.returncode, 1)
        self.assertIn("is not a running fleetfs mount", result.stderr)


if __name__ == "__main__":
    unittest.main()
