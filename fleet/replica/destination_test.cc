#include "fleet/replica/destination.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <latch>
#include <thread>

#include "fleet/replica/counting_destination.h"
#include "fleet/replica/destination_fakes.h"
#include "fleet/unique_fd.h"

namespace fleetfs::replica {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;
using std::chrono::seconds;

// Sets the process umask for one test and puts the old one back.
class UmaskGuard {
 public:
  explicit UmaskGuard(mode_t mask) : old_(::umask(mask)) {}
  ~UmaskGuard() { ::umask(old_); }

 private:
  mode_t old_;
};

mode_t ModeOf(const fs::path& p) {
  struct stat st;
  EXPECT_EQ(::stat(p.c_str(), &st), 0) << p;
  return st.st_mode & 07777;
}

// Every name under `root` that starts ".tmp-", seen without List (which hides them).
std::vector<std::string> TempsUnder(const fs::path& root) {
  std::vector<std::string> temps;
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    if (e.path().filename().string().starts_with(".tmp-")) temps.push_back(e.path().string());
  }
  return temps;
}

// Makes an old file: last modified `age` ago.
void Backdate(const fs::path& p, seconds age) {
  auto then = std::chrono::system_clock::now() - age;
  auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(then.time_since_epoch()).count();
  timespec times[2];
  times[0].tv_sec = times[1].tv_sec = ns / 1'000'000'000;
  times[0].tv_nsec = times[1].tv_nsec = ns % 1'000'000'000;
  ASSERT_EQ(::utimensat(AT_FDCWD, p.c_str(), times, 0), 0) << p;
}

void WriteFile(const fs::path& p, std::string_view bytes) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << bytes;
}

std::string ReadAll(Destination& d, std::string_view path) {
  std::string out;
  Status st = d.Get(path, [&](std::string_view piece) {
    out.append(piece);
    return Status::Ok();
  });
  EXPECT_TRUE(st.ok()) << st.message();
  return out;
}

// A file:// destination in a fresh directory; the parameter is whether it
// stages creates in named temporary files instead of O_TMPFILEs.
class FileDest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    for (char& c : name) c = (c == '/') ? '_' : c;
    dir_ = fs::temp_directory_path() / ("fleetfs-dest-" + std::to_string(::getpid()) + "-" + name);
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "work");
    root_ = dir_ / "replica";
    dest_ = Open(root_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::shared_ptr<Destination> Open(const fs::path& root) {
    DestinationOptions options;
    options.named_temps_only = GetParam();
    auto d = OpenDestination("file://" + root.string(), options);
    EXPECT_TRUE(d.ok()) << d.status().message();
    return *d;
  }
  // A local file holding `bytes`, opened for reading.
  UniqueFd Local(const std::string& name, std::string_view bytes) {
    fs::path p = dir_ / "work" / name;
    WriteFile(p, bytes);
    return UniqueFd(::open(p.c_str(), O_RDONLY | O_CLOEXEC));
  }

  fs::path dir_;
  fs::path root_;
  std::shared_ptr<Destination> dest_;
};

INSTANTIATE_TEST_SUITE_P(Staging, FileDest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "named_temps" : "tmpfile"; });

TEST_P(FileDest, a_created_object_reads_back_whole) {
  ASSERT_TRUE(dest_->Create("k/log/0001", "hello").ok());
  EXPECT_EQ(ReadAll(*dest_, "k/log/0001"), "hello");
  EXPECT_EQ(*dest_->Size("k/log/0001"), 5u);
  EXPECT_TRUE(TempsUnder(root_).empty());
}

TEST_P(FileDest, a_create_on_a_taken_name_is_already_exists_and_leaves_the_object_alone) {
  ASSERT_TRUE(dest_->Create("k/log/0001", "first").ok());
  Status st = dest_->Create("k/log/0001", "second");
  EXPECT_EQ(st.code(), Code::kAlreadyExists);
  EXPECT_NE(st.message().find((root_ / "k/log/0001").string()), std::string::npos) << st.message();
  UniqueFd fd = Local("src", "third");
  EXPECT_EQ(dest_->CreateFromFile("k/log/0001", fd.get()).code(), Code::kAlreadyExists);
  EXPECT_EQ(ReadAll(*dest_, "k/log/0001"), "first");
  EXPECT_TRUE(TempsUnder(root_).empty());
}

