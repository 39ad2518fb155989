#include "lease/etcd_store.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cstdio>
#include <mutex>
#include <system_error>
#include <thread>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "lease/bounded_json.h"
#include "lease/lease_ttl.h"

namespace fleetfs::lease {

using Json = nlohmann::json;

struct EtcdStore::StoredRow {
  OwnershipRow row;
  std::string key;
  std::int64_t mod_revision = 0;
  std::int64_t lease = 0;
  Millis ttl{0};  // the lease length the row was granted or last extended for
  bool offer = false;  // an offer key: a lapsed row offered to row.offered_to
};

struct EtcdStore::Snapshot {
  std::vector<StoredRow> rows;  // in key order, so range order
  std::uint64_t counter = 0;
  std::int64_t counter_mod_revision = 0;  // 0: no counter key yet
};

namespace {

// Rows present are live: etcd removes a row when its lease expires, so the
// table sees no expiry but "not yet".
constexpr WallMs kLive = INT64_MAX;

// etcd leases are whole seconds: round up, so etcd never ends a lease before
// the ttl the host counts on.
std::int64_t TtlSeconds(Millis ttl) { return (ttl.count() + 999) / 1000; }

std::string RowValue(const OwnerId& owner, Epoch epoch, Millis ttl) {
  return Json{{"owner", owner.str()}, {"epoch", epoch.value()}, {"ttl_ms", ttl.count()}}.dump();
}

// A whole number in 0..max, or nullopt.
std::optional<std::uint64_t> Decimal(std::string_view text, std::uint64_t max) {
  std::uint64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || value > max) {
    return std::nullopt;
  }
  return value;
}

// An unsigned JSON integer in min..max, or nullopt.
std::optional<std::uint64_t> JsonWhole(const Json& object, const char* name, std::uint64_t min,
                                       std::uint64_t max) {
  const auto it = object.find(name);
  if (it == object.end() || !it->is_number_integer()) return std::nullopt;
  if (!it->is_number_unsigned() && it->get<std::int64_t>() < 0) return std::nullopt;
  const std::uint64_t value = it->get<std::uint64_t>();
  if (value < min || value > max) return std::nullopt;
  return value;
}

}  // namespace

EtcdStore::EtcdStore(std::unique_ptr<EtcdClient> client, std::string prefix, std::string url,
                     const WallClock& wall, const MonotonicClock& mono, Options options)
    : client_(std::move(client)),
      prefix_(std::move(prefix)),
      url_(std::move(url)),
      wall_(wall),
      mono_(mono),
      options_(options) {}

std::string EtcdStore::OfferKey(SlotRange range) const {
  char name[16];
  std::snprintf(name, sizeof name, "%05d-%05d", range.first(), range.last());
  return prefix_ + "/offers/" + name;
}

Result<EtcdStore::StoredRow> EtcdStore::ParseOffer(const EtcdKv& kv, SlotRange range) const {
  const std::string where = "etcd key '" + Printable(kv.key) + "' (an offer)";
  const auto parsed = ParseBoundedJson(kv.value, {.max_depth = 2, .max_values = 64});
  const Json value = parsed.ok() ? *parsed : Json();
  if (!parsed.ok() || !value.is_object()) {
    return DataLoss(where + ": its value is not a JSON object {owner, epoch, to, ttl_ms}");
  }
  auto text = [&](const char* name) -> Result<OwnerId> {
    const auto it = value.find(name);
    if (it == value.end() || !it->is_string()) {
      return DataLoss(where + ": field '" + name + "' must be a string");
    }
    auto id = OwnerId::Make(it->get<std::string>());
    if (!id.ok()) return DataLoss(where + ": field '" + name + "': " + id.status().message());
    return *id;
  };
  FLEETFS_ASSIGN_OR_RETURN(const OwnerId owner, text("owner"));
  FLEETFS_ASSIGN_OR_RETURN(const OwnerId to, text("to"));
  const auto epoch = JsonWhole(value, "epoch", 1, Epoch::kMax);
  if (!epoch) return DataLoss(where + ": field 'epoch' must be a whole number from 1 to 2^63-1");
  if (kv.lease == 0) {
    return DataLoss(where + ": it has no etcd lease, so it would never end; every offer is "
                            "attached to a lease of its own");
  }
  StoredRow row{OwnershipRow{range, owner, Epoch(*epoch), /*lapsed*/ 0}, kv.key, kv.mod_revision,
                kv.lease, Millis(0), true};
  row.row.offered_to = to;
  row.row.offer_expires_ms = kLive;
  return row;
}

