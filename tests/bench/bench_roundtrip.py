#!/usr/bin/env python3
"""FUSE round-trip microbenchmark: the cost of one request through
min_passthrough under each set of transport switches, against the same system
call on the backing directory, interleaved round by round; medians.

Not a test: it asserts nothing about speed. Each operation is chosen to make
one FUSE request (min_passthrough --count checks it: the "req/op" column is
counted, not assumed):

  write1    os.pwrite of 1 byte at offset 0          WRITE
  write4k   os.pwrite of 4 KiB at offset 0           WRITE (a page: the size
            libfuse splices into its pipe under --splice)
  statx     statx(AT_STATX_FORCE_SYNC) of an open fd GETATTR (a plain fstat is
            answered from the kernel's attribute cache)
  read4k    posix_fadvise(DONTNEED) + pread of 4 KiB  READ: the advice drops the
            mount's cached page, so the read asks the daemon (whose backing
            page stays cached). The direct side gives the same advice on an
            empty file (dropping its warm page would read the disk; advice
            on a page it cannot drop, a mapped one, drains every CPU's LRU
            lists) and reads warm. The difference also holds a page cache
            page dropped, allocated and filled.
  openclose os.open + os.close                       OPEN, FLUSH, RELEASE (the
            release is asynchronous), a LOOKUP per second (1 s entry timeout)
  write1xC  write1 by --clients processes at once, each on its own file, per
            operation of all of them (wall time / operations); only with
            --clients 2 or more
  wsync     os.pwrite of 1 byte + os.fdatasync       WRITE, FSYNC (a twentieth
            of --ops: the disk's flush dominates; what differs is whether
            the daemon lets two syncs overlap, see wsyncxC)
  wsyncxC   wsync by --clients processes at once, each on its own file

Usage (as root):
  python3 tests/bench/bench_roundtrip.py --passthrough build/tests/min_passthrough
      [--rounds 5] [--ops 20000] [--clients 2]
      [--variant "NAME:ARGS" ...] [--with-defaults]

Without --variant the default set runs (libfuse defaults as fleetfs uses
them, then one switch changed at a time). Each --variant is one more mount of
min_passthrough with ARGS (e.g. "uring:--transport io_uring"); with
--variant only those run, unless --with-defaults.
"""
import argparse
import ctypes
import os
import select
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

DEFAULT_VARIANTS = [
    ("default", ""),  # fuse_session_loop_mt, max_threads 10, as fleetfs
    ("clone-fd", "--clone-fd"),
    ("threads-1", "--threads 1"),
    ("threads-2", "--threads 2"),
    ("threads-4", "--threads 4"),
    ("max-idle-1", "--max-idle 1"),
    ("single", "--single"),
    ("splice", "--splice"),
    ("no-splice", "--no-splice"),
]

PAGE = b"p" * 4096
AT_EMPTY_PATH = 0x1000
AT_STATX_FORCE_SYNC = 0x2000
STATX_BASIC_STATS = 0x7FF
libc = ctypes.CDLL(None, use_errno=True)
statx_buf = ctypes.create_string_buffer(512)


def statx_sync(fd):
    if libc.statx(fd, b"", AT_EMPTY_PATH | AT_STATX_FORCE_SYNC, STATX_BASIC_STATS,
                  statx_buf) != 0:
        raise OSError(ctypes.get_errno(), "statx")


