#include "fleet/replica/s3_protocol.h"

#include <openssl/evp.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <pugixml.hpp>
#include <sstream>

namespace fleetfs::replica::s3 {
namespace {

bool Unreserved(unsigned char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '.' || c == '_' || c == '~';
}

bool LowerOrDigit(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); }

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

// "1.2.3.4": AWS refuses bucket names shaped like an IPv4 address.
bool LooksLikeIp(std::string_view s) {
  int parts = 0;
  std::size_t start = 0;
  while (true) {
    std::size_t dot = s.find('.', start);
    std::string_view part = s.substr(start, dot == std::string_view::npos ? dot : dot - start);
    if (part.empty() || part.size() > 3 ||
        !std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      return false;
    }
    ++parts;
    if (dot == std::string_view::npos) break;
    start = dot + 1;
  }
  return parts == 4;
}

// Parses `xml` (at most kMaxXmlBytes) into `doc`; the error says why not.
Status LoadXml(pugi::xml_document& doc, std::string_view xml, std::string_view what) {
  if (xml.size() > kMaxXmlBytes) {
    return DataLoss(std::string(what) + " of " + std::to_string(xml.size()) +
                    " bytes is larger than any S3 answer (" + std::to_string(kMaxXmlBytes >> 20) +
                    " MiB); refused");
  }
  pugi::xml_parse_result r = doc.load_buffer(xml.data(), xml.size(), pugi::parse_default,
                                             pugi::encoding_utf8);
  if (!r) {
    return DataLoss(std::string(what) + " is not XML (" + r.description() + " at byte " +
                    std::to_string(r.offset) + ": '" + Printable(xml.substr(0, 120)) + "')");
  }
  return Status::Ok();
}

}  // namespace

std::string UriEncode(std::string_view s, bool keep_slash) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size() * 3);
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (Unreserved(c) || (keep_slash && c == '/')) {
      out += ch;
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

std::string CanonicalQuery(std::vector<std::pair<std::string, std::string>> params) {
  for (auto& [name, value] : params) {
    name = UriEncode(name, false);
    value = UriEncode(value, false);
  }
  // Sorted by the encoded names, byte order, as SigV4 sorts them.
  std::sort(params.begin(), params.end());
  std::string out;
  for (const auto& [name, value] : params) {
    if (!out.empty()) out += '&';
    out += name;
    out += '=';
    out += value;
  }
  return out;
}

Result<S3Location> ParseS3Url(std::string_view url) {
  auto bad = [&](std::string_view rule) {
    return InvalidArgument("replica '" + Printable(url) + "': " + std::string(rule));
  };
  if (!url.starts_with(kS3Scheme)) return bad("an S3 URL begins s3://");
  std::string_view rest = url.substr(kS3Scheme.size());
  std::size_t slash = rest.find('/');
  std::string_view bucket = rest.substr(0, slash);
  std::string_view prefix = slash == std::string_view::npos ? "" : rest.substr(slash + 1);
  if (bucket.size() < 3 || bucket.size() > 63) {
    return bad("the bucket name '" + Printable(bucket) +
               "' must be 3 to 63 characters, as in s3://my-bucket/fleet");
  }
  for (char c : bucket) {
    if (!LowerOrDigit(c) && c != '.' && c != '-') {
      return bad("the bucket name '" + Printable(bucket) +
                 "' may hold only lower-case letters, digits, '.' and '-'");
    }
  }
  if (!LowerOrDigit(bucket.front()) || !LowerOrDigit(bucket.back())) {
    return bad("the bucket name '" + std::string(bucket) +
               "' must begin and end with a lower-case letter or a digit");
  }
  if (bucket.find("..") != std::string_view::npos) {
    return bad("the bucket name '" + std::string(bucket) + "' must not hold two '.' in a row");
  }
  if (LooksLikeIp(bucket)) {
    return bad("the bucket name '" + std::string(bucket) + "' must not look like an IP address");
  }
  while (!prefix.empty() && prefix.back() == '/') prefix.remove_suffix(1);
  if (!prefix.empty()) {
    std::size_t start = 0;
    while (true) {
      std::size_t next = prefix.find('/', start);
      std::string_view part =
          prefix.substr(start, next == std::string_view::npos ? next : next - start);
      if (part.empty()) return bad("the prefix must not have an empty part ('//')");
      if (part == "." || part == "..") return bad("the prefix must not have a '.' or '..' part");
      if (part.starts_with(kDestinationTempPrefix)) {
        return bad("the prefix must not have a part starting '" +
                   std::string(kDestinationTempPrefix) + "' (the destination's own names)");
      }
      for (char c : part) {
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
          return bad("the prefix must not hold control characters");
        }
      }
      if (next == std::string_view::npos) break;
      start = next + 1;
    }
  }
  return S3Location{std::string(bucket), std::string(prefix)};
}

