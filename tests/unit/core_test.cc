// core: 16-bit float conversions, reductions, sizes, tunables, the tuning table.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <memory>

#include "loom/comm/reduce.h"
#include "loom/comm/tuning.h"
#include "loom/core/cpus.h"
#include "loom/core/dtype.h"
#include "loom/core/error.h"
#include "loom/core/tunable.h"

namespace loom {
namespace {

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
  // 1 + 2^-8 is halfway between bf16 1.0 and 1.0078125: ties to even (1.0).
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + std::ldexp(1.0f, -8))), 1.0f);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8))), 1.015625f);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
  EXPECT_TRUE(std::isinf(bf16_to_f32(f32_to_bf16(INFINITY))));
  for (int i = -256; i <= 256; ++i) EXPECT_EQ(bf16_to_f32(f32_to_bf16(float(i))), float(i));
}

TEST(DType, F16AllValuesRoundTrip) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    float f = f16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(f))));
      continue;
    }
    EXPECT_EQ(f32_to_f16(f), h) << std::hex << h;
  }
  EXPECT_EQ(f16_to_f32(f32_to_f16(65504.0f)), 65504.0f);
  EXPECT_TRUE(std::isinf(f16_to_f32(f32_to_f16(70000.0f))));
  EXPECT_EQ(f16_to_f32(f32_to_f16(5.9604645e-8f)), 5.9604645e-8f);  // smallest subnormal
}

TEST(Reduce, EveryDtypeAndOpAgainstScalars) {
  using comm::ReduceOp;
  for (int ti = 0; ti < static_cast<int>(DType::kCount); ++ti) {
    DType t = static_cast<DType>(ti);
    size_t es = dtype_size(t), n = 37;
    std::vector<uint8_t> a(n * es), b(n * es), d(n * es);
    auto put = [&](std::vector<uint8_t>& v, size_t i, double x) {
      store_element(t, v.data(), i, x);
    };
    auto get = [&](std::vector<uint8_t>& v, size_t i) { return load_element(t, v.data(), i); };
    for (size_t i = 0; i < n; ++i) put(a, i, double(i % 11)), put(b, i, double((i * 7) % 5));
    for (auto op : {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax}) {
      comm::reduce_into(d.data(), a.data(), b.data(), n, t, op);
      for (size_t i = 0; i < n; ++i) {
        double x = double(i % 11), y = double((i * 7) % 5);
        double want = op == ReduceOp::kSum    ? x + y
                      : op == ReduceOp::kProd ? x * y
                      : op == ReduceOp::kMin  ? std::min(x, y)
                                              : std::max(x, y);
        EXPECT_EQ(get(d, i), want) << dtype_name(t) << " " << comm::reduce_op_name(op) << " " << i;
      }
    }
    // in place: d = d + b
    comm::reduce_into(a.data(), a.data(), b.data(), n, t, ReduceOp::kSum);
    for (size_t i = 0; i < n; ++i) EXPECT_EQ(get(a, i), double(i % 11) + double((i * 7) % 5));
  }
}

