#include "fleet/replica/s3_client.h"

#include <curl/curl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "fleet/curl_tls.h"

namespace fleetfs::replica::s3 {
namespace {

// ── libcurl ────────────────────────────────────────────────────────────────

struct SlistDeleter {
  void operator()(curl_slist* list) const { curl_slist_free_all(list); }
};

// One transfer's state, shared with libcurl's callbacks.
struct Transfer {
  CURL* curl = nullptr;
  const S3Request* request = nullptr;
  const BodySink* sink = nullptr;
  std::uint64_t sent = 0;  // of the request body
  S3Response response;
  Status sink_error;
  Status read_error;
  bool too_big = false;
  bool head_seen = false;  // on_head was called
};

bool HeaderIs(std::string_view line, std::string_view name) {
  if (line.size() <= name.size() || line[name.size()] != ':') return false;
  for (std::size_t i = 0; i < name.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(line[i])) != name[i]) return false;
  }
  return true;
}

std::string HeaderValue(std::string_view line, std::size_t name_size) {
  std::string_view v = line.substr(name_size + 1);
  while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
  while (!v.empty() && (v.back() == '\r' || v.back() == '\n' || v.back() == ' ')) v.remove_suffix(1);
  return std::string(v);
}

std::size_t OnHeader(char* data, std::size_t size, std::size_t count, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const std::size_t n = size * count;
  std::string_view line(data, n);
  try {
    if (line.starts_with("HTTP/")) {
      // A new answer (after a 100 Continue): forget the last one's headers.
      t->response.etag.clear();
      t->response.content_length.reset();
      t->response.content_range.clear();
      t->response.bucket_region.clear();
    } else if (HeaderIs(line, "etag")) {
      t->response.etag = HeaderValue(line, 4);
    } else if (HeaderIs(line, "content-length")) {
      std::string v = HeaderValue(line, 14);
      char* end = nullptr;
      errno = 0;
      unsigned long long len = std::strtoull(v.c_str(), &end, 10);
      if (!v.empty() && end == v.c_str() + v.size() && errno == 0) t->response.content_length = len;
    } else if (HeaderIs(line, "content-range")) {
      t->response.content_range = HeaderValue(line, 13);
    } else if (HeaderIs(line, "x-amz-bucket-region")) {
      t->response.bucket_region = Printable(HeaderValue(line, 19), 64);
    }
  } catch (const std::bad_alloc&) {
    return 0;  // no exception may cross libcurl's C frames
  }
  return n;
}

std::size_t OnBody(char* data, std::size_t size, std::size_t count, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const std::size_t n = size * count;
  long status = 0;
  curl_easy_getinfo(t->curl, CURLINFO_RESPONSE_CODE, &status);
  if (t->sink != nullptr && status >= 200 && status < 300) {
    try {
      if (!t->head_seen) {
        t->head_seen = true;
        t->response.status = status;
        if (t->request->on_head) t->request->on_head(t->response);
      }
      Status st = (*t->sink)(std::string_view(data, n));
      if (!st.ok()) {
        t->sink_error = std::move(st);
        return 0;
      }
    } catch (...) {
      t->sink_error = Internal("a sink of an S3 answer threw");
      return 0;
    }
    return n;
  }
  if (t->response.body.size() + n > kMaxXmlBytes) {
    t->too_big = true;
    return 0;
  }
  try {
    t->response.body.append(data, n);
  } catch (const std::bad_alloc&) {
    t->too_big = true;
    return 0;
  }
  return n;
}

