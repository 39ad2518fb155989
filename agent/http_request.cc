#include "agent/http_request.h"

#include <algorithm>
#include <climits>

namespace fleetfs::agent {

std::string_view ReasonPhrase(int status) {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 413: return "Payload Too Large";
    case 431: return "Request Header Fields Too Large";
    case 503: return "Service Unavailable";
    default: return "Error";
  }
}

std::string RenderResponse(const HttpResponse& r, bool head) {
  std::string out = "HTTP/1.1 " + std::to_string(r.status) + " ";
  out += ReasonPhrase(r.status);
  out += "\r\nContent-Type: " + r.content_type +
         "\r\nContent-Length: " + std::to_string(r.body.size()) +
         "\r\nConnection: close\r\nCache-Control: no-store\r\n\r\n";
  if (!head) out += r.body;
  return out;
}

namespace {

HttpRequestParser* Self(http_parser* p) { return static_cast<HttpRequestParser*>(p->data); }

// A request target is printable ASCII without spaces (RFC 9112 3.2): other
// bytes are never a path the server has, and must not reach a handler that
// might echo them into a JSON or text answer.
bool PrintableAscii(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c > 0x20 && c < 0x7f; });
}

}  // namespace

// The callbacks only record; Feed decides once execute returns. A callback
// that refuses returns non-zero, which stops http_parser at once.
struct HttpRequestParserCallbacks {
  static int OnUrl(http_parser* p, const char* at, size_t length) {
    Self(p)->request_.target.append(at, length);  // bounded by kMaxHeadBytes
    return 0;
  }
  static int OnHeadersComplete(http_parser* p) {
    HttpRequestParser* self = Self(p);
    if (p->http_major != 1) {
      self->refused_status_ = 400;
      self->refused_why_ = "only HTTP/1.0 and HTTP/1.1 are served";
      return -1;
    }
    bool has_length = (p->flags & F_CONTENTLENGTH) != 0 && p->content_length != ULLONG_MAX;
    if ((has_length && p->content_length > 0) || p->uses_transfer_encoding ||
        (p->flags & F_CHUNKED) != 0) {
      self->refused_status_ = 413;
      self->refused_why_ = "a request body is not accepted";
      return -1;
    }
    return 0;
  }
  static int OnMessageComplete(http_parser* p) {
    Self(p)->complete_ = true;
    // Stop here: bytes after the first request (pipelined) are not read.
    http_parser_pause(p, 1);
    return 0;
  }
};

const http_parser_settings& HttpRequestParser::Settings() {
  static const http_parser_settings settings = [] {
    http_parser_settings s{};
    s.on_url = HttpRequestParserCallbacks::OnUrl;
    s.on_headers_complete = HttpRequestParserCallbacks::OnHeadersComplete;
    s.on_message_complete = HttpRequestParserCallbacks::OnMessageComplete;
    return s;
  }();
  return settings;
}

HttpRequestParser::HttpRequestParser() {
  http_parser_init(&parser_, HTTP_REQUEST);
  parser_.data = this;
}

HttpRequestParser::Progress HttpRequestParser::Fail(int status, std::string why) {
  error_ = HttpResponse{status, "text/plain; charset=utf-8", std::move(why) + "\n"};
  progress_ = Progress::kError;
  return progress_;
}

HttpRequestParser::Progress HttpRequestParser::Feed(std::string_view bytes) {
  if (progress_ != Progress::kNeedMore || bytes.empty()) return progress_;
  // Never hand http_parser more than the head may still take: the limit
  // holds whatever the chunking, and no byte past it is looked at.
  std::size_t n = std::min(bytes.size(), kMaxHeadBytes - consumed_);
  std::size_t parsed = http_parser_execute(&parser_, &Settings(), bytes.data(), n);
  consumed_ += std::min(parsed, n);
  if (refused_status_ != 0) return Fail(refused_status_, std::move(refused_why_));
  if (complete_) {
    if (parser_.http_major != 1) return Fail(400, "only HTTP/1.0 and HTTP/1.1 are served");
    if (request_.target.empty() || !PrintableAscii(request_.target)) {
      return Fail(400, "bad request: the target is not printable ASCII");
    }
    request_.method = http_method_str(static_cast<http_method>(parser_.method));
    request_.path = request_.target.substr(0, request_.target.find('?'));
    progress_ = Progress::kRequest;
    return progress_;
  }
  auto err = static_cast<http_errno>(parser_.http_errno);
  if (err == HPE_HEADER_OVERFLOW) return Fail(431, "request head over 8 KiB");
  if (err != HPE_OK || parsed != n) {
    return Fail(400, std::string("bad request: ") + http_errno_description(err));
  }
  if (consumed_ >= kMaxHeadBytes) return Fail(431, "request head over 8 KiB");
  return progress_;
}

HttpRequestParser::Progress HttpRequestParser::Finish() {
  if (progress_ != Progress::kNeedMore) return progress_;
  return Fail(400, "bad request: the connection ended before the request head did");
}

}  // namespace fleetfs::agent
