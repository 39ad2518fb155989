#include "fleet/replica/s3_client.h"

#include <gtest/gtest.h>

#include <deque>

namespace fleetfs::replica::s3 {
namespace {

// Time that moves only when the client sleeps.
class FakeClock final : public MonotonicClock {
 public:
  MonoTime Now() const override { return now_; }
  void Advance(Millis d) { now_ += d; }

 private:
  MonoTime now_{};
};

// Answers from a script, one per request, and records the requests.
class ScriptedTransport final : public S3Transport {
 public:
  struct Step {
    Result<S3Response> outcome;
    std::string body_for_sink;  // given to the sink before a 2xx answer returns
  };
  explicit ScriptedTransport(std::deque<Step>* steps, std::vector<S3Request>* seen)
      : steps_(steps), seen_(seen) {}
  Result<S3Response> Send(const S3Request& request, const BodySink* sink) override {
    seen_->push_back(request);
    if (steps_->empty()) return Unavailable("script ran out");
    Step step = std::move(steps_->front());
    steps_->pop_front();
    if (sink != nullptr && !step.body_for_sink.empty()) {
      FLEETFS_RETURN_IF_ERROR((*sink)(step.body_for_sink));
    }
    return step.outcome;
  }

 private:
  std::deque<Step>* steps_;
  std::vector<S3Request>* seen_;
};

S3Response Answer(long status, std::string body = "") {
  S3Response r;
  r.status = status;
  r.body = std::move(body);
  return r;
}

std::string ErrorXml(std::string_view code, std::string_view extra = "") {
  return "<?xml version=\"1.0\"?><Error><Code>" + std::string(code) +
         "</Code><Message>m</Message>" + std::string(extra) + "</Error>";
}

class ClientTest : public ::testing::Test {
 protected:
  std::unique_ptr<S3Client> Make(RetryPolicy policy = {}) {
    S3Endpoint ep{.scheme = "https",
                  .authority = "s3.eu-west-1.amazonaws.com",
                  .region = "eu-west-1",
                  .path_style = false,
                  .custom = false};
    return std::make_unique<S3Client>(
        "s3://bucket/fleet", S3Location{"bucket", "fleet"}, ep, "the environment (AWS_ACCESS_KEY_ID)",
        std::make_unique<ScriptedTransport>(&steps_, &seen_), policy, clock_,
        [this](Millis d) {
          sleeps_.push_back(d);
          clock_.Advance(d);
        },
        /*seed=*/42);
  }
  void Then(Result<S3Response> outcome, std::string sink_body = "") {
    steps_.push_back({std::move(outcome), std::move(sink_body)});
  }
  S3Request Put() {
    S3Request r;
    r.method = "PUT";
    r.path_and_query = "/fleet/k";
    r.body = "abc";
    return r;
  }

