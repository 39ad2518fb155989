// The s3:// destination: replica objects in an S3-compatible bucket under a
// prefix, through S3Client (signing, retries, error lines).
//
// How the Destination calls map to S3:
// - List/ListFrom: ListObjectsV2 with prefix PREFIX/DIR/, delimiter '/',
//   start-after, paged by continuation token; objects and common prefixes
//   alike become names. Keys outside the prefix asked for are ignored (an
//   answer is untrusted), and so are the destination's own names (".tmp-").
// - Put/PutFile: a plain PUT; Create/CreateFromFile: PUT with
//   If-None-Match: *, where 412 means the name is taken (kAlreadyExists).
//   A file above the multipart threshold goes by multipart upload, its
//   completion conditional too; a failed upload is aborted.
// - Get streams a GET; GetHead is a ranged GET; Size is a HEAD.
// - Remove deletes the object and every object under PATH/.
// - CleanTemps aborts multipart uploads under the prefix older than its
//   max_age (a crashed writer's), where the store lists them.
// - Probe proves conditional writes: it creates one probe object twice under
//   PREFIX/.tmp-probe/; the second create must be refused, else the
//   destination cannot fence an old owner's uploads and is refused.
//
// Opening reads the credentials and resolves the endpoint; it sends nothing.
//
// Thread-safety: safe from any thread (S3Client is).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "fleet/clock.h"
#include "fleet/replica/destination.h"
#include "fleet/replica/s3_client.h"
#include "fleet/replica/s3_protocol.h"

namespace fleetfs::replica::s3 {

// Everything here but `settings` is for tests; the defaults are the agent's.
struct S3DestinationOptions {
  // A file larger than this goes by multipart upload, in parts of part_size
  // (S3 wants at least 5 MiB but for the last, and at most 10000 parts: a
  // larger file gets larger parts).
  std::uint64_t multipart_threshold = 64u << 20;
  std::uint64_t part_size = 16u << 20;
  // ListObjectsV2's max-keys (S3's own limit is 1000).
  int max_keys = 1000;
  RetryPolicy retry;
  CurlTimeouts timeouts;
  // null: the process's environment.
  Getenv env;
  // null: libcurl. Called once at open with where the requests go.
  std::function<std::unique_ptr<S3Transport>(const S3Endpoint&, const std::string& bucket,
                                             const S3Credentials&)>
      make_transport;
  // null: the system's monotonic clock (and it must outlive the destination).
  const MonotonicClock* clock = nullptr;
  S3Client::Sleep sleep;  // null: really sleep
  std::optional<std::uint64_t> seed;  // unset: random
};

// Opens s3://BUCKET[/PREFIX]. InvalidArgument for a bad URL or setting;
// FailedPrecondition when no credentials are found.
Result<std::shared_ptr<Destination>> OpenS3Destination(std::string_view url,
                                                       const S3Settings& settings,
                                                       S3DestinationOptions options = {});

}  // namespace fleetfs::replica::s3
