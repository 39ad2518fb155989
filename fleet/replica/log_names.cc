#include "fleet/replica/log_names.h"

#include <algorithm>
#include <charconv>
#include <cstdio>

#include "fleet/replica/destination.h"

namespace fleetfs::replica {
namespace {

bool AllDigits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

}  // namespace

std::string QuotedName(std::string_view name) {
  std::string out = "'";
  for (unsigned char c : name) {
    if (c >= 0x20 && c < 0x7f && c != '\'' && c != '\\') {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  return out + "'";
}

std::string LogDir(const FleetFile& main) { return main.main_path; }

std::string LogObjectName(std::uint64_t seq) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%020llu", static_cast<unsigned long long>(seq));
  return buf;
}

std::string LogObjectPath(std::string_view log_dir, std::uint64_t seq) {
  return std::string(log_dir) + "/" + LogObjectName(seq);
}

std::optional<std::uint64_t> ParseLogObjectName(std::string_view name) {
  if (name.size() != kLogSeqDigits || !AllDigits(name)) return std::nullopt;
  std::uint64_t seq = 0;
  auto [end, ec] = std::from_chars(name.data(), name.data() + name.size(), seq);
  // Twenty digits reach past 2^64; from_chars says so rather than wrapping.
  if (ec != std::errc() || end != name.data() + name.size()) return std::nullopt;
  return seq;
}

bool IsOldGenerationName(std::string_view name) {
  return name.size() == 1 + 20 + 2 + 8 && name[0] == 'e' && AllDigits(name.substr(1, 20)) &&
         name.substr(21, 2) == "-g" && AllDigits(name.substr(23, 8));
}

Result<std::vector<std::uint64_t>> ParseLogListing(const std::vector<std::string>& names) {
  // The old layout first: whatever else the directory holds, that is the
  // finding an operator can act on.
  for (const std::string& n : names) {
    if (IsOldGenerationName(n)) {
      return Status(Code::kFailedPrecondition,
                    "the replica holds " + QuotedName(n) +
                        ", a generation directory of the old replica layout (generations as "
                        "directories); this fleetfs reads and writes only the replica log. "
                        "Restore the key with the older fleetfs that wrote it, or start a new "
                        "replica directory (a new replica URL) for this fleetfs");
    }
  }
  std::vector<std::uint64_t> seqs;
  seqs.reserve(names.size());
  for (const std::string& n : names) {
    if (n.starts_with(kDestinationTempPrefix)) continue;  // a put in progress, or a crash's leftover
    auto seq = ParseLogObjectName(n);
    if (!seq) {
      return DataLoss("the replica log holds " + QuotedName(n) + ", which is not a log object: " +
                      "an object's name is its sequence in " + std::to_string(kLogSeqDigits) +
                      " digits");
    }
    seqs.push_back(*seq);
  }
  std::sort(seqs.begin(), seqs.end());
  return seqs;
}

}  // namespace fleetfs::replica
