// EtcdClient against canned gateway answers: the JSON shapes etcd 3.4 sends,
// hostile answers, and endpoint failover within a call's deadline.
#include "lease/etcd_client.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include <chrono>
#include <deque>
#include <new>
#include <functional>

#include "lease/test_support.h"

namespace fleetfs::lease {
namespace {

using testing::FakeMonotonicClock;

// Answers each call from a script; records what was sent.
class ScriptedTransport final : public EtcdTransport {
 public:
  using Step = std::function<Result<EtcdHttpAnswer>(const EtcdHttpCall&)>;

  explicit ScriptedTransport(std::vector<EtcdHttpCall>* calls) : calls_(calls) {}
  void Then(Step step) { steps_.push_back(std::move(step)); }
  void ThenAnswer(std::string body, long status = 200) {
    Then([=](const EtcdHttpCall&) { return Result<EtcdHttpAnswer>(EtcdHttpAnswer{status, body}); });
  }

  // What every call gets once the script has run out.
  void Always(Step step) { always_ = std::move(step); }

  Result<EtcdHttpAnswer> Post(const EtcdHttpCall& call) override {
    calls_->push_back(call);
    if (steps_.empty() && always_) return always_(call);
    if (steps_.empty()) return Internal("the script has no answer for " + call.path);
    Step step = std::move(steps_.front());
    steps_.pop_front();
    return step(call);
  }

 private:
  std::vector<EtcdHttpCall>* calls_;
  std::deque<Step> steps_;
  Step always_;
};

class EtcdClientTest : public ::testing::Test {
 protected:
  EtcdClient& Client(std::vector<std::string> endpoints = {"10.0.0.1:2379"}) {
    auto transport = std::make_unique<ScriptedTransport>(&calls_);
    script_ = transport.get();
    client_ = std::make_unique<EtcdClient>(std::move(endpoints), std::move(transport), clock_,
                                           [this](Millis ms) { clock_.Advance(ms); });
    return *client_;
  }
  MonoTime In(Millis ms) const { return clock_.Now() + ms; }

