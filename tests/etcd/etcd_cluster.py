"""A real etcd cluster on loopback for the tests: N `etcd` members, each with
its own data directory under a temporary directory and ports picked free.

    with EtcdCluster(3) as cluster:
        cluster.url("fleet")          # etcd://127.0.0.1:A,127.0.0.1:B,127.0.0.1:C/fleet
        cluster.kill(cluster.leader())
        cluster.restart(i)

Members listen for clients on loopback, and with client_hosts=[address, ...]
on those addresses too, at the same port (the test side of network-namespace
hosts, tests/mount/netns.py): `cluster.url(prefix, endpoints=
cluster.endpoints_at(host.gateway))` is the URL an agent in that host uses.

Every member is started by the fixture and ended by close() (or leaving the
`with` block), even when a test fails. Each member logs to member-N.log in
the cluster's directory; failures print the tails.
"""
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

ETCD = shutil.which("etcd") or "/usr/bin/etcd"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(endpoint, path, body, timeout=2.0, tls=None):
    """POSTs JSON to a member's v3 gateway (over TLS with `tls`, an
    ssl.SSLContext); the answer's JSON, or None when it does not answer."""
    scheme = "https" if tls else "http"
    request = urllib.request.Request(f"{scheme}://{endpoint}{path}",
                                     data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=tls) as r:
            return json.loads(r.read())
    except (OSError, urllib.error.URLError, ValueError):
        return None


class Member:
    def __init__(self, root, index):
        self.index = index
        self.name = f"m{index}"
        self.data_dir = os.path.join(root, f"member-{index}")
        self.log_path = os.path.join(root, f"member-{index}.log")
        self.client_port = free_port()
        self.peer_port = free_port()
        self.proc = None

    @property
    def endpoint(self):
        return f"127.0.0.1:{self.client_port}"

    @property
    def peer_url(self):
        return f"http://127.0.0.1:{self.peer_port}"

    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines=20):
        try:
            with open(self.log_path, errors="replace") as f:
                tail = f.read().splitlines()[-lines:]
        except OSError:
            tail = []
        return f"--- etcd {self.name} ({self.endpoint}) ---\n" + "\n".join(tail)


def make_certificates(root):
    """A CA, a server certificate for 127.0.0.1 and a client certificate, with
    the openssl command: {"ca", "server_cert", "server_key", "client_cert",
    "client_key"} paths."""
    files = {k: os.path.join(root, f"{k}.pem") for k in
             ("ca", "ca_key", "server_cert", "server_key", "client_cert", "client_key")}

    def openssl(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True)
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
            "/CN=fleetfs-test-ca", "-keyout", files["ca_key"], "-out", files["ca"])
    ext = os.path.join(root, "san.ext")
    with open(ext, "w") as f:
        f.write("subjectAltName=IP:127.0.0.1\n")
    for who, cn in (("server", "127.0.0.1"), ("client", "fleetfs-client")):
        csr = os.path.join(root, f"{who}.csr")
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={cn}",
                "-keyout", files[f"{who}_key"], "-out", csr)
        openssl("x509", "-req", "-in", csr, "-CA", files["ca"], "-CAkey", files["ca_key"],
                "-CAcreateserial", "-days", "2", "-extfile", ext, "-out", files[f"{who}_cert"])
    return files


