"""Replication to an S3 bucket (issue 12), through real mounts: the replica is
s3://BUCKET/PREFIX on the test server of tests/s3 (s3rver with AWS's
`If-None-Match: *` create-only writes), each test under its own prefix.

The failover, point-in-time and fencing tests of test_replication run here
unchanged against s3:// (S3Replication overrides how the replica is named
and how its objects are reached); the tests below them are S3's own: an
owner fenced by the conditional create, the destination down under load,
and the destinations an agent refuses at start.

Objects are read and forged with the `curl` CLI's own SigV4 signing, a
client independent of fleetfs."""
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
import unittest
import urllib.parse

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "s3"))
from s3_fixture import ACCESS_KEY, REGION, SECRET_KEY, FaultProxy, S3Server  # noqa: E402
from test_fixture import curl  # noqa: E402

import test_replication as rep  # noqa: E402  (the module: its Replication is not run here)
from harness import MountTest, tenants_in, wait_for  # noqa: E402

# The tests of test_replication that run against s3:// too.
SHARED = ("test_failover_wal", "test_failover_rollback_journal", "test_point_in_time",
          "test_newer_epoch_at_the_replica_drops_the_range",
          "test_a_forged_epoch_in_the_log_is_refused_not_taken_for_a_fence")

OUTAGE_S = 20
# The outage test's sync interval: its bound (every commit from before the
# destination's return shipped within two of them) is that many seconds.
OUTAGE_SYNC_S = 1.0


def credentials(secret=SECRET_KEY):
    return {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": secret,
            "AWS_REGION": REGION}


class Bucket:
    """One bucket of the test server, read and written with curl."""

    def __init__(self, endpoint, bucket):
        self.endpoint, self.bucket = endpoint, bucket

    def _path(self, key):
        return f"/{self.bucket}/" + urllib.parse.quote(key, safe="/-_.~")

    def keys(self, prefix, delimiter=None):
        """The keys under `prefix` (with `delimiter`, only the objects one
        level down, named relative to `prefix`)."""
        found, token = [], None
        while True:
            params = {"list-type": "2", "prefix": prefix}
            if delimiter:
                params["delimiter"] = delimiter
            if token:
                params["continuation-token"] = token
            # curl signs the query as written: its parameters sorted.
            query = "&".join(f"{k}={urllib.parse.quote(v, safe='-_.~')}"
                             for k, v in sorted(params.items()))
            a = curl(self.endpoint, "GET", f"/{self.bucket}?{query}")
            if a.status != 200:
                raise AssertionError(f"listing {prefix!r} in {self.bucket}: {a}")
            for k in re.findall(rb"<Key>([^<]+)</Key>", a.body):
                found.append(k.decode())
            m = re.search(rb"<NextContinuationToken>([^<]+)</NextContinuationToken>", a.body)
            if not m:
                break
            token = m.group(1).decode()
        if delimiter:
            return [k[len(prefix):] for k in found]
        return found

    def get(self, key):
        a = curl(self.endpoint, "GET", self._path(key))
        if a.status != 200:
            raise AssertionError(f"GET {key}: {a}")
        return a.body

    def create(self, key, data):
        """A create-only write, as the agents write their log."""
        a = curl(self.endpoint, "PUT", self._path(key), data, headers=["If-None-Match: *"])
        if a.status != 200:
            raise AssertionError(f"create {key}: {a}")


# Commits one row at a time until the file argv[3] exists; after each commit
# returns, appends its id to argv[2] (outside the mount). A process of its
# own, not a fork of the test's: a fork would hold the fault proxy's sockets
# open, and a connection the proxy resets would stay open in it.
WRITER = r"""
import os, sqlite3, sys, time
path, log_path, stop = sys.argv[1:4]
db = sqlite3.connect(path, timeout=30, isolation_level=None)
i = 0
with open(log_path, "a") as log:
    while not os.path.exists(stop):
        i += 1
        db.execute("INSERT INTO t(id, pad) VALUES (?, randomblob(200))", (i,))
        log.write(f"{i}\n")
        log.flush()
        time.sleep(0.005)  # pacing, so 2 cores keep room for the agent
db.close()
"""


def committed_ids(log_path):
    with open(log_path) as f:
        return {int(line) for line in f if line.strip()}


