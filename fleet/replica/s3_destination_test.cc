#include "fleet/replica/s3_destination.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <atomic>

#include "fleet/unique_fd.h"

namespace fleetfs::replica::s3 {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kSecret = "SECRETdoNOTshowTHIS";

std::string Decode(std::string_view s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size()) {
      out += static_cast<char>(std::stoi(std::string(s.substr(i + 1, 2)), nullptr, 16));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

std::string XmlEscape(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '&') out += "&amp;";
    else if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else out += c;
  }
  return out;
}

S3Response Answer(long status, std::string body = "") {
  S3Response r;
  r.status = status;
  r.body = std::move(body);
  return r;
}

std::string ErrorXml(std::string_view code) {
  return "<Error><Code>" + std::string(code) + "</Code><Message>m</Message></Error>";
}

// An in-memory S3 bucket behind the transport interface: enough of
// ListObjectsV2, PUT (If-None-Match: *), GET (Range), HEAD, DELETE and
// multipart upload for the destination. `intercept` sees each request first
// and may answer it instead (a fault); `honours_conditional` false is a
// store that ignores If-None-Match.
class FakeS3 {
 public:
  struct Seen {
    std::string method;
    std::string path_and_query;
    std::map<std::string, std::string> headers;
  };
  using Intercept = std::function<std::optional<Result<S3Response>>(const S3Request&, FakeS3&)>;

  bool honours_conditional = true;
  Intercept intercept;
  std::function<void()> on_piece;  // each piece of a GET's body sent
  std::map<std::string, std::string> objects;
  std::map<std::string, std::map<int, std::string>> uploads;
  std::vector<Seen> seen;
  std::vector<std::string> extra_list_keys;  // hostile: added to every listing page
  bool repeat_token = false;                 // hostile: the same token forever
  bool ignore_range = false;
  bool answer_206_when_ignoring_range = false;  // and says 206 all the same
  // A GET's body breaks off after this many bytes (0: never), breaks_left times.
  std::size_t break_get_after = 0;
  int breaks_left = 0;
  bool lists_uploads = true;  // false: ListMultipartUploads is NotImplemented (s3rver)
  std::map<std::string, std::string> upload_key;        // upload id -> key
  std::map<std::string, std::string> upload_initiated;  // upload id -> S3 time
  std::mutex mu;

  Result<S3Response> Send(const S3Request& r, const BodySink* sink) {
    std::unique_lock lock(mu);
    Seen s{r.method, r.path_and_query, {}};
    for (const auto& [n, v] : r.headers) s.headers[n] = v;
    seen.push_back(s);
    if (intercept) {
      lock.unlock();
      auto forced = intercept(r, *this);
      if (forced) return *forced;
      lock.lock();
    }
    return Handle(r, s.headers, sink);
  }

  // Applies a request as the bucket would (for faults that land the write
  // and lose the answer).
  void Apply(const S3Request& r) {
    std::map<std::string, std::string> headers(r.headers.begin(), r.headers.end());
    std::lock_guard lock(mu);
    (void)Handle(r, headers, nullptr);
  }

  std::vector<std::string> Methods() {
    std::vector<std::string> out;
    for (const Seen& s : seen) {
      std::string q = s.path_and_query;
      std::size_t at = q.find('?');
      std::string what = s.method + (at == std::string::npos ? "" : " ?" + q.substr(at + 1, q.find('=', at) - at - 1));
      if (s.headers.count("If-None-Match")) what += " if-none-match";
      out.push_back(what);
    }
    return out;
  }

 private:
  static std::string Body(const S3Request& r) {
    if (r.body_fd < 0) return std::string(r.body);
    std::string out(r.body_length, '\0');
    ssize_t n = ::pread(r.body_fd, out.data(), out.size(), static_cast<off_t>(r.body_offset));
    out.resize(n < 0 ? 0 : static_cast<std::size_t>(n));
    return out;
  }

