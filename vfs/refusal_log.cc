#include "vfs/refusal_log.h"

#include <spdlog/spdlog.h>

namespace fleetfs::vfs {

bool RefusalLog::ShouldLog(std::string_view name, MonoTime now) {
  std::lock_guard lock(mu_);
  std::string key(name);
  auto it = last_.find(key);
  if (it != last_.end()) {
    if (now - it->second < interval_) return false;
    it->second = now;
    return true;
  }
  if (last_.size() >= max_names_) {
    std::erase_if(last_, [&](const auto& e) { return now - e.second >= interval_; });
    if (last_.size() >= max_names_) return false;
  }
  last_.emplace(std::move(key), now);
  return true;
}

void RefusalLog::Refused(std::string_view name, MonoTime now, std::string_view message) {
  if (ShouldLog(name, now)) spdlog::warn("vfs: {}", message);
}

}  // namespace fleetfs::vfs