std::optional<EtcdStore::StoredRow> EtcdStore::OfferOf(const EtcdKv& kv) const {
  const std::string offers_prefix = prefix_ + "/offers/";
  // A name that is no range is not ours (a fleet nested at PREFIX/offers).
  const std::string_view name = std::string_view(kv.key).substr(offers_prefix.size());
  if (name.size() != 11 || name[5] != '-') return std::nullopt;
  const auto first = Decimal(name.substr(0, 5), kLastSlot);
  const auto last = Decimal(name.substr(6), kLastSlot);
  if (!first || !last) return std::nullopt;
  auto made = SlotRange::Make(static_cast<int>(*first), static_cast<int>(*last));
  if (!made.ok() || OfferKey(*made) != kv.key) return std::nullopt;
  // An offer is a hint (a claim decides by the rows and the counter): a
  // malformed one is skipped, not made every read of the fleet fail.
  auto offer = ParseOffer(kv, *made);
  if (!offer.ok()) {
    spdlog::warn("{}; the offer is ignored", offer.status().message());
    return std::nullopt;
  }
  return std::move(*offer);
}

std::string EtcdStore::RowKey(SlotRange range) const {
  char name[16];
  std::snprintf(name, sizeof name, "%05d-%05d", range.first(), range.last());
  return prefix_ + "/rows/" + name;
}

Result<EtcdStore::StoredRow> EtcdStore::ParseRow(const EtcdKv& kv, SlotRange range) const {
  const std::string where = "etcd key '" + Printable(kv.key) + "' (an ownership row)";
  // A row is one flat object of three fields.
  const auto parsed = ParseBoundedJson(kv.value, {.max_depth = 2, .max_values = 64});
  const Json value = parsed.ok() ? *parsed : Json();
  if (!parsed.ok() || !value.is_object()) {
    return DataLoss(where + ": its value is not a JSON object {owner, epoch, ttl_ms} ('" +
                    Printable(std::string_view(kv.value).substr(0, 80)) + "')");
  }
  const auto owner_it = value.find("owner");
  if (owner_it == value.end() || !owner_it->is_string()) {
    return DataLoss(where + ": field 'owner' must be a string");
  }
  auto owner = OwnerId::Make(owner_it->get<std::string>());
  if (!owner.ok()) return DataLoss(where + ": field 'owner': " + owner.status().message());
  const auto epoch = JsonWhole(value, "epoch", 1, Epoch::kMax);
  if (!epoch) return DataLoss(where + ": field 'epoch' must be a whole number from 1 to 2^63-1");
  const auto ttl = JsonWhole(value, "ttl_ms", kMinTtl.count(), kMaxTtl.count());
  if (!ttl) {
    return DataLoss(where + ": field 'ttl_ms' must be a whole number of ms from " +
                    std::to_string(kMinTtl.count()) + " to " + std::to_string(kMaxTtl.count()));
  }
  if (kv.lease == 0) {
    return DataLoss(where + ": it has no etcd lease, so it would never expire; every row is "
                            "attached to a lease of its own");
  }
  return StoredRow{OwnershipRow{range, *owner, Epoch(*epoch), kLive}, kv.key, kv.mod_revision,
                   kv.lease, Millis(*ttl)};
}

