// How a key's replica log is named at the destination.
//
//   <bucket>/<file>/<seq:020>
//
// A key's log directory is its main file's path ("176/acme.db"), and object
// n of its log is named by n alone, twenty digits. The kind, epoch and the
// rest live in the object's header (fleet/replica/log_object.h), never in the
// name: two writers of one sequence, an old owner and the new one, race for
// one name, and the create-only put lets exactly one of them win.
//
// The replica catalogue before the log kept generations as directories
// (`e<epoch:020>-g<index:08>/`); a log directory holding one is refused with
// what to do, never read as an empty log.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fleet/layout.h"
#include "fleet/status.h"

namespace fleetfs::replica {

// Digits in an object's name: enough for any 64-bit sequence, and names sort
// as their numbers do.
inline constexpr std::size_t kLogSeqDigits = 20;

// "BBB/<file>": the directory of the key's log (its main file's path).
std::string LogDir(const FleetFile& main);
// "00000000000000000042" for sequence 42.
std::string LogObjectName(std::uint64_t seq);
// "<log_dir>/<seq:020>".
std::string LogObjectPath(std::string_view log_dir, std::uint64_t seq);

// The sequence an object's name stands for: exactly twenty digits, at most
// the largest 64-bit number; nullopt for anything else.
std::optional<std::uint64_t> ParseLogObjectName(std::string_view name);

// A name or key read from a replica, for messages: quoted, with bytes
// outside printable ASCII escaped, so hostile bytes cannot forge a log line.
std::string QuotedName(std::string_view name);

// True for a name of the old layout's generation directories,
// `e<20 digits>-g<8 digits>`.
bool IsOldGenerationName(std::string_view name);

// The sequences of a log directory's listing, ascending. Temporary files of a
// destination's puts in progress are skipped. FailedPrecondition when the
// directory holds the old layout's generations (the message says what to
// do); DataLoss naming the first entry that is no log object.
Result<std::vector<std::uint64_t>> ParseLogListing(const std::vector<std::string>& names);

}  // namespace fleetfs::replica
