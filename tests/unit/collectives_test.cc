// Every collective x algorithm x dtype x reduce op, in place and out of place, on
// communicators of 1..8 thread ranks over shared memory, TCP, and two-level (virtual hosts
// of two ranks: shm inside, TCP across). Expected values are closed-form (values.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <set>
#include <thread>

#include "loom/comm/algorithms/algorithms.h"
#include "loom/comm/communicator.h"
#include "loom/comm/reduce.h"
#include "loom/comm/transport/shm/shm_pair.h"
#include "loom/comm/transport/tcp/tcp_pair.h"
#include "loom/core/cpus.h"
#include "loom/core/error.h"
#include "support/sweep.h"
#include "support/thread_ranks.h"
#include "support/values.h"

namespace loom::test {
namespace {

struct Case {
  Layout layout;
  int n;
};

class CollectiveSweep : public ::testing::TestWithParam<Case> {};

TEST_P(CollectiveSweep, ClosedFormResults) {
  Case k = GetParam();
  std::string name = std::string("sweep-") + layout_name(k.layout) + std::to_string(k.n);
  std::vector<size_t> counts{0, 1, 7, 1031, static_cast<size_t>(k.n) * 13 + 3};
  run_ranks(k.n, k.layout, name, [&](Communicator& c) {
    int wrong = sweep(c, counts, name, [](const std::string& m) { ADD_FAILURE() << m; });
    EXPECT_EQ(wrong, 0) << name << " rank " << c.rank();
  });
}

std::vector<Case> all_cases() {
  std::vector<Case> v;
  for (int n = 1; n <= 8; ++n) v.push_back({Layout::kShm, n});
  for (int n : {2, 3, 4, 5}) v.push_back({Layout::kTcp, n});
  for (int n : {4, 5, 6}) v.push_back({Layout::kHier, n});
  return v;
}

// A 4 KiB ring: the messages go round it hundreds of times, so every header slot a receiver
// polls last held an earlier lap's header, stamp or payload, and frames with an inline
// payload (up to 16 bytes), header-only frames, whole frames (payload before the stamp, up
// to 4 KiB, often wrapping here) and multi-chunk ones that wrap alternate.
TEST(ShmRing, SmallFramesAcrossManyLaps) {
  ::setenv("LOOM_SHM_RING", "4096", 1);
  for (int n : {2, 3}) {
    std::string name = "ring-laps-" + std::to_string(n);
    std::vector<size_t> counts{0, 1,    2, 3,   4,   1, 17,
                               2, 1031, 1, 300, 301, 1, static_cast<size_t>(n) * 5 + 1};
    run_ranks(n, Layout::kShm, name, [&](Communicator& c) {
      for (int round = 0; round < 3; ++round) {
        int wrong = sweep(c, counts, name, [](const std::string& m) { ADD_FAILURE() << m; });
        EXPECT_EQ(wrong, 0) << name << " rank " << c.rank() << " round " << round;
      }
    });
  }
  ::unsetenv("LOOM_SHM_RING");
}

// More ranks than cores, LOOM_SHM_FUTEX=1: a rank that has waited LOOM_FUTEX_AFTER_US for
// its one peer sleeps on the pair's futex, and the peer's next write wakes it (the counters
// see both sides).
TEST(ShmFutex, AWaitingRankSleepsAndIsWoken) {
  const int n = std::max(3, cpus_available() + 1);  // oversubscribed on any machine
  ::setenv("LOOM_SHM_FUTEX", "1", 1);
  ::setenv("LOOM_FUTEX_AFTER_US", "200", 1);
  const uint64_t slept = comm::ShmPair::futex_sleeps(), woken = comm::ShmPair::futex_wakes();
  run_ranks(n, Layout::kShm, "futex", [&](Communicator& c) {
    for (int round = 0; round < 3; ++round) {
      if (c.rank() == round % c.size()) std::this_thread::sleep_for(std::chrono::milliseconds(30));
      std::vector<float> v(1000, float(c.rank() + 1));
      c.allreduce(v.data(), v.data(), v.size(), DType::kF32, ReduceOp::kSum);
      EXPECT_EQ(v[999], float(c.size() * (c.size() + 1) / 2)) << "round " << round;
    }
  });
  ::unsetenv("LOOM_FUTEX_AFTER_US");
  ::unsetenv("LOOM_SHM_FUTEX");
  EXPECT_GT(comm::ShmPair::futex_sleeps(), slept);
  EXPECT_GT(comm::ShmPair::futex_wakes(), woken);
}

// Oversubscription counts the CPUs the host's ranks may use together, not one rank's mask:
// with each rank bound to its own CPU (as LOOM_BIND=cores, Slurm's --cpu-bind or mpirun
// --bind-to core leave them), as many ranks as CPUs are not oversubscribed; one more is.
TEST(Topology, RanksBoundToTheirOwnCpusAreNotOversubscribed) {
  const std::vector<int> cpus = cpus_allowed();
  const int n = static_cast<int>(cpus.size());
  if (n < 2) GTEST_SKIP() << "needs 2 CPUs";
  EXPECT_EQ(parse_cpu_list(format_cpu_list(cpus)), cpus);
  for (int ranks : {n, n + 1}) {
    auto store = std::make_shared<comm::MemoryStore>();
    std::vector<int> oversubscribed(ranks, -1);
    std::vector<std::thread> threads;
    for (int r = 0; r < ranks; ++r)
      threads.emplace_back([&, r] {
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(cpus[r % n], &one);
        ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);
        auto c = comm::Communicator::create(
            store, r, ranks, config_for(Layout::kShm, r, "bound" + std::to_string(ranks)));
        oversubscribed[r] = c->topology().oversubscribed;
      });
    for (auto& t : threads) t.join();
    for (int r = 0; r < ranks; ++r)
      EXPECT_EQ(oversubscribed[r], ranks > n ? 1 : 0)
          << ranks << " ranks on " << n << " CPUs, rank " << r;
  }
}

// Single copy between thread ranks: every collective message is read in place from the
// sender's buffer (plain loads: the ranks share an address space).
TEST(ReadInPlace, ThreadRanksOverSharedMemory) {
  ::setenv("LOOM_SHM_SINGLE_COPY", "1", 1);
  for (int n : {2, 3, 5}) {
    std::string name = "in-place-" + std::to_string(n);
    const uint64_t before = comm::ShmPair::bytes_read_in_place();
    std::vector<size_t> counts{0, 1, 7, 1031, static_cast<size_t>(n) * 13 + 3};
    run_ranks(n, Layout::kShm, name, [&](Communicator& c) {
      int wrong = sweep(c, counts, name, [](const std::string& m) { ADD_FAILURE() << m; });
      EXPECT_EQ(wrong, 0) << name << " rank " << c.rank();
    });
    EXPECT_GT(comm::ShmPair::bytes_read_in_place(), before)
        << name << ": the counter must move in every layout";
  }
  ::unsetenv("LOOM_SHM_SINGLE_COPY");
}

// Shared buffers (alloc_shared): every buffer of the sweep lies in one, so every message of
// LOOM_SHM_SHARED_MIN{,_ALLREDUCE}=1 byte and up between ranks of a (virtual) host is read in place
// through the receiver's own mapping; across virtual hosts it goes over TCP as before.
TEST(SharedBuffers, SweepReadsInPlace) {
  ::setenv("LOOM_SHM_SHARED_MIN", "1", 1);
  ::setenv("LOOM_SHM_SHARED_MIN_ALLREDUCE", "1", 1);
  for (auto [layout, n] :
       {std::pair{Layout::kShm, 2}, {Layout::kShm, 3}, {Layout::kShm, 5}, {Layout::kHier, 4}}) {
    std::string name = std::string("shared-") + layout_name(layout) + std::to_string(n);
    const uint64_t before = comm::ShmPair::bytes_read_in_place();
    std::vector<size_t> counts{0, 1, 7, 1031, static_cast<size_t>(n) * 13 + 3};
    run_ranks(n, layout, name, [&](Communicator& c) {
      int wrong = sweep_shared(c, counts, name, [](const std::string& m) { ADD_FAILURE() << m; });
      EXPECT_EQ(wrong, 0) << name << " rank " << c.rank();
    });
    EXPECT_GT(comm::ShmPair::bytes_read_in_place(), before)
        << name << ": the counter must move in every layout";
  }
  ::unsetenv("LOOM_SHM_SHARED_MIN");
  ::unsetenv("LOOM_SHM_SHARED_MIN_ALLREDUCE");
}

// The shared allreduce and reduce-scatter between thread ranks: every buffer is reachable
// (one address space), heap or shared, so they run fused on every call; in pieces of 64
// bytes (a block takes many, the last one short); with TCP forced they are not a valid
// choice and the sweep skips them.
TEST(SharedAllreduce, FusedPieceByPiece) {
  ::setenv("LOOM_SHARED_ALLREDUCE_PIECE", "64", 1);
  for (int n : {2, 3, 5}) {
    std::string name = "shared-allreduce-" + std::to_string(n);
    const uint64_t before = comm::algo::shared_allreduces_fused(),
                   before_rs = comm::algo::shared_reduce_scatters_fused();
    std::vector<size_t> counts{1, 7, 1031, static_cast<size_t>(n) * 13 + 3};
    run_ranks(n, Layout::kShm, name, [&](Communicator& c) {
      int wrong = sweep(c, counts, name, [](const std::string& m) { ADD_FAILURE() << m; });
      EXPECT_EQ(wrong, 0) << name << " rank " << c.rank();
    });
    EXPECT_GT(comm::algo::shared_allreduces_fused(), before) << name;
    EXPECT_GT(comm::algo::shared_reduce_scatters_fused(), before_rs) << name;
  }
  ::unsetenv("LOOM_SHARED_ALLREDUCE_PIECE");
}

// TCP send threads (LOOM_TCP_SEND_THREAD=1): every payload of the sweep is written by the
// pair's send thread while the engine receives, over TCP and two-level; then 1.2 MB
// messages (three stripes: both streams carry a thread's message) through allgather and a
// reducing allreduce.
TEST(TcpSendThread, SweepWithEveryPayloadOnTheThread) {
  ::setenv("LOOM_TCP_SEND_THREAD", "1", 1);
  for (auto [layout, n] : {std::pair{Layout::kTcp, 2}, {Layout::kTcp, 3}, {Layout::kHier, 4}}) {
    std::string name = std::string("sendthread-") + layout_name(layout) + std::to_string(n);
    const uint64_t before = comm::TcpPair::bytes_sent_by_thread();
    std::vector<size_t> counts{0, 1, 7, 1031, static_cast<size_t>(n) * 13 + 3};
    run_ranks(n, layout, name, [&](Communicator& c) {
      int wrong = sweep(c, counts, name, [](const std::string& m) { ADD_FAILURE() << m; });
      EXPECT_EQ(wrong, 0) << name << " rank " << c.rank();
      const size_t count = 300000;
      const size_t ranks = static_cast<size_t>(c.size());  // (clang captures no bindings)
      std::vector<float> mine(count), all(count * ranks), sum(count);
      for (size_t i = 0; i < count; ++i) mine[i] = static_cast<float>(c.rank() * 8 + i % 7);
      c.allgather(mine.data(), all.data(), count, DType::kF32);
      c.allreduce(mine.data(), sum.data(), count, DType::kF32, ReduceOp::kSum);
      for (size_t i = 0; i < count * ranks; ++i)
        if (all[i] != static_cast<float>(i / count * 8 + i % count % 7)) {
          ADD_FAILURE() << name << " rank " << c.rank() << ": allgather element " << i;
          break;
        }
      for (size_t i = 0; i < count; ++i)
        if (sum[i] != static_cast<float>(4 * ranks * (ranks - 1) + ranks * (i % 7))) {
          ADD_FAILURE() << name << " rank " << c.rank() << ": allreduce element " << i;
          break;
        }
    });
    EXPECT_GT(comm::TcpPair::bytes_sent_by_thread(), before)
        << name << ": the counter must move in every layout";
  }
  ::unsetenv("LOOM_TCP_SEND_THREAD");
}

// Non-temporal copies (LOOM_STREAMING_COPY_MIN=1: every operation streams its plain copies
// of 64 KiB and up — receives and own blocks copied in the background): the sweep over the
// shm rings (70001 elements: several chunks per message, odd block boundaries), shared
// buffers read in place, TCP and two levels. Under AddressSanitizer the 70001-element heap
// messages run on shm 2 and TCP 2 only (the chunked ring and socket paths, one thread per
// rank), shm 3 and two levels stream 17001-element ones (past 64 KiB in 4- and 8-byte types):
// each such buffer is a fresh mmap there, and the four layouts with 70001 took 260-320 s of
// the sanitizer pass (16.6 s in Release); the release pass runs every layout with them.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAsan = true;
#else
constexpr bool kAsan = false;
#endif
TEST(StreamingCopies, SweepWithEveryMessageStreamed) {
  ::setenv("LOOM_STREAMING_COPY_MIN", "1", 1);
  ::setenv("LOOM_SHM_SHARED_MIN", "1", 1);
  ::setenv("LOOM_SHM_SHARED_MIN_ALLREDUCE", "1", 1);
  for (auto [layout, n] :
       {std::pair{Layout::kShm, 2}, {Layout::kShm, 3}, {Layout::kTcp, 2}, {Layout::kHier, 4}}) {
    std::string name = std::string("streaming-") + layout_name(layout) + std::to_string(n);
    const uint64_t before = comm::bytes_streamed();
    std::vector<size_t> counts{0, 1, 7, 1031, static_cast<size_t>(n) * 13 + 3};
    std::vector<size_t> heap_counts = counts;
    // several ring chunks per message; under ASan, on 3 ranks and more, just past 64 KiB
    heap_counts.push_back(!kAsan || n == 2 ? 70001 : 17001);
    run_ranks(n, layout, name, [&](Communicator& c) {
      int wrong = sweep(c, heap_counts, name, [](const std::string& m) { ADD_FAILURE() << m; });
      wrong += sweep_shared(c, counts, name, [](const std::string& m) { ADD_FAILURE() << m; });
      EXPECT_EQ(wrong, 0) << name << " rank " << c.rank();
    });
    EXPECT_GT(comm::bytes_streamed(), before) << name << ": the counter must move in every layout";
  }
  ::unsetenv("LOOM_STREAMING_COPY_MIN");
  ::unsetenv("LOOM_SHM_SHARED_MIN");
  ::unsetenv("LOOM_SHM_SHARED_MIN_ALLREDUCE");
}

// copy_streaming equals memcpy at every alignment of source and destination and every
// length around the line size, and leaves the bytes around the destination alone.
TEST(StreamingCopies, EqualsMemcpyAtEveryAlignment) {
  std::vector<unsigned char> src(4096 + 128), dst(4096 + 256);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 7 + 3);
  for (size_t so = 0; so < 64; so += 5)
    for (size_t d_off = 0; d_off < 64; d_off += 3)
      for (size_t len : {0, 1, 63, 64, 65, 127, 128, 200, 1000, 4096}) {
        std::fill(dst.begin(), dst.end(), 0xEE);
        comm::copy_streaming(dst.data() + 64 + d_off, src.data() + so, len);
        for (size_t i = 0; i < dst.size(); ++i) {
          const bool inside = i >= 64 + d_off && i < 64 + d_off + len;
          const unsigned char want = inside ? src[so + i - 64 - d_off] : 0xEE;
          ASSERT_EQ(dst[i], want) << "src +" << so << " dst +" << d_off << " len " << len
                                  << " byte " << i;
        }
      }
}

