#include "fleet/replica/s3_destination.h"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <random>

namespace fleetfs::replica::s3 {
namespace {

// Where Probe writes; a ".tmp-" name, so List hides it and no object path
// can take it (ValidateObjectPath).
constexpr std::string_view kProbeDir = ".tmp-probe";

// How many times one Get resumes a body that broke off.
constexpr int kGetResumes = 5;

// S3 counts parts 1..10000.
constexpr std::uint64_t kMaxParts = 10000;

// A CompleteMultipartUpload that answers 200 with an error inside is tried
// again this many times in all.
constexpr int kCompleteAttempts = 3;

class S3Destination final : public Destination {
 public:
  S3Destination(std::unique_ptr<S3Client> client, std::unique_ptr<MonotonicClock> owned_clock,
                const S3DestinationOptions& options)
      : owned_clock_(std::move(owned_clock)),
        client_(std::move(client)),
        threshold_(options.multipart_threshold),
        part_size_(std::max<std::uint64_t>(1, options.part_size)),
        max_keys_(std::clamp(options.max_keys, 1, 1000)) {}

  const std::string& url() const override { return client_->url(); }

  Result<std::vector<std::string>> List(std::string_view dir) override {
    return Names(dir, "");
  }

  Result<std::vector<std::string>> ListFrom(std::string_view dir, std::string_view after) override {
    FLEETFS_ASSIGN_OR_RETURN(std::vector<std::string> names, Names(dir, after));
    // A common prefix "after/" sorts after the start key "after" itself.
    std::erase_if(names, [&](const std::string& n) { return n <= after; });
    std::sort(names.begin(), names.end());
    names.erase(std::unique(names.begin(), names.end()), names.end());
    return names;
  }

  Status Put(std::string_view path, std::string_view bytes) override {
    S3Request r = ObjectRequest("PUT", path);
    r.body = bytes;
    return Write(path, std::move(r), /*conditional=*/false);
  }

  Status PutFile(std::string_view path, int fd) override {
    return WriteFile(path, fd, /*conditional=*/false);
  }

  Status Create(std::string_view path, std::string_view bytes) override {
    FLEETFS_RETURN_IF_ERROR(ValidateObjectPath(path));
    S3Request r = ObjectRequest("PUT", path);
    r.body = bytes;
    return Write(path, std::move(r), /*conditional=*/true);
  }

  Status CreateFromFile(std::string_view path, int fd) override {
    FLEETFS_RETURN_IF_ERROR(ValidateObjectPath(path));
    return WriteFile(path, fd, /*conditional=*/true);
  }

  // A body that breaks off is resumed where it broke (Range from the bytes
  // the sink took, If-Match the ETag the first answer gave), so a large
  // snapshot survives a reset; an object replaced meanwhile is not spliced.
  Status Get(std::string_view path, const Sink& sink) override {
    std::uint64_t delivered = 0;
    std::string etag;
    Status sink_error;
    const BodySink counted = [&](std::string_view piece) {
      Status st = sink(piece);
      if (!st.ok()) {
        sink_error = st;
        return st;
      }
      delivered += piece.size();
      return Status::Ok();
    };
    for (int resumes = 0;; ++resumes) {
      S3Request r = ObjectRequest("GET", path);
      const bool resuming = delivered > 0;
      if (resuming) {
        r.headers.emplace_back("Range", "bytes=" + std::to_string(delivered) + "-");
        r.headers.emplace_back("If-Match", etag);
      } else {
        r.on_head = [&](const S3Response& head) { etag = head.etag; };
      }
      auto got = client_->Call(std::move(r), &counted);
      if (!sink_error.ok()) return sink_error;
      if (got.ok()) {
        if (got->status == 200 && !resuming) return Status::Ok();
        if (got->status == 206 && resuming) return Status::Ok();
        // The break fell after the last byte: nothing is left to read.
        if (got->status == 416 && resuming) return Status::Ok();
        if (got->status == 412 && resuming) {
          return Unavailable(Where("GET", path) + ": the object changed while it was read (its " +
                             "ETag is no longer " + Printable(etag, 80) + "); read it again");
        }
        return client_->ErrorOf(*got, "GET " + Key(path));
      }
      if (delivered == 0 || etag.empty() || resumes >= kGetResumes) {
        return got.status().WithContext(Where("GET", path));
      }
    }
  }

