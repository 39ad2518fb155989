// The pure parts of the s3:// destination: how a URL names a bucket and a
// prefix, where requests go (endpoint, region, path or virtual-host style),
// where credentials come from, how keys and queries are written for AWS's
// SigV4 (libcurl 7.88 signs the path and query exactly as given, so they must
// already be canonical), and what S3's XML answers say.
//
// Every answer is untrusted input: an XML body above kMaxXmlBytes, one that
// does not parse, or one without the elements its request promises is an
// error naming what was asked, never a crash.
//
// Credentials: a secret key is never put in a Status message or a log line;
// errors name the variable, file and profile instead.
//
// Thread-safety: free functions over values.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fleet/replica/destination.h"
#include "fleet/status.h"

namespace fleetfs::replica::s3 {

inline constexpr std::string_view kS3Scheme = "s3://";

// An XML answer larger than this is not one of S3's (a full listing page of
// 1000 keys of 1 KiB is ~1.2 MiB) and is refused.
inline constexpr std::size_t kMaxXmlBytes = 16u << 20;

// AWS's URI encoding (SigV4): A-Z a-z 0-9 - . _ ~ kept, every other byte
// %XX with upper-case hex; '/' kept when `keep_slash` (object keys in paths).
std::string UriEncode(std::string_view s, bool keep_slash);

// A key as it goes in a request path: UriEncode keeping '/'.
inline std::string EncodeKey(std::string_view key) { return UriEncode(key, true); }

// The canonical query string: parameters sorted by name (then value),
// names and values URI-encoded, `name=` for an empty value, joined by '&'.
std::string CanonicalQuery(std::vector<std::pair<std::string, std::string>> params);

// s3://BUCKET[/PREFIX]: the prefix without its leading and trailing '/'.
struct S3Location {
  std::string bucket;
  std::string prefix;  // "" = the bucket's top
};

// InvalidArgument naming the URL and the broken rule: bucket names are 3-63
// of a-z 0-9 . -, beginning and ending with a letter or digit, not shaped
// like an IP address; prefix parts are not empty, "." or "..".
Result<S3Location> ParseS3Url(std::string_view url);

// The environment, injectable: nullopt for an unset variable.
using Getenv = std::function<std::optional<std::string>(const char* name)>;
// The process's environment.
Getenv ProcessEnv();

// Where requests go.
struct S3Endpoint {
  std::string scheme;     // "https" or "http"
  std::string authority;  // host[:port] of the endpoint, without the bucket
  std::string region;
  bool path_style = false;  // https://HOST/BUCKET/KEY, else https://BUCKET.HOST/KEY
  bool custom = false;      // not AWS's own endpoint for the region

  // "https://s3.eu-west-1.amazonaws.com" (for messages).
  std::string Name() const { return scheme + "://" + authority; }
  // The URL of `path_and_query` in `bucket`: "/" + encoded key [+ "?" +
  // canonical query] for an object, "?" + canonical query for the bucket.
  std::string Url(std::string_view bucket, std::string_view path_and_query) const;
};

// Settings first, then AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL and AWS_REGION
// / AWS_DEFAULT_REGION, else us-east-1 and AWS's endpoint for the region
// (virtual-host style). Path style is on by default for a custom endpoint
// and for a bucket name with dots (which breaks AWS's TLS certificates).
// InvalidArgument naming the setting for an endpoint that is not
// http(s)://HOST[:PORT] or a region that is not a-z 0-9 -.
Result<S3Endpoint> ResolveS3Endpoint(const S3Settings& settings, std::string_view bucket,
                                     const Getenv& env);

struct S3Credentials {
  std::string access_key;
  std::string secret_key;
  std::string session_token;  // "" = none
  // Where they came from, for messages: "the environment (AWS_ACCESS_KEY_ID)"
  // or "/root/.aws/credentials, profile default".
  std::string source;
};

// AWS_ACCESS_KEY_ID + AWS_SECRET_ACCESS_KEY (+ AWS_SESSION_TOKEN), else the
// file at AWS_SHARED_CREDENTIALS_FILE or ~/.aws/credentials, section
// AWS_PROFILE or "default". FailedPrecondition naming the variables, file
// and profile when none are found or they are incomplete.
Result<S3Credentials> LoadS3Credentials(const Getenv& env);

// The [profile] of a credentials file's text (INI: [section], key = value,
// '#' and ';' comments). NotFound when the profile is absent;
// FailedPrecondition when it lacks a key. Messages name `file` and
// `profile`, never a value.
Result<S3Credentials> ParseCredentialsFile(std::string_view text, std::string_view file,
                                           std::string_view profile);

// Lower-case hex SHA-256.
std::string Sha256Hex(std::string_view bytes);
// Of `length` bytes of `fd` from `offset` (pread; the fd's offset is not used).
Result<std::string> Sha256HexOfFile(int fd, std::uint64_t offset, std::uint64_t length);
// SHA-256 of the empty string: the hash of every request without a body.
inline constexpr std::string_view kEmptySha256 =
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

// One page of ListObjectsV2.
struct ListPage {
  std::vector<std::string> keys;      // Contents/Key
  std::vector<std::string> prefixes;  // CommonPrefixes/Prefix
  bool truncated = false;
  std::string next_token;  // NextContinuationToken, when truncated
};
// DataLoss naming what is wrong: not XML, not a ListBucketResult, a truncated
// page without a continuation token.
Result<ListPage> ParseListPage(std::string_view xml);

// S3's <Error> document.
struct S3ErrorBody {
  std::string code;
  std::string message;
  std::string region;    // the bucket's region, in redirects and region errors
  std::string endpoint;  // the endpoint to use, in PermanentRedirect
  std::string bucket;
};
// nullopt when `xml` is not an <Error> document (also for any malformed text).
std::optional<S3ErrorBody> ParseErrorBody(std::string_view xml);

// InitiateMultipartUploadResult/UploadId; DataLoss when absent or malformed.
Result<std::string> ParseUploadId(std::string_view xml);

// A 200 answer of CompleteMultipartUpload: OK for a
// CompleteMultipartUploadResult; an <Error> body (S3 sends errors inside a
// 200 after it has started answering) comes back as that error's code in
// `error`; DataLoss for anything else.
Result<std::optional<S3ErrorBody>> ParseCompleteResult(std::string_view xml);

// One page of ListMultipartUploads: uploads begun and neither completed nor
// aborted.
struct MultipartUpload {
  std::string key;
  std::string upload_id;
  std::optional<std::int64_t> initiated_s;  // Unix seconds; unset when unreadable
};
struct UploadsPage {
  std::vector<MultipartUpload> uploads;
  bool truncated = false;
  std::string next_key_marker;
  std::string next_upload_id_marker;
};
// DataLoss for anything but a ListMultipartUploadsResult, or a truncated page
// without its markers.
Result<UploadsPage> ParseUploadsPage(std::string_view xml);

// "2026-12-02T13:24:37.000Z" (S3's times, UTC) in Unix seconds.
std::optional<std::int64_t> ParseIsoTime(std::string_view text);

// The CompleteMultipartUpload request body for parts 1..N with their ETags.
std::string CompleteMultipartBody(const std::vector<std::string>& etags);

// Text safe to quote in a message: printable ASCII, others as '?', at most
// `max` bytes.
std::string Printable(std::string_view s, std::size_t max = 200);

}  // namespace fleetfs::replica::s3
