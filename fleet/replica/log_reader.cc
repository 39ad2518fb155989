#include "fleet/replica/log_reader.h"

#include <sys/uio.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <memory>
#include <vector>

#include "fleet/fd_io.h"
#include "fleet/replica/log_names.h"

namespace fleetfs::replica {
namespace {

std::string N(std::uint64_t v) { return std::to_string(v); }

// "replica log object file:///r/176/acme.db/00000000000000000007": the prefix
// every error about one object carries.
std::string ObjectName(Destination& dest, std::string_view dir, std::uint64_t seq) {
  return "replica log object " + dest.url() + "/" + LogObjectPath(dir, seq);
}

LogExpectation Expect(std::string_view dir, std::uint64_t seq, std::uint64_t max_epoch) {
  return LogExpectation{std::string(dir), seq, std::nullopt, max_epoch};
}

// Writes `iov` at `offset` whole, however the kernel splits it.
Status PwritevAll(int fd, std::vector<iovec>& iov, std::uint64_t offset) {
  std::size_t first = 0;
  while (first < iov.size()) {
    const ssize_t n = ::pwritev(fd, iov.data() + first, static_cast<int>(iov.size() - first),
                                static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus("writing the restored database", errno);
    }
    if (n == 0) return Status(Code::kInternal, "writing the restored database: nothing was written");
    offset += static_cast<std::uint64_t>(n);
    for (auto left = static_cast<std::size_t>(n); left > 0;) {
      if (left >= iov[first].iov_len) {
        left -= iov[first].iov_len;
        ++first;
      } else {
        iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + left;
        iov[first].iov_len -= left;
        left = 0;
      }
    }
  }
  return Status::Ok();
}

Status ApplyTxn(int fd, const TxnView& t) {
  // Pages that follow each other on disk go in one call: a restore of a log
  // of segments is a page per write otherwise, and the calls cost more than
  // the copying.
  std::vector<iovec> run;
  std::uint64_t run_at = 0, run_end = 0;
  for (const PageView& w : t.writes) {
    // Nothing to write (a hostile segment may hold it): an empty iovec at a
    // run's end would have pwritev answer 0 for ever.
    if (w.data.empty()) continue;
    if (!run.empty() && (w.offset != run_end || run.size() == IOV_MAX)) {
      FLEETFS_RETURN_IF_ERROR(PwritevAll(fd, run, run_at));
      run.clear();
    }
    if (run.empty()) run_at = run_end = w.offset;
    run.push_back(iovec{const_cast<char*>(w.data.data()), w.data.size()});
    run_end += w.data.size();
  }
  if (!run.empty()) FLEETFS_RETURN_IF_ERROR(PwritevAll(fd, run, run_at));
  if (::ftruncate(fd, static_cast<off_t>(t.db_size)) != 0) {
    return ErrnoStatus("sizing the restored database", errno);
  }
  return Status::Ok();
}

Status Empty(int fd) {
  if (::ftruncate(fd, 0) != 0) return ErrnoStatus("emptying the restore's output file", errno);
  return Status::Ok();
}

// Reads an object whole into memory, never more than its header declared
// (a segment, tombstone or marker: bounded by the header's checked sizes).
Result<std::string> GetBounded(Destination& dest, std::string_view dir, const LogHeader& h) {
  std::string bytes;
  const std::uint64_t limit = h.ObjectBytes();
  Status st = dest.Get(LogObjectPath(dir, h.seq), [&](std::string_view piece) -> Status {
    if (piece.size() > limit - bytes.size()) {
      return DataLoss("the object is longer than the " + N(limit) + " bytes its header declares");
    }
    bytes.append(piece);
    return Status::Ok();
  });
  if (!st.ok()) return st;
  return bytes;
}

}  // namespace

Result<std::vector<std::uint64_t>> ListLog(Destination& dest, std::string_view dir,
                                           std::optional<std::uint64_t> after) {
  auto names = dest.ListFrom(dir, after ? LogObjectName(*after) : std::string());
  if (!names.ok()) {
    return names.status().WithContext("listing replica log " + dest.url() + "/" + std::string(dir));
  }
  auto seqs = ParseLogListing(*names);
  if (!seqs.ok()) {
    return seqs.status().WithContext("replica log " + dest.url() + "/" + std::string(dir));
  }
  return seqs;
}

Result<LogHeader> ReadLogHeader(Destination& dest, std::string_view dir, std::uint64_t seq,
                                std::uint64_t max_epoch) {
  auto head = dest.GetHead(LogObjectPath(dir, seq), kMaxLogHeaderBytes);
  if (!head.ok()) return head.status().WithContext(ObjectName(dest, dir, seq));
  auto h = Summarize(*head, Expect(dir, seq, max_epoch));
  if (!h.ok()) return h.status().WithContext(ObjectName(dest, dir, seq));
  return h;
}

Result<LogObjectSum> ReadLogObjectSum(Destination& dest, std::string_view dir, std::uint64_t seq,
                                      std::uint64_t max_epoch) {
  std::unique_ptr<XXH64_state_t, decltype(&XXH64_freeState)> hash(XXH64_createState(),
                                                                  XXH64_freeState);
  if (!hash) return Internal("out of memory for a checksum state");
  XXH64_reset(hash.get(), 0);
  const LogExpectation expected = Expect(dir, seq, max_epoch);
  std::string head;  // the first kMaxLogHeaderBytes, until the header is read
  std::optional<LogHeader> header;
  std::uint64_t seen = 0;
  Status st = dest.Get(LogObjectPath(dir, seq), [&](std::string_view piece) -> Status {
    XXH64_update(hash.get(), piece.data(), piece.size());
    seen += piece.size();
    if (!header) {
      head.append(piece.substr(0, kMaxLogHeaderBytes - std::min(head.size(), kMaxLogHeaderBytes)));
      if (head.size() < kMaxLogHeaderBytes) return Status::Ok();
      FLEETFS_ASSIGN_OR_RETURN(header, Summarize(head, expected));
    }
    if (seen > header->ObjectBytes()) {
      return DataLoss("the object is longer than the " + N(header->ObjectBytes()) +
                      " bytes its header declares");
    }
    return Status::Ok();
  });
  if (st.ok() && !header) {
    auto h = Summarize(head, expected);  // an object shorter than the largest header
    if (h.ok()) header = std::move(*h);
    st = h.status();
  }
  if (st.ok() && seen != header->ObjectBytes()) {
    st = DataLoss("truncated: " + N(seen) + " of " + N(header->ObjectBytes()) + " bytes");
  }
  if (!st.ok()) return st.WithContext(ObjectName(dest, dir, seq));
  return LogObjectSum{std::move(*header), XXH64_digest(hash.get())};
}

std::string_view LogRestoreResultName(LogRestoreResult r) {
  switch (r) {
    case LogRestoreResult::kRestored:
      return "restored";
    case LogRestoreResult::kNoReplica:
      return "no replica";
    case LogRestoreResult::kDeleted:
      return "deleted";
  }
  return "unknown";
}

Result<LogRestoreOutcome> RestoreFromLog(Destination& dest, std::string_view dir,
                                         std::optional<WallMs> at_ms, int out_fd,
                                         std::uint64_t max_epoch, const LogProgress& progress) {
  LogRestoreOutcome out;
  FLEETFS_ASSIGN_OR_RETURN(const std::vector<std::uint64_t> seqs, ListLog(dest, dir));
  if (seqs.empty()) {
    FLEETFS_RETURN_IF_ERROR(Empty(out_fd));
    return out;
  }
  out.tail_seq = seqs.back();
  auto at_or_before = [&](WallMs t) { return !at_ms || t <= *at_ms; };

  // Headers from the tail backwards to the newest snapshot at or before the
  // point in time: `back[k]` is object seqs[n-1-k].
  std::vector<LogHeader> back;
  std::optional<std::size_t> snap;  // index into seqs
  // The first segment after the object being read, when no snapshot comes
  // between: it needs a database to apply to, which a tombstone took away.
  // (A flag and a number: GCC 12 misjudges an optional here as uninitialized.)
  bool has_segment_after = false;
  std::uint64_t segment_after = 0;
  for (std::size_t i = seqs.size(); i-- > 0;) {
    FLEETFS_ASSIGN_OR_RETURN(LogHeader h, ReadLogHeader(dest, dir, seqs[i], max_epoch));
    if (!back.empty() && h.epoch > back.back().epoch) {
      return DataLoss(ObjectName(dest, dir, seqs[i]) + ": written at epoch " + N(h.epoch) +
                      ", above the epoch " + N(back.back().epoch) + " of object " +
                      N(back.back().seq) + " after it (epochs never decrease along a log)");
    }
    if (h.kind == LogKind::kSegment) {
      has_segment_after = true;
      segment_after = h.seq;
    }
    if (h.kind == LogKind::kSnapshot) has_segment_after = false;
    if (h.kind == LogKind::kTombstone && has_segment_after) {
      return DataLoss(ObjectName(dest, dir, segment_after) + ": a segment after the tombstone " +
                      N(h.seq) + " with no snapshot between (nothing to apply it to)");
    }
    const bool found = h.kind == LogKind::kSnapshot && at_or_before(h.first_ms);
    back.push_back(std::move(h));
    if (found) {
      snap = i;
      break;
    }
  }
  out.tail_epoch = back.front().epoch;

  if (!snap) {
    // No snapshot to start from: the whole log was read, oldest last.
    const std::string log = "replica log " + dest.url() + "/" + std::string(dir);
    if (seqs.front() != 0) {
      if (!at_ms) return DataLoss(log + " has lost its beginning and holds no snapshot");
      return Status(Code::kFailedPrecondition,
                    log + " begins at object " + N(seqs.front()) +
                        " (retention removed the older ones) and keeps no snapshot at or before " +
                        N(static_cast<std::uint64_t>(*at_ms)) + " ms");
    }
    std::optional<WallMs> deleted;
    bool base = false;  // a snapshot comes before, and no tombstone since
    for (auto it = back.rbegin(); it != back.rend(); ++it) {
      if (it->kind == LogKind::kSnapshot) base = true;
      if (it->kind == LogKind::kTombstone) base = false;
      if (it->kind == LogKind::kSegment && !base) {
        return DataLoss(ObjectName(dest, dir, it->seq) +
                        ": a segment with no snapshot before it in the log");
      }
      if (it->kind == LogKind::kTombstone && at_or_before(it->first_ms)) {
        deleted = it->first_ms;
        out.as_of_seq = it->seq;
      }
    }
    FLEETFS_RETURN_IF_ERROR(Empty(out_fd));
    if (deleted) {
      out.result = LogRestoreResult::kDeleted;
      out.as_of_ms = *deleted;
    } else {
      out.as_of_seq.reset();
    }
    return out;
  }

  std::vector<LogHeader> fwd(back.rbegin(), back.rend());  // fwd[k] is object seqs[*snap + k]
  std::uint64_t total = 0, done = 0;
  for (std::size_t k = 0; k < fwd.size(); ++k) {
    if (seqs[*snap + k] != fwd[0].seq + k) {
      return DataLoss("replica log " + dest.url() + "/" + std::string(dir) + " is missing object " +
                      N(fwd[0].seq + k) + " (a gap in its sequence)");
    }
    total += fwd[k].ObjectBytes();
  }

  // The snapshot, streaming to the output file.
  const LogHeader& sh = fwd[0];
  {
    LogSnapshotReader reader(out_fd, LogExpectation{std::string(dir), sh.seq, sh.epoch, max_epoch});
    Status st = dest.Get(LogObjectPath(dir, sh.seq), [&](std::string_view piece) -> Status {
      done += piece.size();
      if (progress) progress(done, total);
      return reader.Feed(piece);
    });
    if (st.ok()) st = reader.Finish();
    if (st.ok() && *reader.header() != sh) st = DataLoss("the object changed while it was read");
    if (!st.ok()) return st.WithContext(ObjectName(dest, dir, sh.seq));
    if (::ftruncate(out_fd, static_cast<off_t>(sh.db_size)) != 0) {
      return ErrnoStatus("sizing the restored database", errno);
    }
    out.as_of_seq = sh.seq;
    out.as_of_ms = sh.first_ms;
    out.bytes = sh.db_size;
    out.owner = sh.owner;
    if (fwd.size() == 1) out.tail_checksum = reader.checksum();
    std::uint64_t prev = reader.checksum();

    // Then every object after it, in order, while its time is at or before
    // the point in time: a point in time is the longest prefix of the log
    // written by then.
    for (std::size_t k = 1; k < fwd.size(); ++k) {
      const LogHeader& h = fwd[k];
      if (!at_or_before(h.first_ms)) break;
      const std::string name = ObjectName(dest, dir, h.seq);
      auto bytes = GetBounded(dest, dir, h);
      if (!bytes.ok()) return bytes.status().WithContext(name);
      // Views into the decoded body: nothing copied per page.
      auto obj = DecodeLogObjectViews(*bytes,
                                      LogExpectation{std::string(dir), h.seq, h.epoch, max_epoch});
      if (!obj.ok()) return obj.status().WithContext(name);
      if (obj->header != h) return DataLoss(name + ": the object changed while it was read");
      FLEETFS_RETURN_IF_ERROR(CheckChain(h, prev).WithContext(name));
      prev = obj->checksum;
      done += bytes->size();
      if (progress) progress(done, total);
      if (k + 1 == fwd.size()) out.tail_checksum = prev;
      if (h.kind == LogKind::kMarker) {
        out.as_of_seq = h.seq;
        continue;
      }
      if (h.kind == LogKind::kTombstone) {
        out = LogRestoreOutcome{LogRestoreResult::kDeleted,
                                out.tail_seq,
                                out.tail_epoch,
                                out.tail_checksum,
                                h.seq,
                                h.first_ms,
                                0,
                                0,
                                {}};
        FLEETFS_RETURN_IF_ERROR(Empty(out_fd));
        return out;
      }
      if (h.kind == LogKind::kSnapshot) {
        // The snapshot taken was the newest at or before the point in time.
        return Internal(name + ": a snapshot at or before the point in time after the one taken");
      }
      bool past = false;
      for (const TxnView& t : obj->txns) {
        if (!at_or_before(t.commit_ms)) {
          past = true;
          break;
        }
        FLEETFS_RETURN_IF_ERROR(ApplyTxn(out_fd, t).WithContext(name));
        ++out.commits;
        out.as_of_ms = t.commit_ms;
        out.bytes = t.db_size;
      }
      out.as_of_seq = h.seq;
      if (past) break;
    }
  }
  out.result = LogRestoreResult::kRestored;
  return out;
}

std::vector<std::uint64_t> PlanRetention(const std::vector<LogHeader>& headers, WallMs cutoff_ms) {
  std::optional<std::size_t> keep_from;
  for (std::size_t i = 0; i < headers.size(); ++i) {
    if (headers[i].kind == LogKind::kSnapshot && headers[i].first_ms <= cutoff_ms) keep_from = i;
  }
  std::vector<std::uint64_t> drop;
  for (std::size_t i = 0; keep_from && i < *keep_from; ++i) drop.push_back(headers[i].seq);
  return drop;
}

Result<int> PruneLog(Destination& dest, std::string_view dir, WallMs cutoff_ms,
                     std::uint64_t max_epoch) {
  FLEETFS_ASSIGN_OR_RETURN(const std::vector<std::uint64_t> seqs, ListLog(dest, dir));
  // Headers are read oldest first, and only until one is past the cutoff:
  // no later snapshot can then be at or before it (commit times grow along
  // the log), so the reads are about as many as the objects removed, not
  // the whole log every time. Stopping early only keeps more (the plan
  // never removes the last header it is given).
  std::vector<LogHeader> headers;
  for (std::uint64_t seq : seqs) {
    FLEETFS_ASSIGN_OR_RETURN(LogHeader h, ReadLogHeader(dest, dir, seq, max_epoch));
    const bool past = h.kind != LogKind::kMarker && h.first_ms > cutoff_ms;
    headers.push_back(std::move(h));
    if (past) break;
  }
  int removed = 0;
  for (std::uint64_t seq : PlanRetention(headers, cutoff_ms)) {
    Status st = dest.RemoveObject(LogObjectPath(dir, seq));
    if (!st.ok()) return st.WithContext("pruning " + ObjectName(dest, dir, seq));
    ++removed;
  }
  return removed;
}

}  // namespace fleetfs::replica
