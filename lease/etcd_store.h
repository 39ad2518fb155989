// EtcdStore: the ownership table in an etcd cluster, for fleets of several
// hosts.
//
// Layout under PREFIX:
//   PREFIX/rows/AAAAA-BBBBB   one key per row (zero-padded, so key order is
//                             range order); value {"owner","epoch","ttl_ms"};
//                             attached to an etcd lease of its own
//   PREFIX/counter            the highest epoch ever granted (decimal), no lease
//   PREFIX/offers/AAAAA-BBBBB an offer: a released row that only one owner may
//                             claim; value {"owner","epoch","to","ttl_ms"}
//                             (the releasing owner and epoch, the target),
//                             on an etcd lease of the offer's window
// Other keys under PREFIX/ are not this fleet's (a fleet at PREFIX/b keeps
// its own there) and are ignored; a key under PREFIX/rows/ that is not a row
// is DataLoss. (So a fleet's prefix should not end in "/rows": its keys would
// sit among its parent fleet's rows.)
//
// Expiry is etcd's: a row whose etcd lease expired is gone, so every row
// present is live, and no host's wall clock takes part in safety. Renewing a
// row keeps its etcd lease alive.
//
// Each call loads what it needs, decides with OwnershipTable, and turns the
// decision into etcd operations:
// - Renew reads only its own row and keeps its lease alive: hosts renewing
//   different ranges never conflict.
// - Claim reads every row and the counter at one revision; a fresh grant is
//   one txn that compares the mod_revision of each of them (an absent counter
//   by create_revision 0), deletes the rows the table removed, and puts the
//   new row (on a new lease) and the counter. A failed comparison is a lost
//   race (or this txn landed by a member whose answer was lost, then sent
//   again: the row on the txn's own lease tells): its lease is revoked and
//   the claim decides again, within its time.
// - Release deletes its row by a txn on the row's mod_revision, then revokes
//   the row's lease. Offer does the same, and in that txn puts the offer key
//   on a new lease of the window: while etcd keeps it, the table sees a
//   lapsed row offered to the target (others are held), and the target's
//   fresh grant deletes it in its txn like any lapsed row it replaces. An
//   offer whose range a row overlaps is stale and ignored.
// Wall times in rows and answers are this host's wall time plus the time
// etcd says a lease has left: for display only.
//
// Time limits: Claim and Renew get ttl/3 (the refresher's limit); Release,
// Read, ReadSlots and ReadOffers get Options::call_timeout.
//
// Thread-safety: all calls are safe from any thread.
#pragma once

#include <memory>
#include <string>

#include "fleet/clock.h"
#include "lease/etcd_client.h"
#include "lease/ownership_store.h"

namespace fleetfs::lease {

class EtcdStore final : public OwnershipStore {
 public:
  struct Options {
    Millis call_timeout{10'000};  // Release and Read
  };

  // `prefix` has no leading or trailing '/'; `url` is for messages. The
  // clocks must outlive the store.
  EtcdStore(std::unique_ptr<EtcdClient> client, std::string prefix, std::string url,
            const WallClock& wall, const MonotonicClock& mono, Options options);

  Result<Decision> Claim(SlotRange range, const OwnerId& owner, Millis ttl,
                         std::uint64_t floor) override;
  Result<Decision> Renew(SlotRange range, const OwnerId& owner, Epoch epoch,
                         Millis ttl) override;
  Result<bool> Release(SlotRange range, const OwnerId& owner, Epoch epoch) override;
  Result<bool> Offer(SlotRange range, const OwnerId& owner, Epoch epoch, const OwnerId& to,
                     Millis window) override;
  bool keeps_offers() const override { return true; }
  Result<OwnershipTable> Read() override;
  // Every row is loaded, but etcd is asked the time left only of the rows
  // that hold `slots`; the table holds those rows and the counter.
  Result<OwnershipTable> ReadSlots(const std::vector<Slot>& slots) override;
  // Reads PREFIX/offers/ alone (not the rows, nor the counter), and asks
  // etcd the time left of each offer. When two offers clash (a slot or an
  // epoch in common), everything as Read does, so that the offers kept are
  // Read's.
  Result<OwnershipTable> ReadOffers() override;

