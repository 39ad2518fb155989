// OwnershipTable: the shared table of who owns which slot range, as a pure
// state machine. No I/O; the time of each decision is passed in.
//
// Invariants (checked by a randomized property test):
// - rows never overlap, and every row's epoch is unique;
// - the counter (last_epoch) is the highest epoch ever granted, and it and
//   every slot's epoch never go down; an epoch is never reused, even after
//   the rows that held it are gone;
// - a live lease (expires > now) of another owner is never taken;
// - a lease is never shortened by a late call (a call that timed out may
//   land after a newer one).
//
// Every store applies exactly one of Claim, Renew, Release or Offer per
// atomic decision (load rows, decide, write changes, in one transaction).
//
// Offers (a planned handover): Offer ends the owner's lease now, as Release
// does, and for a window after it only the named owner may claim the range;
// anyone else is refused as if the range were held. The target's claim must
// cover the whole offered range (a part would erase the rest of the offer
// with the lapsed row). An offer changes no epoch: the target's claim takes a
// new one as usual, so fencing is unchanged. Once the window passes
// unclaimed, anyone may claim.
//
// Thread-safety: none; a value that one thread owns at a time.
#pragma once

#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "fleet/clock.h"
#include "fleet/status.h"
#include "lease/epoch.h"
#include "lease/owner_id.h"
#include "lease/slot_range.h"

namespace fleetfs::lease {

// Times here (`now`, every lease_expires_ms) are in the store's frame
// (OwnershipStore::NowMs), whatever clock that is; the table only compares
// them. OwnershipStore::ToWallMs turns one into a wall time for display.
struct OwnershipRow {
  SlotRange range;
  OwnerId owner;
  Epoch epoch;
  WallMs lease_expires_ms = 0;  // store time
  // Set by Offer: until offer_expires_ms (store time) only this owner may
  // claim the range. Meaningless once the row is live again or gone.
  std::optional<OwnerId> offered_to{};
  WallMs offer_expires_ms = 0;

  // Whether an offer to someone else than `who` still stands at `now`.
  bool OfferedAwayFrom(const OwnerId& who, WallMs now) const {
    return offered_to && offer_expires_ms > now && !(*offered_to == who);
  }

  bool operator==(const OwnershipRow&) const = default;
};

// A claim or renewal that went through.
struct Grant {
  SlotRange range;
  Epoch epoch;
  WallMs lease_expires_ms = 0;
  bool fresh = false;  // the claim made a new epoch

  bool operator==(const Grant&) const = default;
};

// A claim refused because another live lease covers part of the range, or
// because a released range is offered to another owner (`offered`: then
// `owner` is that owner and the expiry is the offer's end).
struct Held {
  SlotRange range;  // the holding row's range
  std::string owner;
  WallMs lease_expires_ms = 0;
  bool offered = false;

  bool operator==(const Held&) const = default;
};

// A renewal refused because the row is no longer (range, owner, epoch).
struct Lost {
  SlotRange range;

  bool operator==(const Lost&) const = default;
};

// What a claim or renew decided. Failures to decide at all are a Status.
using Decision = std::variant<Grant, Held, Lost>;

// "held by b until 2026-11-29 15:04:05 UTC" and the like, for test messages:
// it shows store times as if they were wall times.
std::string DescribeDecision(const Decision& decision);

class OwnershipTable {
 public:
  OwnershipTable() = default;

  // A table from stored rows and the stored counter. The counter is raised to
  // the highest row epoch if it is lower. DataLoss when the rows break an
  // invariant (overlap, a repeated or zero epoch): the store is corrupt.
  static Result<OwnershipTable> FromParts(std::vector<OwnershipRow> rows, std::uint64_t last_epoch);

  // Sorted by range.
  const std::vector<OwnershipRow>& rows() const { return rows_; }
  Epoch last_epoch() const { return Epoch(last_epoch_); }

  // The row that holds `slot`, or null.
  const OwnershipRow* RowFor(Slot slot) const;

  // Whether a write by `owner` under `epoch` to `slot` is current.
  bool Admits(Slot slot, const OwnerId& owner, Epoch epoch) const;

  // Claims `range` for `owner` at `now` for `ttl`, at an epoch above `floor`.
  // - Held (offered) when an overlapping row is offered to another owner and
  //   the offer still stands, whoever's row it is; and when it is offered to
  //   `owner` but `range` does not cover all of it.
  // - Held when a live lease overlaps the range, unless it is the owner's own
  //   row with the same bounds (a range of another shape is never taken while
  //   live, even from its owner: an old process may still serve it).
  // - The owner's own row with the same bounds and an epoch above `floor`
  //   keeps its epoch (a restart is not a new owner); its lease is extended,
  //   never shortened.
  // - Otherwise the lapsed rows overlapping the range go, and one row with
  //   epoch max(counter, floor) + 1 replaces them.
  // FailedPrecondition only when the epoch counter is exhausted.
  Result<Decision> Claim(SlotRange range, const OwnerId& owner, WallMs now, Millis ttl,
                         std::uint64_t floor = 0);

  // Extends the lease of exactly (range, owner, epoch), even after a lapse
  // nobody used; never shortens it. Lost otherwise, and Lost while the row
  // stands offered to another owner (the owner gave it away).
  Decision Renew(SlotRange range, const OwnerId& owner, Epoch epoch, WallMs now, Millis ttl);

  // Ends the lease of exactly (range, owner, epoch) at `now` (never later than
  // it already ends). Returns whether the row was still the owner's.
  bool Release(SlotRange range, const OwnerId& owner, Epoch epoch, WallMs now);

  // Release, and offer the range to `to` until now + `window`: only `to` may
  // claim it meanwhile. Offering to oneself is a plain release. Returns
  // whether the row was still the owner's.
  bool Offer(SlotRange range, const OwnerId& owner, Epoch epoch, WallMs now, const OwnerId& to,
             Millis window);

  bool operator==(const OwnershipTable&) const = default;

 private:
  OwnershipRow* Exact(SlotRange range, const OwnerId& owner, Epoch epoch);

  std::vector<OwnershipRow> rows_;  // sorted by range, never overlapping
  std::uint64_t last_epoch_ = 0;
};

// "2026-11-29 15:04:05 UTC" for a wall time in ms.
std::string FormatWallTime(WallMs ms, bool local = false);

}  // namespace fleetfs::lease