  FakeMonotonicClock clock_;
  std::vector<EtcdHttpCall> calls_;
  ScriptedTransport* script_ = nullptr;
  std::unique_ptr<EtcdClient> client_;
};

constexpr const char* kHeader =
    R"("header":{"cluster_id":"15118495548433857066","member_id":"1","revision":"7","raft_term":"2"})";

std::string Body(const std::string& fields) { return std::string("{") + kHeader + fields + "}"; }

TEST(Base64, round_trips_every_length_and_refuses_anything_not_canonical) {
  for (const std::string& text : std::vector<std::string>{"", "a", "ab", "abc", "abcd", std::string("\0\xff\x10", 3)}) {
    EXPECT_EQ(Base64Decode(Base64Encode(text)), text);
  }
  EXPECT_EQ(Base64Encode("p/counter"), "cC9jb3VudGVy");
  EXPECT_EQ(Base64Decode("MQ=="), "1");
  for (const char* bad : {"MQ=", "M===", "MQ==MQ==", "M!==", "MR==", "cC9jb3VudGVy\n", "===="}) {
    EXPECT_EQ(Base64Decode(bad), std::nullopt) << bad;
  }
}

TEST_F(EtcdClientTest, a_range_that_found_nothing_has_no_kvs_and_is_empty) {
  EtcdClient& client = Client();
  script_->ThenAnswer(Body(""));
  const auto range = client.Range("p/", "p0", In(Millis(1000)));
  ASSERT_TRUE(range.ok()) << range.status().message();
  EXPECT_TRUE(range->kvs.empty());
  EXPECT_EQ(range->revision, 7);
  EXPECT_EQ(calls_.at(0).path, "/v3/kv/range");
  EXPECT_EQ(calls_.at(0).body, R"({"key":"cC8=","range_end":"cDA="})");
}

TEST_F(EtcdClientTest, numbers_come_as_strings_and_omitted_fields_are_zero) {
  EtcdClient& client = Client();
  // As etcd 3.4 sent it: the counter has no lease, so no "lease" field.
  script_->ThenAnswer(Body(
      R"(,"kvs":[{"key":"cC9jb3VudGVy","create_revision":"2","mod_revision":"9","version":"3","value":"MQ=="},)"
      R"({"key":"cC9yb3dzLzAwMDAwLTAwMTAw","create_revision":"4","mod_revision":"4","version":"1","lease":"4111120378986280713"}],"count":"2")"));
  const auto range = client.Range("p/", "p0", In(Millis(1000)));
  ASSERT_TRUE(range.ok()) << range.status().message();
  ASSERT_EQ(range->kvs.size(), 2u);
  EXPECT_EQ(range->kvs[0].key, "p/counter");
  EXPECT_EQ(range->kvs[0].value, "1");
  EXPECT_EQ(range->kvs[0].mod_revision, 9);
  EXPECT_EQ(range->kvs[0].lease, 0);
  EXPECT_EQ(range->kvs[1].value, "");  // an empty value is left out too
  EXPECT_EQ(range->kvs[1].lease, 4111120378986280713);
}

TEST_F(EtcdClientTest, a_failed_txn_has_no_succeeded_field) {
  EtcdClient& client = Client();
  script_->ThenAnswer(Body(""));
  script_->ThenAnswer(Body(R"(,"succeeded":true,"responses":[{"response_put":{"header":{"revision":"8"}}}])"));
  EtcdTxn txn;
  txn.compare.push_back({"p/counter", EtcdCompare::Target::kCreateRevision, 0});
  txn.success.push_back({EtcdOp::Kind::kPut, "p/counter", "1", 0});
  txn.success.push_back({EtcdOp::Kind::kDelete, "p/rows/00000-00001", "", 0});
  const auto failed = client.Txn(txn, In(Millis(1000)));
  ASSERT_TRUE(failed.ok()) << failed.status().message();
  EXPECT_FALSE(failed->succeeded);
  const auto succeeded = client.Txn(txn, In(Millis(1000)));
  ASSERT_TRUE(succeeded.ok()) << succeeded.status().message();
  EXPECT_TRUE(succeeded->succeeded);
  EXPECT_EQ(calls_.at(0).body,
            R"({"compare":[{"create_revision":"0","key":"cC9jb3VudGVy","result":"EQUAL","target":"CREATE"}],)"
            R"("success":[{"request_put":{"key":"cC9jb3VudGVy","value":"MQ=="}},)"
            R"({"request_delete_range":{"key":"cC9yb3dzLzAwMDAwLTAwMDAx"}}]})");
}

TEST_F(EtcdClientTest, a_keepalive_answer_without_ttl_means_the_lease_is_gone) {
  EtcdClient& client = Client();
  script_->ThenAnswer(std::string(R"({"result":{)") + kHeader + R"(,"ID":"42","TTL":"5"}})");
  script_->ThenAnswer(std::string(R"({"result":{)") + kHeader + R"(,"ID":"42"}})");
  EXPECT_EQ(*client.KeepAlive(42, In(Millis(1000))), std::optional<std::int64_t>(5));
  EXPECT_EQ(*client.KeepAlive(42, In(Millis(1000))), std::nullopt);
  EXPECT_EQ(calls_.at(0).body, R"({"ID":"42"})");
}

TEST_F(EtcdClientTest, a_keepalive_answer_for_another_lease_is_refused) {
  EtcdClient& client = Client();
  script_->ThenAnswer(std::string(R"({"result":{)") + kHeader + R"(,"ID":"43","TTL":"5"}})");
  const auto kept = client.KeepAlive(42, In(Millis(1000)));
  ASSERT_FALSE(kept.ok());
  EXPECT_NE(kept.status().message().find("'result.ID'"), std::string::npos) << kept.status().message();
}

TEST_F(EtcdClientTest, timetolive_of_a_gone_lease_is_none) {
  EtcdClient& client = Client();
  script_->ThenAnswer(Body(R"(,"ID":"42","TTL":"-1")"));
  EXPECT_EQ(*client.TimeToLive(42, In(Millis(1000))), std::nullopt);
}

TEST_F(EtcdClientTest, a_revoke_of_a_gone_lease_is_not_found) {
  EtcdClient& client = Client();
  script_->ThenAnswer(
      R"({"error":"etcdserver: requested lease not found","message":"etcdserver: requested lease not found","code":5})",
      404);
  const Status revoked = client.Revoke(42, In(Millis(1000)));
  EXPECT_EQ(revoked.code(), Code::kNotFound) << revoked.message();
  EXPECT_NE(revoked.message().find("10.0.0.1:2379"), std::string::npos);
  EXPECT_EQ(calls_.size(), 1u);  // an answer, not a failure: no other endpoint is asked
}

// A canned answer with the header every etcd answer carries (also inside a
// keepalive's result), so a test reaches the field it is about.
std::string H(std::string body) {
  if (body.rfind("{\"result\":{", 0) == 0) {
    return "{\"result\":{\"header\":{\"revision\":\"1\"}," + body.substr(11);
  }
  if (body.rfind("{", 0) != 0 || body.find("\"header\"") != std::string::npos) return body;
  return "{\"header\":{\"revision\":\"1\"}" + std::string(body.size() > 2 ? "," : "") +
         body.substr(1);
}

// Each hostile answer and the field its error must name.
struct Hostile {
  const char* body;
  const char* names;
};

TEST_F(EtcdClientTest, hostile_range_answers_are_errors_that_name_the_field) {
  const Hostile cases[] = {
      {R"({"kvs":[{"key":"%%%%","mod_revision":"1"}]})", "'kvs[0].key'"},
      {R"({"kvs":[{"key":"cA==","value":"cA"}]})", "'kvs[0].value'"},
      {R"({"kvs":[{"key":"cA==","mod_revision":"99999999999999999999"}]})", "'kvs[0].mod_revision'"},
      {R"({"kvs":[{"key":"cA==","mod_revision":18446744073709551615}]})", "'kvs[0].mod_revision'"},
      {R"({"kvs":[{"key":"cA==","lease":"12abc"}]})", "'kvs[0].lease'"},
      {R"({"kvs":[{"key":"cA==","version":true}]})", "'kvs[0].version'"},
      {R"({"kvs":[{"key":"cA==","create_revision":1.5}]})", "'kvs[0].create_revision'"},
      {R"({"kvs":[{"key":7}]})", "'kvs[0].key'"},
      {R"({"kvs":[{"value":"cA=="}]})", "'kvs[0].key'"},
      {R"({"kvs":{"key":"cA=="}})", "'kvs'"},
      {R"({"kvs":["x"]})", "'kvs[0]'"},
      {R"({"header":"x"})", "'header'"},
      {R"({"header":{"revision":[]}})", "'header.revision'"},
      {R"([1,2])", "'(the answer)'"},
      {R"({"kvs":[{"key":"cA==","mod_rev)", "not JSON"},
      {"", "not JSON"},
      {"<html>proxy error</html>", "not JSON"},
  };
  for (const Hostile& c : cases) {
    EtcdClient& client = Client();
    script_->ThenAnswer(H(c.body));
    const auto range = client.Range("p/", "p0", In(Millis(1000)));
    ASSERT_FALSE(range.ok()) << c.body;
    EXPECT_EQ(range.status().code(), Code::kDataLoss) << c.body;
    EXPECT_NE(range.status().message().find(c.names), std::string::npos)
        << c.body << " -> " << range.status().message();
    EXPECT_NE(range.status().message().find("10.0.0.1:2379"), std::string::npos);
  }
}

TEST_F(EtcdClientTest, hostile_txn_and_lease_answers_are_errors_that_name_the_field) {
  EtcdClient& client = Client();
  script_->ThenAnswer(H(R"({"succeeded":"yes"})"));
  const auto txn = client.Txn(EtcdTxn{}, In(Millis(1000)));
  ASSERT_FALSE(txn.ok());
  EXPECT_NE(txn.status().message().find("'succeeded'"), std::string::npos) << txn.status().message();

  script_->ThenAnswer(H(R"({"ID":"0","TTL":"5"})"));
  const auto zero = client.Grant(5, In(Millis(1000)));
  ASSERT_FALSE(zero.ok());
  EXPECT_NE(zero.status().message().find("'ID'"), std::string::npos) << zero.status().message();

  script_->ThenAnswer(H(R"({"ID":"5","TTL":"2"})"));
  const auto short_lease = client.Grant(5, In(Millis(1000)));
  ASSERT_FALSE(short_lease.ok());
  EXPECT_NE(short_lease.status().message().find("'TTL'"), std::string::npos);

  script_->ThenAnswer(H(R"({"result":{"ID":"42","TTL":"-3"}})"));
  const auto negative = client.KeepAlive(42, In(Millis(1000)));
  ASSERT_FALSE(negative.ok());
  EXPECT_NE(negative.status().message().find("'result.TTL'"), std::string::npos);

  script_->ThenAnswer(H(R"({"result":"x"})"));
  const auto not_object = client.KeepAlive(42, In(Millis(1000)));
  ASSERT_FALSE(not_object.ok());
  EXPECT_NE(not_object.status().message().find("'result'"), std::string::npos);

  script_->ThenAnswer(H(R"({"TTL":{"x":1}})"));
  const auto ttl = client.TimeToLive(42, In(Millis(1000)));
  ASSERT_FALSE(ttl.ok());
  EXPECT_NE(ttl.status().message().find("'TTL'"), std::string::npos);
}

TEST_F(EtcdClientTest, a_dead_first_endpoint_costs_one_retry_on_the_next) {
  EtcdClient& client = Client({"10.0.0.1:2379", "10.0.0.2:2379", "10.0.0.3:2379"});
  script_->Then([](const EtcdHttpCall& call) -> Result<EtcdHttpAnswer> {
    return Unavailable("etcd endpoint " + call.endpoint + " is unreachable: refused");
  });
  script_->ThenAnswer(Body(""));
  script_->ThenAnswer(Body(""));
  ASSERT_TRUE(client.Range("p/", "p0", In(Millis(1000))).ok());
  ASSERT_EQ(calls_.size(), 2u);
  EXPECT_EQ(calls_[0].endpoint, "10.0.0.1:2379");
  EXPECT_EQ(calls_[1].endpoint, "10.0.0.2:2379");
  // The endpoint that answered is asked first next time.
  EXPECT_EQ(client.preferred(), "10.0.0.2:2379");
  ASSERT_TRUE(client.Range("p/", "p0", In(Millis(1000))).ok());
  EXPECT_EQ(calls_.at(2).endpoint, "10.0.0.2:2379");
}

TEST_F(EtcdClientTest, a_partitioned_endpoint_gets_half_the_time_and_leaves_the_rest) {
  EtcdClient& client = Client({"10.0.0.1:2379", "10.0.0.2:2379"});
  // It accepts the call and never answers: its whole budget passes.
  script_->Then([this](const EtcdHttpCall& call) -> Result<EtcdHttpAnswer> {
    clock_.Advance(call.timeout);
    return Unavailable("etcd endpoint " + call.endpoint + " did not answer");
  });
  script_->ThenAnswer(Body(R"(,"succeeded":true)"));
  const auto txn = client.Txn(EtcdTxn{}, In(Millis(1000)));
  ASSERT_TRUE(txn.ok()) << txn.status().message();
  EXPECT_TRUE(txn->succeeded);
  ASSERT_EQ(calls_.size(), 2u);
  EXPECT_EQ(calls_[0].timeout, Millis(500));
  EXPECT_EQ(calls_[1].timeout, Millis(500));  // the last endpoint gets all that is left
}

TEST_F(EtcdClientTest, an_endpoint_without_a_leader_is_retried_on_the_next) {
  EtcdClient& client = Client({"10.0.0.1:2379", "10.0.0.2:2379"});
  script_->ThenAnswer(R"({"error":"etcdserver: no leader","message":"etcdserver: no leader","code":14})",
                      503);
  script_->ThenAnswer(std::string(R"({"result":{)") + kHeader + R"(,"ID":"42","TTL":"5"}})");
  const auto kept = client.KeepAlive(42, In(Millis(1000)));
  ASSERT_TRUE(kept.ok()) << kept.status().message();
  EXPECT_EQ(calls_.size(), 2u);
}

TEST_F(EtcdClientTest, when_no_endpoint_answers_the_call_goes_round_until_its_deadline_naming_each) {
  EtcdClient& client = Client({"10.0.0.1:2379", "10.0.0.2:2379"});
  const MonoTime start = clock_.Now();
  script_->Always([](const EtcdHttpCall& call) -> Result<EtcdHttpAnswer> {
    return Unavailable("etcd endpoint " + call.endpoint + " is unreachable: refused");
  });
  const auto range = client.Range("p/", "p0", In(Millis(1000)));
  ASSERT_FALSE(range.ok());
  EXPECT_EQ(range.status().code(), Code::kUnavailable);
  const std::string& message = range.status().message();
  EXPECT_NE(message.find("10.0.0.1:2379 is unreachable"), std::string::npos) << message;
  EXPECT_NE(message.find("10.0.0.2:2379 is unreachable"), std::string::npos) << message;
  // Each endpoint is named once, however many rounds there were.
  EXPECT_EQ(message.find("10.0.0.1:2379"), message.rfind("10.0.0.1:2379")) << message;
  EXPECT_GT(calls_.size(), 2u);
  EXPECT_LE(clock_.Now() - start, Millis(1000));
}

TEST_F(EtcdClientTest, a_tls_failure_is_not_retried_in_later_rounds_and_keeps_its_message) {
  EtcdClient& client = Client({"10.0.0.1:2379", "10.0.0.2:2379"});
  script_->Then([](const EtcdHttpCall& call) -> Result<EtcdHttpAnswer> {
    return Status(Code::kFailedPrecondition,
                  "TLS with etcd endpoint " + call.endpoint + " failed: unknown CA");
  });
  script_->Always([this](const EtcdHttpCall& call) -> Result<EtcdHttpAnswer> {
    clock_.Advance(Millis(10));
    return Unavailable("etcd endpoint " + call.endpoint + " did not answer");
  });
  const auto range = client.Range("p/", "p0", In(Millis(1000)));
  ASSERT_FALSE(range.ok());
  EXPECT_NE(range.status().message().find("TLS with etcd endpoint 10.0.0.1:2379 failed"),
            std::string::npos)
      << range.status().message();
  std::size_t to_first = 0;
  for (const auto& call : calls_) to_first += call.endpoint == "10.0.0.1:2379";
  EXPECT_EQ(to_first, 1u);
  EXPECT_GT(calls_.size(), 3u);  // the other endpoint was asked round after round
}

TEST_F(EtcdClientTest, an_election_in_progress_is_ridden_out_by_another_round) {
  EtcdClient& client = Client({"10.0.0.1:2379", "10.0.0.2:2379"});
  const MonoTime start = clock_.Now();
  for (int i = 0; i < 2; ++i) {
    script_->ThenAnswer(
        R"({"error":"etcdserver: leader changed","message":"etcdserver: leader changed","code":14})",
        503);
  }
  script_->ThenAnswer(std::string(R"({"result":{)") + kHeader + R"(,"ID":"42","TTL":"5"}})");
  const auto kept = client.KeepAlive(42, In(Millis(1000)));
  ASSERT_TRUE(kept.ok()) << kept.status().message();
  ASSERT_EQ(calls_.size(), 3u);
  EXPECT_EQ(calls_[2].endpoint, "10.0.0.1:2379");
  EXPECT_EQ(clock_.Now() - start, EtcdClient::kRoundPause);
}

TEST_F(EtcdClientTest, an_answer_after_the_deadline_is_ignored) {
  EtcdClient& client = Client({"10.0.0.1:2379", "10.0.0.2:2379"});
  script_->Then([this](const EtcdHttpCall&) -> Result<EtcdHttpAnswer> {
    clock_.Advance(Millis(1500));
    return EtcdHttpAnswer{200, Body(R"(,"succeeded":true)")};
  });
  const auto txn = client.Txn(EtcdTxn{}, In(Millis(1000)));
  ASSERT_FALSE(txn.ok());
  EXPECT_EQ(txn.status().code(), Code::kDeadlineExceeded);
  EXPECT_NE(txn.status().message().find("ignored"), std::string::npos);
  EXPECT_EQ(calls_.size(), 1u);
}

TEST_F(EtcdClientTest, a_call_whose_time_is_up_reaches_no_endpoint) {
  EtcdClient& client = Client();
  const auto range = client.Range("p/", "p0", clock_.Now());
  ASSERT_FALSE(range.ok());
  EXPECT_EQ(range.status().code(), Code::kDeadlineExceeded);
  EXPECT_TRUE(calls_.empty());
}

TEST_F(EtcdClientTest, a_refusal_that_is_not_unavailable_is_not_retried) {
  EtcdClient& client = Client({"10.0.0.1:2379", "10.0.0.2:2379"});
  script_->ThenAnswer(
      R"({"error":"etcdserver: duplicate key given in txn request","message":"etcdserver: duplicate key given in txn request","code":3})",
      400);
  const auto txn = client.Txn(EtcdTxn{}, In(Millis(1000)));
  ASSERT_FALSE(txn.ok());
  EXPECT_EQ(txn.status().code(), Code::kFailedPrecondition);
  EXPECT_NE(txn.status().message().find("duplicate key"), std::string::npos);
  EXPECT_EQ(calls_.size(), 1u);
}


// An answer that is not a well-formed gateway answer of the call, or an error
// that is not etcd refusing the request itself: what a member behind a
// broken proxy, a wrong port or a sick member gives.
struct BadAnswer {
  long status;
  const char* body;
};

TEST_F(EtcdClientTest, an_answer_that_is_not_etcds_costs_a_retry_on_the_next_endpoint) {
  const BadAnswer cases[] = {
      {200, "<html>ok</html>"},
      {200, R"({"kvs":"x"})"},
      {404, "404 page not found"},
      {404, "<html>Not Found</html>"},
      {500, "<html>Internal Server Error</html>"},
      {500, R"({"error":"etcdserver: internal","message":"etcdserver: internal","code":13})"},
      {429,
       R"({"error":"etcdserver: too many requests","message":"etcdserver: too many requests","code":8})"},
      {502, "Bad Gateway"},
      // Review: a 200 with no header passed as "no keys" (a renewal through
      // such a member found its row gone and dropped the range).
      {200, "{}"},
      {200, R"({"kvs":[]})"},
      {200, R"({"header":{"revision":"0"}})"},
      // Review: another gRPC gateway's refusal in the codes etcd uses ended
      // the call, and made that member the preferred one.
      {404, R"({"error":"Not Found","message":"Not Found","code":5})"},
      {403, R"({"error":"denied","message":"permission denied","code":7})"},
  };
  for (const BadAnswer& bad : cases) {
    calls_.clear();
    EtcdClient& client = Client({"10.0.0.1:2379", "10.0.0.2:2379"});
    script_->ThenAnswer(bad.body, bad.status);
    script_->ThenAnswer(Body(R"(,"kvs":[{"key":"cA==","mod_revision":"3"}])"));
    script_->ThenAnswer(Body(""));
    const auto range = client.Range("p", "", In(Millis(1000)));
    ASSERT_TRUE(range.ok()) << bad.status << " " << bad.body << " -> " << range.status().message();
    EXPECT_EQ(range->kvs.at(0).mod_revision, 3);
    ASSERT_EQ(calls_.size(), 2u) << bad.body;
    EXPECT_EQ(calls_[1].endpoint, "10.0.0.2:2379");
    // Only the member that answered well is asked first from now on.
    EXPECT_EQ(client.preferred(), "10.0.0.2:2379") << bad.body;
    ASSERT_TRUE(client.Range("p", "", In(Millis(1000))).ok());
    EXPECT_EQ(calls_.at(2).endpoint, "10.0.0.2:2379") << bad.body;
  }
}

TEST_F(EtcdClientTest, a_txn_whose_answer_was_mangled_is_sent_to_the_next_member) {
  EtcdClient& client = Client({"10.0.0.1:2379", "10.0.0.2:2379"});
  script_->ThenAnswer("<html>ok</html>");
  script_->ThenAnswer(Body(""));  // the comparisons failed there: the caller looks again
  const auto txn = client.Txn(EtcdTxn{}, In(Millis(1000)));
  ASSERT_TRUE(txn.ok()) << txn.status().message();
  EXPECT_FALSE(txn->succeeded);
  ASSERT_EQ(calls_.size(), 2u);
  EXPECT_EQ(calls_[0].body, calls_[1].body);
}

TEST_F(EtcdClientTest, a_keepalive_stream_error_costs_a_retry_on_the_next_endpoint) {
  EtcdClient& client = Client({"10.0.0.1:2379", "10.0.0.2:2379"});
  script_->ThenAnswer(R"({"error":{"grpc_code":14,"http_code":503,"message":"etcdserver: no leader"}})");
  script_->ThenAnswer(std::string(R"({"result":{)") + kHeader + R"(,"ID":"42","TTL":"5"}})");
  const auto kept = client.KeepAlive(42, In(Millis(1000)));
  ASSERT_TRUE(kept.ok()) << kept.status().message();
  EXPECT_EQ(*kept, std::optional<std::int64_t>(5));
  EXPECT_EQ(client.preferred(), "10.0.0.2:2379");
}

TEST_F(EtcdClientTest, when_every_member_answers_something_not_etcds_the_call_ends_at_once_naming_each) {
  EtcdClient& client = Client({"10.0.0.1:2379", "10.0.0.2:2379"});
  const MonoTime start = clock_.Now();
  script_->Always([](const EtcdHttpCall&) -> Result<EtcdHttpAnswer> {
    return EtcdHttpAnswer{200, "<html>captive portal</html>"};
  });
  const auto range = client.Range("p/", "p0", In(Millis(1000)));
  ASSERT_FALSE(range.ok());
  EXPECT_EQ(range.status().code(), Code::kDataLoss);
  const std::string& message = range.status().message();
  EXPECT_NE(message.find("10.0.0.1:2379"), std::string::npos) << message;
  EXPECT_NE(message.find("10.0.0.2:2379"), std::string::npos) << message;
  EXPECT_NE(message.find("not JSON"), std::string::npos) << message;
  // Another round would get the same pages: none is asked twice.
  EXPECT_EQ(calls_.size(), 2u);
  EXPECT_EQ(clock_.Now(), start);
  EXPECT_EQ(client.preferred(), "10.0.0.1:2379");
}

TEST_F(EtcdClientTest, etcds_refusals_of_the_request_itself_end_the_call_on_the_first_member) {
  const std::pair<int, Code> cases[] = {{3, Code::kFailedPrecondition},
                                        {5, Code::kNotFound},
                                        {11, Code::kFailedPrecondition},
                                        {7, Code::kFailedPrecondition}};
  for (const auto& [grpc, code] : cases) {
    calls_.clear();
    EtcdClient& client = Client({"10.0.0.1:2379", "10.0.0.2:2379"});
    script_->ThenAnswer(R"({"error":"etcdserver: x","message":"etcdserver: x","code":)" +
                            std::to_string(grpc) + "}",
                        400);
    const Status revoked = client.Revoke(42, In(Millis(1000)));
    EXPECT_EQ(revoked.code(), code) << grpc << ": " << revoked.message();
    EXPECT_EQ(calls_.size(), 1u) << grpc;
  }
}


TEST_F(EtcdClientTest, an_answer_nested_deeper_than_the_gateways_is_refused_at_once_naming_the_rule) {
  EtcdClient& client = Client();
  script_->ThenAnswer(std::string(8u << 20, '['));
  const auto range = client.Range("p/", "p0", In(Millis(1000)));
  ASSERT_FALSE(range.ok());
  EXPECT_EQ(range.status().code(), Code::kDataLoss);
  EXPECT_NE(range.status().message().find("nests deeper than 8 levels"), std::string::npos)
      << range.status().message();
  EXPECT_NE(range.status().message().find("10.0.0.1:2379"), std::string::npos);
  // The rule's words say the counting pass refused it at the ninth '[',
  // before nlohmann built 8 Mi nested arrays (no timed check: a sanitizer
  // build is slow at anything).
}

TEST_F(EtcdClientTest, an_answer_of_more_values_than_a_full_table_holds_is_refused_naming_the_rule) {
  EtcdClient& client = Client();
  std::string body = R"({"kvs":[)";
  for (int i = 0; i < 1'000'001; ++i) body += i == 0 ? "{}" : ",{}";
  body += "]}";
  script_->ThenAnswer(body);
  const auto range = client.Range("p/", "p0", In(Millis(1000)));
  ASSERT_FALSE(range.ok());
  EXPECT_EQ(range.status().code(), Code::kDataLoss);
  EXPECT_NE(range.status().message().find("holds more than 1000000 values"), std::string::npos)
      << range.status().message().substr(0, 300);
}

TEST_F(EtcdClientTest, an_error_answer_nested_deep_is_not_etcds_and_costs_the_endpoint) {
  EtcdClient& client = Client({"10.0.0.1:2379", "10.0.0.2:2379"});
  script_->ThenAnswer(std::string(1u << 20, '['), 400);
  script_->ThenAnswer(Body(""));
  ASSERT_TRUE(client.Range("p/", "p0", In(Millis(1000))).ok());
  EXPECT_EQ(calls_.size(), 2u);
}

TEST_F(EtcdClientTest, a_transport_that_throws_costs_the_endpoint_and_never_escapes) {
  EtcdClient& client = Client({"10.0.0.1:2379", "10.0.0.2:2379"});
  script_->Then([](const EtcdHttpCall&) -> Result<EtcdHttpAnswer> { throw std::bad_alloc(); });
  script_->ThenAnswer(Body(""));
  const auto range = client.Range("p/", "p0", In(Millis(1000)));
  ASSERT_TRUE(range.ok()) << range.status().message();
  EXPECT_EQ(client.preferred(), "10.0.0.2:2379");
}


TEST_F(EtcdClientTest, a_lease_ttl_beyond_ten_years_is_a_malformed_answer) {
  EtcdClient& client = Client();
  const std::string huge = "9223372036854775807";
  script_->ThenAnswer(H(R"({"ID":"5","TTL":")" + huge + R"("})"));
  const auto granted = client.Grant(5, In(Millis(1000)));
  ASSERT_FALSE(granted.ok());
  EXPECT_EQ(granted.status().code(), Code::kDataLoss);
  EXPECT_NE(granted.status().message().find("'TTL'"), std::string::npos) << granted.status().message();
  EXPECT_NE(granted.status().message().find("10 years"), std::string::npos);

  script_->ThenAnswer(H(R"({"result":{"ID":"42","TTL":")" + huge + R"("}})"));
  const auto kept = client.KeepAlive(42, In(Millis(1000)));
  ASSERT_FALSE(kept.ok());
  EXPECT_NE(kept.status().message().find("'result.TTL'"), std::string::npos) << kept.status().message();

  script_->ThenAnswer(
      H(R"({"ID":"42","TTL":")" + std::to_string(EtcdClient::kMaxLeaseTtlS + 1) + R"("})"));
  const auto left = client.TimeToLive(42, In(Millis(1000)));
  ASSERT_FALSE(left.ok());
  EXPECT_NE(left.status().message().find("'TTL'"), std::string::npos) << left.status().message();

  script_->ThenAnswer(
      H(R"({"ID":"42","TTL":")" + std::to_string(EtcdClient::kMaxLeaseTtlS) + R"("})"));
  EXPECT_EQ(*client.TimeToLive(42, In(Millis(1000))), EtcdClient::kMaxLeaseTtlS);
}

// A loopback HTTP server that answers each connection with `answer` (a whole
// HTTP response) until it is destroyed; it counts the connections.
class LoopbackHttp {
 public:
  explicit LoopbackHttp(std::string answer) : answer_(std::move(answer)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    socklen_t len = sizeof addr;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    EXPECT_EQ(::listen(fd_, 8), 0);
    thread_ = std::thread([this] {
      for (;;) {
        const int conn = ::accept(fd_, nullptr, nullptr);
        if (conn < 0) return;
        ++connections_;
        std::string request;
        char buf[4096];
        while (request.find("\r\n\r\n") == std::string::npos) {
          const ssize_t n = ::recv(conn, buf, sizeof buf, 0);
          if (n <= 0) break;
          request.append(buf, static_cast<std::size_t>(n));
        }
        std::size_t sent = 0;
        while (sent < answer_.size()) {
          const ssize_t n = ::send(conn, answer_.data() + sent, answer_.size() - sent, MSG_NOSIGNAL);
          if (n <= 0) break;
          sent += static_cast<std::size_t>(n);
        }
        ::close(conn);
      }
    });
  }
  ~LoopbackHttp() {
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    thread_.join();
  }
  std::string endpoint() const { return "127.0.0.1:" + std::to_string(port_); }
  int connections() const { return connections_.load(); }

