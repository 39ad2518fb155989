// A randomized property test of the ownership table's invariants: random
// sequences of claim, claim above a floor, renew, release, offer (a release
// to one named owner) and renew with any epoch (stale ones included) by 3
// owners over 64 slots at advancing times.
//
// FLEETFS_PROPERTY_SEED replays a run; FLEETFS_PROPERTY_SEQUENCES sets how many
// sequences run (default 20000). A failure prints the seed, the sequence and
// every step up to the one that broke an invariant.
#include <gtest/gtest.h>

#include <cstdlib>
#include <random>
#include <sstream>

#include "lease/ownership_table.h"
#include "lease/test_support.h"

namespace fleetfs::lease {
namespace {

using testing::Owner;
using testing::Range;

constexpr int kSlots = 64;
constexpr Millis kTtl{50};
constexpr Millis kShortTtl{20};

struct Checker {
  std::ostringstream steps;
  std::string failure;

  void Check(bool ok, const std::string& what) {
    if (!ok && failure.empty()) failure = what;
  }
};

// Everything that must hold between the table before and after one step.
// A slot may lose its row only when the row had lapsed (a claim of another
// shape absorbed it); any later row for it gets an epoch above the counter, so
// its epoch still never goes down.
void CheckInvariants(const OwnershipTable& before, const OwnershipTable& after, WallMs now,
                     Checker& c) {
  const auto& rows = after.rows();
  for (std::size_t i = 0; i < rows.size(); ++i) {
    c.Check(rows[i].epoch <= after.last_epoch(), "a row's epoch is above the counter");
    c.Check(rows[i].epoch.value() > 0, "a row has epoch 0");
    for (std::size_t j = i + 1; j < rows.size(); ++j) {
      c.Check(!rows[i].range.Overlaps(rows[j].range), "two rows overlap");
      c.Check(rows[i].epoch != rows[j].epoch, "two rows share an epoch");
    }
  }
  c.Check(after.last_epoch() >= before.last_epoch(), "the counter went down");
  for (Slot slot = 0; slot < kSlots; ++slot) {
    const OwnershipRow* old_row = before.RowFor(slot);
    const OwnershipRow* new_row = after.RowFor(slot);
    if (old_row == nullptr) continue;
    if (new_row == nullptr) {
      c.Check(old_row->lease_expires_ms <= now, "a live row vanished");
      c.Check(!(old_row->offered_to && old_row->offer_expires_ms > now),
              "a standing offer vanished outside its target's claim");
      continue;
    }
    // A standing offer binds its whole range: only its target may be granted
    // a slot of it before the window ends.
    const bool offer_stands = old_row->offered_to && old_row->offer_expires_ms > now &&
                              old_row->lease_expires_ms <= now;
    if (offer_stands && new_row->epoch != old_row->epoch) {
      c.Check(new_row->owner == *old_row->offered_to, "a standing offer went to another owner");
    }
    c.Check(new_row->epoch >= old_row->epoch, "a slot's epoch went down");
    if (new_row->epoch > old_row->epoch) {
      c.Check(!after.Admits(slot, old_row->owner, old_row->epoch), "a stale epoch is admitted");
    } else {
      c.Check(new_row->owner == old_row->owner, "a slot changed owner at the same epoch");
    }
  }
}

// Whether a claim must be refused: a live lease that is not the same claim,
// or a standing offer to another owner, or to `who` but not all in `range`.
bool Blocked(const OwnershipTable& table, SlotRange range, const OwnerId& who, WallMs now) {
  for (const auto& row : table.rows()) {
    if (row.range.Overlaps(range) && !(row.owner == who && row.range == range) &&
        row.lease_expires_ms > now) {
      return true;
    }
    const bool covered = range.first() <= row.range.first() && row.range.last() <= range.last();
    if (row.range.Overlaps(range) && row.offered_to && row.offer_expires_ms > now &&
        (!(*row.offered_to == who) || !covered)) {
      return true;
    }
  }
  return false;
}

const OwnershipRow* Exact(const OwnershipTable& table, SlotRange range) {
  for (const auto& row : table.rows()) {
    if (row.range == range) return &row;
  }
  return nullptr;
}

// Runs one random sequence; returns a failure description or "".
std::string RunSequence(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  const OwnerId owners[] = {Owner("a"), Owner("b"), Owner("c")};
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  OwnershipTable table;
  WallMs now = 0;
  Checker c;
  const int steps = uniform(1, 60);
  for (int step = 0; step < steps && c.failure.empty(); ++step) {
    const OwnershipTable before = table;
    const int a = uniform(0, kSlots - 1);
    const int b = uniform(0, kSlots - 1);
    SlotRange range = Range(std::min(a, b), std::max(a, b));
    // Half the steps name a row's exact range: renewals, releases and offers
    // need one, and a random range almost never is.
    if (!table.rows().empty() && uniform(0, 1) == 0) {
      range = table.rows()[uniform(0, static_cast<int>(table.rows().size()) - 1)].range;
    }
    const OwnerId& who = owners[uniform(0, 2)];
    now += uniform(0, 40);
    // Some calls decide late (a wall-clock step back, a call that waited) or
    // with a shorter ttl (a reconfigured host): neither may shorten a lease.
    const WallMs base = now;
    if (uniform(0, 5) == 0) now -= uniform(1, 30);
    const Millis ttl = uniform(0, 3) == 0 ? kShortTtl : kTtl;
    const int op = uniform(0, 5);
    c.steps << "  step " << step << " t=" << now << " ttl=" << ttl.count() << ": ";
    if (op == 0 || op == 1) {
      const std::uint64_t floor = op == 1 ? static_cast<std::uint64_t>(uniform(0, 12)) : 0;
      c.steps << "claim " << range.ToString() << " by " << who.str() << " floor " << floor;
      const auto result = table.Claim(range, who, now, ttl, floor);
      c.Check(result.ok(), "a claim failed to decide");
      if (!result.ok()) break;
      const bool blocked = Blocked(before, range, who, now);
      c.Check(std::holds_alternative<Held>(*result) == blocked,
              blocked ? "a live lease of another owner was taken" : "a free range was refused");
      if (const auto* grant = std::get_if<Grant>(&*result)) {
        const OwnershipRow* own = Exact(before, range);
        const bool keeps = own != nullptr && own->owner == who && own->epoch.value() > floor;
        c.Check(grant->fresh == !keeps, "a claim kept or changed its epoch against the rules");
        if (grant->fresh) {
          c.Check(grant->epoch.value() ==
                      std::max(before.last_epoch().value(), floor) + 1,
                  "a fresh grant is not max(counter, floor) + 1");
        } else {
          c.Check(grant->lease_expires_ms >= own->lease_expires_ms, "a reclaim shortened a lease");
        }
        c.Check(table.Admits(range.first(), who, grant->epoch), "a grant is not admitted");
      } else {
        c.Check(table == before, "a refused claim changed the table");
      }
    } else if (op == 2) {
      const OwnershipRow* row = Exact(before, range);
      if (row == nullptr) {
        c.steps << "(no row to renew)\n";
        now = base;
        continue;
      }
      c.steps << "renew " << range.ToString() << " by " << who.str() << " at its epoch "
              << row->epoch.value();
      const Decision result = table.Renew(range, who, row->epoch, now, ttl);
      const bool given_away =
          row->offered_to && row->offer_expires_ms > now && !(*row->offered_to == who);
      c.Check(std::holds_alternative<Grant>(result) == (row->owner == who && !given_away),
              "renew of the exact row did not follow its owner, or renewed a row it offered away");
      if (const auto* grant = std::get_if<Grant>(&result)) {
        c.Check(grant->lease_expires_ms >= row->lease_expires_ms, "a renew shortened a lease");
      }
    } else if (op == 3) {
      const Epoch epoch(static_cast<std::uint64_t>(uniform(1, 12)));
      c.steps << "renew " << range.ToString() << " by " << who.str() << " at any epoch "
              << epoch.value();
      const Decision result = table.Renew(range, who, epoch, now, ttl);
      const OwnershipRow* row = Exact(before, range);
      const bool holds = row != nullptr && row->owner == who && row->epoch == epoch &&
                         !(row->offered_to && row->offer_expires_ms > now &&
                           !(*row->offered_to == who));
      c.Check(std::holds_alternative<Grant>(result) == holds, "a stale epoch renewed");
      if (!holds) c.Check(table == before, "a refused renew changed the table");
    } else if (op == 5) {
      const OwnershipRow* row = Exact(before, range);
      const Epoch epoch = row != nullptr ? row->epoch : Epoch(1);
      const OwnerId& to = owners[uniform(0, 2)];
      c.steps << "offer " << range.ToString() << " by " << who.str() << " epoch "
              << epoch.value() << " to " << to.str();
      const bool offered = table.Offer(range, who, epoch, now, to, ttl);
      c.Check(offered == (row != nullptr && row->owner == who),
              "offer did not follow the exact row");
      if (offered) {
        c.Check(Exact(table, range)->lease_expires_ms <= row->lease_expires_ms,
                "an offer lengthened a lease");
        c.Check(to == who || !Blocked(table, range, to, now),
                "an offered range is not free for its target");
        for (const OwnerId& other : owners) {
          if (to == who || other == to || other == who) continue;  // to itself: a release
          c.Check(Blocked(table, range, other, now), "an offered range is free for another owner");
        }
      } else {
        c.Check(table == before, "a refused offer changed the table");
      }
    } else {
      const OwnershipRow* row = Exact(before, range);
      const Epoch epoch = row != nullptr ? row->epoch : Epoch(1);
      c.steps << "release " << range.ToString() << " by " << who.str() << " epoch "
              << epoch.value();
      const bool released = table.Release(range, who, epoch, now);
      c.Check(released == (row != nullptr && row->owner == who),
              "release did not follow the exact row");
      if (released) {
        c.Check(Exact(table, range)->lease_expires_ms <= row->lease_expires_ms,
                "a release lengthened a lease");
        const bool still_offered = row->offered_to && row->offer_expires_ms > now;
        c.Check(still_offered || !Blocked(table, range, Owner(who.str() == "a" ? "b" : "a"), now),
                "a released range is not free at once");
      }
    }
    c.steps << "\n";
    CheckInvariants(before, table, now, c);
    now = base;
  }
  if (c.failure.empty()) return "";
  return c.failure + "\n" + c.steps.str();
}

TEST(OwnershipTableProperty, random_sequences_keep_every_invariant) {
  testing::RunPropertySequences(20000, "table sequences", RunSequence);
}

// The checker itself must catch a broken table: a table that hands a live
// range to another owner is detected.
TEST(OwnershipTableProperty, the_checker_catches_a_taken_live_lease) {
  OwnershipTable before;
  (void)before.Claim(Range(0, 9), Owner("a"), 0, kTtl);
  auto broken = OwnershipTable::FromParts({OwnershipRow{Range(0, 9), Owner("b"), Epoch(1), 50}}, 1);
  ASSERT_TRUE(broken.ok());
  Checker c;
  CheckInvariants(before, *broken, 10, c);
  EXPECT_EQ(c.failure, "a slot changed owner at the same epoch");
  auto emptied = OwnershipTable::FromParts({}, 1);
  Checker vanished;
  CheckInvariants(*broken, *emptied, 10, vanished);
  EXPECT_EQ(vanished.failure, "a live row vanished");
  Checker down;
  CheckInvariants(*broken, OwnershipTable(), 60, down);
  EXPECT_EQ(down.failure, "the counter went down");
}

}  // namespace
}  // namespace fleetfs::lease