  Result<S3Response> Handle(const S3Request& r, std::map<std::string, std::string>& headers,
                            const BodySink* sink) {
    std::string pq = r.path_and_query;
    std::size_t qat = pq.find('?');
    std::string path = pq.substr(0, qat);
    std::map<std::string, std::string> q;
    if (qat != std::string::npos) {
      std::string query = pq.substr(qat + 1);
      std::size_t start = 0;
      while (start <= query.size()) {
        std::size_t amp = query.find('&', start);
        std::string kv = query.substr(start, amp == std::string::npos ? amp : amp - start);
        std::size_t eq = kv.find('=');
        q[Decode(kv.substr(0, eq))] = eq == std::string::npos ? "" : Decode(kv.substr(eq + 1));
        if (amp == std::string::npos) break;
        start = amp + 1;
      }
    }
    if (path.empty() && q.count("uploads")) return ListUploads(q);
    if (path.empty()) return List(q);
    std::string key = Decode(path.substr(1));
    bool conditional = honours_conditional && headers.count("If-None-Match") != 0;
    if (r.method == "POST" && q.count("uploads")) {
      std::string id = "upload-" + std::to_string(next_upload_++);
      uploads[id];
      upload_key[id] = key;
      upload_initiated[id] = "2099-01-01T00:00:00.000Z";
      return Answer(200, "<InitiateMultipartUploadResult><UploadId>" + id +
                             "</UploadId></InitiateMultipartUploadResult>");
    }
    if (q.count("uploadId")) {
      auto up = uploads.find(q["uploadId"]);
      if (up == uploads.end()) return Answer(404, ErrorXml("NoSuchUpload"));
      if (r.method == "PUT") {
        int n = std::stoi(q["partNumber"]);
        up->second[n] = Body(r);
        S3Response a = Answer(200);
        a.etag = "\"part" + std::to_string(n) + "\"";
        return a;
      }
      if (r.method == "DELETE") {
        uploads.erase(up);
        return Answer(204);
      }
      // POST: complete.
      if (conditional && objects.count(key)) return Answer(412, ErrorXml("PreconditionFailed"));
      std::string whole;
      for (const auto& [n, part] : up->second) whole += part;
      objects[key] = whole;
      uploads.erase(up);
      return Answer(200, "<CompleteMultipartUploadResult><Key>" + XmlEscape(key) +
                             "</Key></CompleteMultipartUploadResult>");
    }
    if (r.method == "PUT") {
      if (conditional && objects.count(key)) return Answer(412, ErrorXml("PreconditionFailed"));
      objects[key] = Body(r);
      return Answer(200);
    }
    if (r.method == "DELETE") {
      objects.erase(key);
      return Answer(204);
    }
    auto it = objects.find(key);
    if (it == objects.end()) return Answer(404, r.method == "HEAD" ? "" : ErrorXml("NoSuchKey"));
    if (r.method == "HEAD") {
      S3Response a = Answer(200);
      a.content_length = it->second.size();
      return a;
    }
    std::string body = it->second;
    const std::string etag = "\"" + std::to_string(std::hash<std::string>()(body)) + "\"";
    if (auto m = headers.find("If-Match"); m != headers.end() && m->second != etag) {
      return Answer(412, ErrorXml("PreconditionFailed"));
    }
    long status = 200;
    std::string content_range;
    if (auto range = headers.find("Range"); range != headers.end() && !ignore_range) {
      // bytes=FIRST-[LAST]
      std::string spec = range->second.substr(6);
      std::size_t dash = spec.find('-');
      std::size_t first = std::stoul(spec.substr(0, dash));
      std::size_t last = dash + 1 < spec.size() ? std::stoul(spec.substr(dash + 1)) : body.size() - 1;
      if (first >= body.size()) return Answer(416, ErrorXml("InvalidRange"));
      content_range = "bytes " + std::to_string(first) + "-" + std::to_string(last) + "/" +
                      std::to_string(body.size());
      body = body.substr(first, last + 1 - first);
      status = 206;
    }
    if (ignore_range && answer_206_when_ignoring_range && headers.count("Range") > 0) {
      status = 206;
    }
    if (sink != nullptr) {
      S3Response head = Answer(status);
      head.etag = etag;
      head.content_range = content_range;
      head.content_length = body.size();
      if (r.on_head) r.on_head(head);
      for (std::size_t i = 0; i < body.size(); i += 3) {
        if (break_get_after > 0 && i >= break_get_after && breaks_left > 0) {
          --breaks_left;
          return Unavailable("connection reset mid-body");
        }
        if (on_piece) on_piece();
        FLEETFS_RETURN_IF_ERROR((*sink)(std::string_view(body).substr(i, 3)));
      }
      return Answer(status);
    }
    return Answer(status, body);
  }

  Result<S3Response> ListUploads(std::map<std::string, std::string>& q) {
    if (!lists_uploads) return Answer(501, ErrorXml("NotImplemented"));
    std::string xml = "<ListMultipartUploadsResult><IsTruncated>false</IsTruncated>";
    for (const auto& [id, parts] : uploads) {
      if (!upload_key[id].starts_with(q["prefix"])) continue;
      xml += "<Upload><Key>" + XmlEscape(upload_key[id]) + "</Key><UploadId>" + id +
             "</UploadId><Initiated>" + upload_initiated[id] + "</Initiated></Upload>";
    }
    return Answer(200, xml + "</ListMultipartUploadsResult>");
  }

  Result<S3Response> List(std::map<std::string, std::string>& q) {
    EXPECT_EQ(q["list-type"], "2");
    const std::string prefix = q["prefix"];
    const bool delimited = q["delimiter"] == "/";
    const std::size_t max = std::stoul(q["max-keys"]);
    std::string after = q.count("continuation-token") ? q["continuation-token"] : q["start-after"];
    std::string xml = "<ListBucketResult>";
    std::set<std::string> prefixes;
    std::size_t count = 0;
    std::string last;
    bool truncated = false;
    for (const auto& [key, bytes] : objects) {
      if (!key.starts_with(prefix) || key <= after) continue;
      std::string rest = key.substr(prefix.size());
      std::size_t slash = rest.find('/');
      if (delimited && slash != std::string::npos) {
        std::string p = prefix + rest.substr(0, slash + 1);
        if (prefixes.count(p) || p <= after) continue;
        if (count == max) {
          truncated = true;
          break;
        }
        prefixes.insert(p);
        xml += "<CommonPrefixes><Prefix>" + XmlEscape(p) + "</Prefix></CommonPrefixes>";
        last = p + "\xff";  // past everything under it
      } else {
        if (count == max) {
          truncated = true;
          break;
        }
        xml += "<Contents><Key>" + XmlEscape(key) + "</Key></Contents>";
        last = key;
      }
      ++count;
    }
    for (const std::string& k : extra_list_keys) xml += "<Contents><Key>" + XmlEscape(k) + "</Key></Contents>";
    if (repeat_token) truncated = true;
    xml += std::string("<IsTruncated>") + (truncated ? "true" : "false") + "</IsTruncated>";
    if (truncated) {
      xml += "<NextContinuationToken>" + XmlEscape(repeat_token ? "same" : last) +
             "</NextContinuationToken>";
    }
    xml += "</ListBucketResult>";
    return Answer(200, xml);
  }

  int next_upload_ = 1;
};

class FakeTransport final : public S3Transport {
 public:
  explicit FakeTransport(FakeS3* s3) : s3_(s3) {}
  Result<S3Response> Send(const S3Request& request, const BodySink* sink) override {
    return s3_->Send(request, sink);
  }

 private:
  FakeS3* s3_;
};

class NoClock final : public MonotonicClock {
 public:
  MonoTime Now() const override { return MonoTime{}; }
};

