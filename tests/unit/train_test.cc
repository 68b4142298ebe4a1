// The training configuration, checkpoint format and TensorBoard encoder, from outside.
#include <gtest/gtest.h>
#include <unistd.h>

#include <barrier>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <numeric>
#include <thread>

#include "loom/ckpt/checkpoint.h"
#include "loom/core/checksum.h"
#include "loom/core/error.h"
#include "loom/optim/adamw.h"
#include "loom/train/config.h"
#include "loom/train/divergence.h"
#include "loom/train/tensorboard.h"

namespace loom {
namespace {
namespace fs = std::filesystem;
using train::TrainConfig;

std::string temp_dir(const std::string& name) {
  fs::path p =
      fs::temp_directory_path() / ("loom-train-test-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

std::string write(const std::string& dir, const std::string& text) {
  const std::string path = dir + "/c.toml";
  std::ofstream(path) << text;
  return path;
}

// The message of the UserError that f throws ("" if none).
template <typename F>
std::string error_of(F f) {
  try {
    f();
  } catch (const UserError& e) {
    return std::string(e.what()) + " | " + e.hint();
  }
  return "";
}

TEST(Config, FileThenOverridesWithTypesChecked) {
  auto dir = temp_dir("cfg");
  auto path = write(dir,
                    "[model]\nname = \"small\"\n[data]\npath = \"d\"\n[train]\nsteps = 7\n"
                    "[optim]\nlr = 1e-3\n");
  TrainConfig c = TrainConfig::load(
      path, {"optim.lr=3e-4", "run.dir=runs/x", "train.dtype=bf16", "optim.warmup_steps=2"});
  EXPECT_EQ(c.model_name, "small");
  EXPECT_EQ(c.steps, 7);
  EXPECT_DOUBLE_EQ(c.lr, 3e-4);
  EXPECT_EQ(c.run_dir, "runs/x");
  EXPECT_EQ(c.dtype, "bf16");
  EXPECT_EQ(c.warmup_steps, 2);
  // The resolved config round-trips through its TOML.
  auto again = TrainConfig::load(write(dir, c.to_toml()), {});
  EXPECT_EQ(again.to_toml(), c.to_toml());
}

TEST(Config, ErrorsNameTheKeyAndSuggest) {
  auto dir = temp_dir("cfgerr");
  auto base = write(dir, "[data]\npath = \"d\"\n");
  EXPECT_NE(error_of([&] {
              TrainConfig::load(base, {"train.stpes=3"});
            }).find("unknown config key 'train.stpes'"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              TrainConfig::load(base, {"train.stpes=3"});
            }).find("did you mean 'train.steps'"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              TrainConfig::load(base, {"train.steps=many"});
            }).find("train.steps = \"many\" is invalid: expected an integer"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              TrainConfig::load(base, {"train.micro_batch=0"});
            }).find("train.micro_batch = 0 is invalid: must be at least 1"),
            std::string::npos);
  EXPECT_NE(error_of([&] { TrainConfig::load(base, {"train.dtype=fp8"}); }).find("train.dtype"),
            std::string::npos);
  EXPECT_NE(error_of([&] { TrainConfig::load(base, {"optim.lr"}); }).find("not key=value"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              TrainConfig::load(write(dir, "[train]\nsteps = 3\n"), {});
            }).find("data.path is not set"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              TrainConfig::load(write(dir, "[data]\npath = 3\n"), {});
            }).find("data.path = 3 is invalid: expected a string"),
            std::string::npos);
  EXPECT_NE(
      error_of([&] { TrainConfig::load(write(dir, "[data\npath = 3\n"), {}); }).find("line 1"),
      std::string::npos);
  EXPECT_NE(error_of([&] { TrainConfig::load(dir + "/missing.toml", {}); }).find("missing.toml"),
            std::string::npos);
}

TEST(Config, BatchArithmetic) {
  TrainConfig c;
  c.micro_batch = 4, c.global_batch = 32;
  c.resolve_batch(2);
  EXPECT_EQ(c.grad_accum, 4);
  TrainConfig d;
  d.micro_batch = 4, d.grad_accum = 3;
  d.resolve_batch(2);
  EXPECT_EQ(d.global_batch, 24);
  TrainConfig e;
  e.micro_batch = 4, e.global_batch = 30;
  EXPECT_NE(error_of([&] { e.resolve_batch(2); }).find("train.global_batch = 30"),
            std::string::npos);
  TrainConfig f;
  f.micro_batch = 4, f.global_batch = 32, f.grad_accum = 2;
  EXPECT_NE(error_of([&] { f.resolve_batch(2); }).find("needs grad_accum 4"), std::string::npos);
}

