"""The observer: what writers saw acknowledged, and whether two hosts served
one key at once.

A writer reports each write that came back acknowledged: the host it went
through, the key (a tenant id or a slot), and when it was sent and answered,
on the monotonic clock (CLOCK_MONOTONIC, which no wall-clock step moves and
which every process of the host shares). A write whose answer was an error is
not reported: only acknowledged writes are promises.

The property checked: for each key, the hosts' tenures (maximal runs of one
host's acknowledged writes, in order of acknowledgement) never overlap. A
tenure lasts from its first write's send to its last write's answer; if two
hosts' tenures overlap, both acknowledged writes for the key at once, which a
lease must never allow. `tenures(key)` gives the runs, so a test can also say
how many handovers it expects.

    obs = Observer()
    w = LoopWriter(obs, "a", tenant, os.path.join(agent_a.mount, rel)).start()
    ...
    w.stop()
    obs.assert_no_overlap()
    assert [t.host for t in obs.tenures(tenant)] == ["a", "b"]

Thread-safe: writers in threads report to one observer.
"""
import collections
import contextlib
import sqlite3
import threading
import time

Ack = collections.namedtuple("Ack", "host key sent acked")
Tenure = collections.namedtuple("Tenure", "host key first_sent last_acked writes")


class Observer:
    def __init__(self):
        self._lock = threading.Lock()
        self._acks = []

    def record(self, host, key, sent, acked):
        """One acknowledged write: sent and acked are time.monotonic() values."""
        if acked < sent:
            raise ValueError(f"write on {host}/{key} acknowledged before it was sent")
        with self._lock:
            self._acks.append(Ack(host, key, sent, acked))

    @contextlib.contextmanager
    def write(self, host, key):
        """Times the block as one write; records it only if the block returns."""
        sent = time.monotonic()
        yield
        self.record(host, key, sent, time.monotonic())

    def acks(self, host=None, key=None):
        """Acknowledged writes (of one host, one key), in order of acknowledgement."""
        with self._lock:
            found = [a for a in self._acks
                     if (host is None or a.host == host) and (key is None or a.key == key)]
        return sorted(found, key=lambda a: a.acked)

    def keys(self):
        with self._lock:
            return sorted({a.key for a in self._acks}, key=str)

    def tenures(self, key):
        """Maximal runs of one host's acknowledged writes to `key`."""
        runs = []
        for a in self.acks(key=key):
            if runs and runs[-1].host == a.host:
                last = runs[-1]
                runs[-1] = last._replace(first_sent=min(last.first_sent, a.sent),
                                         last_acked=a.acked, writes=last.writes + 1)
            else:
                runs.append(Tenure(a.host, key, a.sent, a.acked, 1))
        return runs

    def overlaps(self):
        """Pairs of tenures of different hosts, on one key, that overlap in time."""
        found = []
        for key in self.keys():
            runs = self.tenures(key)
            for i, early in enumerate(runs):
                for late in runs[i + 1:]:
                    if late.host != early.host and late.first_sent < early.last_acked:
                        found.append((early, late))
        return found

    def assert_no_overlap(self):
        bad = self.overlaps()
        if bad:
            lines = [f"{len(bad)} overlapping tenures: two hosts acknowledged writes for one key "
                     "at once"]
            for early, late in bad[:5]:
                lines.append(
                    f"  key {early.key}: {early.host} acknowledged {early.writes} writes until "
                    f"{early.last_acked:.3f}, {late.host} sent one at {late.first_sent:.3f} "
                    f"({(early.last_acked - late.first_sent) * 1000:.0f} ms overlap)")
            raise AssertionError("\n".join(lines))


class LoopWriter:
    """A thread that commits one row per transaction to a SQLite database at
    `path` (through a host's mount) until stopped, reporting each commit that
    returned to the observer. A failed write (the file hidden, fenced, the
    mount gone) is retried on a new connection after `retry_s`; the database
    must have `CREATE TABLE t(id INTEGER PRIMARY KEY, host TEXT)` or be
    restorable. Row ids are unique per writer: `ids()` gives the acknowledged ones."""

    def __init__(self, observer, host, key, path, id_base=0, retry_s=0.02):
        self.observer, self.host, self.key, self.path = observer, host, key, path
        self.id_base, self.retry_s = id_base, retry_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"writer-{host}-{key}")
        self._ids = []
        self.errors = collections.Counter()

    def start(self):
        self._thread.start()
        return self

    def stop(self, timeout=30):
        self._stop.set()
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise AssertionError(f"writer {self.host}/{self.key} hung in a write")

    def ids(self):
        return list(self._ids)

    def _run(self):
        db, n = None, 0
        while not self._stop.is_set():
            try:
                if db is None:
                    db = sqlite3.connect(f"file:{self.path}?mode=rw", uri=True, timeout=5,
                                         isolation_level=None)
                n += 1
                row = self.id_base + n
                with self.observer.write(self.host, self.key):
                    db.execute("BEGIN IMMEDIATE")
                    db.execute("INSERT INTO t(id, host) VALUES (?, ?)", (row, self.host))
                    db.execute("COMMIT")
                self._ids.append(row)
            except sqlite3.Error as e:
                self.errors[str(e)] += 1
                if db is not None:
                    try:
                        db.close()
                    except sqlite3.Error:
                        pass
                    db = None
                self._stop.wait(self.retry_s)
        if db is not None:
            try:
                db.close()
            except sqlite3.Error:
                pass
