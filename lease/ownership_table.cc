#include "lease/ownership_table.h"

#include <algorithm>
#include <ctime>

namespace fleetfs::lease {
namespace {

WallMs LeaseEnd(WallMs now, Millis ttl) {
  // Saturates: an overflowing sum would otherwise wrap into the past.
  if (now > INT64_MAX - ttl.count()) return INT64_MAX;
  return now + ttl.count();
}

bool Covers(SlotRange outer, SlotRange inner) {
  return outer.first() <= inner.first() && inner.last() <= outer.last();
}

}  // namespace

std::string FormatWallTime(WallMs ms, bool local) {
  const std::time_t seconds = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  if (local) {
    localtime_r(&seconds, &tm);
  } else {
    gmtime_r(&seconds, &tm);
  }
  char buffer[64];
  std::strftime(buffer, sizeof buffer, local ? "%Y-%m-%d %H:%M:%S %Z" : "%Y-%m-%d %H:%M:%S UTC",
                &tm);
  return buffer;
}

std::string DescribeDecision(const Decision& decision) {
  if (const auto* grant = std::get_if<Grant>(&decision)) {
    return "slot range " + grant->range.ToString() + " granted at epoch " +
           grant->epoch.ToString() + (grant->fresh ? " (new)" : "") + " until " +
           FormatWallTime(grant->lease_expires_ms);
  }
  if (const auto* held = std::get_if<Held>(&decision)) {
    return "slot range " + held->range.ToString() + (held->offered ? " is offered to '" : " is held by '") +
           held->owner + "' until " + FormatWallTime(held->lease_expires_ms);
  }
  const auto& lost = std::get<Lost>(decision);
  return "slot range " + lost.range.ToString() +
         " was lost: the table no longer holds it for this owner at this epoch";
}

Result<OwnershipTable> OwnershipTable::FromParts(std::vector<OwnershipRow> rows,
                                                 std::uint64_t last_epoch) {
  std::sort(rows.begin(), rows.end(),
            [](const OwnershipRow& a, const OwnershipRow& b) { return a.range < b.range; });
  std::vector<std::uint64_t> epochs;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    if (rows[i].epoch.value() == 0 || rows[i].epoch.value() > Epoch::kMax) {
      return DataLoss("ownership row " + rows[i].range.ToString() + " has epoch " +
                      rows[i].epoch.ToString() + "; epochs are 1 to 2^63-1");
    }
    if (i > 0 && rows[i - 1].range.Overlaps(rows[i].range)) {
      return DataLoss("ownership rows " + rows[i - 1].range.ToString() + " and " +
                      rows[i].range.ToString() + " overlap; rows never share a slot");
    }
    epochs.push_back(rows[i].epoch.value());
  }
  std::sort(epochs.begin(), epochs.end());
  if (std::adjacent_find(epochs.begin(), epochs.end()) != epochs.end()) {
    return DataLoss("two ownership rows share an epoch; every row's epoch is unique");
  }
  OwnershipTable table;
  table.rows_ = std::move(rows);
  table.last_epoch_ = std::max(last_epoch, epochs.empty() ? 0 : epochs.back());
  return table;
}

const OwnershipRow* OwnershipTable::RowFor(Slot slot) const {
  for (const auto& row : rows_) {
    if (row.range.Contains(slot)) return &row;
  }
  return nullptr;
}

bool OwnershipTable::Admits(Slot slot, const OwnerId& owner, Epoch epoch) const {
  const OwnershipRow* row = RowFor(slot);
  return row != nullptr && row->owner == owner && row->epoch == epoch;
}

OwnershipRow* OwnershipTable::Exact(SlotRange range, const OwnerId& owner, Epoch epoch) {
  for (auto& row : rows_) {
    if (row.range == range && row.owner == owner && row.epoch == epoch) return &row;
  }
  return nullptr;
}

Result<Decision> OwnershipTable::Claim(SlotRange range, const OwnerId& owner, WallMs now,
                                       Millis ttl, std::uint64_t floor) {
  for (const auto& row : rows_) {
    const bool same_claim = row.owner == owner && row.range == range;
    if (row.range.Overlaps(range) && !same_claim && row.lease_expires_ms > now) {
      return Decision(Held{row.range, row.owner.str(), row.lease_expires_ms});
    }
    // An offer binds its own owner too: the releasing host gave it away. Its
    // target takes it whole or not at all, as a live row of another shape is
    // never taken: a claim of a part would erase the rest of the offer (the
    // lapsed row goes whole), leaving it free to anyone within the window.
    const bool offer_stands = row.offered_to && row.offer_expires_ms > now;
    if (row.range.Overlaps(range) && offer_stands &&
        (row.OfferedAwayFrom(owner, now) || !Covers(range, row.range))) {
      return Decision(Held{row.range, row.offered_to->str(), row.offer_expires_ms, true});
    }
  }
  const WallMs expires = LeaseEnd(now, ttl);
  // Rows never overlap, so a row with these bounds is the only one that
  // overlaps the range.
  for (auto& row : rows_) {
    if (row.range == range && row.owner == owner && row.epoch.value() > floor) {
      row.lease_expires_ms = std::max(row.lease_expires_ms, expires);
      row.offered_to.reset();  // taken back after its offer ran out
      row.offer_expires_ms = 0;
      return Decision(Grant{range, row.epoch, row.lease_expires_ms, /*fresh=*/false});
    }
  }
  const std::uint64_t next = std::max(last_epoch_, floor) + 1;
  if (next > Epoch::kMax || next == 0) {
    return Status(Code::kFailedPrecondition,
                  "the epoch counter is exhausted; no new epoch can be granted");
  }
  std::erase_if(rows_, [&](const OwnershipRow& row) { return row.range.Overlaps(range); });
  const auto at = std::lower_bound(
      rows_.begin(), rows_.end(), range,
      [](const OwnershipRow& row, SlotRange r) { return row.range < r; });
  rows_.insert(at, OwnershipRow{range, owner, Epoch(next), expires});
  last_epoch_ = next;
  return Decision(Grant{range, Epoch(next), expires, /*fresh=*/true});
}

Decision OwnershipTable::Renew(SlotRange range, const OwnerId& owner, Epoch epoch, WallMs now,
                               Millis ttl) {
  OwnershipRow* row = Exact(range, owner, epoch);
  if (row == nullptr || row->OfferedAwayFrom(owner, now)) return Lost{range};
  row->offered_to.reset();
  row->offer_expires_ms = 0;
  row->lease_expires_ms = std::max(row->lease_expires_ms, LeaseEnd(now, ttl));
  return Grant{range, epoch, row->lease_expires_ms, /*fresh=*/false};
}

bool OwnershipTable::Release(SlotRange range, const OwnerId& owner, Epoch epoch, WallMs now) {
  OwnershipRow* row = Exact(range, owner, epoch);
  if (row == nullptr) return false;
  row->lease_expires_ms = std::min(row->lease_expires_ms, now);
  return true;
}

bool OwnershipTable::Offer(SlotRange range, const OwnerId& owner, Epoch epoch, WallMs now,
                           const OwnerId& to, Millis window) {
  if (!Release(range, owner, epoch, now)) return false;
  if (to == owner) return true;
  OwnershipRow* row = Exact(range, owner, epoch);
  row->offered_to = to;
  row->offer_expires_ms = LeaseEnd(now, window);
  return true;
}

}  // namespace fleetfs::lease