Result<EtcdStore::Snapshot> EtcdStore::Load(MonoTime deadline) {
  const std::string rows_prefix = prefix_ + "/rows/";
  const std::string offers_prefix = prefix_ + "/offers/";
  std::vector<StoredRow> offers;
  // [PREFIX/, PREFIX0): every key under the prefix ('0' follows '/').
  FLEETFS_ASSIGN_OR_RETURN(EtcdRange range, client_->Range(prefix_ + "/", prefix_ + "0", deadline));
  Snapshot snapshot;
  for (const EtcdKv& kv : range.kvs) {
    if (kv.key == CounterKey()) {
      const auto counter = Decimal(kv.value, Epoch::kMax);
      if (!counter) {
        return DataLoss("etcd key '" + Printable(kv.key) + "' (the epoch counter): its value '" +
                        Printable(std::string_view(kv.value).substr(0, 40)) +
                        "' is not a whole number from 0 to 2^63-1");
      }
      snapshot.counter = *counter;
      snapshot.counter_mod_revision = kv.mod_revision;
      continue;
    }
    if (kv.key.starts_with(offers_prefix)) {
      if (auto offer = OfferOf(kv)) offers.push_back(std::move(*offer));
      continue;
    }
    // Keys that are neither the counter nor under PREFIX/rows/ are not
    // ours: a fleet at PREFIX/b shares the range read, and must not block
    // this one (nor this one it).
    if (!kv.key.starts_with(rows_prefix)) continue;
    const std::string_view name = std::string_view(kv.key).substr(rows_prefix.size());
    // "AAAAA-BBBBB", zero-padded: the canonical key of a valid range.
    std::optional<SlotRange> bounds;
    if (name.size() == 11 && name[5] == '-') {
      const auto first = Decimal(name.substr(0, 5), kLastSlot);
      const auto last = Decimal(name.substr(6), kLastSlot);
      if (first && last) {
        auto made = SlotRange::Make(static_cast<int>(*first), static_cast<int>(*last));
        if (made.ok() && RowKey(*made) == kv.key) bounds = *made;
      }
    }
    if (!bounds) {
      return DataLoss("etcd key '" + Printable(kv.key) + "' under the prefix '" + prefix_ +
                      "' is neither a row (" + rows_prefix +
                      "AAAAA-BBBBB, a slot range in 0-16383) nor the counter; the keys under " +
                      rows_prefix + " belong to this fleet alone");
    }
    FLEETFS_ASSIGN_OR_RETURN(StoredRow row, ParseRow(kv, *bounds));
    snapshot.rows.push_back(std::move(row));
  }
  // An offer stands only while no row overlaps it (a claim of the range
  // deletes it in its txn; a row beside it is a claim that did not know of
  // offers), never over another offer, and never at the epoch of a row or
  // another offer (its row's epoch, deleted with the offer's put: a second
  // holder of it is stale or planted, and a table with two would fail
  // every read and claim of the fleet).
  std::vector<StoredRow> kept;
  for (StoredRow& offer : offers) {
    // An offered epoch was granted, so it is at most the counter; a bigger
    // one is not an offer (and must not raise the next epoch to the limit).
    if (offer.row.epoch.value() > snapshot.counter) {
      spdlog::warn("etcd key '{}' (an offer): epoch {} is above the epoch counter {}; the offer "
                   "is ignored",
                   Printable(offer.key), offer.row.epoch.value(), snapshot.counter);
      continue;
    }
    auto overlaps = [&](const StoredRow& other) {
      return other.row.range.Overlaps(offer.row.range) || other.row.epoch == offer.row.epoch;
    };
    if (std::any_of(snapshot.rows.begin(), snapshot.rows.end(), overlaps) ||
        std::any_of(kept.begin(), kept.end(), overlaps)) {
      continue;
    }
    kept.push_back(std::move(offer));
  }
  for (StoredRow& offer : kept) snapshot.rows.push_back(std::move(offer));
  std::sort(snapshot.rows.begin(), snapshot.rows.end(),
            [](const StoredRow& a, const StoredRow& b) { return a.row.range < b.row.range; });
  return snapshot;
}

