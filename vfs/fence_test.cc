// The fence without a mount: a recording notifier stands for the kernel.
#include "vfs/fence.h"

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <mutex>

namespace fleetfs::vfs {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

class FakeClock final : public MonotonicClock {
 public:
  MonoTime Now() const override { return MonoTime(seconds(1000)); }
};

// What the kernel was told, in order, as one line each.
class RecordingNotifier final : public KernelNotifier {
 public:
  void InvalEntry(std::uint64_t parent, std::string_view name) override {
    Add("entry " + std::to_string(parent) + "/" + std::string(name));
  }
  void InvalInode(std::uint64_t ino) override { Add("inode " + std::to_string(ino)); }
  void Store(std::uint64_t ino, std::uint64_t offset, std::string_view data) override {
    bool zeros = data.find_first_not_of('\0') == std::string_view::npos;
    Add("store " + std::to_string(ino) + "@" + std::to_string(offset) + " " +
        std::to_string(data.size()) + (zeros ? " zeros" : " data"));
  }
  std::vector<std::string> told() {
    std::lock_guard lock(mu_);
    return told_;
  }

 private:
  void Add(std::string line) {
    std::lock_guard lock(mu_);
    told_.push_back(std::move(line));
  }
  std::mutex mu_;  // guards told_
  std::vector<std::string> told_;
};

class FakeFiles final : public FencedFiles {
 public:
  std::vector<FenceTarget> files;  // set before the fence runs
  NegativeNames absent{100, seconds(1)};
  std::vector<FenceTarget> FilesIn(const std::vector<ServedRange>& ranges) override {
    std::vector<FenceTarget> in;
    for (const auto& f : files) {
      Slot slot = static_cast<Slot>(f.ino % 1000);  // the tests number files by slot
      for (const auto& r : ranges) {
        if (slot >= r.first && slot <= r.last) in.push_back(f);
      }
    }
    return in;
  }
  std::vector<EntryName> ForgetAbsentIn(const std::vector<ServedRange>& claimed) override {
    return absent.ForgetIn(claimed, MonoTime(seconds(1000)));
  }
  std::size_t OpenHandlesIn(Slot, Slot) override { return 0; }
};

class FenceTest : public ::testing::Test {
 protected:
  void SetUp() override { fence_.Start(); }

  std::shared_ptr<const ServingView> Serving(Slot first, Slot last, std::uint64_t epoch,
                                             std::uint64_t period) {
    auto view = ServingView::Make(
        {ServedRange{first, last, ServingToken{epoch, period}, clock_.Now() + seconds(10)}}, true);
    EXPECT_TRUE(view.ok());
    return std::make_shared<const ServingView>(*view);
  }

  FakeClock clock_;
  RecordingNotifier kernel_;
  FakeFiles files_;
  VfsStats stats_;
  Fence fence_{kernel_, files_, clock_, stats_};
};

TEST_F(FenceTest, a_withdrawn_range_is_told_to_the_kernel_only_after_every_older_view_is_let_go) {
  files_.files = {FenceTarget{1005, {2, "a.db"}, FileRole::kMain, std::nullopt},
                  FenceTarget{2005, {2, "a.db-wal"}, FileRole::kWal, std::nullopt}};
  auto old = Serving(0, 99, 1, 1);
  std::shared_ptr<const ServingView> in_flight = old;  // a write still holds it
  fence_.Replaced(std::move(old), ServingView(), clock_.Now());
  auto waited = std::async(std::launch::async, [&] { fence_.Wait(); });
  EXPECT_EQ(waited.wait_for(milliseconds(100)), std::future_status::timeout);
  EXPECT_TRUE(kernel_.told().empty());
  in_flight.reset();  // the write is done
  waited.get();
  EXPECT_EQ(kernel_.told(), (std::vector<std::string>{"entry 2/a.db", "inode 1005",
                                                       "entry 2/a.db-wal", "inode 2005"}));
  EXPECT_EQ(stats_.fences.load(), 1u);
}

TEST_F(FenceTest, a_wal_index_keeps_its_pages_and_only_its_headers_are_zeroed_in_the_cache) {
  files_.files = {FenceTarget{1005, {2, "a.db-shm"}, FileRole::kShm, 32768},
                  FenceTarget{2005, {2, "b.db-shm"}, FileRole::kShm, 40},
                  FenceTarget{3005, {2, "c.db-shm"}, FileRole::kShm, std::nullopt}};
  fence_.Replaced(Serving(0, 99, 1, 1), ServingView(), clock_.Now());
  fence_.Wait();
  // A -shm smaller than both headers holds nothing a reader trusts, and a
  // store must not grow it; one of unknown size is left alone.
  EXPECT_EQ(kernel_.told(), (std::vector<std::string>{"entry 2/a.db-shm", "store 1005@0 96 zeros",
                                                       "entry 2/b.db-shm", "entry 2/c.db-shm"}));
}

TEST_F(FenceTest, a_renewal_tells_the_kernel_nothing) {
  files_.files = {FenceTarget{1005, {2, "a.db"}, FileRole::kMain, std::nullopt}};
  auto first = Serving(0, 99, 1, 1);
  fence_.Replaced(first, *Serving(0, 99, 1, 1), clock_.Now());
  fence_.Wait();
  EXPECT_TRUE(kernel_.told().empty());
  EXPECT_EQ(stats_.fences.load(), 0u);
}

TEST_F(FenceTest, a_range_served_anew_makes_the_kernel_forget_its_cached_absent_names) {
  ASSERT_TRUE(files_.absent.Remember(2, "a.db-journal", 5, clock_.Now()));
  ASSERT_TRUE(files_.absent.Remember(3, "b.db", 150, clock_.Now()));
  fence_.Replaced(std::make_shared<const ServingView>(), *Serving(0, 99, 2, 1), clock_.Now());
  fence_.Wait();
  EXPECT_EQ(kernel_.told(), (std::vector<std::string>{"entry 2/a.db-journal"}));
}

TEST_F(FenceTest, the_sidecars_of_a_deleted_tenant_are_forgotten_without_waiting_for_views) {
  std::shared_ptr<const ServingView> held = Serving(0, 99, 1, 1);
  fence_.Replaced(held, *held, clock_.Now());  // nothing withdrawn, but `held` is still held
  fence_.Queue(FenceJob{{}, {}, {EntryName{2, "a.db-wal"}, EntryName{2, "a.db-shm"}}});
  fence_.Wait();
  EXPECT_EQ(kernel_.told(), (std::vector<std::string>{"entry 2/a.db-wal", "entry 2/a.db-shm"}));
}

TEST_F(FenceTest, jobs_still_queued_at_stop_are_run) {
  fence_.Queue(FenceJob{{}, {}, {EntryName{2, "x.db-wal"}}});
  fence_.Stop();
  EXPECT_EQ(kernel_.told(), (std::vector<std::string>{"entry 2/x.db-wal"}));
}

}  // namespace
}  // namespace fleetfs::vfs
