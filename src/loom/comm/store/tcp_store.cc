#include "loom/comm/store/tcp_store.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>

#include "loom/comm/net/handshake.h"
#include "loom/core/error.h"
#include "loom/core/log.h"
#include "loom/core/tunable.h"

namespace loom::comm {
namespace {

const BytesTunable kMaxStoreFrame("LOOM_STORE_MAX_FRAME", 16 << 20,
                                  "largest store message accepted, bytes; larger ones are refused");

constexpr double kHandshakeSeconds = 10.0;

// Slack added to a blocking request's own timeout before the client gives up on the socket.
constexpr double kReplySlackSeconds = 5.0;

// "a, b, c": the keys a wait named, for a message about it.
std::string key_list(const std::vector<std::string>& keys) {
  std::string out;
  for (const std::string& k : keys) out += (out.empty() ? "" : ", ") + k;
  return out;
}

uint32_t timeout_ms_of(Deadline d) {
  return static_cast<uint32_t>(d.remaining_ms(0x7fffffff));
}

}  // namespace

// ---------------------------------------------------------------- server

TcpStoreServer::TcpStoreServer(const std::string& host, uint16_t port, std::string token)
    : token_(std::move(token)),
      listen_(net::listen_on(host, port)),
      address_(net::local_address(listen_.get())),
      table_(std::make_shared<MemoryStore::Table>()),
      local_(table_) {
  acceptor_ = std::thread([this] { accept_loop(); });
}

TcpStoreServer::~TcpStoreServer() {
  stop_ = true;
  table_->cv.notify_all();
  acceptor_.join();
  std::lock_guard<std::mutex> lock(conns_mu_);
  for (auto& c : conns_)
    if (c.fd.valid()) ::shutdown(c.fd.get(), SHUT_RDWR);
  for (auto& c : conns_) c.thread.join();
}

void TcpStoreServer::reap_finished() {
  std::lock_guard<std::mutex> lock(conns_mu_);
  for (auto it = conns_.begin(); it != conns_.end();) {
    if (it->done) {
      it->thread.join();
      it = conns_.erase(it);
    } else {
      ++it;
    }
  }
}

void TcpStoreServer::accept_loop() {
  while (!stop_) {
    net::Fd fd = net::accept_one(listen_.get(), Deadline::after_seconds(0.1));
    if (!fd.valid()) continue;
    reap_finished();
    std::lock_guard<std::mutex> lock(conns_mu_);
    Conn& c = conns_.emplace_back();
    c.fd = std::move(fd);
    c.thread = std::thread([this, &c] { serve(c); });
  }
}

void TcpStoreServer::serve(Conn& conn) {
  int fd = conn.fd.get();
  if (!net::server_handshake(fd, token_, "store", Deadline::after_seconds(kHandshakeSeconds))) {
    ++refused_;
    ::shutdown(fd, SHUT_RDWR);  // the peer sees the refusal at once
    conn.done = true;
    return;
  }
  std::string who = net::peer_address(fd).str();
  std::vector<uint8_t> buf;
  size_t max_frame = static_cast<size_t>(kMaxStoreFrame.get());
  try {
    while (!stop_) {
      wire::Message req;
      wire::DecodeResult r = wire::decode(buf.data(), buf.size(), max_frame, req);
      if (r.status == wire::Status::kNeedMore) {
        pollfd pfd{fd, POLLIN, 0};
        if (::poll(&pfd, 1, 100) <= 0) continue;
        uint8_t chunk[64 * 1024];
        ssize_t n = ::recv(fd, chunk, sizeof chunk, 0);
        if (n <= 0) break;  // client went away
        buf.insert(buf.end(), chunk, chunk + n);
        continue;
      }
      std::string why = r.error;
      if (r.status == wire::Status::kOk && !wire::valid_request(req, why))
        r.status = wire::Status::kMalformed;
      if (r.status != wire::Status::kOk) {
        ++refused_;
        LOOM_LOG(kWarn, "store") << "closed connection from " << who << ": "
                                 << (r.status == wire::Status::kOversized ? "oversized"
                                                                          : "malformed")
                                 << " message (" << why << ")";
        break;
      }
      buf.erase(buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(r.consumed));
      std::string out = wire::encode(execute(req));
      net::send_all(fd, out.data(), out.size(), Deadline::after_seconds(30), who);
    }
  } catch (const std::exception& e) {
    LOOM_LOG(kInfo, "store") << "connection from " << who << " ended: " << e.what();
  }
  ::shutdown(fd, SHUT_RDWR);
  conn.done = true;
}

wire::Message TcpStoreServer::execute(const wire::Message& req) {
  wire::Message rep;
  const auto& s = req.strings;
  auto deadline = Deadline::after(std::chrono::milliseconds(req.timeout_ms));
  // Blocking requests wait in slices so a stopping server is not held up.
  auto wait_keys = [&](const std::vector<std::string>& keys) {
    while (true) {
      if (stop_) {
        throw PeerError(PeerError::Kind::kClosed,
                        "the store is shutting down (the process hosting it is exiting) while "
                        "this rank waited for " +
                            key_list(keys));
      }
      try {
        local_.wait(keys, deadline.earlier(Deadline::after_seconds(0.1)));
        return;
      } catch (const PeerError&) {
        if (deadline.expired()) throw;
      }
    }
  };
  try {
    switch (req.code) {
      case wire::Code::kSet:
        local_.set(s[0], s[1]);
        break;
      case wire::Code::kGet:
        wait_keys({s[0]});
        rep.strings.push_back(local_.get(s[0], Deadline::never()));
        break;
      case wire::Code::kAdd:
        rep.number = local_.add(s[0], req.number);
        break;
      case wire::Code::kCompareSet:
        rep.strings.push_back(local_.compare_set(s[0], s[1], s[2]));
        break;
      case wire::Code::kRemove:
        rep.number = local_.remove(s[0]) ? 1 : 0;
        break;
      case wire::Code::kWait:
        wait_keys(s);
        break;
      case wire::Code::kCheck:
        rep.number = local_.check(s) ? 1 : 0;
        break;
      default:
        break;
    }
  } catch (const PeerError& e) {
    rep.code = e.kind() == PeerError::Kind::kTimeout ? wire::Code::kTimeout : wire::Code::kError;
    rep.strings = {e.what()};
  } catch (const std::exception& e) {
    rep.code = wire::Code::kError;
    rep.strings = {e.what()};
  }
  return rep;
}

// ---------------------------------------------------------------- client

TcpStore::TcpStore(net::HostPort server, std::string token, Deadline connect_deadline)
    : server_(std::move(server)), token_(std::move(token)) {
  fd_ = net::connect_to(server_, connect_deadline, "the rendezvous store");
  net::client_handshake(fd_.get(), token_, "store",
                        connect_deadline.earlier(Deadline::after_seconds(kHandshakeSeconds)));
}

wire::Message TcpStore::call(const wire::Message& req, Deadline deadline) {
  std::lock_guard<std::mutex> lock(mu_);
  std::string who = "the rendezvous store at " + server_.str();
  std::string out = wire::encode(req);
  Deadline io =
      Deadline::after_seconds(std::max(0.0, deadline.remaining_seconds()) + kReplySlackSeconds);
  try {
    net::send_all(fd_.get(), out.data(), out.size(), io, who);
    uint32_t len = 0;
    net::recv_all(fd_.get(), &len, 4, io, who);
    if (len > static_cast<uint32_t>(kMaxStoreFrame.get()) + 1024)
      throw PeerError(PeerError::Kind::kProtocol, who + " sent an oversized reply");
    std::vector<uint8_t> frame(4 + len);
    std::memcpy(frame.data(), &len, 4);
    net::recv_all(fd_.get(), frame.data() + 4, len, io, who);
    wire::Message rep;
    auto r = wire::decode(frame.data(), frame.size(), len, rep);
    if (r.status != wire::Status::kOk)
      throw PeerError(PeerError::Kind::kProtocol, who + " sent a malformed reply: " + r.error);
    if (rep.code == wire::Code::kTimeout)
      throw PeerError(PeerError::Kind::kTimeout,
                      rep.strings.empty() ? "store timeout" : rep.strings[0]);
    if (rep.code == wire::Code::kError)
      throw PeerError(PeerError::Kind::kProtocol,
                      "store error: " + (rep.strings.empty() ? std::string("?") : rep.strings[0]));
    return rep;
  } catch (const PeerError& e) {
    if (e.kind() == PeerError::Kind::kClosed) {
      // Name what this rank was waiting for: where the store's host gave up on the same
      // deadline a moment earlier, the key is the only hint of who never arrived.
      std::string waited;
      if (req.code == wire::Code::kGet || req.code == wire::Code::kWait)
        waited = " while this rank waited for " + key_list(req.strings);
      throw PeerError(PeerError::Kind::kClosed,
                      std::string(e.what()) + waited +
                          " (the process hosting the store, rank 0 or the launcher, has exited?)");
    }
    throw;
  }
}

void TcpStore::set(const std::string& key, const std::string& value) {
  call({wire::Code::kSet, 0, 0, {key, value}}, Deadline::after_seconds(60));
}

std::string TcpStore::get(const std::string& key, Deadline deadline) {
  return call({wire::Code::kGet, timeout_ms_of(deadline), 0, {key}}, deadline).strings.at(0);
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  return call({wire::Code::kAdd, 0, delta, {key}}, Deadline::after_seconds(60)).number;
}

std::string TcpStore::compare_set(const std::string& key, const std::string& expected,
                                  const std::string& desired) {
  return call({wire::Code::kCompareSet, 0, 0, {key, expected, desired}},
              Deadline::after_seconds(60))
      .strings.at(0);
}

bool TcpStore::remove(const std::string& key) {
  return call({wire::Code::kRemove, 0, 0, {key}}, Deadline::after_seconds(60)).number != 0;
}

void TcpStore::wait(const std::vector<std::string>& keys, Deadline deadline) {
  call({wire::Code::kWait, timeout_ms_of(deadline), 0, keys}, deadline);
}

bool TcpStore::check(const std::vector<std::string>& keys) {
  return call({wire::Code::kCheck, 0, 0, keys}, Deadline::after_seconds(60)).number != 0;
}

std::unique_ptr<Store> TcpStore::clone() {
  return std::make_unique<TcpStore>(server_, token_, Deadline::after_seconds(60));
}

}  // namespace loom::comm
