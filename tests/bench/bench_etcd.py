#!/usr/bin/env python3
"""fleetfs etcd store benchmark, in one run against one 3-member etcd cluster
on loopback (etcd-server from Debian, started here, one data dir per member):

  1. renewals per second the cluster sustains for N simulated hosts x R
     ranges each, every host renewing its ranges back to back through its own
     EtcdStore (what the agent runs), beside the baseline measured in the same
     run: single-key linearizable reads per second by N clients through the
     same client code. A renewal is two gateway calls (a read of its row and a
     keepalive of its lease), so a ratio near 0.5 means the store adds
     nothing beyond its calls;
  2. claim latency under contention: C clients racing for one range (claim;
     release when granted), p50 and p99, and how the claims ended;
  3. the largest fleet that implies at the default ttl (30 s): each range
     renews every ttl/3 = 10 s, so the cluster carries per_second x 10 ranges;
     the figure given keeps half of that as headroom. Beside each row: how
     long the N x R claims took when every host claimed at once (each fresh
     grant moves the one epoch counter, so concurrent claims lose races and
     retry), and how many claims ran out of their time (ttl/3) and were tried
     again, as an agent's next refresh would (leases of 300 s here, so the
     first grants are still live when the renewals begin; a claim's time
     is ttl/3, 100 s).

Not a test: it asserts nothing about speed. Usage (as root, after a build):
  python3 tests/bench/bench_etcd.py --bench build/tests/bench_etcd [--seconds 5]
"""
import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "etcd"))
from etcd_cluster import EtcdCluster  # noqa: E402

DEFAULT_TTL_S = 30


def run(bench, *args):
    p = subprocess.run([bench, *map(str, args)], capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        sys.exit(f"bench_etcd {args[0]} failed: {p.stderr.strip()}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bench", required=True, help="the built bench_etcd binary")
    p.add_argument("--seconds", type=float, default=5.0, help="length of each measurement")
    p.add_argument("--hosts", default="1,8,32,64", help="simulated host counts")
    p.add_argument("--ranges", default="1,4", help="ranges per host")
    p.add_argument("--claimers", default="2,8,32", help="racing claimers")
    a = p.parse_args()
    hosts = [int(x) for x in a.hosts.split(",")]
    ranges = [int(x) for x in a.ranges.split(",")]
    with EtcdCluster(3) as cluster:
        print(f"etcd cluster: 3 members on loopback; {os.cpu_count()} cores; "
              f"{a.seconds:g} s per measurement")
        print()
        print("1. renewals per second (N hosts x R ranges), beside single-key reads "
              "per second by N clients")
        print(f"{'N':>4} {'R':>3} {'renew/s':>9} {'p50 ms':>7} {'p99 ms':>7} {'fail':>5} "
              f"{'reads/s':>9} {'ratio':>6} {'claims s':>9} {'retries':>8}")
        best = None
        for n in hosts:
            base = run(a.bench, "reads", cluster.url("bench/reads"), n, a.seconds)
            for r in ranges:
                got = run(a.bench, "renew", cluster.url(f"bench/renew-{n}-{r}"), n, r,
                          a.seconds)
                ratio = got["per_second"] / base["per_second"] if base["per_second"] else 0
                print(f"{n:>4} {r:>3} {got['per_second']:>9.0f} {got['p50_ms']:>7.1f} "
                      f"{got['p99_ms']:>7.1f} {got['failures']:>5} {base['per_second']:>9.0f} "
                      f"{ratio:>6.2f} {got['claims_s']:>9.1f} {got['claim_retries']:>8}",
                      flush=True)
                if best is None or got["per_second"] > best["per_second"]:
                    best = got
        print()
        print("2. claim latency, C clients racing for one range (claim; release when granted)")
        print(f"{'C':>4} {'claims':>7} {'granted':>8} {'held':>6} {'errors':>7} {'p50 ms':>7} "
              f"{'p99 ms':>7}")
        for c in [int(x) for x in a.claimers.split(",")]:
            got = run(a.bench, "contend", cluster.url(f"bench/contend-{c}"), c, a.seconds)
            print(f"{c:>4} {got['claims']:>7} {got['grants']:>8} {got['held']:>6} "
                  f"{got['errors']:>7} {got['p50_ms']:>7.1f} {got['p99_ms']:>7.1f}", flush=True)
        print()
        period = DEFAULT_TTL_S / 3
        carried = best["per_second"] * period
        print(f"3. at the default ttl ({DEFAULT_TTL_S} s) each range renews every {period:g} s: "
              f"the best rate, {best['per_second']:.0f}/s "
              f"({best['hosts']} hosts x {best['ranges_per_host']} ranges), carries "
              f"{carried:.0f} ranges; with half kept as headroom, {carried / 2:.0f} ranges, "
              f"e.g. {int(carried / 2 / 4)} hosts of 4 ranges or {int(carried / 2 / 16)} "
              f"hosts of 16")


if __name__ == "__main__":
    main()