TEST(Config, AutoDtypePicksTheFasterPrecision) {
  // An AVX2-only CPU (bf16 emulated, slower), an AVX-512 BF16 one (bf16 about twice fp32),
  // and a Xeon whose bf16 products ran at half the fp32 rate (issue 15).
  EXPECT_EQ(TrainConfig::resolve_dtype("auto", 90, 70), "fp32");
  EXPECT_EQ(TrainConfig::resolve_dtype("auto", 150, 290), "bf16");
  EXPECT_EQ(TrainConfig::resolve_dtype("auto", 310, 165), "fp32");
  EXPECT_EQ(TrainConfig::resolve_dtype("auto", 100, 105), "fp32");  // within noise: fp32's numbers
  EXPECT_EQ(TrainConfig::resolve_dtype("auto", 100, 300, false), "fp32");  // bf16 only emulated
  EXPECT_EQ(TrainConfig::resolve_dtype("bf16", 310, 165), "bf16");  // explicit: kept (warned)
  EXPECT_EQ(TrainConfig::resolve_dtype("fp32", 150, 290), "fp32");
  EXPECT_EQ(TrainConfig().dtype, "auto");
}

TEST(Schedule, WarmupThenCosineToTheFloor) {
  TrainConfig c;
  c.steps = 110, c.warmup_steps = 10, c.min_lr_ratio = 0.1;
  const optim::LrSchedule s = c.schedule(1.0);
  EXPECT_DOUBLE_EQ(s.at(0), 0.1);
  EXPECT_DOUBLE_EQ(s.at(9), 1.0);
  EXPECT_DOUBLE_EQ(s.at(10), 1.0);
  EXPECT_NEAR(s.at(60), 0.55, 1e-12);
  EXPECT_NEAR(s.at(110), 0.1, 1e-12);
}

// The moments streamed from a file in chunks (several of them, the last partial, two ranges
// in one file) update the parameters with the same bits as moments in memory.
TEST(AdamW, MomentsInAFileEqualMomentsInMemoryOverSeveralChunks) {
  const size_t n = (size_t{5} << 20) + 12345;  // 2.5 chunks of 2^21 elements
  const std::vector<optim::DecaySpan> spans = {{0, 3000000, true}, {3000000, n + 100, false}};
  const std::string dir = temp_dir("moments");
  optim::MomentFile file(dir, 0);
  optim::AdamW first(spans, 0, 100, &file);  // the second range starts past offset 0
  optim::AdamW disk(spans, 100, n + 100, &file), memory(spans, 100, n + 100);
  std::vector<float> p_disk(n), p_mem(n), g(n);
  for (size_t i = 0; i < n; ++i) p_disk[i] = p_mem[i] = 0.01f * static_cast<float>(i % 97) - 0.4f;
  const optim::AdamWParams ap;
  for (int t = 1; t <= 3; ++t) {
    for (size_t i = 0; i < n; ++i)
      g[i] = 0.001f * static_cast<float>((i * 31 + static_cast<size_t>(t) * 7) % 101) - 0.05f;
    disk.step(p_disk.data(), g.data(), 0.5f, 1e-3, ap, t);
    memory.step(p_mem.data(), g.data(), 0.5f, 1e-3, ap, t);
  }
  EXPECT_EQ(0, std::memcmp(p_disk.data(), p_mem.data(), n * sizeof(float)));
  std::vector<float> m(n);
  for (auto which : {optim::AdamW::kM, optim::AdamW::kV}) {
    disk.read(which, 0, n, m.data());
    EXPECT_EQ(0, std::memcmp(m.data(), memory.in_memory(which), n * sizeof(float)));
  }
  EXPECT_GT(file.bytes_read(), 3.0 * 2 * n * sizeof(float) - 1);
  fs::remove_all(dir);
}

