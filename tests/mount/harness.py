"""Real-mount test harness: agents started as the user runs them, real clients.

Each test gets its own directory under /tmp, a time limit (SIGALRM), and a
teardown that ends its agents and detaches their mounts even when the test
fails. Agents run the built binary named by FLEETFS_BINARY.
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.request

BINARY = os.environ.get("FLEETFS_BINARY", "")

# The transport every agent is started with (--transport), and what its
# status must then name; unset: no flag, the agent's own default (auto).
TRANSPORT = os.environ.get("FLEETFS_TRANSPORT") or None
TRANSPORT_NAMES = {"io_uring": "io_uring", "dev_fuse": "/dev/fuse"}
ENABLE_URING = "/sys/module/fuse/parameters/enable_uring"


def enable_fuse_uring():
    """Turns the fuse module's enable_uring on, for FLEETFS_TRANSPORT=io_uring.

    The kernel refuses FUSE over io_uring while the parameter is off (its
    default), and an agent asked for io_uring then refuses to start: the
    io_uring runs would test nothing. The mount tests run as root (they mount
    and unmount), so they can set it; it is a host-wide switch, which only
    allows io_uring and leaves /dev/fuse mounts as they are.
    """
    try:
        with open(ENABLE_URING) as f:
            if f.read().strip() == "Y":
                return
        with open(ENABLE_URING, "w") as f:
            f.write("Y")
    except OSError as e:
        raise AssertionError(
            f"FLEETFS_TRANSPORT=io_uring, but {ENABLE_URING} cannot be set to Y ({e}): the "
            "kernel needs FUSE over io_uring (CONFIG_FUSE_IO_URING) and the tests need root")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def slots(*keys):
    """fleetfs slot --json for the keys: {key: {slot, bucket, tenant_path, slot_path}}."""
    out = subprocess.run([BINARY, "slot", "--json", "--", *keys], check=True,
                         capture_output=True, text=True).stdout
    return {row["key"]: row for row in json.loads(out)}


def tenants_in(first, last, count, prefix="t"):
    """`count` tenant ids whose slots lie in first..last."""
    found, i = [], 0
    while len(found) < count:
        batch = [f"{prefix}{n}" for n in range(i, i + 400)]
        i += 400
        for key, row in slots(*batch).items():
            if first <= row["slot"] <= last and len(found) < count:
                found.append(key)
    return found


def wait_for(predicate, timeout, what, poll=0.01, on_fail=None):
    """Polls until predicate() is true; returns the monotonic time it was."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if predicate():
                return time.monotonic()
        except OSError:
            pass
        if time.monotonic() > deadline:
            extra = on_fail() if on_fail else ""
            raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{extra}")
        time.sleep(poll)


