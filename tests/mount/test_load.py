"""Load through the mount: many processes, own and shared tenants, both journal modes."""
import multiprocessing
import os
import sqlite3
import time
import unittest

from harness import MountTest, slots, tenants_in

OWN_WRITERS = 8
SHARED_WRITERS = 4
TRANSACTIONS = 1000


def is_busy(error):
    text = str(error)
    return "locked" in text or "busy" in text


def write_rows(path, journal_mode, writer, count, results):
    """One process: `count` single-row transactions; only SQLITE_BUSY is retried."""
    busy_retries = 0

    def until_not_busy(*statements):
        nonlocal busy_retries
        while True:
            try:
                for sql, params in statements:
                    db.execute(sql, params)
                return
            except sqlite3.OperationalError as e:
                if not is_busy(e):
                    raise
                busy_retries += 1

    try:
        db = sqlite3.connect(path, timeout=0.05, isolation_level=None)
        until_not_busy((f"PRAGMA journal_mode={journal_mode}", ()),
                       ("CREATE TABLE IF NOT EXISTS t(writer INTEGER, n INTEGER, pad TEXT)", ()))
        for n in range(count):
            until_not_busy(("BEGIN IMMEDIATE", ()))
            db.execute("INSERT INTO t VALUES (?, ?, ?)", (writer, n, "x" * 100))
            until_not_busy(("COMMIT", ()))
        db.close()
        results.put((writer, "ok", busy_retries))
    except Exception as e:  # reported to the test, which fails on it
        results.put((writer, f"{type(e).__name__}: {e}", busy_retries))


class Load(MountTest):
    TIME_LIMIT = 600

    def run_load(self, journal_mode):
        a = self.agent(ranges="0-16383", ttl="10s").start()
        a.wait_states("serving")
        names = tenants_in(0, 16383, OWN_WRITERS + 1, prefix=f"load-{journal_mode}-")
        info = slots(*names)
        own = [os.path.join(a.mount, info[n]["tenant_path"]) for n in names[:OWN_WRITERS]]
        shared = os.path.join(a.mount, info[names[-1]]["tenant_path"])
        sqlite3.connect(shared).execute("CREATE TABLE t(writer INTEGER, n INTEGER, pad TEXT)")

        ctx = multiprocessing.get_context("fork")
        results = ctx.Queue()
        procs = [ctx.Process(target=write_rows, args=(p, journal_mode, i, TRANSACTIONS, results))
                 for i, p in enumerate(own)]
        procs += [ctx.Process(target=write_rows,
                              args=(shared, journal_mode, 100 + i, TRANSACTIONS, results))
                  for i in range(SHARED_WRITERS)]
        started = time.monotonic()
        for p in procs:
            p.start()
        outcomes = [results.get(timeout=self.TIME_LIMIT) for _ in procs]
        for p in procs:
            p.join(60)
        took = time.monotonic() - started
        errors = [o for o in outcomes if o[1] != "ok"]
        self.assertEqual(errors, [], "writers failed with more than SQLITE_BUSY")
        retries = sum(o[2] for o in outcomes)
        total = (OWN_WRITERS + SHARED_WRITERS) * TRANSACTIONS
        print(f"\n{journal_mode}: {total} transactions by {len(procs)} processes in {took:.1f} s "
              f"({total / took:.0f}/s), {retries} SQLITE_BUSY retries")

        for path in own:
            db = sqlite3.connect(path)
            self.assertEqual(db.execute("SELECT count(*), count(DISTINCT n) FROM t").fetchone(),
                             (TRANSACTIONS, TRANSACTIONS))
            self.assertEqual(db.execute("PRAGMA integrity_check").fetchone()[0], "ok")
            self.assertEqual(db.execute("PRAGMA journal_mode").fetchone()[0], journal_mode)
            db.close()
        db = sqlite3.connect(shared)
        self.assertEqual(db.execute("SELECT count(*) FROM t").fetchone()[0],
                         SHARED_WRITERS * TRANSACTIONS)
        self.assertEqual(db.execute("SELECT writer, count(*) FROM t GROUP BY writer").fetchall(),
                         [(100 + i, TRANSACTIONS) for i in range(SHARED_WRITERS)])
        self.assertEqual(db.execute("PRAGMA integrity_check").fetchone()[0], "ok")
        db.close()
        # Nothing was fenced while the lease held.
        status, metrics = a.http("/metrics")
        self.assertEqual(status, 200)
        self.assertIn("fleetfs_fenced_operations_total 0\n", metrics)

    def test_wal_mode_under_load(self):
        self.run_load("wal")

    def test_rollback_journal_mode_under_load(self):
        self.run_load("delete")


if __name__ == "__main__":
    unittest.main()