// A rank's units as one stream (AdamW::step_all): three ranges of one file, chunks that end
// inside a range and at its boundary, and a range with its moments in memory between them,
// update with the same bits as each range stepped alone in memory.
TEST(AdamW, OneStreamOverSeveralRangesEqualsMomentsInMemory) {
  const size_t n = 10000;
  const std::vector<optim::DecaySpan> spans = {{0, 2500, true}, {2500, n, false}};
  const std::string dir = temp_dir("moments-stream");
  optim::MomentFile file(dir, 0, /*chunk=*/1000);
  const std::vector<std::pair<size_t, size_t>> cuts = {
      {0, 2000}, {2000, 2333}, {2333, 7000}, {7000, n}};
  std::vector<std::unique_ptr<optim::AdamW>> streamed, memory;
  for (size_t i = 0; i < cuts.size(); ++i) {
    const bool in_file = i != 2;  // the third stays in memory
    streamed.push_back(std::make_unique<optim::AdamW>(spans, cuts[i].first, cuts[i].second,
                                                      in_file ? &file : nullptr));
    memory.push_back(std::make_unique<optim::AdamW>(spans, cuts[i].first, cuts[i].second));
  }
  std::vector<float> p_stream(n), p_mem(n), g(n);
  for (size_t i = 0; i < n; ++i) p_stream[i] = p_mem[i] = 0.01f * static_cast<float>(i % 89) - 0.3f;
  const optim::AdamWParams ap;
  for (int t = 1; t <= 3; ++t) {
    for (size_t i = 0; i < n; ++i)
      g[i] = 0.001f * static_cast<float>((i * 37 + static_cast<size_t>(t) * 11) % 103) - 0.05f;
    std::vector<optim::AdamW::RangeStep> ranges;
    for (size_t i = 0; i < cuts.size(); ++i) {
      const size_t b = cuts[i].first;
      ranges.push_back({streamed[i].get(), p_stream.data() + b, g.data() + b});
      memory[i]->step(p_mem.data() + b, g.data() + b, 0.5f, 1e-3, ap, t);
    }
    // Each range is reported once, when its parameters are already final (what the overlapped
    // step's waiters rely on): the range in memory first, then the file's in their order.
    std::vector<size_t> reported;
    optim::AdamW::step_all(ranges, 0.5f, 1e-3, ap, t, [&](size_t i) {
      reported.push_back(i);
      const size_t b = cuts[i].first, k = cuts[i].second - b;
      EXPECT_EQ(0, std::memcmp(p_stream.data() + b, p_mem.data() + b, k * sizeof(float)))
          << "range " << i << " reported before its update was done, step " << t;
    });
    EXPECT_EQ(reported, (std::vector<size_t>{2, 0, 1, 3}));
  }
  EXPECT_EQ(0, std::memcmp(p_stream.data(), p_mem.data(), n * sizeof(float)));
  // Three steps of the file's 5,333 elements, m and v, each read and written once.
  EXPECT_EQ(file.bytes_read(), 3.0 * 2 * 5333 * sizeof(float));
  EXPECT_EQ(file.bytes_written(), 3.0 * 2 * 5333 * sizeof(float));
  for (size_t i = 0; i < cuts.size(); ++i) {
    const size_t k = cuts[i].second - cuts[i].first;
    std::vector<float> m(k);
    for (auto which : {optim::AdamW::kM, optim::AdamW::kV}) {
      streamed[i]->read(which, 0, k, m.data());
      EXPECT_EQ(0, std::memcmp(m.data(), memory[i]->in_memory(which), k * sizeof(float)))
          << "range " << i << (which == optim::AdamW::kM ? " m" : " v");
    }
  }
  fs::remove_all(dir);
}

