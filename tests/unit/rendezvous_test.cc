// The multi-machine rendezvous (launch/rendezvous.h) against a real etcd server: machines
// (threads here, and a killed process for a dead one) agree on one membership, the last
// call freezes at MIN, a late machine waits and is admitted by the next round, a machine
// killed without a word is noticed when its lease expires, records signed with another
// token are ignored, a failure reaches every machine, and a finished job leaves no keys.
#include "loom/launch/rendezvous.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <memory>
#include <thread>
#include <vector>

#include "loom/core/error.h"
#include "loom/launch/etcd.h"
#include "support/etcd_server.h"

namespace loom::launch {
namespace {
using Clock = std::chrono::steady_clock;

test::EtcdServer& server() {
  static test::EtcdServer s;
  return s;
}

const std::string kToken = "0123456789abcdef0123456789abcdef";

RendezvousOptions options(const std::string& job, int min_nodes, int max_nodes,
                          double last_call_s = 1, const std::string& token = kToken) {
  RendezvousOptions o;
  o.job = job;
  o.min_nodes = min_nodes;
  o.max_nodes = max_nodes;
  o.last_call_s = last_call_s;
  o.join_timeout_s = 30;
  o.lease_ttl_s = 3;
  o.keepalive_s = 1;
  o.token = token;
  return o;
}

NodeInfo node(const std::string& host, int nproc = 1) {
  static int next_port = 1000;
  NodeInfo n;
  n.host = host;
  n.addr = "10.0.0." + std::to_string(host.back() - 'a' + 1);
  n.id = host + "-" + std::to_string(next_port);
  n.nproc = nproc;
  n.store_port = ++next_port;
  n.torch_port = ++next_port;
  return n;
}

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

TEST(Rendezvous, MachinesAgreeOnOneMembership) {
  // Three machines with 1, 2 and 3 ranks, arriving in reverse host order.
  const RendezvousOptions o = options("agree", 2, 3, 30);
  Rendezvous rc(server().url(), {}, o), rb(server().url(), {}, o), ra(server().url(), {}, o);
  auto fc = std::async(std::launch::async, [&] { return rc.join(node("c", 3)); });
  auto fb = std::async(std::launch::async, [&] { return rb.join(node("b", 2)); });
  auto fa = std::async(std::launch::async, [&] { return ra.join(node("a", 1)); });
  const auto start = Clock::now();
  std::vector<Membership> ms = {fa.get(), fb.get(), fc.get()};
  EXPECT_LT(seconds_since(start), 10) << "MAX machines in: no last call needed";
  for (int i = 0; i < 3; ++i) {
    const Membership& m = ms[i];
    EXPECT_EQ(m.round, 0);
    ASSERT_EQ(m.nodes.size(), 3u);
    EXPECT_EQ(m.hosts(), "a, b, c");
    EXPECT_EQ(m.node_rank, i);
    EXPECT_EQ(m.world_size(), 6);
    EXPECT_EQ(m.nodes[2].store_port, ms[2].nodes[2].store_port);
  }
  EXPECT_EQ(ms[0].rank_offset(), 0);
  EXPECT_EQ(ms[1].rank_offset(), 1);
  EXPECT_EQ(ms[2].rank_offset(), 3);
  EXPECT_FALSE(ra.watch(ms[0], 0)) << "nothing changed";
}

TEST(Rendezvous, MachinesStartingUpTo10SecondsApartFormOneJob) {
  // --nnodes 2:3 with the default last call (10 s): b comes 4 s after a, c 4 s after b; the
  // last call, started when b made MIN, is still open when c comes, and MAX freezes it.
  RendezvousOptions o = options("apart", 2, 3, 10);
  Rendezvous ra(server().url(), {}, o), rb(server().url(), {}, o), rc(server().url(), {}, o);
  const auto start = Clock::now();
  auto fa = std::async(std::launch::async, [&] { return ra.join(node("a")); });
  std::this_thread::sleep_for(std::chrono::seconds(4));
  auto fb = std::async(std::launch::async, [&] { return rb.join(node("b")); });
  std::this_thread::sleep_for(std::chrono::seconds(4));
  const Membership mc = rc.join(node("c"));
  EXPECT_EQ(mc.hosts(), "a, b, c");
  EXPECT_EQ(fa.get().hosts(), "a, b, c");
  EXPECT_EQ(fb.get().round, 0);
  EXPECT_LT(seconds_since(start), 10) << "MAX in: frozen at once, not at the last call's end";
}

TEST(Rendezvous, LastCallFreezesAtMinAndALateMachineWaitsForTheNextRound) {
  const RendezvousOptions o = options("late", 2, 3, 1.5);
  Rendezvous ra(server().url(), {}, o), rb(server().url(), {}, o), rc(server().url(), {}, o);
  const auto start = Clock::now();
  auto fa = std::async(std::launch::async, [&] { return ra.join(node("a")); });
  const Membership mb = rb.join(node("b"));
  const Membership ma = fa.get();
  EXPECT_GE(seconds_since(start), 1.4) << "froze before the last call ended";
  EXPECT_EQ(mb.hosts(), "a, b");
  EXPECT_EQ(ma.node_rank, 0);

  // c arrives after the freeze: it waits, and the running machines see it waiting.
  auto fc = std::async(std::launch::async, [&] { return rc.join(node("c")); });
  Change ch;
  for (int i = 0; i < 40 && !ch; ++i) ch = ra.watch(ma, 0.5);
  EXPECT_EQ(ch.kind, Change::kJoinerWaiting);
  EXPECT_EQ(ch.detail, "c");
  EXPECT_EQ(fc.wait_for(std::chrono::milliseconds(0)), std::future_status::timeout);
  // They stop and meet again: round 1 admits it (MAX in, no last call).
  ra.next_round(ma);
  rb.next_round(mb);  // a no-op: a moved it already
  auto fb2 = std::async(std::launch::async, [&] { return rb.join(node("b")); });
  const Membership ma2 = ra.join(node("a"));
  EXPECT_EQ(ma2.round, 1);
  EXPECT_EQ(ma2.hosts(), "a, b, c");
  EXPECT_EQ(fb2.get().node_rank, 1);
  EXPECT_EQ(fc.get().node_rank, 2);
  EXPECT_EQ(rb.watch(ma2, 0).kind, Change::kNone) << "c's waiting key is of round 0";
}

TEST(Rendezvous, AKilledMachineIsNoticedWhenItsLeaseExpires) {
  const RendezvousOptions o = options("killed", 2, 2);
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = fork();
  if (child == 0) {  // machine b, in a process of its own: joins, then is killed
    try {
      Rendezvous rb(server().url(), {}, o);
      rb.join(node("b"));
      if (write(ready[1], "x", 1) != 1) _exit(3);
      pause();
    } catch (...) {
      _exit(4);
    }
    _exit(0);
  }
  Rendezvous ra(server().url(), {}, o);
  const Membership m = ra.join(node("a"));
  char c;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  EXPECT_EQ(m.hosts(), "a, b");
  EXPECT_FALSE(ra.watch(m, 0.5));
  kill(child, SIGKILL);  // no revoke: only the lease's expiry tells
  waitpid(child, nullptr, 0);
  const auto killed = Clock::now();
  Change ch;
  while (!ch && seconds_since(killed) < 20) ch = ra.watch(m, 1);
  EXPECT_EQ(ch.kind, Change::kMemberLost);
  EXPECT_EQ(ch.detail, "b");
  EXPECT_LE(seconds_since(killed), o.lease_ttl_s + 2.5);
  close(ready[0]);
  close(ready[1]);
}

TEST(Rendezvous, ALeaseEtcdNoLongerHasIsReplacedWhenTheMachineJoins) {
  // A machine cut off from etcd for longer than its lease's TTL finds its lease gone when
  // it reaches etcd again (seen in the cross-machine campaign: "requested lease not found"
  // ended the launcher). Revoked here from outside, the join right after (before the
  // keep-alive thread's next beat) must take a new lease and join.
  const RendezvousOptions o = options("lease-gone", 1, 1);
  Rendezvous ra(server().url(), {}, o);
  const int64_t old = ra.lease();
  Etcd(server().url()).revoke(old);
  const Membership m = ra.join(node("a"));
  EXPECT_EQ(m.hosts(), "a");
  EXPECT_NE(ra.lease(), old);
  EXPECT_FALSE(ra.watch(m, 1.5)) << "the new lease is kept alive";
}

TEST(Rendezvous, RecordsSignedWithAnotherTokenAreIgnored) {
  // b was given another token: a and c meet without it, and b cannot join their round.
  RendezvousOptions o = options("forged", 2, 3, 1);
  o.join_timeout_s = 4;
  RendezvousOptions other = options("forged", 3, 3, 1, std::string(32, 'x'));
  other.join_timeout_s = 10;
  Rendezvous rb(server().url(), {}, other);
  auto fb = std::async(std::launch::async, [&] { return rb.join(node("b")); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  // And a record written straight into etcd, as anyone with write access could.
  Etcd(server().url()).put("/loom/forged/r0/members/z", R"({"body":{"host":"z"},"sig":"00"})");
  Rendezvous ra(server().url(), {}, o), rc(server().url(), {}, o);
  auto fc = std::async(std::launch::async, [&] { return rc.join(node("c")); });
  const Membership m = ra.join(node("a"));
  EXPECT_EQ(m.hosts(), "a, c");
  EXPECT_EQ(fc.get().hosts(), "a, c");
  // b fails at once, loudly, when the round freezes under a signature it cannot check.
  const auto frozen = Clock::now();
  try {
    fb.get();
    FAIL() << "b joined a job whose token it does not have";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("frozen by launchers with another job token"),
              std::string::npos)
        << e.what();
  }
  EXPECT_LT(seconds_since(frozen), 3);
}

TEST(Rendezvous, AJoinThatCannotReachMinTimesOutNamingWhoIsIn) {
  RendezvousOptions o = options("alone", 2, 2);
  o.join_timeout_s = 1.5;
  Rendezvous ra(server().url(), {}, o);
  try {
    ra.join(node("a"));
    FAIL() << "joined alone with --nnodes 2";
  } catch (const PeerError& e) {
    EXPECT_EQ(e.kind(), PeerError::Kind::kTimeout);
    EXPECT_NE(std::string(e.what()).find("1 of --nnodes 2:2 machines joined round 0"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("(in: a)"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Rendezvous(server().url(), {}, options("bad", 3, 2)), UserError);
  EXPECT_THROW(Rendezvous(server().url(), {}, options("a/b", 1, 2)), UserError);
}

TEST(Rendezvous, AFailureReachesEveryMachineAndAFinishedJobLeavesNoKeys) {
  const RendezvousOptions o = options("fin", 3, 3);
  Rendezvous ra(server().url(), {}, o), rc(server().url(), {}, o);
  auto rb = std::make_unique<Rendezvous>(server().url(), EtcdTls{}, o);
  auto meet = [&] {
    auto fb = std::async(std::launch::async, [&] { return rb->join(node("b")); });
    auto fc = std::async(std::launch::async, [&] { return rc.join(node("c")); });
    Membership ma = ra.join(node("a"));
    return std::vector<Membership>{ma, fb.get(), fc.get()};
  };
  std::vector<Membership> m = meet();
  rb->fail(m[1], "b: rank 1 exited with code 2 (bad input)");
  const Change ch = ra.watch(m[0], 0);
  EXPECT_EQ(ch.kind, Change::kJobFailed);
  EXPECT_EQ(ch.detail, "b: rank 1 exited with code 2 (bad input)");

  // Rerun under the same id: the failed round is left behind.
  m = meet();
  EXPECT_EQ(m[0].round, 1);
  EXPECT_FALSE(ra.watch(m[0], 0));
  // b finishes and its launcher exits (its lease revoked): finished, not lost.
  rb->finish(m[1]);
  rb.reset();
  EXPECT_FALSE(ra.watch(m[0], 0)) << "a machine that finished was taken for lost";
  // Node 0 hosts the store: it waits for c, then removes the job's keys.
  auto finished_a = std::async(std::launch::async, [&] { ra.finish(m[0]); });
  EXPECT_EQ(finished_a.wait_for(std::chrono::milliseconds(500)), std::future_status::timeout)
      << "node 0 did not wait for the other machines";
  rc.finish(m[2]);
  finished_a.get();
  EXPECT_TRUE(Etcd(server().url()).get_prefix("/loom/fin/").empty());
}

TEST(Rendezvous, OverTlsWithClientCertificates) {
  // etcds://: https only, client certificates required (made by the test with openssl).
  test::EtcdServer tls(/*tls=*/true);
  const RendezvousOptions o = options("tls", 2, 2);
  Rendezvous ra(tls.url(), tls.tls(), o), rb(tls.url(), tls.tls(), o);
  auto fb = std::async(std::launch::async, [&] { return rb.join(node("b")); });
  const Membership m = ra.join(node("a"));
  EXPECT_EQ(m.hosts(), "a, b");
  EXPECT_EQ(fb.get().node_rank, 1);
  // Without the client certificate the launcher cannot even take its lease.
  EXPECT_THROW(Rendezvous(tls.url(), EtcdTls{tls.tls().ca_file, "", ""}, o), PeerError);
  // The keep-alive thread uses the certificates too: the lease outlives its TTL.
  std::this_thread::sleep_for(std::chrono::seconds(o.lease_ttl_s + 1));
  EXPECT_FALSE(ra.watch(m, 0)) << "a lease expired: the keep-alive failed over TLS";
}

}  // namespace
}  // namespace loom::launch