class S3DestinationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    work_ = fs::temp_directory_path() / ("fleetfs-s3-dest-" + std::to_string(::getpid()) + "-" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(work_);
    fs::create_directories(work_);
  }
  void TearDown() override { fs::remove_all(work_); }

  S3DestinationOptions Options() {
    S3DestinationOptions o;
    o.env = [](const char* name) -> std::optional<std::string> {
      if (std::string_view(name) == "AWS_ACCESS_KEY_ID") return "AKID";
      if (std::string_view(name) == "AWS_SECRET_ACCESS_KEY") return std::string(kSecret);
      return std::nullopt;
    };
    o.make_transport = [this](const S3Endpoint&, const std::string&, const S3Credentials&) {
      return std::make_unique<FakeTransport>(&s3_);
    };
    o.clock = &clock_;
    o.sleep = [](Millis) {};
    o.seed = 7;
    return o;
  }
  std::shared_ptr<Destination> Open(S3DestinationOptions o) {
    auto d = OpenS3Destination("s3://bucket/fleet", S3Settings{}, std::move(o));
    EXPECT_TRUE(d.ok()) << d.status().message();
    return *d;
  }
  std::shared_ptr<Destination> Open() { return Open(Options()); }

  UniqueFd Local(const std::string& name, std::string_view bytes) {
    fs::path p = work_ / name;
    std::ofstream(p, std::ios::binary | std::ios::trunc) << bytes;
    return UniqueFd(::open(p.c_str(), O_RDONLY | O_CLOEXEC));
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

  FakeS3 s3_;
  NoClock clock_;
  fs::path work_;
};

TEST_F(S3DestinationTest, objects_live_under_the_prefix_with_encoded_keys) {
  auto d = Open();
  ASSERT_TRUE(d->Put("k a/x+y", "v").ok());
  EXPECT_EQ(s3_.seen.back().path_and_query, "/fleet/k%20a/x%2By");
  EXPECT_EQ(s3_.objects.count("fleet/k a/x+y"), 1u);
  EXPECT_EQ(d->url(), "s3://bucket/fleet");
}

TEST_F(S3DestinationTest, a_create_is_conditional_and_a_taken_name_is_already_exists) {
  auto d = Open();
  ASSERT_TRUE(d->Create("k/log/1", "first").ok());
  EXPECT_EQ(s3_.seen.back().headers["If-None-Match"], "*");
  Status st = d->Create("k/log/1", "second");
  EXPECT_EQ(st.code(), Code::kAlreadyExists);
  EXPECT_NE(st.message().find("fleet/k/log/1"), std::string::npos) << st.message();
  EXPECT_EQ(ReadAll(*d, "k/log/1"), "first");
  ASSERT_TRUE(d->Put("k/log/1", "put").ok());
  EXPECT_EQ(s3_.seen.back().headers.count("If-None-Match"), 0u);
  EXPECT_EQ(ReadAll(*d, "k/log/1"), "put");
  EXPECT_EQ(d->Create("../x", "x").code(), Code::kInvalidArgument);
}

TEST_F(S3DestinationTest, a_create_whose_lost_answer_is_retried_into_a_412_is_already_exists) {
  int puts = 0;
  s3_.intercept = [&](const S3Request& r, FakeS3& s3) -> std::optional<Result<S3Response>> {
    if (r.method == "PUT" && puts++ == 0) {
      s3.Apply(r);  // it landed ...
      return Result<S3Response>(Unavailable("connection reset"));  // ... and the answer was lost
    }
    return std::nullopt;
  };
  auto d = Open();
  Status st = d->Create("k/log/1", "mine");
  EXPECT_EQ(st.code(), Code::kAlreadyExists) << st.message();
  EXPECT_EQ(s3_.objects["fleet/k/log/1"], "mine");  // the caller reads it and finds its own
  EXPECT_EQ(puts, 2);
}

TEST_F(S3DestinationTest, a_conditional_conflict_is_retried) {
  int puts = 0;
  s3_.intercept = [&](const S3Request& r, FakeS3&) -> std::optional<Result<S3Response>> {
    if (r.method == "PUT" && puts++ < 2) {
      return Result<S3Response>(Answer(409, ErrorXml("ConditionalRequestConflict")));
    }
    return std::nullopt;
  };
  auto d = Open();
  EXPECT_TRUE(d->Create("k/log/1", "x").ok());
  EXPECT_EQ(puts, 3);
}

TEST_F(S3DestinationTest, list_pages_and_names_objects_and_directories_relative_to_dir) {
  auto o = Options();
  o.max_keys = 2;
  auto d = Open(std::move(o));
  for (const char* p : {"k/log/0003", "k/log/0001", "k/log/0010", "k/log/0002", "k/log/sub/x",
                        "k/log/sub/y", "k/meta", "kk/z"}) {
    ASSERT_TRUE(d->Put(p, p).ok());
  }
  s3_.objects["fleet/k/log/.tmp-probe/1"] = "";  // the destination's own names are hidden
  s3_.objects["fleet/k/log/"] = "";              // a console's "directory" marker
  std::size_t before = s3_.seen.size();
  auto names = d->ListFrom("k/log", "");
  ASSERT_TRUE(names.ok()) << names.status().message();
  EXPECT_EQ(*names, (std::vector<std::string>{"0001", "0002", "0003", "0010", "sub"}));
  EXPECT_GE(s3_.seen.size() - before, 3u);  // paged
  EXPECT_NE(s3_.seen[before].path_and_query.find("delimiter=%2F"), std::string::npos);
  EXPECT_NE(s3_.seen[before].path_and_query.find("prefix=fleet%2Fk%2Flog%2F"), std::string::npos);
  before = s3_.seen.size();
  EXPECT_EQ(*d->ListFrom("k/log", "0002"), (std::vector<std::string>{"0003", "0010", "sub"}));
  EXPECT_NE(s3_.seen[before].path_and_query.find("start-after=fleet%2Fk%2Flog%2F0002"),
            std::string::npos);
  auto top = d->List("");
  ASSERT_TRUE(top.ok());
  std::sort(top->begin(), top->end());
  EXPECT_EQ(*top, (std::vector<std::string>{"k", "kk"}));
  EXPECT_TRUE(d->List("absent")->empty());
}

