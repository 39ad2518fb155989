"""Through a real mount: owned tenants work, everything else is hidden or refused."""
import errno
import os
import sqlite3
import subprocess
import unittest

from harness import MountTest, slots, tenants_in

NOBODY = 65534
OTHER_USER = 65533


def as_user(uid, code):
    """Runs Python `code` as uid/gid `uid`; returns the completed process."""
    return subprocess.run(
        ["python3", "-c", code], capture_output=True, text=True, timeout=60,
        preexec_fn=lambda: (os.setgroups([]), os.setgid(uid), os.setuid(uid)))


class OwnedTenants(MountTest):
    def test_a_tenant_in_an_owned_slot_is_created_in_wal_mode_written_and_read_back(self):
        a = self.agent(ranges="0-8191").start()
        a.wait_states("serving")
        tenant = tenants_in(0, 8191, 1)[0]
        rel = slots(tenant)[tenant]["tenant_path"]
        path = os.path.join(a.mount, rel)

        # The sqlite3 shell creates it; the bucket directory is already there.
        shell = subprocess.run(
            ["sqlite3", path, "PRAGMA journal_mode=WAL;"
             "CREATE TABLE kv(k TEXT PRIMARY KEY, v TEXT);"
             "INSERT INTO kv VALUES ('a', 'one'), ('b', 'two');"],
            capture_output=True, text=True, timeout=30)
        self.assertEqual(shell.returncode, 0, shell.stderr)
        self.assertEqual(shell.stdout.strip(), "wal")

        # Python's sqlite3 reads it back, writes more, and checks it.
        db = sqlite3.connect(path)
        self.assertEqual(db.execute("PRAGMA journal_mode").fetchone()[0], "wal")
        db.execute("INSERT INTO kv VALUES ('c', 'three')")
        db.commit()
        self.assertEqual(db.execute("SELECT v FROM kv ORDER BY k").fetchall(),
                         [("one",), ("two",), ("three",)])
        self.assertEqual(db.execute("PRAGMA integrity_check").fetchone()[0], "ok")
        db.close()

        # The file sits in the backing directory at its bucket path.
        backing_file = os.path.join(a.backing, rel)
        self.assertTrue(os.path.isfile(backing_file), backing_file)
        self.assertIn(rel.split("/")[1], os.listdir(os.path.join(a.mount, rel.split("/")[0])))
        # It carries the epoch it was created under, outside the tenant's schema.
        epoch = a.status()["ranges"][0]["epoch"]
        self.assertEqual(os.getxattr(backing_file, "user.fleetfs.epoch").decode(), str(epoch))
        self.assertEqual(os.getxattr(backing_file, "user.fleetfs.key").decode(), tenant)

    def test_a_file_belongs_to_the_user_that_created_it_and_the_kernel_checks_its_mode(self):
        a = self.agent(ranges="0-16383")
        os.chmod(a.backing, 0o1777)  # anyone may create tenants, as in /tmp
        a.start()
        a.wait_states("serving")
        tenant = tenants_in(0, 16383, 1, prefix="user")[0]
        rel = slots(tenant)[tenant]["tenant_path"]
        path = os.path.join(a.mount, rel)

        made = as_user(NOBODY, f"""
import sqlite3
db = sqlite3.connect({path!r})
db.execute("PRAGMA journal_mode=WAL")
db.execute("CREATE TABLE t(x)")
db.execute("INSERT INTO t VALUES (1)")
db.commit()
print(db.execute("SELECT count(*) FROM t").fetchone()[0])
""")
        self.assertEqual(made.returncode, 0, made.stderr)
        self.assertEqual(made.stdout.strip(), "1")
        st = os.stat(os.path.join(a.backing, rel))
        self.assertEqual((st.st_uid, st.st_gid), (NOBODY, NOBODY))
        self.assertEqual(st.st_mode & 0o777, 0o644)

        # Another user may read (0644) but not write it.
        other = as_user(OTHER_USER, f"""
import os, errno
fd = os.open({path!r}, os.O_RDONLY)
os.close(fd)
try:
    os.open({path!r}, os.O_RDWR)
    print("opened for writing")
except PermissionError:
    print("EACCES")
""")
        self.assertEqual(other.returncode, 0, other.stderr)
        self.assertEqual(other.stdout.strip(), "EACCES")


