#include "fleet/replica/s3_destination.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <random>
#include <set>

#include "fleet/unique_fd.h"

namespace fleetfs::replica::s3 {
namespace {

// Where Probe writes; a ".tmp-" name, so List hides it and no object path
// can take it (ValidateObjectPath).
constexpr std::string_view kProbeDir = ".tmp-probe";

// How many times one Get resumes a body that broke off.
constexpr int kGetResumes = 5;

// A listing longer than this many pages (of up to 1000 names) is a store
// that never ends it.
constexpr int kMaxListPages = 100'000;

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
  // snapshot survives a reset. A resumed answer must continue the same
  // object at that byte (a 206 whose Content-Range starts there, the same
  // ETag): a store that ignores Range or If-Match would otherwise splice
  // two objects, or the start of one twice. Each resume is a call of its
  // own (a large snapshot on a slow link needs more than one call's time).
  Status Get(std::string_view path, const Sink& sink) override {
    std::uint64_t delivered = 0;
    std::string etag;
    std::optional<std::uint64_t> total;  // the object's size, from the first answer
    S3Response head;
    bool checked = false;  // this attempt's head was checked
    Status sink_error;
    for (int resumes = 0;; ++resumes) {
      const bool resuming = delivered > 0;
      if (resuming && total && delivered == *total) return Status::Ok();  // broke after the end
      checked = !resuming;
      const BodySink counted = [&](std::string_view piece) {
        if (!checked) {
          checked = true;
          const std::string from = "bytes " + std::to_string(delivered) + "-";
          std::string range = head.content_range;
          for (char& c : range) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
          if (head.status != 206 || !range.starts_with(from) ||
              (!head.etag.empty() && head.etag != etag)) {
            sink_error = Unavailable(
                Where("GET", path) + ": resuming at byte " + std::to_string(delivered) +
                " got HTTP " + std::to_string(head.status) + " '" +
                Printable(head.content_range, 80) + "' " + Printable(head.etag, 80) +
                ", not the rest of the object it began (" + Printable(etag, 80) +
                "); read it again");
            return sink_error;
          }
        }
        Status st = sink(piece);
        if (!st.ok()) {
          sink_error = st;
          return st;
        }
        delivered += piece.size();
        return Status::Ok();
      };
      S3Request r = ObjectRequest("GET", path);
      if (resuming) {
        r.headers.emplace_back("Range", "bytes=" + std::to_string(delivered) + "-");
        r.headers.emplace_back("If-Match", etag);
      }
      r.on_head = [&, resuming](const S3Response& h) {
        head = h;
        if (!resuming) {
          etag = h.etag;
          total = h.content_length;
        }
      };
      auto got = client_->Call(std::move(r), &counted);
      if (!sink_error.ok()) return sink_error;
      if (got.ok()) {
        if (got->status == 200 && !resuming) return Status::Ok();
        if (got->status == 206 && resuming) return Status::Ok();
        if (got->status == 412 && resuming) {
          return Unavailable(Where("GET", path) + ": the object changed while it was read (its " +
                             "ETag is no longer " + Printable(etag, 80) + "); read it again");
        }
        if (resuming) {
          // A 416 here: the object is shorter than its first answer said.
          return Unavailable(Where("GET", path) + ": resuming at byte " +
                             std::to_string(delivered) + " got HTTP " +
                             std::to_string(got->status) + "; read it again");
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
    // A store that ignores Range sends the whole object: keep the first n
    // and end the transfer there, not at the end of a snapshot.
    // (Only then: ending a transfer closes its connection, and a store that
    // honours Range sends no more than n.)
    // A store that sends more than the range asked for ends there too.
    bool enough = false;
    long status = 0;
    std::uint64_t received = 0;
    r.on_head = [&](const S3Response& h) { status = h.status; };
    BodySink keep = [&](std::string_view piece) {
      received += piece.size();
      std::size_t take = std::min(piece.size(), n - out.size());
      out.append(piece.substr(0, take));
      if (out.size() < n || (status != 200 && received <= n)) return Status::Ok();
      enough = true;
      return Status(Code::kInternal, "enough");  // ends the transfer
    };
    auto got = client_->Call(std::move(r), &keep);
    if (enough) return out;
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

  Status RemoveObject(std::string_view path) override { return Delete(Key(path)); }

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
    std::set<std::pair<std::string, std::string>> seen_markers;
    for (int pages = 0;; ++pages) {
      if (pages >= kMaxListPages) {
        return DataLoss(client_->where() + ": " + what + " did not end after " +
                        std::to_string(kMaxListPages) + " pages");
      }
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
        // Only uploads of names this destination writes: with no prefix the
        // listing is the whole bucket, other applications' uploads included.
        if (!IsOurUpload(std::string_view(up.key).substr(prefix.size()))) continue;
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
      if (!seen_markers.emplace(page->next_key_marker, page->next_upload_id_marker).second) {
        return DataLoss(client_->where() + ": " + what +
                        " gave markers it gave before; it would never end");
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
    if (!first.ok()) {
      (void)Delete(Key(path));  // it may have landed
      return first.status().WithContext(client_->where() + ": " + what);
    }
    // A 412 after a retry: the first attempt may have landed and its answer
    // been lost; the object must be there (a store refusing every
    // conditional PUT would refuse every create).
    if (first->status / 100 != 2 &&
        !(first->status == 412 && first->attempts > 1 && Size(path).ok())) {
      (void)Delete(Key(path));
      return client_->ErrorOf(*first, what);
    }
    auto second = create();
    Status removed = Delete(Key(path));
    if (!second.ok()) return second.status().WithContext(client_->where() + ": " + what);
    if (second->status / 100 == 2) {
      return Status(Code::kFailedPrecondition,
                    client_->where() +
                        " does not honour conditional writes (If-None-Match: *): a second create "
                        "of one object was accepted; fleetfs needs them to fence an old owner's "
                        "uploads");
    }
    if (second->status != 412) return client_->ErrorOf(*second, what + " (the second)");
    FLEETFS_RETURN_IF_ERROR(removed);
    return ProbeMultipart();
  }

 private:
  // Large snapshots are created by multipart upload, whose completion must
  // be refused just as a PUT's is: a store that checks If-None-Match only on
  // PutObject would let a fenced owner's late snapshot replace a new
  // owner's marker.
  Status ProbeMultipart() {
    char name[48];
    std::snprintf(name, sizeof name, "%016" PRIx64 "-multipart", client_->Random());
    const std::string path = std::string(kProbeDir) + "/" + name;
    UniqueFd fd(::memfd_create("fleetfs-s3-probe", MFD_CLOEXEC));
    if (!fd.valid()) return ErrnoStatus("memfd_create for the S3 probe", errno);
    constexpr std::string_view kBody = "fleetfs conditional multipart probe";
    if (::write(fd.get(), kBody.data(), kBody.size()) != static_cast<ssize_t>(kBody.size())) {
      return ErrnoStatus("writing the S3 probe", errno);
    }
    const std::string what = "the probe's conditional multipart create of " + Key(path);
    Status first = Multipart(path, fd.get(), kBody.size(), /*conditional=*/true);
    if (first.code() == Code::kAlreadyExists) {
      // The name is new: a 412 is only right when an earlier attempt of this
      // very completion landed. A store that refuses every conditional
      // completion would refuse every large snapshot.
      if (Size(path).ok()) {
        first = Status::Ok();
      } else {
        first = Status(Code::kFailedPrecondition,
                       client_->where() +
                           " refused the conditional completion of a multipart upload of a new "
                           "name (412 for an object that is not there); fleetfs creates large "
                           "snapshots that way");
      }
    }
    if (!first.ok()) {
      (void)Delete(Key(path));  // it may have landed
      return first.WithContext(what);
    }
    Status second = Multipart(path, fd.get(), kBody.size(), /*conditional=*/true);
    Status removed = Delete(Key(path));
    if (second.ok()) {
      return Status(Code::kFailedPrecondition,
                    client_->where() +
                        " does not honour conditional writes on multipart uploads "
                        "(CompleteMultipartUpload with If-None-Match: *): a second create of one "
                        "object was accepted; fleetfs needs them to fence an old owner's large "
                        "snapshots");
    }
    if (second.code() != Code::kAlreadyExists) return second.WithContext(what + " (the second)");
    return removed;
  }

  // Whether an upload's key (relative to the prefix) is one this destination
  // begins: a log object (a 20-digit sequence name) or its own probe.
  static bool IsOurUpload(std::string_view rest) {
    if (rest.starts_with(std::string(kProbeDir) + "/")) return true;
    const std::size_t slash = rest.rfind('/');
    const std::string_view base = slash == std::string_view::npos ? rest : rest.substr(slash + 1);
    return base.size() == 20 &&
           std::all_of(base.begin(), base.end(), [](char c) { return c >= '0' && c <= '9'; });
  }

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
      if (got->status / 100 != 2) {
        return client_->ErrorOf(*got, "PUT part " + number + " of " + key);
      }
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
    std::set<std::string> seen_tokens;
    std::string last;  // the greatest key or common prefix listed so far
    for (int pages = 0;; ++pages) {
      if (pages >= kMaxListPages) {
        return DataLoss(client_->where() + ": listing " + prefix + " did not end after " +
                        std::to_string(kMaxListPages) + " pages");
      }
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
      // S3 lists in key order, each page after the last: a page that does
      // not move past what came before (a store that ignores the token) would
      // list forever.
      if (pages > 0 && (!page->keys.empty() || !page->prefixes.empty())) {
        std::string lo;
        std::string hi;
        bool first_entry = true;
        for (const auto* v : {&page->keys, &page->prefixes}) {
          for (const std::string& k : *v) {
            if (first_entry || k < lo) lo = k;
            if (first_entry || k > hi) hi = k;
            first_entry = false;
          }
        }
        if (lo < last || hi <= last) {
          return DataLoss(client_->where() + ": " + what + " went back to '" +
                          Printable(lo, 120) + "' after '" + Printable(last, 120) +
                          "'; it would never end");
        }
      }
      for (const auto* v : {&page->keys, &page->prefixes}) {
        for (const std::string& k : *v) last = std::max(last, k);
      }
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
      if (!seen_tokens.insert(page->next_token).second) {
        return DataLoss(client_->where() + ": " + what +
                        " gave a continuation token it gave before; it would never end");
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
