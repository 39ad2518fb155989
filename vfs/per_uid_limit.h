// A count per user of something each may hold only so many of at once (the
// open control files, whose content is made at open and kept by the handle):
// one user cannot make the agent hold unbounded memory for it.
//
// Thread-safety: all members may be called from any thread.
#pragma once

#include <sys/types.h>

#include <mutex>
#include <unordered_map>

namespace fleetfs::vfs {

class PerUidLimit {
 public:
  explicit PerUidLimit(int most) : most_(most) {}

  // Counts one for `uid`; false (and counts nothing) when it holds `most`.
  bool Enter(uid_t uid) {
    std::lock_guard lock(mu_);
    auto [it, added] = held_.try_emplace(uid, 0);
    if (it->second >= most_) return false;
    ++it->second;
    return true;
  }
  void Leave(uid_t uid) {
    std::lock_guard lock(mu_);
    auto it = held_.find(uid);
    if (it != held_.end() && --it->second <= 0) held_.erase(it);
  }
  int held(uid_t uid) const {
    std::lock_guard lock(mu_);
    auto it = held_.find(uid);
    return it == held_.end() ? 0 : it->second;
  }

 private:
  const int most_;
  mutable std::mutex mu_;
  std::unordered_map<uid_t, int> held_;  // no entry for a user holding none
};

}  // namespace fleetfs::vfs