std::size_t OnRead(char* buffer, std::size_t size, std::size_t count, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const S3Request& r = *t->request;
  const std::uint64_t total = r.BodySize();
  const std::size_t want =
      static_cast<std::size_t>(std::min<std::uint64_t>(size * count, total - t->sent));
  if (want == 0) return 0;
  if (r.body_fd < 0) {
    std::memcpy(buffer, r.body.data() + t->sent, want);
    t->sent += want;
    return want;
  }
  while (true) {
    ssize_t n = ::pread(r.body_fd, buffer, want, static_cast<off_t>(r.body_offset + t->sent));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      t->read_error = n < 0 ? ErrnoStatus("reading the local copy to send it", errno)
                            : Status(Code::kIoError, "the local copy shrank while it was sent");
      return CURL_READFUNC_ABORT;
    }
    t->sent += static_cast<std::uint64_t>(n);
    return static_cast<std::size_t>(n);
  }
}

int OnSeek(void* user, curl_off_t offset, int origin) {
  auto* t = static_cast<Transfer*>(user);
  if (origin != SEEK_SET || offset < 0 ||
      static_cast<std::uint64_t>(offset) > t->request->BodySize()) {
    return CURL_SEEKFUNC_CANTSEEK;
  }
  t->sent = static_cast<std::uint64_t>(offset);
  return CURL_SEEKFUNC_OK;
}


class CurlS3Transport final : public S3Transport {
 public:
  CurlS3Transport(S3Endpoint endpoint, std::string bucket, S3Credentials credentials,
                  CurlTimeouts timeouts)
      : endpoint_(std::move(endpoint)),
        bucket_(std::move(bucket)),
        credentials_(std::move(credentials)),
        timeouts_(timeouts),
        sigv4_("aws:amz:" + endpoint_.region + ":s3") {}

  ~CurlS3Transport() override {
    for (CURL* c : idle_) curl_easy_cleanup(c);
  }

  Result<S3Response> Send(const S3Request& request, const BodySink* sink) override {
    CURL* c = Take();
    if (c == nullptr) return Unavailable("libcurl could not start a request");
    Result<S3Response> r = Perform(c, request, sink);
    Give(c);
    return r;
  }

 private:
  static constexpr std::size_t kPoolSize = 8;

  // A handle from the pool (its connections stay open between requests).
  CURL* Take() {
    {
      std::lock_guard lock(mu_);
      if (!idle_.empty()) {
        CURL* c = idle_.back();
        idle_.pop_back();
        return c;
      }
    }
    return curl_easy_init();
  }
  void Give(CURL* c) {
    curl_easy_reset(c);  // options go; the connection cache stays
    std::lock_guard lock(mu_);
    if (idle_.size() < kPoolSize) {
      idle_.push_back(c);
      return;
    }
    curl_easy_cleanup(c);
  }

