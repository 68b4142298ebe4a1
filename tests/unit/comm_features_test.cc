// Communicator behaviour beyond single results: async handles in flight together,
// split communicators running concurrently with their parent, point-to-point, deadlines,
// a broken communicator after a failure, desync detection, Work::wait with a deadline.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <numeric>

#include "loom/comm/communicator.h"
#include "loom/core/error.h"
#include "support/thread_ranks.h"

namespace loom::test {
namespace {

using comm::Communicator;
using comm::OpOptions;
using comm::ReduceOp;
using comm::WorkPtr;

class Features : public ::testing::TestWithParam<Layout> {};

TEST_P(Features, ManyAsyncOpsInFlightOnParentAndSplits) {
  const int n = 4;
  run_ranks(n, GetParam(), "async", [&](Communicator& c) {
    const int r = c.rank();
    auto pairs = c.split(r / 2, r);  // {0,1} and {2,3}
    auto odd = c.split(r % 2 ? 1 : -1, 0);
    ASSERT_EQ(pairs->size(), 2);
    EXPECT_EQ(odd == nullptr, r % 2 == 0);
    const size_t count = 50001;
    std::vector<std::vector<float>> bufs(6, std::vector<float>(count));
    std::vector<WorkPtr> works;
    for (int k = 0; k < 6; ++k) {
      std::fill(bufs[k].begin(), bufs[k].end(), float((r + 1) * (k + 1)));
      Communicator& target = k % 2 ? *pairs : c;
      works.push_back(target.allreduce_async(bufs[k].data(), bufs[k].data(), count, DType::kF32,
                                             ReduceOp::kSum));
    }
    float odd_sum = 0;
    WorkPtr ow;
    float mine = float(r);
    if (odd) ow = odd->allreduce_async(&mine, &odd_sum, 1, DType::kF32, ReduceOp::kSum);
    for (auto& w : works) w->wait(Deadline::after_seconds(30));
    if (ow) ow->wait();
    for (int k = 0; k < 6; ++k) {
      float want = k % 2 ? float((k + 1) * ((r / 2) * 4 + 3)) : float((k + 1) * 10);
      EXPECT_EQ(bufs[k][0], want) << "op " << k;
      EXPECT_EQ(bufs[k][count - 1], want) << "op " << k;
      EXPECT_TRUE(works[k]->test());
      EXPECT_EQ(works[k]->error(), nullptr);
    }
    if (odd) {
      EXPECT_EQ(odd_sum, 1 + 3);
    }
  });
}

TEST_P(Features, PointToPointBothWays) {
  run_ranks(3, GetParam(), "p2p", [&](Communicator& c) {
    const int n = c.size(), r = c.rank();
    std::vector<int64_t> out(1000, r), in(1000, -1);
    auto s = c.send_async(out.data(), out.size(), DType::kI64, (r + 1) % n);
    c.recv(in.data(), in.size(), DType::kI64, (r + n - 1) % n);
    s->wait();
    EXPECT_EQ(in[999], (r + n - 1) % n);
  });
}

TEST_P(Features, DeadlineFailsEveryRankAndBreaksTheCommunicator) {
  const int n = 3;
  std::atomic<int> timed_out{0};
  run_ranks(n, GetParam(), "deadline", [&](Communicator& c) {
    float x = 1;
    if (c.rank() != 2) {  // rank 2 never joins this allreduce
      auto t0 = std::chrono::steady_clock::now();
      try {
        c.allreduce(&x, &x, 1, DType::kF32, ReduceOp::kSum, OpOptions{comm::Algo::kAuto, 0.5});
        ADD_FAILURE() << "allreduce without rank 2 did not fail";
      } catch (const PeerError& e) {
        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        EXPECT_LT(s, 10.0);
        std::string what = e.what();
        EXPECT_NE(what.find("allreduce"), std::string::npos) << what;
        ++timed_out;
      }
      // Later calls fail at once: the communicator is broken.
      EXPECT_THROW(c.barrier(), PeerError);
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    }
  });
  EXPECT_EQ(timed_out.load(), 2);
}

TEST_P(Features, DesyncIsReportedOnEveryRank) {
  std::atomic<int> reported{0};
  run_ranks(3, GetParam(), "desync", [&](Communicator& c) {
    std::vector<float> v(64, 1.0f);
    try {
      if (c.rank() == 0)
        c.allreduce(v.data(), v.data(), 64, DType::kF32, ReduceOp::kMax);
      else
        c.allreduce(v.data(), v.data(), 64, DType::kF32, ReduceOp::kSum);
      ADD_FAILURE() << "mismatched reduce ops were not detected on rank " << c.rank();
    } catch (const PeerError& e) {
      std::string what = e.what();
      EXPECT_NE(what.find("desync"), std::string::npos) << what;
      EXPECT_NE(what.find("op=max"), std::string::npos) << what;
      EXPECT_NE(what.find("op=sum"), std::string::npos) << what;
      ++reported;
    }
  });
  EXPECT_EQ(reported.load(), 3);
}

TEST_P(Features, WorkWaitWithDeadlineDoesNotCancel) {
  run_ranks(2, GetParam(), "workwait", [&](Communicator& c) {
    float x = float(c.rank() + 1), y = 0;
    if (c.rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    WorkPtr w = c.allreduce_async(&x, &y, 1, DType::kF32, ReduceOp::kSum);
    if (c.rank() == 0) {
      EXPECT_THROW(w->wait(Deadline::after_seconds(0.05)), PeerError);
    }
    w->wait();
    EXPECT_EQ(y, 3.0f);
  });
}

INSTANTIATE_TEST_SUITE_P(Transports, Features,
                         ::testing::Values(Layout::kShm, Layout::kTcp, Layout::kHier),
                         [](const auto& info) { return std::string(layout_name(info.param)); });

}  // namespace
}  // namespace loom::test