TEST_P(FileDest, a_create_never_replaces_an_object_a_put_wrote) {
  ASSERT_TRUE(dest_->Put("k/log/0001", "put").ok());
  EXPECT_EQ(dest_->Create("k/log/0001", "create").code(), Code::kAlreadyExists);
  EXPECT_EQ(ReadAll(*dest_, "k/log/0001"), "put");
}

TEST_P(FileDest, create_from_file_copies_the_file_from_its_start_to_its_end) {
  std::string big(3 * (1 << 20) + 17, '\0');
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 31 + i / 4096);
  UniqueFd fd = Local("big", big);
  ASSERT_EQ(::lseek(fd.get(), 1000, SEEK_SET), 1000);  // the offset does not matter
  ASSERT_TRUE(dest_->CreateFromFile("k/snap", fd.get()).ok());
  EXPECT_EQ(ReadAll(*dest_, "k/snap"), big);
}

TEST_P(FileDest, a_failed_create_leaves_no_temporary_file_and_no_object) {
  fs::path wo = dir_ / "work" / "write-only";
  WriteFile(wo, "data");
  UniqueFd fd(::open(wo.c_str(), O_WRONLY | O_CLOEXEC));  // reading it fails
  Status st = dest_->CreateFromFile("k/log/0001", fd.get());
  EXPECT_EQ(st.code(), Code::kIoError) << st.message();
  EXPECT_EQ(dest_->Size("k/log/0001").status().code(), Code::kNotFound);
  EXPECT_TRUE(TempsUnder(root_).empty());
  // And the name is still free.
  EXPECT_TRUE(dest_->Create("k/log/0001", "x").ok());
}

TEST_P(FileDest, a_failed_put_leaves_no_temporary_file) {
  fs::path wo = dir_ / "work" / "write-only";
  WriteFile(wo, "data");
  UniqueFd fd(::open(wo.c_str(), O_WRONLY | O_CLOEXEC));
  EXPECT_EQ(dest_->PutFile("k/snap", fd.get()).code(), Code::kIoError);
  EXPECT_TRUE(TempsUnder(root_).empty());
}

TEST_P(FileDest, a_create_refuses_paths_that_leave_the_root_or_look_like_temporary_files) {
  for (std::string_view bad :
       {"", "/etc/x", "../x", "k/../../x", "k//x", "k/./x", ".tmp-1", "k/.tmp-x"}) {
    EXPECT_EQ(dest_->Create(bad, "x").code(), Code::kInvalidArgument) << bad;
  }
  EXPECT_FALSE(fs::exists(dir_ / "x"));
  EXPECT_TRUE(ValidateObjectPath("176/acme.db/log/0000000000000001.seg").ok());
}

TEST_P(FileDest, many_writers_creating_one_name_see_exactly_one_winner) {
  constexpr int kWriters = 12;
  constexpr int kRounds = 15;
  for (int round = 0; round < kRounds; ++round) {
    std::string path = "k/log/" + std::to_string(round);
    std::vector<std::string> bytes(kWriters);
    std::vector<UniqueFd> fds(kWriters);
    for (int w = 0; w < kWriters; ++w) {
      bytes[w] = "writer " + std::to_string(w) + " " +
                 std::string(20000 + w * 977, static_cast<char>('a' + w));
      fds[w] = Local("src-" + std::to_string(w), bytes[w]);
    }
    std::vector<Status> results(kWriters);
    std::latch start(kWriters);
    std::vector<std::thread> threads;
    for (int w = 0; w < kWriters; ++w) {
      threads.emplace_back([&, w] {
        start.arrive_and_wait();
        // Half write from memory, half from a file: both are create-only.
        results[w] = (w % 2 == 0) ? dest_->Create(path, bytes[w])
                                  : dest_->CreateFromFile(path, fds[w].get());
      });
    }
    for (auto& t : threads) t.join();
    int winner = -1;
    for (int w = 0; w < kWriters; ++w) {
      if (results[w].ok()) {
        EXPECT_EQ(winner, -1) << "two writers won " << path;
        winner = w;
      } else {
        EXPECT_EQ(results[w].code(), Code::kAlreadyExists) << results[w].message();
      }
    }
    ASSERT_NE(winner, -1) << "no writer won " << path;
    EXPECT_EQ(ReadAll(*dest_, path), bytes[winner]);
  }
  EXPECT_TRUE(TempsUnder(root_).empty());
}

