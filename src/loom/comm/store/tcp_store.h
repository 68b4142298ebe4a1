// The TCP store: a server (hosted by rank 0 or by `loom run`) and its client.
// Each connection authenticates with the job token (net/handshake.h) before any request.
// The server runs one thread per client connection; blocking requests (get, wait) block
// only that connection's thread. Malformed or oversized frames close that connection
// and are logged; the rest of the job is not disturbed.
#pragma once

#include <atomic>
#include <list>
#include <memory>
#include <mutex>
#include <thread>

#include "loom/comm/net/socket.h"
#include "loom/comm/store/memory_store.h"
#include "loom/comm/store/store.h"
#include "loom/comm/store/wire.h"

namespace loom::comm {

class TcpStoreServer {
 public:
  // Binds exactly host:port (port 0 = any free port).
  TcpStoreServer(const std::string& host, uint16_t port, std::string token);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  net::HostPort address() const { return address_; }
  // Connections refused (bad token, malformed or oversized frames) so far; for tests.
  int refused() const { return refused_.load(); }

 private:
  struct Conn {
    net::Fd fd;
    std::thread thread;
    std::atomic<bool> done{false};
  };
  void accept_loop();
  void serve(Conn& conn);
  wire::Message execute(const wire::Message& req);
  void reap_finished();

  std::string token_;
  net::Fd listen_;
  net::HostPort address_;
  std::shared_ptr<MemoryStore::Table> table_;
  MemoryStore local_;
  std::atomic<bool> stop_{false};
  std::atomic<int> refused_{0};
  std::mutex conns_mu_;
  std::list<Conn> conns_;
  std::thread acceptor_;
};

class TcpStore : public Store {
 public:
  TcpStore(net::HostPort server, std::string token, Deadline connect_deadline);

  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, Deadline deadline) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired) override;
  bool remove(const std::string& key) override;
  void wait(const std::vector<std::string>& keys, Deadline deadline) override;
  bool check(const std::vector<std::string>& keys) override;
  std::unique_ptr<Store> clone() override;

  std::string local_host() const override { return net::local_address(fd_.get()).host; }

 private:
  wire::Message call(const wire::Message& req, Deadline deadline);

  net::HostPort server_;
  std::string token_;
  std::mutex mu_;
  net::Fd fd_;
};

}  // namespace loom::comm