  Result<S3Response> Perform(CURL* c, const S3Request& request, const BodySink* sink) {
    const std::string url = endpoint_.Url(bucket_, request.path_and_query);
    curl_slist* raw = nullptr;
    auto add = [&](const std::string& h) {
      curl_slist* next = curl_slist_append(raw, h.c_str());
      if (next != nullptr) raw = next;
      return next != nullptr;
    };
    bool ok = true;
    for (const auto& [name, value] : request.headers) ok = ok && add(name + ": " + value);
    if (!credentials_.session_token.empty()) {
      ok = ok && add("x-amz-security-token: " + credentials_.session_token);
    }
    // No "Expect:" here to turn 100-continue off: curl 7.88 would sign the
    // empty header it then leaves out. A refused create ends before its body.
    std::unique_ptr<curl_slist, SlistDeleter> headers(raw);
    if (!ok) return Unavailable("libcurl could not build a request's headers");

    Transfer t;
    t.curl = c;
    t.request = &request;
    t.sink = sink;
    char error[CURL_ERROR_SIZE] = {};
    curl_easy_setopt(c, CURLOPT_URL, url.c_str());
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);  // threads: no SIGALRM for DNS timeouts
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(timeouts_.connect.count()));
    Millis total = timeouts_.total;
    if (request.time_left.count() > 0) total = std::min(total, request.time_left);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, std::max<long>(1, static_cast<long>(total.count())));
    // Not more than a byte a second: S3 keeps a long CompleteMultipartUpload
    // alive by sending a space now and then. The total bound ends a trickle.
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
    // SigV4 signs the path as sent, and S3 keys may hold "." and ".." parts:
    // curl must not resolve them into another key (or the bucket itself).
    curl_easy_setopt(c, CURLOPT_PATH_AS_IS, 1L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME,
                     std::max<long>(1, static_cast<long>(timeouts_.stall.count() / 1000)));
    curl_easy_setopt(c, CURLOPT_AWS_SIGV4, sigv4_.c_str());
    curl_easy_setopt(c, CURLOPT_USERNAME, credentials_.access_key.c_str());
    curl_easy_setopt(c, CURLOPT_PASSWORD, credentials_.secret_key.c_str());
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers.get());
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, OnHeader);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, &t);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, OnBody);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &t);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, error);
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
    // The store is reached directly, whatever the agent's environment says
    // about proxies ("" turns the proxy off, "*" every no_proxy match on).
    curl_easy_setopt(c, CURLOPT_PROXY, "");
    curl_easy_setopt(c, CURLOPT_NOPROXY, "*");
    curl_easy_setopt(c, CURLOPT_SSL_VERIFYPEER, 1L);
    curl_easy_setopt(c, CURLOPT_SSL_VERIFYHOST, 2L);
    if (request.method == "HEAD") {
      curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
    } else if (request.method == "PUT" || request.method == "POST") {
      // An upload of a known size read through OnRead, whatever the method
      // (POST with a body of its own would add a form Content-Type).
      curl_easy_setopt(c, CURLOPT_UPLOAD, 1L);
      curl_easy_setopt(c, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(request.BodySize()));
      curl_easy_setopt(c, CURLOPT_READFUNCTION, OnRead);
      curl_easy_setopt(c, CURLOPT_READDATA, &t);
      curl_easy_setopt(c, CURLOPT_SEEKFUNCTION, OnSeek);
      curl_easy_setopt(c, CURLOPT_SEEKDATA, &t);
      if (request.method == "POST") curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, "POST");
    } else if (request.method != "GET") {
      curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, request.method.c_str());
    }
    const CURLcode code = curl_easy_perform(c);
    const std::string detail = error[0] != '\0' ? error : curl_easy_strerror(code);
    const std::string who = "S3 endpoint " + endpoint_.Name();
    if (!t.sink_error.ok()) return t.sink_error;
    if (!t.read_error.ok()) return t.read_error;
    if (t.too_big) {
      return DataLoss(who + " answered " + request.method + " with more than " +
                      std::to_string(kMaxXmlBytes >> 20) + " MiB where S3 sends XML; refused");
    }
    if (IsCurlTlsError(code)) {
      return Status(Code::kFailedPrecondition,
                    "TLS with " + who + " failed: " + detail +
                        " (the endpoint's certificate must verify with the system's CAs)");
    }
    if (code == CURLE_OPERATION_TIMEDOUT) {
      return Unavailable(who + " did not finish a " + request.method + " in time (" + detail + ")");
    }
    if (code != CURLE_OK) return Unavailable(who + ": " + request.method + " failed: " + detail);
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &t.response.status);
    return std::move(t.response);
  }

  const S3Endpoint endpoint_;
  const std::string bucket_;
  const S3Credentials credentials_;
  const CurlTimeouts timeouts_;
  const std::string sigv4_;
  std::mutex mu_;
  std::vector<CURL*> idle_;  // guarded by mu_
};

}  // namespace

std::unique_ptr<S3Transport> MakeCurlS3Transport(S3Endpoint endpoint, std::string bucket,
                                                 S3Credentials credentials, CurlTimeouts timeouts) {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  return std::make_unique<CurlS3Transport>(std::move(endpoint), std::move(bucket),
                                           std::move(credentials), timeouts);
}

// ── retries ────────────────────────────────────────────────────────────────