class Side:
    """Where one variant's files are: a directory on the backing disk (direct)
    or a min_passthrough mount over its own backing directory."""

    def __init__(self, root, name, args, passthrough):
        self.name, self.args, self.proc, self.init = name, args, None, ""
        if args is None:
            self.dir = os.path.join(root, "direct")
            os.makedirs(self.dir)
            self.make_files(self.dir)
        else:
            backing = os.path.join(root, "b-" + name)
            self.dir = os.path.join(root, "m-" + name)
            os.makedirs(backing)
            os.makedirs(self.dir)
            self.make_files(backing)
            self.proc = subprocess.Popen(
                [passthrough, "--count", *shlex.split(args), backing, self.dir],
                stderr=subprocess.PIPE)
            self.init = self.line(10)
            deadline = time.monotonic() + 10
            while not os.path.ismount(self.dir):
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    sys.exit(f"min_passthrough {args} did not mount")
                time.sleep(0.02)
        self.fw = os.open(os.path.join(self.dir, "w"), os.O_RDWR)
        self.fr = os.open(os.path.join(self.dir, "r"), os.O_RDONLY)
        self.fadvise = self.fr if args is not None else os.open(
            os.path.join(self.dir, "e"), os.O_RDWR | os.O_CREAT | os.O_TRUNC)

    @staticmethod
    def make_files(d):
        for f in ["w", "r", "o"] + [f"c{i}" for i in range(64)]:
            with open(os.path.join(d, f), "wb") as out:
                out.write(PAGE)

    def line(self, timeout):
        """The next line min_passthrough writes to stderr."""
        out = b""
        deadline = time.monotonic() + timeout
        fd = self.proc.stderr.fileno()
        while not out.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                sys.exit(f"min_passthrough {self.args}: no line on stderr")
            chunk = os.read(fd, 1)
            if not chunk:
                sys.exit(f"min_passthrough {self.args} exited")
            out += chunk
        return out.decode().strip()

    def counts(self):
        if self.proc is None:
            return {}
        self.proc.send_signal(signal.SIGUSR1)
        line = self.line(10)
        assert line.startswith("counts"), line
        return {k: int(v) for k, v in (kv.split("=") for kv in line.split()[1:])}

    def close(self):
        if self.fadvise != self.fr:
            os.close(self.fadvise)
        os.close(self.fw)
        os.close(self.fr)
        if self.proc is not None:
            subprocess.run(["umount", self.dir])
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                subprocess.run(["umount", "-l", self.dir])


def concurrent_writes(side, clients, count, sync):
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pids = []
    for c in range(clients):
        pid = os.fork()
        if pid == 0:
            try:
                fd = os.open(os.path.join(side.dir, f"c{c}"), os.O_RDWR)
                os.write(ready_w, b"r")
                os.read(go_r, 1)
                for _ in range(count):
                    os.pwrite(fd, b"x", 0)
                    if sync:
                        os.fdatasync(fd)
            finally:
                os._exit(0)
        pids.append(pid)
    got = 0
    while got < clients:
        got += len(os.read(ready_r, clients - got))
    started = time.perf_counter()
    os.write(go_w, b"g" * clients)
    for pid in pids:
        os.waitpid(pid, 0)
    took = time.perf_counter() - started
    for fd in (ready_r, ready_w, go_r, go_w):
        os.close(fd)
    return took / (clients * count)


