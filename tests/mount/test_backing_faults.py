"""A backing volume that fills up or turns read-only under a serving agent
(issue 9 item 15). /health and `fleetfs status` name the volume and why, the
metrics count ENOSPC and EROFS by name; a full volume stays served (what fits
still works), a read-only one is released to a healthy host, and its agent
stands by in phase `failed` until SIGTERM, then exits 1.

The backing directories are real file systems mounted for the test (a small
tmpfs, a loop-mounted ext4 image); the teardown ends the agent first, then
unmounts them, even when the test fails."""
import errno
import os
import re
import sqlite3
import subprocess
import time
import unittest

from harness import BINARY, MountTest, slots, wait_for


def cli(*args):
    return subprocess.run([BINARY, *args], capture_output=True, text=True, timeout=60)


def metric(text, name):
    m = re.search(r"^" + re.escape(name) + r" (\d+)$", text, re.M)
    return int(m.group(1)) if m else None


class BackingFaults(MountTest):
    TIME_LIMIT = 150

    def mount_backing(self, agent, *mount_args):
        subprocess.run(["mount", *mount_args, agent.backing], check=True)

        def unmount():
            agent.cleanup()  # the agent and its FUSE mount hold files of the backing
            for args in (["umount", agent.backing], ["umount", "-l", agent.backing]):
                if subprocess.run(args, capture_output=True).returncode == 0:
                    break
        self.addCleanup(unmount)

    def connect(self, agent, tenant):
        rel = slots(tenant)[tenant]["tenant_path"]
        return sqlite3.connect(os.path.join(agent.mount, rel), isolation_level=None, timeout=5)

    def create_tenant(self, agent, tenant):
        db = self.connect(agent, tenant)
        db.execute("PRAGMA journal_mode=wal")
        db.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, pad BLOB)")
        db.execute("INSERT INTO t(pad) VALUES (randomblob(100))")
        return db

    def health(self, agent):
        return agent.http("/health")

    # ---- ENOSPC: report it, keep serving ----

    def test_a_full_backing_volume_fails_health_naming_it_and_the_range_stays_served(self):
        a = self.agent("a", ttl="3s")
        self.mount_backing(a, "-t", "tmpfs", "-o", "size=2m", "tmpfs")
        a.start()
        a.wait_states("serving")
        db = self.create_tenant(a, "acme")
        self.assertEqual(self.health(a), (200, "ok\n"))

        # Fill the volume beside the agent, as another process on the host would.
        fd = os.open(os.path.join(a.backing, "filler"), os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            for chunk in (65536, 4096, 512, 1):
                while True:
                    try:
                        os.write(fd, b"\0" * chunk)
                    except OSError as e:
                        self.assertEqual(e.errno, errno.ENOSPC)
                        break
        finally:
            os.close(fd)

        with self.assertRaises(sqlite3.OperationalError) as raised:
            db.execute("INSERT INTO t(pad) VALUES (randomblob(400000))")
        self.assertIn("full", str(raised.exception))

        wait_for(lambda: self.health(a)[0] == 503, 5, "/health 503", on_fail=a.log_tail)
        code, body = self.health(a)
        self.assertIn(f"the backing volume {a.backing} is full", body)
        self.assertRegex(body, r"\d+ writes failed with ENOSPC in the last 30s")
        self.assertIn("still serving", body)
        metrics = a.http("/metrics")[1]
        self.assertGreater(metric(metrics, 'fleetfs_fuse_errno_total{errno="ENOSPC"}'), 0, metrics)
        self.assertEqual(metric(metrics, 'fleetfs_fuse_errno_total{errno="EROFS"}'), 0, metrics)
        self.assertIsNotNone(metric(metrics, 'fleetfs_fuse_errno_total{errno="EIO"}'), metrics)
        self.assertEqual(metric(metrics, "fleetfs_backing_full"), 1, metrics)
        self.assertEqual(metric(metrics, "fleetfs_backing_failed"), 0, metrics)
        table = cli("status", a.mount).stdout
        self.assertIn(f"BACKING VOLUME full: the backing volume {a.backing} is full", table)

        # Full is no reason to stand down: the range stays served over a few
        # renewals, and what is there reads back.
        time.sleep(2.5)
        self.assertTrue(a.running(), a.log_tail())
        self.assertEqual(a.states(), ["serving"])
        self.assertEqual(a.status()["phase"], "serving")
        self.assertEqual(db.execute("SELECT count(*) FROM t").fetchone()[0], 1)
        db.close()
        self.assertEqual(a.stop(), 0, a.log_tail())

    # ---- read-only after an error: stand down, release, wait for a signal ----

    def test_a_backing_volume_turned_read_only_is_released_and_the_agent_stands_by_until_sigterm(self):
        image = os.path.join(self.root, "a.img")
        subprocess.run(["truncate", "-s", "16M", image], check=True)
        subprocess.run(["mkfs.ext4", "-q", "-F", image], check=True)
        # A 15 s lease: a release lets B claim at its next refresh (5 s); a
        # lapse would take up to 15 s.
        a = self.agent("a", ttl="15s")
        self.mount_backing(a, "-o", "loop,errors=remount-ro", image)
        b = self.agent("b", ttl="15s")  # a healthy host: its own backing, the same store
        a.start()
        a.wait_states("serving")
        self.create_tenant(a, "acme").close()
        b.start()
        b.wait_states("waiting")
        self.assertEqual(self.health(a), (200, "ok\n"))

        # The file system hits an error and turns itself read-only, as ext4
        # does with errors=remount-ro.
        device = subprocess.run(["findmnt", "-n", "-o", "SOURCE", a.backing], check=True,
                                capture_output=True, text=True).stdout.strip()
        with open(f"/sys/fs/ext4/{os.path.basename(device)}/trigger_fs_error", "w") as f:
            f.write("1")

        db = self.connect(a, "acme")
        with self.assertRaises(sqlite3.OperationalError):
            db.execute("INSERT INTO t(pad) VALUES (randomblob(100))")
        db.close()
        failed_at = time.monotonic()

        wait_for(lambda: "read-only" in self.health(a)[1], 5, "/health naming the read-only volume",
                 on_fail=a.log_tail)
        code, body = self.health(a)
        self.assertEqual(code, 503)
        self.assertIn(f"the backing volume {a.backing} is read-only", body)
        metrics = a.http("/metrics")[1]
        self.assertGreater(metric(metrics, 'fleetfs_fuse_errno_total{errno="EROFS"}'), 0, metrics)
        self.assertEqual(metric(metrics, "fleetfs_backing_failed"), 1, metrics)

        # Released, not left to lapse: the healthy host serves within one of its refreshes.
        b.wait_states("serving", timeout=10)
        self.assertLess(time.monotonic() - failed_at, 12)
        wait_for(lambda: "released 1 ranges" in a.log(), 5, "A's release", on_fail=a.log_tail)

        # A stays up, serving and claiming nothing, and says why.
        wait_for(lambda: a.status()["phase"] == "failed", 5, "phase failed", on_fail=a.log_tail)
        doc = a.status()
        self.assertEqual(doc["backing_volume"]["state"], "failed")
        self.assertIn("read-only", doc["failure"])
        self.assertEqual([r["state"] for r in doc["ranges"]], ["stopped"])
        self.assertFalse(os.path.exists(os.path.join(a.mount, slots("acme")["acme"]["tenant_path"])))
        table = cli("status", a.mount).stdout
        self.assertIn(f"BACKING VOLUME failed: the backing volume {a.backing} is read-only", table)
        self.assertIn("FAILING", table)
        time.sleep(2)
        self.assertTrue(a.running(), a.log_tail())
        self.assertEqual(b.states(), ["serving"])
        self.assertEqual(a.stop(), 1, a.log_tail())
        self.assertRegex(a.log(), r"exiting with 1: the backing volume .* is read-only")

    # ---- one hostile file is not a failing volume ----

    def test_eio_from_a_symlinked_bucket_a_user_made_releases_nothing(self):
        a = self.agent("a", ttl="3s")
        os.chmod(a.backing, 0o1777)  # as in the demo: any user may create in the root
        a.start()
        a.wait_states("serving")
        tenant = "acme"
        row = slots(tenant)[tenant]
        bucket = os.path.dirname(row["tenant_path"])
        elsewhere = os.path.join(self.root, "elsewhere")
        os.makedirs(elsewhere)
        os.symlink(elsewhere, os.path.join(a.backing, bucket))
        with self.assertRaises(sqlite3.OperationalError):
            self.create_tenant(a, tenant)
        time.sleep(1.5)  # several checks of the counters, and the probe they ask for
        self.assertTrue(a.running(), a.log_tail())
        self.assertEqual(a.states(), ["serving"])
        self.assertEqual(self.health(a), (200, "ok\n"))
        metrics = a.http("/metrics")[1]
        self.assertEqual(metric(metrics, "fleetfs_backing_failed"), 0, metrics)
        if (metric(metrics, 'fleetfs_fuse_errors_total{op="create",errno="EIO"}') or 0) > 0:
            # The write error reached the watch: a probe of the volume cleared it.
            self.assertGreaterEqual(metric(metrics, "fleetfs_backing_probes_total"), 1, metrics)
            self.assertIn("writes fine", a.log())


if __name__ == "__main__":
    unittest.main()