TEST_F(S3DestinationTest, keys_outside_the_prefix_asked_for_are_ignored) {
  auto d = Open();
  ASSERT_TRUE(d->Put("k/a", "x").ok());
  s3_.extra_list_keys = {"other/evil", "fleet/k/a/../../etc", "fleet/kk"};
  auto names = d->List("k");
  ASSERT_TRUE(names.ok()) << names.status().message();
  EXPECT_EQ(*names, std::vector<std::string>{"a"});
}

TEST_F(S3DestinationTest, a_listing_that_never_ends_is_data_loss) {
  auto d = Open();
  s3_.repeat_token = true;
  auto names = d->List("k");
  EXPECT_EQ(names.status().code(), Code::kDataLoss);
  EXPECT_NE(names.status().message().find("it would never end"), std::string::npos)
      << names.status().message();
}

TEST_F(S3DestinationTest, a_malformed_listing_is_data_loss_naming_the_replica) {
  s3_.intercept = [](const S3Request&, FakeS3&) -> std::optional<Result<S3Response>> {
    return Result<S3Response>(Answer(200, "<html>proxy login</html>"));
  };
  auto d = Open();
  auto names = d->List("k");
  EXPECT_EQ(names.status().code(), Code::kDataLoss);
  EXPECT_NE(names.status().message().find("s3://bucket/fleet"), std::string::npos)
      << names.status().message();
}

TEST_F(S3DestinationTest, get_head_and_size_read_objects_and_absent_ones_are_not_found) {
  auto d = Open();
  ASSERT_TRUE(d->Put("o", "abcdefgh").ok());
  ASSERT_TRUE(d->Put("empty", "").ok());
  EXPECT_EQ(ReadAll(*d, "o"), "abcdefgh");
  EXPECT_EQ(*d->GetHead("o", 3), "abc");
  EXPECT_EQ(s3_.seen.back().headers["Range"], "bytes=0-2");
  EXPECT_EQ(*d->GetHead("empty", 3), "");  // 416
  EXPECT_EQ(*d->GetHead("o", 0), "");
  EXPECT_EQ(*d->Size("o"), 8u);
  EXPECT_EQ(d->Get("absent", [](std::string_view) { return Status::Ok(); }).code(),
            Code::kNotFound);
  EXPECT_EQ(d->GetHead("absent", 3).status().code(), Code::kNotFound);
  EXPECT_EQ(d->Size("absent").status().code(), Code::kNotFound);
  s3_.ignore_range = true;  // a store that sends the whole object
  EXPECT_EQ(*d->GetHead("o", 3), "abc");
}

TEST_F(S3DestinationTest, a_body_that_breaks_off_is_resumed_where_it_broke) {
  auto d = Open();
  std::string big;
  for (int i = 0; i < 100; ++i) big += static_cast<char>('a' + i % 26);
  ASSERT_TRUE(d->Put("o", big).ok());
  s3_.break_get_after = 30;
  s3_.breaks_left = 2;
  s3_.seen.clear();
  EXPECT_EQ(ReadAll(*d, "o"), big);
  ASSERT_EQ(s3_.seen.size(), 3u);
  EXPECT_EQ(s3_.seen[1].headers["Range"], "bytes=30-");
  EXPECT_EQ(s3_.seen[2].headers["Range"], "bytes=60-");
  EXPECT_FALSE(s3_.seen[1].headers["If-Match"].empty());
}

TEST_F(S3DestinationTest, an_object_replaced_while_it_was_read_is_not_spliced) {
  auto d = Open();
  ASSERT_TRUE(d->Put("o", std::string(100, 'a')).ok());
  s3_.break_get_after = 30;
  s3_.breaks_left = 1;
  std::string got;
  int pieces = 0;
  Status st = d->Get("o", [&](std::string_view p) {
    got.append(p);
    // Replaced by another writer after the first piece.
    if (++pieces == 1) s3_.objects["fleet/o"] = std::string(100, 'b');
    return Status::Ok();
  });
  EXPECT_EQ(st.code(), Code::kUnavailable) << st.message();
  EXPECT_NE(st.message().find("changed while it was read"), std::string::npos) << st.message();
  EXPECT_EQ(got.find('b'), std::string::npos);
}

TEST_F(S3DestinationTest, remove_deletes_the_object_and_everything_under_it) {
  auto o = Options();
  o.max_keys = 2;
  auto d = Open(std::move(o));
  for (const char* p : {"k", "k/a", "k/log/1", "k/log/sub/2", "kk/keep"}) {
    s3_.objects[std::string("fleet/") + p] = "x";
  }
  ASSERT_TRUE(d->Remove("k").ok());
  EXPECT_EQ(s3_.objects.size(), 1u);
  EXPECT_EQ(s3_.objects.count("fleet/kk/keep"), 1u);
  EXPECT_TRUE(d->Remove("absent").ok());
}

