"""The S3 test fixture itself: the server keeps AWS's `If-None-Match: *`
contract (and s3rver alone does not, which the agent's start-up check must
detect), the errors a client sees have S3's shapes, and each fault proxy
mode does what it says. Requests go through the `curl` CLI with its own
SigV4 signing, a client independent of fleetfs.

    cd tests/s3 && python3 -m unittest -v test_fixture
"""
import os
import re
import subprocess
import tempfile
import threading
import unittest
import urllib.error
import urllib.parse
import urllib.request
import json

from s3_fixture import S3Server, FaultProxy

CURL_TIMEOUT_EXIT = 28
CURL_RECV_ERROR_EXIT = 56
CURL_EMPTY_REPLY_EXIT = 52


class Answer:
    def __init__(self, exit_code, status, headers, body):
        self.exit_code = exit_code
        self.status = status
        self.headers = headers
        self.body = body

    def code(self):
        m = re.search(rb"<Code>([^<]*)</Code>", self.body)
        return m.group(1).decode() if m else None

    def __repr__(self):
        return f"Answer(exit={self.exit_code}, status={self.status}, body={self.body[:300]!r})"


def curl(endpoint, method, path, body=None, headers=(), secret="S3RVER", max_time=60, extra=()):
    """One signed request; the body (bytes) is sent from a file, so with a
    Content-Length, as fleetfs's client sends them."""
    with tempfile.TemporaryDirectory(prefix="fleetfs-curl-") as tmp:
        head_path = os.path.join(tmp, "head")
        out_path = os.path.join(tmp, "out")
        args = ["curl", "-sS", "--max-time", str(max_time),
                "--aws-sigv4", "aws:amz:us-east-1:s3", "--user", f"S3RVER:{secret}",
                "-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD",
                "-D", head_path, "-o", out_path, "-w", "%{http_code}"]
        if method == "HEAD":
            args.append("-I")
        else:
            args += ["-X", method]
        if body is not None:
            body_path = os.path.join(tmp, "body")
            with open(body_path, "wb") as f:
                f.write(body)
            args += ["--data-binary", f"@{body_path}", "-H", "Content-Type: application/octet-stream"]
        for h in headers:
            args += ["-H", h]
        args += list(extra)
        args.append(endpoint + path)
        p = subprocess.run(args, capture_output=True)
        status = int(p.stdout.decode() or "0")
        raw_headers = _read(head_path)
        out = _read(out_path)
        parsed = {}
        for line in raw_headers.decode("latin-1").split("\r\n"):
            if ":" in line:
                k, _, v = line.partition(":")
                parsed[k.strip().lower()] = v.strip()
        return Answer(p.returncode, status, parsed, out)