bool IsRetryable(const Result<S3Response>& outcome) {
  if (!outcome.ok()) return outcome.status().code() == Code::kUnavailable;
  const long s = outcome->status;
  if (s == 500 || s == 502 || s == 503 || s == 504 || s == 429) return true;
  if (s == 409 || s == 400) {
    // 409 ConditionalRequestConflict: a conditional write raced another on
    // the same key and lost the race for the lock, not for the name; AWS
    // says to retry. 400 RequestTimeout: the body came too slowly.
    auto e = ParseErrorBody(outcome->body);
    return e && (e->code == "ConditionalRequestConflict" || e->code == "RequestTimeout");
  }
  return false;
}

Millis BackoffDelay(const RetryPolicy& policy, int retry, std::uint64_t random) {
  std::int64_t ceiling = policy.base.count();
  for (int i = 1; i < retry && ceiling < policy.cap.count(); ++i) ceiling *= 2;
  ceiling = std::min<std::int64_t>(ceiling, policy.cap.count());
  if (ceiling <= 0) return Millis(0);
  return Millis(static_cast<std::int64_t>(random % static_cast<std::uint64_t>(ceiling + 1)));
}

S3Client::S3Client(std::string url, S3Location location, S3Endpoint endpoint,
                   std::string credentials_source, std::unique_ptr<S3Transport> transport,
                   RetryPolicy policy, const MonotonicClock& clock, Sleep sleep,
                   std::uint64_t seed)
    : url_(std::move(url)),
      location_(std::move(location)),
      endpoint_(std::move(endpoint)),
      credentials_source_(std::move(credentials_source)),
      where_("replica " + url_ + " at " + endpoint_.Name()),
      transport_(std::move(transport)),
      policy_(policy),
      clock_(clock),
      sleep_(sleep ? std::move(sleep) : Sleep([](Millis ms) { std::this_thread::sleep_for(ms); })),
      rng_(seed) {}

std::uint64_t S3Client::Random() {
  std::lock_guard lock(rng_mu_);
  return rng_();
}

Result<S3Response> S3Client::Call(S3Request request, const BodySink* sink) {
  std::string sha;
  if (request.body_fd >= 0) {
    FLEETFS_ASSIGN_OR_RETURN(
        sha, Sha256HexOfFile(request.body_fd, request.body_offset, request.body_length));
  } else {
    sha = request.body.empty() ? std::string(kEmptySha256) : Sha256Hex(request.body);
  }
  request.headers.emplace_back("x-amz-content-sha256", std::move(sha));

  // What reached the sink: once a byte has, a retry would give it twice.
  std::uint64_t delivered = 0;
  Status sink_error;
  BodySink counted;
  if (sink != nullptr) {
    counted = [&](std::string_view piece) {
      Status st = (*sink)(piece);
      if (!st.ok()) {
        sink_error = st;
        return st;
      }
      delivered += piece.size();
      return Status::Ok();
    };
  }
  const MonoTime deadline = clock_.Now() + policy_.call_deadline;
  for (int attempt = 1;; ++attempt) {
    const MonoTime now = clock_.Now();
    if (now >= deadline) {
      return Unavailable(where_ + ": " + request.method + " ran out of its time (" +
                         std::to_string(policy_.call_deadline.count() / 1000) + " s for a call)");
    }
    // At least 1 ms: 0 would mean no bound at all.
    request.time_left =
        std::max(Millis(1), std::chrono::duration_cast<Millis>(deadline - now));
    Result<S3Response> r = transport_->Send(request, sink != nullptr ? &counted : nullptr);
    if (!sink_error.ok()) return sink_error;
    if (r.ok()) r->attempts = attempt;
    if (!IsRetryable(r)) return r;
    if (delivered > 0) {
      return Unavailable(where_ + ": " + request.method + " broke off after " +
                         std::to_string(delivered) + " bytes of the answer: " +
                         (r.ok() ? "HTTP " + std::to_string(r->status) : r.status().message()));
    }
    if (attempt >= policy_.max_attempts) return r;
    RetryPolicy policy = policy_;
    if (!r.ok() && policy.unanswered_cap.count() > 0) {
      policy.cap = std::min(policy.cap, policy.unanswered_cap);
    }
    Millis wait = BackoffDelay(policy, attempt, Random());
    if (clock_.Now() + wait >= deadline) return r;  // no attempt would have time left
    sleep_(wait);
  }
}