TEST_P(FileDest, objects_are_0600_and_directories_0700_under_umask_0) {
  UmaskGuard mask(0);
  fs::path root = dir_ / "fresh";
  auto dest = Open(root);
  ASSERT_TRUE(dest->Put("a/b/put", "x").ok());
  ASSERT_TRUE(dest->Create("a/c/created", "x").ok());
  UniqueFd fd = Local("src", "bytes");
  ASSERT_TRUE(dest->PutFile("d/put-file", fd.get()).ok());
  ASSERT_TRUE(dest->CreateFromFile("d/e/created-file", fd.get()).ok());
  ASSERT_TRUE(dest->Probe().ok());
  for (const char* obj : {"a/b/put", "a/c/created", "d/put-file", "d/e/created-file", ".probe"}) {
    EXPECT_EQ(ModeOf(root / obj), 0600u) << obj;
  }
  for (const char* d : {"", "a", "a/b", "a/c", "d", "d/e"}) EXPECT_EQ(ModeOf(root / d), 0700u) << d;
}

TEST_P(FileDest, objects_keep_their_owner_bits_under_a_umask_that_takes_them) {
  UmaskGuard mask(0277);
  fs::path root = dir_ / "fresh";
  auto dest = Open(root);
  ASSERT_TRUE(dest->Create("a/created", "x").ok());
  ASSERT_TRUE(dest->Put("a/put", "x").ok());
  EXPECT_EQ(ModeOf(root / "a/created"), 0600u);
  EXPECT_EQ(ModeOf(root / "a/put"), 0600u);
  EXPECT_EQ(ModeOf(root / "a"), 0700u);
  EXPECT_EQ(ModeOf(root), 0700u);
}

TEST_P(FileDest, list_hides_temporary_files) {
  ASSERT_TRUE(dest_->Put("k/obj", "x").ok());
  WriteFile(root_ / "k" / ".tmp-0123-4", "crashed");
  auto names = dest_->List("k");
  ASSERT_TRUE(names.ok());
  EXPECT_EQ(*names, std::vector<std::string>{"obj"});
}

TEST_P(FileDest, list_from_gives_the_sorted_names_after_the_given_one) {
  for (const char* n : {"0003", "0001", "0010", "0002"})
    ASSERT_TRUE(dest_->Create(std::string("k/log/") + n, n).ok());
  ASSERT_TRUE(dest_->Put("k/log/sub/x", "").ok());
  EXPECT_EQ(*dest_->ListFrom("k/log", "0002"), (std::vector<std::string>{"0003", "0010", "sub"}));
  EXPECT_EQ(*dest_->ListFrom("k/log", ""),
            (std::vector<std::string>{"0001", "0002", "0003", "0010", "sub"}));
  EXPECT_TRUE(dest_->ListFrom("k/log", "zzz")->empty());
  EXPECT_TRUE(dest_->ListFrom("absent", "")->empty());
}

TEST_P(FileDest, clean_temps_removes_old_temporary_files_and_nothing_else) {
  ASSERT_TRUE(dest_->Put("k/log/obj", "x").ok());
  WriteFile(root_ / ".tmp-old-top", "x");
  WriteFile(root_ / "k" / "log" / ".tmp-old-deep", "x");
  WriteFile(root_ / "k" / "log" / ".tmp-fresh", "x");
  Backdate(root_ / ".tmp-old-top", seconds(7200));
  Backdate(root_ / "k" / "log" / ".tmp-old-deep", seconds(7200));
  Backdate(root_ / "k" / "log" / "obj", seconds(7200));  // old, but an object
  auto removed = dest_->CleanTemps(seconds(3600));
  ASSERT_TRUE(removed.ok()) << removed.status().message();
  EXPECT_EQ(*removed, 2);
  EXPECT_FALSE(fs::exists(root_ / ".tmp-old-top"));
  EXPECT_FALSE(fs::exists(root_ / "k" / "log" / ".tmp-old-deep"));
  EXPECT_TRUE(fs::exists(root_ / "k" / "log" / ".tmp-fresh"));  // perhaps a live writer's
  EXPECT_EQ(ReadAll(*dest_, "k/log/obj"), "x");
  EXPECT_EQ(*dest_->CleanTemps(seconds(3600)), 0);
}