// reduce_streaming gives reduce_into's bits for every dtype and op, at every alignment of
// the destination, lengths around its 1 KiB pieces, and with dst aliasing an operand.
TEST(StreamingCopies, ReduceEqualsReduceIntoForEveryDtypeAndOp) {
  for (int t = 0; t < static_cast<int>(DType::kCount); ++t)
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax}) {
      const auto dtype = static_cast<DType>(t);
      const size_t es = dtype_size(dtype);
      std::vector<unsigned char> a(5000 * es), b(a.size());
      for (size_t i = 0; i < 5000; ++i) {  // floats get fractions, so bf16/f16 round
        const double frac = dtype_is_float(dtype) ? (i % 7) * 0.3 : 0;
        store(dtype, a.data(), i, input_value(op, 0, i) + frac);
        store(dtype, b.data(), i, input_value(op, 1, i) + frac);
      }
      for (size_t d_off = 0; d_off < 64; d_off += es * 3)
        for (size_t count :
             std::initializer_list<size_t>{0, 1, 100, 1024 / es + 31, 2048 / es, 3000, 5000}) {
          std::vector<unsigned char> want(a.size() + 64, 0xEE), got(want);
          comm::reduce_into(want.data() + d_off, a.data(), b.data(), count, dtype, op);
          comm::reduce_streaming(got.data() + d_off, a.data(), b.data(), count, dtype, op);
          ASSERT_EQ(got, want) << dtype_name(dtype) << " " << reduce_op_name(op) << " dst +"
                               << d_off << " count " << count;
          std::vector<unsigned char> in_place(a);  // dst == a
          comm::reduce_streaming(in_place.data(), in_place.data(), b.data(), count, dtype, op);
          ASSERT_EQ(0, std::memcmp(in_place.data(), want.data() + d_off, count * es))
              << dtype_name(dtype) << " " << reduce_op_name(op) << " in place, count " << count;
        }
    }
}