Status S3Client::ErrorOf(const S3Response& response, std::string_view what) const {
  const std::optional<S3ErrorBody> e = ParseErrorBody(response.body);
  const std::string code = e ? e->code : "";
  const std::string& bucket = location_.bucket;
  std::string detail = "HTTP " + std::to_string(response.status);
  if (e) detail += " " + e->code + (e->message.empty() ? "" : ": " + e->message);
  auto config = [&](std::string rule) {
    return Status(Code::kFailedPrecondition, where_ + ": " + rule);
  };
  std::string region = e && !e->region.empty() ? e->region : response.bucket_region;
  if (code == "RequestTimeTooSkewed") {
    // A 403, but no credential is at fault: SigV4 refuses a request whose
    // time is more than 15 minutes from the store's.
    return config("this host's clock is too far from the store's for a signed request (" +
                  detail + "): set the clock right (NTP)");
  }
  if (response.status == 301 || response.status == 307 || code == "PermanentRedirect" ||
      code == "TemporaryRedirect" ||
      code == "AuthorizationHeaderMalformed" || code == "IllegalLocationConstraintException" ||
      (code == "AuthorizationQueryParametersError" && !region.empty())) {
    if (!region.empty() && region != endpoint_.region) {
      return config("bucket " + bucket + " is in region " + region + ", not " + endpoint_.region +
                    ": set replica_region = \"" + region + "\" (" + detail + ")");
    }
    return config("bucket " + bucket + " is not in region " + endpoint_.region +
                  " or not at this endpoint: set replica_region (and replica_endpoint) to where "
                  "it is (" + detail + (e && !e->endpoint.empty() ? "; S3 names " + e->endpoint : "") +
                  ")");
  }
  if (code == "InvalidAccessKeyId") {
    return config("the access key from " + credentials_source_ +
                  " is not known there: wrong credentials (" + detail + ")");
  }
  if (code == "SignatureDoesNotMatch") {
    return config("the secret key from " + credentials_source_ +
                  " does not match its access key: wrong credentials (" + detail + ")");
  }
  if (code == "ExpiredToken" || code == "InvalidToken" || code == "TokenRefreshRequired") {
    return config("the session token from " + credentials_source_ +
                  " is expired or invalid (" + detail + ")");
  }
  if (code == "AccessDenied" || code == "AllAccessDisabled" || response.status == 403) {
    return config("access to bucket " + bucket + " is denied to the credentials from " +
                  credentials_source_ + " (" + detail +
                  "); they need s3:ListBucket, s3:GetObject, s3:PutObject and s3:DeleteObject "
                  "on it");
  }
  if (code == "NoSuchBucket") {
    return config("bucket " + bucket + " does not exist there (" + detail + ")");
  }
  if (response.status == 404) {
    return NotFound(where_ + ": " + std::string(what) + ": no such object (" + detail + ")");
  }
  if (response.status == 501 || code == "NotImplemented") {
    return config("the store does not implement " + std::string(what) + " (" + detail + ")");
  }
  std::string tries =
      response.attempts > 1 ? " after " + std::to_string(response.attempts) + " attempts" : "";
  if (response.status >= 500 || response.status == 429 || response.status == 409 ||
      code == "RequestTimeout") {
    return Unavailable(where_ + ": " + std::string(what) + " failed" + tries + " (" + detail + ")");
  }
  return Status(Code::kIoError,
                where_ + ": " + std::string(what) + " was refused (" + detail + ")");
}

}  // namespace fleetfs::replica::s3