TEST_P(FileDest, a_temporary_file_of_a_crashed_writer_does_not_block_later_writes) {
  // A crashed writer's leftover, named as this destination would name one.
  WriteFile(root_ / ".tmp-0000000000000000-0", "crashed");
  Backdate(root_ / ".tmp-0000000000000000-0", seconds(7200));
  ASSERT_TRUE(dest_->Create("obj", "x").ok());
  ASSERT_TRUE(dest_->Put("obj2", "x").ok());
  EXPECT_EQ(*dest_->CleanTemps(seconds(3600)), 1);
  EXPECT_TRUE(TempsUnder(root_).empty());
}

TEST_P(FileDest, a_counting_destination_counts_requests_by_kind_and_failures) {
  CountingDestination counted(dest_);
  ASSERT_TRUE(counted.Put("k/a", "x").ok());
  UniqueFd fd = Local("src", "y");
  ASSERT_TRUE(counted.PutFile("k/b", fd.get()).ok());
  ASSERT_TRUE(counted.Create("k/c", "z").ok());
  EXPECT_EQ(counted.CreateFromFile("k/c", fd.get()).code(), Code::kAlreadyExists);
  ASSERT_TRUE(counted.List("k").ok());
  ASSERT_TRUE(counted.ListFrom("k", "a").ok());
  EXPECT_EQ(ReadAll(counted, "k/a"), "x");
  ASSERT_TRUE(counted.GetHead("k/a", 1).ok());
  EXPECT_EQ(counted.Size("k/zzz").status().code(), Code::kNotFound);
  ASSERT_TRUE(counted.Remove("k/a").ok());
  ASSERT_TRUE(counted.Probe().ok());
  RequestCounts want{.lists = 2,
                     .puts = 2,
                     .creates = 2,
                     .gets = 1,
                     .heads = 1,
                     .sizes = 1,
                     .removes = 1,
                     .probes = 1,
                     .clean_temps = 0,
                     .failures = 2};
  EXPECT_EQ(counted.counts(), want);
  EXPECT_EQ(counted.counts().total(), 11u);
  counted.ResetCounts();
  EXPECT_EQ(counted.counts().total(), 0u);
}

// A clock that moves 7 ms at every second read: each call, started on one
// read and ended on the next, takes 7 ms.
class SteppingClock final : public MonotonicClock {
 public:
  MonoTime Now() const override {
    if (reads_++ % 2 == 1) now_ += std::chrono::milliseconds(7);
    return now_;
  }

 private:
  mutable int reads_ = 0;
  mutable MonoTime now_{};
};

TEST_P(FileDest, a_counting_destination_times_each_call_by_kind_failed_or_not) {
  SteppingClock clock;
  CountingDestination counted(dest_, &clock);
  ASSERT_TRUE(counted.Put("k/a", "x").ok());
  ASSERT_TRUE(counted.List("k").ok());
  EXPECT_EQ(counted.Size("k/zzz").status().code(), Code::kNotFound);
  auto by_kind = counted.latencies();
  auto at = [&](Request r) { return by_kind[static_cast<std::size_t>(r)]; };
  EXPECT_EQ(at(Request::kPut).count(), 1u);
  EXPECT_EQ(at(Request::kList).count(), 1u);
  EXPECT_EQ(at(Request::kSize).count(), 1u);
  EXPECT_EQ(at(Request::kGet).count(), 0u);
  EXPECT_EQ(at(Request::kPut).sum_ns, 7'000'000u);
  EXPECT_EQ(at(Request::kSize).buckets[HistogramBucketOf(7'000'000)], 1u);  // le="0.01"
}