  // How many lease timetolive calls a read has in flight at once: one call
  // per row, and a table may have 16384 rows.
  static constexpr std::size_t kTtlWorkers = 16;
  WallMs NowMs() const override { return wall_.NowMs(); }
  // Rows are already in this host's wall frame (its now + what etcd says a
  // lease has left), so nothing to convert; etcd alone decides expiry.
  WallMs ToWallMs(std::int64_t store_ms) const override { return store_ms; }
  std::string url() const override { return url_; }

  // The key of a row, "PREFIX/rows/00000-08191".
  std::string RowKey(SlotRange range) const;
  std::string CounterKey() const { return prefix_ + "/counter"; }
  // The key of an offer, "PREFIX/offers/00000-08191".
  std::string OfferKey(SlotRange range) const;
  const EtcdClient& client() const { return *client_; }

  struct StoredRow;  // a row as read: the row, its key's revisions, its lease
  struct Snapshot;   // rows and counter read at one revision

 private:
  // The calls above, which may throw (nlohmann, the allocator); each public
  // call wraps its own.
  Result<Decision> DoClaim(SlotRange range, const OwnerId& owner, Millis ttl, std::uint64_t floor);
  Result<Decision> DoRenew(SlotRange range, const OwnerId& owner, Epoch epoch, Millis ttl);
  // Release, or with `to` an offer to it for `window`.
  Result<bool> DoRelease(SlotRange range, const OwnerId& owner, Epoch epoch,
                         const std::optional<OwnerId>& to = std::nullopt, Millis window = {});
  Result<OwnershipTable> DoRead();
  Result<OwnershipTable> DoReadSlots(const std::vector<Slot>& slots);
  Result<OwnershipTable> DoReadOffers();
  // The offer a key under PREFIX/offers/ holds; nullopt (logged when
  // malformed) for a key that is not one of this fleet's offers.
  std::optional<StoredRow> OfferOf(const EtcdKv& kv) const;
  // Sets each row's expiry from the time etcd says its lease has left, with
  // up to kTtlWorkers calls at once, all within `deadline`. The first
  // failure ends it.
  Status FillExpiries(const std::vector<StoredRow*>& rows, MonoTime deadline);
  Result<Snapshot> Load(MonoTime deadline);
  Result<StoredRow> ParseRow(const EtcdKv& kv, SlotRange range) const;
  Result<StoredRow> ParseOffer(const EtcdKv& kv, SlotRange range) const;
  // The row of `range` alone, nullopt when there is none; DataLoss when the
  // answer holds any other key.
  Result<std::optional<StoredRow>> ReadRow(SlotRange range, MonoTime deadline);
  // Keeps `row`'s lease alive for `ttl` (never shorter than it is): a
  // keepalive, or a move to a longer lease when `ttl` is above the row's.
  // nullopt when the row or its lease is gone.
  Result<std::optional<Grant>> Extend(const StoredRow& row, Millis ttl, MonoTime deadline);

  // Whether `key` holds a row put on `lease`. A txn whose comparisons failed
  // may have landed all the same: the client sends a txn again to the next
  // member when the first gives no good answer, and the first may have
  // carried it out. `lease` is new and used by that one txn alone, so a row
  // on it is that txn's.
  Result<bool> Landed(const std::string& key, std::int64_t lease, MonoTime deadline);

  const std::unique_ptr<EtcdClient> client_;
  const std::string prefix_;
  const std::string url_;
  const WallClock& wall_;
  const MonotonicClock& mono_;
  const Options options_;
};

}  // namespace fleetfs::lease
