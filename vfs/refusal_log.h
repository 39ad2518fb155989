// RefusalLog: says in the log what the mount refused and why, at most once
// per name per interval, so a local user who repeats a refused request
// cannot flood the log.
//
// Pure: time is passed in. Thread-safety: safe from any thread (one mutex,
// taken alone).
#pragma once

#include <cstddef>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

#include "fleet/clock.h"

namespace fleetfs::vfs {

class RefusalLog {
 public:
  // At most one line per name per `interval`; at most `max_names` names
  // tracked (beyond, lines are dropped until the interval passes).
  RefusalLog(MonoTime::duration interval, std::size_t max_names)
      : interval_(interval), max_names_(max_names) {}

  // Whether a refusal of `name` at `now` goes to the log.
  bool ShouldLog(std::string_view name, MonoTime now);
  // Logs `message` (warn) when ShouldLog says so.
  void Refused(std::string_view name, MonoTime now, std::string_view message);

 private:
  MonoTime::duration interval_;
  std::size_t max_names_;
  std::mutex mu_;  // guards last_; taken alone
  std::unordered_map<std::string, MonoTime> last_;  // name -> when it was last logged
};

}  // namespace fleetfs::vfs
