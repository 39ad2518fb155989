#include "agent/admin_server.h"

#include <http_parser.h>

#include <cstring>

namespace fleetfs::agent {

constexpr std::size_t kMaxRequestBytes = 16 * 1024;
constexpr std::size_t kMaxConnections = 64;

struct AdminServer::Connection {
  AdminServer* server = nullptr;
  uv_tcp_t tcp{};
  http_parser parser{};
  std::string url;
  std::size_t received = 0;
  bool complete = false;
  bool answered = false;
  std::string response;
  uv_write_t write{};
};

namespace {

const char* Reason(int status) {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 413: return "Payload Too Large";
    case 503: return "Service Unavailable";
    default: return "Error";
  }
}

std::string Render(const HttpResponse& r, bool head) {
  return "HTTP/1.1 " + std::to_string(r.status) + " " + Reason(r.status) +
         "\r\nContent-Type: " + r.content_type +
         "\r\nContent-Length: " + std::to_string(r.body.size()) +
         "\r\nConnection: close\r\nCache-Control: no-store\r\n\r\n" + (head ? "" : r.body);
}

const http_parser_settings& Settings() {
  static const http_parser_settings settings = [] {
    http_parser_settings s{};
    s.on_url = [](http_parser* p, const char* at, size_t length) {
      static_cast<AdminServer::Connection*>(p->data)->url.append(at, length);
      return 0;
    };
    s.on_message_complete = [](http_parser* p) {
      static_cast<AdminServer::Connection*>(p->data)->complete = true;
      return 0;
    };
    return s;
  }();
  return settings;
}

}  // namespace

Result<std::unique_ptr<AdminServer>> AdminServer::Start(uv_loop_t* loop, const Endpoint& endpoint,
                                                        Handler handler) {
  std::unique_ptr<AdminServer> server(new AdminServer(loop, std::move(handler)));
  auto* tcp = new uv_tcp_t;
  uv_tcp_init(loop, tcp);
  tcp->data = server.get();
  server->listener_ = tcp;
  sockaddr_in addr{};
  int rc = uv_ip4_addr(endpoint.host.c_str(), endpoint.port, &addr);
  if (rc == 0) rc = uv_tcp_bind(tcp, reinterpret_cast<const sockaddr*>(&addr), 0);
  if (rc == 0) rc = uv_listen(reinterpret_cast<uv_stream_t*>(tcp), 64, OnConnection);
  if (rc != 0) {
    server->Close();
    return Status(Code::kUnavailable, "admin: cannot listen on " + endpoint.ToString() + ": " +
                                          uv_strerror(rc) +
                                          " (another agent there? choose another with --admin)");
  }
  return server;
}

AdminServer::~AdminServer() { Close(); }

void AdminServer::Close() {
  if (listener_ != nullptr) {
    uv_close(reinterpret_cast<uv_handle_t*>(listener_),
             [](uv_handle_t* h) { delete reinterpret_cast<uv_tcp_t*>(h); });
    listener_ = nullptr;
  }
  for (Connection* c : std::unordered_set<Connection*>(connections_)) Drop(c);
}

void AdminServer::Drop(Connection* c) {
  if (connections_.erase(c) == 0) return;
  c->server = nullptr;
  uv_close(reinterpret_cast<uv_handle_t*>(&c->tcp),
           [](uv_handle_t* h) { delete static_cast<Connection*>(h->data); });
}

void AdminServer::OnConnection(uv_stream_t* listener, int status) {
  auto* server = static_cast<AdminServer*>(listener->data);
  if (status < 0) return;
  auto* c = new Connection;
  c->server = server;
  uv_tcp_init(server->loop_, &c->tcp);
  c->tcp.data = c;
  server->connections_.insert(c);
  // Clients that connect and never finish a request must not pile up.
  if (uv_accept(listener, reinterpret_cast<uv_stream_t*>(&c->tcp)) != 0 ||
      server->connections_.size() > kMaxConnections) {
    server->Drop(c);
    return;
  }
  http_parser_init(&c->parser, HTTP_REQUEST);
  c->parser.data = c;
  uv_read_start(
      reinterpret_cast<uv_stream_t*>(&c->tcp),
      [](uv_handle_t*, size_t suggested, uv_buf_t* buf) {
        buf->base = new char[suggested];
        buf->len = suggested;
      },
      [](uv_stream_t* stream, ssize_t nread, const uv_buf_t* buf) {
        std::unique_ptr<char[]> owned(buf->base);
        auto* c = static_cast<Connection*>(stream->data);
        AdminServer* server = c->server;
        if (server == nullptr || c->answered) return;
        if (nread < 0) {
          server->Drop(c);
          return;
        }
        HttpResponse response;
        c->received += static_cast<std::size_t>(nread);
        std::size_t parsed = http_parser_execute(&c->parser, &Settings(), buf->base,
                                                 static_cast<std::size_t>(nread));
        if (c->parser.http_errno != HPE_OK || parsed != static_cast<std::size_t>(nread)) {
          response = {400, "text/plain; charset=utf-8",
                      std::string("bad request: ") +
                          http_errno_description(static_cast<http_errno>(c->parser.http_errno)) +
                          "\n"};
        } else if (c->received > kMaxRequestBytes) {
          response = {413, "text/plain; charset=utf-8", "request too large\n"};
        } else if (!c->complete) {
          return;  // wait for the rest
        } else {
          std::string path = c->url.substr(0, c->url.find('?'));
          response = server->handler_(http_method_str(static_cast<http_method>(c->parser.method)),
                                      path);
        }
        c->answered = true;
        c->response = Render(response, c->complete && c->parser.method == HTTP_HEAD);
        uv_read_stop(stream);
        uv_buf_t out = uv_buf_init(c->response.data(), static_cast<unsigned>(c->response.size()));
        c->write.data = c;
        uv_write(&c->write, stream, &out, 1, [](uv_write_t* req, int) {
          auto* c = static_cast<Connection*>(req->data);
          if (c->server != nullptr) c->server->Drop(c);
        });
      });
}

}  // namespace fleetfs::agent
