#include "fleet/replica/absent_keys.h"

#include <algorithm>

namespace fleetfs::replica {

AbsentKeys::AbsentKeys(std::size_t cap) : cap_(std::max<std::size_t>(1, cap)) {}

bool AbsentKeys::Contains(const std::string& key, std::uint64_t epoch) {
  std::lock_guard lock(mu_);
  auto it = map_.find(key);
  if (it == map_.end()) return false;
  if (it->second.epoch != epoch) {
    order_.erase(it->second.at);
    map_.erase(it);
    return false;
  }
  order_.splice(order_.begin(), order_, it->second.at);
  return true;
}

void AbsentKeys::Remember(const std::string& key, std::uint64_t epoch) {
  std::lock_guard lock(mu_);
  auto it = map_.find(key);
  if (it != map_.end()) {
    it->second.epoch = epoch;
    order_.splice(order_.begin(), order_, it->second.at);
    return;
  }
  order_.push_front(key);
  map_.emplace(key, Entry{epoch, order_.begin()});
  if (map_.size() > cap_) {
    map_.erase(order_.back());
    order_.pop_back();
  }
}

void AbsentKeys::Forget(const std::string& key) {
  std::lock_guard lock(mu_);
  auto it = map_.find(key);
  if (it == map_.end()) return;
  order_.erase(it->second.at);
  map_.erase(it);
}

}  // namespace fleetfs::replica
