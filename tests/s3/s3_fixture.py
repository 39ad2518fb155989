"""A real S3-compatible server for the tests (s3rver through s3_server.js,
with AWS's `If-None-Match: *` create-only writes), and a fault proxy in
front of it.

    with S3Server() as s3:                       # conditional=True by default
        s3.endpoint                              # "http://127.0.0.1:PORT"
        s3.bucket                                # "fleetfs-test"
        env = {**os.environ, **s3.env()}
        with FaultProxy(s3.endpoint) as proxy:   # fault_proxy.FaultProxy
            env = {**os.environ, **s3.env(endpoint=proxy.endpoint)}

As a command, for test binaries run by ctest against a live server:

    python3 s3_fixture.py run [--no-conditional] [--proxy] -- CMD ARGS...

starts the server (and the proxy), runs CMD with the variables of env() (see
ENV below), returns CMD's exit code, and always stops what it started.

The server needs node >= 20 and the npm package @20minutes/s3rver, which
packaging/install-deps.sh installs into ${FLEETFS_CACHE:-/var/cache/fleetfs}/s3rver.
Test code only.
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fault_proxy import FaultProxy  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SERVER_JS = os.path.join(HERE, "s3_server.js")
ACCESS_KEY = "S3RVER"
SECRET_KEY = "S3RVER"
REGION = "us-east-1"
DEFAULT_BUCKET = "fleetfs-test"
START_TIMEOUT = 60.0

# The variables env() sets: the AWS SDK's standard credential names, and
# where fleetfs's s3:// tests find the server.
ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION",
       "FLEETFS_S3_ENDPOINT", "FLEETFS_S3_BUCKET")


def modules_dir():
    return os.path.join(os.environ.get("FLEETFS_CACHE", "/var/cache/fleetfs"), "s3rver")


class S3Server:
    """s3rver on 127.0.0.1 in a temporary data directory, `buckets` created
    (the first is .bucket). conditional=False leaves s3rver as it comes: it
    accepts `If-None-Match: *` writes over existing objects."""

    def __init__(self, conditional=True, buckets=(DEFAULT_BUCKET,), port=0, verbose=False):
        node = shutil.which("node")
        if node is None:
            raise RuntimeError("S3Server: `node` (>= 20) is not on PATH; run packaging/install-deps.sh")
        self.conditional = conditional
        self.buckets = list(buckets)
        self.bucket = self.buckets[0]
        self.dir = tempfile.mkdtemp(prefix="fleetfs-s3-")
        self.data_dir = os.path.join(self.dir, "data")
        self.log_path = os.path.join(self.dir, "s3rver.log")
        # s3rver's continuation tokens use DES, in OpenSSL 3's legacy provider.
        args = [node, "--openssl-legacy-provider", SERVER_JS, "--dir", self.data_dir, "--port", str(port),
                "--modules", modules_dir()]
        if not conditional:
            args.append("--no-conditional")
        if verbose:
            args.append("--verbose")
        args += self.buckets
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self._log,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            self.port = self._wait_listening()
        except BaseException:
            self.stop()
            raise
        self.endpoint = f"http://127.0.0.1:{self.port}"

    def _wait_listening(self):
        # The first stdout line says the server is ready; a timer bounds a
        # server that neither says it nor exits.
        timer = threading.Timer(START_TIMEOUT, self._kill)
        timer.start()
        try:
            line = self.proc.stdout.readline().decode(errors="replace").strip()
        finally:
            timer.cancel()
        if not line.startswith("listening "):
            self.proc.wait()
            raise RuntimeError(f"S3Server: s3_server.js did not start (exit {self.proc.returncode}); "
                               f"log {self.log_path}:\n{self.log_tail()}")
        return int(line.split()[1])

    def log_tail(self, lines=30):
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""

    def env(self, endpoint=None):
        """The variables a client of this server needs; `endpoint` replaces
        the server's (a proxy's, say)."""
        return {
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": REGION,
            "FLEETFS_S3_ENDPOINT": endpoint or self.endpoint,
            "FLEETFS_S3_BUCKET": self.bucket,
        }

    def _kill(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def stop(self):
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._kill()
                self.proc.wait()
        else:
            self._kill()  # anything it left in its group
        self.proc.stdout.close()
        self._log.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def run(argv):
    import argparse
    parser = argparse.ArgumentParser(prog="s3_fixture.py run",
                                     description="run CMD against a live test S3 server")
    parser.add_argument("--no-conditional", action="store_true",
                        help="s3rver without the If-None-Match: * enforcement")
    parser.add_argument("--proxy", action="store_true",
                        help="put a fault proxy in front; FLEETFS_S3_ENDPOINT is the proxy, "
                             "FLEETFS_S3_PROXY_CONTROL its control URL")
    parser.add_argument("--bucket", default=DEFAULT_BUCKET)
    parser.add_argument("cmd", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        parser.error("no command after --")
    with S3Server(conditional=not args.no_conditional, buckets=[args.bucket]) as s3:
        env = dict(os.environ)
        env["FLEETFS_S3_DIRECT_ENDPOINT"] = s3.endpoint
        if args.proxy:
            with FaultProxy(s3.endpoint) as proxy:
                env.update(s3.env(endpoint=proxy.endpoint))
                env["FLEETFS_S3_PROXY_CONTROL"] = proxy.control_url
                return _run_child(cmd, env)
        env.update(s3.env())
        return _run_child(cmd, env)


def _run_child(cmd, env):
    child = subprocess.Popen(cmd, env=env)
    previous = signal.signal(signal.SIGTERM, lambda *_: child.terminate())
    try:
        return child.wait()
    except KeyboardInterrupt:
        child.terminate()
        return child.wait()
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv):
    if len(argv) < 1 or argv[0] != "run":
        sys.stderr.write("usage: s3_fixture.py run [--no-conditional] [--proxy] [--bucket B] -- CMD ARGS...\n")
        return 2
    code = run(argv[1:])
    # A child killed by a signal: report it as a shell would.
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
