// loom's etcd v3 client (launch/etcd.h) against a real etcd server (Debian etcd-server 3.4,
// started here on loopback ports in a scratch data dir): keys and values with any bytes,
// prefixes in order, create-if-absent, compare-and-swap, deletes, leases that expire
// unless kept alive, watches, https with client certificates the test makes, and the
// errors of an endpoint nobody serves.
#include "loom/launch/etcd.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "loom/core/error.h"
#include "support/etcd_server.h"

namespace loom::launch {
namespace {
using test::EtcdServer;

EtcdServer& server() {
  static EtcdServer s;
  return s;
}

TEST(Etcd, KeysValuesAndPrefixes) {
  Etcd e(server().url());
  const std::string bytes("a\0b\xff\x80z", 6);  // any bytes, in keys and values
  e.put("kv/x" + bytes, bytes);
  e.put("kv/a", "1");
  e.put("kv/b", "2");
  e.put("kw", "outside the prefix");
  auto got = e.get("kv/x" + bytes);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->value, bytes);
  EXPECT_FALSE(e.get("kv/none").has_value());
  int64_t rev = 0;
  auto all = e.get_prefix("kv/", &rev);
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[0].key, "kv/a");
  EXPECT_EQ(all[1].key, "kv/b");
  EXPECT_EQ(all[2].key, "kv/x" + bytes);
  EXPECT_GE(rev, all[2].mod_revision);
  EXPECT_EQ(e.erase("kv/a"), 1);
  EXPECT_EQ(e.erase("kv/a"), 0);
  EXPECT_EQ(e.erase_prefix("kv/"), 2);
  EXPECT_TRUE(e.get_prefix("kv/").empty());
  EXPECT_TRUE(e.get("kw").has_value());
}

TEST(Etcd, CreateIfAbsentAndCompareAndSwap) {
  Etcd e(server().url());
  EXPECT_TRUE(e.create("c/k", "first"));
  EXPECT_FALSE(e.create("c/k", "second"));
  EXPECT_EQ(e.get("c/k")->value, "first");
  EXPECT_FALSE(e.compare_and_swap("c/k", "second", "third"));
  EXPECT_TRUE(e.compare_and_swap("c/k", "first", "third"));
  EXPECT_EQ(e.get("c/k")->value, "third");
}

TEST(Etcd, LeasedKeysVanishUnlessKeptAlive) {
  Etcd e(server().url());
  const int64_t kept = e.grant(2), dropped = e.grant(2), revoked = e.grant(30);
  ASSERT_NE(kept, 0);
  e.put("l/kept", "1", kept);
  e.put("l/dropped", "1", dropped);
  e.put("l/revoked", "1", revoked);
  EXPECT_EQ(e.get("l/kept")->lease, kept);
  e.revoke(revoked);
  EXPECT_FALSE(e.get("l/revoked").has_value());
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < until) {
    EXPECT_GT(e.keep_alive(kept), 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(400));
  }
  EXPECT_TRUE(e.get("l/kept").has_value());
  EXPECT_FALSE(e.get("l/dropped").has_value());  // 2 s lease, 5 s without a refresh
  EXPECT_LE(e.keep_alive(dropped), 0);
}

TEST(Etcd, WatchReturnsChangesAfterARevision) {
  Etcd e(server().url());
  int64_t rev = 0;
  e.get_prefix("w/", &rev);
  // Nothing changes: empty after the timeout.
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(e.watch_prefix("w/", rev + 1, 0.5).empty());
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(400));
  // A put from another thread wakes the watch.
  std::thread writer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    Etcd(server().url()).put("w/new", "v");
  });
  auto events = e.watch_prefix("w/", rev + 1, 10);
  writer.join();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_FALSE(events[0].deleted);
  EXPECT_EQ(events[0].kv.key, "w/new");
  EXPECT_EQ(events[0].kv.value, "v");
  // From the same revision again: the change is not missed after the fact.
  EXPECT_EQ(e.watch_prefix("w/", rev + 1, 5).size(), 1u);
  e.erase("w/new");
  events = e.watch_prefix("w/", events[0].kv.mod_revision + 1, 5);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_TRUE(events[0].deleted);
}

