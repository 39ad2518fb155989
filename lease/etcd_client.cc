#include "lease/etcd_client.h"

#include <curl/curl.h>

#include <algorithm>
#include <charconv>
#include <mutex>
#include <thread>
#include <nlohmann/json.hpp>

#include "fleet/curl_tls.h"
#include "lease/bounded_json.h"
#include "lease/owner_id.h"

namespace fleetfs::lease {
namespace {

using Json = nlohmann::json;

// The largest answer is a range of the whole table: a full one of 16384
// one-slot rows is ~4 MiB (~11 MiB with a 128-byte prefix and 128-byte
// owners). A larger answer is not one of ours, and holding it costs memory
// the agent needs.
constexpr std::size_t kMaxAnswerBytes = 16u << 20;

// A gateway answer nests at most 4 deep ({"kvs":[{"key":...}]}, a keepalive's
// {"result":{"header":{}}}); a full table is ~150k values. nlohmann spends
// tens of bytes on a value and more on a level, so without these limits a
// hostile 16 MiB answer costs gigabytes.
constexpr JsonLimits kAnswerLimits{.max_depth = 8, .max_values = 1'000'000};

// The gRPC code the gateway passes on for a lease that is gone.
constexpr int kGrpcNotFound = 5;

// Every refusal etcd itself makes says so: its messages are its server's
// errors ("etcdserver: requested lease not found"). Another gRPC gateway, or
// an ingress in front of a dead member, answers with the same codes and
// other words; taking its 404 as the cluster's refusal would end every call
// on it while a good member waits in the URL.
constexpr std::string_view kEtcdServerPrefix = "etcdserver: ";

constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

int Sextet(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

// An answer's fields, read with their types checked; every error names the
// endpoint, the call and the field.
class AnswerReader {
 public:
  AnswerReader(std::string endpoint, std::string_view path)
      : where_("etcd endpoint " + endpoint + " answered " + std::string(path) + " with ") {}

  Status Bad(const std::string& field, const std::string& rule) const {
    return DataLoss(where_ + "a bad field '" + field + "': " + rule +
                    "; is it an etcd 3.4 client URL?");
  }

  Result<Json> Parse(const std::string& body) const {
    auto json = ParseBoundedJson(body, kAnswerLimits);
    if (!json.ok()) {
      return DataLoss(where_ + "something that " + json.status().message() + " ('" +
                      Printable(std::string_view(body).substr(0, 120)) +
                      "'); is it an etcd 3.4 client URL?");
    }
    if (!json->is_object()) return Bad("(the answer)", "must be a JSON object");
    return std::move(*json);
  }

  // An object member that may be absent (null); a present one must be an object.
  Result<const Json*> Object(const Json& parent, const char* name, const std::string& field) const {
    const auto it = parent.find(name);
    if (it == parent.end() || it->is_null()) return static_cast<const Json*>(nullptr);
    if (!it->is_object()) return Bad(field, "must be a JSON object");
    return &*it;
  }

  // A 64-bit signed number, written as a decimal string (as the gateway
  // writes them) or a JSON integer; absent is 0.
  Result<std::int64_t> Int64(const Json& parent, const char* name, const std::string& field) const {
    const auto it = parent.find(name);
    if (it == parent.end() || it->is_null()) return std::int64_t{0};
    if (it->is_number_integer() && !it->is_number_unsigned()) return it->get<std::int64_t>();
    if (it->is_number_unsigned()) {
      const std::uint64_t u = it->get<std::uint64_t>();
      if (u > static_cast<std::uint64_t>(INT64_MAX)) return Bad(field, "is above 2^63-1");
      return static_cast<std::int64_t>(u);
    }
    if (!it->is_string()) return Bad(field, "must be a 64-bit integer as a decimal string");
    const std::string& text = it->get_ref<const std::string&>();
    std::int64_t value = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (text.empty() || ec != std::errc() || end != text.data() + text.size()) {
      return Bad(field, "'" + Printable(text.substr(0, 40)) + "' is not a 64-bit integer");
    }
    return value;
  }

  // A lease TTL in seconds: absent is 0; negative is left to the caller.
  Result<std::int64_t> Ttl(const Json& parent, const char* name, const std::string& field) const {
    FLEETFS_ASSIGN_OR_RETURN(const std::int64_t ttl, Int64(parent, name, field));
    if (ttl > EtcdClient::kMaxLeaseTtlS) {
      return Bad(field, std::to_string(ttl) + " s is beyond any lease (10 years)");
    }
    return ttl;
  }

  // Absent is false.
  Result<bool> Bool(const Json& parent, const char* name, const std::string& field) const {
    const auto it = parent.find(name);
    if (it == parent.end() || it->is_null()) return false;
    if (!it->is_boolean()) return Bad(field, "must be true or false");
    return it->get<bool>();
  }

  // Base64 bytes; absent is empty.
  Result<std::string> Bytes(const Json& parent, const char* name, const std::string& field) const {
    const auto it = parent.find(name);
    if (it == parent.end() || it->is_null()) return std::string();
    if (!it->is_string()) return Bad(field, "must be a base64 string");
    auto decoded = Base64Decode(it->get_ref<const std::string&>());
    if (!decoded) return Bad(field, "is not valid base64");
    return std::move(*decoded);
  }

  // Every answer of etcd carries a header with the store's revision, 1 or
  // more from the cluster's first moment. Without this check a member that
  // answers "{}" passes as "no keys", "lease gone" or "compare failed": a
  // renewal through it would find its row gone and drop the range.
  Result<std::int64_t> HeaderRevision(const Json& answer,
                                      const std::string& field = "header") const {
    FLEETFS_ASSIGN_OR_RETURN(const Json* header, Object(answer, "header", field));
    if (header == nullptr) return Bad(field, "every etcd answer has one");
    FLEETFS_ASSIGN_OR_RETURN(const std::int64_t revision,
                             Int64(*header, "revision", field + ".revision"));
    if (revision < 1) return Bad(field + ".revision", "is 1 or more in every etcd answer");
    return revision;
  }

 private:
  std::string where_;
};

// How the gateway names a comparison's target, and the field its value goes in.
struct CompareNames {
  const char* target;
  const char* field;
};

CompareNames NamesOf(EtcdCompare::Target target) {
  switch (target) {
    case EtcdCompare::Target::kModRevision:
      return {"MOD", "mod_revision"};
    case EtcdCompare::Target::kCreateRevision:
      return {"CREATE", "create_revision"};
    case EtcdCompare::Target::kVersion:
      return {"VERSION", "version"};
  }
  return {"MOD", "mod_revision"};
}

// ── libcurl ────────────────────────────────────────────────────────────────

struct CurlDeleter {
  void operator()(CURL* curl) const { curl_easy_cleanup(curl); }
};
struct SlistDeleter {
  void operator()(curl_slist* list) const { curl_slist_free_all(list); }
};

struct Sink {
  std::string body;
  bool too_big = false;
};

std::size_t Collect(char* data, std::size_t size, std::size_t count, void* user) {
  auto* sink = static_cast<Sink*>(user);
  const std::size_t n = size * count;
  if (sink->body.size() + n > kMaxAnswerBytes) {
    sink->too_big = true;
    return 0;  // ends the transfer
  }
  try {
    sink->body.append(data, n);
  } catch (const std::bad_alloc&) {
    // No exception may cross libcurl's C frames.
    sink->too_big = true;
    return 0;
  }
  return n;
}


class CurlTransport final : public EtcdTransport {
 public:
  explicit CurlTransport(EtcdTls tls) : tls_(std::move(tls)) {}

  Result<EtcdHttpAnswer> Post(const EtcdHttpCall& call) override {
    std::unique_ptr<CURL, CurlDeleter> curl(curl_easy_init());
    if (!curl) return Unavailable("etcd endpoint " + call.endpoint + ": libcurl could not start a call");
    std::unique_ptr<curl_slist, SlistDeleter> headers(
        curl_slist_append(nullptr, "Content-Type: application/json"));
    const std::string url = (tls_.enabled ? "https://" : "http://") + call.endpoint + call.path;
    const long timeout_ms = std::max<long>(1, static_cast<long>(call.timeout.count()));
    char error[CURL_ERROR_SIZE] = {};
    Sink sink;
    CURL* c = curl.get();
    curl_easy_setopt(c, CURLOPT_URL, url.c_str());
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);  // threads: no SIGALRM for DNS timeouts
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, timeout_ms);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers.get());
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, call.body.data());
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(call.body.size()));
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, Collect);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &sink);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, error);
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
    // libcurl takes a proxy from http_proxy/https_proxy/all_proxy unless told
    // otherwise; the members are reached directly, whatever the agent's
    // environment says ("" turns the proxy off, "*" every no_proxy match on).
    curl_easy_setopt(c, CURLOPT_PROXY, "");
    curl_easy_setopt(c, CURLOPT_NOPROXY, "*");
    if (tls_.enabled) {
      if (!tls_.ca.empty()) curl_easy_setopt(c, CURLOPT_CAINFO, tls_.ca.c_str());
      if (!tls_.cert.empty()) curl_easy_setopt(c, CURLOPT_SSLCERT, tls_.cert.c_str());
      if (!tls_.key.empty()) curl_easy_setopt(c, CURLOPT_SSLKEY, tls_.key.c_str());
      // Without a password of its own libcurl leaves OpenSSL to ask for a
      // key's passphrase on /dev/tty: a call that waits forever, past every
      // deadline. With "" an encrypted key fails at once.
      curl_easy_setopt(c, CURLOPT_KEYPASSWD, "");
    }
    const CURLcode code = curl_easy_perform(c);
    const std::string detail = error[0] != '\0' ? error : curl_easy_strerror(code);
    const std::string who = "etcd endpoint " + call.endpoint;
    if (sink.too_big) {
      return DataLoss(who + " answered " + call.path + " with more than " +
                      std::to_string(kMaxAnswerBytes >> 20) +
                      " MiB, more than a whole ownership table; refused");
    }
    if (code == CURLE_OPERATION_TIMEDOUT) {
      return Unavailable(who + " did not answer " + call.path + " within " +
                         std::to_string(timeout_ms) + " ms (" + detail + ")");
    }
    if (code == CURLE_SSL_CERTPROBLEM && !tls_.cert.empty()) {
      return Status(Code::kFailedPrecondition,
                    "TLS with " + who + ": the client certificate " + tls_.cert + " or its key " +
                        tls_.key + " could not be loaded (" + detail +
                        "); a key protected by a passphrase is not supported");
    }
    if (IsCurlTlsError(code)) {
      // Not Unavailable: going round the endpoints again will not mend it.
      return Status(Code::kFailedPrecondition, "TLS with " + who + " failed: " + detail +
                         "; an etcds:// store needs members that serve TLS, with certificates "
                         "signed by store_ca (and store_cert/store_key when they ask for a "
                         "client certificate)");
    }
    if (code == CURLE_COULDNT_CONNECT || code == CURLE_COULDNT_RESOLVE_HOST) {
      return Unavailable(who + " is unreachable: " + detail);
    }
    if (tls_.enabled && (code == CURLE_RECV_ERROR || code == CURLE_SEND_ERROR ||
                         code == CURLE_GOT_NOTHING)) {
      // TLS 1.3 checks a client certificate after the handshake: a member
      // that refuses it just closes the connection.
      return Unavailable("TLS with " + who + " failed: the member closed the connection (" +
                         detail + "); a member that asks for a client certificate does so "
                         "when store_cert/store_key is missing or not signed by its CA");
    }
    if (code == CURLE_GOT_NOTHING && !tls_.enabled) {
      return Unavailable(who + ": " + detail +
                         " (a member that serves TLS closes plain connections so; use etcds://)");
    }
    if (code != CURLE_OK) return Unavailable(who + ": " + detail);
    long status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    return EtcdHttpAnswer{status, std::move(sink.body)};
  }

 private:
  const EtcdTls tls_;
};

}  // namespace