// zero.offload_master: the fp32 master weights stream from the file with the moments (two
// ranges, chunks ending inside and at a range's end): over 3 steps the master equals in-memory
// AdamW's parameters bit for bit, `fresh` hands over every element once per step with its
// updated value before the range is reported, and the caller's parameters are not read.
TEST(AdamW, MasterWeightsInAFileEqualInMemoryAdamW) {
  const size_t n = 5000;
  const std::vector<optim::DecaySpan> spans = {{0, 1200, true}, {1200, n, false}};
  const std::string dir = temp_dir("master");
  optim::MomentFile file(dir, 0, /*chunk=*/1000);
  const std::vector<std::pair<size_t, size_t>> cuts = {{0, 1500}, {1500, n}};
  std::vector<std::unique_ptr<optim::AdamW>> streamed, memory;
  std::vector<float> p_mem(n), g(n), seen(n, std::nanf("")), master(n);
  for (size_t i = 0; i < n; ++i) p_mem[i] = 0.01f * static_cast<float>(i % 83) - 0.3f;
  for (const auto& [b, e] : cuts) {
    streamed.push_back(std::make_unique<optim::AdamW>(spans, b, e, &file, /*master=*/true));
    memory.push_back(std::make_unique<optim::AdamW>(spans, b, e));
    streamed.back()->write(optim::AdamW::kMaster, 0, e - b, p_mem.data() + b);
  }
  const optim::AdamWParams ap;
  for (int t = 1; t <= 3; ++t) {
    for (size_t i = 0; i < n; ++i)
      g[i] = 0.001f * static_cast<float>((i * 41 + static_cast<size_t>(t) * 13) % 107) - 0.05f;
    std::vector<optim::AdamW::RangeStep> ranges;
    for (size_t i = 0; i < cuts.size(); ++i) {
      const size_t b = cuts[i].first;
      ranges.push_back({streamed[i].get(), nullptr, g.data() + b});
      memory[i]->step(p_mem.data() + b, g.data() + b, 0.5f, 1e-3, ap, t);
    }
    std::vector<int> handed(n, 0);
    std::vector<size_t> reported;
    optim::AdamW::step_all(
        ranges, 0.5f, 1e-3, ap, t,
        [&](size_t i) {
          reported.push_back(i);
          for (size_t k = cuts[i].first; k < cuts[i].second; ++k)
            ASSERT_EQ(handed[k], 1) << "range " << i << " reported before element " << k;
        },
        [&](size_t i, size_t lo, size_t hi, const float* v) {
          for (size_t k = lo; k < hi; ++k) ++handed[cuts[i].first + k];
          std::copy(v, v + (hi - lo),
                    seen.begin() + static_cast<std::ptrdiff_t>(cuts[i].first + lo));
        });
    EXPECT_EQ(reported, (std::vector<size_t>{0, 1}));
    EXPECT_TRUE(std::all_of(handed.begin(), handed.end(), [](int h) { return h == 1; }));
    EXPECT_EQ(0, std::memcmp(seen.data(), p_mem.data(), n * sizeof(float))) << "step " << t;
  }
  for (size_t i = 0; i < cuts.size(); ++i)
    streamed[i]->read(optim::AdamW::kMaster, 0, cuts[i].second - cuts[i].first,
                      master.data() + cuts[i].first);
  EXPECT_EQ(0, std::memcmp(master.data(), p_mem.data(), n * sizeof(float)));
  // The master written once at the start; then three steps, m, v and the master of every
  // element read and written once each (and the master read back above).
  EXPECT_EQ(file.bytes_written(), n * sizeof(float) + 3.0 * 3 * n * sizeof(float));
  EXPECT_EQ(file.bytes_read(), 3.0 * 3 * n * sizeof(float) + n * sizeof(float));
  fs::remove_all(dir);
}

TEST(TensorBoard, Crc32cKnownAnswer) {
  EXPECT_EQ(train::crc32c("123456789", 9), 0xE3069283u);  // the Castagnoli check value
}