namespace {

Result<OwnershipTable> TableOf(const std::vector<EtcdStore::StoredRow>& stored,
                               std::uint64_t counter, const std::string& url);

}  // namespace

Result<std::optional<Grant>> EtcdStore::Extend(const StoredRow& row, Millis ttl,
                                               MonoTime deadline) {
  const WallMs now = wall_.NowMs();
  if (ttl <= row.ttl) {
    // The lease keeps its own (longer or equal) length: never shortened.
    FLEETFS_ASSIGN_OR_RETURN(const std::optional<std::int64_t> left,
                             client_->KeepAlive(row.lease, deadline));
    if (!left) return std::optional<Grant>();
    return std::optional(Grant{row.row.range, row.row.epoch, now + *left * 1000, false});
  }
  // A longer ttl than the row's lease: the row moves to a new lease of that
  // length, by a txn on its mod_revision (only its own row is touched).
  FLEETFS_ASSIGN_OR_RETURN(const EtcdLease lease, client_->Grant(TtlSeconds(ttl), deadline));
  EtcdTxn txn;
  txn.compare.push_back({row.key, EtcdCompare::Target::kModRevision, row.mod_revision});
  txn.success.push_back({EtcdOp::Kind::kPut, row.key, RowValue(row.row.owner, row.row.epoch, ttl),
                         lease.id});
  const Result<EtcdTxnResult> result = client_->Txn(txn, deadline);
  bool moved = result.ok() && result->succeeded;
  if (result.ok() && !moved) {
    FLEETFS_ASSIGN_OR_RETURN(moved, Landed(row.key, lease.id, deadline));
  }
  if (!moved) {
    (void)client_->Revoke(lease.id, deadline);
    if (!result.ok()) return result.status();
    return std::optional<Grant>();
  }
  (void)client_->Revoke(row.lease, deadline);  // nothing is attached to it any more
  return std::optional(Grant{row.row.range, row.row.epoch, now + lease.ttl_s * 1000, false});
}

Result<std::optional<EtcdStore::StoredRow>> EtcdStore::ReadRow(SlotRange range,
                                                               MonoTime deadline) {
  const std::string key = RowKey(range);
  FLEETFS_ASSIGN_OR_RETURN(const EtcdRange read, client_->Range(key, "", deadline));
  if (read.kvs.empty()) return std::optional<StoredRow>();
  if (read.kvs.size() != 1 || read.kvs.front().key != key) {
    return DataLoss("etcd store " + url_ + ": the read of row '" + key + "' was answered with " +
                    std::to_string(read.kvs.size()) + " key(s), the first '" +
                    Printable(read.kvs.front().key.substr(0, 200)) +
                    "'; a read of one key answers that key or nothing");
  }
  FLEETFS_ASSIGN_OR_RETURN(StoredRow row, ParseRow(read.kvs.front(), range));
  return std::optional<StoredRow>(std::move(row));
}

Result<bool> EtcdStore::Landed(const std::string& key, std::int64_t lease, MonoTime deadline) {
  FLEETFS_ASSIGN_OR_RETURN(const EtcdRange read, client_->Range(key, "", deadline));
  return !read.kvs.empty() && read.kvs.front().key == key && read.kvs.front().lease == lease;
}