TEST_F(S3DestinationTest, a_large_create_is_a_multipart_upload_completed_conditionally) {
  auto o = Options();
  o.multipart_threshold = 10;
  o.part_size = 4;
  auto d = Open(std::move(o));
  UniqueFd fd = Local("big", "0123456789AB");
  ASSERT_TRUE(d->CreateFromFile("k/snap", fd.get()).ok());
  EXPECT_EQ(s3_.objects["fleet/k/snap"], "0123456789AB");
  EXPECT_EQ(s3_.Methods(), (std::vector<std::string>{"POST ?uploads", "PUT ?partNumber",
                                                     "PUT ?partNumber", "PUT ?partNumber",
                                                     "POST ?uploadId if-none-match"}));
  EXPECT_NE(s3_.seen[4].path_and_query.find("uploadId=upload-1"), std::string::npos);
  // Taken: the completion is refused and the upload aborted.
  s3_.seen.clear();
  UniqueFd other = Local("other", "zzzzzzzzzzzzzzzz");
  Status st = d->CreateFromFile("k/snap", other.get());
  EXPECT_EQ(st.code(), Code::kAlreadyExists) << st.message();
  EXPECT_EQ(s3_.objects["fleet/k/snap"], "0123456789AB");
  EXPECT_EQ(s3_.Methods().back(), "DELETE ?uploadId");
  EXPECT_TRUE(s3_.uploads.empty());
  // A put by multipart is not conditional.
  s3_.seen.clear();
  ASSERT_TRUE(d->PutFile("k/snap", other.get()).ok());
  EXPECT_EQ(s3_.Methods().back(), "POST ?uploadId");
  EXPECT_EQ(s3_.objects["fleet/k/snap"], "zzzzzzzzzzzzzzzz");
}

TEST_F(S3DestinationTest, a_failed_part_aborts_the_upload_and_leaves_no_object) {
  s3_.intercept = [](const S3Request& r, FakeS3&) -> std::optional<Result<S3Response>> {
    if (r.path_and_query.find("partNumber=2") != std::string::npos) {
      return Result<S3Response>(Answer(403, ErrorXml("AccessDenied")));
    }
    return std::nullopt;
  };
  auto o = Options();
  o.multipart_threshold = 10;
  o.part_size = 4;
  auto d = Open(std::move(o));
  UniqueFd fd = Local("big", "0123456789AB");
  Status st = d->CreateFromFile("k/snap", fd.get());
  EXPECT_EQ(st.code(), Code::kFailedPrecondition) << st.message();
  EXPECT_EQ(s3_.objects.count("fleet/k/snap"), 0u);
  EXPECT_TRUE(s3_.uploads.empty());
  EXPECT_EQ(s3_.Methods().back(), "DELETE ?uploadId");
}

TEST_F(S3DestinationTest, an_error_inside_a_200_completion_is_retried_then_succeeds) {
  int completes = 0;
  s3_.intercept = [&](const S3Request& r, FakeS3&) -> std::optional<Result<S3Response>> {
    if (r.method == "POST" && r.path_and_query.find("uploadId=") != std::string::npos &&
        completes++ == 0) {
      return Result<S3Response>(Answer(200, "<?xml version=\"1.0\"?>\n" + ErrorXml("InternalError")));
    }
    return std::nullopt;
  };
  auto o = Options();
  o.multipart_threshold = 10;
  o.part_size = 4;
  auto d = Open(std::move(o));
  UniqueFd fd = Local("big", "0123456789AB");
  ASSERT_TRUE(d->CreateFromFile("k/snap", fd.get()).ok());
  EXPECT_EQ(completes, 2);
  EXPECT_EQ(s3_.objects["fleet/k/snap"], "0123456789AB");
}

TEST_F(S3DestinationTest, clean_temps_aborts_the_old_unfinished_uploads_under_the_prefix) {
  auto d = Open();
  auto begin = [&](const std::string& id, const std::string& key, const std::string& when) {
    s3_.uploads[id][1] = "part";
    s3_.upload_key[id] = key;
    s3_.upload_initiated[id] = when;
  };
  begin("old", "fleet/k/log/00000000000000000007", "2001-01-01T00:00:00.000Z");
  begin("fresh", "fleet/k/log/00000000000000000008", "2099-01-01T00:00:00.000Z");
  begin("other", "elsewhere/k/00000000000000000007", "2001-01-01T00:00:00.000Z");
  // Under the prefix, old, but not a name this destination writes.
  begin("foreign", "fleet/backups/db.tar", "2001-01-01T00:00:00.000Z");
  auto cleaned = d->CleanTemps(std::chrono::seconds(3600));
  ASSERT_TRUE(cleaned.ok()) << cleaned.status().message();
  EXPECT_EQ(*cleaned, 1);
  EXPECT_EQ(s3_.uploads.count("old"), 0u);
  EXPECT_EQ(s3_.uploads.count("fresh"), 1u);  // perhaps a live writer's
  EXPECT_EQ(s3_.uploads.count("other"), 1u);  // not under the prefix
  EXPECT_EQ(s3_.uploads.count("foreign"), 1u);
  EXPECT_EQ(*d->CleanTemps(std::chrono::seconds(3600)), 0);
}

TEST_F(S3DestinationTest, clean_temps_on_a_store_without_upload_listing_cleans_nothing) {
  s3_.lists_uploads = false;
  auto d = Open();
  auto cleaned = d->CleanTemps(std::chrono::seconds(3600));
  ASSERT_TRUE(cleaned.ok()) << cleaned.status().message();
  EXPECT_EQ(*cleaned, 0);
}

TEST_F(S3DestinationTest, the_probe_passes_on_a_conditional_store_and_cleans_up) {
  auto d = Open();
  Status st = d->Probe();
  EXPECT_TRUE(st.ok()) << st.message();
  EXPECT_TRUE(s3_.objects.empty());
  // A PUT twice, then a multipart upload twice (the second completion
  // refused and its upload aborted).
  EXPECT_EQ(s3_.Methods(),
            (std::vector<std::string>{"PUT if-none-match", "PUT if-none-match", "DELETE",
                                      "POST ?uploads", "PUT ?partNumber",
                                      "POST ?uploadId if-none-match", "POST ?uploads",
                                      "PUT ?partNumber", "POST ?uploadId if-none-match",
                                      "DELETE ?uploadId", "DELETE"}));
  EXPECT_EQ(s3_.seen[0].path_and_query.rfind("/fleet/.tmp-probe/", 0), 0u)
      << s3_.seen[0].path_and_query;
}

