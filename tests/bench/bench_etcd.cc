// bench_etcd: what one etcd cluster sustains as an ownership store, measured
// through fleetfs's own EtcdStore (libcurl, the v3 JSON gateway). Run by
// tests/bench/bench_etcd.py, which starts the cluster; not a test.
//
//   bench_etcd renew   URL HOSTS RANGES SECONDS   renewals/s of HOSTS simulated
//                                                 hosts, each renewing RANGES
//                                                 ranges back to back
//   bench_etcd reads   URL CLIENTS SECONDS        the baseline: single-key
//                                                 linearizable reads/s through
//                                                 the same client
//   bench_etcd contend URL CLIENTS SECONDS        claim latency when CLIENTS
//                                                 race for one range (claim,
//                                                 and release when granted)
//
// Prints one JSON object on stdout.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "fleet/clock.h"
#include "lease/etcd_client.h"
#include "lease/store_url.h"

namespace fleetfs::lease {
namespace {

using Clock = std::chrono::steady_clock;
using Json = nlohmann::json;

struct Latencies {
  std::mutex mu;
  std::vector<double> ms;
  void Add(const std::vector<double>& more) {
    std::lock_guard lock(mu);
    ms.insert(ms.end(), more.begin(), more.end());
  }
  double Quantile(double q) {
    if (ms.empty()) return 0;
    std::sort(ms.begin(), ms.end());
    return ms[std::min(ms.size() - 1, static_cast<std::size_t>(q * ms.size()))];
  }
};

double MsSince(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

std::unique_ptr<OwnershipStore> Open(const std::string& url) {
  static SystemWallClock wall;
  auto store = OpenStore(url, wall, SqliteStore::Access::kExisting, {});
  if (!store.ok()) {
    std::cerr << "bench_etcd: " << store.status().message() << '\n';
    std::exit(1);
  }
  return std::move(store).value();
}

int Renew(const std::string& url, int hosts, int ranges, double seconds) {
  const int total = hosts * ranges;
  const int width = kSlotCount / total;
  if (width < 1) {
    std::cerr << "bench_etcd: more ranges than slots\n";
    return 2;
  }
  // Long leases: the claim storm of 64 hosts x 4 ranges takes over 30 s on
  // 2 cores, and the first grants must still be live when renewals start.
  // What a renewal costs does not depend on its ttl.
  const Millis ttl{300'000};
  std::atomic<long> renewals{0}, failures{0}, claim_retries{0};
  Latencies latencies;
  std::atomic<int> ready{0};
  const auto claims_began = Clock::now();
  std::atomic<bool> go{false}, stop{false};
  std::vector<std::thread> threads;
  for (int h = 0; h < hosts; ++h) {
    threads.emplace_back([&, h] {
      // Each simulated host has its own store and so its own connections.
      auto store = Open(url);
      const auto owner = OwnerId::Make("bench-host-" + std::to_string(h)).value();
      std::vector<std::pair<SlotRange, Epoch>> held;
      for (int r = 0; r < ranges; ++r) {
        const int first = (h * ranges + r) * width;
        const auto range =
            SlotRange::Make(static_cast<Slot>(first), static_cast<Slot>(first + width - 1)).value();
        // Every host claims at once, and every fresh grant moves the one
        // counter, so most txns lose a race: a claim that runs out of its
        // time is tried again, as the agent's next refresh would.
        for (int attempt = 1;; ++attempt) {
          auto decision = store->Claim(range, owner, ttl, 0);
          if (decision.ok() && std::holds_alternative<Grant>(*decision)) {
            held.emplace_back(range, std::get<Grant>(*decision).epoch);
            break;
          }
          claim_retries.fetch_add(1);
          if (attempt == 20) {
            std::cerr << "bench_etcd: claim of " << range.ToString() << " failed 20 times: "
                      << (decision.ok() ? DescribeDecision(*decision) : decision.status().message())
                      << '\n';
            std::exit(1);
          }
        }
      }
      ready.fetch_add(1);
      while (!go.load()) std::this_thread::yield();
      std::vector<double> mine;
      for (std::size_t i = 0; !stop.load(); i = (i + 1) % held.size()) {
        const auto t = Clock::now();
        auto decision = store->Renew(held[i].first, owner, held[i].second, ttl);
        if (decision.ok() && std::holds_alternative<Grant>(*decision)) {
          renewals.fetch_add(1);
          mine.push_back(MsSince(t));
        } else {
          failures.fetch_add(1);
        }
      }
      latencies.Add(mine);
      for (const auto& [range, epoch] : held) (void)store->Release(range, owner, epoch);
    });
  }
  while (ready.load() < hosts) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const double claims_s = MsSince(claims_began) / 1000;
  const auto start = Clock::now();
  go = true;
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  const double elapsed = MsSince(start) / 1000;
  for (auto& t : threads) t.join();
  std::cout << Json{{"kind", "renew"},
                    {"hosts", hosts},
                    {"ranges_per_host", ranges},
                    {"claims_s", claims_s},
                    {"claim_retries", claim_retries.load()},
                    {"seconds", elapsed},
                    {"renewals", renewals.load()},
                    {"failures", failures.load()},
                    {"per_second", renewals.load() / elapsed},
                    {"p50_ms", latencies.Quantile(0.5)},
                    {"p99_ms", latencies.Quantile(0.99)}}
                   .dump()
            << '\n';
  return 0;
}

int Reads(const std::string& url, int clients, double seconds) {
  auto parsed = ParseStoreUrl(url);
  if (!parsed.ok() || !parsed->is_etcd()) {
    std::cerr << "bench_etcd: not an etcd URL\n";
    return 2;
  }
  static const SystemMonotonicClock mono;
  std::atomic<long> reads{0}, failures{0};
  Latencies latencies;
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  const auto start = Clock::now();
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&] {
      EtcdClient client(parsed->endpoints, MakeCurlTransport({}), mono);
      const std::string key = parsed->prefix + "/counter";
      std::vector<double> mine;
      while (!stop.load()) {
        const auto t = Clock::now();
        auto got = client.Range(key, "", mono.Now() + Millis(10'000));
        if (got.ok()) {
          reads.fetch_add(1);
          mine.push_back(MsSince(t));
        } else {
          failures.fetch_add(1);
        }
      }
      latencies.Add(mine);
    });
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  const double elapsed = MsSince(start) / 1000;
  for (auto& t : threads) t.join();
  std::cout << Json{{"kind", "reads"},
                    {"clients", clients},
                    {"seconds", elapsed},
                    {"reads", reads.load()},
                    {"failures", failures.load()},
                    {"per_second", reads.load() / elapsed},
                    {"p50_ms", latencies.Quantile(0.5)},
                    {"p99_ms", latencies.Quantile(0.99)}}
                   .dump()
            << '\n';
  return 0;
}

int Contend(const std::string& url, int clients, double seconds) {
  const auto range = SlotRange::Make(0, 1023).value();
  const Millis ttl{30'000};
  std::atomic<long> claims{0}, grants{0}, held{0}, errors{0};
  Latencies latencies;
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  const auto start = Clock::now();
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      auto store = Open(url);
      const auto owner = OwnerId::Make("bench-claimer-" + std::to_string(c)).value();
      std::vector<double> mine;
      while (!stop.load()) {
        const auto t = Clock::now();
        auto decision = store->Claim(range, owner, ttl, 0);
        mine.push_back(MsSince(t));
        claims.fetch_add(1);
        if (!decision.ok()) {
          errors.fetch_add(1);
        } else if (const auto* grant = std::get_if<Grant>(&*decision)) {
          grants.fetch_add(1);
          (void)store->Release(range, owner, grant->epoch);
        } else {
          held.fetch_add(1);
        }
      }
      latencies.Add(mine);
    });
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  const double elapsed = MsSince(start) / 1000;
  for (auto& t : threads) t.join();
  std::cout << Json{{"kind", "contend"},
                    {"clients", clients},
                    {"seconds", elapsed},
                    {"claims", claims.load()},
                    {"grants", grants.load()},
                    {"held", held.load()},
                    {"errors", errors.load()},
                    {"p50_ms", latencies.Quantile(0.5)},
                    {"p99_ms", latencies.Quantile(0.99)}}
                   .dump()
            << '\n';
  return 0;
}

}  // namespace
}  // namespace fleetfs::lease

int main(int argc, char** argv) {
  using namespace fleetfs::lease;
  const std::vector<std::string> args(argv + 1, argv + argc);
  if (args.size() == 5 && args[0] == "renew") {
    return Renew(args[1], std::stoi(args[2]), std::stoi(args[3]), std::stod(args[4]));
  }
  if (args.size() == 4 && args[0] == "reads") {
    return Reads(args[1], std::stoi(args[2]), std::stod(args[3]));
  }
  if (args.size() == 4 && args[0] == "contend") {
    return Contend(args[1], std::stoi(args[2]), std::stod(args[3]));
  }
  std::cerr << "usage: bench_etcd renew URL HOSTS RANGES SECONDS | reads URL CLIENTS SECONDS | "
               "contend URL CLIENTS SECONDS\n";
  return 2;
}