Result<Decision> EtcdStore::DoClaim(SlotRange range, const OwnerId& owner, Millis ttl,
                                  std::uint64_t floor) {
  const MonoTime deadline = mono_.Now() + ttl / 3;
  // The last txn's comparisons failed: a rival's write, or this very txn,
  // which a member carried out and whose answer was lost, so the client sent
  // it again to the next member. The next read tells: the row on the txn's
  // own lease (new, and used by that txn alone) is there or not.
  struct Pending {
    EtcdLease lease;  // id 0: none
    Epoch epoch;
  };
  Pending pending;
  for (int races = 0;; ++races) {
    if (races > 0 && mono_.Now() >= deadline) {
      if (pending.lease.id != 0) (void)client_->Revoke(pending.lease.id, deadline);
      return Status(Code::kDeadlineExceeded,
                    "claim of slot range " + range.ToString() + " on " + url_ + ": lost " +
                        std::to_string(races) +
                        " races to other claims and ran out of its time limit (ttl/3)");
    }
    Result<Snapshot> loaded = Load(deadline);
    const WallMs now = wall_.NowMs();
    if (pending.lease.id != 0) {
      if (loaded.ok()) {
        const std::string key = RowKey(range);
        for (const StoredRow& row : loaded->rows) {
          if (row.key == key && row.lease == pending.lease.id) {
            return Decision(Grant{range, pending.epoch, now + pending.lease.ttl_s * 1000, true});
          }
        }
      }
      // Lost the race (or unknown: then the row goes with its lease).
      (void)client_->Revoke(pending.lease.id, deadline);
      pending = Pending{};
    }
    if (!loaded.ok()) return loaded.status();
    Snapshot& snapshot = *loaded;
    FLEETFS_ASSIGN_OR_RETURN(OwnershipTable table,
                             TableOf(snapshot.rows, snapshot.counter, url_));
    OwnershipTable after = table;
    FLEETFS_ASSIGN_OR_RETURN(Decision decision, after.Claim(range, owner, now, ttl, floor));
    auto stored = [&](SlotRange bounds) -> const StoredRow* {
      for (const StoredRow& row : snapshot.rows) {
        if (row.row.range == bounds) return &row;
      }
      return nullptr;
    };

    if (const auto* held = std::get_if<Held>(&decision)) {
      const StoredRow* holder = stored(held->range);
      FLEETFS_ASSIGN_OR_RETURN(const std::optional<std::int64_t> left,
                               client_->TimeToLive(holder->lease, deadline));
      if (!left) continue;  // it expired just now: decide again
      return Decision(Held{held->range, held->owner, now + *left * 1000, held->offered});
    }
    if (!std::holds_alternative<Grant>(decision)) return decision;
    const Grant& grant = std::get<Grant>(decision);
    if (!grant.fresh) {
      FLEETFS_ASSIGN_OR_RETURN(const std::optional<Grant> extended,
                               Extend(*stored(range), ttl, deadline));
      if (!extended) continue;  // its lease ended meanwhile: decide again
      return Decision(*extended);
    }

    // A new epoch: one txn, valid only if nothing the decision read changed.
    // The decision read the rows that overlap the range and the counter; the
    // other rows cannot change it, and every new row moves the counter. (So
    // the txn stays far below etcd's 128 comparisons however many rows the
    // table has, and renewals of other ranges never fail it.)
    FLEETFS_ASSIGN_OR_RETURN(const EtcdLease lease, client_->Grant(TtlSeconds(ttl), deadline));
    const std::string key = RowKey(range);
    EtcdTxn txn;
    bool key_read = false;
    for (const StoredRow& row : snapshot.rows) {
      if (!row.row.range.Overlaps(range)) continue;
      txn.compare.push_back({row.key, EtcdCompare::Target::kModRevision, row.mod_revision});
      key_read = key_read || row.key == key;
      // An offer is never kept: the new row replaces it under its own key.
      const bool kept =
          !row.offer && std::any_of(after.rows().begin(), after.rows().end(),
                                    [&](const OwnershipRow& r) { return r.range == row.row.range; });
      // The new row's own key is overwritten by its put (a txn may not
      // touch one key twice).
      if (!kept && row.key != key) txn.success.push_back({EtcdOp::Kind::kDelete, row.key, "", 0});
    }
    if (!key_read) txn.compare.push_back({key, EtcdCompare::Target::kCreateRevision, 0});
    if (snapshot.counter_mod_revision != 0) {
      txn.compare.push_back(
          {CounterKey(), EtcdCompare::Target::kModRevision, snapshot.counter_mod_revision});
    } else {
      txn.compare.push_back({CounterKey(), EtcdCompare::Target::kCreateRevision, 0});
    }
    txn.success.push_back({EtcdOp::Kind::kPut, key, RowValue(owner, grant.epoch, ttl), lease.id});
    txn.success.push_back(
        {EtcdOp::Kind::kPut, CounterKey(), std::to_string(grant.epoch.value()), 0});
    const Result<EtcdTxnResult> result = client_->Txn(txn, deadline);
    if (result.ok() && result->succeeded) {
      return Decision(Grant{range, grant.epoch, now + lease.ttl_s * 1000, true});
    }
    if (result.ok()) {
      pending = Pending{lease, grant.epoch};
      continue;
    }
    // No answer: the lease goes, and with it the row if the txn did land
    // after all.
    (void)client_->Revoke(lease.id, deadline);
    return result.status();
  }
}