// Two writer ranks (threads) each write half of every tensor; a reader gets any range back.
TEST(Checkpoint, ShardedSaveReadsBackAnyRange) {
  auto root = temp_dir("ckpt");
  std::vector<float> full(1000);
  for (size_t i = 0; i < full.size(); ++i) full[i] = static_cast<float>(i) * 0.5f;
  std::barrier sync(2);
  auto rank = [&](int r) {
    ckpt::SaveOptions o{root, 5, r, 2, 2, [&] { sync.arrive_and_wait(); }};
    std::vector<ckpt::Piece> pieces = {
        {"param/w", {10, 100}, {{}, {}, r * 500, 500}, full.data() + r * 500},
        {"adam_m/w", {10, 100}, {{}, {}, r * 500, 500}, full.data() + r * 500}};
    ckpt::save(o, pieces, {{"next_step", 5}});
  };
  std::thread t0(rank, 0), t1(rank, 1);
  t0.join(), t1.join();
  EXPECT_EQ(ckpt::latest(root), root + "/step_00000005");
  ckpt::Reader rd(ckpt::latest(root));
  EXPECT_EQ(rd.meta()["next_step"], 5);
  EXPECT_EQ(rd.shape("param/w"), (std::vector<int64_t>{10, 100}));
  std::vector<float> got(300);
  rd.read("param/w", 400, 300, got.data());  // spans both pieces
  for (int i = 0; i < 300; ++i) ASSERT_EQ(got[i], full[400 + i]);
  EXPECT_NE(error_of([&] { rd.read("param/nope", 0, 1, got.data()); }).find("param/nope"),
            std::string::npos);
  // Corruption is detected and names the file.
  {
    std::fstream f(root + "/step_00000005/data-00001.bin",
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(8);
    f.put('x');
  }
  EXPECT_NE(error_of([&] {
              rd.read("param/w", 900, 10, got.data());
            }).find("data-00001.bin fails its checksum"),
            std::string::npos);
  EXPECT_EQ(error_of([&] { rd.read("param/w", 0, 10, got.data()); }),
            "");  // rank 0's piece is fine
}

// Four writers as tensor parallelism x ZeRO write them: tp rank t holds the column box
// [3t, 3t+3) of a (4, 6) tensor, dp rank d the range [6d, 6d+6) of that box. Any region of
// any other split reads back; so does a format-1 checkpoint (whole-tensor ranges) of the
// same elements under another shape.
TEST(Checkpoint, BoxesOfTensorParallelShardsReadBackInAnyLayout) {
  auto root = temp_dir("ckptbox");
  std::vector<float> whole(24);
  std::iota(whole.begin(), whole.end(), 0.0f);  // element = its flat index
  std::barrier sync(4);
  auto rank = [&](int r) {
    const int t = r % 2, d = r / 2;
    std::vector<float> box;  // rows of columns 3t..3t+2, row-major in the box
    for (int row = 0; row < 4; ++row)
      for (int c = 0; c < 3; ++c) box.push_back(whole[row * 6 + 3 * t + c]);
    ckpt::SaveOptions o{root, 1, r, 4, 2, [&] { sync.arrive_and_wait(); }};
    ckpt::save(o, {{"param/w", {4, 6}, {{0, 3 * t}, {4, 3}, 6 * d, 6}, box.data() + 6 * d}},
               {{"next_step", 1}});
  };
  std::vector<std::thread> ts;
  for (int r = 0; r < 4; ++r) ts.emplace_back(rank, r);
  for (auto& t : ts) t.join();
  ckpt::Reader rd(ckpt::latest(root));
  std::vector<float> got(24);
  rd.read("param/w", {4, 6}, {{}, {}, 0, 24}, got.data());
  EXPECT_EQ(got, whole);
  rd.read("param/w", {4, 6}, {{1, 0}, {2, 6}, 0, 12}, got.data());  // rows 1-2
  for (int i = 0; i < 12; ++i) EXPECT_EQ(got[i], 6 + i);
  // tp 4's second column box (columns 1-2), elements 1..5 of it.
  rd.read("param/w", {4, 6}, {{0, 1}, {4, 2}, 1, 5}, got.data());
  EXPECT_EQ(std::vector<float>(got.begin(), got.begin() + 5),
            (std::vector<float>{2, 7, 8, 13, 14}));
  EXPECT_NE(error_of([&] {
              rd.read("param/w", {3, 8}, {{}, {}, 0, 24}, got.data());
            }).find("stored with another shape"),
            std::string::npos);
  // Format 1: a (6, 4) tensor in two flat ranges, read as (4, 6) by flat index.
  const std::string v1 = root + "/v1";
  fs::create_directories(v1);
  std::ofstream(v1 + "/data-00000.bin", std::ios::binary)
      .write(reinterpret_cast<const char*>(whole.data()), 24 * sizeof(float));
  nlohmann::json pieces = nlohmann::json::array();
  for (int h = 0; h < 2; ++h)
    pieces.push_back({{"file", "data-00000.bin"},
                      {"offset", h * 12 * sizeof(float)},
                      {"begin", 12 * h},
                      {"count", 12},
                      {"checksum", checksum64(whole.data() + 12 * h, 12 * sizeof(float))}});
  nlohmann::json manifest = {
      {"format", "loom-checkpoint"},
      {"version", 1},
      {"meta", {{"next_step", 3}}},
      {"tensors", {{"param/w", {{"shape", {6, 4}}, {"dtype", "f32"}, {"pieces", pieces}}}}}};
  std::ofstream(v1 + "/manifest.json") << manifest.dump();
  ckpt::Reader old(v1);
  old.read("param/w", {4, 6}, {{0, 3}, {4, 3}, 0, 12}, got.data());
  EXPECT_EQ(std::vector<float>(got.begin(), got.begin() + 12),
            (std::vector<float>{3, 4, 5, 9, 10, 11, 15, 16, 17, 21, 22, 23}));
}

// Findings of tests/fuzz/config_fuzz.cc: toml++ 3.3 reaches __builtin_unreachable on some
// non-ASCII characters wherever it asks whether one is whitespace (outside strings, after a
// backslash in one, inside a bare token), so it never sees one: the text is given to it
// with every byte >= 0x80 and '@' as "@XX", and strings are decoded back. (Mutation
// checked: parsing the raw text, the first error names toml++'s description instead, and
// UBSan reports the unreachable on the three fuzz inputs in tests/fuzz/corpus.)
// train.on_nonfinite's decisions: a non-finite loss or gradient norm is bad; skips up to
// max_skips in a row, then stop; a good step resets the run; rewinds up to max_rewinds.
TEST(Divergence, PoliciesAndTheirLimits) {
  using namespace train;  // NOLINT: the guard's names
  const double nan = std::numeric_limits<double>::quiet_NaN();
  using A = DivergenceGuard::Action;
  DivergenceGuard skip(OnNonFinite::kSkip, 2, 0, 0);
  EXPECT_FALSE(skip.judge(3.0, false).bad());
  EXPECT_FALSE(skip.judge(nan, false).loss_finite);
  EXPECT_FALSE(skip.judge(3.0, true).grads_finite);
  EXPECT_TRUE(skip.judge(std::numeric_limits<double>::infinity(), false).bad());
  const StepHealth bad = skip.judge(3.0, true);
  EXPECT_EQ(skip.decide(bad, 3.0), A::kSkip);
  EXPECT_EQ(skip.decide(bad, 3.0), A::kSkip);
  EXPECT_EQ(skip.decide(skip.judge(3.0, false), 3.0), A::kUpdate);  // ends the run of skips
  EXPECT_EQ(skip.decide(bad, 3.0), A::kSkip);
  EXPECT_EQ(skip.decide(bad, 3.0), A::kSkip);
  EXPECT_EQ(skip.decide(bad, 3.0), A::kStop);  // the third in a row (max_skips = 2)
  EXPECT_EQ(skip.skipped(), 4);
  EXPECT_NE(skip.why_stop().find("train.max_skips = 2"), std::string::npos);

  DivergenceGuard rewind(OnNonFinite::kRewind, 0, 1, 0);
  EXPECT_EQ(rewind.decide(bad, 3.0), A::kRewind);
  EXPECT_EQ(rewind.decide(bad, 3.0), A::kStop);
  EXPECT_NE(rewind.why_stop().find("train.max_rewinds = 1"), std::string::npos);
  DivergenceGuard stop(OnNonFinite::kStop, 5, 5, 0);
  EXPECT_EQ(stop.decide(bad, 3.0), A::kStop);
  EXPECT_EQ(parse_on_nonfinite("rewind"), OnNonFinite::kRewind);
  EXPECT_THROW(parse_on_nonfinite("retry"), UserError);
}

// train.spike_factor: a finite loss above factor x the median of the last good losses is a
// spike (judged once 10 are in); spikes do not enter the window, so they do not raise it.
TEST(Divergence, SpikesAgainstTheRunningMedian) {
  using namespace train;  // NOLINT: the guard's names
  DivergenceGuard g(OnNonFinite::kRewind, 0, 100, 4.0);
  for (int i = 0; i < 9; ++i) {
    EXPECT_FALSE(g.judge(1000.0, false).bad()) << "judged before 10 losses";
    g.decide(g.judge(2.0 + 0.01 * i, false), 2.0 + 0.01 * i);
  }
  g.decide(g.judge(100.0, false), 100.0);  // the 10th: an outlier, but not judged yet
  const StepHealth h = g.judge(8.5, false);
  EXPECT_TRUE(h.spike);  // the median of 2.00..2.08 and 100 is 2.05: 8.5 > 4 x 2.05
  EXPECT_DOUBLE_EQ(h.median, 2.05);
  EXPECT_NE(h.what(8.5, 4.0).find("spiked above 4 x"), std::string::npos);
  EXPECT_FALSE(g.judge(8.1, false).spike);
  EXPECT_EQ(g.decide(h, 8.5), DivergenceGuard::Action::kRewind);
  EXPECT_TRUE(g.judge(8.5, false).spike);  // the spike did not join the window
  DivergenceGuard off(OnNonFinite::kStop, 0, 0, 0);
  for (int i = 0; i < 20; ++i) off.decide(off.judge(2.0, false), 2.0);
  EXPECT_FALSE(off.judge(1e6, false).bad());
}

TEST(Config, NonAsciiNeverReachesToml) {
  auto dir = temp_dir("cfgutf8");
  EXPECT_NE(error_of([&] {
              TrainConfig::load(write(dir, "[data]\npath = \"d\"\u00e9\n"), {});
            }).find("line 2, column 11): a non-ASCII character outside a string"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              TrainConfig::load(write(dir, "[data]\npath = \"\"\"a\\\u03de\"\"\"\n"), {});
            }).find("line 2"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              TrainConfig::load(write(dir, "[optim]\nlr=1'op'op'&\u03d2.\n"), {});
            }).find("line 2"),
            std::string::npos);
  // Inside strings and comments, any text; '@' and "@XX" are only text.
  TrainConfig c = TrainConfig::load(
      write(dir,
            "# \u00e9t\u00e9\n[data]\npath = \"caf\u00e9/\u0416@41\" # \u0416\n"
            "[run]\ndir = '''\u3042@@\u00e9'''\n[pp]\nsplit = [ 1,\n  # \u00e9\n  3 ]\n"),
      {});
  EXPECT_EQ(c.data_path, "caf\u00e9/\u0416@41");
  EXPECT_EQ(c.run_dir, "\u3042@@\u00e9");
  // What `loom train` writes to the run folder reads back the same.
  const TrainConfig again = TrainConfig::load(write(dir, c.to_toml()), {});
  EXPECT_EQ(again.data_path, c.data_path);
  EXPECT_EQ(again.run_dir, c.run_dir);
  // Overrides: TOML values, or bare strings, non-ASCII or not.
  EXPECT_EQ(TrainConfig::load("", {"data.path=\u0416/d@41", "run.dir=r"}).data_path, "\u0416/d@41");
  EXPECT_EQ(TrainConfig::load("", {"data.path=\"\u00e9\"", "run.dir=r"}).data_path, "\u00e9");
  EXPECT_EQ(error_of([&] { TrainConfig::load(write(dir, ""), {"data.path=d"}); }), "");
}

