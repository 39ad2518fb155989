// NegativeNames: the absent names the kernel caches for the mount.
//
// An absent fleet name in a served slot is answered with a negative entry,
// which the kernel caches for the entry timeout: SQLite checks for a journal
// that is not there before every transaction, and each check would otherwise
// be a request. The kernel must forget such an entry when the name's range is
// served anew (a claim, a renewal after a lapse): a restore, or another host,
// may have made the file meanwhile. So every negative entry handed out is
// remembered here until it expires, at most `cap` of them; at the cap the
// mount answers ENOENT instead, which the kernel does not cache.
//
// Pure: time is passed in. Thread-safety: none; the mount guards it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "fleet/clock.h"
#include "fleet/slot.h"
#include "vfs/serving_view.h"

namespace fleetfs::vfs {

// A name in a directory, as the kernel caches it.
struct EntryName {
  std::uint64_t parent = 0;
  std::string name;
  bool operator==(const EntryName&) const = default;
};

class NegativeNames {
 public:
  // `ttl`: how long the kernel may cache a negative entry (its entry timeout).
  NegativeNames(std::size_t cap, MonoTime::duration ttl) : cap_(cap), ttl_(ttl) {}

  // Records that `name` in `parent` (slot `slot`) is answered absent at
  // `now`. False when `cap` live names are remembered: then the answer must
  // not be cacheable. Expired names make room first.
  bool Remember(std::uint64_t parent, std::string_view name, Slot slot, MonoTime now);
  // A name that exists now (created through the mount): nothing to forget later.
  void Forget(std::uint64_t parent, std::string_view name);
  // The names whose slots lie in `claimed` and that the kernel may still
  // cache at `now`; they are forgotten here (and expired ones dropped), and
  // the caller tells the kernel to forget them.
  std::vector<EntryName> ForgetIn(const std::vector<ServedRange>& claimed, MonoTime now);

  std::size_t size() const { return names_.size(); }

 private:
  struct Absent {
    std::uint64_t parent = 0;
    std::string name;
    Slot slot = 0;
    MonoTime until{};
  };
  static std::string KeyOf(std::uint64_t parent, std::string_view name);

  std::size_t cap_;
  MonoTime::duration ttl_;
  std::unordered_map<std::string, Absent> names_;  // key: KeyOf(parent, name)
};

}  // namespace fleetfs::vfs