Result<Decision> EtcdStore::DoRenew(SlotRange range, const OwnerId& owner, Epoch epoch, Millis ttl) {
  const MonoTime deadline = mono_.Now() + ttl / 3;
  FLEETFS_ASSIGN_OR_RETURN(const std::optional<StoredRow> read, ReadRow(range, deadline));
  if (!read) return Decision(Lost{range});
  const StoredRow& row = *read;
  FLEETFS_ASSIGN_OR_RETURN(OwnershipTable table, TableOf({row}, 0, url_));
  const Decision decision = table.Renew(range, owner, epoch, wall_.NowMs(), ttl);
  if (!std::holds_alternative<Grant>(decision)) return decision;
  FLEETFS_ASSIGN_OR_RETURN(const std::optional<Grant> extended, Extend(row, ttl, deadline));
  if (!extended) return Decision(Lost{range});
  return Decision(*extended);
}

Result<bool> EtcdStore::DoRelease(SlotRange range, const OwnerId& owner, Epoch epoch,
                                  const std::optional<OwnerId>& to, Millis window) {
  const MonoTime deadline = mono_.Now() + options_.call_timeout;
  for (int races = 0;; ++races) {
    if (races > 0 && mono_.Now() >= deadline) {
      return Status(Code::kDeadlineExceeded, "release of slot range " + range.ToString() + " on " +
                                                 url_ + ": its row kept changing until the time "
                                                 "limit");
    }
    FLEETFS_ASSIGN_OR_RETURN(const std::optional<StoredRow> read, ReadRow(range, deadline));
    if (!read) return false;
    const StoredRow& row = *read;
    FLEETFS_ASSIGN_OR_RETURN(OwnershipTable table, TableOf({row}, 0, url_));
    if (!table.Release(range, owner, epoch, wall_.NowMs())) return false;
    EtcdTxn txn;
    txn.compare.push_back({row.key, EtcdCompare::Target::kModRevision, row.mod_revision});
    txn.success.push_back({EtcdOp::Kind::kDelete, row.key, "", 0});
    std::int64_t offer_lease = 0;
    if (to && !(*to == owner)) {
      FLEETFS_ASSIGN_OR_RETURN(const EtcdLease lease,
                               client_->Grant(std::max<std::int64_t>(1, TtlSeconds(window)),
                                              deadline));
      offer_lease = lease.id;
      txn.success.push_back(
          {EtcdOp::Kind::kPut, OfferKey(range),
           Json{{"owner", owner.str()}, {"epoch", epoch.value()}, {"to", to->str()},
                {"ttl_ms", window.count()}}
               .dump(),
           offer_lease});
    }
    const Result<EtcdTxnResult> result = client_->Txn(txn, deadline);
    if (!result.ok() || !result->succeeded) {
      // No offer without its release. (A txn that landed unanswered leaves
      // the row gone: the next read says so, and the offer goes with its lease.)
      if (offer_lease != 0) (void)client_->Revoke(offer_lease, deadline);
      if (!result.ok()) return result.status();
      continue;  // the row changed under us: look again
    }
    // The row is gone; its lease has nothing left to keep. A revoke that
    // fails leaves the lease to expire on its own.
    (void)client_->Revoke(row.lease, deadline);
    return true;
  }
}