// Findings of tests/fuzz/ckpt_manifest_fuzz.cc: a manifest's fields are checked for type and
// range when it is opened, so damage is a UserError naming the manifest, never nlohmann's
// type_error, a read of a file outside the folder, a read past a piece's box, or an
// allocation of what a count claims. (Mutation checked: without manifest_problem() the
// first four throw type_error or read outside the tensor under ASan.)
TEST(Checkpoint, DamagedManifestsAreRefusedByName) {
  auto dir = temp_dir("ckptbad");
  std::vector<float> data(64);
  std::iota(data.begin(), data.end(), 0.0f);
  std::ofstream(dir + "/data-00000.bin", std::ios::binary)
      .write(reinterpret_cast<const char*>(data.data()), 256);
  const uint64_t sum = checksum64(data.data(), 256);
  auto manifest = [&](const std::string& tensor) {
    std::ofstream(dir + "/manifest.json")
        << R"({"format": "loom-checkpoint", "version": 2, "meta": {}, "tensors": {"w": )" << tensor
        << "}}";
  };
  auto piece = [&](const std::string& extra) {
    return R"({"shape": [8, 8], "pieces": [{"file": "data-00000.bin", "offset": 0, "begin": 0,
               "count": 64, "checksum": )" +
           std::to_string(sum) + extra + "}]}";
  };
  manifest(piece(""));
  std::vector<float> got(64);
  ckpt::Reader(dir).read("w", 0, 64, got.data());
  EXPECT_EQ(got, data);
  auto refused = [&](const std::string& tensor, const std::string& needle) {
    manifest(tensor);
    const std::string e = error_of([&] {
      ckpt::Reader r(dir);
      r.read("w", 0, 64, got.data());
    });
    EXPECT_NE(e.find(needle), std::string::npos) << tensor << ": " << e;
  };
  refused(R"({"shape": "8x8", "pieces": []})", "has no valid shape");
  refused(R"({"shape": [8, 8], "pieces": [{"file": "data-00000.bin"}]})", "\"offset\" is not");
  refused(piece(R"(, "start": [0], "extent": [8])"), "do not match the tensor's rank");
  refused(piece(R"(, "start": [4, 0], "extent": [8, 8])"), "lies outside the tensor");
  std::string outside = piece("");
  outside.replace(outside.find("data-00000.bin"), 14, "../etc/passwd");
  refused(outside, "is not a file name inside the checkpoint");
  std::string half = piece("");
  half.replace(half.find("\"count\": 64"), 11, "\"count\": 32");
  refused(half, "do not cover");
  // A count the file cannot hold: refused before its buffer is allocated.
  std::string huge = R"({"shape": [1099511627776], "pieces": [{"file": "data-00000.bin",
      "offset": 0, "begin": 0, "count": 1099511627776, "checksum": 1}]})";
  manifest(huge);
  EXPECT_NE(error_of([&] { ckpt::Reader(dir).read("w", 0, 1, got.data()); }).find("truncated"),
            std::string::npos);
  std::ofstream(dir + "/manifest.json") << R"({"format": "loom-checkpoint", "version": "2"})";
  EXPECT_NE(error_of([&] { ckpt::Reader r(dir); }).find("not a loom checkpoint"),
            std::string::npos);
  std::ofstream(dir + "/manifest.json") << "[]";
  EXPECT_NE(error_of([&] { ckpt::Reader r(dir); }).find("not a loom checkpoint"),
            std::string::npos);
  fs::remove_all(dir);
}

