#include "agent/admin_server.h"

#include <algorithm>

namespace fleetfs::agent {

namespace {

// How often connections past their time are looked for; a connection lives
// at most this much longer than its limit.
constexpr std::uint64_t kSweepMs = 250;
constexpr int kListenBacklog = 64;

}  // namespace

struct AdminServer::Connection {
  enum class Phase { kReading, kWriting, kLingering };

  AdminServer* server = nullptr;  // nullptr once dropped (the close is under way)
  uv_tcp_t tcp{};
  HttpRequestParser parser;
  Phase phase = Phase::kReading;
  bool peer_ended = false;        // the client half-closed its side
  std::uint64_t sequence = 0;     // accept order
  std::uint64_t deadline_ms = 0;  // in uv_now time: closed when it passes
  std::string response;
  uv_write_t write{};
  uv_shutdown_t shutdown{};
  // A request head is at most 8 KiB: reads need no more than this, and no
  // allocation per read.
  char buf[4096];
};

namespace {

void ReadInto(uv_handle_t* h, size_t, uv_buf_t* buf) {
  auto* c = static_cast<AdminServer::Connection*>(h->data);
  *buf = uv_buf_init(c->buf, sizeof(c->buf));
}

}  // namespace

Result<std::unique_ptr<AdminServer>> AdminServer::Start(uv_loop_t* loop, const Endpoint& endpoint,
                                                        Handler handler, AdminLimits limits) {
  std::unique_ptr<AdminServer> server(new AdminServer(loop, std::move(handler), limits));
  auto* tcp = new uv_tcp_t;
  uv_tcp_init(loop, tcp);
  tcp->data = server.get();
  server->listener_ = tcp;
  auto* sweep = new uv_timer_t;
  uv_timer_init(loop, sweep);
  sweep->data = server.get();
  server->sweep_ = sweep;
  sockaddr_in addr{};
  int rc = uv_ip4_addr(endpoint.host.c_str(), endpoint.port, &addr);
  if (rc == 0) rc = uv_tcp_bind(tcp, reinterpret_cast<const sockaddr*>(&addr), 0);
  if (rc == 0) rc = uv_listen(reinterpret_cast<uv_stream_t*>(tcp), kListenBacklog, OnConnection);
  if (rc != 0) {
    server->Close();
    return Status(Code::kUnavailable, "admin: cannot listen on " + endpoint.ToString() + ": " +
                                          uv_strerror(rc) +
                                          " (another agent there? choose another with --admin)");
  }
  uv_timer_start(
      sweep, [](uv_timer_t* t) { static_cast<AdminServer*>(t->data)->Sweep(); }, kSweepMs,
      kSweepMs);
  // The sweep alone must not keep the loop running.
  uv_unref(reinterpret_cast<uv_handle_t*>(sweep));
  return server;
}

AdminServer::~AdminServer() { Close(); }

void AdminServer::Close() {
  if (listener_ != nullptr) {
    uv_close(reinterpret_cast<uv_handle_t*>(listener_),
             [](uv_handle_t* h) { delete reinterpret_cast<uv_tcp_t*>(h); });
    listener_ = nullptr;
  }
  if (sweep_ != nullptr) {
    uv_close(reinterpret_cast<uv_handle_t*>(sweep_),
             [](uv_handle_t* h) { delete reinterpret_cast<uv_timer_t*>(h); });
    sweep_ = nullptr;
  }
  for (Connection* c : std::unordered_set<Connection*>(connections_)) Drop(c);
}

void AdminServer::Drop(Connection* c) {
  if (connections_.erase(c) == 0) return;
  c->server = nullptr;
  // Pending write and shutdown callbacks run (cancelled) before the close
  // callback frees the connection.
  uv_close(reinterpret_cast<uv_handle_t*>(&c->tcp),
           [](uv_handle_t* h) { delete static_cast<Connection*>(h->data); });
}

void AdminServer::Sweep() {
  std::uint64_t now = uv_now(loop_);
  for (Connection* c : std::unordered_set<Connection*>(connections_)) {
    if (now >= c->deadline_ms) {
      ++stats_.timed_out;
      Drop(c);
    }
  }
}

void AdminServer::OnConnection(uv_stream_t* listener, int status) {
  auto* server = static_cast<AdminServer*>(listener->data);
  if (status < 0) return;
  auto* c = new Connection;
  c->server = server;
  uv_tcp_init(server->loop_, &c->tcp);
  c->tcp.data = c;
  server->connections_.insert(c);
  if (uv_accept(listener, reinterpret_cast<uv_stream_t*>(&c->tcp)) != 0) {
    server->Drop(c);
    return;
  }
  server->Admit(c);
}

void AdminServer::Admit(Connection* c) {
  ++stats_.accepted;
  c->sequence = next_sequence_++;
  c->deadline_ms = uv_now(loop_) + static_cast<std::uint64_t>(limits_.request_time.count());
  if (connections_.size() > limits_.max_connections) {
    // At the cap the oldest connection not being answered makes room: a
    // client that holds connections open only ever delays its own.
    Connection* oldest = nullptr;
    for (Connection* other : connections_) {
      if (other == c || other->phase == Connection::Phase::kWriting) continue;
      if (oldest == nullptr || other->sequence < oldest->sequence) oldest = other;
    }
    ++stats_.evicted;
    Drop(oldest != nullptr ? oldest : c);
    if (oldest == nullptr) return;
  }
  uv_read_start(reinterpret_cast<uv_stream_t*>(&c->tcp), ReadInto, OnRead);
}

void AdminServer::OnRead(uv_stream_t* stream, ssize_t nread, const uv_buf_t* buf) {
  auto* c = static_cast<Connection*>(stream->data);
  AdminServer* server = c->server;
  if (server == nullptr || nread == 0) return;
  if (c->phase == Connection::Phase::kLingering) {
    // The answer is sent: drop what the client still sends until it ends.
    if (nread < 0) server->Drop(c);
    return;
  }
  if (c->phase != Connection::Phase::kReading) return;
  HttpRequestParser::Progress progress;
  if (nread == UV_EOF) {
    c->peer_ended = true;
    if (c->parser.consumed() == 0) {  // connected and left without a word
      server->Drop(c);
      return;
    }
    progress = c->parser.Finish();
  } else if (nread < 0) {
    server->Drop(c);
    return;
  } else {
    progress = c->parser.Feed(std::string_view(buf->base, static_cast<std::size_t>(nread)));
  }
  switch (progress) {
    case HttpRequestParser::Progress::kNeedMore:
      return;
    case HttpRequestParser::Progress::kError:
      ++server->stats_.refused;
      server->Answer(c, c->parser.error(), false);
      return;
    case HttpRequestParser::Progress::kRequest: {
      const HttpRequest& request = c->parser.request();
      server->Answer(c, server->handler_(request.method, request.path), request.method == "HEAD");
      return;
    }
  }
}

void AdminServer::Answer(Connection* c, const HttpResponse& response, bool head) {
  auto* stream = reinterpret_cast<uv_stream_t*>(&c->tcp);
  uv_read_stop(stream);
  c->phase = Connection::Phase::kWriting;
  c->deadline_ms = uv_now(loop_) + static_cast<std::uint64_t>(limits_.write_time.count());
  c->response = RenderResponse(response, head);
  uv_buf_t out = uv_buf_init(c->response.data(), static_cast<unsigned>(c->response.size()));
  c->write.data = c;
  if (uv_write(&c->write, stream, &out, 1, [](uv_write_t* req, int status) {
        auto* c = static_cast<Connection*>(req->data);
        if (c->server != nullptr && status < 0) c->server->Drop(c);
      }) != 0) {
    Drop(c);
    return;
  }
  // After the answer, end our side, then read until the client ends its own:
  // closing with unread bytes would reset the connection, and the client
  // could lose the answer it was sent.
  c->shutdown.data = c;
  if (uv_shutdown(&c->shutdown, stream, [](uv_shutdown_t* req, int status) {
        auto* c = static_cast<Connection*>(req->data);
        AdminServer* server = c->server;
        if (server == nullptr) return;
        if (status < 0 || c->peer_ended) {
          server->Drop(c);
          return;
        }
        c->phase = Connection::Phase::kLingering;
        c->deadline_ms =
            uv_now(server->loop_) + static_cast<std::uint64_t>(server->limits_.linger_time.count());
        auto* stream = reinterpret_cast<uv_stream_t*>(&c->tcp);
        uv_read_start(stream, ReadInto, OnRead);
      }) != 0) {
    Drop(c);
  }
}

}  // namespace fleetfs::agent