  Result<std::string> GetHead(std::string_view path, std::size_t n) override {
    if (n == 0) {
      FLEETFS_RETURN_IF_ERROR(Size(path).status());
      return std::string();
    }
    S3Request r = ObjectRequest("GET", path);
    r.headers.emplace_back("Range", "bytes=0-" + std::to_string(n - 1));
    std::string out;
    // A store that ignores Range sends the whole object: keep the first n.
    BodySink keep = [&](std::string_view piece) {
      std::size_t take = std::min(piece.size(), n - out.size());
      out.append(piece.substr(0, take));
      return Status::Ok();
    };
    auto got = client_->Call(std::move(r), &keep);
    if (!got.ok()) return got.status().WithContext(Where("GET", path));
    if (got->status == 200 || got->status == 206) return out;
    // An empty object has no byte 0: S3 says the range is unsatisfiable.
    if (got->status == 416) return std::string();
    return client_->ErrorOf(*got, "GET " + Key(path));
  }

  Result<std::uint64_t> Size(std::string_view path) override {
    auto got = client_->Call(ObjectRequest("HEAD", path));
    if (!got.ok()) return got.status().WithContext(Where("HEAD", path));
    if (got->status != 200) return client_->ErrorOf(*got, "HEAD " + Key(path));
    if (!got->content_length) {
      return DataLoss(client_->where() + ": HEAD " + Key(path) + " answered without a Content-Length");
    }
    return *got->content_length;
  }

  Status Remove(std::string_view path) override {
    if (!path.empty()) FLEETFS_RETURN_IF_ERROR(Delete(Key(path)));
    std::vector<std::string> keys;
    FLEETFS_RETURN_IF_ERROR(ListKeys(DirPrefix(path), "", /*delimiter=*/false, nullptr, &keys));
    for (const std::string& key : keys) FLEETFS_RETURN_IF_ERROR(Delete(key));
    return Status::Ok();
  }

  // Aborts the multipart uploads under the prefix begun more than `max_age`
  // ago (a writer that crashed mid-upload leaves one, billed until aborted).
  // A store without ListMultipartUploads (NotImplemented) has none to clean.
  Result<int> CleanTemps(std::chrono::seconds max_age) override {
    const std::int64_t cutoff =
        std::chrono::duration_cast<std::chrono::seconds>(
            (std::chrono::system_clock::now() - max_age).time_since_epoch())
            .count();
    const std::string prefix = DirPrefix("");
    const std::string what = "listing the unfinished uploads under " +
                             (prefix.empty() ? std::string("the bucket") : prefix);
    int aborted = 0;
    std::string key_marker;
    std::string id_marker;
    while (true) {
      std::vector<std::pair<std::string, std::string>> params = {{"uploads", ""},
                                                                 {"prefix", prefix}};
      if (!key_marker.empty()) {
        params.emplace_back("key-marker", key_marker);
        params.emplace_back("upload-id-marker", id_marker);
      }
      S3Request r;
      r.method = "GET";
      r.path_and_query = "?" + CanonicalQuery(std::move(params));
      auto got = client_->Call(std::move(r));
      if (!got.ok()) return got.status().WithContext(client_->where() + ": " + what);
      if (got->status == 501) return aborted;
      if (got->status != 200) return client_->ErrorOf(*got, what);
      auto page = ParseUploadsPage(got->body);
      if (!page.ok()) return page.status().WithContext(client_->where() + ": " + what);
      for (const MultipartUpload& up : page->uploads) {
        if (!std::string_view(up.key).starts_with(prefix)) continue;
        if (!up.initiated_s || *up.initiated_s >= cutoff) continue;  // perhaps a live writer's
        S3Request abort;
        abort.method = "DELETE";
        abort.path_and_query = "/" + EncodeKey(up.key) + "?" + CanonicalQuery({{"uploadId", up.upload_id}});
        auto done = client_->Call(std::move(abort));
        if (!done.ok()) return done.status().WithContext(client_->where() + ": aborting an upload of " + up.key);
        if (done->status == 204 || done->status == 200 || done->status == 404) {
          if (done->status != 404) ++aborted;
          continue;
        }
        return client_->ErrorOf(*done, "aborting an upload of " + up.key);
      }
      if (!page->truncated) return aborted;
      if (page->next_key_marker == key_marker && page->next_upload_id_marker == id_marker) {
        return DataLoss(client_->where() + ": " + what + " gave the same markers twice");
      }
      key_marker = page->next_key_marker;
      id_marker = page->next_upload_id_marker;
    }
  }

