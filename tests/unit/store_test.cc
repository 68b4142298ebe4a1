// The rendezvous stores, the wire decoder and the authenticated handshake.
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <thread>

#include "loom/comm/communicator.h"
#include "loom/comm/net/handshake.h"
#include "loom/comm/net/socket.h"
#include "loom/comm/store/memory_store.h"
#include "loom/comm/store/prefix_store.h"
#include "loom/comm/store/tcp_store.h"
#include "loom/comm/store/wire.h"
#include "loom/core/error.h"

namespace loom::comm {
namespace {

void exercise(Store& s, Store& other) {
  s.set("a", "1");
  EXPECT_EQ(s.get("a", Deadline::after_seconds(1)), "1");
  EXPECT_EQ(s.add("n", 5), 5);
  EXPECT_EQ(other.add("n", -2), 3);
  EXPECT_EQ(s.compare_set("c", "", "x"), "x");   // missing key matches ""
  EXPECT_EQ(s.compare_set("c", "y", "z"), "x");  // mismatch leaves it
  EXPECT_EQ(s.compare_set("c", "x", "z"), "z");
  EXPECT_TRUE(s.check({"a", "c"}));
  EXPECT_FALSE(s.check({"a", "missing"}));
  EXPECT_TRUE(s.remove("a"));
  EXPECT_FALSE(s.remove("a"));
  // get blocks until another handle sets the key
  std::thread setter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    other.set("late", "v");
  });
  EXPECT_EQ(s.get("late", Deadline::after_seconds(5)), "v");
  setter.join();
  // wait times out with PeerError naming the key
  try {
    s.wait({"never"}, Deadline::after_seconds(0.2));
    FAIL() << "wait did not time out";
  } catch (const PeerError& e) {
    EXPECT_EQ(e.kind(), PeerError::Kind::kTimeout);
    EXPECT_NE(std::string(e.what()).find("never"), std::string::npos) << e.what();
  }
  // binary values survive
  std::string bin("\0\1\2\xff", 4);
  s.set("bin", bin);
  EXPECT_EQ(other.get("bin", Deadline::after_seconds(1)), bin);
}

TEST(MemoryStore, Semantics) {
  MemoryStore s;
  auto other = s.clone();
  exercise(s, *other);
}

TEST(TcpStore, Semantics) {
  TcpStoreServer server("127.0.0.1", 0, "tok");
  TcpStore a(server.address(), "tok", Deadline::after_seconds(5));
  TcpStore b(server.address(), "tok", Deadline::after_seconds(5));
  exercise(a, b);
  EXPECT_EQ(server.refused(), 0);
}

TEST(TcpStore, BindsOnlyTheGivenAddress) {
  TcpStoreServer server("127.0.0.1", 0, "tok");
  EXPECT_EQ(server.address().host, "127.0.0.1");
}

TEST(PrefixStore, Namespaces) {
  auto base = std::make_shared<MemoryStore>();
  PrefixStore p1("g1", base), p2("g2", base);
  p1.set("k", "one");
  p2.set("k", "two");
  EXPECT_EQ(p1.get("k", Deadline::after_seconds(1)), "one");
  EXPECT_EQ(base->get("g2/k", Deadline::after_seconds(1)), "two");
  auto clone = p1.clone();
  EXPECT_EQ(clone->get("k", Deadline::after_seconds(1)), "one");
}

TEST(TcpStore, WrongTokenIsRefusedAndTheJobGoesOn) {
  TcpStoreServer server("127.0.0.1", 0, "right");
  TcpStore good(server.address(), "right", Deadline::after_seconds(5));
  good.set("x", "1");
  try {
    TcpStore bad(server.address(), "wrong", Deadline::after_seconds(5));
    FAIL() << "a client with the wrong token was accepted";
  } catch (const PeerError& e) {
    EXPECT_EQ(e.kind(), PeerError::Kind::kProtocol);
    EXPECT_NE(std::string(e.what()).find("token"), std::string::npos) << e.what();
  }
  EXPECT_EQ(server.refused(), 1);
  EXPECT_EQ(good.get("x", Deadline::after_seconds(1)), "1");
}

