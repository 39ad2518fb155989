"""cmake/build_info.cmake, the build-time source of fleetfs_build_info's commit,
run as the build runs it, against throwaway git repositories.

    python3 build_info_test.py [CMAKE]
"""
import os
import pathlib
import subprocess
import sys
import tempfile
import unittest

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "cmake" / "build_info.cmake"
TEMPLATE = ROOT / "agent" / "build_info.h.in"
CMAKE = sys.argv.pop(1) if len(sys.argv) > 1 else "cmake"


def git(repo, *args):
    return subprocess.run(["git", "-c", "safe.directory=*", "-C", str(repo), *args], check=True,
                          capture_output=True, text=True).stdout.strip()


class BuildInfoScript(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        self.repo = pathlib.Path(self.tmp.name) / "src"
        self.repo.mkdir()
        self.out = pathlib.Path(self.tmp.name) / "build_info.h"
        git(self.repo, "init", "-q")
        git(self.repo, "config", "user.email", "t@example.com")
        git(self.repo, "config", "user.name", "t")
        (self.repo / "a.txt").write_text("one\n")
        git(self.repo, "add", "a.txt")
        git(self.repo, "commit", "-qm", "one")

    def run_script(self, source=None):
        subprocess.run([CMAKE, f"-DSOURCE_DIR={source or self.repo}", f"-DOUTPUT={self.out}",
                        f"-DTEMPLATE={TEMPLATE}", "-DVERSION=9.9.9", "-DCOMPILER=GNU 12",
                        "-P", str(SCRIPT)], check=True, capture_output=True)
        return self.out.read_text()

    def commit_in(self, text):
        for line in text.splitlines():
            if "kBuildCommit" in line:
                return line.split('"')[1]
        self.fail(f"no kBuildCommit in {text}")

    def test_the_commit_is_head_and_follows_a_new_commit(self):
        self.assertEqual(self.commit_in(self.run_script()), git(self.repo, "rev-parse", "--short", "HEAD"))
        (self.repo / "a.txt").write_text("two\n")
        git(self.repo, "commit", "-qam", "two")
        self.assertEqual(self.commit_in(self.run_script()), git(self.repo, "rev-parse", "--short", "HEAD"))

    def test_uncommitted_changes_to_tracked_files_mark_it_dirty(self):
        head = git(self.repo, "rev-parse", "--short", "HEAD")
        (self.repo / "untracked.txt").write_text("x\n")  # a build dir in the tree, say
        self.assertEqual(self.commit_in(self.run_script()), head)
        (self.repo / "a.txt").write_text("changed\n")
        self.assertEqual(self.commit_in(self.run_script()), head + "-dirty")

    def test_an_unchanged_commit_leaves_the_header_untouched(self):
        self.run_script()
        os.utime(self.out, ns=(1_000_000_000, 1_000_000_000))
        self.run_script()
        self.assertEqual(self.out.stat().st_mtime_ns, 1_000_000_000)

    def test_a_directory_inside_another_checkout_is_unknown(self):
        sub = self.repo / "tarball"
        sub.mkdir()
        self.assertEqual(self.commit_in(self.run_script(sub)), "unknown")

    @unittest.skipUnless(os.geteuid() == 0, "needs root to give the checkout to another user")
    def test_a_checkout_owned_by_another_user_still_has_its_commit(self):
        head = git(self.repo, "rev-parse", "--short", "HEAD")
        for dirpath, dirnames, filenames in os.walk(self.repo):
            for name in [dirpath] + [os.path.join(dirpath, n) for n in dirnames + filenames]:
                os.chown(name, 65534, 65534, follow_symlinks=False)
        self.assertEqual(self.commit_in(self.run_script()), head)


if __name__ == "__main__":
    unittest.main(verbosity=2)