class EtcdCluster:
    """N members on loopback. Members are numbered 0..N-1 in the URL's order.

    With tls=True the members serve clients over TLS only, and ask for a
    client certificate signed by the cluster's CA (self.certs names the files)."""

    def __init__(self, size=3, token=None, tls=False, client_hosts=()):
        self.client_hosts = list(client_hosts)
        self.root = tempfile.mkdtemp(prefix="fleetfs-etcd-", dir="/tmp")
        self.members = [Member(self.root, i) for i in range(size)]
        self.token = token or os.path.basename(self.root)
        self.started = False
        self.certs = None
        self.tls = None  # the fixture's own client context
        if tls:
            self.certs = make_certificates(self.root)
            self.tls = ssl.create_default_context(cafile=self.certs["ca"])
            self.tls.load_cert_chain(self.certs["client_cert"], self.certs["client_key"])

    # -- lifecycle --

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()

    def start(self, timeout=30, attempts=3):
        # A port picked free can be taken by another process before the
        # member binds it (other tests on the machine pick ports too): such a
        # start is begun again on new ports, the members' data dirs fresh.
        for attempt in range(attempts):
            for m in self.members:
                self._launch(m, state="new")
            self.started = True
            try:
                self.wait_healthy(timeout)
                return self
            except AssertionError:
                if attempt + 1 == attempts or not self._port_taken():
                    raise
            for i, m in enumerate(self.members):
                if m.running():
                    m.proc.kill()
                m.proc.wait(10)
                shutil.rmtree(m.data_dir, ignore_errors=True)
                os.rename(m.log_path, f"{m.log_path}.{attempt}")
                self.members[i] = Member(self.root, i)
        return self

    def _port_taken(self):
        for m in self.members:
            try:
                with open(m.log_path, errors="replace") as f:
                    if "address already in use" in f.read():
                        return True
            except OSError:
                pass
        return False

    def _launch(self, m, state):
        initial = ",".join(f"{x.name}={x.peer_url}" for x in self.members)
        scheme = "https" if self.certs else "http"
        listen = [m.endpoint] + [f"{a}:{m.client_port}" for a in self.client_hosts]
        argv = [ETCD, "--name", m.name, "--data-dir", m.data_dir,
                "--listen-client-urls", ",".join(f"{scheme}://{e}" for e in listen),
                "--advertise-client-urls", f"{scheme}://{m.endpoint}",
                "--listen-peer-urls", m.peer_url,
                "--initial-advertise-peer-urls", m.peer_url,
                "--initial-cluster", initial,
                "--initial-cluster-state", state,
                "--initial-cluster-token", self.token]
        if self.certs:
            argv += ["--cert-file", self.certs["server_cert"], "--key-file",
                     self.certs["server_key"], "--client-cert-auth", "--trusted-ca-file",
                     self.certs["ca"]]
        log = open(m.log_path, "ab")
        m.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        log.close()

    def close(self):
        for m in self.members:
            if m.proc is not None and m.proc.poll() is None:
                m.proc.send_signal(signal.SIGCONT)  # a paused member cannot die otherwise
                m.proc.kill()
                m.proc.wait(10)
        shutil.rmtree(self.root, ignore_errors=True)

    # -- faults --

    def kill(self, i):
        """SIGKILL: the member is gone; its port refuses connections."""
        m = self.members[i]
        m.proc.kill()
        m.proc.wait(10)

    def pause(self, i):
        """SIGSTOP: the member accepts connections and never answers (a partition)."""
        self.members[i].proc.send_signal(signal.SIGSTOP)

    def resume(self, i):
        self.members[i].proc.send_signal(signal.SIGCONT)

    def restart(self, i, timeout=30):
        """Starts a killed member again on its data directory and waits until it
        is healthy."""
        m = self.members[i]
        if m.running():
            raise AssertionError(f"etcd {m.name} is still running")
        self._launch(m, state="existing")
        self.wait_member_healthy(i, timeout)

    # -- looking --

    @property
    def endpoints(self):
        return [m.endpoint for m in self.members]

    def endpoints_at(self, address):
        """Every member's client endpoint at `address`, one of client_hosts."""
        if address not in self.client_hosts:
            raise ValueError(f"{address} is not one of the cluster's client_hosts "
                             f"{self.client_hosts}")
        return [f"{address}:{m.client_port}" for m in self.members]

    def url(self, prefix, scheme=None, endpoints=None):
        scheme = scheme or ("etcds" if self.certs else "etcd")
        return f"{scheme}://{','.join(endpoints or self.endpoints)}/{prefix}"

    def status(self, i, timeout=2.0):
        """/v3/maintenance/status of member i, or None."""
        return post(self.members[i].endpoint, "/v3/maintenance/status", {}, timeout, self.tls)

    def leader(self, timeout=15):
        """The index of the member that leads now (as the live members agree)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ids = {}
            leaders = set()
            for i, m in enumerate(self.members):
                if not m.running():
                    continue
                s = self.status(i)
                if not s or "leader" not in s:
                    continue
                ids[s["header"]["member_id"]] = i
                leaders.add(s["leader"])
            if len(leaders) == 1:
                leader = leaders.pop()
                if leader in ids:
                    return ids[leader]
            time.sleep(0.05)
        raise AssertionError("no leader that the live members agree on\n" + self.log_tails())

    def wait_member_healthy(self, i, timeout=30):
        m = self.members[i]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not m.running():
                raise AssertionError(f"etcd {m.name} exited ({m.proc.returncode})\n" + m.log_tail())
            # A linearizable read answers only with a leader and a quorum.
            if post(m.endpoint, "/v3/kv/range", {"key": "aGVhbHRo"}, timeout=1.0,
                    tls=self.tls) is not None:
                return
            time.sleep(0.05)
        raise AssertionError(f"etcd {m.name} not healthy after {timeout}s\n" + m.log_tail())

    def wait_healthy(self, timeout=30):
        for i in range(len(self.members)):
            self.wait_member_healthy(i, timeout)
        self.leader(timeout)

    def log_tails(self):
        return "\n".join(m.log_tail() for m in self.members)
