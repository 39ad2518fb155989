// S3Client: one bucket's requests, signed and retried, over an injectable
// transport; and the libcurl transport the agent uses.
//
// The transport moves one request and its answer (libcurl signs it with its
// built-in SigV4). The client adds what curl 7.88 leaves to its caller (the
// body's SHA-256 in x-amz-content-sha256), retries what a retry can mend
// (no answer, a reset, a timeout, 500/502/503/504, 429, 409
// ConditionalRequestConflict, 400 RequestTimeout) with exponential backoff
// and full jitter, bounded by attempts and a per-call deadline, and turns an
// answer it does not want into one line that names the bucket and the
// endpoint (ErrorOf). Wrong credentials, a missing bucket and a wrong region
// are kFailedPrecondition (configuration: the agent refuses to start);
// outages are kUnavailable.
//
// A body streamed to a sink is never retried once a byte of it has gone to
// the sink: the sink would see bytes twice.
//
// Thread-safety: S3Client and the curl transport are safe from any thread;
// an injected transport must be too.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fleet/clock.h"
#include "fleet/replica/s3_protocol.h"
#include "fleet/status.h"

namespace fleetfs::replica::s3 {

struct S3Response;

struct S3Request {
  std::string method;          // GET, HEAD, PUT, POST, DELETE
  // "/" + EncodeKey(key) [+ "?" + CanonicalQuery(...)] for an object;
  // "?" + CanonicalQuery(...) for the bucket (a listing).
  std::string path_and_query;
  std::vector<std::pair<std::string, std::string>> headers;
  // The body: `body` (which must outlive the call) when body_fd < 0, else
  // body_length bytes of body_fd from body_offset, read with pread.
  std::string_view body;
  int body_fd = -1;
  std::uint64_t body_offset = 0;
  std::uint64_t body_length = 0;

  // Called with a 2xx answer's status and headers before its first body
  // byte goes to the sink (a reader that must resume a broken body learns
  // the object's ETag here). May be null.
  std::function<void(const S3Response&)> on_head;

  // Set by S3Client::Call for each attempt: what is left of the call's
  // deadline. The transport ends the attempt then, whatever its own bounds.
  Millis time_left{0};

  std::uint64_t BodySize() const { return body_fd >= 0 ? body_length : body.size(); }
};

struct S3Response {
  long status = 0;
  std::string etag;                           // ETag, quotes included
  std::optional<std::uint64_t> content_length;  // of the answer's body
  std::string content_range;
  std::string bucket_region;  // x-amz-bucket-region
  // The body when no sink took it (XML answers, error bodies), at most
  // kMaxXmlBytes.
  std::string body;
  int attempts = 1;  // set by S3Client::Call
};

// Takes a 2xx answer's body in pieces; its error ends the transfer.
using BodySink = std::function<Status(std::string_view)>;

class S3Transport {
 public:
  virtual ~S3Transport() = default;
  // Sends `request` and returns the answer, whatever its status. A 2xx
  // answer's body goes to `sink` when there is one. Unavailable when there
  // is no answer (unreachable, reset, timed out); FailedPrecondition when TLS
  // fails (a retry cannot mend it); DataLoss when an answer for memory is
  // over kMaxXmlBytes; the sink's error as it is.
  virtual Result<S3Response> Send(const S3Request& request, const BodySink* sink) = 0;
};

struct CurlTimeouts {
  Millis connect{10'000};
  // A transfer that moves no byte for this long is abandoned.
  Millis stall{30'000};
  // One request, connection to last byte (a 16 MiB part at 1 MiB/s fits).
  Millis total{300'000};
};

// libcurl, signing with CURLOPT_AWS_SIGV4 for `endpoint`'s region, reusing
// connections through a small pool of handles. No proxy from the
// environment; TLS peers verified.
std::unique_ptr<S3Transport> MakeCurlS3Transport(S3Endpoint endpoint, std::string bucket,
                                                 S3Credentials credentials, CurlTimeouts timeouts);

struct RetryPolicy {
  int max_attempts = 8;
  Millis base{100};
  Millis cap{5'000};
  // When set, the longest wait after an attempt that got no answer (the
  // store unreachable or resetting): the agent passes its sync interval, so
  // a request retried through an outage tries again within an interval of
  // the store's return. Answers that ask to slow down (503, SlowDown, 429)
  // keep the full backoff.
  Millis unanswered_cap{0};
  // All attempts of one call, waits included: no call holds its caller
  // (the shipper, a stop's last flush) longer than this.
  Millis call_deadline{300'000};
};

// Whether an attempt's outcome is worth another: no answer (Unavailable), or
// an answer that says "later" (see the file comment).
bool IsRetryable(const Result<S3Response>& outcome);
// The wait before retry `retry` (1 for the first): uniform in
// [0, min(cap, base * 2^(retry-1))], from `random`.
Millis BackoffDelay(const RetryPolicy& policy, int retry, std::uint64_t random);

class S3Client {
 public:
  using Sleep = std::function<void(Millis)>;

  // `url` is what the destination was opened from; `credentials_source` says
  // where the credentials came from (never the credentials). `clock` must
  // outlive the client.
  S3Client(std::string url, S3Location location, S3Endpoint endpoint,
           std::string credentials_source, std::unique_ptr<S3Transport> transport,
           RetryPolicy policy, const MonotonicClock& clock, Sleep sleep, std::uint64_t seed);

  // Sends `request` (adding x-amz-content-sha256), retrying as the file
  // comment says. Returns the last answer whatever its status, or the last
  // transport error.
  Result<S3Response> Call(S3Request request, const BodySink* sink = nullptr);

  // The one-line error for `response`, an answer `what` ("PUT k/log/1") did
  // not want.
  Status ErrorOf(const S3Response& response, std::string_view what) const;

  // "replica s3://B/P at https://ENDPOINT": the start of every message.
  const std::string& where() const { return where_; }
  const S3Location& location() const { return location_; }
  const S3Endpoint& endpoint() const { return endpoint_; }
  const std::string& url() const { return url_; }

  // A random 64-bit number from the client's generator (probe names).
  std::uint64_t Random();

 private:
  const std::string url_;
  const S3Location location_;
  const S3Endpoint endpoint_;
  const std::string credentials_source_;
  const std::string where_;
  const std::unique_ptr<S3Transport> transport_;
  const RetryPolicy policy_;
  const MonotonicClock& clock_;
  const Sleep sleep_;
  std::mutex rng_mu_;
  std::mt19937_64 rng_;  // guarded by rng_mu_
};

}  // namespace fleetfs::replica::s3
