"""An HTTP-aware fault-injecting proxy for the S3 tests, in front of the
test S3 server (s3_server.js): the client connects to the proxy, signs the
proxy's address as Host, and the proxy forwards each request's raw bytes
unchanged, so SigV4 signatures stay valid.

    with FaultProxy("http://127.0.0.1:9000") as proxy:
        proxy.endpoint                    # "http://127.0.0.1:P", what clients use
        proxy.control_url                 # "http://127.0.0.1:C", for other processes
        proxy.set_mode("error500", count=2)            # the next 2 requests get 500
        proxy.set_mode("latency", ms=300, methods=["PUT"])
        proxy.set_mode("reset", fraction=0.5, seed=7)
        proxy.counts()                    # {"GET": 3, "PUT": 1, ...}

Modes (each for every matching request, or for the first `count` matching
requests after set_mode, or a random `fraction` of them; `methods` limits
which methods match; a request that does not draw the fault passes):
  pass        forward
  latency     wait `ms` milliseconds, then forward
  error500    read the request, answer 500 InternalError (S3 XML), keep-alive
  slowdown    read the request, answer 503 SlowDown (S3 XML), keep-alive
  reset       read the request head, then reset the client's connection (RST);
              the server never sees the request
  reset_after forward the request and read the server's answer, then reset the
              client's connection instead of relaying it: the write happened,
              the client does not know
  hang        read the request, never answer (until the client closes or the
              proxy stops)

The control port speaks plain HTTP (GET, JSON answers):
  /mode?mode=latency&ms=300&count=2&fraction=0.5&methods=PUT,POST&seed=1
  /counts                  {"requests": {"GET": n, ...}, "faults": n}
  /reset-counts
Test code only; Python 3 standard library.
"""
import http.server
import json
import random
import socket
import struct
import threading
import urllib.parse

MODES = ("pass", "latency", "error500", "slowdown", "reset", "reset_after", "hang")
CHUNK = 1 << 20


def _error_body(code, message):
    return ('<?xml version="1.0" encoding="UTF-8"?>\n'
            f"<Error><Code>{code}</Code><Message>{message}</Message>"
            "<RequestId>FLEETFSPROXY</RequestId><HostId>fleetfs-fault-proxy</HostId></Error>").encode()


ERRORS = {
    "error500": (500, "Internal Server Error",
                 _error_body("InternalError", "We encountered an internal error. Please try again.")),
    "slowdown": (503, "Slow Down", _error_body("SlowDown", "Please reduce your request rate.")),
}


class _Closed(Exception):
    """The peer closed the connection mid-message."""


def _read_head(reader):
    """Reads one HTTP message head; returns (raw bytes, start line, headers
    as a list of (lower-case name, value)), or None at a clean EOF."""
    raw = bytearray()
    lines = []
    while True:
        line = reader.readline(65536)
        if not line:
            if raw:
                raise _Closed()
            return None
        if not raw and line in (b"\r\n", b"\n"):
            continue  # tolerated blank lines between messages
        raw += line
        if line in (b"\r\n", b"\n"):
            break
        lines.append(line.decode("latin-1").rstrip("\r\n"))
    headers = []
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers.append((name.strip().lower(), value.strip()))
    return bytes(raw), lines[0], headers


def _header(headers, name):
    for n, v in headers:
        if n == name:
            return v
    return None


def _copy_exact(reader, out, length):
    """Copies `length` bytes from reader to out (a socket, or None to
    discard)."""
    while length > 0:
        data = reader.read(min(length, CHUNK))
        if not data:
            raise _Closed()
        if out is not None:
            out.sendall(data)
        length -= len(data)


def _copy_chunked(reader, out):
    """Copies a chunked body, raw, through its last chunk and trailers."""
    while True:
        line = reader.readline(65536)
        if not line:
            raise _Closed()
        out.sendall(line)
        size = int(line.split(b";")[0].strip() or b"0", 16)
        if size == 0:
            while True:
                trailer = reader.readline(65536)
                if not trailer:
                    raise _Closed()
                out.sendall(trailer)
                if trailer in (b"\r\n", b"\n"):
                    return
        _copy_exact(reader, out, size + 2)  # the chunk and its CRLF


