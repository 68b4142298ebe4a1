#include "loom/data/prep.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "loom/core/cpus.h"
#include "loom/core/error.h"
#include "loom/data/shard.h"
#include "loom/data/text_source.h"

namespace loom::data {
namespace fs = std::filesystem;

namespace {

constexpr size_t kChunkTarget = 64 << 10;
constexpr size_t kBatchText = 8 << 20;  // text tokenized per parallel batch

bool ascii_letter(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}
bool js_space_ascii(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

struct Chunk {
  size_t file;  // index into the batch's texts
  size_t begin, end;
  bool val;
  std::vector<int> ids;
};

class Progress {
 public:
  Progress(uint64_t total, bool enabled) : total_(total), enabled_(enabled), tty_(::isatty(2)) {
    start_ = last_ = std::chrono::steady_clock::now();
  }
  void update(uint64_t done, bool force = false) {
    if (!enabled_) return;
    auto now = std::chrono::steady_clock::now();
    double since = std::chrono::duration<double>(now - last_).count();
    double pct = total_ ? 100.0 * done / total_ : 100;
    if (!force && (tty_ ? since < 0.25 : pct < next_pct_)) return;
    last_ = now;
    next_pct_ = std::floor(pct / 10) * 10 + 10;
    double el = std::chrono::duration<double>(now - start_).count();
    double mbs = el > 0 ? done / el / 1e6 : 0;
    double eta = mbs > 0 ? (total_ - done) / 1e6 / mbs : 0;
    std::fprintf(stderr, "%sprep %5.1f%% %8.1f MB of %.1f MB  %6.1f MB/s  ETA %4.0f s%s",
                 tty_ ? "\r" : "", pct, done / 1e6, total_ / 1e6, mbs, eta, tty_ ? "" : "\n");
    std::fflush(stderr);
  }
  void finish() {
    if (enabled_ && tty_) std::fprintf(stderr, "\n");
  }

 private:
  uint64_t total_;
  bool enabled_, tty_;
  double next_pct_ = 10;
  std::chrono::steady_clock::time_point start_, last_;
};

// Accumulates one split's tokens and writes a shard whenever a shard's worth is there.
class SplitWriter {
 public:
  SplitWriter(std::string dir, std::string name, uint32_t split, uint64_t shard_tokens)
      : dir_(std::move(dir)), name_(std::move(name)), split_(split), shard_tokens_(shard_tokens) {}
  void add(const std::vector<int>& ids) {
    for (int id : ids) push(static_cast<uint16_t>(id));
  }
  void push(uint16_t t) {
    buf_.push_back(t);
    ++total_;
    if (buf_.size() >= shard_tokens_) flush();
  }
  void flush() {
    if (buf_.empty()) return;
    char file[64];
    std::snprintf(file, sizeof file, "%s_%06d.bin", name_.c_str(),
                  static_cast<int>(shards_.size()));
    write_shard(dir_ + "/" + file, buf_, split_, static_cast<uint32_t>(shards_.size()),
                Gpt2Tokenizer::kVocabSize);
    shards_.push_back({file, buf_.size()});
    buf_.clear();
  }
  uint64_t total() const { return total_; }
  const std::vector<std::pair<std::string, uint64_t>>& shards() const { return shards_; }

 private:
  std::string dir_, name_;
  uint32_t split_;
  uint64_t shard_tokens_;
  std::vector<uint16_t> buf_;
  uint64_t total_ = 0;
  std::vector<std::pair<std::string, uint64_t>> shards_;
};

}  // namespace

std::vector<size_t> chunk_cuts(const std::string& t, size_t target) {
  std::vector<size_t> cuts;
  size_t last = 0;
  for (size_t p = target; p + 1 < t.size();) {
    // A cut at p: t[p-1] is not whitespace, t[p] is one space, t[p+1] an ASCII letter. The
    // piece before ends at p-1 and " word" starts at p whatever surrounds it.
    if (p > last && !js_space_ascii(t[p - 1]) && static_cast<unsigned char>(t[p - 1]) < 0x80 &&
        t[p] == ' ' && ascii_letter(t[p + 1])) {
      cuts.push_back(p);
      last = p;
      p += target;
    } else {
      ++p;
    }
  }
  return cuts;
}

PrepSummary run_prep(const PrepOptions& o, std::shared_ptr<const Gpt2Tokenizer> tok) {
  auto t0 = std::chrono::steady_clock::now();
  if (o.out.empty()) throw UserError("no output folder", "pass --out DIR");
  if (fs::exists(o.out))
    throw UserError("output folder " + o.out + " already exists",
                    "choose a new --out, or remove the old one if you mean to replace it");
  if (o.inputs.empty()) throw UserError("no inputs", "pass text files or folders with --input");
  if (!(o.val_fraction >= 0 && o.val_fraction < 1))
    throw UserError("--val-fraction " + std::to_string(o.val_fraction) + " is not in [0, 1)",
                    "e.g. --val-fraction 0.01");
  if (o.shard_bytes < 1024)
    throw UserError("--shard-size is below 1 KiB", "e.g. --shard-size 64MiB or 1GiB");
  std::vector<InputFile> files = list_inputs(o.inputs);
  PrepSummary sum;
  sum.files = files.size();
  for (const auto& f : files) sum.input_bytes += f.bytes;

  const std::string tmp = o.out + ".tmp-" + std::to_string(::getpid());
  fs::create_directories(tmp);
  try {
    const uint64_t shard_tokens = std::max<uint64_t>(1, o.shard_bytes / 2);
    SplitWriter train(tmp, "train", 0, shard_tokens), val(tmp, "val", 1, shard_tokens);
    const int threads = o.threads > 0 ? o.threads : cpus_available();
    std::vector<std::unique_ptr<Gpt2Tokenizer::Encoder>> encoders;
    for (int i = 0; i < threads; ++i)
      encoders.push_back(std::make_unique<Gpt2Tokenizer::Encoder>(tok));
    Progress progress(sum.input_bytes, o.progress);
    uint64_t chunk_index = 0, done_bytes = 0;

    size_t next_file = 0;
    while (next_file < files.size()) {
      // Read files until the batch holds enough text, and cut them into chunks.
      std::vector<std::string> texts;
      std::vector<Chunk> chunks;
      std::vector<size_t> last_chunk_of;  // per text: index of its last chunk
      size_t batch_text = 0;
      uint64_t batch_disk = 0;
      while (next_file < files.size() && batch_text < kBatchText) {
        texts.push_back(read_text(files[next_file].path));
        batch_disk += files[next_file].bytes;
        ++next_file;
        const std::string& t = texts.back();
        batch_text += t.size();
        sum.text_bytes += t.size();
        std::vector<size_t> cuts = chunk_cuts(t, kChunkTarget);
        size_t begin = 0;
        cuts.push_back(t.size());
        for (size_t c : cuts) {
          if (c == begin && c != 0) continue;
          bool is_val = o.val_fraction > 0 && std::floor((chunk_index + 1) * o.val_fraction + 0.5) >
                                                  std::floor(chunk_index * o.val_fraction + 0.5);
          chunks.push_back({texts.size() - 1, begin, c, is_val, {}});
          ++chunk_index;
          begin = c;
        }
        last_chunk_of.push_back(chunks.size() - 1);
      }
      // Tokenize the batch's chunks on every core.
      std::atomic<size_t> next{0};
      std::vector<std::thread> pool;
      std::vector<std::exception_ptr> errors(threads);
      for (int w = 0; w < threads; ++w) {
        pool.emplace_back([&, w] {
          try {
            for (size_t i; (i = next.fetch_add(1)) < chunks.size();) {
              Chunk& c = chunks[i];
              encoders[w]->encode(std::string_view(texts[c.file]).substr(c.begin, c.end - c.begin),
                                  c.ids);
            }
          } catch (...) {
            errors[w] = std::current_exception();
          }
        });
      }
      for (auto& th : pool) th.join();
      for (auto& e : errors)
        if (e) std::rethrow_exception(e);
      // Append in corpus order; end each document in every split that got part of it.
      size_t first = 0;
      for (size_t f = 0; f < texts.size(); ++f) {
        bool to_train = false, to_val = false;
        for (size_t i = first; i <= last_chunk_of[f]; ++i) {
          Chunk& c = chunks[i];
          if (c.ids.empty()) continue;
          (c.val ? val : train).add(c.ids);
          (c.val ? to_val : to_train) = true;
        }
        if (to_train) train.push(Gpt2Tokenizer::kEndOfText);
        if (to_val) val.push(Gpt2Tokenizer::kEndOfText);
        first = last_chunk_of[f] + 1;
      }
      sum.chunks += chunks.size();
      done_bytes += batch_disk;
      progress.update(done_bytes);
    }
    progress.update(done_bytes, true);
    progress.finish();
    if (train.total() + val.total() == 0)
      throw UserError(
          "the corpus is empty: no text in " + std::to_string(files.size()) + " file(s)",
          "check the --input paths");
    train.flush();
    val.flush();
    sum.train_tokens = train.total();
    sum.val_tokens = val.total();
    sum.train_shards = static_cast<int>(train.shards().size());
    sum.val_shards = static_cast<int>(val.shards().size());

    nlohmann::json m;
    m["format"] = "loom-tokens";
    m["version"] = kShardVersion;
    m["tokenizer"] = "gpt2 (r50k_base)";
    m["vocab_size"] = Gpt2Tokenizer::kVocabSize;
    m["eot"] = Gpt2Tokenizer::kEndOfText;
    m["val_fraction"] = o.val_fraction;
    m["files"] = sum.files;
    m["input_bytes"] = sum.input_bytes;
    for (auto* w : {&train, &val})
      for (auto& [file, n] : w->shards())
        m["shards"].push_back(
            {{"file", file}, {"split", w == &train ? "train" : "val"}, {"tokens", n}});
    std::ofstream(tmp + "/manifest.json") << m.dump(2) << "\n";
    if (fs::exists(o.out))
      throw UserError("output folder " + o.out + " appeared while preparing", "choose a new --out");
    fs::rename(tmp, o.out);
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw;
  }
  sum.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return sum;
}

}  // namespace loom::data
