"""The agent under a service manager: the built binary with a fake
NOTIFY_SOCKET (an AF_UNIX datagram socket this test reads, as systemd's) and
WATCHDOG_USEC set, and stderr named by JOURNAL_STREAM as systemd names the
journal's stream.

Checks READY=1 comes once the mount is up (it is a FUSE mount at that moment,
and the log has said "serving range" and "mounted"), STATUS= with the serving
summary, WATCHDOG=1 pings, STOPPING=1 at SIGTERM, and journald-style log lines.
"""
import os
import signal
import socket
import sqlite3
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "mount"))
import harness  # noqa: E402

WAIT = 60  # seconds for any one message; generous, never a measurement


def fuse_mounts():
    """{mount point: fstype} of FUSE mounts, from /proc/self/mountinfo."""
    found = {}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            sep = fields.index("-")
            if fields[sep + 1].startswith("fuse"):
                found[fields[4].replace("\\040", " ")] = fields[sep + 1]
    return found


class SystemdNotifyTest(harness.MountTest):
    TIME_LIMIT = 240

    def setUp(self):
        super().setUp()
        self.sock_path = os.path.join(self.root, "notify.sock")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.addCleanup(self.sock.close)
        self.sock.bind(self.sock_path)
        self.sock.settimeout(WAIT)
        self.seen = []

    def next_message(self, agent):
        try:
            data = self.sock.recv(65536).decode()
        except socket.timeout:
            self.fail_with_logs(f"no notify message in {WAIT}s; so far {self.seen}")
        for line in data.splitlines():
            self.seen.append(line)
        return data

    def mounts_at_ready(self, agent):
        """The FUSE mounts as /proc/self/mountinfo has them the moment the
        datagram carrying READY=1 is received."""
        while True:
            try:
                data = self.sock.recv(65536)
            except socket.timeout:
                self.fail_with_logs(f"no READY=1 in {WAIT}s; so far {self.seen}")
            # Read before anything else, decoding included: a READY=1 sent
            # before the mount passes only if the mount completes between the
            # agent's send and this recv returning. That window is the
            # tightest a test outside the agent can get: it cannot observe
            # the instant of the send, only the datagram's arrival; the order
            # inside the agent (READY from the mount's completion) closes it.
            mounts = fuse_mounts()
            lines = data.decode().splitlines()
            self.seen.extend(lines)
            if "READY=1" in lines:
                return mounts
            if not agent.running():
                self.fail_with_logs(f"agent exited before READY=1; messages {self.seen}")

    def wait_message(self, agent, predicate, what):
        while True:
            data = self.next_message(agent)
            for line in data.splitlines():
                if predicate(line):
                    return line
            if not agent.running():
                self.fail_with_logs(f"agent exited before {what}; messages {self.seen}")

    def test_ready_status_watchdog_and_stopping_reach_the_service_manager(self):
        a = self.agent(ttl="3s", extra=["--replica", f"file://{self.root}/replica"])
        # The log file is the agent's stderr; JOURNAL_STREAM names it as
        # systemd names the journal's stream.
        open(a.log_path, "ab").close()
        st = os.stat(a.log_path)
        a.env.update({"NOTIFY_SOCKET": self.sock_path, "WATCHDOG_USEC": "1000000",
                      "JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"})
        a.start()

        mounts = self.mounts_at_ready(a)
        self.assertEqual(mounts.get(a.mount), "fuse.fleetfs",
                         f"READY=1 came before {a.mount} was a fleetfs mount: {mounts}")
        log = a.log()
        self.assertIn("serving range 0-16383", log)
        self.assertIn(f"mounted {a.mount}", log)

        status = self.wait_message(a, lambda m: m.startswith("STATUS="), "STATUS=")
        self.assertRegex(status, r"^STATUS=serving 1 of 1 range, 0 open files, lag \d+\.\ds$")
        self.wait_message(a, lambda m: m == "WATCHDOG=1", "WATCHDOG=1")
        self.wait_message(a, lambda m: m == "WATCHDOG=1", "a second WATCHDOG=1")

        # An open file shows in the STATUS line.
        tenant = harness.tenants_in(0, 16383, 1)[0]
        path = os.path.join(a.mount, harness.slots(tenant)[tenant]["tenant_path"])
        db = sqlite3.connect(path)
        try:
            db.execute("CREATE TABLE t(x)")
            db.commit()
            self.wait_message(
                a, lambda m: m.startswith("STATUS=serving 1 of 1 range, 1 open file, lag "),
                "STATUS with the open file")
        finally:
            db.close()

        a.proc.send_signal(signal.SIGTERM)
        self.wait_message(a, lambda m: m == "STOPPING=1", "STOPPING=1")
        self.assertEqual(a.proc.wait(WAIT), 0, a.log_tail())
        self.assertEqual(self.seen.count("READY=1"), 1, self.seen)

        # journald's way: each line starts with its priority, no time stamp.
        lines = [line for line in a.log().splitlines() if line]
        self.assertTrue(lines)
        for line in lines:
            self.assertRegex(line, r"^<[2-7]>", "a log line without a priority prefix")
            self.assertNotRegex(line, r"^<\d>\d{4}-\d\d-\d\dT", "a time stamp under journald")
        self.assertTrue(any(line.startswith(f"<6>mounted {a.mount} ") for line in lines),
                        "no info line for the mount")

    def open_db(self, a):
        tenant = harness.tenants_in(0, 16383, 1)[0]
        db = sqlite3.connect(os.path.join(a.mount, harness.slots(tenant)[tenant]["tenant_path"]))
        self.addCleanup(db.close)
        db.execute("CREATE TABLE IF NOT EXISTS t(x)")
        db.commit()
        return db

    def test_a_stop_extends_systemds_timeout_to_its_own_bound(self):
        # TimeoutStopSec is fixed; at ttl 120s the stop may take
        # grace + ttl + ttl/3 + ttl/3 = 285s: systemd must be told.
        a = self.agent(ttl="120s", extra=["--shutdown-grace", "5s"])
        a.env.update({"NOTIFY_SOCKET": self.sock_path})
        a.start()
        self.wait_message(a, lambda m: m == "READY=1", "READY=1")
        db = self.open_db(a)
        a.proc.send_signal(signal.SIGTERM)
        self.wait_message(a, lambda m: m == "STOPPING=1", "STOPPING=1")
        extend = self.wait_message(a, lambda m: m.startswith("EXTEND_TIMEOUT_USEC="),
                                   "EXTEND_TIMEOUT_USEC= at the stop")
        bound_s = 5 + 120 + 40 + 40
        self.assertGreaterEqual(int(extend.split("=", 1)[1]), bound_s * 1_000_000, self.seen)
        db.close()
        self.assertEqual(a.proc.wait(WAIT * 4), 0, a.log_tail())

    def test_an_unread_notify_socket_does_not_stop_the_agent_from_stopping(self):
        a = self.agent(ttl="3s", extra=["--shutdown-grace", "3s"])
        a.env.update({"NOTIFY_SOCKET": self.sock_path, "WATCHDOG_USEC": "200000"})
        a.start()
        a.wait_states("serving", timeout=WAIT)
        db = self.open_db(a)
        # Nobody reads the socket from here: fill its queue as a wedged
        # manager's would be, so the agent's next message finds it full.
        filler = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.addCleanup(filler.close)
        try:
            while True:
                filler.sendto(b"X=1", socket.MSG_DONTWAIT, self.sock_path)
        except BlockingIOError:
            pass
        a.proc.send_signal(signal.SIGTERM)
        try:
            code = a.proc.wait(WAIT)
        except Exception:
            a.proc.kill()
            self.fail_with_logs("the agent did not exit at SIGTERM with NOTIFY_SOCKET unread")
        db.close()
        self.assertEqual(code, 0, a.log_tail())

    def test_no_ready_while_the_store_has_not_answered(self):
        # An etcd endpoint that accepts and never answers: every claim times
        # out, the agent reaches phase serving with nothing served.
        hole = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.addCleanup(hole.close)
        hole.bind(("127.0.0.1", 0))
        hole.listen(64)
        a = self.agent(ttl="3s")
        a.store = f"etcd://127.0.0.1:{hole.getsockname()[1]}/fleetfs"
        a.env.update({"NOTIFY_SOCKET": self.sock_path})
        a.start()
        self.wait_message(a, lambda m: m.startswith("STATUS=serving 0 of 1 range"),
                          "phase serving with nothing served")
        while "range 0-16383:" not in a.log():  # the failed round is logged
            self.wait_message(a, lambda m: True, "the failed round")
        self.assertNotIn("READY=1", self.seen, "READY=1 while the store had not answered")
        self.assertEqual(a.stop(timeout=WAIT), 0, a.log_tail())

    def test_a_start_failure_reaches_the_journal_as_an_error(self):
        # The admin port taken before the agent starts: it fails before its
        # loop runs, and `journalctl -p err` must still show why.
        taken = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.addCleanup(taken.close)
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        a = self.agent(ttl="3s")
        a.admin_port = port
        open(a.log_path, "ab").close()
        st = os.stat(a.log_path)
        a.env.update({"NOTIFY_SOCKET": self.sock_path,
                      "JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"})
        a.start()
        self.assertNotEqual(a.proc.wait(WAIT), 0, a.log_tail())
        lines = [line for line in a.log().splitlines() if line]
        self.assertTrue(any(line.startswith("<3>") and str(port) in line for line in lines),
                        f"no <3> line naming port {port}: {lines}")
        for line in lines:
            self.assertRegex(line, r"^<[0-7]>", "a line without a priority prefix")

    def test_without_notify_socket_the_agent_logs_time_stamps_and_runs_as_before(self):
        a = self.agent(ttl="3s")
        a.env.update({"WATCHDOG_USEC": "1000000"})
        a.env.pop("NOTIFY_SOCKET", None)
        os.environ.pop("NOTIFY_SOCKET", None)
        os.environ.pop("JOURNAL_STREAM", None)
        a.start()
        a.wait_states("serving", timeout=WAIT)
        self.assertEqual(a.stop(timeout=WAIT), 0, a.log_tail())
        first = a.log().splitlines()[0]
        self.assertRegex(first, r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3} info ")
        self.assertNotIn("watchdog", a.log())


if __name__ == "__main__":
    import unittest
    unittest.main()