def _reset(sock):
    """Closes with RST rather than FIN, as a crashed peer or a middlebox
    would."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


class FaultProxy:
    def __init__(self, target_endpoint, host="127.0.0.1", port=0, control_port=0):
        parsed = urllib.parse.urlsplit(target_endpoint)
        if parsed.scheme != "http" or not parsed.hostname or not parsed.port:
            raise ValueError(f"FaultProxy: target {target_endpoint!r} must be http://HOST:PORT")
        self.target = (parsed.hostname, parsed.port)
        self._lock = threading.Lock()
        self._mode = "pass"
        self._ms = 0
        self._count = None
        self._fraction = None
        self._methods = None
        self._random = random.Random(0)
        self._requests = {}
        self._faults = 0
        self._stopping = threading.Event()
        self._clients = set()
        self._listener = socket.create_server((host, port), backlog=128)
        self.port = self._listener.getsockname()[1]
        self.endpoint = f"http://{host}:{self.port}"
        self._control = http.server.ThreadingHTTPServer((host, control_port), self._control_handler())
        self._control.daemon_threads = True
        self.control_port = self._control.server_address[1]
        self.control_url = f"http://{host}:{self.control_port}"
        self._threads = [threading.Thread(target=self._accept_loop, daemon=True, name="fault-proxy-accept"),
                         threading.Thread(target=self._control.serve_forever, daemon=True,
                                          name="fault-proxy-control")]
        for t in self._threads:
            t.start()

    # -- control -----------------------------------------------------------

    def set_mode(self, mode, ms=0, count=None, fraction=None, methods=None, seed=None):
        if mode not in MODES:
            raise ValueError(f"FaultProxy: mode {mode!r} is not one of {', '.join(MODES)}")
        if mode == "latency" and (ms is None or ms < 0):
            raise ValueError("FaultProxy: latency needs ms >= 0")
        if count is not None and count < 0:
            raise ValueError("FaultProxy: count must be >= 0")
        if fraction is not None and not 0.0 <= fraction <= 1.0:
            raise ValueError("FaultProxy: fraction must be in [0, 1]")
        with self._lock:
            self._mode = mode
            self._ms = ms or 0
            self._count = count
            self._fraction = fraction
            self._methods = {m.upper() for m in methods} if methods else None
            if seed is not None:
                self._random = random.Random(seed)

    def counts(self):
        """Requests received, by method (including faulted ones)."""
        with self._lock:
            return dict(self._requests)

    def faults(self):
        """Requests that drew a fault (latency included)."""
        with self._lock:
            return self._faults

    def reset_counts(self):
        with self._lock:
            self._requests = {}
            self._faults = 0

    def _draw(self, method):
        """Counts the request and picks what happens to it."""
        with self._lock:
            self._requests[method] = self._requests.get(method, 0) + 1
            if self._mode == "pass":
                return "pass", 0
            if self._methods is not None and method not in self._methods:
                return "pass", 0
            if self._count is not None and self._count <= 0:
                return "pass", 0
            if self._fraction is not None and self._random.random() >= self._fraction:
                return "pass", 0
            if self._count is not None:
                self._count -= 1
            self._faults += 1
            return self._mode, self._ms

    def _control_handler(self):
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _answer(self, status, body):
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                url = urllib.parse.urlsplit(self.path)
                q = dict(urllib.parse.parse_qsl(url.query))
                try:
                    if url.path == "/mode":
                        proxy.set_mode(
                            q.get("mode", "pass"),
                            ms=int(q.get("ms", "0")),
                            count=int(q["count"]) if "count" in q else None,
                            fraction=float(q["fraction"]) if "fraction" in q else None,
                            methods=q["methods"].split(",") if q.get("methods") else None,
                            seed=int(q["seed"]) if "seed" in q else None)
                        self._answer(200, {"mode": q.get("mode", "pass")})
                    elif url.path == "/counts":
                        self._answer(200, {"requests": proxy.counts(), "faults": proxy.faults()})
                    elif url.path == "/reset-counts":
                        proxy.reset_counts()
                        self._answer(200, {})
                    else:
                        self._answer(404, {"error": f"no control path {url.path}"})
                except (ValueError, KeyError) as e:
                    self._answer(400, {"error": str(e)})

            do_POST = do_GET

        return Handler

    # -- proxying ----------------------------------------------------------

    def _accept_loop(self):
        while not self._stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self._clients.add(client)
            threading.Thread(target=self._serve, args=(client,), daemon=True,
                             name="fault-proxy-conn").start()

    def _serve(self, client):
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        reader = client.makefile("rb")
        try:
            while not self._stopping.is_set():
                head = _read_head(reader)
                if head is None:
                    break
                if not self._one_request(client, reader, head):
                    break
        except (_Closed, OSError, ValueError):
            pass
        finally:
            reader.close()
            with self._lock:
                self._clients.discard(client)
            if client.fileno() != -1:
                try:
                    client.close()
                except OSError:
                    pass

    def _one_request(self, client, reader, head):
        """Handles one request; False when the client connection must end."""
        raw, start, headers = head
        method = start.split(" ", 1)[0].upper()
        if _header(headers, "transfer-encoding"):
            # The clients this proxy serves send Content-Length bodies.
            client.sendall(b"HTTP/1.1 501 Not Implemented\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            return False
        length = int(_header(headers, "content-length") or "0")
        expect = (_header(headers, "expect") or "").lower() == "100-continue"
        action, ms = self._draw(method)

        if action == "reset":
            reader.close()
            _reset(client)
            return False
        if action in ERRORS or action == "hang":
            if expect and length:
                client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
            _copy_exact(reader, None, length)
            if action == "hang":
                # Never answer; wait for the client to give up or the proxy
                # to stop (stop() shuts this socket down).
                while reader.read(CHUNK):
                    pass
                return False
            status, reason, body = ERRORS[action]
            client.sendall(f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/xml\r\n"
                           f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            return True
        if action == "latency" and self._stopping.wait(ms / 1000.0):
            return False
        return self._forward(client, reader, raw, method, length, expect,
                             relay=(action != "reset_after"))

    def _forward(self, client, reader, raw, method, length, expect, relay):
        # A fresh server connection per request: no race with the server
        # closing an idle keep-alive connection, and nothing the client
        # signed changes (the raw head goes as it came).
        upstream = socket.create_connection(self.target)
        upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        ureader = upstream.makefile("rb")
        out = client if relay else None
        try:
            upstream.sendall(raw)
            body_sent = not length
            if expect and length:
                # The server answers 100 Continue (or a final answer) before
                # the client sends the body.
                while True:
                    head = _read_head(ureader)
                    if head is None:
                        raise _Closed()
                    uraw, ustart, uheaders = head
                    status = int(ustart.split(" ")[1])
                    if status < 200:
                        # Interim answers go to the client even in
                        # reset_after: it needs its 100 to send the body.
                        client.sendall(uraw)
                        if status == 100:
                            break
                        continue
                    # A final answer before the body: whether the client
                    # sends the body anyway is unknowable; end the connection.
                    if out is not None:
                        client.sendall(uraw)
                    self._relay_body(ureader, out, method, status, uheaders)
                    if not relay:
                        reader.close()
                        _reset(client)
                    return False
            if not body_sent:
                _copy_exact(reader, upstream, length)
            while True:
                head = _read_head(ureader)
                if head is None:
                    raise _Closed()
                uraw, ustart, uheaders = head
                status = int(ustart.split(" ")[1])
                if out is not None:
                    client.sendall(uraw)
                if status >= 200:
                    break
            keep = self._relay_body(ureader, out, method, status, uheaders)
            if not relay:
                reader.close()
                _reset(client)
                return False
            return keep and (_header(uheaders, "connection") or "").lower() != "close"
        finally:
            ureader.close()
            upstream.close()

    def _relay_body(self, ureader, out, method, status, headers):
        """Relays a response body; False when its end is the connection's."""
        sink = out if out is not None else _Discard()
        if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            return True
        if (_header(headers, "transfer-encoding") or "").lower().endswith("chunked"):
            _copy_chunked(ureader, sink)
            return True
        length = _header(headers, "content-length")
        if length is not None:
            _copy_exact(ureader, sink, int(length))
            return True
        while True:
            data = ureader.read1(CHUNK)
            if not data:
                return False
            sink.sendall(data)

    # -- life --------------------------------------------------------------

    def stop(self):
        self._stopping.set()
        try:
            self._listener.close()
        except OSError:
            pass
        self._control.shutdown()
        self._control.server_close()
        with self._lock:
            clients = list(self._clients)
        for c in clients:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


class _Discard:
    def sendall(self, data):
        pass
