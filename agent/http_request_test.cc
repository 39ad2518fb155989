#include "agent/http_request.h"

#include <gtest/gtest.h>

#include <string>

namespace fleetfs::agent {
namespace {

using Progress = HttpRequestParser::Progress;

// Feeds `bytes` in pieces of `piece` bytes (0: all at once) until a result.
Progress FeedAll(HttpRequestParser& p, std::string_view bytes, std::size_t piece = 0) {
  if (piece == 0) piece = bytes.size() + 1;
  for (std::size_t at = 0; at < bytes.size() && p.progress() == Progress::kNeedMore; at += piece) {
    p.Feed(bytes.substr(at, piece));
  }
  return p.progress();
}

TEST(HttpRequestParser, a_whole_request_gives_its_method_and_its_path_without_the_query) {
  HttpRequestParser p;
  ASSERT_EQ(FeedAll(p, "GET /status?pretty=1 HTTP/1.1\r\nHost: localhost\r\n\r\n"),
            Progress::kRequest);
  EXPECT_EQ(p.request().method, "GET");
  EXPECT_EQ(p.request().target, "/status?pretty=1");
  EXPECT_EQ(p.request().path, "/status");
}

TEST(HttpRequestParser, a_request_fed_one_byte_at_a_time_is_the_same_request) {
  HttpRequestParser p;
  ASSERT_EQ(FeedAll(p, "HEAD /health HTTP/1.0\r\nUser-Agent: curl\r\n\r\n", 1), Progress::kRequest);
  EXPECT_EQ(p.request().method, "HEAD");
  EXPECT_EQ(p.request().path, "/health");
}

TEST(HttpRequestParser, a_request_line_cut_short_needs_more_and_is_400_when_the_client_ends) {
  HttpRequestParser p;
  EXPECT_EQ(p.Feed("GET /hea"), Progress::kNeedMore);
  EXPECT_EQ(p.Finish(), Progress::kError);
  EXPECT_EQ(p.error().status, 400);
}

TEST(HttpRequestParser, a_head_over_8_KiB_is_431_in_one_piece_or_byte_by_byte) {
  std::string big = "GET /health HTTP/1.1\r\nX-Big: " + std::string(1 << 20, 'a') + "\r\n\r\n";
  for (std::size_t piece : {std::size_t{0}, std::size_t{1}, std::size_t{1000}}) {
    HttpRequestParser p;
    ASSERT_EQ(FeedAll(p, big, piece), Progress::kError) << piece;
    EXPECT_EQ(p.error().status, 431) << piece;
    EXPECT_LE(p.consumed(), HttpRequestParser::kMaxHeadBytes);
  }
}

TEST(HttpRequestParser, a_request_line_over_8_KiB_is_431) {
  HttpRequestParser p;
  ASSERT_EQ(FeedAll(p, "GET /" + std::string(9000, 'h') + " HTTP/1.1\r\n\r\n"), Progress::kError);
  EXPECT_EQ(p.error().status, 431);
}

TEST(HttpRequestParser, a_head_of_exactly_8_KiB_is_a_request) {
  std::string head = "GET /health HTTP/1.1\r\nX-Pad: ";
  std::string end = "\r\n\r\n";
  head += std::string(HttpRequestParser::kMaxHeadBytes - head.size() - end.size(), 'p') + end;
  ASSERT_EQ(head.size(), HttpRequestParser::kMaxHeadBytes);
  HttpRequestParser p;
  EXPECT_EQ(FeedAll(p, head, 100), Progress::kRequest);
  HttpRequestParser longer;
  std::string one_more = head;
  one_more.insert(one_more.find("X-Pad: ") + 7, "p");
  EXPECT_EQ(FeedAll(longer, one_more), Progress::kError);
  EXPECT_EQ(longer.error().status, 431);
}

TEST(HttpRequestParser, a_request_with_a_body_is_413) {
  for (const char* request :
       {"POST /health HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello",
        "POST /health HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        "GET /health HTTP/1.1\r\nContent-Length: 1\r\n\r\n"}) {
    HttpRequestParser p;
    ASSERT_EQ(FeedAll(p, request), Progress::kError) << request;
    EXPECT_EQ(p.error().status, 413) << request;
  }
}

TEST(HttpRequestParser, an_empty_body_is_no_body) {
  HttpRequestParser p;
  ASSERT_EQ(FeedAll(p, "POST /health HTTP/1.1\r\nContent-Length: 0\r\n\r\n"), Progress::kRequest);
  EXPECT_EQ(p.request().method, "POST");  // the handler answers 405
}

TEST(HttpRequestParser, garbage_is_400) {
  for (std::string_view garbage :
       {std::string_view("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 11),  // a TLS hello
        std::string_view("FETCH / HTTP/1.1\r\n\r\n"),
        std::string_view("GET /health HTTP/1.1\r\nNo colon here\r\n\r\n"),
        std::string_view("GET /health\0 HTTP/1.1\r\n\r\n", 25)}) {
    HttpRequestParser p;
    ASSERT_EQ(FeedAll(p, garbage), Progress::kError) << garbage;
    EXPECT_EQ(p.error().status, 400) << garbage;
  }
}

TEST(HttpRequestParser, a_target_that_is_not_printable_ascii_is_400) {
  HttpRequestParser p;
  ASSERT_EQ(FeedAll(p, "GET /\xff\xfe\x80 HTTP/1.1\r\n\r\n"), Progress::kError);
  EXPECT_EQ(p.error().status, 400);
}

TEST(HttpRequestParser, header_values_that_are_not_utf8_are_not_read) {
  HttpRequestParser p;
  EXPECT_EQ(FeedAll(p, "GET /health HTTP/1.1\r\nX: \xff\xfe\r\n\r\n"), Progress::kRequest);
}

TEST(HttpRequestParser, versions_other_than_http_1_are_400) {
  for (const char* request :
       {"GET /health\r\n\r\n", "GET /health HTTP/2.0\r\n\r\n", "GET /health HTTP/0.9\r\n\r\n"}) {
    HttpRequestParser p;
    ASSERT_EQ(FeedAll(p, request), Progress::kError) << request;
    EXPECT_EQ(p.error().status, 400) << request;
  }
}

TEST(HttpRequestParser, pipelined_requests_give_the_first_and_the_rest_is_not_read) {
  std::string first = "GET /health HTTP/1.1\r\n\r\n";
  HttpRequestParser p;
  ASSERT_EQ(FeedAll(p, first + "GET /status HTTP/1.1\r\n\r\n"), Progress::kRequest);
  EXPECT_EQ(p.request().path, "/health");
  EXPECT_EQ(p.consumed(), first.size());
  EXPECT_EQ(p.Feed("more garbage"), Progress::kRequest);
  EXPECT_EQ(p.request().path, "/health");
}

TEST(HttpRequestParser, after_an_error_later_bytes_change_nothing) {
  HttpRequestParser p;
  ASSERT_EQ(p.Feed("\x01\x02"), Progress::kError);
  EXPECT_EQ(p.Feed("GET / HTTP/1.1\r\n\r\n"), Progress::kError);
  EXPECT_EQ(p.Finish(), Progress::kError);
  EXPECT_EQ(p.error().status, 400);
}

TEST(HttpRequestParser, an_upgrade_or_connect_request_is_a_request_for_the_handler_to_refuse) {
  HttpRequestParser p;
  ASSERT_EQ(FeedAll(p,
                    "GET /health HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
                    "\x81\x05hello"),
            Progress::kRequest);
  EXPECT_EQ(p.request().path, "/health");
  HttpRequestParser connect;
  ASSERT_EQ(FeedAll(connect, "CONNECT host:443 HTTP/1.1\r\n\r\n"), Progress::kRequest);
  EXPECT_EQ(connect.request().method, "CONNECT");
}

TEST(RenderResponse, gives_the_length_of_the_body_and_leaves_it_out_for_head) {
  HttpResponse r{431, "text/plain; charset=utf-8", "too big\n"};
  std::string get = RenderResponse(r, false);
  EXPECT_EQ(get.rfind("HTTP/1.1 431 Request Header Fields Too Large\r\n", 0), 0u) << get;
  EXPECT_NE(get.find("Content-Length: 8\r\n"), std::string::npos);
  EXPECT_NE(get.find("Connection: close\r\n"), std::string::npos);
  EXPECT_TRUE(get.ends_with("\r\n\r\ntoo big\n"));
  std::string head = RenderResponse(r, true);
  EXPECT_TRUE(head.ends_with("\r\n\r\n"));
  EXPECT_NE(head.find("Content-Length: 8\r\n"), std::string::npos);
}

}  // namespace
}  // namespace fleetfs::agent
