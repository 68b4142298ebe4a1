// `loom bench`: collective performance and correctness, in the manner of nccl-tests.
//
// For each size from --min to --max (x --factor) it runs --warmup untimed and --iters timed
// operations out of place and in place, then one checked operation on closed-form inputs,
// and prints size, count, dtype, algorithm, median time, algbw = size / time, busbw =
// algbw x the op's bus factor (allreduce 2(n-1)/n; allgather, reduce_scatter, alltoall
// (n-1)/n; broadcast, reduce 1), the share of the copy limit reached (%lim) and #wrong. It
// exits non-zero on any wrong element. The copy limit (limit(us)) is the time to write the
// bytes each rank must write into its output — allreduce, broadcast, reduce: the message;
// allgather, alltoall: all of it out of place, the (n-1)/n from peers in place;
// reduce_scatter: its 1/n block — at the rank's share of the machine's copy bandwidth,
// measured in the same run with all local ranks copying at once (min(ranks, cores) threads,
// 256 MiB each, the faster of memcpy and non-temporal stores, divided by the local ranks):
// every rank writes during a collective, so one thread's copy alone overstates what each
// gets. In-cache sizes can pass 100%.
//
// --np N spawns N local ranks (this binary again) and hosts the store; without it, the
// process joins a job started by `loom run`, mpirun or srun.
#include "bench.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "loom/comm/bootstrap.h"
#include "loom/comm/communicator.h"
#include "loom/comm/tuning.h"
#include "loom/core/error.h"
#include "loom/core/tunable.h"
#include "loom/launch/local_launcher.h"
#include "probe.h"

namespace loom::apps {
namespace {

using comm::Algo;
using comm::Communicator;
using comm::OpKind;
using comm::ReduceOp;

struct BenchArgs {
  std::string op = "allreduce";
  int np = 0;
  std::string algo = "auto";
  std::string dtype = "f32";
  std::string min = "8";
  std::string max = "64M";
  int factor = 2;
  int iters = 20;
  int warmup = 5;
  bool check = true;
  bool no_check = false;
  std::string json;  // "" none, "-" stdout, else a path
  bool tunables = false;
  bool probe = false;
  double job_timeout = 0;
  std::string calibrate;               // a tuning table to write (LOOM_TUNING_FILE)
  bool shared = false;                 // buffers from Communicator::alloc_shared
  std::vector<std::string> forwarded;  // argv after "bench", for re-executing ranks
};

// A benchmark buffer: heap memory, or (--shared) a buffer the other local ranks have mapped.
// allgather_shared's output is a machine buffer (every local rank maps the same one).
struct Buf {
  std::vector<std::byte> heap;
  comm::SharedBuffer shared;
  comm::MachineBuffer machine;
  std::byte* p = nullptr;
  size_t n = 0;
  static Buf make(Communicator& comm, size_t bytes, bool shared, bool machine = false) {
    Buf b;
    if (machine) {
      b.machine = comm.alloc_machine_buffer(bytes);
      b.p = b.machine.as<std::byte>();
    } else if (shared) {
      b.shared = comm.alloc_shared(bytes);
      b.p = b.shared.as<std::byte>();
    } else {
      b.heap.resize(bytes);
      b.p = b.heap.data();
    }
    b.n = bytes;
    return b;
  }
  std::byte* data() const { return p; }
  std::byte* begin() const { return p; }
  std::byte* end() const { return p + n; }
};

double value(int rank, size_t i) {
  return (rank + 1) * static_cast<double>(i % 5 + 1);
}

// One benchmarked operation: buffer shapes, how to run it, what its result must be.
struct Case {
  OpKind op;
  int n, rank;
  DType t;
  size_t es;
  size_t count;  // the count argument of the call
  Algo algo;
  size_t in_elems, out_elems;
  double bus_factor;
  size_t size_bytes;  // what the row reports as size
  // Bytes each rank must write into its output, as a share of size_bytes: the copy limit
  // (below) is that many bytes at the rank's share of the measured copy bandwidth. Out of
  // place, allgather and alltoall also write the rank's own block.
  double write_factor = 1;
  bool own_block_out_of_place = false;
  double writes(bool in_place) const {
    return own_block_out_of_place && !in_place ? 1.0 : write_factor;
  }

