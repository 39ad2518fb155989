// OwnershipStore: where the ownership table lives, shared by every host that
// serves the fleet. Each call is one atomic decision of OwnershipTable, made
// at the store's time: load the rows, apply one rule, write the changes.
//
// Store time is the store's own frame, one that no wall-clock step moves (the
// SQLite store: this boot's CLOCK_BOOTTIME). The expiries of the rows and
// decisions a store returns are in it; only ToWallMs turns one into a wall
// time, and only for display.
//
// Thread-safety: implementations accept concurrent calls from any thread (a
// host refreshes its ranges at the same time). A call may block; callers put
// it on a worker and bound its time.
#pragma once

#include <string>
#include <vector>

#include "fleet/status.h"
#include "lease/ownership_table.h"

namespace fleetfs::lease {

class OwnershipStore {
 public:
  virtual ~OwnershipStore() = default;

  // OwnershipTable::Claim at the store's time, above `floor`.
  virtual Result<Decision> Claim(SlotRange range, const OwnerId& owner, Millis ttl,
                                 std::uint64_t floor) = 0;
  // OwnershipTable::Renew at the store's time: a Grant or Lost.
  virtual Result<Decision> Renew(SlotRange range, const OwnerId& owner, Epoch epoch,
                                 Millis ttl) = 0;
  // OwnershipTable::Release at the store's time.
  virtual Result<bool> Release(SlotRange range, const OwnerId& owner, Epoch epoch) = 0;
  // OwnershipTable::Offer at the store's time: release, and let only `to`
  // claim the range for `window`. A store that cannot keep offers answers
  // FailedPrecondition (and changes nothing).
  virtual Result<bool> Offer(SlotRange range, const OwnerId& owner, Epoch epoch,
                             const OwnerId& to, Millis window) = 0;
  // Whether Offer works here.
  // Pure, as every call here: a wrapper that forgot one would answer for
  // the store without asking it.
  virtual bool keeps_offers() const = 0;
  // The whole table (rows and counter), read in one transaction.
  virtual Result<OwnershipTable> Read() = 0;
  // The rows that hold `slots` and the counter: what `where` needs. A store
  // where reading a row's expiry costs a call (etcd) reads only these;
  // others read the whole table.
  virtual Result<OwnershipTable> ReadSlots(const std::vector<Slot>& slots) {
    (void)slots;
    return Read();
  }
  // A table that holds every offer standing now (each as its lapsed row
  // offered to the target, with the offer's end), for a host that polls for
  // offers to itself. A store where the whole table costs more to read
  // (etcd: every row) holds only the offers, and its counter is then only
  // theirs: not for a decision, nor for the counter. Others read the table.
  virtual Result<OwnershipTable> ReadOffers() { return Read(); }
  // The store's time now, in the frame of its expiries (not a wall time).
  virtual std::int64_t NowMs() const = 0;
  // A store time as a wall time, for display only: wall_now - store_now +
  // store_ms, so it moves with every step of the wall clock and is never to
  // be compared with anything of another host.
  virtual WallMs ToWallMs(std::int64_t store_ms) const = 0;
  // The store's URL, for messages.
  virtual std::string url() const = 0;
};

}  // namespace fleetfs::lease
