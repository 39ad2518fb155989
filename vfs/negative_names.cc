#include "vfs/negative_names.h"

namespace fleetfs::vfs {

std::string NegativeNames::KeyOf(std::uint64_t parent, std::string_view name) {
  return std::string(name) + '\0' + std::to_string(parent);
}

bool NegativeNames::Remember(std::uint64_t parent, std::string_view name, Slot slot,
                             MonoTime now) {
  std::string key = KeyOf(parent, name);
  if (names_.size() >= cap_ && !names_.contains(key)) {
    std::erase_if(names_, [&](const auto& entry) { return entry.second.until <= now; });
    if (names_.size() >= cap_) return false;
  }
  names_[std::move(key)] = Absent{parent, std::string(name), slot, now + ttl_};
  return true;
}

void NegativeNames::Forget(std::uint64_t parent, std::string_view name) {
  names_.erase(KeyOf(parent, name));
}

std::vector<EntryName> NegativeNames::ForgetIn(const std::vector<ServedRange>& claimed,
                                               MonoTime now) {
  std::vector<EntryName> forgotten;
  std::erase_if(names_, [&](const auto& entry) {
    const Absent& a = entry.second;
    if (a.until <= now) return true;  // the kernel has dropped it already
    for (const ServedRange& r : claimed) {
      if (a.slot >= r.first && a.slot <= r.last) {
        forgotten.push_back(EntryName{a.parent, a.name});
        return true;
      }
    }
    return false;
  });
  return forgotten;
}

}  // namespace fleetfs::vfs