TEST(Cpus, ListsFormatAsRangesAndParseBack) {
  EXPECT_EQ(format_cpu_list({0, 1, 2, 3, 8, 10, 11}), "0-3,8,10-11");
  EXPECT_EQ(parse_cpu_list("0-3,8,10-11"), (std::vector<int>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(format_cpu_list({}), "");
  for (const char* bad : {"", "x", "3-1", "1-", "-1", "1,,2", "2-3x", "99999"})
    EXPECT_TRUE(parse_cpu_list(bad).empty()) << bad;
}

TEST(Tunables, BytesParseAndErrors) {
  EXPECT_EQ(parse_bytes("4096", "x"), 4096u);
  EXPECT_EQ(parse_bytes("64K", "x"), 65536u);
  EXPECT_EQ(parse_bytes("1GiB", "x"), 1u << 30);
  EXPECT_THROW(parse_bytes("lots", "x"), UserError);
  EXPECT_THROW(parse_bytes("12Q", "x"), UserError);
  EXPECT_THROW(parse_bytes("99999999999999999999999", "x"), UserError);
  EXPECT_THROW(parse_bytes("17179869184G", "x"), UserError);  // 2^64 bytes
  // A size tunable takes the same sizes, and names itself when it cannot read one.
  static const BytesTunable kSize("LOOM_TEST_BYTES_TUNABLE", 1 << 20, "test");
  EXPECT_EQ(kSize.get(), 1 << 20);
  setenv("LOOM_TEST_BYTES_TUNABLE", "4M", 1);
  EXPECT_EQ(kSize.get(), 4 << 20);
  setenv("LOOM_TEST_BYTES_TUNABLE", "4 MiB", 1);
  try {
    kSize.get();
    ADD_FAILURE() << "'4 MiB' should not parse";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("LOOM_TEST_BYTES_TUNABLE"), std::string::npos) << e.what();
  }
  unsetenv("LOOM_TEST_BYTES_TUNABLE");
  setenv("LOOM_TEST_INT_TUNABLE", "abc", 1);
  IntTunable t("LOOM_TEST_INT_TUNABLE", 3, "test");
  EXPECT_THROW(t.get(), UserError);
  setenv("LOOM_TEST_INT_TUNABLE", "42", 1);
  EXPECT_EQ(t.get(), 42);
  unsetenv("LOOM_TEST_INT_TUNABLE");
  EXPECT_EQ(t.get(), 3);
}

TEST(Tuning, AutoPicksValidAlgorithmsAndHonoursOverrides) {
  using namespace comm;
  CostModel m = CostModel::from_env();
  for (int n : {2, 3, 4, 8}) {
    Topology t;
    t.size = n;
    t.hosts = {{}};
    for (int r = 0; r < n; ++r) t.host_of.push_back(0), t.hosts[0].push_back(r);
    for (int op = 0; op < static_cast<int>(OpKind::kSendRecv); ++op) {
      auto valid = valid_algos(static_cast<OpKind>(op), t);
      for (size_t bytes : {8ul, 4096ul, 1ul << 20, 256ul << 20}) {
        Algo a = choose_algo(static_cast<OpKind>(op), bytes, t, m, Algo::kAuto);
        EXPECT_NE(std::find(valid.begin(), valid.end(), a), valid.end());
      }
    }
    // Small allreduce: a latency-optimal algorithm; large, on one machine: shared (the
    // buffers' owners read and write each other's); with TCP forced: ring.
    EXPECT_NE(choose_algo(OpKind::kAllreduce, 8, t, m, Algo::kAuto), Algo::kRing);
    EXPECT_EQ(choose_algo(OpKind::kAllreduce, 256 << 20, t, m, Algo::kAuto), Algo::kShared);
    Topology tcp = t;
    tcp.force_tcp = true;
    EXPECT_EQ(choose_algo(OpKind::kAllreduce, 256 << 20, tcp, m, Algo::kAuto), Algo::kRing);
    EXPECT_NE(choose_algo(OpKind::kAllreduce, 256 << 20, tcp, m, Algo::kShared), Algo::kShared);
    EXPECT_EQ(choose_algo(OpKind::kAllreduce, 8, t, m, Algo::kDirect), Algo::kDirect);
    // hier is not valid on one host: the override falls back to auto
    EXPECT_NE(choose_algo(OpKind::kAllreduce, 8, t, m, Algo::kHier), Algo::kHier);
  }
}

// The chooser returns the cost model's winner, worked out by hand (docs/algorithms.md's
// formulas) for a pinned model: shm 0.4 us + 12 GB/s, TCP 30 us + 1.7 GB/s. A chooser that
// took the first valid algorithm, the last, or ignored the size would fail here.
TEST(Tuning, AutoPicksTheCostModelsWinner) {
  using namespace comm;
  const CostModel m{{0.4, 12.0}, {30.0, 1.7}};
  auto one_host = [](int n) {
    Topology t;
    t.size = n;
    t.hosts = {{}};
    for (int r = 0; r < n; ++r) t.host_of.push_back(0), t.hosts[0].push_back(r);
    return t;
  };
  auto machines = [](int h, int k) {  // h machines x k ranks, consecutive ranks per machine
    Topology t;
    t.size = h * k;
    t.hosts.resize(h);
    for (int r = 0; r < h * k; ++r) t.host_of.push_back(r / k), t.hosts[r / k].push_back(r);
    return t;
  };
  const Topology two_hosts = machines(2, 2), four_hosts = machines(4, 1),
                 four_by_two = machines(4, 2);
  Topology shared_four = one_host(4);  // every rank's buffers from 64 KiB on are shared
  shared_four.shared_from = 64 << 10;
  struct Case {
    OpKind op;
    Topology topo;
    size_t bytes;
    Algo want;
    const char* why;
  };
  const size_t MiB = 1 << 20;
  const Case cases[] = {
      // 4 ranks, 8 B: direct 0.4 + 0.1*2 = 0.6 us; rd 2 steps = 0.8; tree 1.6; ring 2.4.
      {OpKind::kAllreduce, one_host(4), 8, Algo::kDirect, "latency: one step to everyone"},
      // 256 MiB: shared 2*0.4*1.5 + 0.75 B/beta = 16.8 ms; ring 6*(0.4 + 64 MiB/12 GB/s) =
      // 33.6 ms; tree 2.5 B/beta = 55.9 ms; rd 67 ms.
      {OpKind::kAllreduce, one_host(4), 256 * MiB, Algo::kShared, "one pass, no staging"},
      // 512 KiB, under the shared algorithm's 1 MiB: ring 6*(0.4 + 128 KiB/beta) = 68.3 us;
      // direct 0.6 + 1.5*3*B/beta = 131.7 us; rd 2*(0.4 + 1.5 B/beta) = 132.0 us.
      {OpKind::kAllreduce, one_host(4), 512 * 1024, Algo::kRing, "bandwidth: 2(n-1)/n B"},
      // 4 ranks, 64 MiB reduce-scatter: shared 2*0.4*1.5 + 0.75*3*16 MiB/beta = 3147 us;
      // ring 3*(0.4 + 16 MiB/beta) = 4195.6 us; direct 0.6 + 4194.3 us.
      {OpKind::kReduceScatter, one_host(4), 64 * MiB, Algo::kShared, "each block read once"},
      // 512 KiB, under its 1 MiB minimum: direct 0.6 + 3*128 KiB/beta = 33.4 us; rd 33.6;
      // ring 3*(0.4 + 128 KiB/beta) = 34.0 us.
      {OpKind::kReduceScatter, one_host(4), 512 * 1024, Algo::kDirect, "below the minimum"},
      // The same 512 KiB where every rank's buffers from 64 KiB on are shared (the torch
      // backend's allocator): no minimum, shared 1.2 + 0.75 B/beta = 34.0 us against ring's
      // 68.3; and the reduce-scatter 1.2 + 0.75*3*128 KiB/beta = 25.8 us against direct's 33.4.
      {OpKind::kAllreduce, shared_four, 512 * 1024, Algo::kShared, "shared buffers: no minimum"},
      {OpKind::kReduceScatter, shared_four, 512 * 1024, Algo::kShared, "shared inputs"},
      // 32 KiB, under the size from which buffers are shared: ring 6*(0.4 + 8 KiB/beta) = 6.5
      // us; shared (were it allowed) 1.2 + 2.0 = 3.2: not chosen, the buffers are on the heap.
      {OpKind::kAllreduce, shared_four, 32 * 1024, Algo::kRing, "below the shared size"},
      // 2 ranks, 8 B: rd and direct both 0.40 us (rd listed first wins the tie).
      {OpKind::kAllreduce, one_host(2), 8, Algo::kRd, "tie goes to the first listed"},
      // 3 ranks (rd invalid for allgather), 8 B: direct 0.4 + 0.1 = 0.5 us; ring 2*0.4 = 0.8.
      {OpKind::kAllgather, one_host(3), 8, Algo::kDirect, "no rd for 3 ranks"},
      // 4 ranks, 64 MiB: ring 3*(0.4 + 16 MiB/beta) = 4195.6 us; rd 2*0.4 + 3*16 MiB/beta =
      // 4195.0 us; direct 0.6 + 4194.3 = 4194.9 us.
      {OpKind::kAllgather, one_host(4), 64 * MiB, Algo::kDirect, "fewest alphas at equal bytes"},
      // 8 ranks, 64 MiB: tree 3*0.4 + B/beta + 2*256 KiB/beta = 5636 us; ring 5726; direct 7x.
      {OpKind::kBroadcast, one_host(8), 64 * MiB, Algo::kTree, "pipelined tree"},
      // 2 x 2 ranks, 256 MiB: hier max(local 44.7 ms, inter 158 ms) = 158 ms; a flat ring
      // crosses TCP with 6*(30 us + 64 MiB/1.7 GB/s) = 237 ms.
      {OpKind::kAllreduce, two_hosts, 256 * MiB, Algo::kHier, "machines: the local step hides"},
      // 2 x 2 ranks, 256 MiB: hier max(local 0.4 + 256 MiB/beta_shm = 22.4 ms, inter 30 +
      // 128 MiB/1.7 GB/s = 79.0 ms) = 79.0 ms; ring 3*(30 us + 64 MiB/1.7 GB/s) = 118.5 ms.
      {OpKind::kReduceScatter, two_hosts, 256 * MiB, Algo::kHier, "machines: half the link bytes"},
      // 4 machines x 1 rank, 64 MiB: ring 3*(30 + 16 MiB/1.7 GB/s) = 29.7 ms; rd 2*30 us +
      // 1.1*48 MiB/1.7 GB/s = 32.6 ms (its rounds do not overlap across TCP: measured 13%
      // behind ring, docs/perf.md); direct 32.6 ms.
      {OpKind::kAllgather, four_hosts, 64 * MiB, Algo::kRing, "rd's rounds wait across TCP"},
      // 4 x 2 ranks, 256 MiB allgather: hier max(local 0.4 + 256 MiB/beta_shm = 22.4 ms,
      // inter 30 + 192 MiB/1.7 GB/s = 118.5 ms) + 30.8 us = 118.5 ms; ring 7*(30 + 32 MiB/
      // 1.7 GB/s) = 138.4 ms. (Summing the levels, 140.8 ms, had picked ring.)
      {OpKind::kAllgather, four_by_two, 256 * MiB, Algo::kHier, "pipelined: the slower level"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(choose_algo(c.op, c.bytes, c.topo, m, Algo::kAuto), c.want)
        << op_name(c.op) << " " << c.bytes << " B on " << c.topo.describe() << ": " << c.why;
    // The winner is also the smallest prediction among the valid algorithms.
    const double best = predict_us(c.op, c.want, c.bytes, c.topo, m);
    for (Algo a : valid_algos(c.op, c.topo))
      EXPECT_LE(best, predict_us(c.op, a, c.bytes, c.topo, m)) << algo_name(a);
  }
}

// A measured table (LOOM_TUNING_FILE, `loom bench --calibrate`) overrides the cost model
// for the topology and op it measured, at the nearest measured size; elsewhere the model
// decides; an override still wins; a malformed file is a one-line UserError.
TEST(Tuning, AMeasuredTableOverridesTheModelWhereItMeasured) {
  using namespace comm;
  Topology two_hosts;  // 2 machines x 2 ranks
  two_hosts.size = 4;
  two_hosts.host_of = {0, 0, 1, 1};
  two_hosts.hosts = {{0, 1}, {2, 3}};
  Topology one_host = two_hosts;
  one_host.host_of = {0, 0, 0, 0};
  one_host.hosts = {{0, 1, 2, 3}};
  const std::string path = ::testing::TempDir() + "/loom-tuning-test.json";
  {
    TuningTable t;
    t.tables[TuningTable::key_of(two_hosts)] = {
        {OpKind::kAllreduce, 1 << 20, Algo::kRing, {{"ring", 10}, {"hier", 12}}},
        {OpKind::kAllreduce, 64 << 20, Algo::kDirect, {{"direct", 100}, {"hier", 120}}}};
    std::ofstream(path) << t.to_json();
  }
  CostModel m{{0.4, 12.0}, {30.0, 1.7}};
  const CostModel plain = m;
  m.measured = std::make_shared<const TuningTable>(TuningTable::load(path));
  // The model alone picks hier for a large allreduce across machines (AutoPicksThe...).
  EXPECT_EQ(choose_algo(OpKind::kAllreduce, 256 << 20, two_hosts, plain, Algo::kAuto), Algo::kHier);
  EXPECT_EQ(choose_algo(OpKind::kAllreduce, 256 << 20, two_hosts, m, Algo::kAuto), Algo::kDirect)
      << "nearest measured size: 64 MiB";
  EXPECT_EQ(choose_algo(OpKind::kAllreduce, 2 << 20, two_hosts, m, Algo::kAuto), Algo::kRing)
      << "nearest measured size: 1 MiB";
  EXPECT_EQ(choose_algo(OpKind::kAllgather, 256 << 20, two_hosts, m, Algo::kAuto),
            choose_algo(OpKind::kAllgather, 256 << 20, two_hosts, plain, Algo::kAuto))
      << "an op it did not measure: the model";
  EXPECT_EQ(choose_algo(OpKind::kAllreduce, 256 << 20, one_host, m, Algo::kAuto),
            choose_algo(OpKind::kAllreduce, 256 << 20, one_host, plain, Algo::kAuto))
      << "a topology it did not measure: the model";
  EXPECT_EQ(choose_algo(OpKind::kAllreduce, 256 << 20, two_hosts, m, Algo::kTree), Algo::kTree);
  // The file round-trips, timings included.
  const TuningTable again = TuningTable::load(path);
  ASSERT_EQ(again.tables.size(), 1u);
  const auto& e = again.tables.begin()->second.at(1);
  EXPECT_EQ(e.algo, Algo::kDirect);
  EXPECT_EQ(e.bytes, size_t{64} << 20);
  EXPECT_EQ(e.us.at("hier"), 120);
  // Malformed files.
  EXPECT_THROW(TuningTable::load(path + ".missing"), UserError);
  std::ofstream(path) << "{\"tables\": [{\"nhosts\": 2}]}";
  EXPECT_THROW(TuningTable::load(path), UserError);
  std::ofstream(path) << R"({"tables": [{"nhosts": 2, "local": 2, "ranks": 4, "force_tcp": false,
                          "entries": [{"op": "allreduce", "bytes": 8, "algo": "warp"}]}]})";
  try {
    TuningTable::load(path);
    FAIL() << "an unknown algorithm was accepted";
  } catch (const UserError& err) {
    EXPECT_NE(std::string(err.what()).find("is not a tuning table"), std::string::npos);
    EXPECT_NE(err.hint().find("loom bench --calibrate"), std::string::npos);
  }
  std::remove(path.c_str());
}

}  // namespace
}  // namespace loom
