// One rank of a multi-process test, started by multiproc_test through the local launcher.
//
//   comm_worker sweep               every collective, closed-form check (exit 1 if wrong)
//   comm_worker big                 64 MiB allreduce / allgather / reduce_scatter, checked
//   comm_worker async               overlapping async ops on the world and split comms
//   comm_worker kill VICTIM         allreduce loop; VICTIM SIGKILLs itself at iteration 20
//   comm_worker desync              rank 1 passes a different count at the third allreduce
//
// LOOM_TEST_HOSTS=k places ranks on virtual hosts of k ranks (LOOM_HOST_ID).
// A PeerError prints "PEER ERROR: <message>" and exits 3.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "loom/comm/bootstrap.h"
#include "loom/core/error.h"
#include "support/sweep.h"
#include "support/values.h"

using namespace loom;
using namespace loom::comm;

namespace {

int run_sweep(Communicator& c) {
  std::vector<size_t> counts{0, 1, 7, 1031, static_cast<size_t>(c.size()) * 13 + 3};
  int wrong = test::sweep(c, counts, "process-sweep", [](const std::string& m) {
    std::fprintf(stderr, "WRONG: %s\n", m.c_str());
  });
  return wrong ? 1 : 0;
}

int run_big(Communicator& c) {
  const int n = c.size(), r = c.rank();
  const size_t count = (64u << 20) / 4;  // 64 MiB of f32
  int wrong = 0;
  for (Algo a : {Algo::kAuto, Algo::kRing, Algo::kDirect}) {
    std::vector<float> buf(count);
    for (size_t i = 0; i < count; ++i) buf[i] = static_cast<float>((r + 1) * (i % 5 + 1));
    c.allreduce(buf.data(), buf.data(), count, DType::kF32, ReduceOp::kSum, OpOptions{a});
    for (size_t i = 0; i < count; ++i)
      if (buf[i] != static_cast<float>((i % 5 + 1) * n * (n + 1) / 2)) ++wrong;
  }
  size_t per = count / n;
  std::vector<float> mine(per, static_cast<float>(r)), all(per * n);
  c.allgather(mine.data(), all.data(), per, DType::kF32);
  for (int q = 0; q < n; ++q)
    for (size_t i = 0; i < per; ++i)
      if (all[q * per + i] != static_cast<float>(q)) ++wrong;
  std::vector<float> in(per * n, 1.0f), out(per);
  c.reduce_scatter(in.data(), out.data(), per, DType::kF32, ReduceOp::kSum);
  for (size_t i = 0; i < per; ++i)
    if (out[i] != static_cast<float>(n)) ++wrong;
  if (wrong) std::fprintf(stderr, "WRONG: %d elements in the 64 MiB checks\n", wrong);
  return wrong ? 1 : 0;
}

// Many async operations in flight on the world communicator and on two split
// communicators at once; results checked after all are waited for.
int run_async(Communicator& c) {
  const int n = c.size(), r = c.rank();
  auto half = c.split(r % 2, r);  // evens and odds
  auto rev = c.split(0, -r);      // everyone, reversed rank order
  int wrong = 0;
  if (rev->rank() != n - 1 - r) {
    std::fprintf(stderr, "WRONG: split by key -rank gave rank %d, want %d\n", rev->rank(),
                 n - 1 - r);
    ++wrong;
  }
  const size_t count = 100003;
  std::vector<std::vector<int32_t>> bufs(8, std::vector<int32_t>(count));
  std::vector<WorkPtr> works;
  for (int k = 0; k < 8; ++k) {
    for (size_t i = 0; i < count; ++i) bufs[k][i] = (r + 1) * (k + 1);
    Communicator& target = k % 3 == 0 ? c : k % 3 == 1 ? *half : *rev;
    works.push_back(
        target.allreduce_async(bufs[k].data(), bufs[k].data(), count, DType::kI32, ReduceOp::kSum));
  }
  std::vector<int64_t> gathered(n);
  int64_t me = r * 10;
  works.push_back(c.allgather_async(&me, gathered.data(), 1, DType::kI64));
  for (auto& w : works) w->wait(Deadline::after_seconds(60));
  for (int k = 0; k < 8; ++k) {
    int32_t want;
    if (k % 3 == 1) {
      int s = 0;
      for (int q = r % 2; q < n; q += 2) s += (q + 1) * (k + 1);
      want = s;
    } else {
      want = (k + 1) * n * (n + 1) / 2;
    }
    for (size_t i = 0; i < count; ++i)
      if (bufs[k][i] != want) {
        std::fprintf(stderr, "WRONG: async op %d element %zu: %d want %d\n", k, i, bufs[k][i],
                     want);
        ++wrong;
        break;
      }
  }
  for (int q = 0; q < n; ++q)
    if (gathered[q] != q * 10) ++wrong;
  // send/recv around a ring, async, both directions at once.
  int32_t to_next = r, from_prev = -1;
  auto s = c.send_async(&to_next, 1, DType::kI32, (r + 1) % n);
  auto v = c.recv_async(&from_prev, 1, DType::kI32, (r + n - 1) % n);
  s->wait();
  v->wait();
  if (from_prev != (r + n - 1) % n) ++wrong;
  c.barrier();
  return wrong ? 1 : 0;
}

int run_kill(Communicator& c, int victim) {
  std::vector<float> buf(256 * 1024, 1.0f);
  for (int it = 0; it < 2000; ++it) {
    if (it == 20 && c.rank() == victim) raise(SIGKILL);
    c.allreduce(buf.data(), buf.data(), buf.size(), DType::kF32, ReduceOp::kMax);
  }
  std::printf("finished without noticing the dead rank\n");
  return 0;
}

int run_desync(Communicator& c) {
  std::vector<float> buf(1000, 1.0f);
  for (int it = 0; it < 5; ++it) {
    size_t count = (it == 2 && c.rank() == 1) ? 999 : 1000;
    c.allreduce(buf.data(), buf.data(), count, DType::kF32, ReduceOp::kSum);
  }
  std::printf("finished without noticing the desync\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: comm_worker sweep|big|async|kill VICTIM|desync\n");
    return 2;
  }
  std::string what = argv[1];
  if (const char* k = std::getenv("LOOM_TEST_HOSTS")) {
    int per = std::atoi(k);
    int rank = std::atoi(std::getenv("LOOM_RANK"));
    setenv("LOOM_HOST_ID", ("vhost" + std::to_string(rank / per)).c_str(), 1);
  }
  // One process that does not know the job token (the Failures.WrongToken test).
  if (const char* w = std::getenv("LOOM_TEST_WRONG_TOKEN_RANK"))
    if (std::atoi(w) == std::atoi(std::getenv("LOOM_RANK")))
      setenv("LOOM_JOB_TOKEN", "0123456789abcdef0123456789abcdef", 1);
  try {
    auto c = init_from_env();
    if (what == "sweep") return run_sweep(*c);
    if (what == "big") return run_big(*c);
    if (what == "async") return run_async(*c);
    if (what == "kill") return run_kill(*c, argc > 2 ? std::atoi(argv[2]) : 1);
    if (what == "desync") return run_desync(*c);
    std::fprintf(stderr, "unknown scenario %s\n", what.c_str());
    return 2;
  } catch (const PeerError& e) {
    std::fprintf(stderr, "PEER ERROR: %s\n", e.what());
    return 3;
  } catch (const UserError& e) {
    std::fprintf(stderr, "USER ERROR: %s\nhint: %s\n", e.what(), e.hint().c_str());
    return 2;
  }
}