Getenv ProcessEnv() {
  return [](const char* name) -> std::optional<std::string> {
    const char* v = std::getenv(name);
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

std::string S3Endpoint::Url(std::string_view bucket, std::string_view path_and_query) const {
  // A bucket-level request ("?list-type=2") has no path of its own: path
  // style sends /BUCKET?..., without a slash that some stores (s3rver) leave
  // out of the path they sign.
  const bool bucket_level = path_and_query.empty() || path_and_query.front() == '?';
  if (path_style) {
    return scheme + "://" + authority + "/" + std::string(bucket) + std::string(path_and_query);
  }
  return scheme + "://" + std::string(bucket) + "." + authority + (bucket_level ? "/" : "") +
         std::string(path_and_query);
}

Result<S3Endpoint> ResolveS3Endpoint(const S3Settings& settings, std::string_view bucket,
                                     const Getenv& env) {
  S3Endpoint ep;
  auto nonempty = [&](const char* name) -> std::optional<std::string> {
    auto v = env(name);
    if (v && !v->empty()) return v;
    return std::nullopt;
  };
  std::string region_from = "replica_region";
  ep.region = settings.region;
  if (ep.region.empty()) {
    for (const char* name : {"AWS_REGION", "AWS_DEFAULT_REGION"}) {
      if (auto v = nonempty(name)) {
        ep.region = *v;
        region_from = name;
        break;
      }
    }
  }
  if (ep.region.empty()) ep.region = "us-east-1";
  if (ep.region.size() > 64 || !std::all_of(ep.region.begin(), ep.region.end(),
                                            [](char c) { return LowerOrDigit(c) || c == '-'; })) {
    return InvalidArgument(region_from + " '" + Printable(ep.region, 80) +
                           "' is not an AWS region name (lower-case letters, digits and '-', as "
                           "in eu-west-1)");
  }
  std::string endpoint = settings.endpoint;
  std::string endpoint_from = "replica_endpoint";
  if (endpoint.empty()) {
    for (const char* name : {"AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"}) {
      if (auto v = nonempty(name)) {
        endpoint = *v;
        endpoint_from = name;
        break;
      }
    }
  }
  if (endpoint.empty()) {
    ep.scheme = "https";
    ep.authority = "s3." + ep.region + ".amazonaws.com";
    ep.custom = false;
  } else {
    std::string_view e = endpoint;
    auto bad = [&](std::string_view rule) {
      return InvalidArgument(endpoint_from + " '" + Printable(endpoint, 120) + "': " +
                             std::string(rule));
    };
    if (e.starts_with("https://")) {
      ep.scheme = "https";
      e.remove_prefix(8);
    } else if (e.starts_with("http://")) {
      ep.scheme = "http";
      e.remove_prefix(7);
    } else {
      return bad("must begin http:// or https://, as in https://minio.example:9000");
    }
    while (!e.empty() && e.back() == '/') e.remove_suffix(1);
    if (e.empty()) return bad("names no host");
    for (char c : e) {
      if (!(LowerOrDigit(c) || (c >= 'A' && c <= 'Z') || c == '.' || c == '-' || c == ':' ||
            c == '[' || c == ']')) {
        return bad("must be only scheme://HOST[:PORT], without a path, user or query");
      }
    }
    ep.authority = std::string(e);
    ep.custom = true;
  }
  if (settings.path_style.has_value()) {
    ep.path_style = *settings.path_style;
  } else {
    ep.path_style = ep.custom || bucket.find('.') != std::string_view::npos;
  }
  return ep;
}

Result<S3Credentials> ParseCredentialsFile(std::string_view text, std::string_view file,
                                           std::string_view profile) {
  const std::string where = std::string(file) + ", profile [" + std::string(profile) + "]";
  bool in_section = false;
  bool found = false;
  S3Credentials c;
  std::size_t start = 0;
  while (start <= text.size()) {
    std::size_t nl = text.find('\n', start);
    std::string_view line =
        Trim(text.substr(start, nl == std::string_view::npos ? std::string_view::npos : nl - start));
    start = nl == std::string_view::npos ? text.size() + 1 : nl + 1;
    if (line.empty() || line.front() == '#' || line.front() == ';') continue;
    if (line.front() == '[') {
      if (line.back() != ']') {
        in_section = false;
        continue;
      }
      std::string_view name = Trim(line.substr(1, line.size() - 2));
      // The config file's "[profile x]" spelling is accepted here too.
      if (name.starts_with("profile ")) name = Trim(name.substr(8));
      in_section = name == profile;
      found = found || in_section;
      continue;
    }
    if (!in_section) continue;
    std::size_t eq = line.find('=');
    if (eq == std::string_view::npos) continue;
    std::string_view key = Trim(line.substr(0, eq));
    std::string_view value = Trim(line.substr(eq + 1));
    if (key == "aws_access_key_id") c.access_key = std::string(value);
    else if (key == "aws_secret_access_key") c.secret_key = std::string(value);
    else if (key == "aws_session_token") c.session_token = std::string(value);
  }
  if (!found) return NotFound("no profile [" + std::string(profile) + "] in " + std::string(file));
  if (c.access_key.empty() || c.secret_key.empty()) {
    return Status(Code::kFailedPrecondition,
                  where + " lacks " +
                      (c.access_key.empty() ? "aws_access_key_id" : "aws_secret_access_key") +
                      "; an s3:// replica needs both");
  }
  c.source = where;
  return c;
}

Result<S3Credentials> LoadS3Credentials(const Getenv& env) {
  auto get = [&](const char* name) {
    auto v = env(name);
    return v ? *v : std::string();
  };
  std::string id = get("AWS_ACCESS_KEY_ID");
  std::string secret = get("AWS_SECRET_ACCESS_KEY");
  if (!id.empty() || !secret.empty()) {
    if (id.empty() || secret.empty()) {
      return Status(Code::kFailedPrecondition,
                    std::string("the environment sets ") +
                        (id.empty() ? "AWS_SECRET_ACCESS_KEY but not AWS_ACCESS_KEY_ID"
                                    : "AWS_ACCESS_KEY_ID but not AWS_SECRET_ACCESS_KEY") +
                        "; an s3:// replica needs both");
    }
    return S3Credentials{std::move(id), std::move(secret), get("AWS_SESSION_TOKEN"),
                         "the environment (AWS_ACCESS_KEY_ID)"};
  }
  std::string file = get("AWS_SHARED_CREDENTIALS_FILE");
  if (file.empty()) {
    std::string home = get("HOME");
    if (home.empty()) {
      return Status(Code::kFailedPrecondition,
                    "no S3 credentials: AWS_ACCESS_KEY_ID is not set, and neither "
                    "AWS_SHARED_CREDENTIALS_FILE nor HOME names a credentials file");
    }
    file = home + "/.aws/credentials";
  }
  std::string profile = get("AWS_PROFILE");
  if (profile.empty()) profile = "default";
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    return Status(Code::kFailedPrecondition,
                  "no S3 credentials: AWS_ACCESS_KEY_ID is not set and the credentials file " +
                      file + " cannot be read (" + std::strerror(errno) + ")");
  }
  std::string text;
  constexpr std::size_t kMaxFile = 1 << 20;
  text.resize(kMaxFile + 1);
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<std::size_t>(in.gcount()));
  if (text.size() > kMaxFile) {
    return Status(Code::kFailedPrecondition,
                  "the credentials file " + file + " is larger than 1 MiB; is it one?");
  }
  auto c = ParseCredentialsFile(text, file, profile);
  if (!c.ok() && c.status().code() == Code::kNotFound) {
    return Status(Code::kFailedPrecondition,
                  "no S3 credentials: AWS_ACCESS_KEY_ID is not set and " + c.status().message() +
                      " (AWS_PROFILE chooses the profile)");
  }
  return c;
}

