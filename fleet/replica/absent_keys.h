// AbsentKeys: keys the replica was found not to hold, each with the epoch it
// was listed at, so a repeated lookup of an absent name needs no job and no
// listing (fleet/replicator.h, "Prepare").
//
// At one epoch only this host writes a key's replica, so an entry stays true
// for its epoch unless this host makes the key (a create through the mount,
// or a shipment, forgets it); an entry of another epoch never answers, and
// is dropped when asked. Bounded: the least recently used key goes first.
//
// Thread-safety: every method is safe from any thread. One mutex, held only
// while the map is read or changed, and taken alone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <mutex>
#include <string>
#include <unordered_map>

namespace fleetfs::replica {

class AbsentKeys {
 public:
  // Holds at most `cap` keys (at least one).
  explicit AbsentKeys(std::size_t cap);

  // True when `key` was remembered absent at `epoch`; a hit counts as a use.
  bool Contains(const std::string& key, std::uint64_t epoch);
  // `key` was listed absent at `epoch`; may push out the least recently used.
  void Remember(const std::string& key, std::uint64_t epoch);
  // `key` exists now (made here, or shipped).
  void Forget(const std::string& key);

 private:
  struct Entry {
    std::uint64_t epoch = 0;
    std::list<std::string>::iterator at;
  };
  const std::size_t cap_;
  std::mutex mu_;                 // guards the two below; taken alone
  std::list<std::string> order_;  // most recently used first
  std::unordered_map<std::string, Entry> map_;
};

}  // namespace fleetfs::replica