 private:
  std::string answer_;
  int fd_ = -1;
  int port_ = 0;
  std::atomic<int> connections_{0};
  std::thread thread_;
};

std::string HttpOk(const std::string& body) {
  return "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
}

TEST(CurlTransport, an_answer_larger_than_a_whole_table_is_refused_naming_the_cap) {
  LoopbackHttp server(HttpOk(std::string((16u << 20) + 1, ' ')));
  const auto transport = MakeCurlTransport({});
  const auto answer = transport->Post({server.endpoint(), "/v3/kv/range", "{}", Millis(10'000)});
  ASSERT_FALSE(answer.ok());
  EXPECT_EQ(answer.status().code(), Code::kDataLoss);
  EXPECT_NE(answer.status().message().find("more than 16 MiB"), std::string::npos)
      << answer.status().message();
  EXPECT_NE(answer.status().message().find(server.endpoint()), std::string::npos);
}

TEST(CurlTransport, an_answer_within_the_cap_is_returned_whole) {
  const std::string body = "{" + std::string(15u << 20, ' ') + "}";
  LoopbackHttp server(HttpOk(body));
  const auto transport = MakeCurlTransport({});
  const auto answer = transport->Post({server.endpoint(), "/v3/kv/range", "{}", Millis(10'000)});
  ASSERT_TRUE(answer.ok()) << answer.status().message();
  EXPECT_EQ(answer->status, 200);
  EXPECT_EQ(answer->body.size(), body.size());
}

TEST(CurlTransport, a_proxy_named_by_the_environment_is_never_used) {
  LoopbackHttp server(HttpOk(Body("")));
  // A port nothing listens on: a call through the proxy would be refused.
  std::string proxy;
  {
    const LoopbackHttp gone("");
    proxy = "http://" + gone.endpoint();
  }
  for (const char* name : {"http_proxy", "all_proxy", "ALL_PROXY"}) {
    ::setenv(name, proxy.c_str(), 1);
    const auto transport = MakeCurlTransport({});
    const auto answer = transport->Post({server.endpoint(), "/v3/kv/range", "{}", Millis(5000)});
    ::unsetenv(name);
    ASSERT_TRUE(answer.ok()) << name << ": " << answer.status().message();
    EXPECT_EQ(answer->status, 200);
  }
  EXPECT_EQ(server.connections(), 3);
}

}  // namespace
}  // namespace fleetfs::lease
