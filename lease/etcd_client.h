// EtcdClient: the few calls of etcd 3.4's v3 JSON gateway that the etcd
// ownership store needs (range, txn, lease grant/keepalive/revoke/timetolive),
// over an injectable HTTP transport.
//
// The gateway's JSON: keys and values are base64; 64-bit numbers are strings;
// a field that is false, zero or empty is left out (a failed txn has no
// `succeeded`, a range that found nothing has no `kvs`). Every answer is
// untrusted input: malformed JSON, a field of the wrong type, bad base64 or a
// number out of range is an error that names the endpoint, the call and the
// field, never a crash.
//
// Endpoints fail over: a call goes first to the endpoint that last answered
// well; an endpoint that cannot be reached, times out, answers "unavailable"
// (no leader, leader changed) or anything that is not a well-formed answer
// of the call (an HTML page, a 404 or 500 that is not etcd refusing the
// request itself) costs one retry on the next one, all within the call's
// deadline. Only etcd's refusal of the request itself (a bad txn, a gone
// lease: the same on every member) ends a call at once. In each round over the endpoints every attempt but the
// round's last gets half of the time left, so a partitioned member (one that
// accepts the connection and never answers) leaves time for the next. When a
// whole round failed fast (an election in progress), the call waits a moment
// and goes round again until its deadline. An answer that arrives after the
// deadline is ignored.
//
// Thread-safety: all calls are safe from any thread; the transport must be
// too. The preferred endpoint is an atomic index.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fleet/clock.h"
#include "fleet/status.h"

namespace fleetfs::lease {

// One HTTP POST to one endpoint ("host:port"): path "/v3/kv/range" and a
// JSON body. `timeout` bounds the whole exchange, connection included.
struct EtcdHttpCall {
  std::string endpoint;
  std::string path;
  std::string body;
  Millis timeout{0};
};

struct EtcdHttpAnswer {
  long status = 0;  // the HTTP status
  std::string body;
};

// Moves one call to an endpoint and back. Unavailable when the endpoint cannot
// be reached or does not answer in time, FailedPrecondition when the TLS
// handshake fails (a retry cannot mend it); the message names the endpoint
// and says which. Any HTTP answer is returned as is.
class EtcdTransport {
 public:
  virtual ~EtcdTransport() = default;
  virtual Result<EtcdHttpAnswer> Post(const EtcdHttpCall& call) = 0;
};

struct EtcdTls {
  bool enabled = false;  // https (etcds://)
  std::string ca;        // CA bundle that signs the members' certificates; "" = system's
  std::string cert;      // client certificate and key, both or neither
  std::string key;
};

// libcurl, one easy handle per call. Answers are capped at 16 MiB.
std::unique_ptr<EtcdTransport> MakeCurlTransport(EtcdTls tls);

// Strict base64 (RFC 4648 with padding): nullopt for anything else.
std::string Base64Encode(std::string_view bytes);
std::optional<std::string> Base64Decode(std::string_view text);

struct EtcdKv {
  std::string key;
  std::string value;
  std::int64_t create_revision = 0;
  std::int64_t mod_revision = 0;
  std::int64_t version = 0;
  std::int64_t lease = 0;  // 0: no lease
};

struct EtcdRange {
  std::int64_t revision = 0;  // the store revision the range was read at
  std::vector<EtcdKv> kvs;    // in key order
};

// One txn comparison, always EQUAL.
struct EtcdCompare {
  enum class Target { kModRevision, kCreateRevision, kVersion };
  std::string key;
  Target target = Target::kModRevision;
  std::int64_t value = 0;
};

struct EtcdOp {
  enum class Kind { kPut, kDelete };
  Kind kind = Kind::kPut;
  std::string key;
  std::string value;       // kPut
  std::int64_t lease = 0;  // kPut; 0: no lease
};

struct EtcdTxn {
  std::vector<EtcdCompare> compare;
  std::vector<EtcdOp> success;  // applied only when every comparison holds
};

struct EtcdTxnResult {
  bool succeeded = false;
  std::int64_t revision = 0;
};

struct EtcdLease {
  std::int64_t id = 0;
  std::int64_t ttl_s = 0;  // as etcd granted it (it may raise a short one)
};

class EtcdClient {
 public:
  using Sleep = std::function<void(Millis)>;

  // `endpoints` are "host:port", at least one; `clock` gives the deadlines
  // and must outlive the client; `sleep` waits between rounds (a test moves
  // its clock instead).
  EtcdClient(std::vector<std::string> endpoints, std::unique_ptr<EtcdTransport> transport,
             const MonotonicClock& clock, Sleep sleep = nullptr);

  // The longest lease TTL an answer may give: fleetfs asks for an hour at
  // most, and a wall time of now + TTL must not overflow. More is a
  // malformed answer.
  static constexpr std::int64_t kMaxLeaseTtlS = 10LL * 365 * 24 * 3600;

  // The pause between two rounds over the endpoints.
  static constexpr Millis kRoundPause{50};

  // The keys in [key, range_end) (range_end "" = the one key), linearizable.
  Result<EtcdRange> Range(const std::string& key, const std::string& range_end, MonoTime deadline);
  Result<EtcdTxnResult> Txn(const EtcdTxn& txn, MonoTime deadline);
  Result<EtcdLease> Grant(std::int64_t ttl_s, MonoTime deadline);
  // The lease's TTL after the keepalive, in seconds; nullopt when the lease
  // no longer exists (etcd answers TTL 0, which the gateway leaves out).
  Result<std::optional<std::int64_t>> KeepAlive(std::int64_t lease, MonoTime deadline);
  // NotFound when the lease no longer exists.
  Status Revoke(std::int64_t lease, MonoTime deadline);
  // Seconds the lease has left; nullopt when it no longer exists.
  Result<std::optional<std::int64_t>> TimeToLive(std::int64_t lease, MonoTime deadline);

  const std::vector<std::string>& endpoints() const { return endpoints_; }
  // The endpoint the next call goes to first: the one that last answered.
  std::string preferred() const { return endpoints_[preferred_.load()]; }

 private:
  // Reads a 200 answer of one endpoint into the call's result. OK: done.
  // DataLoss (not a well-formed answer of the call) or Unavailable (the
  // member could not do it): the next endpoint is asked. Any other code is
  // the cluster's definitive answer and ends the call.
  using ReadAnswer = std::function<Status(const std::string& endpoint, const std::string& body)>;

  // Posts to one endpoint after another until one answers well, within the
  // deadline. An etcd refusal of the request itself (a bad txn, a gone
  // lease) ends the call with that error; any other failure costs a retry on
  // the next endpoint. The preferred endpoint moves only to one that
  // answered well.
  Status Call(std::string_view path, const std::string& body, MonoTime deadline,
              const ReadAnswer& read);

  const std::vector<std::string> endpoints_;
  const std::unique_ptr<EtcdTransport> transport_;
  const MonotonicClock& clock_;
  const Sleep sleep_;
  std::atomic<std::size_t> preferred_{0};
};

}  // namespace fleetfs::lease