TEST_F(S3DestinationTest, the_probe_refuses_a_store_that_accepts_a_second_create) {
  s3_.honours_conditional = false;
  auto d = Open();
  Status st = d->Probe();
  EXPECT_EQ(st.code(), Code::kFailedPrecondition);
  EXPECT_EQ(st.message(),
            "replica s3://bucket/fleet at https://s3.us-east-1.amazonaws.com does not honour "
            "conditional writes (If-None-Match: *): a second create of one object was accepted; "
            "fleetfs needs them to fence an old owner's uploads");
  EXPECT_TRUE(s3_.objects.empty());
}

TEST_F(S3DestinationTest, refused_credentials_never_show_the_secret) {
  s3_.intercept = [](const S3Request&, FakeS3&) -> std::optional<Result<S3Response>> {
    return Result<S3Response>(Answer(403, ErrorXml("SignatureDoesNotMatch")));
  };
  auto d = Open();
  Status st = d->Probe();
  EXPECT_EQ(st.code(), Code::kFailedPrecondition);
  EXPECT_NE(st.message().find("secret key"), std::string::npos) << st.message();
  EXPECT_EQ(st.message().find(kSecret), std::string::npos) << st.message();
  EXPECT_EQ(d->List("").status().message().find(kSecret), std::string::npos);
}

TEST(OpenS3, opening_sends_nothing_and_needs_credentials) {
  S3DestinationOptions o;
  o.env = [](const char*) -> std::optional<std::string> { return std::nullopt; };
  o.make_transport = [](const S3Endpoint&, const std::string&,
                        const S3Credentials&) -> std::unique_ptr<S3Transport> {
    ADD_FAILURE() << "no transport without credentials";
    return nullptr;
  };
  auto d = OpenS3Destination("s3://bucket/x", S3Settings{}, o);
  EXPECT_EQ(d.status().code(), Code::kFailedPrecondition);
  EXPECT_NE(d.status().message().find("s3://bucket/x"), std::string::npos) << d.status().message();
  EXPECT_NE(d.status().message().find("AWS_ACCESS_KEY_ID"), std::string::npos);
}

TEST(OpenS3, open_destination_builds_an_s3_destination_from_the_url_and_settings) {
  ::setenv("AWS_ACCESS_KEY_ID", "AKID", 1);
  ::setenv("AWS_SECRET_ACCESS_KEY", std::string(kSecret).c_str(), 1);
  auto d = OpenDestination("s3://bucket/fleet",
                           DestinationOptions{.named_temps_only = false,
                                              .s3 = S3Settings{.endpoint = "http://127.0.0.1:1",
                                                               .region = "eu-west-1",
                                                               .path_style = {}}});
  ::unsetenv("AWS_ACCESS_KEY_ID");
  ::unsetenv("AWS_SECRET_ACCESS_KEY");
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_EQ((*d)->url(), "s3://bucket/fleet");
  auto bad = OpenDestination("s3://bucket/fleet",
                             DestinationOptions{.named_temps_only = false,
                                                .s3 = S3Settings{.endpoint = "ftp://x",
                                                                 .region = "",
                                                                 .path_style = {}}});
  EXPECT_EQ(bad.status().code(), Code::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("replica_endpoint"), std::string::npos)
      << bad.status().message();
}


// From an adversarial review of the S3 destination: each of these failed
// before its fix.

Result<S3Response> ListAnswer(std::string keys_xml, std::string truncated, std::string token) {
  return Result<S3Response>(Answer(
      200, "<ListBucketResult>" + keys_xml + "<IsTruncated>" + truncated + "</IsTruncated>" +
               (token.empty() ? "" : "<NextContinuationToken>" + token + "</NextContinuationToken>") +
               "</ListBucketResult>"));
}

bool IsListing(const S3Request& r) {
  return r.method == "GET" && r.path_and_query.find("list-type") != std::string::npos;
}

TEST_F(S3DestinationTest, a_listing_whose_tokens_come_round_again_ends_as_data_loss) {
  int lists = 0;
  s3_.intercept = [&](const S3Request& r, FakeS3&) -> std::optional<Result<S3Response>> {
    if (!IsListing(r)) return std::nullopt;
    if (++lists > 500) return Result<S3Response>(Answer(500, ErrorXml("Stop")));  // the test's bound
    return ListAnswer("<Contents><Key>fleet/k/0001</Key></Contents>", "true",
                      lists % 2 ? "A" : "B");
  };
  auto d = Open();
  auto names = d->List("k");
  EXPECT_EQ(names.status().code(), Code::kDataLoss) << names.status().message();
  EXPECT_LT(lists, 4);
}

TEST_F(S3DestinationTest, a_store_that_ignores_the_token_and_hands_out_new_ones_is_stopped) {
  int lists = 0;
  s3_.intercept = [&](const S3Request& r, FakeS3&) -> std::optional<Result<S3Response>> {
    if (!IsListing(r)) return std::nullopt;
    if (++lists > 500) return Result<S3Response>(Answer(500, ErrorXml("Stop")));
    return ListAnswer("<CommonPrefixes><Prefix>fleet/a/</Prefix></CommonPrefixes>", "true",
                      "t" + std::to_string(lists));
  };
  auto d = Open();
  auto names = d->List("");
  EXPECT_EQ(names.status().code(), Code::kDataLoss) << names.status().message();
  EXPECT_LT(lists, 4);
}