  static std::optional<Case> make(OpKind op, size_t bytes, int n, int rank, DType t) {
    Case c{op, n, rank, t, dtype_size(t), 0, Algo::kAuto, 0, 0, 1.0, 0, 1.0, false};
    size_t elems = bytes / c.es;
    switch (op) {
      case OpKind::kAllreduce:
        c.count = elems, c.in_elems = c.out_elems = elems, c.bus_factor = 2.0 * (n - 1) / n;
        c.size_bytes = elems * c.es;
        break;
      case OpKind::kBroadcast:
      case OpKind::kReduce:
        c.count = elems, c.in_elems = c.out_elems = elems, c.bus_factor = 1;
        c.size_bytes = elems * c.es;
        break;
      case OpKind::kAllgather:
        c.count = elems / n, c.in_elems = c.count, c.out_elems = c.count * n;
        c.bus_factor = double(n - 1) / n, c.size_bytes = c.count * n * c.es;
        c.write_factor = double(n - 1) / n;  // the peers' blocks
        c.own_block_out_of_place = true;
        break;
      case OpKind::kAllgatherShared:  // busbw as allgather's, to compare with it
        c.count = elems / n, c.in_elems = c.count, c.out_elems = c.count * n;
        c.bus_factor = double(n - 1) / n, c.size_bytes = c.count * n * c.es;
        c.write_factor = 1.0 / n;  // its own block: the machine's ranks share the rest
        break;
      case OpKind::kReduceScatter:
        c.count = elems / n, c.in_elems = c.count * n, c.out_elems = c.count;
        c.bus_factor = double(n - 1) / n, c.size_bytes = c.count * n * c.es;
        c.write_factor = 1.0 / n;  // its block of the result
        break;
      case OpKind::kAlltoall:
        c.count = elems / n, c.in_elems = c.out_elems = c.count * n;
        c.bus_factor = double(n - 1) / n, c.size_bytes = c.count * n * c.es;
        c.write_factor = double(n - 1) / n;
        c.own_block_out_of_place = true;
        break;
      default:
        return std::nullopt;
    }
    if (c.count == 0) return std::nullopt;
    return c;
  }

  comm::MachineBuffer* machine = nullptr;  // allgather_shared's output

  // Pointers for one call, in place or not (allgather_shared: never in place).
  void run(Communicator& comm, std::byte* in, std::byte* out, bool in_place, Algo requested) {
    comm::OpOptions o{requested};
    switch (op) {
      case OpKind::kAllreduce:
        comm.allreduce(in, in_place ? in : out, count, t, ReduceOp::kSum, o);
        break;
      case OpKind::kBroadcast:
        comm.broadcast(in, count, t, 0, o);
        break;
      case OpKind::kReduce:
        comm.reduce(in, in_place ? in : out, count, t, ReduceOp::kSum, 0, o);
        break;
      case OpKind::kAllgather:
        comm.allgather(in_place ? out + rank * count * es : in, out, count, t, o);
        break;
      case OpKind::kReduceScatter:
        comm.reduce_scatter(in, in_place ? in + rank * count * es : out, count, t, ReduceOp::kSum,
                            o);
        break;
      case OpKind::kAlltoall:
        comm.alltoall(in, in_place ? in : out, count, t, o);
        break;
      case OpKind::kAllgatherShared:
        comm.allgather_shared(in, *machine, count, t, o);
        break;
      default:
        break;
    }
  }

