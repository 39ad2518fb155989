// No split brain, as a property: three hosts with overlapping range shapes
// share one ownership table. Random interleavings of refreshes, store
// decisions, late and lost answers, partitions, fences, time jumps and
// shutdowns, with the hosts' wall clocks apart by up to ttl/3. After every
// step no slot is served by two hosts, and a host that serves a slot holds its
// row in the table.
//
// A store call lives through three events: sent (BeginRefresh), decided by
// the store at its then-current time, and answered (which may come after the
// refresh ended: a late answer). FLEETFS_PROPERTY_SEED replays a run;
// FLEETFS_PROPERTY_SEQUENCES sets how many run (default 3000).
#include <gtest/gtest.h>

#include <cstdlib>
#include <deque>
#include <random>
#include <sstream>

#include "lease/host_ownership.h"
#include "lease/test_support.h"

namespace fleetfs::lease {
namespace {

using testing::Owner;
using testing::Range;

constexpr Millis kTtl{30'000};
constexpr int kSlots = 64;

struct Call {
  int host;
  int process;  // which start of the host sent it
  StoreCall call;
  std::optional<Result<Decision>> decided;  // set once the store decided
};

struct Host {
  HostOwnership ownership;
  int process = 0;
  // This host's wall clock minus the true time. Each host's store decisions
  // use its own wall clock (the SQLite store reads the deciding host's
  // clock); DESIGN promises safety while they agree within ttl/3.
  WallMs skew = 0;
  MonoTime refresh_started{};
  bool partitioned = false;
};

// Runs one random sequence; returns a failure description or "".
std::string RunSequence(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const std::vector<std::vector<SlotRange>> shapes = {
      {Range(0, 31), Range(32, 63)}, {Range(0, 63)}, {Range(16, 47)}};
  std::vector<Host> hosts;
  for (int i = 0; i < 3; ++i) {
    hosts.push_back(Host{*HostOwnership::Make(Owner("h" + std::to_string(i)), shapes[i], kTtl)});
    hosts.back().skew = uniform(-4'999, 4'999);  // any two agree within 10 s
  }
  OwnershipTable table;
  // One clock for the store (wall, ms) and the hosts (monotonic): they run at
  // the same rate, which is what ttl/3 of slack protects.
  MonoTime now{Millis(10'000'000)};
  WallMs wall = 1'700'000'000'000;
  std::deque<Call> calls;
  std::ostringstream log;

  auto decide = [&](Call& c) {
    const OwnerId& owner = hosts[c.host].ownership.owner();
    if (hosts[c.host].partitioned) {
      c.decided = Result<Decision>(Unavailable("partitioned"));
    } else if (c.call.kind == StoreCall::Kind::kClaim) {
      c.decided = table.Claim(c.call.range, owner, wall + hosts[c.host].skew, kTtl, c.call.floor);
    } else {
      c.decided = Result<Decision>(
          table.Renew(c.call.range, owner, c.call.epoch, wall + hosts[c.host].skew, kTtl));
    }
  };

  const int steps = uniform(20, 200);
  for (int step = 0; step < steps; ++step) {
    const int h = uniform(0, 2);
    Host& host = hosts[h];
    const int event = uniform(0, 9);
    log << "  step " << step << " t+" << (now.time_since_epoch().count() / 1'000'000 - 10'000'000)
        << "ms host " << h << ": ";
    if (event <= 1) {  // time passes
      const int by = uniform(0, 12'000);
      now += Millis(by);
      wall += by;
      log << "advance " << by << "ms";
    } else if (event == 2) {  // a refresh starts, or ends at its time limit
      if (!host.ownership.refresh_open()) {
        host.refresh_started = now;
        for (const StoreCall& call : host.ownership.BeginRefresh(now)) {
          calls.push_back(Call{h, host.process, call, std::nullopt});
        }
        log << "begin refresh";
      } else if (now >= host.refresh_started + host.ownership.refresh_interval()) {
        host.ownership.EndRefresh();
        log << "end refresh at its time limit";
      } else {
        log << "(refresh open)";
      }
    } else if (event <= 5 && !calls.empty()) {  // the store decides a call
      Call& c = calls[uniform(0, static_cast<int>(calls.size()) - 1)];
      if (!c.decided) {
        decide(c);
        log << "store decides call " << c.call.id << " of host " << c.host;
      } else {
        log << "(already decided)";
      }
    } else if (event <= 7 && !calls.empty()) {  // a decided answer arrives
      const int i = uniform(0, static_cast<int>(calls.size()) - 1);
      if (calls[i].decided) {
        Call c = calls[i];
        calls.erase(calls.begin() + i);
        Host& owner = hosts[c.host];
        if (c.process != owner.process) {
          // Its process is gone: the store decided, but nobody hears it.
          log << "answer call " << c.call.id << " to a stopped process\n";
          continue;
        }
        owner.ownership.Answer(c.call.id, *c.decided);
        if (owner.ownership.refresh_open() && owner.ownership.AllAnswered()) {
          owner.ownership.EndRefresh();
        }
        log << "answer call " << c.call.id << " to host " << c.host;
      } else {
        log << "(not decided yet)";
      }
    } else if (event == 8) {  // a partition starts or heals; or a fence
      if (uniform(0, 1) == 0) {
        host.partitioned = !host.partitioned;
        log << (host.partitioned ? "partition" : "heal");
      } else {
        const Slot slot = static_cast<Slot>(uniform(0, kSlots - 1));
        const Epoch newer(table.last_epoch().value() + static_cast<std::uint64_t>(uniform(0, 2)));
        host.ownership.Lose(slot, newer);
        log << "fence slot " << slot << " at epoch " << newer.value();
      }
    } else if (event == 9 && uniform(0, 20) == 0) {  // shutdown, then a restart
      const ReleasePlan plan = host.ownership.PlanRelease(/*all_shipped=*/true);
      for (const ReleaseCall& release : plan.calls) {
        table.Release(release.range, host.ownership.owner(), release.epoch, wall + host.skew);
      }
      // Calls of the old process may still be decided by the store; their
      // answers go to nobody.
      host.ownership = *HostOwnership::Make(host.ownership.owner(), shapes[h], kTtl);
      ++host.process;
      log << "restart (released " << plan.calls.size() << ")";
    } else {
      log << "(nothing)";
    }
    log << "\n";

    // The invariants. A host that serves a slot holds its row: the owner is
    // this host and the row's epoch is the served one or newer. Newer happens
    // without harm when a call of a stopped process of the same owner, sent
    // with a fence floor, lands after the new process reclaimed the range (a
    // network store may apply a request after its client died): the table
    // then gives that owner a higher epoch, the live process's next renewal is
    // lost, and it reclaims. No other host can serve meanwhile: the row and
    // its live lease are still this owner's.
    for (Slot slot = 0; slot < kSlots; ++slot) {
      int serving = 0;
      for (const Host& each : hosts) {
        const auto epoch = each.ownership.EpochFor(slot, now);
        if (!epoch) continue;
        ++serving;
        const OwnershipRow* row = table.RowFor(slot);
        if (row == nullptr || row->owner != each.ownership.owner() || row->epoch < *epoch) {
          return "host " + each.ownership.owner().str() + " serves slot " +
                 std::to_string(slot) + " at epoch " + epoch->ToString() +
                 " but the table's row is " +
                 (row == nullptr ? std::string("gone")
                                 : row->owner.str() + "'s at epoch " + row->epoch.ToString()) +
                 "\n" + log.str();
        }
      }
      if (serving > 1) {
        return "split brain: slot " + std::to_string(slot) + " is served by " +
               std::to_string(serving) + " hosts\n" + log.str();
      }
    }
  }
  return "";
}

TEST(HostOwnershipProperty, no_slot_is_ever_served_by_two_hosts) {
  testing::RunPropertySequences(3000, "host sequences (no split brain)", RunSequence);
}

}  // namespace
}  // namespace fleetfs::lease
