// ServingView: which slots this host serves right now, as the mount sees it.
//
// A view is an immutable snapshot the agent publishes on every change of its
// leases. Each served range carries its epoch, its serving period (a number
// that changes whenever the range starts being served again, so a lapse
// followed by a renewal at the same epoch still fences handles opened before
// the lapse), and the monotonic time its local lease ends. The mount checks
// that end itself on every operation, so a late agent loop cannot stretch a
// lease.
//
// vfs knows nothing of the ownership store: epochs here are plain numbers.
//
// Thread-safety: immutable after construction; share it as
// shared_ptr<const ServingView>.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "fleet/clock.h"
#include "fleet/slot.h"
#include "fleet/status.h"

namespace fleetfs::vfs {

// What an open handle was opened under. Operations on the handle go on only
// while the view serves its slot under the same token.
struct ServingToken {
  std::uint64_t epoch = 0;
  std::uint64_t period = 0;
  bool operator==(const ServingToken&) const = default;
};

struct ServedRange {
  Slot first = 0;
  Slot last = 0;
  ServingToken token;
  MonoTime valid_until{};  // the local lease's end
  bool operator==(const ServedRange&) const = default;
};

class ServingView {
 public:
  // Nothing served.
  ServingView() = default;
  // InvalidArgument when ranges overlap or are malformed. `accepting` false
  // means: existing handles go on, but no new name is looked up, opened or
  // created (the agent is draining before it stops).
  static Result<ServingView> Make(std::vector<ServedRange> ranges, bool accepting);

  // The range serving `slot` at `now`, or nullptr.
  const ServedRange* Find(Slot slot, MonoTime now) const;
  // Whether a handle opened under `token` for `slot` may still work at `now`.
  bool Admits(Slot slot, const ServingToken& token, MonoTime now) const {
    const ServedRange* range = Find(slot, now);
    return range != nullptr && range->token == token;
  }
  bool accepting() const { return accepting_; }
  const std::vector<ServedRange>& ranges() const { return ranges_; }

  // The ranges of this view whose handles `next` no longer admits at `now`
  // (lapsed, withdrawn, or served again under another token).
  std::vector<ServedRange> WithdrawnBy(const ServingView& next, MonoTime now) const;

 private:
  std::vector<ServedRange> ranges_;  // sorted by first slot, disjoint
  bool accepting_ = true;
};

}  // namespace fleetfs::vfs