  Status Probe() override {
    char name[32];
    std::snprintf(name, sizeof name, "%016" PRIx64, client_->Random());
    const std::string path = std::string(kProbeDir) + "/" + name;
    const std::string what = "the probe's conditional create (If-None-Match: *) of " + Key(path);
    auto create = [&]() {
      S3Request r = ObjectRequest("PUT", path);
      r.headers.emplace_back("If-None-Match", "*");
      return client_->Call(std::move(r));
    };
    auto first = create();
    if (!first.ok()) return first.status().WithContext(client_->where() + ": " + what);
    // A 412 after a retry: the first attempt landed and its answer was lost.
    if (first->status != 200 && !(first->status == 412 && first->attempts > 1)) {
      return client_->ErrorOf(*first, what);
    }
    auto second = create();
    Status removed = Delete(Key(path));
    if (!second.ok()) return second.status().WithContext(client_->where() + ": " + what);
    if (second->status == 200) {
      return Status(Code::kFailedPrecondition,
                    client_->where() +
                        " does not honour conditional writes (If-None-Match: *): a second create "
                        "of one object was accepted; fleetfs needs them to fence an old owner's "
                        "uploads");
    }
    if (second->status != 412) return client_->ErrorOf(*second, what + " (the second)");
    return removed;
  }

 private:
  std::string Key(std::string_view path) const {
    const std::string& prefix = client_->location().prefix;
    if (prefix.empty()) return std::string(path);
    if (path.empty()) return prefix;
    return prefix + "/" + std::string(path);
  }

  // The key prefix of everything under `dir`: "PREFIX/DIR/", "PREFIX/", or
  // "" for the whole bucket.
  std::string DirPrefix(std::string_view dir) const {
    std::string k = Key(dir);
    if (!k.empty()) k += '/';
    return k;
  }

  std::string Where(std::string_view method, std::string_view path) const {
    return client_->where() + ": " + std::string(method) + " " + Key(path);
  }

  S3Request ObjectRequest(std::string method, std::string_view path) const {
    S3Request r;
    r.method = std::move(method);
    r.path_and_query = "/" + EncodeKey(Key(path));
    return r;
  }

  Status AlreadyExists(std::string_view path) const {
    return Status(Code::kAlreadyExists,
                  client_->where() + ": " + Key(path) +
                      " already exists: a create never replaces an object (read it to learn "
                      "who wrote it)");
  }

  // One PUT; a conditional one carries If-None-Match: * and its 412 is the
  // taken name. A retry whose earlier attempt landed unseen gets that 412
  // too: the caller reads the object, as Create's contract says.
  Status Write(std::string_view path, S3Request r, bool conditional) {
    if (conditional) r.headers.emplace_back("If-None-Match", "*");
    auto got = client_->Call(std::move(r));
    if (!got.ok()) return got.status().WithContext(Where("PUT", path));
    // 2xx: some S3-compatible stores answer a PUT with 201 or 204.
    if (got->status / 100 == 2) return Status::Ok();
    if (conditional && got->status == 412) return AlreadyExists(path);
    return client_->ErrorOf(*got, "PUT " + Key(path));
  }

  Status WriteFile(std::string_view path, int fd, bool conditional) {
    struct stat st;
    if (::fstat(fd, &st) != 0) return ErrnoStatus("stat of the local copy of " + Key(path), errno);
    const auto size = static_cast<std::uint64_t>(st.st_size);
    if (size > threshold_) return Multipart(path, fd, size, conditional);
    S3Request r = ObjectRequest("PUT", path);
    r.body_fd = fd;
    r.body_offset = 0;
    r.body_length = size;
    return Write(path, std::move(r), conditional);
  }

  Status Multipart(std::string_view path, int fd, std::uint64_t size, bool conditional) {
    const std::string key = Key(path);
    const std::string encoded = "/" + EncodeKey(key);
    S3Request init;
    init.method = "POST";
    init.path_and_query = encoded + "?" + CanonicalQuery({{"uploads", ""}});
    auto started = client_->Call(std::move(init));
    if (!started.ok()) return started.status().WithContext(Where("starting an upload of", path));
    if (started->status != 200) return client_->ErrorOf(*started, "starting an upload of " + key);
    auto id = ParseUploadId(started->body);
    if (!id.ok()) return id.status().WithContext(client_->where());
    Status st = UploadParts(path, fd, size, conditional, encoded, *id);
    if (!st.ok()) {
      // Best effort: a stale upload costs storage until the bucket's
      // lifecycle rule (or CleanTemps) ends it.
      S3Request abort;
      abort.method = "DELETE";
      abort.path_and_query = encoded + "?" + CanonicalQuery({{"uploadId", *id}});
      (void)client_->Call(std::move(abort));
    }
    return st;
  }