// ---- the fakes

TEST(MemoryDestination, lists_one_level_like_a_directory) {
  MemoryDestination d;
  ASSERT_TRUE(d.Put("k/log/1", "a").ok());
  ASSERT_TRUE(d.Put("k/log/2", "b").ok());
  ASSERT_TRUE(d.Put("k/meta", "c").ok());
  ASSERT_TRUE(d.Put("kk", "d").ok());
  EXPECT_EQ(*d.List(""), (std::vector<std::string>{"k", "kk"}));
  EXPECT_EQ(*d.List("k"), (std::vector<std::string>{"log", "meta"}));
  EXPECT_EQ(*d.ListFrom("k/log", "1"), (std::vector<std::string>{"2"}));
  EXPECT_TRUE(d.List("absent")->empty());
  ASSERT_TRUE(d.Remove("k").ok());
  EXPECT_EQ(*d.List(""), (std::vector<std::string>{"kk"}));
}

TEST(MemoryDestination, a_name_is_an_object_or_a_directory_never_both) {
  MemoryDestination d;
  ASSERT_TRUE(d.Put("k/log/1", "a").ok());
  EXPECT_EQ(d.Put("k/log", "x").code(), Code::kFailedPrecondition);
  EXPECT_EQ(d.Create("k/log/1/x", "x").code(), Code::kFailedPrecondition);
}

TEST(MemoryDestination, get_streams_in_pieces_and_an_absent_object_is_not_found) {
  MemoryDestination d("memory://t", 3);
  ASSERT_TRUE(d.Put("o", "abcdefgh").ok());
  std::vector<std::string> pieces;
  ASSERT_TRUE(d.Get("o", [&](std::string_view p) {
                 pieces.emplace_back(p);
                 return Status::Ok();
               }).ok());
  EXPECT_EQ(pieces, (std::vector<std::string>{"abc", "def", "gh"}));
  EXPECT_EQ(*d.GetHead("o", 4), "abcd");
  EXPECT_EQ(*d.Size("o"), 8u);
  EXPECT_EQ(d.Get("absent", [](std::string_view) { return Status::Ok(); }).code(), Code::kNotFound);
  EXPECT_EQ(d.GetHead("absent", 1).status().code(), Code::kNotFound);
}

TEST(MemoryDestination, counts_its_requests_by_kind) {
  MemoryDestination d;
  ASSERT_TRUE(d.Create("a", "x").ok());
  EXPECT_EQ(d.Create("a", "y").code(), Code::kAlreadyExists);
  ASSERT_TRUE(d.Put("b", "x").ok());
  ASSERT_TRUE(d.List("").ok());
  EXPECT_EQ(ReadAll(d, "a"), "x");
  ASSERT_TRUE(d.GetHead("a", 1).ok());
  ASSERT_TRUE(d.Remove("b").ok());
  RequestCounts want{
      .lists = 1, .puts = 1, .creates = 2, .gets = 1, .heads = 1, .removes = 1, .failures = 1};
  EXPECT_EQ(d.counts(), want);
  EXPECT_EQ(d.Peek("a"), "x");  // peeking is not a request
  EXPECT_EQ(d.counts(), want);
}

TEST(MemoryDestination, many_writers_creating_one_name_see_exactly_one_winner) {
  constexpr int kWriters = 16;
  MemoryDestination d;
  for (int round = 0; round < 50; ++round) {
    std::string path = "k/" + std::to_string(round);
    std::vector<Status> results(kWriters);
    std::latch start(kWriters);
    std::vector<std::thread> threads;
    for (int w = 0; w < kWriters; ++w) {
      threads.emplace_back([&, w] {
        start.arrive_and_wait();
        results[w] = d.Create(path, "writer " + std::to_string(w));
      });
    }
    for (auto& t : threads) t.join();
    int winners = 0;
    for (int w = 0; w < kWriters; ++w) {
      if (results[w].ok()) {
        ++winners;
        EXPECT_EQ(d.Peek(path), "writer " + std::to_string(w));
      } else {
        EXPECT_EQ(results[w].code(), Code::kAlreadyExists);
        EXPECT_NE(results[w].message().find(path), std::string::npos);
      }
    }
    EXPECT_EQ(winners, 1) << path;
  }
  EXPECT_EQ(d.counts().creates, 50u * kWriters);
  EXPECT_EQ(d.counts().failures, 50u * (kWriters - 1));
}