  // Fills inputs with closed-form values, runs once, returns the number of wrong elements.
  int64_t check(Communicator& comm, Buf& in, Buf& out, bool in_place, Algo requested) {
    if (op == OpKind::kAllgatherShared) {  // each rank clears its own block, after the reads
      comm.barrier();
      std::fill(out.data() + rank * count * es, out.data() + (rank + 1) * count * es,
                std::byte{0xEE});
      comm.barrier();
    } else {
      std::fill(out.begin(), out.end(), std::byte{0xEE});
    }
    std::byte* src = in.data();
    if (op == OpKind::kAllgather && in_place) src = out.data() + rank * count * es;
    size_t fill_elems = op == OpKind::kAllgather ? count : in_elems;
    for (size_t i = 0; i < fill_elems; ++i) store_element(t, src, i, value(rank, i));
    if (op == OpKind::kBroadcast && rank != 0) std::fill(in.begin(), in.end(), std::byte{0xEE});
    run(comm, in.data(), out.data(), in_place, requested);
    int64_t wrong = 0;
    auto sum_of = [&](size_t i) {
      double s = 0;
      for (int q = 0; q < n; ++q) s += value(q, i);
      return s;
    };
    auto expect = [&](const std::byte* p, size_t i, double want) {
      std::vector<std::byte> tmp(8);
      store_element(t, tmp.data(), 0, want);
      if (load_element(t, p, i) != load_element(t, tmp.data(), 0)) ++wrong;
    };
    switch (op) {
      case OpKind::kAllreduce: {
        const std::byte* res = in_place ? in.data() : out.data();
        for (size_t i = 0; i < count; ++i) expect(res, i, sum_of(i));
        break;
      }
      case OpKind::kBroadcast:
        for (size_t i = 0; i < count; ++i) expect(in.data(), i, value(0, i));
        break;
      case OpKind::kReduce:
        if (rank == 0) {
          const std::byte* res = in_place ? in.data() : out.data();
          for (size_t i = 0; i < count; ++i) expect(res, i, sum_of(i));
        }
        break;
      case OpKind::kAllgather:
      case OpKind::kAllgatherShared:
        for (int q = 0; q < n; ++q)
          for (size_t i = 0; i < count; ++i) expect(out.data(), q * count + i, value(q, i));
        break;
      case OpKind::kReduceScatter: {
        const std::byte* res = in_place ? in.data() + rank * count * es : out.data();
        for (size_t i = 0; i < count; ++i) expect(res, i, sum_of(rank * count + i));
        break;
      }
      case OpKind::kAlltoall: {
        const std::byte* res = in_place ? in.data() : out.data();
        for (int q = 0; q < n; ++q)
          for (size_t i = 0; i < count; ++i) expect(res, q * count + i, value(q, rank * count + i));
        break;
      }
      default:
        break;
    }
    if (op == OpKind::kAllgatherShared) comm.barrier();  // all read before the next clears
    return wrong;
  }
};

struct Row {
  double time_us = 0, algbw = 0, busbw = 0, of_limit = 0;
  int64_t wrong = 0;
};

// The median over iterations of the slowest rank's time of one case, after warmup.
double time_case(Communicator& comm, Case& c, Buf& in, Buf& out, bool in_place, Algo algo,
                 int warmup, int iters) {
  for (int w = 0; w < warmup; ++w) c.run(comm, in.data(), out.data(), in_place, algo);
  comm.barrier();
  std::vector<double> times(iters);
  for (int it = 0; it < iters; ++it) {
    auto t0 = std::chrono::steady_clock::now();
    c.run(comm, in.data(), out.data(), in_place, algo);
    times[it] =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  }
  comm.allreduce(times.data(), times.data(), times.size(), DType::kF64, ReduceOp::kMax);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// --calibrate FILE: every valid algorithm of each op at each size, out of place; the
// fastest per size goes into the tuning table for this topology (other topologies already
// in FILE are kept), which LOOM_TUNING_FILE=FILE then uses instead of the cost model.
int calibrate(const BenchArgs& a, Communicator& comm, const std::vector<OpKind>& ops, DType t,
              size_t lo, size_t hi) {
  const int n = comm.size(), rank = comm.rank();
  comm::TuningTable table;
  if (rank == 0 && std::ifstream(a.calibrate).good()) table = comm::TuningTable::load(a.calibrate);
  auto& entries = table.tables[comm::TuningTable::key_of(comm.topology())];
  entries.clear();
  if (rank == 0)
    std::printf("# calibrating %d ranks, %s: median us per algorithm, out of place\n", n,
                comm.topology().describe().c_str());
  for (OpKind op : ops) {
    if (op != OpKind::kAllreduce && op != OpKind::kAllgather && op != OpKind::kReduceScatter)
      continue;
    for (size_t bytes = lo; bytes <= hi; bytes *= static_cast<size_t>(std::max(a.factor, 2))) {
      auto c = Case::make(op, bytes, n, rank, t);
      if (!c) continue;
      Buf in = Buf::make(comm, c->in_elems * c->es + 64, a.shared);
      Buf out = Buf::make(comm, c->out_elems * c->es + 64, a.shared);
      comm::TuningTable::Entry e{op, c->size_bytes, Algo::kAuto, {}};
      double best = 0;
      std::string line;
      for (Algo algo : comm::valid_algos(op, comm.topology())) {
        const double us = time_case(comm, *c, in, out, false, algo, a.warmup, a.iters);
        e.us[comm::algo_name(algo)] = us;
        char cell[48];
        std::snprintf(cell, sizeof cell, " %s %.1f", comm::algo_name(algo), us);
        line += cell;
        if (e.algo == Algo::kAuto || us < best) e.algo = algo, best = us;
      }
      if (rank == 0)
        std::printf("  %-14s %12zu -> %-6s |%s\n", comm::op_name(op), c->size_bytes,
                    comm::algo_name(e.algo), line.c_str());
      entries.push_back(std::move(e));
    }
  }
  if (rank == 0) {  // written whole, then renamed: a reader never sees half a table
    const std::string tmp = a.calibrate + ".tmp";
    {
      std::ofstream f(tmp);
      f << table.to_json() << "\n";
      if (!f) throw UserError("cannot write " + tmp, "check the directory exists and is writable");
    }
    std::filesystem::rename(tmp, a.calibrate);
    std::printf("# wrote %s: use it with LOOM_TUNING_FILE=%s\n", a.calibrate.c_str(),
                a.calibrate.c_str());
  }
  comm.barrier();
  return 0;
}

int run_rank(const BenchArgs& a) {
  auto comm = comm::init_from_env();
  const int n = comm->size(), rank = comm->rank();
  auto t = parse_dtype(a.dtype);
  auto requested = comm::parse_algo(a.algo);
  std::vector<OpKind> ops;
  if (a.op == "all")
    ops = {OpKind::kAllreduce, OpKind::kAllgather, OpKind::kReduceScatter,
           OpKind::kBroadcast, OpKind::kReduce,    OpKind::kAlltoall};
  else
    ops = {*comm::parse_op(a.op)};
  const size_t lo = parse_bytes(a.min, "--min"), hi = parse_bytes(a.max, "--max");
  const bool do_check = a.check && !a.no_check;
  if (!a.calibrate.empty()) return calibrate(a, *comm, ops, *t, lo, hi);

  FILE* json = nullptr;
  if (rank == 0 && !a.json.empty()) json = a.json == "-" ? stdout : std::fopen(a.json.c_str(), "w");
  if (rank == 0 && !a.json.empty() && !json)
    throw UserError("cannot write --json file '" + a.json + "'", "check the directory exists");
  bool table = rank == 0 && a.json != "-";
  // The copy limit's bandwidth, each local rank's share of the machine's when all copy at
  // once: measured by `loom bench --np`'s launcher before the job, else by rank 0 now for
  // rank 0's machine (the other ranks idle at the first barrier meanwhile).
  double mcpy = 0;
  if (const char* v = std::getenv("LOOM_BENCH_MEMCPY_SHARE_GBPS")) mcpy = std::atof(v);
  if (rank == 0 && mcpy <= 0) {
    const int local = static_cast<int>(comm->topology().local(0).size());
    mcpy = memcpy_share_gbps(256 << 20, local);
    if (table)
      std::printf(
          "# copy bandwidth per rank (%d local ranks copying at once, 256 MiB): %.1f GB/s\n", local,
          mcpy);
  }
  if (table)
    std::printf("# %d ranks, %s; dtype %s; iters %d, warmup %d; times are medians over iters\n", n,
                comm->topology().describe().c_str(), a.dtype.c_str(), a.iters, a.warmup);

  int64_t total_wrong = 0;
  double busbw_sum = 0;
  int busbw_rows = 0;
  for (OpKind op : ops) {
    if (table) {
      std::printf("#\n# %s\n", comm::op_name(op));
      std::printf("# %12s %12s %5s %7s %10s | %10s %9s %9s %5s %7s | %10s %9s %9s %5s %7s\n",
                  "size(B)", "count", "type", "algo", "limit(us)", "oop(us)", "algbw", "busbw",
                  "%lim", "#wrong", "ip(us)", "algbw", "busbw", "%lim", "#wrong");
    }
    for (size_t bytes = lo; bytes <= hi; bytes *= static_cast<size_t>(a.factor)) {
      auto c = Case::make(op, bytes, n, rank, *t);
      if (!c) {
        if (a.factor <= 1) break;
        continue;
      }
      c->algo = comm->chosen_algo(op, c->size_bytes, *requested);
      Buf in = Buf::make(*comm, c->in_elems * c->es + 64, a.shared);
      const bool machine = op == OpKind::kAllgatherShared;
      Buf out = Buf::make(*comm, c->out_elems * c->es + 64, a.shared, machine);
      if (machine) c->machine = &out.machine;
      for (size_t i = 0; i < c->in_elems; ++i) store_element(*t, in.data(), i, value(rank, i));
      // The copy limit: the bytes this rank must write, at its share of the copy bandwidth
      // (the column shows out of place's; in place's %lim is against its own).
      auto limit_us_of = [&](bool in_place) {
        return c->size_bytes * c->writes(in_place) / (mcpy * 1e3);
      };
      const double limit_us = limit_us_of(false);
      Row rows[2];
      for (int ip = 0; ip < (machine ? 1 : 2); ++ip) {
        bool in_place = ip == 1;
        const double time_us =
            time_case(*comm, *c, in, out, in_place, *requested, a.warmup, a.iters);
        Row& row = rows[ip];
        row.time_us = time_us;
        row.algbw = c->size_bytes / row.time_us / 1e3;
        row.busbw = row.algbw * c->bus_factor;
        row.of_limit = limit_us_of(in_place) / row.time_us;
        if (do_check) {
          int64_t w = c->check(*comm, in, out, in_place, *requested);
          comm->allreduce(&w, &row.wrong, 1, DType::kI64, ReduceOp::kSum);
        }
        total_wrong += row.wrong;
        if (json) {
          nlohmann::json j = {{"op", comm::op_name(op)},
                              {"bytes", c->size_bytes},
                              {"count", c->count},
                              {"dtype", dtype_name(*t)},
                              {"algo", comm::algo_name(c->algo)},
                              {"inplace", in_place},
                              {"nranks", n},
                              {"time_us", row.time_us},
                              {"algbw", row.algbw},
                              {"busbw", row.busbw},
                              {"limit_us", limit_us_of(in_place)},
                              {"copy_gbps_per_rank", mcpy},
                              {"of_limit", row.of_limit},
                              {"wrong", do_check ? row.wrong : -1}};
          std::fprintf(json, "%s\n", j.dump().c_str());
        }
        busbw_sum += row.busbw;
        ++busbw_rows;
      }
      if (table) {
        auto wrong_text = [&](int64_t w) {
          return do_check ? std::to_string(w) : std::string("N/A");
        };
        std::printf("  %12zu %12zu %5s %7s %10.2f | %10.2f %9.2f %9.2f %4.0f%% %7s | ",
                    c->size_bytes, c->count, dtype_name(*t), comm::algo_name(c->algo), limit_us,
                    rows[0].time_us, rows[0].algbw, rows[0].busbw, 100 * rows[0].of_limit,
                    wrong_text(rows[0].wrong).c_str());
        if (machine)  // never in place
          std::printf("%10s %9s %9s %5s %7s\n", "-", "-", "-", "-", "-");
        else
          std::printf("%10.2f %9.2f %9.2f %4.0f%% %7s\n", rows[1].time_us, rows[1].algbw,
                      rows[1].busbw, 100 * rows[1].of_limit, wrong_text(rows[1].wrong).c_str());
        std::fflush(stdout);
      }
      if (a.factor <= 1) break;
    }
  }
  if (table) {
    std::printf("# Out of bounds values : %lld %s\n", static_cast<long long>(total_wrong),
                total_wrong ? "FAILED" : "OK");
    std::printf("# Avg bus bandwidth    : %.3f GB/s\n", busbw_rows ? busbw_sum / busbw_rows : 0.0);
  }
  if (json && json != stdout) std::fclose(json);
  comm->barrier();
  return total_wrong ? 1 : 0;
}

int run_launcher(const BenchArgs& a) {
  const char* state_note =
      "  (usual ~50 ns; ~210 ns is the host's slow state where shm results drop 4-10x)";
  const double mcpy = memcpy_gbps(256 << 20);
  const double share = memcpy_share_gbps(256 << 20, a.np);
  if (a.json != "-") {
    std::printf(
        "# copy bandwidth (256 MiB, the faster of memcpy and non-temporal stores): 1 "
        "thread %.1f GB/s; per rank with %d copying at once %.1f GB/s (the copy limit's)\n",
        mcpy, a.np, share);
    std::printf("# core-to-core flag latency before: %.0f ns%s\n", flag_latency_ns(), state_note);
    std::fflush(stdout);
  }
  launch::LaunchOptions lo;
  lo.env["LOOM_BENCH_MEMCPY_SHARE_GBPS"] = std::to_string(share);
  lo.nprocs = a.np;
  lo.argv = {launch::self_exe(), "bench"};
  lo.argv.insert(lo.argv.end(), a.forwarded.begin(), a.forwarded.end());
  lo.timeout_seconds = a.job_timeout;
  launch::LaunchResult res = launch::run_local(lo);
  if (a.json != "-") std::printf("# core-to-core flag latency after: %.0f ns\n", flag_latency_ns());
  if (res.timed_out) {
    std::fprintf(stderr, "loom bench: the job did not finish within %.0f s and was stopped\n",
                 a.job_timeout);
    return 1;
  }
  if (!res.ok()) {
    const auto& e = res.ranks[res.first_failure];
    std::fprintf(stderr, "loom bench: %s\n", e.describe().c_str());
    return e.exit_code ? e.exit_code : 1;
  }
  return 0;
}

void validate(const BenchArgs& a) {
  if (a.op != "all" && !comm::parse_op(a.op))
    throw UserError("--op '" + a.op + "' is not a collective",
                    "use allreduce, allgather, reduce_scatter, broadcast, reduce, alltoall, "
                    "allgather_shared or all");
  if (!parse_dtype(a.dtype))
    throw UserError("--dtype '" + a.dtype + "' is not a type",
                    "use f32, bf16, f16, f64, i32, i64 or u8");
  if (!comm::parse_algo(a.algo))
    throw UserError("--algo '" + a.algo + "' is not an algorithm",
                    "use auto, ring, direct, tree, rd or hier");
  size_t lo = parse_bytes(a.min, "--min"), hi = parse_bytes(a.max, "--max");
  if (lo == 0 || lo > hi)
    throw UserError("--min " + a.min + " and --max " + a.max + " do not make a range",
                    "use 0 < min <= max, e.g. --min 4K --max 256M");
  if (a.factor < 1) throw UserError("--factor must be >= 1", "e.g. --factor 2");
  if (a.iters < 1 || a.warmup < 0)
    throw UserError("--iters must be >= 1 and --warmup >= 0", "e.g. --iters 20 --warmup 5");
  if (a.np < 0 || a.np > 256) throw UserError("--np must be between 1 and 256", "e.g. --np 4");
}

}  // namespace

std::function<int()> add_bench_command(CLI::App& app) {
  auto args = std::make_shared<BenchArgs>();
  CLI::App* b =
      app.add_subcommand("bench", "measure collectives (nccl-tests style) and check results");
  b->add_option("--op", args->op,
                "allreduce|allgather|reduce_scatter|broadcast|reduce|alltoall|all");
  b->add_option("--np", args->np, "spawn N local ranks (otherwise join the launcher's job)");
  b->add_option("--algo", args->algo, "auto|ring|direct|tree|rd|hier|shared");
  b->add_option("--dtype", args->dtype, "f32|bf16|f16|f64|i32|i64|u8");
  b->add_option("--min,-b", args->min, "smallest size, bytes (e.g. 4K)");
  b->add_option("--max,-e", args->max, "largest size, bytes (e.g. 256M)");
  b->add_option("--factor,-f", args->factor, "size multiplier between rows");
  b->add_option("--iters,-n", args->iters, "timed iterations per size");
  b->add_option("--warmup,-w", args->warmup, "untimed iterations per size");
  b->add_flag("--check", args->check, "check every result (the default)");
  b->add_flag("--no-check", args->no_check, "skip the result check");
  b->add_option("--json", args->json, "write one JSON object per row to PATH ('-' = stdout)")
      ->expected(0, 1)
      ->default_str("-");
  b->add_flag("--tunables", args->tunables, "list every LOOM_* tunable and exit");
  b->add_flag("--probe", args->probe,
              "print the machine probes (memcpy and read GB/s, core-to-core flag latency) as JSON "
              "and exit");
  b->add_option("--calibrate", args->calibrate,
                "time every valid algorithm per op and size; write the winners to FILE, a "
                "tuning table for LOOM_TUNING_FILE (other topologies in FILE are kept)");
  b->add_flag("--shared", args->shared,
              "put the buffers in memory the local ranks share (Communicator::alloc_shared): "
              "messages are read in place instead of through the ring");
  b->add_option("--job-timeout", args->job_timeout,
                "with --np: stop the job after this many seconds");
  return [args, b]() -> int {
    if (args->tunables) {
      for (const auto& t : all_tunables())
        std::printf("%-24s default %-12s %s\n", t.env, t.default_text.c_str(), t.help);
      return 0;
    }
    if (args->probe) {
      const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
      std::printf(
          "{\"memcpy_gbps\":%.2f,\"memcpy_gbps_all_cores\":%.2f,\"read_gbps\":%.2f,"
          "\"read_gbps_all_cores\":%.2f,\"flag_latency_ns\":%.1f}\n",
          memcpy_gbps(256 << 20), memcpy_gbps_together(256 << 20, cores),
          read_gbps_together(256 << 20, 1), read_gbps_together(256 << 20, cores),
          flag_latency_ns());
      return 0;
    }
    if (b->count("--json") && args->json.empty()) args->json = "-";
    validate(*args);
    if (args->np > 0 && std::getenv("LOOM_RANK") == nullptr) {
      // Forward everything but --np to the ranks.
      std::vector<std::string> fwd = {"--op",     args->op,
                                      "--algo",   args->algo,
                                      "--dtype",  args->dtype,
                                      "--min",    args->min,
                                      "--max",    args->max,
                                      "--factor", std::to_string(args->factor),
                                      "--iters",  std::to_string(args->iters),
                                      "--warmup", std::to_string(args->warmup)};
      if (args->no_check) fwd.push_back("--no-check");
      if (args->shared) fwd.push_back("--shared");
      if (!args->json.empty()) fwd.insert(fwd.end(), {"--json", args->json});
      if (!args->calibrate.empty()) fwd.insert(fwd.end(), {"--calibrate", args->calibrate});
      args->forwarded = fwd;
      return run_launcher(*args);
    }
    return run_rank(*args);
  };
}

}  // namespace loom::apps
