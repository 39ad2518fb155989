// The WAL reader (wal::ReadCommitted) on any bytes: a local user who can
// write a tenant's database through the mount writes its -wal file.
//
// Input: one byte of options, then the log. Option bit 0 "seals" the log
// before it is read: the header checksum and every whole frame's salts and
// checksum chain are made valid, as SQLite would write them, so the fuzzer
// reaches the transaction logic rather than stopping at a checksum. Bits 1-3
// pick the byte budget of one read.
//
// Properties: reading never fails on a readable file; a transaction's pages
// are whole pages in ascending order with a commit after them; reading again
// from the cursor finds nothing new; reading in budgeted steps returns the
// same transactions as one read, and stops at the same place.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "fleet/unique_fd.h"
#include "fleet/wal_format.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

using namespace fleetfs::wal;  // NOLINT: the fuzz target's own file

std::uint32_t Be32(const std::uint8_t* p) {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) |
         std::uint32_t{p[3]};
}
void PutBe32(std::uint8_t* p, std::uint32_t v) {
  p[0] = static_cast<std::uint8_t>(v >> 24);
  p[1] = static_cast<std::uint8_t>(v >> 16);
  p[2] = static_cast<std::uint8_t>(v >> 8);
  p[3] = static_cast<std::uint8_t>(v);
}

// Makes the header and every whole frame valid, as SQLite writes them.
void Seal(std::vector<std::uint8_t>& log) {
  if (log.size() < kHeaderSize) return;
  const bool be = Be32(log.data()) == kMagicBigEndian;
  Checksum sum = Continue({}, be, log.data(), 24);
  PutBe32(log.data() + 24, sum.s0);
  PutBe32(log.data() + 28, sum.s1);
  const std::uint32_t page_size = Be32(log.data() + 8);
  if (page_size < 512 || page_size > 65536 || (page_size & (page_size - 1)) != 0) return;
  const std::size_t frame = kFrameHeaderSize + page_size;
  for (std::size_t at = kHeaderSize; at + frame <= log.size(); at += frame) {
    std::uint8_t* f = log.data() + at;
    std::memcpy(f + 8, log.data() + 16, 8);  // the header's salts
    sum = Continue(sum, be, f, 8);
    sum = Continue(sum, be, f + kFrameHeaderSize, page_size);
    PutBe32(f + 16, sum.s0);
    PutBe32(f + 20, sum.s1);
  }
}

bool SameTxn(const CommittedTxn& a, const CommittedTxn& b) {
  return a.page_size == b.page_size && a.db_pages == b.db_pages &&
         a.commit_frame_offset == b.commit_frame_offset && a.pages == b.pages;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::uint8_t options = data[0];
  std::vector<std::uint8_t> log(data + 1, data + size);
  if (options & 1) Seal(log);
  const std::uint64_t budgets[] = {1, 512, 4096, 65536, 1 << 20, 0, 1000, 100000};
  const std::uint64_t budget = budgets[(options >> 1) & 7];

  fleetfs::UniqueFd fd(::memfd_create("wal-fuzz", MFD_CLOEXEC));
  FUZZ_CHECK(fd.get() >= 0, "memfd_create");
  FUZZ_CHECK(::write(fd.get(), log.data(), log.size()) == static_cast<ssize_t>(log.size()),
             "write");

  WalCursor whole;
  auto all = ReadCommitted(fd.get(), whole, 0);
  FUZZ_CHECK(all.ok(), "reading a readable log failed");
  FUZZ_CHECK(!all->restarted, "a first read is a restart");
  std::uint64_t last_commit = 0;
  for (const CommittedTxn& t : all->txns) {
    FUZZ_CHECK(whole.header && t.page_size == whole.header->page_size, "a page size");
    FUZZ_CHECK(t.db_pages != 0, "a commit without a database size");
    FUZZ_CHECK(t.commit_frame_offset >= kHeaderSize && t.commit_frame_offset < log.size(),
               "a commit frame outside the log");
    FUZZ_CHECK(t.commit_frame_offset >= last_commit, "commits out of order");
    last_commit = t.commit_frame_offset + 1;
    FUZZ_CHECK(!t.pages.empty(), "a transaction without pages");
    std::uint32_t previous = 0;
    for (const auto& [pgno, bytes] : t.pages) {
      FUZZ_CHECK(pgno > previous, "pages not in ascending order");
      FUZZ_CHECK(bytes.size() == t.page_size, "a page that is not whole");
      previous = pgno;
    }
  }
  FUZZ_CHECK(whole.offset <= std::max<std::uint64_t>(log.size(), kHeaderSize),
             "a cursor past the log");

  auto again = ReadCommitted(fd.get(), whole, 0);
  FUZZ_CHECK(again.ok() && again->txns.empty() && !again->restarted,
             "reading again from the cursor found more");

  WalCursor stepped;
  std::vector<CommittedTxn> steps;
  for (int i = 0; i <= static_cast<int>(all->txns.size()); ++i) {
    auto step = ReadCommitted(fd.get(), stepped, budget);
    FUZZ_CHECK(step.ok(), "a budgeted read failed");
    if (step->txns.empty()) break;
    for (CommittedTxn& t : step->txns) steps.push_back(std::move(t));
  }
  FUZZ_CHECK(steps.size() == all->txns.size(), "budgeted reads found another count");
  for (std::size_t i = 0; i < steps.size(); ++i) {
    FUZZ_CHECK(SameTxn(steps[i], all->txns[i]), "budgeted reads found another transaction");
  }
  FUZZ_CHECK(stepped.offset == whole.offset, "budgeted reads stopped elsewhere");
  return 0;
}
