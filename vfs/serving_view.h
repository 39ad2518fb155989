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
#include "fleet/layout.h"
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
  // false: the range drains before a handoff; its open handles go on, but
  // no new name is looked up, opened or created (as a view not accepting).
  bool accepting = true;
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
  // The admission rule, the one place it is written: whether a handle of a
  // `role` file of `slot`, opened under `token`, may still work at `now`. The
  // slot must be served under the same token, except that a -shm handle of an
  // earlier serving period at the same epoch goes on: fencing its file
  // operations protects nothing (its users share the mapping, which bypasses
  // the file system), and the kernel writes back every user's dirty
  // wal-index pages through whichever handle mapped the file first, which
  // may be a fenced one.
  bool Admits(Slot slot, FileRole role, const ServingToken& token, MonoTime now) const {
    return Admitting(slot, role, token, now) != nullptr;
  }
  // The range that admits such a handle (its valid_until is the local lease
  // end the operation must finish before), or nullptr.
  const ServedRange* Admitting(Slot slot, FileRole role, const ServingToken& token,
                               MonoTime now) const;
  // The same for a main file (no exception applies).
  bool Admits(Slot slot, const ServingToken& token, MonoTime now) const {
    return Admits(slot, FileRole::kMain, token, now);
  }
  // The range under which a name of `slot` may be looked up, opened, created
  // or unlinked at `now`, or nullptr. While the view accepts, the serving
  // range. While it drains, only for a tenant that still has open handles
  // (`tenant_open`): its open transactions must be able to finish, and a
  // rollback-journal transaction creates and deletes its -journal. A tenant
  // with no open handle is new here, and refused.
  // A range that drains (ServedRange::accepting false) follows the same rule.
  const ServedRange* ForName(Slot slot, MonoTime now, bool tenant_open) const {
    const ServedRange* range = Find(slot, now);
    if (range == nullptr) return nullptr;
    return (accepting_ && range->accepting) || tenant_open ? range : nullptr;
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