  Status UploadParts(std::string_view path, int fd, std::uint64_t size, bool conditional,
                     const std::string& encoded, const std::string& upload_id) {
    const std::string key = Key(path);
    const std::uint64_t part = std::max(part_size_, (size + kMaxParts - 1) / kMaxParts);
    std::vector<std::string> etags;
    for (std::uint64_t off = 0; off < size || etags.empty(); off += part) {
      const std::string number = std::to_string(etags.size() + 1);
      S3Request r;
      r.method = "PUT";
      r.path_and_query =
          encoded + "?" + CanonicalQuery({{"partNumber", number}, {"uploadId", upload_id}});
      r.body_fd = fd;
      r.body_offset = off;
      r.body_length = std::min(part, size - off);
      auto got = client_->Call(std::move(r));
      if (!got.ok()) return got.status().WithContext(Where("uploading part " + number + " of", path));
      if (got->status != 200) return client_->ErrorOf(*got, "PUT part " + number + " of " + key);
      if (got->etag.empty()) {
        return DataLoss(client_->where() + ": part " + number + " of " + key +
                        " was taken without an ETag");
      }
      etags.push_back(got->etag);
      if (size == 0) break;
    }
    const std::string body = CompleteMultipartBody(etags);
    for (int attempt = 1;; ++attempt) {
      S3Request r;
      r.method = "POST";
      r.path_and_query = encoded + "?" + CanonicalQuery({{"uploadId", upload_id}});
      r.body = body;
      if (conditional) r.headers.emplace_back("If-None-Match", "*");
      auto got = client_->Call(std::move(r));
      const std::string what = "completing the upload of " + key;
      if (!got.ok()) return got.status().WithContext(client_->where() + ": " + what);
      if (conditional && got->status == 412) return AlreadyExists(path);
      if (got->status != 200) {
        auto e = ParseErrorBody(got->body);
        if (e && e->code == "NoSuchUpload" && got->attempts > 1) {
          // An earlier attempt completed it and its answer was lost.
          return Unavailable(client_->where() + ": " + what +
                             ": the upload is gone after a retry; its completion may have landed");
        }
        return client_->ErrorOf(*got, what);
      }
      // S3 may send an error inside a 200 once it has begun answering.
      auto result = ParseCompleteResult(got->body);
      if (!result.ok()) return result.status().WithContext(client_->where() + ": " + what);
      if (!result->has_value()) return Status::Ok();
      const S3ErrorBody& e = **result;
      if (conditional && e.code == "PreconditionFailed") return AlreadyExists(path);
      if (attempt < kCompleteAttempts &&
          (e.code == "InternalError" || e.code == "SlowDown" || e.code == "ServiceUnavailable")) {
        continue;
      }
      S3Response as_error = *got;
      as_error.status = (e.code == "InternalError" || e.code == "SlowDown" ||
                         e.code == "ServiceUnavailable")
                            ? 503
                            : 400;
      return client_->ErrorOf(as_error, what + " (an error inside its 200 answer)");
    }
  }

  Status Delete(const std::string& key) {
    S3Request r;
    r.method = "DELETE";
    r.path_and_query = "/" + EncodeKey(key);
    auto got = client_->Call(std::move(r));
    if (!got.ok()) return got.status().WithContext(client_->where() + ": DELETE " + key);
    if (got->status == 204 || got->status == 200) return Status::Ok();
    if (got->status == 404) {
      auto e = ParseErrorBody(got->body);
      if (!e || e->code == "NoSuchKey") return Status::Ok();  // already gone
    }
    return client_->ErrorOf(*got, "DELETE " + key);
  }

  // The names directly under `dir` (delimited listing), from after `after`.
  Result<std::vector<std::string>> Names(std::string_view dir, std::string_view after) {
    std::vector<std::string> names;
    FLEETFS_RETURN_IF_ERROR(ListKeys(DirPrefix(dir), after, /*delimiter=*/true, &names, nullptr));
    return names;
  }

