"""Seeing the fleet: `fleetfs ls` and `fleetfs inspect` against a running agent."""
import errno
import json
import os
import sqlite3
import subprocess
import time
import unittest

from harness import BINARY, MountTest, slots, tenants_in, wait_for

MiB = 1 << 20


def fleetfs(*args, timeout=60):
    return subprocess.run([BINARY, *args], capture_output=True, text=True, timeout=timeout)


def crc16(data):
    """CRC16/XMODEM, Redis Cluster's HASH_SLOT for keys without a hash tag."""
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


def rss_bytes(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def ls_json(mount):
    run = fleetfs("ls", mount, "--json")
    if run.returncode != 0:
        raise AssertionError(f"fleetfs ls failed ({run.returncode}): {run.stderr}")
    return {row["key"]: row for row in map(json.loads, run.stdout.splitlines())}



# The CLI's memory bound is a property of the release build. Under
# AddressSanitizer (the CI's second pass) freed memory sits in ASan's
# quarantine (256 MiB by default) with redzones around every allocation, so
# a 100,000-line listing peaked at 552 MiB there: that pass checks the
# listing for memory errors, and bounds the CLI only loosely.
CLI_BOUND = (1024 if os.environ.get("FLEETFS_SANITIZED") == "1" else 64) * 1024 * 1024

class TenantListing(MountTest):
    TIME_LIMIT = 240

    def start(self, name="a", ranges="0-8191", replica=True, **kwargs):
        extra = ["--replica", f"file://{self.root}/replica", "--sync-interval", "200ms"] \
            if replica else []
        a = self.agent(name, ranges=ranges, ttl="6s", extra=extra, **kwargs).start()
        a.wait_states("serving")
        return a

    def test_ls_and_inspect_show_every_field_of_wal_and_rollback_tenants(self):
        os.makedirs(os.path.join(self.root, "replica"))
        a = self.start()
        b = self.start("b", ranges="8192-16383", replica=False)
        epoch = a.status()["ranges"][0]["epoch"]
        walt, rollt = tenants_in(0, 8191, 2, prefix="ls")
        far = tenants_in(8192, 16383, 1, prefix="far")[0]
        info = slots(walt, rollt, far)
        t0 = time.time() * 1000

        # A WAL tenant whose log is kept (no checkpoint while this connection
        # lives), and a rollback one, both made through the mount by SQLite.
        wal_db = sqlite3.connect(os.path.join(a.mount, info[walt]["tenant_path"]),
                                 isolation_level=None)
        wal_db.execute("PRAGMA journal_mode=WAL")
        wal_db.execute("PRAGMA wal_autocheckpoint=0")
        wal_db.execute("CREATE TABLE t(x)")
        for i in range(5):
            wal_db.execute("INSERT INTO t VALUES (randomblob(3000))")
        roll_db = sqlite3.connect(os.path.join(a.mount, info[rollt]["tenant_path"]),
                                  isolation_level=None)
        roll_db.execute("PRAGMA journal_mode=DELETE")
        roll_db.execute("CREATE TABLE t(x)")
        roll_db.execute("INSERT INTO t VALUES (randomblob(5000))")
        roll_db.close()
        # One plain handle on the rollback tenant: exactly one open.
        plain = open(os.path.join(a.mount, info[rollt]["tenant_path"]), "rb")
        self.addCleanup(plain.close)

        def shipped():
            rows = ls_json(a.mount)
            return all(rows[k]["shipped_seq"] and rows[k]["lag_s"] == 0 for k in (walt, rollt))
        wait_for(shipped, 30, "both tenants shipped", poll=0.1, on_fail=a.log_tail)
        rows = ls_json(a.mount)
        self.assertEqual(set(rows), {walt, rollt}, "only the served ranges' tenants")
        for key, mode in ((walt, "wal"), (rollt, "rollback")):
            row, rel = rows[key], info[key]["tenant_path"]
            backing = os.path.join(a.backing, rel)
            self.assertEqual(row["path"], rel)
            self.assertEqual(row["slot"], info[key]["slot"])
            self.assertEqual(row["size"], os.stat(backing).st_size)
            self.assertEqual(row["journal_mode"], mode)
            self.assertEqual(row["epoch_stamp"], epoch)
            self.assertEqual(row["served_epoch"], epoch)
            self.assertFalse(row["stale"])
            self.assertGreaterEqual(row["shipped_seq"], 1)
            self.assertGreaterEqual(row["shipped_ms"], t0 - 1000)
            self.assertLessEqual(row["shipped_ms"], time.time() * 1000 + 1000)
            self.assertEqual(row["lag_s"], 0)
        self.assertEqual(rows[walt]["wal_size"], os.stat(os.path.join(
            a.backing, info[walt]["tenant_path"] + "-wal")).st_size)
        self.assertGreater(rows[walt]["wal_size"], 0)
        self.assertEqual(rows[rollt]["wal_size"], 0)
        self.assertEqual(rows[rollt]["open_handles"], 1)
        self.assertGreaterEqual(rows[walt]["open_handles"], 2)  # main, -wal, -shm

        # Text: an aligned header, one line per tenant.
        text = fleetfs("ls", a.mount)
        self.assertEqual(text.returncode, 0, text.stderr)
        header, *lines = text.stdout.splitlines()
        self.assertEqual(header.split(), ["KEY", "SLOT", "SIZE", "JOURNAL", "EPOCH", "SHIPPED",
                                          "SEQ", "LAG", "OPEN"])
        by_key = {l.split()[0]: l for l in lines}
        self.assertEqual(set(by_key), {walt, rollt})
        for key in (walt, rollt):
            line = by_key[key]
            self.assertEqual(line.index(str(info[key]["slot"])), header.index("SLOT"))
            self.assertEqual(line[header.index("JOURNAL"):].split()[0], rows[key]["journal_mode"])
            self.assertEqual(line[header.index("EPOCH"):].split()[0], str(epoch))
            self.assertEqual(line[header.index("SEQ"):].split()[0], str(rows[key]["shipped_seq"]))
            self.assertEqual(line[header.index("LAG"):].split()[0], "0.0s")
            self.assertEqual(line[header.index("OPEN"):].split()[0],
                             str(rows[key]["open_handles"]))

        # inspect: the WAL tenant in depth.
        run = fleetfs("inspect", walt, a.mount, "--json")
        self.assertEqual(run.returncode, 0, run.stderr)
        doc = json.loads(run.stdout)
        self.assertTrue(doc["served_here"])
        self.assertEqual(doc["serving"]["owner"], "host-a")
        self.assertEqual(doc["serving"]["range"], "0-8191")
        self.assertEqual(doc["serving"]["epoch"], epoch)
        self.assertGreater(doc["serving"]["lease_left_ms"], 0)
        local = doc["local"]
        backing = os.path.join(a.backing, info[walt]["tenant_path"])
        self.assertEqual(local["file"], backing)
        self.assertEqual(local["size"], os.stat(backing).st_size)
        self.assertEqual(local["journal_mode"], "wal")
        self.assertEqual(local["page_size"], 4096)
        self.assertGreaterEqual(local["page_count"], 1)
        self.assertEqual(local["epoch_stamp"], epoch)
        self.assertEqual(local["key_stamp"], walt)
        self.assertEqual(local["sidecars"]["wal"], os.stat(backing + "-wal").st_size)
        self.assertEqual(local["sidecars"]["shm"], os.stat(backing + "-shm").st_size)
        self.assertIsNone(local["sidecars"]["journal"])
        wal = local["wal"]
        self.assertTrue(wal["header_valid"])
        self.assertEqual(wal["committed_frames"], wal["frames"])
        self.assertFalse(wal["frames_capped"])
        self.assertGreaterEqual(wal["frames"], 6)  # the table and five rows of 3000 bytes
        self.assertGreaterEqual(doc["open_handles"], 2)
        self.assertEqual(doc["lag_s"], 0)
        self.assertEqual(doc["shipped_seq"], rows[walt]["shipped_seq"])
        rep = doc["replica"]
        self.assertEqual(rep["url"], f"file://{self.root}/replica")
        self.assertGreaterEqual(rep["objects"], 2)  # the marker and a snapshot, at least
        self.assertTrue(rep["tail"])
        self.assertEqual(rep["tail"][-1]["seq"], rows[walt]["shipped_seq"])
        self.assertIn("snapshot", [o["kind"] for o in rep["tail"]])
        self.assertEqual(rep["newest_epoch"], epoch)
        self.assertFalse(rep["deleted"])
        self.assertLessEqual(rep["restorable_from_ms"], rep["restorable_to_ms"])
        text = fleetfs("inspect", walt, a.mount)
        self.assertEqual(text.returncode, 0, text.stderr)
        for label in ("served by", "journal mode", "pages", "wal frames", "epoch stamp",
                      "replica log", "restorable"):
            self.assertIn(label, text.stdout)
        self.assertIn(f"{wal['frames']}, {wal['committed_frames']} committed (checkpoint",
                      text.stdout)

        # A log reused after a checkpoint keeps its old frames past its tail:
        # only the new one is counted, however large the file still is.
        wal_db.execute("PRAGMA wal_checkpoint(RESTART)")
        wal_db.execute("INSERT INTO t VALUES (1)")
        doc = json.loads(fleetfs("inspect", walt, a.mount, "--json").stdout)
        wal = doc["local"]["wal"]
        self.assertGreaterEqual((wal["size"] - 32) // (24 + 4096), 6, "the file kept old frames")
        self.assertIn(wal["frames"], (1, 2), "old frames counted")
        self.assertEqual(wal["committed_frames"], wal["frames"])

        # The rollback tenant: no WAL.
        doc = json.loads(fleetfs("inspect", rollt, a.mount, "--json").stdout)
        self.assertEqual(doc["local"]["journal_mode"], "rollback")
        self.assertIsNone(doc["local"]["wal"])
        self.assertEqual(doc["open_handles"], 1)

        # Served, but no file yet: said so, exit 0.
        absent = tenants_in(0, 8191, 1, prefix="absent")[0]
        run = fleetfs("inspect", absent, a.mount, "--json")
        self.assertEqual(run.returncode, 0, run.stderr)
        doc = json.loads(run.stdout)
        self.assertFalse(doc["local"]["exists"])
        self.assertEqual(doc["local"]["sidecars"], {"wal": None, "shm": None, "journal": None})
        self.assertEqual(doc["replica"]["objects"], 0)

        # Not served here: exit 6, and who serves it.
        run = fleetfs("inspect", far, a.mount, "--json")
        self.assertEqual(run.returncode, 6, run.stderr)
        doc = json.loads(run.stdout)
        self.assertFalse(doc["served_here"])
        self.assertIn("host-b", doc["served_by"])
        run = fleetfs("inspect", far, a.mount)
        self.assertEqual(run.returncode, 6)
        self.assertIn("is not served here", run.stderr)
        self.assertIn("host-b", run.stderr)
        # Bad input.
        run = fleetfs("inspect", "no such/tenant", a.mount)
        self.assertEqual(run.returncode, 2, run.stderr)
        self.assertIn("tenant id", run.stderr)
        # Not a mount.
        run = fleetfs("ls", self.root)
        self.assertEqual(run.returncode, 1)
        self.assertIn("is not a running fleetfs mount", run.stderr)
        wal_db.close()
        del b

    def test_odd_files_in_the_backing_directory_neither_crash_nor_hang_ls(self):
        a = self.start(replica=False)
        junk, fifo, link, dirname = tenants_in(0, 8191, 4, prefix="odd")
        info = slots(junk, fifo, link, dirname)

        def backing(key, suffix=""):
            path = os.path.join(a.backing, info[key]["tenant_path"] + suffix)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            return path
        with open(backing(junk), "wb") as f:
            f.write(b"not a database at all" * 10)
        os.mkfifo(backing(fifo))
        os.symlink("/etc/passwd", backing(link))
        os.mkdir(backing(dirname))
        bucket = os.path.dirname(backing(junk))
        for name in ("bad name.db", ".hidden.db", "x" * 200 + ".db", "nodb", "\udcff.db"):
            try:
                with open(os.path.join(bucket, name), "wb"):
                    pass
            except OSError:
                pass
        os.setxattr(backing(junk), "user.fleetfs.epoch", b"not a number")
        run = fleetfs("ls", a.mount, "--json", timeout=30)
        self.assertEqual(run.returncode, 0, run.stderr)
        rows = {r["key"]: r for r in map(json.loads, run.stdout.splitlines())}
        self.assertEqual(set(rows), {junk})
        self.assertEqual(rows[junk]["journal_mode"], "not-sqlite")
        self.assertIsNone(rows[junk]["epoch_stamp"])
        self.assertTrue(rows[junk]["stale"])
        self.assertEqual(fleetfs("ls", a.mount).returncode, 0)
        self.assertTrue(a.running())

    def test_ls_streams_100000_tenants_without_growing_the_agent(self):
        count = 100_000
        a = self.agent("a", ranges="0-16383", ttl="6s")
        # Made in the backing directory before the agent starts, in the
        # layout and with the stamps the agent gives them.
        made = time.monotonic()
        for bucket in range(256):
            os.makedirs(os.path.join(a.backing, f"{bucket:03d}"))
        for i in range(count):
            key = f"n{i}"
            path = os.path.join(a.backing, f"{crc16(key.encode()) % 16384 // 64:03d}",
                                key + ".db")
            with open(path, "wb") as f:
                f.write(b"SQLite format 3\0")
            if i % 100 == 0:
                os.setxattr(path, "user.fleetfs.epoch", b"1")
                os.setxattr(path, "user.fleetfs.key", key.encode())
        sample = slots("n0", "n99999")
        for key in sample:
            self.assertTrue(os.path.exists(os.path.join(a.backing, sample[key]["tenant_path"])),
                            "the test's CRC16 agrees with fleetfs slot")
        print(f"\n{count} tenant files made in {time.monotonic() - made:.1f}s", flush=True)
        a.start()
        a.wait_states("serving")
        pid = a.proc.pid
        before = rss_bytes(pid)
        started = time.monotonic()
        proc = subprocess.Popen([BINARY, "ls", a.mount, "--json"], stdout=subprocess.PIPE)
        lines = 0
        first = None
        for line in proc.stdout:
            if lines == 0:
                first = json.loads(line)
            lines += 1
        proc.stdout.close()
        # wait4: this child's own peak, not every child's this process waited for.
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        self.assertEqual(proc.returncode, 0)
        elapsed = time.monotonic() - started
        after = rss_bytes(pid)
        cli_peak = usage.ru_maxrss * 1024
        print(f"fleetfs ls --json: {lines} lines in {elapsed:.1f}s; agent RSS "
              f"{before / MiB:.1f} -> {after / MiB:.1f} MiB; CLI peak RSS "
              f"{cli_peak / MiB:.1f} MiB", flush=True)
        self.assertEqual(lines, count)
        self.assertEqual(first["journal_mode"], "not-sqlite")
        self.assertLess(after - before, 64 * MiB, "the agent's memory grew with the listing")
        self.assertLess(cli_peak, CLI_BOUND, "the CLI held the listing in memory")
        # The text form streams the same tenants, under one header.
        run = subprocess.run(f"{BINARY} ls {a.mount} | wc -l", shell=True, capture_output=True,
                             text=True, timeout=120)
        self.assertEqual(int(run.stdout), count + 1)

    def test_the_live_file_follows_the_active_and_open_tenants_not_every_tenant_shipped(self):
        # Written through the mount, so the agent ships every one of them and
        # would name them all if the live file followed what it ever shipped.
        count, kept_open = 2000, 5
        os.makedirs(os.path.join(self.root, "replica"))
        a = self.start(ranges="0-16383")
        live_path = os.path.join(a.mount, ".fleetfs", "tenants-live.jsonl")
        keys = [f"act{i}" for i in range(count)]
        paths = {k: f"{crc16(k.encode()) % 16384 // 64:03d}/{k}.db" for k in keys}
        for k in keys:
            db = sqlite3.connect(os.path.join(a.mount, paths[k]), isolation_level=None)
            db.execute("PRAGMA journal_mode=DELETE")
            db.execute("CREATE TABLE t(x)")
            db.close()

        def live_lines():
            with open(live_path) as f:
                return [json.loads(line) for line in f]
        wait_for(lambda: not live_lines(), 120, "the live file empty once all shipped",
                 poll=0.2, on_fail=lambda: f"{len(live_lines())} lines\n" + a.log_tail())

        held = [open(os.path.join(a.mount, paths[k]), "rb") for k in keys[:kept_open]]
        for f in held:
            self.addCleanup(f.close)
        lines = live_lines()
        self.assertEqual(sorted(line["path"] for line in lines),
                         sorted(paths[k] for k in keys[:kept_open]))
        for line in lines:
            self.assertEqual(line["open_handles"], 1)
            self.assertIsNone(line["pending_since_ms"])

        # ls: every tenant, its shipped sequence from the file's stamp, the
        # open ones with their handle, and no lag anywhere.
        proc = subprocess.Popen([BINARY, "ls", a.mount, "--json"], stdout=subprocess.PIPE)
        rows = {}
        for line in proc.stdout:
            row = json.loads(line)
            rows[row["key"]] = row
        proc.stdout.close()
        _, status, usage = os.wait4(proc.pid, 0)
        self.assertEqual(os.waitstatus_to_exitcode(status), 0)
        self.assertEqual(set(rows), set(keys))
        for k in keys:
            self.assertEqual(rows[k]["open_handles"], 1 if k in keys[:kept_open] else 0, k)
            self.assertEqual(rows[k]["lag_s"], 0, k)
            self.assertGreaterEqual(rows[k]["shipped_seq"] or 0, 1, k)
        self.assertLess(usage.ru_maxrss * 1024, CLI_BOUND, "the CLI held the listing in memory")

        # One user holds at most 64 control files open at once: each keeps its
        # content, and a loop of opens must not make the agent hold unbounded copies.
        opened = []
        try:
            with self.assertRaises(OSError) as refused:
                for _ in range(65):
                    opened.append(open(live_path, "rb"))
            self.assertEqual(refused.exception.errno, errno.EMFILE)
            self.assertEqual(len(opened), 64)
        finally:
            for f in opened:
                f.close()
        with open(live_path) as f:
            self.assertEqual(len(f.readlines()), kept_open, "closing gave the opens back")


if __name__ == "__main__":
    unittest.main()
