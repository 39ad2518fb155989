// The s3:// destination against a real S3-compatible server (s3rver), run
// by tests/s3/s3_fixture.py, which starts the server and sets
// FLEETFS_S3_ENDPOINT, FLEETFS_S3_BUCKET and the AWS_* credentials:
//
//   python3 tests/s3/s3_fixture.py run -- s3_destination_live_test
//   python3 tests/s3/s3_fixture.py run --no-conditional --
//       env FLEETFS_S3_NO_CONDITIONAL=1 s3_destination_live_test
//   python3 tests/s3/s3_fixture.py run --proxy -- s3_destination_live_test --gtest_filter='Faults.*'
//
// With --proxy, FLEETFS_S3_ENDPOINT is a fault proxy (tests/s3/fault_proxy.py)
// whose faults the Faults tests set through FLEETFS_S3_PROXY_CONTROL.
//
// Each test works under a prefix of its own. Without FLEETFS_S3_ENDPOINT the
// tests fail: they are registered only through the fixture.
#include <curl/curl.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <latch>
#include <thread>

#include "fleet/replica/s3_destination.h"
#include "fleet/unique_fd.h"

namespace fleetfs::replica::s3 {
namespace {

namespace fs = std::filesystem;

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

bool NoConditionalServer() { return Env("FLEETFS_S3_NO_CONDITIONAL") == "1"; }

std::string ReadAll(Destination& d, std::string_view path) {
  std::string out;
  Status st = d.Get(path, [&](std::string_view piece) {
    out.append(piece);
    return Status::Ok();
  });
  EXPECT_TRUE(st.ok()) << st.message();
  return out;
}

class Live : public ::testing::Test {
 protected:
  void SetUp() override {
    endpoint_ = Env("FLEETFS_S3_ENDPOINT");
    bucket_ = Env("FLEETFS_S3_BUCKET");
    ASSERT_FALSE(endpoint_.empty() || bucket_.empty())
        << "run through tests/s3/s3_fixture.py run -- " << "s3_destination_live_test";
    std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    prefix_ = "live-" + std::to_string(::getpid()) + "-" + name;
    work_ = fs::temp_directory_path() / ("fleetfs-s3-live-" + std::to_string(::getpid()) + "-" + name);
    fs::remove_all(work_);
    fs::create_directories(work_);
  }
  void TearDown() override { fs::remove_all(work_); }

  S3Settings Settings() const {
    return S3Settings{.endpoint = endpoint_, .region = "", .path_style = {}};
  }

  std::shared_ptr<Destination> Open(S3DestinationOptions options = {},
                                    std::string url = "") {
    if (url.empty()) url = "s3://" + bucket_ + "/" + prefix_;
    auto d = OpenS3Destination(url, Settings(), std::move(options));
    EXPECT_TRUE(d.ok()) << d.status().message();
    return d.ok() ? *d : nullptr;
  }

  UniqueFd Local(const std::string& name, std::string_view bytes) {
    fs::path p = work_ / name;
    std::ofstream(p, std::ios::binary | std::ios::trunc) << bytes;
    return UniqueFd(::open(p.c_str(), O_RDONLY | O_CLOEXEC));
  }

