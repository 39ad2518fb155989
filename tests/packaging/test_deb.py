"""The Debian package: packaging/build-deb.sh run on the build tree under test
(FLEETFS_BUILD_DIR), then the .deb checked as dpkg sees it.

It is installed with a real `dpkg -i` into a scratch root (`dpkg --root`),
not onto this machine: the test runs beside others and as root, and must
neither replace a fleetfs someone installed nor leave one behind. The scratch
root has no libraries registered, so the install forces past Depends; Depends
is checked instead against this machine's installed packages (the libraries
the binary was linked with), each with its version bound.
"""
import glob
import gzip
import os
import re
import shutil
import subprocess
import tempfile
import unittest

SOURCE = os.environ.get("FLEETFS_SOURCE_DIR", "")
BUILD = os.environ.get("FLEETFS_BUILD_DIR", "")
VERSION = os.environ.get("FLEETFS_VERSION", "")

FILES = ["/usr/bin/fleetfs", "/etc/fleetfs/agent.toml", "/usr/share/man/man1/fleetfs.1.gz",
         "/lib/systemd/system/fleetfs.service"]


def run(*argv, **kwargs):
    return subprocess.run(argv, check=True, capture_output=True, text=True, **kwargs).stdout


class DebTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not (SOURCE and BUILD and VERSION):
            raise unittest.SkipTest("FLEETFS_SOURCE_DIR, FLEETFS_BUILD_DIR and FLEETFS_VERSION "
                                    "are set by ctest")
        cls.tmp = tempfile.mkdtemp(prefix="fleetfs-deb-", dir="/tmp")
        try:
            # --out relative to the caller's directory, not the source tree.
            out = run("bash", os.path.join(SOURCE, "packaging", "build-deb.sh"),
                      "--build-dir", BUILD, "--out", "out", cwd=cls.tmp)
            cls.deb = out.strip().splitlines()[-1]
            if not cls.deb.startswith(os.path.join(cls.tmp, "out") + "/"):
                raise AssertionError(f"--out out from {cls.tmp} made {cls.deb}")
        except BaseException:
            shutil.rmtree(cls.tmp, ignore_errors=True)
            raise

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def setUp(self):
        self.root = tempfile.mkdtemp(prefix="root-", dir=self.tmp)
        admin = os.path.join(self.root, "var", "lib", "dpkg")
        for d in ("info", "updates", "triggers"):
            os.makedirs(os.path.join(admin, d))
        for f in ("status", "available"):
            open(os.path.join(admin, f), "w").close()
        # dpkg runs the maintainer scripts chrooted into the root: give it a
        # shell and the tools they use, and no systemd (/run/systemd/system).
        for tool in ("/bin/sh", "/bin/rm"):
            self.copy_into_root(tool)

    def copy_into_root(self, path):
        real = os.path.realpath(path)
        libs = re.findall(r"(/\S+) \(0x", run("ldd", real))
        for f, dest in [(real, path)] + [(lib, lib) for lib in libs]:
            target = self.root + dest
            os.makedirs(os.path.dirname(target), exist_ok=True)
            if not os.path.exists(target):
                shutil.copy(os.path.realpath(f), target)

    def dpkg(self, *args):
        return run("dpkg", f"--root={self.root}", "--force-depends", *args)

    def field(self, name):
        return run("dpkg-deb", "-f", self.deb, name).strip()

    def test_the_file_name_and_control_fields(self):
        self.assertEqual(os.path.basename(self.deb), f"fleetfs_{VERSION}_amd64.deb")
        self.assertEqual(self.field("Package"), "fleetfs")
        self.assertEqual(self.field("Version"), VERSION)
        self.assertEqual(self.field("Architecture"), "amd64")

    def test_depends_lists_the_linked_libraries_and_this_machine_satisfies_them(self):
        depends = self.field("Depends")
        names = {}
        for clause in depends.split(","):
            m = re.fullmatch(r"\s*([a-z0-9.+-]+)(?::any)?\s*(?:\((\S+)\s+([^)]+)\))?\s*", clause)
            self.assertIsNotNone(m, f"a Depends clause dpkg-shlibdeps would not write: {clause!r}")
            names[m.group(1)] = (m.group(2), m.group(3))
        for lib in ("libc6", "libfuse3-3", "libsqlite3-0", "libuv1", "libsystemd0", "libcurl4",
                    "libzstd1", "fuse3"):
            self.assertIn(lib, names, f"Depends: {depends}")
        self.assertTrue(any(n.startswith("libspdlog") for n in names), f"Depends: {depends}")
        for name, (op, version) in names.items():
            installed = run("dpkg-query", "-W", "-f=${Version}", name)
            if op:
                ok = subprocess.run(["dpkg", "--compare-versions", installed, op, version])
                self.assertEqual(ok.returncode, 0, f"{name} {installed} is not {op} {version}")

    def test_the_package_holds_the_files_and_marks_the_configuration_a_conffile(self):
        listing = run("dpkg-deb", "-c", self.deb)
        paths = {line.split()[-1].lstrip(".") for line in listing.splitlines()}
        for f in FILES:
            self.assertIn(f, paths)
        self.assertFalse([p for p in paths if p.startswith(("/usr/etc", "/usr/lib/systemd"))],
                         "the configuration or the unit left under the prefix")
        self.assertEqual(run("dpkg-deb", "-I", self.deb, "conffiles").split(),
                         ["/etc/fleetfs/agent.toml"])

    def test_dpkg_installs_it_keeps_an_edited_conffile_and_removes_it(self):
        self.dpkg("-i", self.deb)
        for f in FILES:
            self.assertTrue(os.path.isfile(self.root + f), f)
        binary = self.root + "/usr/bin/fleetfs"
        self.assertEqual(run(binary, "--version").strip(), f"fleetfs {VERSION}")
        self.assertIn("Status: install ok installed", self.dpkg("-s", "fleetfs"))
        self.assertRegex(self.dpkg("-s", "fleetfs"), r"Conffiles:\n /etc/fleetfs/agent.toml [0-9a-f]{32}")
        with open(os.path.join(SOURCE, "packaging", "agent.toml")) as f:
            shipped = f.read()
        with open(self.root + "/etc/fleetfs/agent.toml") as f:
            self.assertEqual(f.read(), shipped)

        conf = self.root + "/etc/fleetfs/agent.toml"
        with open(conf, "a") as f:
            f.write('owner = "host-edited"\n')
        self.dpkg("-i", self.deb)  # the same version again: an edited conffile stays
        with open(conf) as f:
            self.assertIn('owner = "host-edited"', f.read())

        self.dpkg("-r", "fleetfs")
        self.assertFalse(os.path.exists(binary))
        self.assertTrue(os.path.exists(conf), "remove keeps the conffile")
        self.dpkg("-P", "fleetfs")
        self.assertFalse(os.path.exists(conf), "purge takes the conffile")

    def test_maintainer_scripts_are_shell_and_run_without_systemd(self):
        control = os.path.join(self.root, "control")
        run("dpkg-deb", "-e", self.deb, control)
        for script in ("postinst", "prerm", "postrm"):
            path = os.path.join(control, script)
            self.assertTrue(os.access(path, os.X_OK), f"{script} missing or not executable")
            subprocess.run(["sh", "-n", path], check=True)
            with open(path) as f:
                text = f.read()
            for line in text.splitlines():
                if "systemctl" in line and not line.lstrip().startswith("#"):
                    self.assertIn("/run/systemd/system", text, f"{script}: unguarded systemctl")
        with open(os.path.join(control, "prerm")) as f:
            self.assertIn("systemctl stop fleetfs.service", f.read())
        with open(os.path.join(control, "postinst")) as f:
            self.assertIn("try-restart fleetfs.service", f.read())
        # Install, upgrade (the same version again), remove, purge: each runs
        # the scripts in the root, where systemd does not run.
        self.dpkg("-i", self.deb)
        self.dpkg("-i", self.deb)
        self.dpkg("-r", "fleetfs")
        self.dpkg("-P", "fleetfs")

    def test_a_plain_install_keeps_to_its_prefix(self):
        prefix = os.path.join(self.root, "prefix")
        run("cmake", "--install", BUILD, "--prefix", prefix)
        with open(os.path.join(BUILD, "install_manifest.txt")) as f:
            installed = f.read().split()
        self.assertTrue(installed)
        for path in installed:
            self.assertTrue(path.startswith(prefix + "/"), f"installed outside --prefix: {path}")
        for f in ("bin/fleetfs", "etc/fleetfs/agent.toml", "lib/systemd/system/fleetfs.service"):
            self.assertTrue(os.path.isfile(os.path.join(prefix, f)), f)

    def test_the_man_page_renders_with_every_command(self):
        self.dpkg("-i", self.deb)
        page = self.root + "/usr/share/man/man1/fleetfs.1.gz"
        with gzip.open(page, "rt") as f:
            source = f.read()
        self.assertIn(".TH FLEETFS \"1\"", source)
        r = subprocess.run(["man", "--warnings", "-l", "-P", "cat", page], capture_output=True,
                           text=True, env={**os.environ, "MANWIDTH": "100", "LC_ALL": "C.UTF-8"})
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stderr, "", "groff warnings")
        text = r.stdout
        self.assertIn("fleetfs - volume agent for fleets of SQLite databases", text)
        binary = self.root + "/usr/bin/fleetfs"
        top = run(binary, "--help")
        listed = top.split("Subcommands:\n")[1].split("\n\n")[0]
        commands = re.findall(r"^  ([a-z]+)\s", listed, re.M)
        self.assertIn("mount", commands)
        headings = set(re.findall(r"^   (fleetfs [a-z ]+)$", text, re.M))
        for cmd in commands:
            self.assertIn(f"fleetfs {cmd}", headings)
        for heading in ("fleetfs lease claim", "fleetfs replica verify"):
            self.assertIn(heading, headings)
        for word in ("--config", "--shutdown-grace", "NOTIFY_SOCKET", "/etc/fleetfs/agent.toml"):
            self.assertIn(word, text)

    def test_the_unit_passes_systemd_analyze_verify(self):
        self.assertIsNotNone(shutil.which("systemd-analyze"),
                             "systemd-analyze is not installed: run packaging/install-deps.sh "
                             "(it installs the systemd package for this check)")
        self.dpkg("-i", self.deb)
        unit = self.root + "/lib/systemd/system/fleetfs.service"
        with open(unit) as f:
            text = f.read()
        for line in ("Type=notify", "NotifyAccess=main", "WatchdogSec=", "LimitNOFILE=",
                     "After=network-online.target",
                     "ExecStart=/usr/bin/fleetfs mount --config /etc/fleetfs/agent.toml"):
            self.assertIn(line, text)
        # What every installed system has and the unit refers to: the targets
        # its default dependencies name, and mkdir (ExecStartPre). Documentation=
        # is not looked up (--man=no): the man page is the test above's.
        for target in glob.glob("/lib/systemd/system/*.target"):
            shutil.copy(target, self.root + "/lib/systemd/system/")
        os.makedirs(self.root + "/bin", exist_ok=True)
        shutil.copy("/bin/mkdir", self.root + "/bin/mkdir")
        r = subprocess.run(["systemd-analyze", "verify", "--man=no", f"--root={self.root}",
                            "/lib/systemd/system/fleetfs.service"],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertNotIn("fleetfs.service", r.stdout + r.stderr, "warnings about the unit")


if __name__ == "__main__":
    unittest.main()