Status EtcdStore::FillExpiries(const std::vector<StoredRow*>& rows, MonoTime deadline) {
  const WallMs now = wall_.NowMs();
  std::atomic<std::size_t> next{0};
  std::atomic<bool> stop{false};
  std::mutex mu;
  Status failure;  // guarded by mu: the first failure
  auto fail = [&](Status why) {
    std::lock_guard lock(mu);
    if (failure.ok()) failure = std::move(why);
    stop = true;
  };
  auto work = [&] {
    try {
      while (!stop) {
        const std::size_t i = next++;
        if (i >= rows.size()) return;
        const Result<std::optional<std::int64_t>> left =
            client_->TimeToLive(rows[i]->lease, deadline);
        if (!left.ok()) return fail(left.status());
        // A lease gone since the read: the row has lapsed (etcd removes it).
        WallMs& expires =
            rows[i]->offer ? rows[i]->row.offer_expires_ms : rows[i]->row.lease_expires_ms;
        expires = *left ? now + **left * 1000 : now;
      }
    } catch (const std::exception& e) {
      fail(Status(Code::kInternal, "etcd store " + url_ + ": reading a lease's time left: " +
                                       e.what()));
    }
  };
  std::vector<std::thread> helpers;
  const std::size_t workers = std::min(kTtlWorkers, rows.size());
  for (std::size_t k = 1; k < workers; ++k) {
    try {
      helpers.emplace_back(work);
    } catch (const std::system_error&) {
      break;  // fewer threads: slower, not wrong
    }
  }
  work();  // this thread is a worker too
  for (std::thread& helper : helpers) helper.join();
  return failure;
}

Result<OwnershipTable> EtcdStore::DoRead() {
  const MonoTime deadline = mono_.Now() + options_.call_timeout;
  FLEETFS_ASSIGN_OR_RETURN(Snapshot snapshot, Load(deadline));
  std::vector<StoredRow*> rows;
  rows.reserve(snapshot.rows.size());
  for (StoredRow& row : snapshot.rows) rows.push_back(&row);
  FLEETFS_RETURN_IF_ERROR(FillExpiries(rows, deadline));
  return TableOf(snapshot.rows, snapshot.counter, url_);
}

Result<OwnershipTable> EtcdStore::DoReadSlots(const std::vector<Slot>& slots) {
  const MonoTime deadline = mono_.Now() + options_.call_timeout;
  FLEETFS_ASSIGN_OR_RETURN(Snapshot snapshot, Load(deadline));
  std::vector<StoredRow> held;
  for (StoredRow& row : snapshot.rows) {
    if (std::any_of(slots.begin(), slots.end(),
                    [&](Slot slot) { return row.row.range.Contains(slot); })) {
      held.push_back(std::move(row));
    }
  }
  std::vector<StoredRow*> rows;
  for (StoredRow& row : held) rows.push_back(&row);
  FLEETFS_RETURN_IF_ERROR(FillExpiries(rows, deadline));
  return TableOf(held, snapshot.counter, url_);
}