TEST(TcpStore, GarbageAndOversizedFramesAreRefused) {
  TcpStoreServer server("127.0.0.1", 0, "tok");
  TcpStore good(server.address(), "tok", Deadline::after_seconds(5));
  {  // not a loom client at all
    net::Fd fd = net::connect_to(server.address(), Deadline::after_seconds(5), "store");
    std::string junk(200, 'G');
    net::send_all(fd.get(), junk.data(), junk.size(), Deadline::after_seconds(5), "store");
    char buf[256];
    // The server says hello, then closes once it sees the garbage.
    Deadline d = Deadline::after_seconds(5);
    ssize_t n;
    while ((n = ::recv(fd.get(), buf, sizeof buf, 0)) > 0 && !d.expired()) {
    }
    EXPECT_EQ(n, 0);
  }
  {  // authenticated, then an oversized frame: refused without allocating it
    net::Fd fd = net::connect_to(server.address(), Deadline::after_seconds(5), "store");
    net::client_handshake(fd.get(), "tok", "store", Deadline::after_seconds(5));
    uint32_t huge = 1u << 30;
    net::send_all(fd.get(), &huge, 4, Deadline::after_seconds(5), "store");
    char c;
    EXPECT_EQ(::recv(fd.get(), &c, 1, 0), 0);
  }
  {  // authenticated, then a frame whose string runs past its end
    net::Fd fd = net::connect_to(server.address(), Deadline::after_seconds(5), "store");
    net::client_handshake(fd.get(), "tok", "store", Deadline::after_seconds(5));
    wire::Message m{wire::Code::kSet, 0, 0, {"k", "v"}};
    std::string frame = wire::encode(m);
    frame[frame.size() - 5] = 100;  // the second string's length now lies
    net::send_all(fd.get(), frame.data(), frame.size(), Deadline::after_seconds(5), "store");
    char c;
    EXPECT_EQ(::recv(fd.get(), &c, 1, 0), 0);
  }
  EXPECT_EQ(server.refused(), 3);
  good.set("still", "works");
  EXPECT_EQ(good.get("still", Deadline::after_seconds(1)), "works");
}

TEST(Wire, RoundTripAndPartialInput) {
  wire::Message m{wire::Code::kCompareSet, 17, -5, {"key", "", std::string(1000, 'x')}};
  std::string f = wire::encode(m);
  wire::Message out;
  for (size_t cut = 0; cut < f.size(); ++cut) {
    auto r = wire::decode(reinterpret_cast<const uint8_t*>(f.data()), cut, 1 << 20, out);
    EXPECT_EQ(r.status, wire::Status::kNeedMore) << cut;
  }
  auto r = wire::decode(reinterpret_cast<const uint8_t*>(f.data()), f.size(), 1 << 20, out);
  ASSERT_EQ(r.status, wire::Status::kOk);
  EXPECT_EQ(r.consumed, f.size());
  EXPECT_EQ(out.code, m.code);
  EXPECT_EQ(out.timeout_ms, 17u);
  EXPECT_EQ(out.number, -5);
  EXPECT_EQ(out.strings, m.strings);
  r = wire::decode(reinterpret_cast<const uint8_t*>(f.data()), f.size(), 100, out);
  EXPECT_EQ(r.status, wire::Status::kOversized);
}

// A rank that does not know the job token cannot join the communicator's pairs.
TEST(PairHandshake, WrongTokenRankIsRefused) {
  auto store = std::make_shared<MemoryStore>();
  std::string err0, err1;
  auto rank = [&](int r, std::string token, std::string& err) {
    CommConfig c;
    c.name = "tokentest";
    c.timeout_s = 3;
    c.transport = "tcp";
    c.token = token;
    c.host_id = "h";
    try {
      auto comm = Communicator::create(store, r, 2, c);
    } catch (const std::exception& e) {
      err = e.what();
    }
  };
  std::thread t0([&] { rank(0, "right", err0); });
  std::thread t1([&] { rank(1, "wrong", err1); });
  t0.join();
  t1.join();
  EXPECT_NE(err1.find("token"), std::string::npos) << err1;
  EXPECT_NE(err0, "") << "rank 0 accepted a peer with the wrong token";
}

}  // namespace
}  // namespace loom::comm