TEST(Etcd, UnreachableEndpointAndBadUrl) {
  Etcd e("http://127.0.0.1:1", {}, 2);  // nothing listens on port 1
  try {
    e.put("k", "v");
    FAIL() << "expected PeerError";
  } catch (const PeerError& err) {
    EXPECT_NE(std::string(err.what()).find("etcd at http://127.0.0.1:1"), std::string::npos)
        << err.what();
  }
  EXPECT_THROW(Etcd("127.0.0.1:2379"), UserError);
}

// https with client certificates (etcd --client-cert-auth): the client with the CA and its
// certificate works; without its certificate, or without the CA, it is refused.
TEST(Etcd, TlsWithClientCertificates) {
  EtcdServer tls_server(/*tls=*/true);
  Etcd e(tls_server.url(), tls_server.tls());
  e.put("tls/k", "v");
  EXPECT_EQ(e.get("tls/k")->value, "v");
  EtcdTls no_cert{tls_server.tls().ca_file, "", ""};
  EXPECT_THROW(Etcd(tls_server.url(), no_cert, 5).get("tls/k"), PeerError);
  EtcdTls no_ca{"", tls_server.tls().cert_file, tls_server.tls().key_file};
  EXPECT_THROW(Etcd(tls_server.url(), no_ca, 5).get("tls/k"), PeerError);
  EXPECT_THROW(Etcd("http" + tls_server.url().substr(5), {}, 5).get("tls/k"), PeerError);
}

TEST(Etcd, PrefixEnd) {
  EXPECT_EQ(etcd_prefix_end("a/"), "a0");
  EXPECT_EQ(etcd_prefix_end(std::string("a\xff", 2)), "b");
}

// A 3-member cluster: calls move to the next member when the one in use dies (and say so),
// go on while a majority lives, and name the quorum's loss when only one member is left.
TEST(EtcdCluster, CallsMoveOnAndQuorumLossIsNamed) {
  test::EtcdCluster cluster(3);
  Etcd e(cluster.urls(), {}, 3);
  e.put("q/k", "1");
  EXPECT_EQ(e.endpoint(), cluster.url(0));

  cluster.kill(0);  // the member in use
  testing::internal::CaptureStderr();
  e.put("q/k", "2");
  const std::string said = testing::internal::GetCapturedStderr();
  std::printf("member 0 killed: %s", said.c_str());
  EXPECT_NE(e.endpoint(), cluster.url(0));
  EXPECT_NE(said.find("now using " + e.endpoint()), std::string::npos) << said;
  EXPECT_EQ(e.get("q/k")->value, "2");

  // Then the leader of the two left (if member 0 led, a new one was elected).
  int leader = -1;
  for (int t = 0; t < 100 && leader < 0; ++t) {
    leader = cluster.leader();
    if (leader < 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_GT(leader, 0);
  cluster.kill(leader);
  const int alive = 3 - leader;  // 1 or 2
  try {
    e.put("q/k", "3");
    FAIL() << "a write with 1 of 3 members alive succeeded";
  } catch (const EtcdUnavailable& err) {
    const std::string what = err.what();
    std::printf("with 1 of 3 members: %s\n", what.c_str());
    EXPECT_TRUE(err.quorum_lost()) << what;
    EXPECT_NE(
        what.find("etcd has lost its quorum: " + cluster.url(alive) + " answers without a leader"),
        std::string::npos)
        << what;
    EXPECT_NE(what.find(cluster.url(0)), std::string::npos) << what;
    EXPECT_NE(what.find(cluster.url(leader)), std::string::npos) << what;
  }

  // A majority back: the same client serves again.
  cluster.start(leader);
  cluster.wait_ready(leader);
  e.put("q/k", "4");
  EXPECT_EQ(e.get("q/k")->value, "4");
  cluster.start(0);
}

}  // namespace
}  // namespace loom::launch
