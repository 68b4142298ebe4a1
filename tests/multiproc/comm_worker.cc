// One rank of a multi-process test, started by multiproc_test through the local launcher.
//
//   comm_worker sweep               every collective, closed-form check (exit 1 if wrong)
//   comm_worker big                 64 MiB allreduce / allgather / reduce_scatter, checked
//   comm_worker async               overlapping async ops on the world and split comms
//   comm_worker kill VICTIM         allreduce loop; VICTIM SIGKILLs itself at iteration 20
//   comm_worker desync              rank 1 passes a different count at the third allreduce
//   comm_worker soak OPS DIR        OPS mixed collectives, checked; RSS, descriptors and
//                                   shm segments sampled into DIR/soak-rankR.csv; exit 1 if
//                                   a result is wrong or they grow after warm-up
//
// LOOM_TEST_HOSTS=k places ranks on virtual hosts of k ranks (LOOM_HOST_ID).
// A PeerError prints "PEER ERROR: <message>" and exits 3.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "loom/comm/algorithms/algorithms.h"
#include "loom/comm/bootstrap.h"
#include "loom/comm/transport/shm/shm_pair.h"
#include "loom/core/error.h"
#include "support/sweep.h"
#include "support/values.h"

using namespace loom;
using namespace loom::comm;