namespace {
struct MdCtxDeleter {
  void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
};
std::string Hex(const unsigned char* d, unsigned n) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned i = 0; i < n; ++i) {
    out += kHex[d[i] >> 4];
    out += kHex[d[i] & 15];
  }
  return out;
}
}  // namespace

std::string Sha256Hex(std::string_view bytes) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned n = 0;
  EVP_Digest(bytes.data(), bytes.size(), md, &n, EVP_sha256(), nullptr);
  return Hex(md, n);
}

Result<std::string> Sha256HexOfFile(int fd, std::uint64_t offset, std::uint64_t length) {
  std::unique_ptr<EVP_MD_CTX, MdCtxDeleter> ctx(EVP_MD_CTX_new());
  if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1) {
    return Internal("OpenSSL could not start a SHA-256");
  }
  std::vector<char> buf(1 << 20);
  std::uint64_t done = 0;
  while (done < length) {
    std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>(buf.size(), length - done));
    ssize_t n = ::pread(fd, buf.data(), want, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus("reading the local copy to hash it", errno);
    }
    if (n == 0) {
      return Status(Code::kIoError, "the local copy shrank while it was read (" +
                                        std::to_string(offset + done) + " of " +
                                        std::to_string(offset + length) + " bytes)");
    }
    EVP_DigestUpdate(ctx.get(), buf.data(), static_cast<std::size_t>(n));
    done += static_cast<std::uint64_t>(n);
  }
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned n = 0;
  EVP_DigestFinal_ex(ctx.get(), md, &n);
  return Hex(md, n);
}