class S3Replication(rep.Replication):
    """test_replication's tests with the replica in a bucket: s3://BUCKET/PREFIX,
    the endpoint by --replica-endpoint, credentials in the environment."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.s3 = S3Server()
        cls.addClassCleanup(cls.s3.stop)
        cls.objects = Bucket(cls.s3.endpoint, cls.s3.bucket)

    @property
    def prefix(self):
        return os.path.basename(self.root)  # one per test

    @property
    def replica(self):
        return f"s3://{self.s3.bucket}/{self.prefix}"

    def replica_flags(self):
        return ["--replica-endpoint", self.s3.endpoint]

    def replica_env(self):
        return credentials()

    def log_objects(self, rel):
        return self.objects.keys(f"{self.prefix}/{rel}/", delimiter="/")

    def read_object(self, rel, name):
        return self.objects.get(f"{self.prefix}/{rel}/{name}")

    def create_object(self, rel, name, data):
        self.objects.create(f"{self.prefix}/{rel}/{name}", data)

    def ragent(self, name, endpoint=None, **kwargs):
        """`endpoint` replaces the server's (a fault proxy's)."""
        a = super().ragent(name, **kwargs)
        if endpoint:
            a.extra[a.extra.index("--replica-endpoint") + 1] = endpoint
        return a

    def lag(self, agent):
        code, body = agent.http("/status")
        self.assertEqual(code, 200, body)
        return max(r["replication_lag_s"] for r in json.loads(body)["ranges"])

    def before_the_kill(self, agent, load_began):
        # One upload to s3rver takes tens of milliseconds, and one key's
        # uploads are sequential: on a loaded machine (ctest -j2 beside
        # mount_replication) A's lag reached 2.6 s with a 0.2 s sync
        # interval, and a tenant had shipped none of the load when A was
        # killed. The kill waits until every commit of the load's first
        # second has landed (A's lag is younger than that), so B has some of
        # it whatever the machine's speed; what B must hold is still judged
        # by the lag A reports just before the kill.
        wait_for(lambda: self.lag(agent) < time.time() - load_began - 1.0, 15,
                 f"{agent.name} to ship the load's first second",
                 on_fail=lambda: f"lag {self.lag(agent):.3f} s, load running for "
                                 f"{time.time() - load_began:.1f} s\n" + agent.log_tail())

    def stop_after_renewal(self, agent):
        """SIGSTOPs `agent` just after a renewal of its lease returned: a
        pause inside its store transaction would keep the SQLite control file
        locked and nobody could claim (see test_pause)."""
        last = [None]

        def renewed():
            code, body = agent.http("/status")
            left = min(r["lease_left_ms"] for r in json.loads(body)["ranges"])
            grew = last[0] is not None and left > last[0]
            last[0] = left
            return grew
        wait_for(renewed, rep.TTL_S * 2, f"a renewal of {agent.name}'s lease", poll=0.005,
                 on_fail=agent.log_tail)
        agent.proc.send_signal(signal.SIGSTOP)

    # Issue 12: two owners at different epochs write one key. A's upload
    # fails (the proxy answers 500) and A is paused past its lease; B claims
    # at a higher epoch and ships, its marker taking the sequence A's pending
    # upload is for. A resumes: its upload is refused by the store's
    # conditional create (412), A reads B's epoch there and drops the range.
    def test_a_paused_owner_is_fenced_by_the_conditional_create_and_b_loses_nothing(self):
        tenant = tenants_in(0, 16383, 1, prefix="paused")[0]
        with FaultProxy(self.s3.endpoint) as proxy:
            a = self.ragent("a", endpoint=proxy.endpoint).start()
            a.wait_states("serving")
            a_epoch = a.status()["ranges"][0]["epoch"]
            rel = self.make_tenant(a, tenant, "wal")
            db = sqlite3.connect(os.path.join(a.mount, rel), isolation_level=None)
            for i in range(10):
                db.execute("INSERT INTO t(id, pad) VALUES (?, x'00')", (i,))
            self.wait_shipped(a)
            # A's last commit never reaches the store before the pause (the
            # loss an unplanned failover allows: it was never shipped).
            proxy.set_mode("error500", methods=["PUT"])
            faults = proxy.faults()
            db.execute("INSERT INTO t(id, pad) VALUES (100, x'00')")
            db.close()
            wait_for(lambda: proxy.faults() > faults, 10, "A's upload of its last commit",
                     on_fail=a.log_tail)
            self.stop_after_renewal(a)
            try:
                b = self.ragent("b").start()
                b.wait_states("serving", timeout=rep.TTL_S * 4)
                b_epoch = b.status()["ranges"][0]["epoch"]
                self.assertGreater(b_epoch, a_epoch)
                path = os.path.join(b.mount, rel)
                self.assertEqual(rep.rows(path), (set(range(10)), "ok"))
                db = sqlite3.connect(path, isolation_level=None)
                for i in range(200, 210):
                    db.execute("INSERT INTO t(id, pad) VALUES (?, x'00')", (i,))
                db.close()
                self.wait_shipped(b)  # B's marker, then its segments
                self.assertIn(f"taken at epoch {b_epoch}", b.log())
                proxy.set_mode("pass")
                puts = proxy.counts().get("PUT", 0)
            finally:
                a.proc.send_signal(signal.SIGCONT)
            wait_for(lambda: "another host owns it now" in a.log(), 30,
                     "A's upload refused and B's epoch read", on_fail=a.log_tail)
            self.assertGreater(proxy.counts().get("PUT", 0), puts, "A never tried again")
        self.assertIn(f"has epoch {b_epoch} at {self.replica}", a.log())
        self.assertIn(f"(ours is {a_epoch})", a.log())
        wait_for(lambda: a.states() and "serving" not in a.states(), 15, "A drops the range",
                 on_fail=a.log_tail)
        self.assertTrue(a.running(), a.log_tail())
        self.assertEqual(b.states(), ["serving"])
        self.assertEqual(b.status()["ranges"][0]["epoch"], b_epoch)
        # B's writes all stand: A's late upload overwrote nothing.
        db = sqlite3.connect(os.path.join(b.mount, rel), isolation_level=None)
        db.execute("INSERT INTO t(id, pad) VALUES (300, x'00')")
        db.close()
        self.wait_shipped(b)
        want = set(range(10)) | set(range(200, 210)) | {300}
        out = os.path.join(self.root, "after.db")
        r = self.cli("restore", tenant, "--replica", self.replica, "-o", out)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(rep.rows(out), (want, "ok"))
        r = self.cli("replica", "verify", tenant, "--replica", self.replica)
        self.assertEqual(r.returncode, 0, r.stderr)

    # Issue 12: the destination down for 20 s (every connection reset) while
    # a writer commits through the mount: /health says so, nothing is lost,
    # and once it is back every commit from before its return ships within
    # two sync intervals.
    def test_a_destination_down_for_20_s_under_load_loses_nothing_and_catches_up(self):
        tenant = tenants_in(0, 16383, 1, prefix="outage")[0]
        with FaultProxy(self.s3.endpoint) as proxy:
            a = self.ragent("a", endpoint=proxy.endpoint,
                            sync=f"{int(OUTAGE_SYNC_S * 1000)}ms").start()
            a.wait_states("serving")
            rel = self.make_tenant(a, tenant, "wal")
            self.wait_shipped(a, timeout=10 * OUTAGE_SYNC_S)
            log_path = os.path.join(self.root, "writer.log")
            stop = os.path.join(self.root, "stop-writer")
            w = subprocess.Popen([sys.executable, "-c", WRITER, os.path.join(a.mount, rel),
                                  log_path, stop])
            self.addCleanup(lambda: w.poll() is not None or (w.kill(), w.wait()))
            wait_for(lambda: os.path.exists(log_path) and len(committed_ids(log_path)) >= 20,
                     15, "the writer under way", on_fail=a.log_tail)
            self.assertEqual(a.http("/health")[0], 200)

            proxy.set_mode("reset")
            down_at = time.monotonic()
            codes, first_503, health_body = [], None, ""
            while time.monotonic() < down_at + OUTAGE_S:
                code, body = a.http("/health")
                codes.append(code)
                if code == 503 and first_503 is None:
                    first_503, health_body = time.monotonic() - down_at, body
                time.sleep(0.1)  # polling /health for the outage's fixed length
            during = len(committed_ids(log_path))
            proxy.set_mode("pass")
            back_wall, back = time.time(), time.monotonic()

            # Caught up when the oldest unshipped commit is younger than the
            # return: every commit made while it was down has landed.
            caught = wait_for(lambda: self.lag(a) < time.time() - back_wall, 120,
                              "every commit from before the return shipped", poll=0.02,
                              on_fail=a.log_tail) - back
            healthy = wait_for(lambda: a.http("/health")[0] == 200, 60, "health 200 again",
                               on_fail=a.log_tail) - back
            open(stop, "w").close()
            self.assertEqual(w.wait(30), 0, "the writer failed")
            self.wait_shipped(a, timeout=30)
            self.assertEqual(a.stop(), 0)
            self.assertIn("every commit is shipped", a.log())
            resets = proxy.faults()
        committed = committed_ids(log_path)
        print(f"\noutage {OUTAGE_S} s, {resets} requests reset; /health 503 first "
              f"{first_503 if first_503 is None else round(first_503, 2)} s after it began "
              f"({codes.count(503)} of {len(codes)} polls); {during} commits by its end, "
              f"{len(committed)} in all; every commit from before the return shipped "
              f"{caught:.2f} s after it ({caught / OUTAGE_SYNC_S:.2f} sync intervals of "
              f"{OUTAGE_SYNC_S} s); /health 200 after {healthy:.2f} s", flush=True)
        self.assertIsNotNone(first_503, f"/health never answered 503 while the destination was "
                             f"down: {sorted(set(codes))}\n" + a.log_tail())
        self.assertIn("the replicator cannot write", health_body)
        out = os.path.join(self.root, "after.db")
        r = self.cli("restore", tenant, "--replica", self.replica, "-o", out)
        self.assertEqual(r.returncode, 0, r.stderr)
        ids, check = rep.rows(out)
        self.assertEqual(check, "ok")
        self.assertFalse(committed - ids, f"{len(committed - ids)} of {len(committed)} commits "
                         f"are not in the replica")
        self.assertLessEqual(caught, 2 * OUTAGE_SYNC_S,
                             f"the commits made while the destination was down shipped "
                             f"{caught:.2f} s after its return, more than two sync intervals")


class S3StartRefusals(MountTest):
    """Destinations an agent refuses at start: it exits non-zero with one
    line naming the bucket and the endpoint, and mounts nothing."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.s3 = S3Server()
        cls.addClassCleanup(cls.s3.stop)

    def refused(self, s3, bucket, env):
        prefix = os.path.basename(self.root)
        url = f"s3://{bucket}/{prefix}"
        a = self.agent("a", extra=["--replica", url, "--replica-endpoint", s3.endpoint],
                       env=env).start()
        try:
            code = a.proc.wait(60)
        except Exception:
            self.fail_with_logs("the agent did not exit")
        self.assertNotEqual(code, 0, a.log_tail())
        self.assertFalse(os.path.ismount(a.mount), "the agent mounted")
        lines = [line for line in a.log().splitlines() if bucket in line and s3.endpoint in line]
        self.assertTrue(lines, "no line names the bucket and the endpoint\n" + a.log_tail())
        print(f"\nexit {code}: {lines[-1]}", flush=True)
        return lines[-1], prefix

    def test_a_store_without_conditional_writes_is_refused_at_start(self):
        with S3Server(conditional=False) as s3:
            line, prefix = self.refused(s3, s3.bucket, credentials())
            self.assertIn("If-None-Match", line)
            self.assertIn("conditional", line)
            # The probe's own objects go again.
            self.assertEqual(Bucket(s3.endpoint, s3.bucket).keys(prefix + "/"), [])

    def test_a_wrong_secret_is_refused_at_start_and_nothing_ships(self):
        line, prefix = self.refused(self.s3, self.s3.bucket, credentials(secret="not-the-secret"))
        self.assertIn("SignatureDoesNotMatch", line)
        self.assertEqual(Bucket(self.s3.endpoint, self.s3.bucket).keys(prefix + "/"), [])

    def test_a_missing_bucket_is_refused_at_start(self):
        line, _ = self.refused(self.s3, "no-such-bucket", credentials())
        self.assertIn("NoSuchBucket", line)


def load_tests(loader, standard_tests, pattern):
    suite = unittest.TestSuite()
    own = [n for n in vars(S3Replication) if n.startswith("test_")]
    for name in (*SHARED, *own):
        suite.addTest(S3Replication(name))
    suite.addTests(loader.loadTestsFromTestCase(S3StartRefusals))
    return suite


if __name__ == "__main__":
    unittest.main()