// A large reduce_scatter out of place writes its reductions with streaming stores (it has no
// plain copies, so the counter moves only through them); in place it keeps plain stores.
TEST(StreamingCopies, ReductionsStreamOutOfPlaceOnly) {
  ::setenv("LOOM_STREAMING_COPY_MIN", "1", 1);
  const size_t count = 1 << 16;  // 256 KiB per rank's block
  for (bool in_place : {false, true}) {
    std::atomic<uint64_t> streamed{0};
    run_ranks(2, Layout::kShm, in_place ? "rs-stream-inplace" : "rs-stream", [&](Communicator& c) {
      std::vector<float> in(2 * count), out(count);
      for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i % 97 + c.rank());
      float* dst = in_place ? in.data() + c.rank() * count : out.data();
      c.barrier();
      const uint64_t before = comm::bytes_streamed();
      c.reduce_scatter(in.data(), dst, count, DType::kF32, ReduceOp::kSum);
      if (c.rank() == 0) streamed = comm::bytes_streamed() - before;
      c.barrier();
      for (size_t i = 0; i < count; ++i)
        ASSERT_EQ(dst[i], static_cast<float>(2 * ((c.rank() * count + i) % 97) + 1)) << i;
    });
    if (in_place)
      EXPECT_EQ(streamed.load(), 0u);
    else
      EXPECT_GT(streamed.load(), 0u);
  }
  ::unsetenv("LOOM_STREAMING_COPY_MIN");
}

