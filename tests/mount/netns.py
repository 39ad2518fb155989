"""Hosts as network namespaces, for multi-host tests on one machine.

Each Host is a network namespace joined to the test's own namespace by a veth
pair: the host reaches services of the test (etcd) at `gateway`, and
partition() takes the link down so nothing passes either way until heal().
Only the network is separate: an agent started through wrap() keeps the
test's mount namespace, so its FUSE mount stays visible to the test, and
its status file is read from the mount as on one host.

Names carry the test process's pid, so parallel tests do not collide, and a
namespace left by a killed run is removed by the next run with the same pid
at worst (cleanup() is idempotent).
"""
import os
import subprocess


def _ip(*args, check=True):
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


class Host:
    """One host: a network namespace with one link to the test's namespace."""

    # 10.201.0.0/16, a /30 per host: the test's side .1, the host's side .2.
    def __init__(self, index):
        if not 0 <= index < 16000:
            raise ValueError(f"host index {index}: 0 to 15999")
        tag = f"{os.getpid() % 100000}x{index}"
        self.index = index
        self.netns = f"fleetfs-{tag}"
        self.outer_link = f"fo{tag}"[:15]
        self.inner_link = f"fi{tag}"[:15]
        block = index * 4
        self.gateway = f"10.201.{block // 256}.{block % 256 + 1}"
        self.address = f"10.201.{block // 256}.{block % 256 + 2}"
        self.created = False

    def create(self):
        self.cleanup()
        _ip("netns", "add", self.netns)
        self.created = True
        _ip("link", "add", self.outer_link, "type", "veth", "peer", "name", self.inner_link)
        _ip("link", "set", self.inner_link, "netns", self.netns)
        _ip("addr", "add", f"{self.gateway}/30", "dev", self.outer_link)
        _ip("link", "set", self.outer_link, "up")
        self.run_ip("addr", "add", f"{self.address}/30", "dev", self.inner_link)
        self.run_ip("link", "set", self.inner_link, "up")
        self.run_ip("link", "set", "lo", "up")
        return self

    def run_ip(self, *args):
        return _ip("-n", self.netns, *args)

    def wrap(self, argv):
        """argv, run inside this host's network namespace."""
        return ["nsenter", f"--net=/run/netns/{self.netns}", "--", *argv]

    def partition(self):
        """Cuts the host off: its packets to and from the test's side are dropped."""
        _ip("link", "set", self.outer_link, "down")

    def heal(self):
        _ip("link", "set", self.outer_link, "up")
        # An address resolution that failed during the partition is cached
        # as FAILED for a while; without the flush, a heal looks like "no
        # route to host" for seconds.
        _ip("neigh", "flush", "dev", self.outer_link, check=False)
        self.run_ip("neigh", "flush", "dev", self.inner_link)

    def cleanup(self):
        # Deleting one end of a veth pair deletes both.
        _ip("link", "del", self.outer_link, check=False)
        _ip("netns", "del", self.netns, check=False)
        self.created = False