class HiddenAndRefused(MountTest):
    def test_unowned_slots_and_stray_files_are_hidden_and_creating_there_is_remote(self):
        a = self.agent(ranges="0-8191")
        owned = tenants_in(0, 8191, 2)
        unowned = tenants_in(8192, 16383, 2)
        info = slots(*owned, *unowned)
        # Files that exist in the backing directory before the agent starts.
        stray_unowned = info[unowned[0]]["tenant_path"]
        bucket = stray_unowned.split("/")[0]
        os.makedirs(os.path.join(a.backing, bucket), exist_ok=True)
        with open(os.path.join(a.backing, stray_unowned), "wb") as f:
            f.write(b"not served here")
        with open(os.path.join(a.backing, bucket, "notes.txt"), "w") as f:
            f.write("no fleet file")
        link_rel = info[owned[1]]["tenant_path"]
        os.makedirs(os.path.join(a.backing, link_rel.split("/")[0]), exist_ok=True)
        os.symlink("/etc/passwd", os.path.join(a.backing, link_rel))
        a.start()
        a.wait_states("serving")

        listing = os.listdir(os.path.join(a.mount, bucket))
        self.assertNotIn(stray_unowned.split("/")[1], listing)
        self.assertNotIn("notes.txt", listing)
        self.assertEqual(sorted(n for n in os.listdir(a.mount)),
                         sorted([f"{b:03d}" for b in range(256)] + [".fleetfs"]))
        # A symlink out of the root is no fleet file.
        self.assertFalse(os.path.lexists(os.path.join(a.mount, link_rel)))

        for rel in (stray_unowned, info[unowned[1]]["tenant_path"]):
            path = os.path.join(a.mount, rel)
            with self.assertRaises(FileNotFoundError):
                os.stat(path)
            with self.assertRaises(sqlite3.OperationalError):
                sqlite3.connect(f"file:{path}?mode=rw", uri=True).execute("SELECT 1")
            with self.assertRaises(OSError) as created:
                os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            self.assertEqual(created.exception.errno, errno.EREMOTE, rel)
        with self.assertRaises(FileNotFoundError):
            os.stat(os.path.join(a.mount, bucket, "notes.txt"))
        # The stray file is untouched.
        with open(os.path.join(a.backing, stray_unowned), "rb") as f:
            self.assertEqual(f.read(), b"not served here")

    def test_names_that_are_no_fleet_files_and_directory_changes_are_refused(self):
        a = self.agent(ranges="0-16383").start()
        a.wait_states("serving")
        tenant, other = tenants_in(0, 16383, 2)
        info = slots(tenant, other)
        path = os.path.join(a.mount, info[tenant]["tenant_path"])
        sqlite3.connect(path).execute("CREATE TABLE t(x)").connection.close()
        bucket_dir = os.path.dirname(path)

        def refused(call, *args):
            with self.assertRaises(OSError) as e:
                call(*args)
            return e.exception.errno

        self.assertEqual(refused(os.open, os.path.join(bucket_dir, "notes.txt"),
                                 os.O_CREAT | os.O_RDWR), errno.EPERM)
        self.assertEqual(refused(os.mkdir, os.path.join(bucket_dir, "sub")), errno.EPERM)
        self.assertEqual(refused(os.mkdir, os.path.join(a.mount, "999")), errno.EPERM)
        self.assertEqual(refused(os.rmdir, bucket_dir), errno.EPERM)
        self.assertEqual(refused(os.symlink, path, os.path.join(bucket_dir, "x.db")),
                         errno.EPERM)
        other_path = os.path.join(a.mount, info[other]["tenant_path"])
        self.assertEqual(refused(os.rename, path, other_path), errno.EPERM)
        self.assertEqual(refused(os.link, path, other_path), errno.EPERM)
        # A tenant id in the wrong bucket is no fleet file either.
        wrong_bucket = "000" if not info[tenant]["tenant_path"].startswith("000") else "001"
        self.assertEqual(refused(os.open, os.path.join(a.mount, wrong_bucket, f"{tenant}.db"),
                                 os.O_CREAT | os.O_RDWR), errno.EPERM)
        # The control files are read-only, even for root.
        self.assertEqual(refused(os.open, os.path.join(a.mount, ".fleetfs", "status.json"),
                                 os.O_WRONLY), errno.EACCES)
        self.assertTrue(os.path.exists(path))

    def test_deleting_a_main_file_deletes_its_sidecars(self):
        a = self.agent(ranges="0-16383").start()
        a.wait_states("serving")
        tenant = tenants_in(0, 16383, 1, prefix="del")[0]
        rel = slots(tenant)[tenant]["tenant_path"]
        path = os.path.join(a.mount, rel)
        sqlite3.connect(path).execute("CREATE TABLE t(x)").connection.close()
        fd = os.open(path + "-journal", os.O_CREAT | os.O_RDWR, 0o644)
        os.write(fd, b"x" * 512)
        os.close(fd)
        self.assertTrue(os.path.exists(os.path.join(a.backing, rel + "-journal")))
        os.unlink(path)
        self.assertFalse(os.path.exists(path))
        self.assertFalse(os.path.exists(os.path.join(a.backing, rel)))
        self.assertFalse(os.path.exists(os.path.join(a.backing, rel + "-journal")))
        # The kernel forgets the sidecar's name too.
        wait_ok = False
        for _ in range(100):
            if not os.path.exists(path + "-journal"):
                wait_ok = True
                break
            __import__("time").sleep(0.01)
        self.assertTrue(wait_ok, "the sidecar is still visible through the mount")

    def test_no_create_refuses_new_tenants_but_serves_existing_ones(self):
        a = self.agent(ranges="0-16383").start()
        a.wait_states("serving")
        old, new = tenants_in(0, 16383, 2, prefix="nc")
        info = slots(old, new)
        db = sqlite3.connect(os.path.join(a.mount, info[old]["tenant_path"]))
        db.execute("CREATE TABLE t(x)")
        db.commit()
        db.close()
        self.assertEqual(a.stop(), 0)

        b = self.agent(name="a2", ranges="0-16383", extra=["--no-create"])
        b.backing, b.mount = a.backing, a.mount
        b.start()
        b.wait_states("serving")
        db = sqlite3.connect(os.path.join(b.mount, info[old]["tenant_path"]))
        db.execute("INSERT INTO t VALUES (1)")
        db.commit()
        db.close()
        with self.assertRaises(OSError) as e:
            os.open(os.path.join(b.mount, info[new]["tenant_path"]), os.O_CREAT | os.O_RDWR)
        self.assertEqual(e.exception.errno, errno.EPERM)