std::unique_ptr<EtcdTransport> MakeCurlTransport(EtcdTls tls) {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  return std::make_unique<CurlTransport>(std::move(tls));
}

std::string Base64Encode(std::string_view bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  std::size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    const std::uint32_t n = (static_cast<unsigned char>(bytes[i]) << 16) |
                            (static_cast<unsigned char>(bytes[i + 1]) << 8) |
                            static_cast<unsigned char>(bytes[i + 2]);
    out += kAlphabet[(n >> 18) & 63];
    out += kAlphabet[(n >> 12) & 63];
    out += kAlphabet[(n >> 6) & 63];
    out += kAlphabet[n & 63];
  }
  const std::size_t rest = bytes.size() - i;
  if (rest > 0) {
    std::uint32_t n = static_cast<unsigned char>(bytes[i]) << 16;
    if (rest == 2) n |= static_cast<unsigned char>(bytes[i + 1]) << 8;
    out += kAlphabet[(n >> 18) & 63];
    out += kAlphabet[(n >> 12) & 63];
    out += rest == 2 ? kAlphabet[(n >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

std::optional<std::string> Base64Decode(std::string_view text) {
  if (text.size() % 4 != 0) return std::nullopt;
  std::string out;
  out.reserve(text.size() / 4 * 3);
  for (std::size_t i = 0; i < text.size(); i += 4) {
    const bool last = i + 4 == text.size();
    int s[4];
    int pad = 0;
    for (int j = 0; j < 4; ++j) {
      const char c = text[i + j];
      if (c == '=' && last && j >= 2) {
        s[j] = 0;
        ++pad;
        continue;
      }
      if (pad > 0) return std::nullopt;  // data after padding
      s[j] = Sextet(c);
      if (s[j] < 0) return std::nullopt;
    }
    const std::uint32_t n = (s[0] << 18) | (s[1] << 12) | (s[2] << 6) | s[3];
    // Bits below the padding must be zero: one encoding per byte string.
    if ((pad == 1 && (n & 0xff) != 0) || (pad == 2 && (n & 0xffff) != 0)) return std::nullopt;
    out += static_cast<char>((n >> 16) & 0xff);
    if (pad < 2) out += static_cast<char>((n >> 8) & 0xff);
    if (pad < 1) out += static_cast<char>(n & 0xff);
  }
  return out;
}

EtcdClient::EtcdClient(std::vector<std::string> endpoints, std::unique_ptr<EtcdTransport> transport,
                       const MonotonicClock& clock, Sleep sleep)
    : endpoints_(std::move(endpoints)),
      transport_(std::move(transport)),
      clock_(clock),
      sleep_(sleep ? std::move(sleep) : Sleep([](Millis ms) { std::this_thread::sleep_for(ms); })) {
  assert(!endpoints_.empty());
}

namespace {

// gRPC codes with which etcd refuses the request itself, alike on every
// member, so asking another member is pointless: InvalidArgument (a bad txn:
// a key twice, too many operations, too large), NotFound (a gone lease),
// AlreadyExists, PermissionDenied and Unauthenticated (the cluster's auth),
// FailedPrecondition, OutOfRange (a TTL too large, a compacted revision).
// Every other code (Unavailable, Unknown, Internal, ResourceExhausted for
// "too many requests", Unimplemented, ...) says something about the member
// that answered: the next one is tried.
bool IsDefinitiveRefusal(int grpc) {
  switch (grpc) {
    case 3:
    case 5:
    case 6:
    case 7:
    case 9:
    case 11:
    case 16:
      return true;
    default:
      return false;
  }
}

}  // namespace

Status EtcdClient::Call(std::string_view path, const std::string& body, MonoTime deadline,
                        const ReadAnswer& read) {
  const std::size_t n = endpoints_.size();
  const std::size_t first = preferred_.load();
  // The first failure of each endpoint (its fullest attempt), for the
  // status when none answers well.
  std::vector<Status> failures(n);
  // Endpoints that failed in a way another round cannot mend (TLS, an answer
  // that is not the gateway's).
  std::vector<bool> hopeless(n, false);
  auto failed = [&](std::size_t index, Status why, bool for_good) {
    if (failures[index].ok()) failures[index] = std::move(why);
    hopeless[index] = hopeless[index] || for_good;
  };
  bool any_tried = false;
  for (int round = 0;; ++round) {
    if (round > 0) {
      const MonoTime now = clock_.Now();
      if (std::all_of(hopeless.begin(), hopeless.end(), [](bool h) { return h; })) break;
      if (now + kRoundPause >= deadline) break;
      sleep_(kRoundPause);
    }
    for (std::size_t tried = 0; tried < n; ++tried) {
      const std::size_t index = (first + tried) % n;
      if (hopeless[index]) continue;
      const std::string& endpoint = endpoints_[index];
      const std::string who = "etcd endpoint " + endpoint;
      const MonoTime now = clock_.Now();
      if (now >= deadline) break;
      const Millis left = std::chrono::ceil<Millis>(deadline - now);
      // Every attempt but the round's last leaves half the time for the next.
      const Millis budget = tried + 1 < n ? std::max(left / 2, Millis(1)) : left;
      any_tried = true;
      Result<EtcdHttpAnswer> answer = Unavailable(who + ": not asked");
      try {
        answer = transport_->Post({endpoint, std::string(path), body, budget});
      } catch (const std::exception& e) {
        // Nothing thrown below may end the agent; it costs this endpoint.
        answer = Unavailable(who + ": the call to " + std::string(path) + " failed: " + e.what());
      }
      if (!answer.ok()) {
        failed(index, answer.status(), answer.status().code() != Code::kUnavailable);
        continue;
      }
      if (clock_.Now() > deadline) {
        return Status(Code::kDeadlineExceeded,
                      who + " answered " + std::string(path) +
                          " after the call's time limit; the answer is ignored");
      }
      if (answer->status == 200) {
        Status got;
        try {
          got = read(endpoint, answer->body);
        } catch (const std::exception& e) {
          got = DataLoss(who + " answered " + std::string(path) +
                         " with something that could not be read: " + e.what());
        }
        if (got.ok()) {
          preferred_.store(index);
          return got;
        }
        // Not a well-formed answer of the call (DataLoss), or the member
        // could not do it (Unavailable): the next member may.
        if (got.code() == Code::kDataLoss || got.code() == Code::kUnavailable) {
          const bool for_good = got.code() == Code::kDataLoss;
          failed(index, std::move(got), for_good);
          continue;
        }
        preferred_.store(index);  // a definitive answer of the cluster
        return got;
      }
      // An error answer: {"error": ..., "message": ..., "code": N}.
      std::string message = "HTTP " + std::to_string(answer->status);
      int grpc = -1;
      const auto json = ParseBoundedJson(answer->body, {.max_depth = 4, .max_values = 1000});
      bool gateway = false;
      if (json.ok() && json->is_object()) {
        const auto m = json->find("message");
        const auto c = json->find("code");
        if (m != json->end() && m->is_string() && c != json->end() && c->is_number_integer()) {
          gateway = true;
          message = Printable(m->get_ref<const std::string&>().substr(0, 300));
          grpc = static_cast<int>(std::clamp<std::int64_t>(c->get<std::int64_t>(), -1, 1000));
        }
      }
      if (!gateway) {
        message += ": '" + Printable(std::string_view(answer->body).substr(0, 120)) + "'";
      }
      const std::string said = who + " refused " + std::string(path) + ": " + message;
      if (gateway && IsDefinitiveRefusal(grpc) && message.rfind(kEtcdServerPrefix, 0) == 0) {
        // Final, but not a reason to prefer this member: a refusal is cheap
        // to fake, and a good answer moves the preference soon enough.
        if (grpc == kGrpcNotFound) return NotFound(said);
        return Status(Code::kFailedPrecondition, said);
      }
      // Another round may mend what etcd itself said (no leader, too many
      // requests) or what a proxy says when the member is down (502-504);
      // any other answer that is not the gateway's will not change.
      const bool transient = gateway || answer->status == 502 || answer->status == 503 ||
                             answer->status == 504;
      if (transient) {
        failed(index, Unavailable(said), false);
      } else {
        failed(index, DataLoss(said + "; is it an etcd 3.4 client URL?"), true);
      }
    }
    if (clock_.Now() >= deadline) break;
  }
  if (!any_tried) {
    return Status(Code::kDeadlineExceeded,
                  "etcd call " + std::string(path) + ": its time limit ended before any endpoint "
                  "could be tried");
  }
  std::string all;
  bool all_malformed = true;
  for (std::size_t i = 0; i < n; ++i) {
    const Status& failure = failures[(first + i) % n];
    if (failure.ok()) continue;
    all += (all.empty() ? "" : "; ") + failure.message();
    all_malformed = all_malformed && failure.code() == Code::kDataLoss;
  }
  // Only answers that are not etcd's: the URL names something else.
  if (all_malformed) {
    return DataLoss("no etcd endpoint gave a well-formed answer to " + std::string(path) + ": " +
                    all);
  }
  return Unavailable("the etcd cluster did not answer " + std::string(path) +
                     " within the call's time limit: " + all);
}

Result<EtcdRange> EtcdClient::Range(const std::string& key, const std::string& range_end,
                                    MonoTime deadline) {
  Json request = {{"key", Base64Encode(key)}};
  if (!range_end.empty()) request["range_end"] = Base64Encode(range_end);
  static constexpr std::string_view kPath = "/v3/kv/range";
  EtcdRange range;
  FLEETFS_RETURN_IF_ERROR(Call(kPath, request.dump(), deadline,
                               [&](const std::string& endpoint, const std::string& body) -> Status {
    range = EtcdRange{};
    const AnswerReader read(endpoint, kPath);
    FLEETFS_ASSIGN_OR_RETURN(const Json json, read.Parse(body));
    FLEETFS_ASSIGN_OR_RETURN(range.revision, read.HeaderRevision(json));
    const auto kvs = json.find("kvs");
    if (kvs == json.end() || kvs->is_null()) return Status::Ok();
    if (!kvs->is_array()) return read.Bad("kvs", "must be a list");
    range.kvs.reserve(kvs->size());
    for (std::size_t i = 0; i < kvs->size(); ++i) {
      const Json& item = (*kvs)[i];
      const std::string at = "kvs[" + std::to_string(i) + "].";
      if (!item.is_object()) return read.Bad("kvs[" + std::to_string(i) + "]", "must be an object");
      EtcdKv kv;
      FLEETFS_ASSIGN_OR_RETURN(kv.key, read.Bytes(item, "key", at + "key"));
      FLEETFS_ASSIGN_OR_RETURN(kv.value, read.Bytes(item, "value", at + "value"));
      FLEETFS_ASSIGN_OR_RETURN(kv.create_revision,
                               read.Int64(item, "create_revision", at + "create_revision"));
      FLEETFS_ASSIGN_OR_RETURN(kv.mod_revision,
                               read.Int64(item, "mod_revision", at + "mod_revision"));
      FLEETFS_ASSIGN_OR_RETURN(kv.version, read.Int64(item, "version", at + "version"));
      FLEETFS_ASSIGN_OR_RETURN(kv.lease, read.Int64(item, "lease", at + "lease"));
      if (kv.key.empty()) return read.Bad(at + "key", "a key is never empty");
      range.kvs.push_back(std::move(kv));
    }
    return Status::Ok();
  }));
  return range;
}

Result<EtcdTxnResult> EtcdClient::Txn(const EtcdTxn& txn, MonoTime deadline) {
  Json compare = Json::array();
  for (const EtcdCompare& c : txn.compare) {
    compare.push_back({{"key", Base64Encode(c.key)},
                       {"target", NamesOf(c.target).target},
                       {"result", "EQUAL"},
                       {NamesOf(c.target).field, std::to_string(c.value)}});
  }
  Json success = Json::array();
  for (const EtcdOp& op : txn.success) {
    if (op.kind == EtcdOp::Kind::kDelete) {
      success.push_back({{"request_delete_range", {{"key", Base64Encode(op.key)}}}});
    } else {
      Json put = {{"key", Base64Encode(op.key)}, {"value", Base64Encode(op.value)}};
      if (op.lease != 0) put["lease"] = std::to_string(op.lease);
      success.push_back({{"request_put", put}});
    }
  }
  const Json request = {{"compare", compare}, {"success", success}};
  static constexpr std::string_view kPath = "/v3/kv/txn";
  EtcdTxnResult result;
  // Sent again to the next member when one gives no good answer: the
  // comparisons make that safe (a txn that landed the first time fails them
  // the second; the caller looks at what is there).
  FLEETFS_RETURN_IF_ERROR(Call(kPath, request.dump(), deadline,
                               [&](const std::string& endpoint, const std::string& body) -> Status {
    const AnswerReader read(endpoint, kPath);
    FLEETFS_ASSIGN_OR_RETURN(const Json json, read.Parse(body));
    FLEETFS_ASSIGN_OR_RETURN(result.revision, read.HeaderRevision(json));
    FLEETFS_ASSIGN_OR_RETURN(result.succeeded, read.Bool(json, "succeeded", "succeeded"));
    return Status::Ok();
  }));
  return result;
}

Result<EtcdLease> EtcdClient::Grant(std::int64_t ttl_s, MonoTime deadline) {
  static constexpr std::string_view kPath = "/v3/lease/grant";
  const Json request = {{"TTL", std::to_string(ttl_s)}};
  EtcdLease lease;
  // A grant sent again to the next member leaks the first lease, if it was
  // granted, until its TTL ends: nothing is attached to it.
  FLEETFS_RETURN_IF_ERROR(Call(kPath, request.dump(), deadline,
                               [&](const std::string& endpoint, const std::string& body) -> Status {
    const AnswerReader read(endpoint, kPath);
    FLEETFS_ASSIGN_OR_RETURN(const Json json, read.Parse(body));
    const auto error = json.find("error");
    if (error != json.end() && error->is_string() &&
        !error->get_ref<const std::string&>().empty()) {
      return Status(Code::kFailedPrecondition,
                    "etcd endpoint " + endpoint + " refused a lease: " +
                        Printable(error->get_ref<const std::string&>().substr(0, 300)));
    }
    FLEETFS_RETURN_IF_ERROR(read.HeaderRevision(json).status());
    FLEETFS_ASSIGN_OR_RETURN(lease.id, read.Int64(json, "ID", "ID"));
    FLEETFS_ASSIGN_OR_RETURN(lease.ttl_s, read.Ttl(json, "TTL", "TTL"));
    if (lease.id == 0) return read.Bad("ID", "a granted lease has an id");
    if (lease.ttl_s < ttl_s) {
      return read.Bad("TTL", std::to_string(lease.ttl_s) + " s is shorter than the " +
                                 std::to_string(ttl_s) + " s asked for");
    }
    return Status::Ok();
  }));
  return lease;
}

Result<std::optional<std::int64_t>> EtcdClient::KeepAlive(std::int64_t lease, MonoTime deadline) {
  static constexpr std::string_view kPath = "/v3/lease/keepalive";
  const Json request = {{"ID", std::to_string(lease)}};
  std::optional<std::int64_t> left;
  FLEETFS_RETURN_IF_ERROR(Call(kPath, request.dump(), deadline,
                               [&](const std::string& endpoint, const std::string& body) -> Status {
    const AnswerReader read(endpoint, kPath);
    FLEETFS_ASSIGN_OR_RETURN(const Json json, read.Parse(body));
    // A stream of one message: {"result": {...}} or {"error": {...}}.
    FLEETFS_ASSIGN_OR_RETURN(const Json* error, read.Object(json, "error", "error"));
    if (error != nullptr) {
      const auto m = error->find("message");
      const std::string message = m != error->end() && m->is_string()
                                      ? Printable(m->get_ref<const std::string&>().substr(0, 300))
                                      : "?";
      // The stream broke on this member (no leader, say): the next may do.
      return Unavailable("etcd endpoint " + endpoint + " refused a keepalive of lease " +
                         std::to_string(lease) + ": " + message);
    }
    FLEETFS_ASSIGN_OR_RETURN(const Json* result, read.Object(json, "result", "result"));
    if (result == nullptr) return read.Bad("result", "a keepalive answer has one");
    FLEETFS_RETURN_IF_ERROR(read.HeaderRevision(*result, "result.header").status());
    FLEETFS_ASSIGN_OR_RETURN(const std::int64_t id, read.Int64(*result, "ID", "result.ID"));
    FLEETFS_ASSIGN_OR_RETURN(const std::int64_t ttl, read.Ttl(*result, "TTL", "result.TTL"));
    if (id != lease) {
      return read.Bad("result.ID", "lease " + std::to_string(id) +
                                       " is not the lease kept alive (" + std::to_string(lease) +
                                       ")");
    }
    if (ttl < 0) return read.Bad("result.TTL", "a lease's TTL is not negative");
    left = ttl == 0 ? std::nullopt : std::optional<std::int64_t>(ttl);
    return Status::Ok();
  }));
  return left;
}

Status EtcdClient::Revoke(std::int64_t lease, MonoTime deadline) {
  static constexpr std::string_view kPath = "/v3/lease/revoke";
  const Json request = {{"ID", std::to_string(lease)}};
  return Call(kPath, request.dump(), deadline,
              [&](const std::string& endpoint, const std::string& body) -> Status {
                const AnswerReader read(endpoint, kPath);
                FLEETFS_ASSIGN_OR_RETURN(const Json json, read.Parse(body));
                return read.HeaderRevision(json).status();
              });
}

Result<std::optional<std::int64_t>> EtcdClient::TimeToLive(std::int64_t lease, MonoTime deadline) {
  static constexpr std::string_view kPath = "/v3/lease/timetolive";
  const Json request = {{"ID", std::to_string(lease)}};
  std::optional<std::int64_t> left;
  FLEETFS_RETURN_IF_ERROR(Call(kPath, request.dump(), deadline,
                               [&](const std::string& endpoint, const std::string& body) -> Status {
    const AnswerReader read(endpoint, kPath);
    FLEETFS_ASSIGN_OR_RETURN(const Json json, read.Parse(body));
    FLEETFS_RETURN_IF_ERROR(read.HeaderRevision(json).status());
    FLEETFS_ASSIGN_OR_RETURN(const std::int64_t ttl, read.Ttl(json, "TTL", "TTL"));
    left = ttl < 0 ? std::nullopt : std::optional<std::int64_t>(ttl);
    return Status::Ok();
  }));
  return left;
}

}  // namespace fleetfs::lease