def run_op(side, op, count, clients):
    """Seconds per operation."""
    fw, fr, fa = side.fw, side.fr, side.fadvise
    if op == "write1xC":
        return concurrent_writes(side, clients, count // clients, False)
    if op == "wsyncxC":
        return concurrent_writes(side, clients, count // clients, True)
    started = time.perf_counter()
    if op == "write1":
        for _ in range(count):
            os.pwrite(fw, b"x", 0)
    elif op == "write4k":
        for _ in range(count):
            os.pwrite(fw, PAGE, 0)
    elif op == "statx":
        for _ in range(count):
            statx_sync(fw)
    elif op == "read4k":
        for _ in range(count):
            os.posix_fadvise(fa, 0, 4096, os.POSIX_FADV_DONTNEED)
            os.pread(fr, 4096, 0)
    elif op == "wsync":
        for _ in range(count):
            os.pwrite(fw, b"x", 0)
            os.fdatasync(fw)
    elif op == "openclose":
        path = os.path.join(side.dir, "o")
        for _ in range(count):
            os.close(os.open(path, os.O_RDONLY))
    return (time.perf_counter() - started) / count


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--passthrough", required=True, help="the min_passthrough binary")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--ops", type=int, default=20000, help="operations per batch")
    ap.add_argument("--clients", type=int, default=2,
                    help="processes of write1xC (1: skip it)")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME:ARGS",
                    help="a min_passthrough mount with ARGS (repeatable)")
    ap.add_argument("--with-defaults", action="store_true",
                    help="run the default variants as well as --variant ones")
    ap.add_argument("--only-ops", help="comma-separated subset of the operations")
    ap.add_argument("--dir", default="/var/tmp")
    args = ap.parse_args()

    variants = []
    if not args.variant or args.with_defaults:
        variants += DEFAULT_VARIANTS
    for v in args.variant:
        name, _, vargs = v.partition(":")
        variants.append((name, vargs))
    ops = ["write1", "write4k", "statx", "read4k", "openclose"]
    if args.clients > 1:
        ops.append("write1xC")
    ops.append("wsync")
    if args.clients > 1:
        ops.append("wsyncxC")
    if args.only_ops:
        ops = [o for o in ops if o in args.only_ops.split(",")]

    root = tempfile.mkdtemp(prefix="fleetfs-rt-", dir=args.dir)
    sides = []
    try:
        sides.append(Side(root, "direct", None, args.passthrough))
        for name, vargs in variants:
            sides.append(Side(root, name, vargs, args.passthrough))
        def batch(op):
            return args.ops // 20 if op.startswith("wsync") else args.ops

        # Warm-up: first requests start threads and fill caches.
        for s in sides:
            for op in ops:
                run_op(s, op, max(batch(op) // 10, 2 * args.clients), args.clients)

        secs = {(s.name, op): [] for s in sides for op in ops}
        reqs = {(s.name, op): [] for s in sides for op in ops}
        for r in range(args.rounds):
            for op in ops:
                # Rotate the order each round: no variant always runs first.
                order = sides[r % len(sides):] + sides[:r % len(sides)]
                for s in order:
                    before = s.counts()
                    secs[(s.name, op)].append(run_op(s, op, batch(op), args.clients))
                    after = s.counts()
                    if s.proc is not None:
                        n = sum(after.values()) - sum(before.values())
                        reqs[(s.name, op)].append(
                            (n, {k: after[k] - before.get(k, 0) for k in after
                                 if after[k] != before.get(k, 0)}))

        print(f"FUSE round trip: {args.rounds} interleaved rounds of {args.ops} operations "
              f"({batch('wsync')} of wsync), "
              f"medians; {os.cpu_count()} CPUs; kernel {os.uname().release}; "
              f"{args.clients} clients in write1xC")
        for s in sides[1:]:
            print(f"  {s.name:12} min_passthrough {s.args or '(no options)'}; {s.init}")
        direct = {op: statistics.median(secs[("direct", op)]) * 1e6 for op in ops}
        print("\nPer operation: us (median of rounds), delta over direct, requests per operation "
              "(counted), delta per request (median; min over rounds); direct first")
        for op in ops:
            print(f"\n{op}")
            print(f"  {'variant':12} {'us':>8} {'delta':>8} {'req/op':>7} {'us/req':>7} {'min':>7}")
            d_rounds = secs[("direct", op)]
            print(f"  {'direct':12} {direct[op]:8.2f}")
            for s in sides[1:]:
                rounds = secs[(s.name, op)]
                us = statistics.median(rounds) * 1e6
                per_op = statistics.median(n for n, _ in reqs[(s.name, op)]) / batch(op)
                per_op = max(per_op, 1e-9)
                delta = us - direct[op]
                # Round by round against the direct batch of the same round.
                best = min((f - d) * 1e6 for f, d in zip(rounds, d_rounds)) / per_op
                print(f"  {s.name:12} {us:8.2f} {delta:8.2f} {per_op:7.3f} "
                      f"{delta / per_op:7.2f} {best:7.2f}")
        print("\nRequests per operation in the last round, by opcode:")
        for op in ops:
            for s in sides[1:]:
                split = reqs[(s.name, op)][-1][1]
                parts = ", ".join(f"{k} {v / batch(op):.3f}" for k, v in
                                  sorted(split.items(), key=lambda kv: -kv[1]))
                print(f"  {op:10} {s.name:12} {parts}")
    finally:
        for s in sides:
            s.close()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