class Configuration(MountTest):
    def test_a_config_file_sets_slot_mode_and_flags_win_over_it(self):
        a = self.agent(ranges="0-16383", ttl=None)
        config = os.path.join(self.root, "agent.toml")
        with open(config, "w") as f:
            f.write('mode = "slot"\nttl = "45s"\nranges = ["0-99"]\nshutdown_grace = "2s"\n')
        a.extra = ["--config", config]
        a.ranges = "0-8191"  # the flag wins over the file's 0-99
        a.start()
        a.wait_states("serving")
        doc = a.status()
        self.assertEqual((doc["mode"], doc["ttl"]), ("slot", "45s"))
        self.assertEqual([r["range"] for r in doc["ranges"]], ["0-8191"])
        key = tenants_in(0, 8191, 1, prefix="slotkey")[0]
        rel = slots(key)[key]["slot_path"]
        db = sqlite3.connect(os.path.join(a.mount, rel))
        db.execute("CREATE TABLE t(x)")
        db.close()
        self.assertTrue(os.path.isfile(os.path.join(a.backing, rel)))
        # In slot mode a tenant-mode name is no fleet file.
        with self.assertRaises(OSError) as e:
            os.open(os.path.join(a.mount, slots(key)[key]["tenant_path"]),
                    os.O_CREAT | os.O_RDWR)
        self.assertEqual(e.exception.errno, errno.EPERM)

    def test_bad_configuration_is_refused_before_anything_is_touched(self):
        a = self.agent()
        config = os.path.join(self.root, "bad.toml")
        with open(config, "w") as f:
            f.write('ranges = "0-100"\nowners = "x"\n')
        for extra, expect in [(["--ranges", "9-1"], "ranges: "),
                              (["--ttl", "2s"], "ttl: "),
                              (["--admin", "0.0.0.0:1"], "admin: "),
                              (["--config", config], "unknown key 'owners'")]:
            argv = a.argv() + extra
            result = subprocess.run(argv, capture_output=True, text=True, timeout=30)
            self.assertEqual(result.returncode, 2, result.stderr)
            self.assertIn(expect, result.stderr)
            self.assertFalse(os.path.ismount(a.mount))
        self.assertFalse(os.path.exists(os.path.join(self.root, "control.db")))


if __name__ == "__main__":
    unittest.main()