  // Lists the keys under `prefix` (after prefix + `after` when it is not
  // empty). With `delimiter`, the names relative to `prefix` go to `names`,
  // sub-directories included; without, every full key goes to `keys`.
  Status ListKeys(const std::string& prefix, std::string_view after, bool delimiter,
                  std::vector<std::string>* names, std::vector<std::string>* keys) {
    std::string token;
    for (int pages = 0;; ++pages) {
      std::vector<std::pair<std::string, std::string>> params = {
          {"list-type", "2"}, {"max-keys", std::to_string(max_keys_)}, {"prefix", prefix}};
      if (delimiter) params.emplace_back("delimiter", "/");
      if (!token.empty()) {
        params.emplace_back("continuation-token", token);
      } else if (!after.empty()) {
        params.emplace_back("start-after", prefix + std::string(after));
      }
      S3Request r;
      r.method = "GET";
      r.path_and_query = "?" + CanonicalQuery(std::move(params));
      const std::string what = "listing " + (prefix.empty() ? std::string("the bucket") : prefix);
      auto got = client_->Call(std::move(r));
      if (!got.ok()) return got.status().WithContext(client_->where() + ": " + what);
      if (got->status != 200) return client_->ErrorOf(*got, what);
      auto page = ParseListPage(got->body);
      if (!page.ok()) return page.status().WithContext(client_->where() + ": " + what);
      auto relative = [&](const std::string& key) -> std::optional<std::string_view> {
        // Untrusted: a key outside what was asked for is not ours to name.
        if (!std::string_view(key).starts_with(prefix)) return std::nullopt;
        std::string_view rest = std::string_view(key).substr(prefix.size());
        if (rest.empty()) return std::nullopt;  // a "directory marker" object
        return rest;
      };
      for (const std::string& key : page->keys) {
        auto rest = relative(key);
        if (!rest) continue;
        if (keys != nullptr) keys->push_back(key);
        if (names != nullptr && rest->find('/') == std::string_view::npos &&
            !rest->starts_with(kDestinationTempPrefix)) {
          names->emplace_back(*rest);
        }
      }
      for (const std::string& p : page->prefixes) {
        auto rest = relative(p);
        if (!rest || !rest->ends_with('/')) continue;
        rest->remove_suffix(1);
        if (names != nullptr && !rest->empty() && rest->find('/') == std::string_view::npos &&
            !rest->starts_with(kDestinationTempPrefix)) {
          names->emplace_back(*rest);
        }
      }
      if (!page->truncated) return Status::Ok();
      if (page->next_token == token) {
        return DataLoss(client_->where() + ": " + what +
                        " gave the same continuation token twice; it would never end");
      }
      token = std::move(page->next_token);
    }
  }

  // Declared first: the client reads it until its last call.
  const std::unique_ptr<MonotonicClock> owned_clock_;
  const std::unique_ptr<S3Client> client_;
  const std::uint64_t threshold_;
  const std::uint64_t part_size_;
  const int max_keys_;
};

}  // namespace

Result<std::shared_ptr<Destination>> OpenS3Destination(std::string_view url,
                                                       const S3Settings& settings,
                                                       S3DestinationOptions options) {
  FLEETFS_ASSIGN_OR_RETURN(S3Location location, ParseS3Url(url));
  const Getenv env = options.env ? options.env : ProcessEnv();
  auto endpoint = ResolveS3Endpoint(settings, location.bucket, env);
  if (!endpoint.ok()) return endpoint.status().WithContext("replica " + std::string(url));
  auto credentials = LoadS3Credentials(env);
  if (!credentials.ok()) {
    return credentials.status().WithContext("replica " + std::string(url) + " at " +
                                            endpoint->Name());
  }
  std::unique_ptr<S3Transport> transport =
      options.make_transport
          ? options.make_transport(*endpoint, location.bucket, *credentials)
          : MakeCurlS3Transport(*endpoint, location.bucket, *credentials, options.timeouts);
  std::unique_ptr<MonotonicClock> owned_clock;
  const MonotonicClock* clock = options.clock;
  if (clock == nullptr) {
    owned_clock = std::make_unique<SystemMonotonicClock>();
    clock = owned_clock.get();
  }
  std::uint64_t seed = options.seed ? *options.seed : (std::uint64_t{std::random_device()()} << 32 |
                                                        std::random_device()());
  auto client = std::make_unique<S3Client>(std::string(url), std::move(location),
                                           std::move(*endpoint), credentials->source,
                                           std::move(transport), options.retry, *clock,
                                           options.sleep, seed);
  return std::shared_ptr<Destination>(
      std::make_shared<S3Destination>(std::move(client), std::move(owned_clock), options));
}

}  // namespace fleetfs::replica::s3