  std::string endpoint_;
  std::string bucket_;
  std::string prefix_;
  fs::path work_;
};

class Conditional : public Live {
 protected:
  void SetUp() override {
    // Not a skip: ctest runs these only against the conditional server, so
    // meeting the other one means the run was set up wrong.
    if (NoConditionalServer()) {
      GTEST_FAIL() << "run against a server without conditional writes; these need "
                      "s3_fixture.py run -- (without --no-conditional)";
    }
    Live::SetUp();
  }
};

TEST_F(Conditional, a_created_object_reads_back_and_a_second_create_is_already_exists) {
  auto d = Open();
  ASSERT_TRUE(d);
  ASSERT_TRUE(d->Create("k/log/0001", "hello world").ok());
  Status again = d->Create("k/log/0001", "other");
  EXPECT_EQ(again.code(), Code::kAlreadyExists) << again.message();
  EXPECT_NE(again.message().find("k/log/0001"), std::string::npos) << again.message();
  UniqueFd fd = Local("src", "from a file");
  EXPECT_EQ(d->CreateFromFile("k/log/0001", fd.get()).code(), Code::kAlreadyExists);
  EXPECT_EQ(ReadAll(*d, "k/log/0001"), "hello world");
  EXPECT_EQ(*d->GetHead("k/log/0001", 5), "hello");
  EXPECT_EQ(*d->GetHead("k/log/0001", 100), "hello world");
  EXPECT_EQ(*d->Size("k/log/0001"), 11u);
  // A put replaces; a create never does.
  ASSERT_TRUE(d->Put("k/log/0001", "replaced").ok());
  EXPECT_EQ(ReadAll(*d, "k/log/0001"), "replaced");
  ASSERT_TRUE(d->CreateFromFile("k/log/0002", fd.get()).ok());
  EXPECT_EQ(ReadAll(*d, "k/log/0002"), "from a file");
}

TEST_F(Conditional, keys_with_characters_that_need_encoding_are_signed_and_listed_right) {
  auto d = Open();
  ASSERT_TRUE(d);
  // Not '(', ')', '!', '*' or '\'': s3rver signs query values with
  // encodeURIComponent, which leaves them as they are where AWS encodes them;
  // and not '&', which s3rver's listings escape twice.
  const std::string name = "a b+c=d~f%g,h;\xc3\xa9";
  ASSERT_TRUE(d->Create("k/" + name, "x").ok());
  EXPECT_EQ(d->Create("k/" + name, "y").code(), Code::kAlreadyExists);
  EXPECT_EQ(ReadAll(*d, "k/" + name), "x");
  EXPECT_EQ(*d->List("k"), std::vector<std::string>{name});
  auto after = d->ListFrom("k", name);
  ASSERT_TRUE(after.ok()) << after.status().message();
  EXPECT_TRUE(after->empty());
  EXPECT_TRUE(d->Remove("k/" + name).ok());
  EXPECT_TRUE(d->List("k")->empty());
}

TEST_F(Conditional, an_absent_object_is_not_found_and_an_empty_one_has_an_empty_head) {
  auto d = Open();
  ASSERT_TRUE(d);
  EXPECT_EQ(d->Get("absent", [](std::string_view) { return Status::Ok(); }).code(),
            Code::kNotFound);
  EXPECT_EQ(d->GetHead("absent", 4).status().code(), Code::kNotFound);
  EXPECT_EQ(d->Size("absent").status().code(), Code::kNotFound);
  ASSERT_TRUE(d->Create("empty", "").ok());
  auto head = d->GetHead("empty", 4);
  ASSERT_TRUE(head.ok()) << head.status().message();
  EXPECT_EQ(*head, "");
  EXPECT_EQ(*d->Size("empty"), 0u);
  EXPECT_EQ(ReadAll(*d, "empty"), "");
}

TEST_F(Conditional, list_and_list_from_page_through_many_keys) {
  S3DestinationOptions options;
  options.max_keys = 7;
  auto d = Open(std::move(options));
  ASSERT_TRUE(d);
  std::vector<std::string> want;
  for (int i = 0; i < 40; ++i) {
    char name[16];
    std::snprintf(name, sizeof name, "%04d", i);
    want.emplace_back(name);
    ASSERT_TRUE(d->Create(std::string("k/log/") + name, name).ok());
  }
  ASSERT_TRUE(d->Put("k/log/sub/x", "x").ok());
  ASSERT_TRUE(d->Put("k/log/sub/y", "y").ok());
  ASSERT_TRUE(d->Put("k/other", "o").ok());
  auto all = d->ListFrom("k/log", "");
  ASSERT_TRUE(all.ok()) << all.status().message();
  std::vector<std::string> with_sub = want;
  with_sub.push_back("sub");
  EXPECT_EQ(*all, with_sub);
  auto listed = d->List("k/log");
  ASSERT_TRUE(listed.ok());
  std::sort(listed->begin(), listed->end());
  EXPECT_EQ(*listed, with_sub);
  auto after = d->ListFrom("k/log", "0031");
  ASSERT_TRUE(after.ok()) << after.status().message();
  EXPECT_EQ(*after, (std::vector<std::string>{"0032", "0033", "0034", "0035", "0036", "0037",
                                              "0038", "0039", "sub"}));
  EXPECT_EQ(*d->ListFrom("k/log", "sub"), std::vector<std::string>{});
  auto top = d->List("k");
  ASSERT_TRUE(top.ok());
  std::sort(top->begin(), top->end());
  EXPECT_EQ(*top, (std::vector<std::string>{"log", "other"}));
  EXPECT_TRUE(d->List("absent")->empty());
}

TEST_F(Conditional, of_twenty_racing_creates_exactly_one_wins) {
  auto d = Open();
  ASSERT_TRUE(d);
  constexpr int kWriters = 20;
  std::vector<Status> results(kWriters);
  std::latch start(kWriters);
  std::vector<std::thread> threads;
  for (int w = 0; w < kWriters; ++w) {
    threads.emplace_back([&, w] {
      start.arrive_and_wait();
      results[w] = d->Create("k/log/race", "writer " + std::to_string(w));
    });
  }
  for (auto& t : threads) t.join();
  int winner = -1;
  for (int w = 0; w < kWriters; ++w) {
    if (results[w].ok()) {
      EXPECT_EQ(winner, -1) << "two writers won";
      winner = w;
    } else {
      EXPECT_EQ(results[w].code(), Code::kAlreadyExists) << results[w].message();
    }
  }
  ASSERT_NE(winner, -1);
  EXPECT_EQ(ReadAll(*d, "k/log/race"), "writer " + std::to_string(winner));
}

TEST_F(Conditional, a_large_create_goes_by_multipart_and_its_completion_is_conditional) {
  S3DestinationOptions options;
  options.multipart_threshold = 5u << 20;
  options.part_size = 5u << 20;
  auto d = Open(std::move(options));
  ASSERT_TRUE(d);
  std::string big(11 * (1 << 20) + 123, '\0');
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 131 + i / 7919);
  UniqueFd fd = Local("big", big);
  Status first = d->CreateFromFile("k/snap", fd.get());
  ASSERT_TRUE(first.ok()) << first.message();
  EXPECT_EQ(*d->Size("k/snap"), big.size());
  EXPECT_TRUE(ReadAll(*d, "k/snap") == big);
  std::string other(6 << 20, 'x');
  UniqueFd fd2 = Local("other", other);
  Status again = d->CreateFromFile("k/snap", fd2.get());
  EXPECT_EQ(again.code(), Code::kAlreadyExists) << again.message();
  EXPECT_EQ(*d->Size("k/snap"), big.size());
  // A put by multipart replaces.
  ASSERT_TRUE(d->PutFile("k/snap", fd2.get()).ok());
  EXPECT_EQ(*d->Size("k/snap"), other.size());
}

TEST_F(Conditional, remove_takes_a_directory_and_everything_under_it) {
  auto d = Open();
  ASSERT_TRUE(d);
  for (const char* p : {"k/a", "k/log/1", "k/log/2", "k/log/sub/3", "kk/keep"}) {
    ASSERT_TRUE(d->Put(p, p).ok());
  }
  ASSERT_TRUE(d->Remove("k").ok());
  EXPECT_TRUE(d->List("k")->empty());
  EXPECT_EQ(*d->List(""), std::vector<std::string>{"kk"});
  ASSERT_TRUE(d->Remove("kk/keep").ok());
  EXPECT_TRUE(d->List("")->empty());
  EXPECT_TRUE(d->Remove("absent").ok());
}

TEST_F(Conditional, the_probe_passes_and_leaves_nothing_listed) {
  auto d = Open();
  ASSERT_TRUE(d);
  Status st = d->Probe();
  EXPECT_TRUE(st.ok()) << st.message();
  EXPECT_TRUE(d->List("")->empty());
}

TEST_F(Conditional, clean_temps_answers_on_a_store_without_upload_listing) {
  auto d = Open();
  ASSERT_TRUE(d);
  // s3rver has no ListMultipartUploads: nothing to clean, and no error.
  auto cleaned = d->CleanTemps(std::chrono::seconds(3600));
  ASSERT_TRUE(cleaned.ok()) << cleaned.status().message();
  EXPECT_EQ(*cleaned, 0);
}

TEST_F(Live, a_wrong_secret_is_one_line_about_the_credentials) {
  ::setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret", 1);
  auto d = Open();
  ::setenv("AWS_SECRET_ACCESS_KEY", "S3RVER", 1);
  ASSERT_TRUE(d);
  Status st = d->Probe();
  EXPECT_EQ(st.code(), Code::kFailedPrecondition) << st.message();
  EXPECT_NE(st.message().find("SignatureDoesNotMatch"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find(bucket_), std::string::npos) << st.message();
  EXPECT_NE(st.message().find(endpoint_), std::string::npos) << st.message();
  EXPECT_EQ(st.message().find("not-the-secret"), std::string::npos) << st.message();
  EXPECT_EQ(d->List("").status().code(), Code::kFailedPrecondition);
}

TEST_F(Live, a_missing_bucket_is_one_line_naming_it) {
  auto d = Open({}, "s3://no-such-bucket-" + std::to_string(::getpid()) + "/x");
  ASSERT_TRUE(d);
  Status st = d->Probe();
  EXPECT_EQ(st.code(), Code::kFailedPrecondition) << st.message();
  EXPECT_NE(st.message().find("bucket no-such-bucket-"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("does not exist"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find(endpoint_), std::string::npos) << st.message();
}

TEST_F(Live, an_unreachable_endpoint_is_unavailable) {
  S3DestinationOptions options;
  options.retry.base = Millis(1);
  options.retry.cap = Millis(2);
  auto d = OpenS3Destination("s3://" + bucket_ + "/x",
                             S3Settings{.endpoint = "http://127.0.0.1:1", .region = "",
                                        .path_style = {}},
                             std::move(options));
  ASSERT_TRUE(d.ok());
  Status st = (*d)->Probe();
  EXPECT_EQ(st.code(), Code::kUnavailable) << st.message();
  EXPECT_NE(st.message().find("http://127.0.0.1:1"), std::string::npos) << st.message();
}

// Faults through the proxy: each test sets one and checks the call still
// comes out right.
class Faults : public Conditional {
 protected:
  void SetUp() override {
    control_ = Env("FLEETFS_S3_PROXY_CONTROL");
    // Not a skip: ctest runs Faults.* only through the proxy.
    if (control_.empty()) GTEST_FAIL() << "no fault proxy: run through s3_fixture.py run --proxy";
    Conditional::SetUp();
  }
  // GET control/mode?QUERY on the proxy's control port.
  void SetMode(const std::string& query) {
    CURL* c = curl_easy_init();
    ASSERT_NE(c, nullptr);
    std::string url = control_ + "/mode?" + query;
    curl_easy_setopt(c, CURLOPT_URL, url.c_str());
    curl_easy_setopt(c, CURLOPT_PROXY, "");
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, +[](char*, std::size_t s, std::size_t n, void*) {
      return s * n;
    });
    CURLcode code = curl_easy_perform(c);
    long status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(c);
    ASSERT_EQ(code, CURLE_OK) << url;
    ASSERT_EQ(status, 200) << url;
  }
  std::shared_ptr<Destination> Quick() {
    S3DestinationOptions options;
    options.retry.base = Millis(5);
    options.retry.cap = Millis(50);
    // A hung request is given up after this and tried again.
    options.timeouts.total = Millis(2000);
    return Open(std::move(options));
  }
  std::string control_;
};

TEST_F(Faults, internal_errors_and_slowdowns_are_retried) {
  auto d = Quick();
  ASSERT_TRUE(d);
  SetMode("mode=error500&count=2");
  Status st = d->Create("k/log/1", "a");
  EXPECT_TRUE(st.ok()) << st.message();
  SetMode("mode=slowdown&count=2");
  st = d->Create("k/log/2", "b");
  EXPECT_TRUE(st.ok()) << st.message();
  SetMode("mode=pass");
  EXPECT_EQ(ReadAll(*d, "k/log/1"), "a");
  EXPECT_EQ(ReadAll(*d, "k/log/2"), "b");
}

TEST_F(Faults, a_reset_before_the_server_saw_the_request_is_retried) {
  auto d = Quick();
  ASSERT_TRUE(d);
  SetMode("mode=reset&count=2");
  Status st = d->Create("k/log/1", "a");
  EXPECT_TRUE(st.ok()) << st.message();
  SetMode("mode=pass");
  EXPECT_EQ(ReadAll(*d, "k/log/1"), "a");
}

TEST_F(Faults, a_create_that_landed_and_lost_its_answer_comes_back_already_exists) {
  auto d = Quick();
  ASSERT_TRUE(d);
  SetMode("mode=reset_after&count=1&methods=PUT");
  Status st = d->Create("k/log/1", "mine");
  // The retry found the name taken: by this very write, which the caller
  // learns by reading the object (Create's contract).
  EXPECT_EQ(st.code(), Code::kAlreadyExists) << st.message();
  SetMode("mode=pass");
  EXPECT_EQ(ReadAll(*d, "k/log/1"), "mine");
}

TEST_F(Faults, a_hung_request_times_out_and_is_retried) {
  auto d = Quick();
  ASSERT_TRUE(d);
  SetMode("mode=hang&count=1&methods=PUT");
  Status st = d->Create("k/log/1", "a");
  EXPECT_TRUE(st.ok()) << st.message();
  SetMode("mode=pass");
  EXPECT_EQ(ReadAll(*d, "k/log/1"), "a");
}

TEST_F(Faults, a_multipart_upload_survives_faults_on_its_parts) {
  S3DestinationOptions options;
  options.retry.base = Millis(5);
  options.retry.cap = Millis(50);
  options.multipart_threshold = 5u << 20;
  options.part_size = 5u << 20;
  auto d = Open(std::move(options));
  ASSERT_TRUE(d);
  std::string big(11u << 20, 'q');
  UniqueFd fd = Local("big", big);
  SetMode("mode=error500&count=3&methods=PUT,POST");
  Status st = d->CreateFromFile("k/snap", fd.get());
  EXPECT_TRUE(st.ok()) << st.message();
  SetMode("mode=pass");
  EXPECT_EQ(*d->Size("k/snap"), big.size());
}

TEST_F(Faults, a_store_that_keeps_failing_is_unavailable_naming_it) {
  S3DestinationOptions options;
  options.retry.base = Millis(1);
  options.retry.cap = Millis(5);
  options.retry.max_attempts = 3;
  auto d = Open(std::move(options));
  ASSERT_TRUE(d);
  SetMode("mode=slowdown");
  Status st = d->Create("k/log/1", "a");
  SetMode("mode=pass");
  EXPECT_EQ(st.code(), Code::kUnavailable) << st.message();
  EXPECT_NE(st.message().find("SlowDown"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find(bucket_), std::string::npos) << st.message();
}

TEST(NoConditional, the_probe_refuses_a_store_that_accepts_a_second_create) {
  // Not a skip: ctest runs NoConditional.* only against that server.
  if (!NoConditionalServer()) {
    GTEST_FAIL() << "needs s3_fixture.py run --no-conditional and FLEETFS_S3_NO_CONDITIONAL=1";
  }
  auto d = OpenS3Destination("s3://" + Env("FLEETFS_S3_BUCKET") + "/probe",
                             S3Settings{.endpoint = Env("FLEETFS_S3_ENDPOINT"), .region = "",
                                        .path_style = {}});
  ASSERT_TRUE(d.ok()) << d.status().message();
  Status st = (*d)->Probe();
  EXPECT_EQ(st.code(), Code::kFailedPrecondition) << st.message();
  EXPECT_NE(st.message().find("does not honour conditional writes (If-None-Match: *)"),
            std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find(Env("FLEETFS_S3_ENDPOINT")), std::string::npos) << st.message();
}

}  // namespace
}  // namespace fleetfs::replica::s3