// A send the thread is writing when its deadline passes (the receiver never receives, and
// 64 MiB do not fit the sockets' buffers): the send fails with the timeout, and the thread
// lets go of the buffer, which is freed at once (ASan would see a later read). The receiver
// stays connected until the sender has seen its send fail (a fixed sleep was too short under
// ThreadSanitizer, where filling the 64 MiB alone can take longer: a broken pipe instead).
TEST(TcpSendThread, ATimedOutSendLetsGoOfItsBuffer) {
  ::setenv("LOOM_TCP_SEND_THREAD", "1", 1);
  std::atomic<bool> send_ended{false};
  run_ranks(2, Layout::kTcp, "sendthread-timeout", [&](Communicator& c) {
    if (c.rank() == 1) {  // receives nothing, and stays connected meanwhile
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      while (!send_ended.load() && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      return;
    }
    auto buf = std::make_unique<std::vector<std::byte>>(64 << 20, std::byte{1});
    try {
      c.send(buf->data(), buf->size(), DType::kU8, 1, OpOptions{comm::Algo::kAuto, 0.5});
      ADD_FAILURE() << "a 64 MiB send nobody receives returned";
    } catch (const PeerError& e) {
      EXPECT_NE(std::string(e.what()).find("timed out"), std::string::npos) << e.what();
    }
    send_ended = true;
    buf.reset();
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  });
  ::unsetenv("LOOM_TCP_SEND_THREAD");
}

// allgather_shared on thread ranks: one machine buffer per (virtual) host, mapped again by
// every rank of it but the first; over shm, TCP on one host, and two-level.
TEST(AllgatherShared, ClosedFormRoundAfterRound) {
  for (auto [layout, n] : {std::pair{Layout::kShm, 1},
                           {Layout::kShm, 2},
                           {Layout::kShm, 3},
                           {Layout::kShm, 4},
                           {Layout::kTcp, 2},
                           {Layout::kHier, 4},
                           {Layout::kHier, 5}}) {
    std::string name = std::string("gather-shared-") + layout_name(layout) + std::to_string(n);
    run_ranks(n, layout, name, [&](Communicator& c) {
      int wrong = sweep_allgather_shared(c, name, [](const std::string& m) { ADD_FAILURE() << m; });
      EXPECT_EQ(wrong, 0) << name << " rank " << c.rank();
    });
  }
}

// Misuse is named: a buffer too small or holding the input, and ranks of one machine that
// gather into different buffers: every rank fails at once, naming them (3 ranks, one of
// which names another buffer: its two peers cannot both notice in the barrier's messages,
// the abort reaches the other).
TEST(AllgatherShared, MisuseIsNamed) {
  run_ranks(3, Layout::kShm, "gather-shared-misuse", [&](Communicator& c) {
    comm::MachineBuffer a = c.alloc_machine_buffer(3 * 100 * sizeof(float));
    comm::MachineBuffer b = c.alloc_machine_buffer(3 * 100 * sizeof(float));
    EXPECT_EQ(a.sharers(), 3);
    EXPECT_NE(a.id(), b.id());
    std::vector<float> in(101, 1.0f);
    EXPECT_THROW(c.allgather_shared(in.data(), a, 101, DType::kF32), UserError);
    EXPECT_THROW(c.allgather_shared(a.as<float>() + 100, a, 100, DType::kF32), UserError);
    const auto t0 = std::chrono::steady_clock::now();
    try {
      c.allgather_shared(in.data(), c.rank() == 2 ? b : a, 100, DType::kF32);
      ADD_FAILURE() << "different buffers not noticed on rank " << c.rank();
    } catch (const PeerError& e) {
      EXPECT_NE(std::string(e.what()).find("different machine buffers"), std::string::npos)
          << e.what();
    }
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20));  // deadline 60
  });
}

INSTANTIATE_TEST_SUITE_P(Layouts, CollectiveSweep, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return std::string(layout_name(info.param.layout)) + "_n" +
                                  std::to_string(info.param.n);
                         });

}  // namespace
}  // namespace loom::test