Result<ListPage> ParseListPage(std::string_view xml) {
  pugi::xml_document doc;
  FLEETFS_RETURN_IF_ERROR(LoadXml(doc, xml, "a ListObjectsV2 answer"));
  pugi::xml_node root = doc.child("ListBucketResult");
  if (!root) {
    return DataLoss("a ListObjectsV2 answer is not a ListBucketResult: '" +
                    Printable(xml.substr(0, 120)) + "'");
  }
  ListPage page;
  for (pugi::xml_node c : root.children("Contents")) {
    pugi::xml_node key = c.child("Key");
    if (!key) return DataLoss("a ListObjectsV2 answer has a Contents without a Key");
    page.keys.emplace_back(key.text().get());
  }
  for (pugi::xml_node c : root.children("CommonPrefixes")) {
    pugi::xml_node p = c.child("Prefix");
    if (!p) return DataLoss("a ListObjectsV2 answer has a CommonPrefixes without a Prefix");
    page.prefixes.emplace_back(p.text().get());
  }
  std::string_view truncated = root.child("IsTruncated").text().get();
  page.truncated = truncated == "true";
  if (page.truncated) {
    page.next_token = root.child("NextContinuationToken").text().get();
    if (page.next_token.empty()) {
      return DataLoss(
          "a ListObjectsV2 answer says it is truncated and gives no NextContinuationToken");
    }
  }
  return page;
}

std::optional<S3ErrorBody> ParseErrorBody(std::string_view xml) {
  if (xml.empty() || xml.size() > kMaxXmlBytes) return std::nullopt;
  pugi::xml_document doc;
  if (!LoadXml(doc, xml, "an error answer").ok()) return std::nullopt;
  pugi::xml_node e = doc.child("Error");
  if (!e) return std::nullopt;
  S3ErrorBody b;
  b.code = Printable(e.child("Code").text().get(), 80);
  b.message = Printable(e.child("Message").text().get(), 300);
  b.region = Printable(e.child("Region").text().get(), 80);
  b.endpoint = Printable(e.child("Endpoint").text().get(), 200);
  b.bucket = Printable(e.child("BucketName").text().get(), 80);
  if (b.code.empty()) return std::nullopt;
  return b;
}

Result<std::string> ParseUploadId(std::string_view xml) {
  pugi::xml_document doc;
  FLEETFS_RETURN_IF_ERROR(LoadXml(doc, xml, "a CreateMultipartUpload answer"));
  std::string id = doc.child("InitiateMultipartUploadResult").child("UploadId").text().get();
  if (id.empty()) {
    return DataLoss("a CreateMultipartUpload answer has no InitiateMultipartUploadResult/UploadId: '" +
                    Printable(xml.substr(0, 120)) + "'");
  }
  if (id.size() > 1024) return DataLoss("a CreateMultipartUpload answer's UploadId is over 1 KiB");
  return id;
}

