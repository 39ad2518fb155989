#include "vfs/serving_view.h"

#include <algorithm>

namespace fleetfs::vfs {

Result<ServingView> ServingView::Make(std::vector<ServedRange> ranges, bool accepting) {
  std::sort(ranges.begin(), ranges.end(),
            [](const ServedRange& a, const ServedRange& b) { return a.first < b.first; });
  for (std::size_t i = 0; i < ranges.size(); ++i) {
    const ServedRange& r = ranges[i];
    if (r.first > r.last || r.last > kLastSlot) {
      return InvalidArgument("served range " + std::to_string(r.first) + "-" +
                             std::to_string(r.last) + " is not a range of slots 0-16383");
    }
    if (i > 0 && ranges[i - 1].last >= r.first) {
      return InvalidArgument("served ranges " + std::to_string(ranges[i - 1].first) + "-" +
                             std::to_string(ranges[i - 1].last) + " and " +
                             std::to_string(r.first) + "-" + std::to_string(r.last) +
                             " overlap; a slot is served under one epoch");
    }
  }
  ServingView view;
  view.ranges_ = std::move(ranges);
  view.accepting_ = accepting;
  return view;
}

const ServedRange* ServingView::Find(Slot slot, MonoTime now) const {
  // Few ranges per host: the first range that ends at or after the slot.
  auto it = std::lower_bound(ranges_.begin(), ranges_.end(), slot,
                             [](const ServedRange& r, Slot s) { return r.last < s; });
  if (it == ranges_.end() || it->first > slot || now >= it->valid_until) return nullptr;
  return &*it;
}

const ServedRange* ServingView::Admitting(Slot slot, FileRole role, const ServingToken& token,
                                         MonoTime now) const {
  const ServedRange* range = Find(slot, now);
  if (range == nullptr) return nullptr;
  if (range->token == token) return range;
  return role == FileRole::kShm && range->token.epoch == token.epoch ? range : nullptr;
}

std::vector<ServedRange> ServingView::WithdrawnBy(const ServingView& next, MonoTime now) const {
  std::vector<ServedRange> withdrawn;
  for (const ServedRange& r : ranges_) {
    // A range's handles survive only when every slot of it is served by
    // `next` under the same token; a reshaped range counts as withdrawn.
    bool kept = true;
    for (const ServedRange& n : next.ranges_) {
      if (n.last < r.first || n.first > r.last) continue;
      if (!(n.first <= r.first && r.last <= n.last && n.token == r.token &&
            now < n.valid_until)) {
        kept = false;
      }
    }
    if (kept) {
      const ServedRange* covering = next.Find(r.first, now);
      kept = covering != nullptr && covering->token == r.token && covering->last >= r.last;
    }
    if (!kept) withdrawn.push_back(r);
  }
  return withdrawn;
}

}  // namespace fleetfs::vfs
