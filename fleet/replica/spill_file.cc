#include "fleet/replica/spill_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#include "fleet/fd_io.h"
#include "fleet/little_endian.h"

namespace fleetfs::replica {
namespace {

// A record: its length, commit time, database size and write count, then
// each write's offset and length before its bytes. Little-endian, local.
constexpr std::size_t kHeadBytes = 8 + 8 + 8 + 4;
constexpr std::size_t kWriteHeadBytes = 8 + 4;
// Punched in whole blocks: a partial block stays allocated anyway.
constexpr std::uint64_t kPunchUnit = 4096;

}  // namespace

std::uint64_t SpillFile::RecordBytes(const Txn& txn) {
  std::uint64_t n = kHeadBytes;
  for (const PageWrite& w : txn.writes) n += kWriteHeadBytes + w.data.size();
  return n;
}

Status SpillFile::Append(const Txn& txn) {
  if (!fd_.valid()) {
    fd_ = UniqueFd(
        ::openat(root_, path_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (!fd_.valid()) return ErrnoStatus("making the spill file " + path_, errno);
    read_ = end_ = freed_ = 0;
  }
  const std::uint64_t n = RecordBytes(txn);
  std::string rec;
  rec.reserve(n);
  PutLittleEndian<std::uint64_t>(rec, n);
  PutLittleEndian<std::int64_t>(rec, txn.commit_ms);
  PutLittleEndian<std::uint64_t>(rec, txn.db_size);
  PutLittleEndian<std::uint32_t>(rec, static_cast<std::uint32_t>(txn.writes.size()));
  for (const PageWrite& w : txn.writes) {
    PutLittleEndian<std::uint64_t>(rec, w.offset);
    PutLittleEndian<std::uint32_t>(rec, static_cast<std::uint32_t>(w.data.size()));
    rec += w.data;
  }
  if (Status st = PwriteAll(fd_.get(), rec.data(), rec.size(), end_); !st.ok()) {
    // Whatever landed past end_ is overwritten by the next record.
    return st.WithContext("the spill file " + path_);
  }
  if (count_ == 0) front_ms_ = txn.commit_ms;
  end_ += n;
  ++count_;
  return Status::Ok();
}

Result<SpillFile::Head> SpillFile::ReadHead(std::uint64_t at) const {
  char b[kHeadBytes];
  FLEETFS_ASSIGN_OR_RETURN(const std::size_t got, PreadFull(fd_.get(), b, sizeof b, at));
  const std::string_view in(b, got);
  if (got != sizeof b || GetLittleEndian<std::uint64_t>(in, 0) < kHeadBytes ||
      GetLittleEndian<std::uint64_t>(in, 0) > end_ - at) {
    return DataLoss("the spill file " + path_ + " has no whole record at offset " +
                    std::to_string(at));
  }
  return Head{GetLittleEndian<std::uint64_t>(in, 0), GetLittleEndian<std::int64_t>(in, 8)};
}

Result<Txn> SpillFile::Pop() {
  if (count_ == 0) return Internal("taking from the empty spill file " + path_);
  FLEETFS_ASSIGN_OR_RETURN(const Head head, ReadHead(read_));
  std::string rec(head.record_bytes, '\0');
  FLEETFS_ASSIGN_OR_RETURN(const std::size_t got,
                           PreadFull(fd_.get(), rec.data(), rec.size(), read_));
  if (got != rec.size()) {
    return DataLoss("the spill file " + path_ + " ends inside the record at offset " +
                    std::to_string(read_));
  }
  const std::string_view in(rec);
  Txn txn;
  txn.commit_ms = head.commit_ms;
  txn.db_size = GetLittleEndian<std::uint64_t>(in, 16);
  const std::uint32_t writes = GetLittleEndian<std::uint32_t>(in, 24);
  std::size_t at = kHeadBytes;
  for (std::uint32_t i = 0; i < writes; ++i) {
    if (in.size() - at < kWriteHeadBytes) return DataLoss("a short write record in " + path_);
    PageWrite w;
    w.offset = GetLittleEndian<std::uint64_t>(in, at);
    const std::uint32_t len = GetLittleEndian<std::uint32_t>(in, at + 8);
    at += kWriteHeadBytes;
    if (in.size() - at < len) return DataLoss("a short write record in " + path_);
    w.data.assign(in.substr(at, len));
    at += len;
    txn.writes.push_back(std::move(w));
  }
  read_ += head.record_bytes;
  --count_;
  front_ms_ = 0;
  if (count_ > 0) {
    auto next = ReadHead(read_);
    front_ms_ = next.ok() ? next->commit_ms : txn.commit_ms;  // a bad one is found by its Pop
  }
  return txn;
}

Result<std::vector<WallMs>> SpillFile::CommitTimes() const {
  std::vector<WallMs> times;
  times.reserve(count_);
  std::uint64_t at = read_;
  for (std::size_t i = 0; i < count_; ++i) {
    FLEETFS_ASSIGN_OR_RETURN(const Head head, ReadHead(at));
    times.push_back(head.commit_ms);
    at += head.record_bytes;
  }
  return times;
}

std::uint64_t SpillFile::Trim() {
  const std::uint64_t before = disk_bytes();
  if (count_ == 0) {
    Clear();
    return before;
  }
  const std::uint64_t upto = read_ / kPunchUnit * kPunchUnit;
  if (upto > freed_ &&
      ::fallocate(fd_.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(freed_),
                  static_cast<off_t>(upto - freed_)) == 0) {
    freed_ = upto;
  }
  return before - disk_bytes();
}

void SpillFile::Clear() {
  if (fd_.valid()) {
    fd_.Reset();
    ::unlinkat(root_, path_.c_str(), 0);
  }
  read_ = end_ = freed_ = 0;
  count_ = 0;
  front_ms_ = 0;
}

}  // namespace fleetfs::replica