TEST(Checkpoint, InterruptedSaveLeavesThePreviousOneAndKeepPrunes) {
  auto root = temp_dir("ckpt2");
  std::vector<float> x(10, 1.0f);
  for (int step : {1, 2, 3}) {
    ckpt::SaveOptions o;
    o.root = root, o.step = step, o.keep = 2;
    ckpt::save(o, {{"param/x", {10}, {{}, {}, 0, 10}, x.data()}}, {{"next_step", step}});
  }
  EXPECT_FALSE(fs::exists(root + "/step_00000001"));  // pruned: keep = 2
  // A save that died half-way: a staging folder without a manifest.
  fs::create_directories(root + "/.step_00000004.tmp");
  std::ofstream(root + "/.step_00000004.tmp/data-00000.bin") << "partial";
  EXPECT_EQ(ckpt::latest(root), root + "/step_00000003");
  EXPECT_NE(
      error_of([&] { ckpt::Reader r(root + "/.step_00000004.tmp"); }).find("manifest.json missing"),
      std::string::npos);
}

// ckpt.keep counts finite checkpoints only: with keep = 1, the finite step 2 survives the
// non-finite steps 3 and 4 after it (kept too: the newest state), and goes only when the
// finite step 5 is saved.
TEST(Checkpoint, KeepCountsOnlyFiniteCheckpoints) {
  auto root = temp_dir("ckpt3");
  std::vector<float> x(10, 1.0f);
  auto save = [&](int step, bool finite) {
    ckpt::SaveOptions o;
    o.root = root, o.step = step, o.keep = 1;
    ckpt::save(o, {{"param/x", {10}, {{}, {}, 0, 10}, x.data()}},
               {{"next_step", step}, {"finite", finite}});
  };
  save(1, true);
  save(2, true);
  EXPECT_FALSE(fs::exists(root + "/step_00000001"));
  save(3, false);
  save(4, false);
  for (const char* s : {"/step_00000002", "/step_00000003", "/step_00000004"})
    EXPECT_TRUE(fs::exists(root + s)) << s;
  EXPECT_EQ(ckpt::latest(root), root + "/step_00000004");
  EXPECT_EQ(ckpt::latest_finite(root), root + "/step_00000002");
  save(5, true);
  for (const char* s : {"/step_00000002", "/step_00000003", "/step_00000004"})
    EXPECT_FALSE(fs::exists(root + s)) << s;
  EXPECT_EQ(ckpt::latest_finite(root), root + "/step_00000005");
  fs::remove_all(root);
}

}  // namespace
}  // namespace loom