class Agent:
    """One `fleetfs mount` process with its own backing directory and mount."""

    def __init__(self, root, name, store, owner, ranges="0-16383", ttl="3s", extra=(), env=None):
        self.name = name
        self.dir = os.path.join(root, name)
        self.backing = os.path.join(self.dir, "backing")
        self.mount = os.path.join(self.dir, "mnt")
        self.log_path = os.path.join(self.dir, "agent.log")
        os.makedirs(self.backing, exist_ok=True)
        os.makedirs(self.mount, exist_ok=True)
        self.store, self.owner, self.ranges, self.ttl = store, owner, ranges, ttl
        self.extra = list(extra)
        self.env = dict(env or {})  # added to this process's environment
        self.admin_port = free_port()
        self.proc = None

    def argv(self):
        ttl = ["--ttl", self.ttl] if self.ttl else []  # None: from the config file
        transport = ["--transport", TRANSPORT] if TRANSPORT else []
        return [BINARY, "mount", "--backing", self.backing, "--mount", self.mount,
                "--store", self.store, "--owner", self.owner, "--ranges", self.ranges,
                *ttl, "--admin", f"127.0.0.1:{self.admin_port}", *transport, *self.extra]

    def start(self):
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.argv(), stdout=log, stderr=subprocess.STDOUT,
                                     env={**os.environ, **self.env})
        log.close()
        return self

    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def log(self):
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def log_tail(self):
        return f"--- {self.name} log ---\n" + "\n".join(self.log().splitlines()[-40:])

    def status(self):
        with open(os.path.join(self.mount, ".fleetfs", "status.json")) as f:
            return self.check_transport(json.load(f))

    def check_transport(self, doc):
        """doc, once its transport is the one FLEETFS_TRANSPORT asked for.

        A run asked for io_uring that went on over /dev/fuse would pass while
        testing the other transport. A document that names no transport yet
        (the mount is being made) passes.
        """
        if not TRANSPORT or not isinstance(doc, dict):
            return doc
        want, got = TRANSPORT_NAMES[TRANSPORT], doc.get("transport")
        if got is not None and got != want:
            why = f" ({doc['transport_why']})" if doc.get("transport_why") else ""
            # The teardown prints the agents' logs.
            raise AssertionError(f"agent {self.name}: asked for {TRANSPORT}, status says "
                                 f"{got}{why}")
        return doc

    def states(self):
        return [r["state"] for r in self.status()["ranges"]]

    def wait_states(self, state, timeout=15, poll=0.01):
        def ok():
            if not self.running():
                raise AssertionError(f"agent {self.name} exited ({self.proc.returncode})\n"
                                     + self.log_tail())
            doc = self.status()
            states = [r["state"] for r in doc["ranges"]]
            if not (states and all(s == state for s in states)):
                return False
            # The transport is named from the moment the mount is up: a
            # status read while it is being made may not have it yet.
            return not TRANSPORT or doc.get("transport") is not None
        return wait_for(ok, timeout, f"{self.name}: every range {state}", poll=poll,
                        on_fail=self.log_tail)

    def http(self, path, method="GET"):
        url = f"http://127.0.0.1:{self.admin_port}{path}"
        try:
            with urllib.request.urlopen(urllib.request.Request(url, method=method),
                                        timeout=5) as r:
                body = r.read().decode()
                if path == "/status":
                    self.check_transport(json.loads(body))
                return r.status, body
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def stop(self, sig=signal.SIGTERM, timeout=20):
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"agent {self.name} did not stop\n" + self.log_tail())

    def kill9(self):
        self.proc.kill()
        self.proc.wait(10)

    def cleanup(self):
        if os.environ.get("FLEETFS_KEEP_LOGS"):  # for debugging a failed run
            shutil.copy(self.log_path, os.path.join(os.environ["FLEETFS_KEEP_LOGS"],
                                                    f"{self.name}-{os.getpid()}-{id(self):x}.log"))
        if self.running():
            self.proc.kill()
            self.proc.wait(10)
        subprocess.run(["umount", "-l", self.mount], capture_output=True)


class MountTest(unittest.TestCase):
    TIME_LIMIT = 180

    def setUp(self):
        if not BINARY or not os.access(BINARY, os.X_OK):
            self.fail("FLEETFS_BINARY must name the built fleetfs binary")
        if TRANSPORT not in (None, *TRANSPORT_NAMES):
            self.fail(f"FLEETFS_TRANSPORT={TRANSPORT}: must be io_uring or dev_fuse (or unset)")
        if TRANSPORT == "io_uring":
            enable_fuse_uring()
        self.root = tempfile.mkdtemp(prefix="fleetfs-it-", dir="/tmp")
        os.chmod(self.root, 0o755)
        self.agents = []
        self.addCleanup(self._teardown)

        def on_alarm(signum, frame):
            raise TimeoutError(f"{self.id()} ran past its {self.TIME_LIMIT}s limit")
        signal.signal(signal.SIGALRM, on_alarm)
        signal.alarm(self.TIME_LIMIT)

    def _teardown(self):
        signal.alarm(0)
        # A failed test prints what its agents logged: a CI run keeps no
        # files, and a flaky failure is diagnosed from this or not at all.
        result = getattr(getattr(self, "_outcome", None), "result", None)
        if result and any(t is self for t, _ in result.failures + result.errors):
            for agent in self.agents:
                sys.stderr.write("\n" + agent.log_tail() + "\n")
        for agent in self.agents:
            agent.cleanup()
        if result and any(t is self for t, _ in result.failures + result.errors) and \
                os.environ.get("FLEETFS_KEEP_FAILED_ROOT"):  # for debugging a failed run
            sys.stderr.write(f"kept {self.root}\n")
            return
        shutil.rmtree(self.root, ignore_errors=True)

    @property
    def store(self):
        return f"sqlite://{self.root}/control.db"

    def agent(self, name="a", owner=None, **kwargs):
        a = Agent(self.root, name, self.store, owner or f"host-{name}", **kwargs)
        self.agents.append(a)
        return a

    def fail_with_logs(self, message):
        self.fail(message + "\n" + "\n".join(a.log_tail() for a in self.agents))