Result<std::optional<S3ErrorBody>> ParseCompleteResult(std::string_view xml) {
  pugi::xml_document doc;
  FLEETFS_RETURN_IF_ERROR(LoadXml(doc, xml, "a CompleteMultipartUpload answer"));
  if (doc.child("CompleteMultipartUploadResult")) return std::optional<S3ErrorBody>();
  if (auto e = ParseErrorBody(xml)) return std::optional<S3ErrorBody>(std::move(*e));
  return DataLoss("a CompleteMultipartUpload answer is neither a CompleteMultipartUploadResult "
                  "nor an Error: '" + Printable(xml.substr(0, 120)) + "'");
}

Result<UploadsPage> ParseUploadsPage(std::string_view xml) {
  pugi::xml_document doc;
  FLEETFS_RETURN_IF_ERROR(LoadXml(doc, xml, "a ListMultipartUploads answer"));
  pugi::xml_node root = doc.child("ListMultipartUploadsResult");
  if (!root) {
    return DataLoss("a ListMultipartUploads answer is not a ListMultipartUploadsResult: '" +
                    Printable(xml.substr(0, 120)) + "'");
  }
  UploadsPage page;
  for (pugi::xml_node u : root.children("Upload")) {
    MultipartUpload up{u.child("Key").text().get(), u.child("UploadId").text().get(),
                       ParseIsoTime(u.child("Initiated").text().get())};
    if (up.upload_id.empty()) return DataLoss("a ListMultipartUploads answer has an Upload without an UploadId");
    page.uploads.push_back(std::move(up));
  }
  page.truncated = std::string_view(root.child("IsTruncated").text().get()) == "true";
  if (page.truncated) {
    page.next_key_marker = root.child("NextKeyMarker").text().get();
    page.next_upload_id_marker = root.child("NextUploadIdMarker").text().get();
    if (page.next_key_marker.empty()) {
      return DataLoss("a ListMultipartUploads answer says it is truncated and gives no NextKeyMarker");
    }
  }
  return page;
}

std::optional<std::int64_t> ParseIsoTime(std::string_view t) {
  // YYYY-MM-DDTHH:MM:SS, then fractions and 'Z' (or nothing).
  if (t.size() < 19 || t[4] != '-' || t[7] != '-' || t[10] != 'T' || t[13] != ':' ||
      t[16] != ':') {
    return std::nullopt;
  }
  auto num = [&](std::size_t at, std::size_t n) -> std::optional<int> {
    int v = 0;
    for (std::size_t i = at; i < at + n; ++i) {
      if (t[i] < '0' || t[i] > '9') return std::nullopt;
      v = v * 10 + (t[i] - '0');
    }
    return v;
  };
  auto y = num(0, 4), mo = num(5, 2), d = num(8, 2), h = num(11, 2), mi = num(14, 2),
       s = num(17, 2);
  if (!y || !mo || !d || !h || !mi || !s || *mo < 1 || *mo > 12 || *d < 1 || *d > 31 || *h > 23 ||
      *mi > 59 || *s > 60) {
    return std::nullopt;
  }
  // Days from civil (Howard Hinnant's algorithm): no time zone, no locale.
  const int yy = *y - (*mo <= 2 ? 1 : 0);
  const int era = yy / 400;
  const int yoe = yy - era * 400;
  const int doy = (153 * (*mo + (*mo > 2 ? -3 : 9)) + 2) / 5 + *d - 1;
  const int doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  const std::int64_t days = std::int64_t{era} * 146097 + doe - 719468;
  return days * 86400 + *h * 3600 + *mi * 60 + *s;
}

std::string CompleteMultipartBody(const std::vector<std::string>& etags) {
  pugi::xml_document doc;
  pugi::xml_node root = doc.append_child("CompleteMultipartUpload");
  root.append_attribute("xmlns") = "http://s3.amazonaws.com/doc/2006-03-01/";
  for (std::size_t i = 0; i < etags.size(); ++i) {
    pugi::xml_node part = root.append_child("Part");
    part.append_child("PartNumber").text().set(static_cast<unsigned>(i + 1));
    part.append_child("ETag").text().set(etags[i].c_str());
  }
  std::ostringstream out;
  doc.save(out, "", pugi::format_raw | pugi::format_no_declaration);
  return out.str();
}

std::string Printable(std::string_view s, std::size_t max) {
  std::string out;
  for (char c : s.substr(0, max)) {
    out += (c >= 0x20 && c < 0x7f) ? c : '?';
  }
  if (s.size() > max) out += "...";
  return out;
}

}  // namespace fleetfs::replica::s3
