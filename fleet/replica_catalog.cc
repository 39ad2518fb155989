#include "fleet/replica_catalog.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>

#include "fleet/fd_io.h"

namespace fleetfs::replica {
namespace {

std::optional<std::uint64_t> Digits(std::string_view s, std::size_t width) {
  if (s.size() != width) return std::nullopt;
  std::uint64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return v;
}

std::string Padded(std::uint64_t v, int width) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%0*llu", width, static_cast<unsigned long long>(v));
  return buf;
}

Status ApplyTxn(int fd, const Txn& t) {
  for (const PageWrite& w : t.writes) {
    FLEETFS_RETURN_IF_ERROR(PwriteAll(fd, w.data.data(), w.data.size(), w.offset));
  }
  if (::ftruncate(fd, static_cast<off_t>(t.db_size)) != 0) {
    return ErrnoStatus("sizing the restored database", errno);
  }
  return Status::Ok();
}

}  // namespace

std::string GenerationId::Name() const { return "e" + Padded(epoch, 20) + "-g" + Padded(index, 8); }

std::optional<GenerationId> GenerationId::Parse(std::string_view name) {
  // e<20 digits>-g<8 digits>
  if (name.size() != 1 + 20 + 2 + 8 || name[0] != 'e' || name.substr(21, 2) != "-g") {
    return std::nullopt;
  }
  auto e = Digits(name.substr(1, 20), 20);
  auto i = Digits(name.substr(23), 8);
  if (!e || !i) return std::nullopt;
  return GenerationId{*e, *i};
}

std::string ObjectId::Name() const {
  std::string_view ext = kind == ObjectKind::kSnapshot ? "snap"
                         : kind == ObjectKind::kSegment ? "seg"
                                                        : "tomb";
  return Padded(seq, 10) + "." + std::string(ext);
}

std::optional<ObjectId> ObjectId::Parse(std::string_view name) {
  if (name.size() < 12 || name[10] != '.') return std::nullopt;
  auto seq = Digits(name.substr(0, 10), 10);
  if (!seq) return std::nullopt;
  std::string_view ext = name.substr(11);
  ObjectId id{*seq, ObjectKind::kSegment};
  if (ext == "snap") id.kind = ObjectKind::kSnapshot;
  else if (ext == "seg") id.kind = ObjectKind::kSegment;
  else if (ext == "tomb") id.kind = ObjectKind::kTombstone;
  else return std::nullopt;
  return id;
}

std::string KeyDir(const FleetFile& main) { return main.main_path; }

std::string GenerationDir(std::string_view key_dir, const GenerationId& gen) {
  return std::string(key_dir) + "/" + gen.Name();
}

std::string ObjectPath(std::string_view key_dir, const GenerationId& gen, const ObjectId& obj) {
  return GenerationDir(key_dir, gen) + "/" + obj.Name();
}

Result<std::vector<GenerationId>> ListGenerations(Destination& dest, std::string_view key_dir) {
  FLEETFS_ASSIGN_OR_RETURN(std::vector<std::string> names, dest.List(key_dir));
  std::vector<GenerationId> gens;
  for (const auto& n : names) {
    if (auto g = GenerationId::Parse(n)) gens.push_back(*g);
  }
  std::sort(gens.begin(), gens.end());
  return gens;
}

Result<std::optional<std::uint64_t>> NewestEpoch(Destination& dest, std::string_view key_dir) {
  FLEETFS_ASSIGN_OR_RETURN(std::vector<GenerationId> gens, ListGenerations(dest, key_dir));
  if (gens.empty()) return std::optional<std::uint64_t>();
  return std::optional<std::uint64_t>(gens.back().epoch);
}

Result<GenerationInfo> DescribeGeneration(Destination& dest, std::string_view key_dir,
                                          const GenerationId& gen) {
  GenerationInfo info;
  info.id = gen;
  std::string dir = GenerationDir(key_dir, gen);
  FLEETFS_ASSIGN_OR_RETURN(std::vector<std::string> names, dest.List(dir));
  for (const auto& n : names) {
    auto id = ObjectId::Parse(n);
    if (!id) continue;
    std::string path = dir + "/" + n;
    FLEETFS_ASSIGN_OR_RETURN(std::string head, dest.GetHead(path, kObjectHeaderBytes));
    auto summary = Summarize(head);
    if (!summary.ok()) return summary.status().WithContext("replica object " + dest.url() + "/" + path);
    FLEETFS_ASSIGN_OR_RETURN(std::uint64_t bytes, dest.Size(path));
    info.objects.push_back(ObjectInfo{*id, *summary, bytes});
  }
  std::sort(info.objects.begin(), info.objects.end(),
            [](const ObjectInfo& a, const ObjectInfo& b) { return a.id.seq < b.id.seq; });
  for (const ObjectInfo& o : info.objects) {
    if (o.summary.kind == ObjectKind::kTombstone) info.tombstone = true;
    info.commits += o.summary.commits;
    info.bytes += o.bytes;
    if (info.first_ms == 0) info.first_ms = o.summary.first_ms;
    info.last_ms = std::max(info.last_ms, o.summary.last_ms);
  }
  return info;
}