// One range read of PREFIX/offers/ and a timetolive per offer: a poll costs
// what the offers do, not what the table (up to 16384 rows) does.
Result<OwnershipTable> EtcdStore::DoReadOffers() {
  const MonoTime deadline = mono_.Now() + options_.call_timeout;
  // [PREFIX/offers/, PREFIX/offers0): every key under it ('0' follows '/').
  FLEETFS_ASSIGN_OR_RETURN(const EtcdRange range,
                           client_->Range(prefix_ + "/offers/", prefix_ + "/offers0", deadline));
  std::vector<StoredRow> offers;
  bool clash = false;
  for (const EtcdKv& kv : range.kvs) {
    auto offer = OfferOf(kv);
    if (!offer) continue;
    clash = clash || std::any_of(offers.begin(), offers.end(), [&](const StoredRow& kept) {
              return kept.row.range.Overlaps(offer->row.range) || kept.row.epoch == offer->row.epoch;
            });
    offers.push_back(std::move(*offer));
  }
  if (clash) {
    // Which of two clashing offers stands is decided by the rows and the
    // counter (Load's rules); without them, a stale or planted key that
    // sorts first would hide the real offer from its target. Rare, so the
    // full load, but still the time left of the offers alone.
    FLEETFS_ASSIGN_OR_RETURN(Snapshot snapshot, Load(deadline));
    offers.clear();
    for (StoredRow& row : snapshot.rows) {
      if (row.offer) offers.push_back(std::move(row));
    }
  }
  std::vector<StoredRow*> rows;
  for (StoredRow& offer : offers) rows.push_back(&offer);
  FLEETFS_RETURN_IF_ERROR(FillExpiries(rows, deadline));
  // A lease gone since the read: that offer ended (etcd removed it).
  const WallMs now = wall_.NowMs();
  std::erase_if(offers, [&](const StoredRow& offer) { return offer.row.offer_expires_ms <= now; });
  return TableOf(offers, 0, url_);
}

namespace {

template <typename T, typename F>
Result<T> Contained(const std::string& what, F&& body) {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return Status(Code::kUnavailable, what + ": out of memory");
  } catch (const std::exception& e) {
    return Status(Code::kInternal, what + ": " + e.what());
  }
}

}  // namespace

Result<Decision> EtcdStore::Claim(SlotRange range, const OwnerId& owner, Millis ttl,
                                  std::uint64_t floor) {
  return Contained<Decision>("etcd store " + url_ + ": claim",
                             [&] { return DoClaim(range, owner, ttl, floor); });
}

Result<Decision> EtcdStore::Renew(SlotRange range, const OwnerId& owner, Epoch epoch, Millis ttl) {
  return Contained<Decision>("etcd store " + url_ + ": renew",
                             [&] { return DoRenew(range, owner, epoch, ttl); });
}

Result<bool> EtcdStore::Release(SlotRange range, const OwnerId& owner, Epoch epoch) {
  return Contained<bool>("etcd store " + url_ + ": release",
                         [&] { return DoRelease(range, owner, epoch); });
}

Result<bool> EtcdStore::Offer(SlotRange range, const OwnerId& owner, Epoch epoch,
                              const OwnerId& to, Millis window) {
  return Contained<bool>("etcd store " + url_ + ": offer",
                         [&] { return DoRelease(range, owner, epoch, to, window); });
}

Result<OwnershipTable> EtcdStore::Read() {
  return Contained<OwnershipTable>("etcd store " + url_ + ": read", [&] { return DoRead(); });
}

Result<OwnershipTable> EtcdStore::ReadOffers() {
  return Contained<OwnershipTable>("etcd store " + url_ + ": read of the offers",
                                   [&] { return DoReadOffers(); });
}

Result<OwnershipTable> EtcdStore::ReadSlots(const std::vector<Slot>& slots) {
  return Contained<OwnershipTable>("etcd store " + url_ + ": read",
                                   [&] { return DoReadSlots(slots); });
}

namespace {

Result<OwnershipTable> TableOf(const std::vector<EtcdStore::StoredRow>& stored,
                               std::uint64_t counter, const std::string& url) {
  std::vector<OwnershipRow> rows;
  rows.reserve(stored.size());
  for (const auto& row : stored) rows.push_back(row.row);
  auto table = OwnershipTable::FromParts(std::move(rows), counter);
  if (!table.ok()) return table.status().WithContext("etcd store " + url);
  return table;
}

}  // namespace

}  // namespace fleetfs::lease