  FakeClock clock_;
  std::deque<ScriptedTransport::Step> steps_;
  std::vector<S3Request> seen_;
  std::vector<Millis> sleeps_;
};

std::string HeaderOf(const S3Request& r, std::string_view name) {
  for (const auto& [n, v] : r.headers) {
    if (n == name) return v;
  }
  return "<absent>";
}

TEST_F(ClientTest, adds_the_body_sha256_that_curl_does_not) {
  auto c = Make();
  Then(Answer(200));
  Then(Answer(200));
  ASSERT_TRUE(c->Call(Put()).ok());
  S3Request get;
  get.method = "GET";
  get.path_and_query = "/fleet/k";
  ASSERT_TRUE(c->Call(get).ok());
  EXPECT_EQ(HeaderOf(seen_[0], "x-amz-content-sha256"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(HeaderOf(seen_[1], "x-amz-content-sha256"), kEmptySha256);
}

TEST_F(ClientTest, retries_outages_throttling_and_conflicts_then_succeeds) {
  auto c = Make();
  Then(Unavailable("connection reset"));
  Then(Answer(500, ErrorXml("InternalError")));
  Then(Answer(503, ErrorXml("SlowDown")));
  Then(Answer(429));
  Then(Answer(502));
  Then(Answer(504));
  Then(Answer(409, ErrorXml("ConditionalRequestConflict")));
  Then(Answer(200));
  auto r = c->Call(Put());
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->attempts, 8);
  EXPECT_EQ(seen_.size(), 8u);
  EXPECT_EQ(sleeps_.size(), 7u);
}

TEST_F(ClientTest, the_unanswered_cap_shortens_waits_after_no_answer_not_after_throttling) {
  RetryPolicy p;
  p.base = Millis(1000);
  p.cap = Millis(5000);
  p.unanswered_cap = Millis(10);
  p.max_attempts = 40;
  auto c = Make(p);
  for (int i = 0; i < 20; ++i) Then(Unavailable("connection reset"));
  for (int i = 0; i < 19; ++i) Then(Answer(503, ErrorXml("SlowDown")));
  Then(Answer(200));
  ASSERT_TRUE(c->Call(Put()).ok());
  ASSERT_EQ(sleeps_.size(), 39u);
  Millis after_no_answer{0};
  Millis after_slowdown{0};
  for (std::size_t i = 0; i < sleeps_.size(); ++i) {
    if (i < 20) {
      EXPECT_LE(sleeps_[i], Millis(10)) << i;
      after_no_answer += sleeps_[i];
    } else {
      after_slowdown += sleeps_[i];
    }
  }
  // Full jitter under a 5 s cap: 19 waits come to seconds, not 19 x 10 ms.
  EXPECT_GT(after_slowdown, Millis(5000));
  EXPECT_LE(after_no_answer, Millis(200));
}

TEST_F(ClientTest, does_not_retry_refusals) {
  for (long status : {400L, 403L, 404L, 412L, 301L}) {
    auto c = Make();
    seen_.clear();
    Then(Answer(status, ErrorXml("X")));
    auto r = c->Call(Put());
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->status, status);
    EXPECT_EQ(seen_.size(), 1u) << status;
  }
  auto c = Make();
  seen_.clear();
  Then(Status(Code::kFailedPrecondition, "TLS failed"));  // a certificate error
  EXPECT_EQ(c->Call(Put()).status().code(), Code::kFailedPrecondition);
  EXPECT_EQ(seen_.size(), 1u);
  EXPECT_TRUE(sleeps_.empty());
}

TEST_F(ClientTest, a_409_that_is_not_a_conditional_conflict_is_not_retried) {
  auto c = Make();
  Then(Answer(409, ErrorXml("BucketNotEmpty")));
  EXPECT_EQ(c->Call(Put())->status, 409);
  EXPECT_EQ(seen_.size(), 1u);
}

TEST_F(ClientTest, gives_up_after_max_attempts_with_the_last_answer) {
  auto c = Make(RetryPolicy{.max_attempts = 3});
  for (int i = 0; i < 5; ++i) Then(Answer(503, ErrorXml("SlowDown")));
  auto r = c->Call(Put());
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 503);
  EXPECT_EQ(r->attempts, 3);
  Status st = c->ErrorOf(*r, "PUT fleet/k");
  EXPECT_EQ(st.code(), Code::kUnavailable);
  EXPECT_NE(st.message().find("after 3 attempts"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("s3://bucket/fleet"), std::string::npos) << st.message();
}

TEST_F(ClientTest, gives_up_at_the_call_deadline) {
  auto c = Make(RetryPolicy{.max_attempts = 100, .base = Millis(1000), .cap = Millis(1000),
                            .call_deadline = Millis(3000)});
  for (int i = 0; i < 100; ++i) Then(Unavailable("reset"));
  EXPECT_EQ(c->Call(Put()).status().code(), Code::kUnavailable);
  Millis slept{0};
  for (Millis s : sleeps_) slept += s;
  EXPECT_LT(slept, Millis(3000));
  EXPECT_LT(seen_.size(), 100u);
}

TEST(Backoff, is_full_jitter_under_an_exponential_ceiling_capped) {
  RetryPolicy p{.base = Millis(100), .cap = Millis(5000)};
  EXPECT_EQ(BackoffDelay(p, 1, 100), Millis(100));  // 100 % 101
  EXPECT_EQ(BackoffDelay(p, 1, 101), Millis(0));
  EXPECT_EQ(BackoffDelay(p, 3, 400), Millis(400));  // ceiling 400
  EXPECT_EQ(BackoffDelay(p, 3, 401), Millis(0));
  for (std::uint64_t r : {0ull, 1ull, 4999ull, 5000ull, 123456789ull, ~0ull}) {
    EXPECT_LE(BackoffDelay(p, 30, r), Millis(5000));
    EXPECT_LE(BackoffDelay(p, 1000, r), Millis(5000));
  }
}

TEST_F(ClientTest, a_streamed_answer_is_not_retried_once_bytes_reached_the_sink) {
  auto c = Make();
  Then(Unavailable("reset mid-body"), "partial");
  Then(Answer(200), "whole");
  std::string got;
  BodySink sink = [&](std::string_view p) {
    got.append(p);
    return Status::Ok();
  };
  S3Request get;
  get.method = "GET";
  get.path_and_query = "/fleet/k";
  auto r = c->Call(get, &sink);
  EXPECT_EQ(r.status().code(), Code::kUnavailable);
  EXPECT_NE(r.status().message().find("broke off after 7 bytes"), std::string::npos)
      << r.status().message();
  EXPECT_EQ(got, "partial");
  EXPECT_EQ(seen_.size(), 1u);
}

TEST_F(ClientTest, a_sinks_error_ends_the_call_as_it_is) {
  auto c = Make();
  Then(Answer(200), "bytes");
  BodySink sink = [](std::string_view) { return DataLoss("bad object"); };
  S3Request get;
  get.method = "GET";
  auto r = c->Call(get, &sink);
  EXPECT_EQ(r.status().code(), Code::kDataLoss);
  EXPECT_EQ(r.status().message(), "bad object");
}

// ---- error lines

class ErrorLines : public ClientTest {
 protected:
  Status Of(long status, std::string body, std::string region_header = "") {
    auto c = Make();
    S3Response r = Answer(status, std::move(body));
    r.bucket_region = std::move(region_header);
    return c->ErrorOf(r, "PUT fleet/k");
  }
  static void NamesBucketAndEndpoint(const Status& st) {
    EXPECT_NE(st.message().find("s3://bucket/fleet"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("https://s3.eu-west-1.amazonaws.com"), std::string::npos)
        << st.message();
    EXPECT_EQ(st.message().find('\n'), std::string::npos) << st.message();
  }
};

TEST_F(ErrorLines, wrong_credentials_are_a_configuration_error_naming_where_they_came_from) {
  for (const char* code : {"InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied"}) {
    Status st = Of(403, ErrorXml(code));
    EXPECT_EQ(st.code(), Code::kFailedPrecondition) << code;
    EXPECT_NE(st.message().find(code), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("AWS_ACCESS_KEY_ID"), std::string::npos) << st.message();
    NamesBucketAndEndpoint(st);
  }
  EXPECT_NE(Of(403, ErrorXml("SignatureDoesNotMatch")).message().find("secret key"),
            std::string::npos);
  EXPECT_EQ(Of(403, "").code(), Code::kFailedPrecondition);  // a HEAD's 403 has no body
}

TEST_F(ErrorLines, a_skewed_clock_is_named_as_such_not_as_wrong_credentials) {
  Status st = Of(403, ErrorXml("RequestTimeTooSkewed"));
  EXPECT_EQ(st.code(), Code::kFailedPrecondition);
  EXPECT_NE(st.message().find("clock"), std::string::npos) << st.message();
  EXPECT_EQ(st.message().find("denied"), std::string::npos) << st.message();
  NamesBucketAndEndpoint(st);
}

TEST_F(ErrorLines, a_missing_bucket_is_named) {
  Status st = Of(404, ErrorXml("NoSuchBucket", "<BucketName>bucket</BucketName>"));
  EXPECT_EQ(st.code(), Code::kFailedPrecondition);
  EXPECT_NE(st.message().find("bucket bucket does not exist"), std::string::npos) << st.message();
  NamesBucketAndEndpoint(st);
}

TEST_F(ErrorLines, a_missing_object_is_not_found) {
  EXPECT_EQ(Of(404, ErrorXml("NoSuchKey")).code(), Code::kNotFound);
  EXPECT_EQ(Of(404, "").code(), Code::kNotFound);
}

TEST_F(ErrorLines, a_wrong_region_says_which_region_the_bucket_is_in) {
  Status redirect =
      Of(301, ErrorXml("PermanentRedirect", "<Endpoint>bucket.s3.us-west-2.amazonaws.com</Endpoint>"),
         "us-west-2");
  EXPECT_EQ(redirect.code(), Code::kFailedPrecondition);
  EXPECT_NE(redirect.message().find("is in region us-west-2, not eu-west-1"), std::string::npos)
      << redirect.message();
  EXPECT_NE(redirect.message().find("replica_region = \"us-west-2\""), std::string::npos);
  NamesBucketAndEndpoint(redirect);
  Status malformed =
      Of(400, ErrorXml("AuthorizationHeaderMalformed", "<Region>ap-south-1</Region>"));
  EXPECT_EQ(malformed.code(), Code::kFailedPrecondition);
  EXPECT_NE(malformed.message().find("is in region ap-south-1"), std::string::npos)
      << malformed.message();
  Status unknown = Of(301, "");
  EXPECT_EQ(unknown.code(), Code::kFailedPrecondition);
  EXPECT_NE(unknown.message().find("replica_region"), std::string::npos) << unknown.message();
}

TEST_F(ErrorLines, outages_are_unavailable_and_other_refusals_io_errors) {
  EXPECT_EQ(Of(503, ErrorXml("SlowDown")).code(), Code::kUnavailable);
  EXPECT_EQ(Of(500, "<html>oops</html>").code(), Code::kUnavailable);
  EXPECT_EQ(Of(409, ErrorXml("ConditionalRequestConflict")).code(), Code::kUnavailable);
  Status bad = Of(400, ErrorXml("InvalidArgument"));
  EXPECT_EQ(bad.code(), Code::kIoError);
  NamesBucketAndEndpoint(bad);
  EXPECT_EQ(Of(501, ErrorXml("NotImplemented")).code(), Code::kFailedPrecondition);
}

TEST_F(ErrorLines, hostile_error_bodies_give_a_short_printable_line) {
  std::string body = "<Error><Code>" + std::string(5000, 'A') + "\x07</Code><Message>" +
                     std::string(100000, 'm') + "</Message></Error>";
  Status st = Of(400, body);
  EXPECT_LT(st.message().size(), 1000u);
  EXPECT_EQ(st.message().find('\x07'), std::string::npos);
}

}  // namespace
}  // namespace fleetfs::replica::s3
