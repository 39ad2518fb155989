// HttpRequestParser: reads the one request an admin connection may send, from
// bytes as they arrive, with the limits that keep a hostile local client from
// holding the agent: a request head of at most 8 KiB, no body, HTTP/1.x only,
// a request target of printable ASCII. Pure: no loop, no socket, so it is
// unit-tested and fuzzed on its own (tests/fuzz/admin_request_fuzz.cc).
//
// Bytes after the first complete request (pipelined requests) are not read:
// the admin server answers one request per connection.
//
// Thread-safety: a value used by one thread.
#pragma once

#include <http_parser.h>

#include <cstddef>
#include <string>
#include <string_view>

namespace fleetfs::agent {

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};

// The response as sent: status line, headers ("Connection: close"), body
// (left out for a HEAD request).
std::string RenderResponse(const HttpResponse& response, bool head);

// "Bad Request" for 400; "Error" for a status it does not know.
std::string_view ReasonPhrase(int status);

struct HttpRequest {
  std::string method;  // "GET", "HEAD", ...
  std::string target;  // as sent: "/status?x=1"
  std::string path;    // the target up to '?': "/status"
};

class HttpRequestParser {
 public:
  static constexpr std::size_t kMaxHeadBytes = 8 * 1024;

  enum class Progress { kNeedMore, kRequest, kError };

  HttpRequestParser();
  HttpRequestParser(const HttpRequestParser&) = delete;
  HttpRequestParser& operator=(const HttpRequestParser&) = delete;

  // Reads the next bytes of the connection. kNeedMore until a whole request
  // head arrived; then kRequest (request() is set) or kError (error() is the
  // answer to send: 400 malformed, 413 a body, 431 a head over 8 KiB). Once
  // it is not kNeedMore, it stays so and later bytes are ignored.
  Progress Feed(std::string_view bytes);

  // The client ended its side: a request not yet complete is an error (400).
  Progress Finish();

  Progress progress() const { return progress_; }
  const HttpRequest& request() const { return request_; }  // when kRequest
  const HttpResponse& error() const { return error_; }     // when kError
  // Bytes of the request read so far (never more than kMaxHeadBytes).
  std::size_t consumed() const { return consumed_; }

 private:
  friend struct HttpRequestParserCallbacks;  // http_parser's callbacks record here
  static const http_parser_settings& Settings();
  Progress Fail(int status, std::string why);

  http_parser parser_{};
  Progress progress_ = Progress::kNeedMore;
  std::size_t consumed_ = 0;
  bool complete_ = false;
  // Set by a callback that refused what it saw; answered once execute returns.
  int refused_status_ = 0;
  std::string refused_why_;
  HttpRequest request_;
  HttpResponse error_;
};

}  // namespace fleetfs::agent
