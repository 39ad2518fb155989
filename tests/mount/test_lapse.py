"""A lapse: the store stops answering, and the range is hidden and fenced."""
import errno
import hashlib
import os
import sqlite3
import time
import unittest

from harness import MountTest, slots, tenants_in, wait_for

# How long after the local lease's end the range may still be visible: the
# agent's loop wakes at the lease end, then the kernel is told to forget.
HIDE_BOUND_S = 0.5


def digest(paths):
    h = hashlib.sha256()
    for p in paths:
        try:
            with open(p, "rb") as f:
                h.update(p.encode() + b"\0" + f.read())
        except FileNotFoundError:
            h.update(p.encode() + b"\0missing")
    return h.hexdigest()


class Lapse(MountTest):
    def test_a_range_whose_store_stops_answering_is_hidden_and_fenced_at_its_local_lease_end(self):
        a = self.agent(ranges="0-16383", ttl="3s").start()
        a.wait_states("serving")
        tenant, raw = tenants_in(0, 16383, 2, prefix="lapse")
        info = slots(tenant, raw)
        rel = info[tenant]["tenant_path"]
        path = os.path.join(a.mount, rel)

        db = sqlite3.connect(path)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("CREATE TABLE t(x)")
        db.execute("INSERT INTO t VALUES (1)")
        db.commit()
        reader = sqlite3.connect(path)
        self.assertEqual(reader.execute("SELECT count(*) FROM t").fetchone()[0], 1)
        # A plain descriptor, to see each operation fail on its own.
        raw_path = os.path.join(a.mount, info[raw]["tenant_path"])
        fd = os.open(raw_path, os.O_CREAT | os.O_RDWR, 0o644)
        os.write(fd, b"before" * 100)

        # The store stops answering: the test holds its write lock.
        control = sqlite3.connect(os.path.join(self.root, "control.db"), isolation_level=None,
                                  timeout=5)
        control.execute("BEGIN IMMEDIATE")
        try:
            # No renewal can commit now. One that committed just before may
            # still be on its way back to the agent (slow on a loaded machine):
            # the lease end is final once two reads agree.
            def lease_end_now():
                # The agent's clock is CLOCK_BOOTTIME; this test's times are
                # time.monotonic() (they differ by the time the host slept).
                slept = time.clock_gettime(time.CLOCK_BOOTTIME) - time.monotonic()
                return a.status()["ranges"][0]["local_lease_end_monotonic_s"] - slept
            lease_end = lease_end_now()
            for _ in range(10):
                time.sleep(0.05)
                again = lease_end_now()
                if abs(again - lease_end) < 0.001:
                    break
                lease_end = again
            self.assertGreater(lease_end, time.monotonic(), "the lease ended before the test looked")

            hidden_at = wait_for(lambda: not os.path.exists(path) and
                                 tenant + ".db" not in os.listdir(os.path.dirname(path)),
                                 timeout=10, what="the lapsed range to be hidden", poll=0.002,
                                 on_fail=a.log_tail)
            delay = hidden_at - lease_end
            print(f"\nhidden {delay * 1000:.1f} ms after the local lease end "
                  f"(bound {HIDE_BOUND_S * 1000:.0f} ms)")
            self.assertLess(delay, HIDE_BOUND_S)
            self.assertGreater(delay, -0.05, "hidden before the local lease ended")

            backing = [os.path.join(a.backing, rel + s) for s in ("", "-wal")] + \
                      [os.path.join(a.backing, info[raw]["tenant_path"])]
            before = digest(backing)

            # The open connections' next write and read fail.
            with self.assertRaises(sqlite3.Error):
                db.execute("INSERT INTO t VALUES (2)")
                db.commit()
            with self.assertRaises(sqlite3.Error):
                reader.execute("SELECT count(*) FROM t").fetchall()
            # Every operation on an open handle fails with ESTALE.
            for name, call in [("pwrite", lambda: os.pwrite(fd, b"after", 0)),
                               ("pread", lambda: os.pread(fd, 10, 0)),
                               ("fsync", lambda: os.fsync(fd)),
                               ("ftruncate", lambda: os.ftruncate(fd, 0)),
                               ("fallocate", lambda: os.posix_fallocate(fd, 0, 8192))]:
                with self.assertRaises(OSError, msg=name) as e:
                    call()
                self.assertEqual(e.exception.errno, errno.ESTALE, name)
            time.sleep(0.2)
            self.assertEqual(digest(backing), before, "a backing file changed after the lapse")
            status, body = a.http("/health")
            self.assertEqual(status, 503)
            self.assertIn("range 0-16383", body)
        finally:
            control.execute("ROLLBACK")
            control.close()

        # The store answers again: the range comes back, the old handles stay fenced.
        a.wait_states("serving")
        with self.assertRaises(OSError) as e:
            os.pread(fd, 10, 0)
        self.assertEqual(e.exception.errno, errno.ESTALE)
        os.close(fd)
        db.close()
        reader.close()
        fresh = sqlite3.connect(path)
        self.assertEqual(fresh.execute("SELECT count(*) FROM t").fetchone()[0], 1)
        self.assertEqual(fresh.execute("PRAGMA integrity_check").fetchone()[0], "ok")
        fresh.close()
        self.assertIn("fencing its handles", a.log())


if __name__ == "__main__":
    unittest.main()