namespace {

// With LOOM_TEST_EXPECT_IN_PLACE set, the run fails unless some messages were read in place
// (so a test of the single-copy path cannot pass through the ring alone). With
// LOOM_TEST_EXPECT_FUSED=1 it fails unless some shared allreduce and some shared
// reduce-scatter ran fused (each rank reducing its block of every input in place), with =0
// if any did.
int expect_in_place(int status) {
  if (status == 0 && std::getenv("LOOM_TEST_EXPECT_IN_PLACE") &&
      comm::ShmPair::bytes_read_in_place() == 0) {
    std::fprintf(stderr, "NOT IN PLACE: no message was read in place\n");
    return 1;
  }
  if (const char* f = std::getenv("LOOM_TEST_EXPECT_FUSED"); status == 0 && f) {
    const uint64_t fused = comm::algo::shared_allreduces_fused(),
                   fused_rs = comm::algo::shared_reduce_scatters_fused();
    const bool want = std::string(f) == "1";
    if (want != (fused > 0) || want != (fused_rs > 0)) {
      std::fprintf(stderr,
                   "FUSED: %llu shared allreduces and %llu shared reduce-scatters ran fused, "
                   "expected %s of each\n",
                   static_cast<unsigned long long>(fused),
                   static_cast<unsigned long long>(fused_rs), want ? "some" : "none");
      return 1;
    }
  }
  return status;
}

int run_sweep(Communicator& c) {
  std::vector<size_t> counts{0, 1, 7, 1031, static_cast<size_t>(c.size()) * 13 + 3};
  int wrong = test::sweep(c, counts, "process-sweep", [](const std::string& m) {
    std::fprintf(stderr, "WRONG: %s\n", m.c_str());
  });
  return expect_in_place(wrong ? 1 : 0);
}

int run_sweep_shared(Communicator& c) {
  std::vector<size_t> counts{0, 1, 7, 1031, static_cast<size_t>(c.size()) * 13 + 3};
  int wrong = test::sweep_shared(c, counts, "process-sweep-shared", [](const std::string& m) {
    std::fprintf(stderr, "WRONG: %s\n", m.c_str());
  });
  return expect_in_place(wrong ? 1 : 0);
}

int run_gather_shared(Communicator& c) {
  int wrong = test::sweep_allgather_shared(c, "process-allgather-shared", [](const std::string& m) {
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
  return expect_in_place(wrong ? 1 : 0);
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

// The victim stops (SIGSTOP) while the others only talk among themselves, on a communicator
// without it: no operation of theirs waits on it, so only its silent heartbeat
// (LOOM_HEARTBEAT_S) can stop them.
int run_silent(Communicator& c, int victim) {
  auto mine = c.split(c.rank() == victim ? 1 : 0, c.rank());
  if (c.rank() == victim) {
    raise(SIGSTOP);
    return 0;
  }
  std::vector<float> buf(1024, 1.0f);
  for (int it = 0; it < 6000; ++it) {  // 60 s
    mine->allreduce(buf.data(), buf.data(), buf.size(), DType::kF32, ReduceOp::kMax);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::printf("finished without noticing the silent rank\n");
  return 0;
}

// The victim dies while its peers are reading its 32 MiB block of an allgather in place
// (a timer thread kills it a few milliseconds into the operation).
int run_kill_in_place(Communicator& c, int victim) {
  const size_t per = (32u << 20) / 4;
  std::vector<float> mine(per, static_cast<float>(c.rank())), all(per * c.size());
  for (int it = 0; it < 200; ++it) {
    if (it == 5 && c.rank() == victim)
      std::thread([] {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        raise(SIGKILL);
      }).detach();
    c.allgather(mine.data(), all.data(), per, DType::kF32);
  }
  std::printf("finished without noticing the dead rank\n");
  return 0;
}

// ... while the ranks of its machine gather into a machine buffer it may own: reported by
// every other rank, whose mapping of the buffer stays valid.
int run_kill_shared(Communicator& c, int victim) {
  const size_t per = (8u << 20) / 4;
  comm::MachineBuffer all = c.alloc_machine_buffer(per * c.size() * sizeof(float));
  std::vector<float> mine(per, static_cast<float>(c.rank()));
  for (int it = 0; it < 400; ++it) {
    if (it == 5 && c.rank() == victim)
      std::thread([] {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        raise(SIGKILL);
      }).detach();
    c.allgather_shared(mine.data(), all, per, DType::kF32);
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

// ---- soak: mixed collectives for a long time, memory and descriptors sampled ----
//
// Every rank draws the same sequence from a shared seed: communicator (the world, a half,
// the world in reverse order, or a split made and dropped every 500 operations), operation
// (allreduce, allgather, reduce_scatter, broadcast, reduce, alltoall, send/recv around the
// ring, barrier), dtype, reduction, element count (log-uniform, 1 to 256 Ki) and batch (one
// blocking call, or 2-4 async calls in flight). Every result is checked in closed form.
// RSS, open descriptors and loom's /dev/shm segments are sampled 100 times; the run fails
// if any result is wrong, if descriptors or segments after warm-up (the first 20% of
// samples) differ from the end, or if RSS grows after warm-up by more than 24 MiB or 15%.

struct Sample {
  long op;
  long rss_kb;
  int fds;
  int shm;   // loom's names in /dev/shm (unlinked once mapped: 0 between setups)
  int maps;  // loom's shared-memory segments mapped into this process
};

Sample sample_now(long op) {
  Sample s{op, 0, 0, 0, 0};
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    long size = 0, resident = 0;
    if (std::fscanf(f, "%ld %ld", &size, &resident) == 2)
      s.rss_kb = resident * (sysconf(_SC_PAGESIZE) / 1024);
    std::fclose(f);
  }
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) (void)e, ++s.fds;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm"))
    if (e.path().filename().string().starts_with("loom.")) ++s.shm;
  if (FILE* f = std::fopen("/proc/self/maps", "r")) {
    char line[512];
    while (std::fgets(line, sizeof line, f))
      if (std::strstr(line, "/dev/shm/loom.")) ++s.maps;
    std::fclose(f);
  }
  return s;
}

int run_soak(Communicator& world, long ops, const std::string& out_dir) {
  using namespace loom::test;
  const int r = world.rank();
  std::mt19937_64 rng(20261201);  // the same on every rank
  auto pick = [&](int k) { return static_cast<int>(rng() % static_cast<uint64_t>(k)); };
  std::shared_ptr<Communicator> half = world.split(r % 2, r), rev = world.split(0, -r), tmp;
  const DType types[] = {DType::kF32, DType::kBF16, DType::kF64, DType::kI32};
  const ReduceOp reds[] = {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin, ReduceOp::kAvg};
  const long every = std::max(1L, ops / 100);
  const char* leak = std::getenv("LOOM_TEST_SOAK_LEAK");  // fd | rss: leak on purpose
  std::vector<Sample> samples;
  long wrong = 0;
  struct Pending {
    WorkPtr work;
    std::vector<uint8_t> in, out;
    std::function<long()> check;  // wrong elements
  };
  for (long op = 0; op < ops;) {
    if (op % 500 == 0) {  // a fresh sub-group: made, used, dropped (its pairs and segments freed)
      tmp.reset();
      tmp = world.split(static_cast<int>((r + op / 500) % 2), r);
    }
    const int batch = pick(10) < 3 ? 2 + pick(3) : 1;
    std::vector<Pending> pend(static_cast<size_t>(batch));
    for (auto& p : pend) {
      const int which = pick(10);
      Communicator& c = which < 6 ? world : which < 8 ? *half : which < 9 ? *rev : *tmp;
      const int cn = c.size(), cr = c.rank();
      const DType t = types[pick(4)];
      const ReduceOp red = reds[pick(4)];
      const size_t count = static_cast<size_t>(std::exp2(pick(1800) / 100.0));  // 1 .. 2^18
      const size_t es = dtype_size(t);
      const int root = pick(cn);
      const int kind = pick(20);
      auto fill = [&](std::vector<uint8_t>& b, size_t elems, auto value) {
        b.resize(elems * es);
        for (size_t i = 0; i < elems; ++i) store(t, b.data(), i, value(i));
      };
      auto count_wrong = [t](const std::vector<uint8_t>* b, size_t elems, auto want) {
        long bad = 0;
        for (size_t i = 0; i < elems; ++i)
          if (load(t, b->data(), i) != want(i)) ++bad;
        return bad;
      };
      if (kind < 6) {  // allreduce
        fill(p.in, count, [&](size_t i) { return input_value(red, cr, i); });
        p.out.resize(count * es);
        p.work = c.allreduce_async(p.in.data(), p.out.data(), count, t, red);
        p.check = [&p, count, count_wrong, red, t, cn] {
          return count_wrong(&p.out, count,
                             [&](size_t i) { return expected_value(red, t, cn, i); });
        };
      } else if (kind < 9) {  // allgather
        fill(p.in, count, [&](size_t i) { return static_cast<double>((cr * 3 + i) % 11); });
        p.out.resize(count * cn * es);
        p.work = c.allgather_async(p.in.data(), p.out.data(), count, t);
        p.check = [&p, count, count_wrong] {
          return count_wrong(&p.out, p.out.size() / (p.in.size() / count), [&](size_t i) {
            return static_cast<double>(((i / count) * 3 + i % count) % 11);
          });
        };
      } else if (kind < 12) {  // reduce_scatter
        fill(p.in, count * cn, [&](size_t i) { return input_value(red, cr, i); });
        p.out.resize(count * es);
        p.work = c.reduce_scatter_async(p.in.data(), p.out.data(), count, t, red);
        p.check = [&p, count, count_wrong, red, t, cn, cr] {
          return count_wrong(&p.out, count,
                             [&](size_t i) { return expected_value(red, t, cn, cr * count + i); });
        };
      } else if (kind < 14) {  // broadcast (in place)
        fill(p.out, count,
             [&](size_t i) { return cr == root ? static_cast<double>((root + i) % 9) : -1.0; });
        p.work = c.broadcast_async(p.out.data(), count, t, root);
        p.check = [&p, count, count_wrong, root] {
          return count_wrong(&p.out, count,
                             [&](size_t i) { return static_cast<double>((root + i) % 9); });
        };
      } else if (kind < 15) {  // reduce to a root
        fill(p.in, count, [&](size_t i) { return input_value(red, cr, i); });
        p.out.resize(count * es);
        p.work = c.reduce_async(p.in.data(), p.out.data(), count, t, red, root);
        p.check = [&p, count, count_wrong, red, t, cn, cr, root] {
          return cr != root ? 0 : count_wrong(&p.out, count, [&](size_t i) {
            return expected_value(red, t, cn, i);
          });
        };
      } else if (kind < 17) {  // alltoall: block q of rank r's input goes to rank q
        const size_t per = std::max<size_t>(1, count / cn);
        fill(p.in, per * cn,
             [&](size_t i) { return static_cast<double>((cr * 4 + i / per + i % per) % 13); });
        p.out.resize(per * cn * es);
        p.work = c.alltoall_async(p.in.data(), p.out.data(), per, t);
        p.check = [&p, per, cn, cr, count_wrong] {
          return count_wrong(&p.out, per * cn, [&](size_t i) {
            return static_cast<double>(((i / per) * 4 + cr + i % per) % 13);
          });
        };
      } else if (kind < 19 && cn > 1) {  // send to the next rank, receive from the previous
        fill(p.in, count, [&](size_t i) { return static_cast<double>((cr + i) % 7); });
        p.out.resize(count * es);
        WorkPtr s = c.send_async(p.in.data(), count, t, (cr + 1) % cn);
        p.work = c.recv_async(p.out.data(), count, t, (cr + cn - 1) % cn);
        const int from = (cr + cn - 1) % cn;
        p.check = [&p, s, count, count_wrong, from] {
          s->wait(Deadline::after_seconds(60));
          return count_wrong(&p.out, count,
                             [&](size_t i) { return static_cast<double>((from + i) % 7); });
        };
      } else {
        p.work = c.barrier_async();
        p.check = [] { return 0L; };
      }
    }
    for (auto& p : pend) p.work->wait(Deadline::after_seconds(60));
    for (auto& p : pend) {
      const long bad = p.check();
      if (bad && wrong < 10)
        std::fprintf(stderr, "WRONG: %ld elements at operation %ld\n", bad, op);
      wrong += bad;
    }
    for (int k = 0; k < batch; ++k, ++op) {
      if (op % every == 0) samples.push_back(sample_now(op));
      // The detector's own test: a descriptor, or 1 MiB of touched memory, every 50 ops.
      if (leak && op % 50 == 0) {
        if (std::strcmp(leak, "fd") == 0) (void)::dup(1);
        if (std::strcmp(leak, "rss") == 0) {  // (reachable, so LeakSanitizer stays quiet)
          static std::vector<std::unique_ptr<char[]>> kept;
          kept.emplace_back(new char[1 << 20]);
          std::memset(kept.back().get(), 1, 1 << 20);
        }
      }
    }
  }
  samples.push_back(sample_now(ops));  // (the sub-group of the moment still alive, as in all)
  tmp.reset();
  world.barrier();

  const std::string csv = out_dir + "/soak-rank" + std::to_string(r) + ".csv";
  if (FILE* f = std::fopen(csv.c_str(), "w")) {
    std::fprintf(f, "op,rss_kb,fds,shm_names,shm_mapped\n");
    for (const Sample& s : samples)
      std::fprintf(f, "%ld,%ld,%d,%d,%d\n", s.op, s.rss_kb, s.fds, s.shm, s.maps);
    std::fclose(f);
  }
  const Sample& warm = samples[samples.size() / 5];
  long peak = 0;
  for (size_t i = samples.size() / 5; i < samples.size(); ++i)
    peak = std::max(peak, samples[i].rss_kb);
  const Sample& end = samples.back();
  // (3000 operations grow 12-16 MiB after their warm-up as rarer, larger messages first
  // appear; 10^5 grow 2-4 MiB after theirs: docs/reliability.md.)
  const long allowed = std::max(24L * 1024, warm.rss_kb * 15 / 100);
  std::printf(
      "soak rank %d: %ld operations, %ld wrong; RSS %.1f MiB after warm-up, peak %.1f, "
      "end %.1f; descriptors %d -> %d; shm segments mapped %d -> %d, named %d -> %d\n",
      r, ops, wrong, warm.rss_kb / 1024.0, peak / 1024.0, end.rss_kb / 1024.0, warm.fds, end.fds,
      warm.maps, end.maps, warm.shm, end.shm);
  int status = wrong ? 1 : 0;
  if (peak - warm.rss_kb > allowed) {
    std::fprintf(stderr, "GROWTH: RSS grew %.1f MiB after warm-up (allowed %.1f)\n",
                 (peak - warm.rss_kb) / 1024.0, allowed / 1024.0);
    status = 1;
  }
  if (end.fds != warm.fds || end.maps != warm.maps || end.shm != 0) {
    std::fprintf(stderr,
                 "LEAK: descriptors %d -> %d, shm segments mapped %d -> %d, named %d after "
                 "warm-up\n",
                 warm.fds, end.fds, warm.maps, end.maps, end.shm);
    status = 1;
  }
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: comm_worker sweep|big|async|kill VICTIM|desync|soak OPS DIR\n");
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
    if (what == "sweep_shared") return run_sweep_shared(*c);
    if (what == "big") return run_big(*c);
    if (what == "async") return run_async(*c);
    if (what == "kill") return run_kill(*c, argc > 2 ? std::atoi(argv[2]) : 1);
    if (what == "kill_in_place") return run_kill_in_place(*c, argc > 2 ? std::atoi(argv[2]) : 1);
    if (what == "kill_shared") return run_kill_shared(*c, argc > 2 ? std::atoi(argv[2]) : 1);
    if (what == "silent") return run_silent(*c, argc > 2 ? std::atoi(argv[2]) : 1);
    if (what == "gather_shared") return run_gather_shared(*c);
    if (what == "desync") return run_desync(*c);
    if (what == "soak")
      return run_soak(*c, argc > 2 ? std::atol(argv[2]) : 3000, argc > 3 ? argv[3] : ".");
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
