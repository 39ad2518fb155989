#!/usr/bin/env python3
"""fleetfs slot must agree with Redis Cluster's own CLUSTER KEYSLOT.

Starts redis-server in cluster mode on a free loopback port (its own
directory, shut down at the end), sends CLUSTER KEYSLOT for 5000 generated
keys over one pipelined RESP connection, runs `fleetfs slot --json` on the
same keys, and compares every answer.
"""
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time


def free_port():
    """A loopback port that is free, and whose cluster bus port (+10000) is too."""
    rng = random.Random()
    for _ in range(200):
        port = rng.randint(20000, 45000)
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 10000))
                return port
        except OSError:
            continue
    raise SystemExit("no free loopback port pair for redis-server")


def keys():
    rng = random.Random(20261129)
    fixed = ["123456789", "{user1000}.following", "{user1000}.followers", "foo{}{bar}",
             "foo{{bar}}zap", "foo{bar}{zap}", "{}", "{", "}", "a{b", "}{x}", "acme",
             "slot-00042", "caf\u00e9", "tab\there"]
    alphabet = "abcXYZ019-_.{}{}{} /:\\\"'"
    out = list(fixed)
    while len(out) < 5000:
        out.append("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 24))))
    return out


def redis_slots(port, ks):
    request = bytearray()
    for k in ks:
        b = k.encode()
        request += b"*3\r\n$7\r\nCLUSTER\r\n$7\r\nKEYSLOT\r\n$%d\r\n%s\r\n" % (len(b), b)
    with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
        conn.sendall(request)
        reader = conn.makefile("rb")
        answers = []
        for _ in ks:
            line = reader.readline()
            if not line.startswith(b":"):
                raise SystemExit("redis answered %r" % line)
            answers.append(int(line[1:]))
        return answers


def main():
    fleetfs = sys.argv[1]
    server = shutil.which("redis-server")
    if server is None:
        raise SystemExit("redis-server is not installed (packaging/install-deps.sh installs it)")
    work = tempfile.mkdtemp(prefix="fleetfs-redis-")
    port = free_port()
    log = open(os.path.join(work, "redis.log"), "wb")
    proc = subprocess.Popen(
        [server, "--port", str(port), "--bind", "127.0.0.1", "--cluster-enabled", "yes",
         "--cluster-config-file", os.path.join(work, "nodes.conf"), "--dir", work,
         "--save", "", "--appendonly", "no"],
        stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    log.flush()
                    with open(os.path.join(work, "redis.log"), "rb") as f:
                        tail = f.read()[-2000:].decode(errors="replace")
                    raise SystemExit("redis-server did not start on port %d:\n%s" % (port, tail))
                time.sleep(0.05)
        ks = keys()
        expected = redis_slots(port, ks)
        ran = subprocess.run([fleetfs, "slot", "--json", "--", *ks], capture_output=True)
        if ran.returncode != 0:
            raise SystemExit("fleetfs slot failed: " + ran.stderr.decode(errors="replace")[:500])
        got = [entry["slot"] for entry in json.loads(ran.stdout)]
        wrong = [(k, e, g) for k, e, g in zip(ks, expected, got) if e != g]
        if len(got) != len(ks) or wrong:
            for k, e, g in wrong[:20]:
                print("key %r: redis %d, fleetfs %d" % (k, e, g))
            raise SystemExit("fleetfs slot and redis CLUSTER KEYSLOT disagree")
        print("fleetfs slot agrees with redis CLUSTER KEYSLOT on %d keys" % len(ks))
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
