"""`fleetfs mount --store etcd://...`: agents whose ownership table lives in a
real 3-member etcd cluster on loopback (tests/etcd/etcd_cluster.py)."""
import json
import os
import sqlite3
import subprocess
import sys
import time
import unittest

from harness import BINARY, MountTest, slots, tenants_in

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "etcd"))
from etcd_cluster import EtcdCluster  # noqa: E402

TTL_S = 3


class EtcdMount(MountTest):
    def setUp(self):
        super().setUp()
        self.cluster = EtcdCluster(3)
        self.addCleanup(self.cluster.close)  # after the agents' teardown (cleanups run LIFO)
        self.cluster.start()

    @property
    def store(self):
        return self.cluster.url("fleetfs/mount-test")

    def table(self):
        out = subprocess.run([BINARY, "lease", "ls", "--json", "--store", self.store],
                             check=True, capture_output=True, text=True).stdout
        return json.loads(out)

    def test_an_agent_on_an_etcd_store_serves_a_tenant_and_hands_it_over_at_sigterm(self):
        a = self.agent("a", ttl=f"{TTL_S}s").start()
        a.wait_states("serving", timeout=30)
        self.assertEqual(a.status()["store"], self.store)
        tenant = tenants_in(0, 16383, 1, prefix="etcd")[0]
        path = os.path.join(a.mount, slots(tenant)[tenant]["tenant_path"])
        db = sqlite3.connect(path)
        db.execute("CREATE TABLE t(x)")
        db.executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(100)])
        db.commit()
        db.close()
        db = sqlite3.connect(path)
        self.assertEqual(db.execute("SELECT count(*), sum(x) FROM t").fetchone(), (100, 4950))
        db.close()
        rows = self.table()["rows"]
        self.assertEqual([(r["range"], r["owner"]) for r in rows], [("0-16383", "host-a")])
        epoch = rows[0]["epoch"]

        # Renewals keep the row: after several ttls it is still a's, at its epoch.
        time.sleep(2 * TTL_S)
        self.assertEqual(a.states(), ["serving"])
        self.assertEqual(self.table()["rows"][0]["epoch"], epoch)

        b = self.agent("b", ttl=f"{TTL_S}s").start()
        b.wait_states("waiting", timeout=30)
        self.assertEqual(b.status()["ranges"][0]["held_by"]["owner"], "host-a")
        # SIGTERM: a releases through etcd, and b claims at once (well
        # before a's lease would have ended).
        stopped = time.monotonic()
        self.assertEqual(a.stop(), 0, a.log_tail())
        b.wait_states("serving", timeout=TTL_S * 3)
        rows = self.table()["rows"]
        self.assertEqual([(r["range"], r["owner"]) for r in rows], [("0-16383", "host-b")])
        self.assertGreater(rows[0]["epoch"], epoch)
        print(f"\nb serving {time.monotonic() - stopped:.2f} s after a's SIGTERM")

    def test_a_handoff_on_an_etcd_store_is_claimed_by_its_target_at_once_and_back(self):
        # A handoff to an owner needs a replica (it is what carries the data).
        extra = ["--replica", f"file://{self.root}/replica", "--sync-interval", "200ms",
                 "--shutdown-grace", "1s"]
        a = self.agent("a", ttl=f"{TTL_S}s", extra=extra).start()
        a.wait_states("serving", timeout=30)
        b = self.agent("b", ttl=f"{TTL_S}s", extra=extra).start()
        b.wait_states("waiting", timeout=30)
        tenant = tenants_in(0, 16383, 1, prefix="etcdhandoff")[0]
        rel = slots(tenant)[tenant]["tenant_path"]
        db = sqlite3.connect(os.path.join(a.mount, rel))
        db.execute("CREATE TABLE t(x)")
        db.execute("INSERT INTO t VALUES (1)")
        db.commit()
        db.close()
        rows_seen = 1
        for src, dst in ((a, b), (b, a)):
            r = subprocess.run([BINARY, "handoff", "0-16383", "--to", dst.owner, "--mount",
                                src.mount, "--timeout", "30"], capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr + src.log_tail())
            self.assertIn(f"handed over to '{dst.owner}'", r.stdout)
            dst.wait_states("serving", timeout=30)
            self.assertEqual(src.states(), ["handed-off"])
            rows = self.table()["rows"]
            self.assertEqual([(r["range"], r["owner"]) for r in rows], [("0-16383", dst.owner)])
            # The target serves every commit the source made, and writes on.
            db = sqlite3.connect(os.path.join(dst.mount, rel))
            self.assertEqual(db.execute("SELECT count(*) FROM t").fetchone()[0], rows_seen)
            db.execute("INSERT INTO t VALUES (2)")
            db.commit()
            db.close()
            rows_seen += 1


if __name__ == "__main__":
    unittest.main()