TEST_F(S3DestinationTest, is_truncated_is_read_as_xml_spells_it_and_an_unknown_spelling_refused) {
  s3_.intercept = [&](const S3Request& r, FakeS3&) -> std::optional<Result<S3Response>> {
    if (!IsListing(r)) return std::nullopt;
    if (r.path_and_query.find("continuation-token=t1") == std::string::npos) {
      return ListAnswer("<Contents><Key>fleet/k/0001</Key></Contents>", " True\n", "t1");
    }
    return ListAnswer("<Contents><Key>fleet/k/0002</Key></Contents>", "false", "");
  };
  auto d = Open();
  auto names = d->List("k");
  ASSERT_TRUE(names.ok()) << names.status().message();
  EXPECT_EQ(*names, (std::vector<std::string>{"0001", "0002"}));
  s3_.intercept = [&](const S3Request& r, FakeS3&) -> std::optional<Result<S3Response>> {
    if (!IsListing(r)) return std::nullopt;
    return ListAnswer("<Contents><Key>fleet/k/0001</Key></Contents>", "maybe", "t1");
  };
  EXPECT_EQ(d->List("k").status().code(), Code::kDataLoss);
}

TEST_F(S3DestinationTest, a_store_that_ignores_the_condition_on_multipart_completion_is_refused) {
  // If-None-Match honoured on PutObject, ignored on CompleteMultipartUpload:
  // a fenced owner's late large snapshot would replace a new owner's marker.
  s3_.intercept = [&](const S3Request& r, FakeS3& s3) -> std::optional<Result<S3Response>> {
    if (r.method == "POST" && r.path_and_query.find("uploadId=") != std::string::npos) {
      S3Request copy = r;
      copy.headers.clear();
      s3.Apply(copy);
      return Result<S3Response>(Answer(200, "<CompleteMultipartUploadResult/>"));
    }
    return std::nullopt;
  };
  auto d = Open();
  Status st = d->Probe();
  EXPECT_EQ(st.code(), Code::kFailedPrecondition) << st.message();
  EXPECT_NE(st.message().find("multipart"), std::string::npos) << st.message();
}

TEST_F(S3DestinationTest, a_resume_answered_from_byte_zero_is_refused_not_spliced) {
  const std::string body = "0123456789abcdefghijklmnopqrstuvwxyz";
  s3_.objects["fleet/k/o"] = body;
  s3_.break_get_after = 9;
  s3_.breaks_left = 1;
  int gets = 0;
  s3_.intercept = [&](const S3Request& r, FakeS3& s3) -> std::optional<Result<S3Response>> {
    if (r.method == "GET" && ++gets == 2) s3.ignore_range = true;  // the resume
    return std::nullopt;
  };
  auto d = Open();
  std::string out;
  Status st = d->Get("k/o", [&](std::string_view p) {
    out.append(p);
    return Status::Ok();
  });
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(out, body.substr(0, 9));  // never the start twice
}

TEST_F(S3DestinationTest, a_resume_the_store_finds_past_the_end_is_an_error_not_a_short_object) {
  s3_.objects["fleet/k/o"] = "0123456789abcdefghijklmnopqrstuvwxyz";
  s3_.break_get_after = 9;
  s3_.breaks_left = 1;
  int gets = 0;
  s3_.intercept = [&](const S3Request& r, FakeS3&) -> std::optional<Result<S3Response>> {
    if (r.method == "GET" && ++gets == 2) {
      return Result<S3Response>(Answer(416, ErrorXml("InvalidRange")));
    }
    return std::nullopt;
  };
  auto d = Open();
  Status st = d->Get("k/o", [](std::string_view) { return Status::Ok(); });
  EXPECT_FALSE(st.ok());
}

TEST_F(S3DestinationTest, clean_temps_with_no_prefix_leaves_other_applications_uploads) {
  auto dd = OpenS3Destination("s3://bucket", S3Settings{}, Options());
  ASSERT_TRUE(dd.ok());
  s3_.uploads["backup"][1] = "part";
  s3_.upload_key["backup"] = "nightly-backups/db.tar";
  s3_.upload_initiated["backup"] = "2001-01-01T00:00:00.000Z";
  s3_.uploads["ours"][1] = "part";
  s3_.upload_key["ours"] = "k/log/00000000000000000003";
  s3_.upload_initiated["ours"] = "2001-01-01T00:00:00.000Z";
  auto cleaned = (*dd)->CleanTemps(std::chrono::seconds(3600));
  ASSERT_TRUE(cleaned.ok()) << cleaned.status().message();
  EXPECT_EQ(*cleaned, 1);
  EXPECT_EQ(s3_.uploads.count("backup"), 1u);
  EXPECT_EQ(s3_.uploads.count("ours"), 0u);
}

TEST_F(S3DestinationTest, a_store_answering_writes_with_204_passes_the_probe) {
  s3_.intercept = [&](const S3Request& r, FakeS3& s3) -> std::optional<Result<S3Response>> {
    if (r.method != "PUT" || r.path_and_query.find('?') != std::string::npos) return std::nullopt;
    auto exists = [&]() {
      std::lock_guard l(s3.mu);
      return s3.objects.count(Decode(r.path_and_query.substr(1))) > 0;
    }();
    if (exists) return Result<S3Response>(Answer(412, ErrorXml("PreconditionFailed")));
    S3Request copy = r;
    s3.Apply(copy);
    return Result<S3Response>(Answer(204));
  };
  auto d = Open();
  EXPECT_TRUE(d->Create("k/log/1", "x").ok());
  Status st = d->Probe();
  EXPECT_TRUE(st.ok()) << st.message();
}

TEST_F(S3DestinationTest, a_clock_skew_refusal_says_clock_not_access) {
  s3_.intercept = [](const S3Request&, FakeS3&) -> std::optional<Result<S3Response>> {
    return Result<S3Response>(Answer(403, ErrorXml("RequestTimeTooSkewed")));
  };
  auto d = Open();
  Status st = d->Probe();
  EXPECT_EQ(st.code(), Code::kFailedPrecondition);
  EXPECT_NE(st.message().find("clock"), std::string::npos) << st.message();
  EXPECT_EQ(st.message().find("denied"), std::string::npos) << st.message();
}

