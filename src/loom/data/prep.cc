#include "loom/data/prep.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "loom/core/cpus.h"
#include "loom/core/error.h"
#include "loom/data/input.h"
#include "loom/data/shard.h"

namespace loom::data {
namespace fs = std::filesystem;

namespace {

constexpr size_t kChunkTarget = 64 << 10;
constexpr size_t kPieceTarget = 8 << 20;  // decompressed bytes a reader hands a worker
constexpr size_t kFirstBadShown = 5;

bool ascii_letter(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}
bool js_space_ascii(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
std::string display(const std::string& path) {
  return path == "-" ? "<stdin>" : path;
}

// One chunk's tokens, the document bytes behind them, and whether its document ends here.
struct Chunk {
  std::vector<int> ids;
  uint64_t bytes = 0;
  bool ends_document = false;
};

struct BadRecord {
  uint64_t line;  // within the piece, from 0
  std::string reason;
};

// A run of one input's decompressed bytes: whole JSON Lines records, or whole chunks of a
// text file. The reader fills the first part, a worker the second.
struct Piece {
  uint64_t seq = 0;
  size_t file = 0;
  InputFormat format = InputFormat::kText;
  std::string data;  // size bytes, then JsonlRecords::kPadding more
  size_t size = 0;
  bool file_end = false;     // the last piece of its file
  std::vector<size_t> cuts;  // text: where each chunk ends (the last one at size)
  uint64_t disk_bytes = 0;   // of the input file, consumed to read this piece
  std::exception_ptr error;  // reading or processing it failed
  // The worker's results.
  std::vector<Chunk> chunks;
  uint64_t lines = 0, documents = 0, filtered = 0;
  std::vector<BadRecord> bad;
};

// Cuts the inputs into pieces, in input order. Not thread-safe: one worker at a time.
class PieceReader {
 public:
  explicit PieceReader(const std::vector<InputFile>& files) : files_(files) {}

  // The next piece, or null after the last.
  std::unique_ptr<Piece> next() {
    if (!stream_) {
      if (file_ == files_.size()) return nullptr;
      stream_ = open_input(files_[file_].path);
      buf_.clear();
      eof_ = false;
      consumed_ = 0;
    }
    auto p = std::make_unique<Piece>();
    p->file = file_;
    p->format = files_[file_].format;
    size_t end = 0;
    for (size_t want = kPieceTarget;; want += kPieceTarget) {
      fill(want);
      if (eof_) {
        end = buf_.size();
        if (p->format == InputFormat::kText) {
          p->cuts = chunk_cuts(buf_, kChunkTarget);
          p->cuts.push_back(end);
        }
        p->file_end = true;
        break;
      }
      if (p->format == InputFormat::kText) {  // end at the last chunk cut
        p->cuts = chunk_cuts(buf_, kChunkTarget);
        if (!p->cuts.empty()) {
          end = p->cuts.back();
          break;
        }
      } else {  // end after the last whole line
        const void* nl = memrchr(buf_.data(), '\n', buf_.size());
        if (nl) {
          end = static_cast<size_t>(static_cast<const char*>(nl) - buf_.data()) + 1;
          break;
        }
      }
    }
    p->size = end;
    p->data.reserve(end + JsonlRecords::kPadding);
    p->data.assign(buf_.data(), end);
    p->data.append(JsonlRecords::kPadding, '\0');
    buf_.erase(0, end);
    p->disk_bytes = stream_->consumed() - consumed_;
    consumed_ = stream_->consumed();
    if (p->file_end) {
      stream_.reset();
      ++file_;
    }
    return p;
  }

 private:
  // Reads until the buffer holds `want` bytes or the file ends, a block at a time (a small
  // file costs its own size, not a piece's worth of zeroed buffer).
  void fill(size_t want) {
    while (!eof_ && buf_.size() < want) {
      const size_t n = stream_->read(block_.data(), std::min(block_.size(), want - buf_.size()));
      buf_.append(block_.data(), n);
      if (n == 0) eof_ = true;
    }
  }

  const std::vector<InputFile>& files_;
  size_t file_ = 0;
  std::unique_ptr<ByteStream> stream_;
  std::string buf_;  // the current file's bytes read and not yet handed out
  std::vector<char> block_ = std::vector<char>(1 << 20);
  bool eof_ = false;
  uint64_t consumed_ = 0;
};

// A worker's tools: its tokenizer memo and its JSON parser.
struct Worker {
  Gpt2Tokenizer::Encoder encoder;
  JsonlRecords records;

  void add_document(std::string_view text, Piece& p) {
    std::vector<size_t> cuts = chunk_cuts(text, kChunkTarget);
    cuts.push_back(text.size());
    tokenize(text, cuts, true, p);
  }
  // Chunks [0, cuts[0]), [cuts[0], cuts[1]), ...; the last one ends the document if `ends`.
  void tokenize(std::string_view text, const std::vector<size_t>& cuts, bool ends, Piece& p) {
    size_t begin = 0;
    for (size_t i = 0; i < cuts.size(); ++i) {
      Chunk c;
      encoder.encode(text.substr(begin, cuts[i] - begin), c.ids);
      c.bytes = cuts[i] - begin;
      c.ends_document = ends && i + 1 == cuts.size();
      p.chunks.push_back(std::move(c));
      begin = cuts[i];
    }
  }
  void process(Piece& p, bool skip_bad) {
    const std::string_view data(p.data.data(), p.size);
    if (p.format == InputFormat::kText) {
      tokenize(data, p.cuts, p.file_end, p);
      p.documents = p.file_end ? 1 : 0;
      return;
    }
    for (size_t at = 0; at < data.size(); ++p.lines) {
      const size_t nl = data.find('\n', at);
      const size_t end = nl == std::string_view::npos ? data.size() : nl;
      const std::string_view line = data.substr(at, end - at);
      at = end + 1;
      if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;  // blank
      JsonlRecords::Record r = records.parse(line);
      if (r.kind == JsonlRecords::Kind::kKept) {
        ++p.documents;
        add_document(r.text, p);
      } else if (r.kind == JsonlRecords::Kind::kFiltered) {
        ++p.filtered;
      } else {
        p.bad.push_back({p.lines, std::move(r.reason)});
        if (!skip_bad) return;  // prep stops at this piece
      }
    }
  }
};

// Pieces handed from the workers to the writer in input order. At most `window` pieces are
// read ahead of the writer, so memory stays bounded when one piece takes long.
class PieceQueue {
 public:
  explicit PieceQueue(uint64_t window) : window_(window) {}

  // A worker: waits until the window has room; false when prep stops.
  bool wait_for_room(uint64_t seq) {
    std::unique_lock l(mu_);
    cv_.wait(l, [&] { return stop_ || seq < written_ + window_; });
    return !stop_;
  }
  void put(std::unique_ptr<Piece> p) {
    std::lock_guard l(mu_);
    const uint64_t seq = p->seq;
    ready_[seq] = std::move(p);
    cv_.notify_all();
  }
  void set_total(uint64_t n) {
    std::lock_guard l(mu_);
    total_ = n;
    cv_.notify_all();
  }
  // The writer: piece seq, or null when there are only seq pieces.
  std::unique_ptr<Piece> take(uint64_t seq) {
    std::unique_lock l(mu_);
    cv_.wait(l, [&] { return ready_.count(seq) || seq >= total_; });
    if (seq >= total_) return nullptr;
    auto p = std::move(ready_[seq]);
    ready_.erase(seq);
    written_ = seq + 1;
    cv_.notify_all();
    return p;
  }
  void stop() {
    std::lock_guard l(mu_);
    stop_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, std::unique_ptr<Piece>> ready_;
  uint64_t window_, written_ = 0, total_ = UINT64_MAX;
  bool stop_ = false;
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
    double pct = total_ ? 100.0 * done / total_ : 0;
    if (!force && (tty_ || !total_ ? since < (tty_ ? 0.25 : 10) : pct < next_pct_)) return;
    last_ = now;
    next_pct_ = std::floor(pct / 10) * 10 + 10;
    double el = std::chrono::duration<double>(now - start_).count();
    double mbs = el > 0 ? done / el / 1e6 : 0;
    if (total_) {
      double eta = mbs > 0 ? (total_ - done) / 1e6 / mbs : 0;
      std::fprintf(stderr, "%sprep %5.1f%% %8.1f MB of %.1f MB  %6.1f MB/s  ETA %4.0f s%s",
                   tty_ ? "\r" : "", pct, done / 1e6, total_ / 1e6, mbs, eta, tty_ ? "" : "\n");
    } else {
      std::fprintf(stderr, "%sprep %8.1f MB  %6.1f MB/s%s", tty_ ? "\r" : "", done / 1e6, mbs,
                   tty_ ? "" : "\n");
    }
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
  // Document bookkeeping: bytes behind the tokens, documents that reached this split.
  uint64_t text_bytes = 0, documents = 0;
  bool in_document = false;  // the current document put tokens here

 private:
  std::string dir_, name_;
  uint32_t split_;
  uint64_t shard_tokens_;
  std::vector<uint16_t> buf_;
  uint64_t total_ = 0;
  std::vector<std::pair<std::string, uint64_t>> shards_;
};

void check_options(const PrepOptions& o) {
  if (o.out.empty()) throw UserError("no output folder", "pass --out DIR");
  if (fs::exists(o.out))
    throw UserError("output folder " + o.out + " already exists",
                    "choose a new --out, or remove the old one if you mean to replace it");
  if (o.inputs.empty())
    throw UserError("no inputs", "pass text or JSON Lines files or folders with --input");
  if (!(o.val_fraction >= 0 && o.val_fraction < 1))
    throw UserError("--val-fraction " + std::to_string(o.val_fraction) + " is not in [0, 1)",
                    "e.g. --val-fraction 0.01");
  if (o.shard_bytes < 1024)
    throw UserError("--shard-size is below 1 KiB", "e.g. --shard-size 64MiB or 1GiB");
  if (o.format != "auto" && o.format != "text" && o.format != "jsonl")
    throw UserError("--format '" + o.format + "' is not known",
                    "auto (by file name), text or jsonl");
  if (std::count(o.inputs.begin(), o.inputs.end(), "-") > 1)
    throw UserError("standard input (-) is named twice", "pass - once");
}

// Appends pieces in input order: splits, document ends, the bad-record policy.
class Writer {
 public:
  Writer(const PrepOptions& o, const std::vector<InputFile>& files, const std::string& dir,
         PrepSummary& sum)
      : o_(o),
        files_(files),
        sum_(sum),
        train_(dir, "train", 0, std::max<uint64_t>(1, o.shard_bytes / 2)),
        val_(dir, "val", 1, std::max<uint64_t>(1, o.shard_bytes / 2)) {}

  void add(const Piece& p) {
    if (p.error) std::rethrow_exception(p.error);
    if (p.file != line_file_) line_file_ = p.file, line_base_ = 0;
    for (const BadRecord& b : p.bad) {
      const std::string where = display(files_[p.file].path) + ":" +
                                std::to_string(line_base_ + b.line + 1) + ": " + b.reason;
      if (!o_.skip_bad)
        throw UserError(where,
                        "fix or remove that line, name the document's field with --text-key, or "
                        "pass --skip-bad to count bad records and go on");
      ++sum_.bad;
      if (sum_.first_bad.size() < kFirstBadShown) sum_.first_bad.push_back(where);
    }
    line_base_ += p.lines;
    for (const Chunk& c : p.chunks) {
      const bool is_val =
          o_.val_fraction > 0 && std::floor((chunk_index_ + 1) * o_.val_fraction + 0.5) >
                                     std::floor(chunk_index_ * o_.val_fraction + 0.5);
      ++chunk_index_;
      sum_.text_bytes += c.bytes;
      if (!c.ids.empty()) {
        SplitWriter& w = is_val ? val_ : train_;
        w.add(c.ids);
        w.text_bytes += c.bytes;
        w.in_document = true;
      }
      if (c.ends_document)
        for (SplitWriter* w : {&train_, &val_})
          if (w->in_document)
            w->push(Gpt2Tokenizer::kEndOfText), ++w->documents, w->in_document = false;
    }
    sum_.chunks += p.chunks.size();
    sum_.documents += p.documents;
    sum_.filtered += p.filtered;
    sum_.raw_bytes += p.size;
  }

  void finish(const std::string& dir) {
    if (train_.total() + val_.total() == 0)
      throw UserError(
          "the corpus is empty: no text in " + std::to_string(files_.size()) + " input(s)" +
              (sum_.filtered ? " (--where left out " + std::to_string(sum_.filtered) + " record(s))"
                             : ""),
          "check the --input paths, --text-key and --where");
    train_.flush();
    val_.flush();
    sum_.train_tokens = train_.total();
    sum_.val_tokens = val_.total();
    sum_.train_shards = static_cast<int>(train_.shards().size());
    sum_.val_shards = static_cast<int>(val_.shards().size());
    sum_.train_text_bytes = train_.text_bytes;
    sum_.val_text_bytes = val_.text_bytes;
    sum_.train_documents = train_.documents;
    sum_.val_documents = val_.documents;

    nlohmann::json m;
    m["format"] = "loom-tokens";
    m["version"] = kShardVersion;
    m["tokenizer"] = "gpt2 (r50k_base)";
    m["vocab_size"] = Gpt2Tokenizer::kVocabSize;
    m["eot"] = Gpt2Tokenizer::kEndOfText;
    m["val_fraction"] = o_.val_fraction;
    m["files"] = sum_.files;
    m["input_bytes"] = sum_.input_bytes;
    m["documents"] = sum_.documents;
    for (auto* w : {&train_, &val_}) {
      const char* split = w == &train_ ? "train" : "val";
      m["splits"][split] = {
          {"tokens", w->total()}, {"text_bytes", w->text_bytes}, {"documents", w->documents}};
      for (auto& [file, n] : w->shards())
        m["shards"].push_back({{"file", file}, {"split", split}, {"tokens", n}});
    }
    std::ofstream(dir + "/manifest.json") << m.dump(2) << "\n";
  }

 private:
  const PrepOptions& o_;
  const std::vector<InputFile>& files_;
  PrepSummary& sum_;
  SplitWriter train_, val_;
  uint64_t chunk_index_ = 0;
  size_t line_file_ = SIZE_MAX;
  uint64_t line_base_ = 0;
};

}  // namespace

std::vector<size_t> chunk_cuts(std::string_view t, size_t target) {
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
  check_options(o);
  JsonlRecords{o.records};  // checks --text-key before any worker starts
  const std::vector<InputFile> files =
      list_inputs(o.inputs, o.format == "jsonl" ? InputFormat::kJsonLines : InputFormat::kText,
                  o.format != "auto");
  PrepSummary sum;
  sum.files = files.size();
  for (const auto& f : files) sum.input_bytes += f.bytes;

  const std::string tmp = o.out + ".tmp-" + std::to_string(::getpid());
  fs::create_directories(tmp);
  const int threads = o.threads > 0 ? o.threads : cpus_available();
  PieceReader reader(files);
  std::mutex read_mu;  // one reader at a time; taken before the queue's lock, never after
  uint64_t next_seq = 0;
  bool read_all = false;
  PieceQueue queue(2 * static_cast<uint64_t>(threads) + 2);
  std::vector<std::thread> pool;
  auto stop_workers = [&] {
    queue.stop();
    for (auto& t : pool) t.join();
    pool.clear();
  };
  try {
    for (int w = 0; w < threads; ++w) {
      pool.emplace_back([&] {
        Worker worker{Gpt2Tokenizer::Encoder(tok), JsonlRecords(o.records)};
        for (;;) {
          std::unique_ptr<Piece> p;
          {
            std::lock_guard rl(read_mu);
            if (read_all || !queue.wait_for_room(next_seq)) return;
            try {
              p = reader.next();
            } catch (...) {
              p = std::make_unique<Piece>();
              p->error = std::current_exception();
            }
            if (!p || p->error) read_all = true;
            if (!p) {
              queue.set_total(next_seq);
              return;
            }
            p->seq = next_seq++;
            if (p->error) queue.set_total(next_seq);
          }
          if (!p->error) {
            try {
              worker.process(*p, o.skip_bad);
            } catch (...) {
              p->error = std::current_exception();
            }
          }
          queue.put(std::move(p));
        }
      });
    }
    Writer writer(o, files, tmp, sum);
    Progress progress(sum.input_bytes, o.progress);
    uint64_t done_bytes = 0;
    for (uint64_t seq = 0;; ++seq) {
      std::unique_ptr<Piece> p = queue.take(seq);
      if (!p) break;
      writer.add(*p);
      done_bytes += p->disk_bytes;
      progress.update(done_bytes);
    }
    stop_workers();
    progress.update(done_bytes, true);
    progress.finish();
    writer.finish(tmp);
    if (fs::exists(o.out))
      throw UserError("output folder " + o.out + " appeared while preparing", "choose a new --out");
    fs::rename(tmp, o.out);
  } catch (...) {
    stop_workers();
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw;
  }
  sum.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return sum;
}

}  // namespace loom::data