TEST(FailingDestination, every_call_fails_with_the_chosen_status_until_healed) {
  auto mem = std::make_shared<MemoryDestination>();
  FailingDestination d(mem);
  d.FailEvery(Unavailable("the bucket does not answer"));
  EXPECT_EQ(d.Put("a", "x").code(), Code::kUnavailable);
  EXPECT_EQ(d.List("").status().code(), Code::kUnavailable);
  EXPECT_EQ(d.Probe().code(), Code::kUnavailable);
  EXPECT_EQ(d.injected_failures(), 3);
  EXPECT_FALSE(mem->Peek("a").has_value());  // a failed call never reached it
  d.Heal();
  EXPECT_TRUE(d.Put("a", "x").ok());
  EXPECT_EQ(mem->Peek("a"), "x");
}

TEST(FailingDestination, the_nth_call_of_a_kind_fails_once) {
  FailingDestination d;
  d.FailNth(Request::kCreate, 2, Status(Code::kDeadlineExceeded, "slow"));
  EXPECT_TRUE(d.Create("a", "x").ok());
  EXPECT_TRUE(d.Put("p", "x").ok());  // another kind does not count
  EXPECT_EQ(d.Create("b", "x").code(), Code::kDeadlineExceeded);
  EXPECT_TRUE(d.Create("b", "x").ok());
  EXPECT_EQ(d.injected_failures(), 1);
}

TEST(FailingDestination, a_full_disk_takes_an_empty_put_and_refuses_a_real_one) {
  FailingDestination d;
  d.FailWritesOver(0, ErrnoStatus("writing", ENOSPC));
  EXPECT_TRUE(d.Probe().ok());
  EXPECT_TRUE(d.Put("empty", "").ok());
  EXPECT_EQ(d.Put("real", "bytes").code(), Code::kIoError);
  EXPECT_EQ(d.Create("real", "bytes").code(), Code::kIoError);
  fs::path src = fs::temp_directory_path() / ("fleetfs-dest-full-" + std::to_string(::getpid()));
  WriteFile(src, "bytes");
  UniqueFd fd(::open(src.c_str(), O_RDONLY | O_CLOEXEC));
  EXPECT_EQ(d.PutFile("real", fd.get()).code(), Code::kIoError);
  EXPECT_EQ(d.CreateFromFile("real", fd.get()).code(), Code::kIoError);
  fs::remove(src);
  EXPECT_TRUE(d.List("").ok());  // reads still work
  EXPECT_EQ(d.injected_failures(), 4);
}

TEST(HangingDestination, a_held_call_waits_until_released) {
  auto mem = std::make_shared<MemoryDestination>();
  HangingDestination d(mem);
  d.Hang(Request::kCreate);
  std::atomic<bool> done{false};
  auto put = std::async(std::launch::async, [&] {
    Status st = d.Create("a", "x");
    done = true;
    return st;
  });
  ASSERT_TRUE(d.WaitHeld(1, seconds(10)));
  EXPECT_TRUE(d.List("").ok());  // another kind goes through
  EXPECT_FALSE(done.load());
  EXPECT_FALSE(mem->Peek("a").has_value());
  d.Release();
  EXPECT_TRUE(put.get().ok());
  EXPECT_EQ(mem->Peek("a"), "x");
  EXPECT_EQ(d.held(), 0);
  EXPECT_TRUE(d.Create("b", "x").ok());  // not held after the release
}

TEST(HangingDestination, a_call_nobody_releases_gives_up_with_deadline_exceeded) {
  HangingDestination d(std::make_shared<MemoryDestination>(), milliseconds(20));
  d.Hang();
  EXPECT_EQ(d.Get("a", [](std::string_view) { return Status::Ok(); }).code(),
            Code::kDeadlineExceeded);
  EXPECT_EQ(d.held(), 0);
}

}  // namespace
}  // namespace fleetfs::replica