Result<RestoreOutcome> RestoreTo(Destination& dest, std::string_view key_dir,
                                 std::optional<WallMs> at_ms, int out_fd,
                                 const Progress& progress) {
  RestoreOutcome outcome;
  FLEETFS_ASSIGN_OR_RETURN(std::vector<GenerationId> gens, ListGenerations(dest, key_dir));
  // Newest first: the newest epoch wins, whatever the times say.
  std::optional<GenerationInfo> chosen;
  for (auto it = gens.rbegin(); it != gens.rend(); ++it) {
    FLEETFS_ASSIGN_OR_RETURN(GenerationInfo info, DescribeGeneration(dest, key_dir, *it));
    if (info.objects.empty()) continue;  // a generation whose first put never landed
    if (at_ms && info.first_ms > *at_ms) continue;
    chosen = std::move(info);
    break;
  }
  if (!chosen) return outcome;  // kNoReplica
  outcome.generation = chosen->id;
  const std::string gen_name = dest.url() + "/" + GenerationDir(key_dir, chosen->id);
  const auto& objects = chosen->objects;
  if (objects.front().summary.kind == ObjectKind::kTombstone) {
    outcome.result = RestoreResult::kDeleted;
    outcome.as_of_ms = objects.front().summary.first_ms;
    return outcome;
  }
  // The last snapshot not after the target time, then the segments after it,
  // numbered without a gap. (Retention removes a generation's objects older
  // than a kept snapshot, oldest first, so what comes before does not matter.)
  std::optional<std::size_t> found;
  for (std::size_t i = 0; i < objects.size(); ++i) {
    if (objects[i].summary.kind == ObjectKind::kSnapshot &&
        (!at_ms || objects[i].summary.first_ms <= *at_ms)) {
      found = i;
    }
  }
  if (!found) {
    return DataLoss("replica generation " + gen_name + " holds no snapshot" +
                    (at_ms ? " at or before that time" : ""));
  }
  const std::size_t start = *found;
  for (std::size_t i = start + 1; i < objects.size(); ++i) {
    const std::uint64_t want = objects[i - 1].id.seq + 1;
    if (objects[i].id.seq != want) {
      return DataLoss("replica generation " + gen_name + " is missing object " +
                      ObjectId{want, ObjectKind::kSegment}.Name() + " (a gap in its numbering)");
    }
  }
  std::uint64_t total = 0, done = 0;
  for (std::size_t i = start; i < objects.size(); ++i) {
    if (objects[i].summary.kind != ObjectKind::kSnapshot || i == start) total += objects[i].bytes;
  }
  const ObjectInfo& snap = objects[start];
  {
    std::string path = ObjectPath(key_dir, chosen->id, snap.id);
    SnapshotReader reader(out_fd);
    Status st = dest.Get(path, [&](std::string_view piece) {
      done += piece.size();
      if (progress) progress(done, total);
      return reader.Feed(piece);
    });
    if (st.ok()) st = reader.Finish();
    if (!st.ok()) return st.WithContext("replica snapshot " + dest.url() + "/" + path);
    outcome.as_of_ms = snap.summary.first_ms;
    outcome.bytes = reader.written();
    outcome.owner = reader.summary().owner;
  }
  for (std::size_t i = start + 1; i < objects.size(); ++i) {
    if (objects[i].summary.kind != ObjectKind::kSegment) continue;  // a later snapshot
    if (at_ms && objects[i].summary.first_ms > *at_ms) break;
    std::string path = ObjectPath(key_dir, chosen->id, objects[i].id);
    std::string bytes;
    Status st = dest.Get(path, [&](std::string_view piece) {
      bytes.append(piece);
      return Status::Ok();
    });
    if (!st.ok()) return st.WithContext("replica segment " + dest.url() + "/" + path);
    auto txns = DecodeSegment(bytes);
    if (!txns.ok()) return txns.status().WithContext("replica segment " + dest.url() + "/" + path);
    done += bytes.size();
    if (progress) progress(done, total);
    for (const Txn& t : *txns) {
      if (at_ms && t.commit_ms > *at_ms) break;
      FLEETFS_RETURN_IF_ERROR(ApplyTxn(out_fd, t));
      ++outcome.commits;
      outcome.as_of_ms = t.commit_ms;
      outcome.bytes = t.db_size;
    }
  }
  outcome.result = RestoreResult::kRestored;
  return outcome;
}

Result<int> PruneGenerations(Destination& dest, std::string_view key_dir, WallMs before_ms) {
  FLEETFS_ASSIGN_OR_RETURN(std::vector<GenerationId> gens, ListGenerations(dest, key_dir));
  // The newest generation that holds objects is the key's state: never
  // removed, even behind newer empty ones (a takeover's marker, or a first
  // put that never landed).
  std::size_t newest_data = gens.size();
  for (std::size_t i = gens.size(); i-- > 0;) {
    FLEETFS_ASSIGN_OR_RETURN(GenerationInfo info, DescribeGeneration(dest, key_dir, gens[i]));
    if (!info.objects.empty()) {
      newest_data = i;
      break;
    }
  }
  int removed = 0;
  for (std::size_t i = 0; i < gens.size(); ++i) {
    FLEETFS_ASSIGN_OR_RETURN(GenerationInfo info, DescribeGeneration(dest, key_dir, gens[i]));
    if (i + 1 < gens.size() && i < newest_data && info.last_ms < before_ms) {
      FLEETFS_RETURN_IF_ERROR(dest.Remove(GenerationDir(key_dir, gens[i])));
      ++removed;
      continue;
    }
    // Inside a kept generation: what precedes its newest snapshot taken
    // before the cut is needed by no restore within the retention. Oldest
    // first, so an interrupted prune leaves a restorable tail.
    std::optional<std::size_t> cut;
    for (std::size_t j = 1; j < info.objects.size(); ++j) {
      if (info.objects[j].summary.kind == ObjectKind::kSnapshot &&
          info.objects[j].summary.first_ms < before_ms) {
        cut = j;
      }
    }
    for (std::size_t j = 0; cut && j < *cut; ++j) {
      FLEETFS_RETURN_IF_ERROR(dest.Remove(ObjectPath(key_dir, gens[i], info.objects[j].id)));
      ++removed;
    }
  }
  return removed;
}

}  // namespace fleetfs::replica