TEST_F(S3DestinationTest, a_store_that_ignores_range_sends_no_more_than_a_head_read_needs) {
  s3_.objects["fleet/k/o"] = std::string(3000, 'x');
  s3_.ignore_range = true;
  std::size_t pieces = 0;
  s3_.on_piece = [&] { ++pieces; };
  auto d = Open();
  auto head = d->GetHead("k/o", 6);
  ASSERT_TRUE(head.ok()) << head.status().message();
  EXPECT_EQ(*head, "xxxxxx");
  EXPECT_LE(pieces, 2u);  // the fake sends 3 bytes a piece: the transfer ended there
}

TEST(OpenS3, an_endpoint_or_url_holding_a_user_name_is_refused_without_echoing_it) {
  auto ep = ResolveS3Endpoint(
      S3Settings{.endpoint = "https://AKIDX:SECRETdoNOTshowTHIS@minio:9000", .region = "",
                 .path_style = {}},
      "bucket", [](const char*) -> std::optional<std::string> { return std::nullopt; });
  ASSERT_FALSE(ep.ok());
  EXPECT_EQ(ep.status().message().find("SECRETdoNOTshowTHIS"), std::string::npos);
  auto url = ParseS3Url("s3://AKIDX:SECRETdoNOTshowTHIS@bucket/p");
  ASSERT_FALSE(url.ok());
  EXPECT_EQ(url.status().message().find("SECRETdoNOTshowTHIS"), std::string::npos);
}

class StepClock final : public MonotonicClock {
 public:
  MonoTime Now() const override { return MonoTime{} + std::chrono::milliseconds(ms.load()); }
  mutable std::atomic<std::int64_t> ms{0};
};

// Each attempt takes what the transport would: its own bound (stall or
// total), cut to what the call has left.
TEST_F(S3DestinationTest, no_call_holds_its_caller_past_the_call_deadline) {
  StepClock clk;
  auto o = Options();
  o.clock = &clk;
  o.sleep = [&](Millis w) { clk.ms += w.count(); };
  const std::int64_t deadline_ms = o.retry.call_deadline.count();
  std::int64_t per_attempt_ms = 30'000;  // a silent store: the stall bound
  s3_.intercept = [&](const S3Request& r, FakeS3&) -> std::optional<Result<S3Response>> {
    EXPECT_GT(r.time_left.count(), 0);
    clk.ms += std::min<std::int64_t>(per_attempt_ms, r.time_left.count());
    return Result<S3Response>(Unavailable("stalled"));
  };
  auto d = Open(std::move(o));
  EXPECT_FALSE(d->Create("k/log/1", "x").ok());
  EXPECT_LE(clk.ms.load(), deadline_ms);
  // A trickling store: each attempt runs to the request's total bound.
  clk.ms = 0;
  per_attempt_ms = 300'000;
  EXPECT_FALSE(d->Create("k/log/2", "x").ok());
  EXPECT_LE(clk.ms.load(), deadline_ms);
  // A Get whose body keeps breaking off resumes a bounded number of times,
  // each resume a call of its own.
  s3_.intercept = nullptr;
  s3_.seen.clear();
  s3_.objects["fleet/k/o"] = std::string(100, 'x');
  s3_.break_get_after = 3;
  s3_.breaks_left = 1000;
  EXPECT_FALSE(d->Get("k/o", [](std::string_view) { return Status::Ok(); }).ok());
  EXPECT_LE(s3_.seen.size(), 6u);
}

TEST_F(S3DestinationTest, a_store_that_refuses_every_conditional_completion_is_refused) {
  // Every large snapshot would come back "taken" for a name nobody wrote.
  s3_.intercept = [&](const S3Request& r, FakeS3&) -> std::optional<Result<S3Response>> {
    if (r.method == "POST" && r.path_and_query.find("uploadId=") != std::string::npos) {
      return Result<S3Response>(Answer(412, ErrorXml("PreconditionFailed")));
    }
    return std::nullopt;
  };
  auto d = Open();
  Status st = d->Probe();
  EXPECT_FALSE(st.ok());
  EXPECT_TRUE(s3_.objects.empty());
}

TEST_F(S3DestinationTest, a_store_refusing_every_conditional_put_fails_the_probe_after_a_retry) {
  // The first attempt meets a 503, the retry a 412 for an object that is not
  // there: that is not "our first attempt landed".
  int puts = 0;
  s3_.intercept = [&](const S3Request& r, FakeS3&) -> std::optional<Result<S3Response>> {
    if (r.method != "PUT" || r.path_and_query.find('?') != std::string::npos) return std::nullopt;
    if (++puts == 1) return Result<S3Response>(Answer(503, ErrorXml("SlowDown")));
    return Result<S3Response>(Answer(412, ErrorXml("PreconditionFailed")));
  };
  auto d = Open();
  Status st = d->Probe();
  EXPECT_FALSE(st.ok());
  EXPECT_TRUE(s3_.objects.empty());
}

TEST_F(S3DestinationTest, a_head_read_ends_when_a_ranged_answer_sends_more_than_asked) {
  s3_.objects["fleet/k/o"] = std::string(3000, 'x');
  std::size_t pieces = 0;
  s3_.on_piece = [&] { ++pieces; };
  // A 206 whose body is the whole object.
  s3_.intercept = [&](const S3Request& r, FakeS3& s3) -> std::optional<Result<S3Response>> {
    if (r.method != "GET") return std::nullopt;
    s3.ignore_range = true;
    return std::nullopt;
  };
  s3_.answer_206_when_ignoring_range = true;
  auto d = Open();
  auto head = d->GetHead("k/o", 6);
  ASSERT_TRUE(head.ok()) << head.status().message();
  EXPECT_EQ(*head, "xxxxxx");
  EXPECT_LE(pieces, 3u);
}

}  // namespace
}  // namespace fleetfs::replica::s3