def _read(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return b""


def create(endpoint, bucket, key, body):
    return curl(endpoint, "PUT", f"/{bucket}/{key}", body, headers=["If-None-Match: *"])


def multipart(endpoint, bucket, key, parts, complete_headers=()):
    """Initiates, uploads `parts` (bytes each), completes; the completion's
    answer."""
    init = curl(endpoint, "POST", f"/{bucket}/{key}?uploads=")
    assert init.status == 200, init
    upload_id = re.search(rb"<UploadId>([^<]+)</UploadId>", init.body).group(1).decode()
    etags = []
    for n, part in enumerate(parts, 1):
        a = curl(endpoint, "PUT", f"/{bucket}/{key}?partNumber={n}&uploadId={upload_id}", part)
        assert a.status == 200, a
        etags.append(a.headers["etag"])
    xml = "<CompleteMultipartUpload>" + "".join(
        f"<Part><PartNumber>{n}</PartNumber><ETag>{e}</ETag></Part>" for n, e in enumerate(etags, 1)
    ) + "</CompleteMultipartUpload>"
    return curl(endpoint, "POST", f"/{bucket}/{key}?uploadId={upload_id}", xml.encode(),
                headers=list(complete_headers))


class ConditionalServerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.s3 = S3Server()

    @classmethod
    def tearDownClass(cls):
        cls.s3.stop()

    def get(self, key):
        return curl(self.s3.endpoint, "GET", f"/{self.s3.bucket}/{key}")

    def test_conditional_create_twice_is_200_then_412_and_keeps_the_first(self):
        first = create(self.s3.endpoint, self.s3.bucket, "twice", b"first")
        self.assertEqual(first.status, 200, first)
        second = create(self.s3.endpoint, self.s3.bucket, "twice", b"second")
        self.assertEqual(second.status, 412, second)
        self.assertEqual(second.code(), "PreconditionFailed")
        self.assertIn(b"<Condition>If-None-Match</Condition>", second.body)
        self.assertEqual(self.get("twice").body, b"first")

    def test_racing_conditional_creates_have_exactly_one_winner(self):
        for round_ in range(20):
            key = f"race/{round_}"
            answers = [None, None]
            start = threading.Barrier(2)

            def put(i):
                start.wait()
                answers[i] = create(self.s3.endpoint, self.s3.bucket, key, f"writer-{i}".encode())

            threads = [threading.Thread(target=put, args=(i,)) for i in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            statuses = sorted(a.status for a in answers)
            self.assertEqual(statuses, [200, 412], f"round {round_}: {answers}")
            winner = [i for i in range(2) if answers[i].status == 200][0]
            self.assertEqual(self.get(key).body, f"writer-{winner}".encode())

    def test_a_put_whose_body_breaks_off_stores_nothing_and_leaves_the_name_free(self):
        # As on AWS; s3rver alone stored the bytes that had arrived, and a
        # writer killed mid-upload left a short object holding the name.
        with tempfile.TemporaryDirectory(prefix="fleetfs-curl-") as tmp:
            body = os.path.join(tmp, "body")
            with open(body, "wb") as f:
                f.write(os.urandom(1 << 20))
            writer = subprocess.Popen(
                ["curl", "-sS", "--aws-sigv4", "aws:amz:us-east-1:s3", "--user", "S3RVER:S3RVER",
                 "-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD", "-H", "If-None-Match: *",
                 "--limit-rate", "100k", "-X", "PUT", "--data-binary", f"@{body}",
                 "-o", os.devnull, f"{self.s3.endpoint}/{self.s3.bucket}/broken"],
                stderr=subprocess.DEVNULL)
            # Part of the body has gone (about 100 KiB a second) when it dies.
            try:
                writer.wait(timeout=1.5)
            except subprocess.TimeoutExpired:
                writer.kill()
                writer.wait()
        for _ in range(100):  # the server sees the connection end a moment later
            if self.get("broken").status == 404:
                break
        self.assertEqual(self.get("broken").status, 404)
        self.assertEqual(create(self.s3.endpoint, self.s3.bucket, "broken", b"whole").status, 200)
        self.assertEqual(self.get("broken").body, b"whole")

    def test_unconditional_put_still_overwrites(self):
        self.assertEqual(curl(self.s3.endpoint, "PUT", f"/{self.s3.bucket}/plain", b"1").status, 200)
        self.assertEqual(curl(self.s3.endpoint, "PUT", f"/{self.s3.bucket}/plain", b"2").status, 200)
        self.assertEqual(self.get("plain").body, b"2")

    def test_wrong_secret_is_403_even_with_if_none_match(self):
        create(self.s3.endpoint, self.s3.bucket, "secret", b"x")
        a = curl(self.s3.endpoint, "PUT", f"/{self.s3.bucket}/secret", b"y",
                 headers=["If-None-Match: *"], secret="wrong")
        self.assertEqual(a.status, 403, a)
        self.assertEqual(a.code(), "SignatureDoesNotMatch")

    def test_missing_bucket_is_404_no_such_bucket(self):
        a = create(self.s3.endpoint, "no-such-bucket", "k", b"x")
        self.assertEqual(a.status, 404, a)
        self.assertEqual(a.code(), "NoSuchBucket")
        a = curl(self.s3.endpoint, "GET", "/no-such-bucket?list-type=2")
        self.assertEqual(a.status, 404, a)
        self.assertEqual(a.code(), "NoSuchBucket")

    def test_multipart_completion_with_if_none_match_on_existing_key_is_412(self):
        part1 = os.urandom(5 * 1024 * 1024)
        first = multipart(self.s3.endpoint, self.s3.bucket, "mp", [part1, b"tail"],
                          complete_headers=["If-None-Match: *"])
        self.assertEqual(first.status, 200, first)
        self.assertEqual(self.get("mp").body, part1 + b"tail")
        second = multipart(self.s3.endpoint, self.s3.bucket, "mp", [b"other"],
                           complete_headers=["If-None-Match: *"])
        self.assertEqual(second.status, 412, second)
        self.assertEqual(second.code(), "PreconditionFailed")
        self.assertEqual(self.get("mp").body, part1 + b"tail")

    def test_list_objects_v2_start_after(self):
        for key in ("list/a", "list/b", "list/c", "list/d/e"):
            self.assertEqual(curl(self.s3.endpoint, "PUT", f"/{self.s3.bucket}/{key}", b"x").status, 200)
        a = curl(self.s3.endpoint, "GET", f"/{self.s3.bucket}?list-type=2&prefix=list%2F&start-after=list%2Fb")
        self.assertEqual(a.status, 200, a)
        keys = re.findall(rb"<Key>([^<]+)</Key>", a.body)
        self.assertEqual(sorted(keys), [b"list/c", b"list/d/e"])

    def test_list_objects_v2_pages_in_key_order(self):
        # s3rver alone lists "a/b" before "a" (its on-disk order) and then
        # loses keys when paging; and its continuation tokens need DES.
        keys = ["order/A", "order/a", "order/a-c", "order/a.b", "order/a/b", "order/a0", "order/b"]
        for key in reversed(keys):
            self.assertEqual(curl(self.s3.endpoint, "PUT", f"/{self.s3.bucket}/{key}", b"x").status, 200)
        listed, token, pages = [], None, 0
        while True:
            # curl 7.88 signs the query as written: keep parameters sorted.
            query = "list-type=2&max-keys=2&prefix=order%2F"
            if token:
                query = f"continuation-token={urllib.parse.quote(token, safe='')}&" + query
            a = curl(self.s3.endpoint, "GET", f"/{self.s3.bucket}?{query}")
            self.assertEqual(a.status, 200, a)
            pages += 1
            listed += [k.decode() for k in re.findall(rb"<Key>([^<]+)</Key>", a.body)]
            m = re.search(rb"<NextContinuationToken>([^<]+)</NextContinuationToken>", a.body)
            if not m:
                break
            token = m.group(1).decode()
        self.assertEqual(listed, sorted(keys, key=lambda k: k.encode()))
        self.assertEqual(pages, 4)

    def test_range_get_as_aws_answers(self):
        self.assertEqual(curl(self.s3.endpoint, "PUT", f"/{self.s3.bucket}/range", b"0123456789").status, 200)
        cases = {
            "bytes=0-0": (206, b"0", "bytes 0-0/10"),
            "bytes=2-5": (206, b"2345", "bytes 2-5/10"),
            "bytes=7-": (206, b"789", "bytes 7-9/10"),
            "bytes=-3": (206, b"789", "bytes 7-9/10"),
            "bytes=-30": (206, b"0123456789", "bytes 0-9/10"),
            "bytes=8-20": (206, b"89", "bytes 8-9/10"),
        }
        for range_, (status, body, content_range) in cases.items():
            a = curl(self.s3.endpoint, "GET", f"/{self.s3.bucket}/range", headers=[f"Range: {range_}"])
            self.assertEqual((a.status, a.body, a.headers.get("content-range")),
                             (status, body, content_range), range_)
        a = curl(self.s3.endpoint, "GET", f"/{self.s3.bucket}/range", headers=["Range: bytes=10-"])
        self.assertEqual((a.status, a.code()), (416, "InvalidRange"))
        self.assertEqual(curl(self.s3.endpoint, "PUT", f"/{self.s3.bucket}/range-empty", b"").status, 200)
        a = curl(self.s3.endpoint, "GET", f"/{self.s3.bucket}/range-empty", headers=["Range: bytes=0-"])
        self.assertEqual((a.status, a.code()), (416, "InvalidRange"))
        a = curl(self.s3.endpoint, "GET", f"/{self.s3.bucket}/range-empty")
        self.assertEqual((a.status, a.body), (200, b""))

    def test_missing_key_is_404_no_such_key(self):
        a = self.get("never-written")
        self.assertEqual(a.status, 404, a)
        self.assertEqual(a.code(), "NoSuchKey")


class PlainServerTest(unittest.TestCase):
    """s3rver without the middleware: what a server that ignores
    `If-None-Match: *` does, and what the agent's start-up check must catch."""

    def test_second_conditional_create_is_accepted(self):
        with S3Server(conditional=False) as s3:
            self.assertEqual(create(s3.endpoint, s3.bucket, "k", b"first").status, 200)
            second = create(s3.endpoint, s3.bucket, "k", b"second")
            self.assertEqual(second.status, 200, second)
            self.assertEqual(curl(s3.endpoint, "GET", f"/{s3.bucket}/k").body, b"second")


class FaultProxyTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.s3 = S3Server()

    @classmethod
    def tearDownClass(cls):
        cls.s3.stop()

    def setUp(self):
        self.proxy = FaultProxy(self.s3.endpoint)
        self.addCleanup(self.proxy.stop)

    def via(self, method, key, body=None, **kw):
        return curl(self.proxy.endpoint, method, f"/{self.s3.bucket}/{key}", body, **kw)

    def direct(self, key):
        return curl(self.s3.endpoint, "GET", f"/{self.s3.bucket}/{key}")

    def test_pass_forwards_large_bodies_and_counts_by_method(self):
        big = os.urandom(7 * 1024 * 1024)  # curl sends Expect: 100-continue
        self.assertEqual(self.via("PUT", "pass/big", big).status, 200)
        self.assertEqual(self.via("GET", "pass/big").body, big)
        self.assertEqual(self.via("HEAD", "pass/big").headers["content-length"], str(len(big)))
        self.assertEqual(self.proxy.counts(), {"PUT": 1, "GET": 1, "HEAD": 1})

    def test_pass_multipart_with_conditional_completion(self):
        part1 = os.urandom(6 * 1024 * 1024)
        done = multipart(self.proxy.endpoint, self.s3.bucket, "pass/mp", [part1, b"end"],
                         complete_headers=["If-None-Match: *"])
        self.assertEqual(done.status, 200, done)
        self.assertEqual(self.direct("pass/mp").body, part1 + b"end")
        again = multipart(self.proxy.endpoint, self.s3.bucket, "pass/mp", [b"x"],
                          complete_headers=["If-None-Match: *"])
        self.assertEqual(again.status, 412, again)

    def test_keep_alive_connection_is_reused_across_requests(self):
        big = os.urandom(3 * 1024 * 1024)
        curl(self.s3.endpoint, "PUT", f"/{self.s3.bucket}/ka/1", big)
        auth = ["--aws-sigv4", "aws:amz:us-east-1:s3", "--user", "S3RVER:S3RVER",
                "-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD"]
        url = f"{self.proxy.endpoint}/{self.s3.bucket}/ka/1"
        p = subprocess.run(["curl", "-sS", "--max-time", "60",
                            "-w", "%{http_code} %{num_connects}\n", *auth,
                            "-o", "/dev/null", url, "-o", "/dev/null", url, "-o", "/dev/null", url],
                           capture_output=True, text=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout.split("\n")[:3], ["200 1", "200 0", "200 0"])
        self.assertEqual(self.proxy.counts(), {"GET": 3})

    def test_latency_delays_then_forwards(self):
        self.proxy.set_mode("latency", ms=400)
        p = subprocess.run(["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code} %{time_total}",
                            "--aws-sigv4", "aws:amz:us-east-1:s3", "--user", "S3RVER:S3RVER",
                            "-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD",
                            f"{self.proxy.endpoint}/{self.s3.bucket}?list-type=2"],
                           capture_output=True, text=True)
        status, seconds = p.stdout.split()
        self.assertEqual(status, "200")
        # A lower bound only: the proxy waits at least this long.
        self.assertGreaterEqual(float(seconds), 0.4)
        self.assertEqual(self.proxy.faults(), 1)

    def test_error500_is_s3_internal_error_and_the_server_sees_nothing(self):
        self.proxy.set_mode("error500")
        a = self.via("PUT", "e500/k", b"x")
        self.assertEqual(a.status, 500, a)
        self.assertEqual(a.code(), "InternalError")
        self.assertEqual(self.direct("e500/k").status, 404)

    def test_slowdown_is_503_slow_down(self):
        self.proxy.set_mode("slowdown")
        a = self.via("PUT", "slow/k", os.urandom(2 * 1024 * 1024))
        self.assertEqual(a.status, 503, a)
        self.assertEqual(a.code(), "SlowDown")
        self.assertEqual(self.direct("slow/k").status, 404)

    def test_reset_closes_without_answer_and_the_server_sees_nothing(self):
        self.proxy.set_mode("reset")
        a = self.via("PUT", "reset/k", b"x")
        self.assertIn(a.exit_code, (CURL_RECV_ERROR_EXIT, CURL_EMPTY_REPLY_EXIT), a)
        self.assertEqual(a.status, 0)
        self.assertEqual(self.direct("reset/k").status, 404)

    def test_reset_after_write_lands_but_the_client_sees_a_reset(self):
        self.proxy.set_mode("reset_after")
        a = self.via("PUT", "reset_after/k", b"landed", headers=["If-None-Match: *"])
        self.assertIn(a.exit_code, (CURL_RECV_ERROR_EXIT, CURL_EMPTY_REPLY_EXIT), a)
        self.assertEqual(self.direct("reset_after/k").body, b"landed")
        self.proxy.set_mode("pass")
        retry = self.via("PUT", "reset_after/k", b"landed", headers=["If-None-Match: *"])
        self.assertEqual(retry.status, 412, retry)

    def test_hang_never_answers(self):
        self.proxy.set_mode("hang")
        a = self.via("GET", "hang/k", max_time=2)
        self.assertEqual(a.exit_code, CURL_TIMEOUT_EXIT, a)
        self.assertEqual(a.status, 0)
        self.assertEqual(self.proxy.counts(), {"GET": 1})

    def test_first_n_then_pass(self):
        self.proxy.set_mode("error500", count=2)
        statuses = [curl(self.proxy.endpoint, "GET", f"/{self.s3.bucket}?list-type=2").status
                    for _ in range(4)]
        self.assertEqual(statuses, [500, 500, 200, 200])

    def test_fraction_is_seeded(self):
        self.proxy.set_mode("error500", fraction=0.5, seed=11)
        statuses = [curl(self.proxy.endpoint, "GET", f"/{self.s3.bucket}?list-type=2").status
                    for _ in range(20)]
        failed = statuses.count(500)
        self.assertEqual(failed + statuses.count(200), 20)
        self.assertEqual(failed, self.proxy.faults())
        self.assertTrue(0 < failed < 20, statuses)

    def test_methods_filter(self):
        self.proxy.set_mode("error500", methods=["PUT"])
        self.assertEqual(self.via("PUT", "methods/k", b"x").status, 500)
        self.assertEqual(self.via("GET", "methods/k").status, 404)

    def test_control_port(self):
        def control(path):
            with urllib.request.urlopen(self.proxy.control_url + path, timeout=10) as r:
                return json.loads(r.read())

        control("/mode?mode=slowdown&count=1&methods=GET")
        self.assertEqual(self.via("GET", "ctl/k").status, 503)
        self.assertEqual(self.via("GET", "ctl/k").status, 404)
        self.assertEqual(control("/counts"), {"requests": {"GET": 2}, "faults": 1})
        control("/reset-counts")
        self.assertEqual(control("/counts"), {"requests": {}, "faults": 0})
        with self.assertRaises(urllib.error.HTTPError) as e:
            control("/mode?mode=nonsense")
        self.assertEqual(e.exception.code, 400)


class CommandTest(unittest.TestCase):
    def test_run_passes_env_and_exit_code(self):
        script = ('import os,sys,urllib.request;'
                  'e=os.environ;'
                  'assert e["AWS_ACCESS_KEY_ID"]=="S3RVER" and e["AWS_REGION"]=="us-east-1";'
                  'urllib.request.urlopen(e["FLEETFS_S3_PROXY_CONTROL"]+"/counts").read();'
                  'sys.exit(7)')
        p = subprocess.run(["python3", "s3_fixture.py", "run", "--proxy", "--", "python3", "-c", script],
                           cwd=os.path.dirname(os.path.abspath(__file__)), capture_output=True, text=True)
        self.assertEqual(p.returncode, 7, p.stderr)


if __name__ == "__main__":
    unittest.main()
