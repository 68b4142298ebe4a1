// loom prep and the loader: chunked, multi-threaded tokenization gives exactly the ids of
// tokenizing each whole file; shards are deterministic in the thread count; errors leave
// nothing behind; the sample order is a keyed bijection; data-parallel slices partition the
// global batch; damaged shards are reported by name.
#include <gtest/gtest.h>
#include <lzma.h>
#include <zlib.h>
#include <zstd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "loom/core/error.h"
#include "loom/data/input.h"
#include "loom/data/jsonl.h"
#include "loom/data/loader.h"
#include "loom/data/prep.h"
#include "loom/data/shard.h"
#include "loom/data/tokenizer.h"

namespace loom::data {
namespace {
namespace fs = std::filesystem;

std::shared_ptr<const Gpt2Tokenizer> tok() {
  static auto t = Gpt2Tokenizer::load(Gpt2Tokenizer::default_vocab_path());
  return t;
}

// Varied text: words, numbers, punctuation, runs of spaces and newlines, some Unicode.
std::string corpus_text(uint32_t seed, size_t bytes) {
  static const char* words[] = {"the",     "King", "said", "unto",  "him",  "It's",
                                "they're", "42",   "3.14", "naïve", "日本", "😀",
                                "--",      "!!",   "(x)",  "and",   "LORD"};
  static const char* seps[] = {" ", " ", " ", ", ", ". ", "\n", "\n\n", "   ", "\t", " \n  "};
  std::mt19937 g(seed);
  std::string s;
  while (s.size() < bytes) {
    s += words[g() % 17];
    s += seps[g() % 10];
  }
  return s;
}

std::string fresh_dir(const std::string& name) {
  std::string d = ::testing::TempDir() + "/loom-data-" + name + "-" + std::to_string(::getpid());
  fs::remove_all(d);
  return d;
}

void write_file(const std::string& path, const std::string& s) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << s;
}

void write_gz(const std::string& path, const std::string& s) {
  gzFile g = gzopen(path.c_str(), "wb");
  gzwrite(g, s.data(), static_cast<unsigned>(s.size()));
  gzclose(g);
}

void write_xz(const std::string& path, const std::string& s) {
  std::string out(s.size() + 1024, '\0');
  size_t pos = 0;
  ASSERT_EQ(lzma_easy_buffer_encode(6, LZMA_CHECK_CRC64, nullptr,
                                    reinterpret_cast<const uint8_t*>(s.data()), s.size(),
                                    reinterpret_cast<uint8_t*>(out.data()), &pos, out.size()),
            LZMA_OK);
  out.resize(pos);
  std::ofstream(path, std::ios::binary) << out;
}

// One zstd frame of s; window_log > 0 streams it with that window (and long-distance
// matching, as `zstd --long` does) so the frame header asks for the whole window.
std::string zstd_frame(const std::string& s, int window_log = 0) {
  ZSTD_CCtx* c = ZSTD_createCCtx();
  ZSTD_CCtx_setParameter(c, ZSTD_c_compressionLevel, 3);
  if (window_log) {
    ZSTD_CCtx_setParameter(c, ZSTD_c_windowLog, window_log);
    ZSTD_CCtx_setParameter(c, ZSTD_c_enableLongDistanceMatching, 1);
    ZSTD_CCtx_setParameter(c, ZSTD_c_contentSizeFlag, 0);
  }
  std::string out(ZSTD_compressBound(s.size()) + 1024, '\0');
  ZSTD_inBuffer in{s.data(), s.size(), 0};
  ZSTD_outBuffer o{out.data(), out.size(), 0};
  // Two calls: with all input in one ZSTD_e_end call the library shrinks the window to it.
  ZSTD_compressStream2(c, &o, &in, ZSTD_e_continue);
  while (ZSTD_compressStream2(c, &o, &in, ZSTD_e_end) != 0) {
  }
  ZSTD_freeCCtx(c);
  out.resize(o.pos);
  return out;
}

std::string gz_member(const std::string& s) {
  z_stream z{};
  deflateInit2(&z, 6, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY);
  std::string out(deflateBound(&z, s.size()) + 64, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(s.data()));
  z.avail_in = static_cast<uInt>(s.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  deflate(&z, Z_FINISH);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

std::string xz_stream(const std::string& s) {
  std::string out(s.size() + 1024, '\0');
  size_t pos = 0;
  lzma_easy_buffer_encode(6, LZMA_CHECK_CRC64, nullptr, reinterpret_cast<const uint8_t*>(s.data()),
                          s.size(), reinterpret_cast<uint8_t*>(out.data()), &pos, out.size());
  out.resize(pos);
  return out;
}

// Files of the test corpus, in the sorted order prep reads them, with their texts.
std::vector<std::pair<std::string, std::string>> make_corpus(const std::string& dir) {
  std::vector<std::pair<std::string, std::string>> files = {
      {dir + "/a.txt", corpus_text(1, 300000)},
      {dir + "/b.txt.gz", corpus_text(2, 150000)},
      {dir + "/c.txt.xz", corpus_text(3, 90000)},
      {dir + "/d_empty.txt", ""},
      {dir + "/sub/e.txt", corpus_text(4, 5000) + "\xff\xfe invalid bytes"},
  };
  for (auto& [p, t] : files) {
    fs::create_directories(fs::path(p).parent_path());
    if (p.ends_with(".gz"))
      write_gz(p, t);
    else if (p.ends_with(".xz"))
      write_xz(p, t);
    else
      write_file(p, t);
  }
  return files;
}

std::vector<uint16_t> read_split(const std::string& dir, const std::string& split) {
  TokenDataset d = TokenDataset::open(dir, split);
  std::vector<int32_t> v(d.tokens());
  d.read(0, v.size(), v.data());
  return std::vector<uint16_t>(v.begin(), v.end());
}

TEST(Prep, ChunkedParallelTokensEqualWholeFileTokens) {
  std::string in = fresh_dir("in"), out = fresh_dir("out");
  auto files = make_corpus(in);
  PrepOptions o{{in}, out, 40000, 0.0, 2, false};
  PrepSummary s = run_prep(o, tok());
  EXPECT_EQ(s.files, files.size());
  EXPECT_GT(s.train_shards, 3);  // 40 KB shards force several
  std::vector<uint16_t> want;
  Gpt2Tokenizer::Encoder enc(tok());
  for (auto& [p, t] : files) {
    if (t.empty()) continue;
    for (int id : enc.encode(t)) want.push_back(static_cast<uint16_t>(id));
    want.push_back(Gpt2Tokenizer::kEndOfText);
  }
  EXPECT_EQ(read_split(out, "train"), want);
  fs::remove_all(in);
  fs::remove_all(out);
}

TEST(Prep, DeterministicInThreadsAndSplitsValidation) {
  std::string in = fresh_dir("in2");
  make_corpus(in);
  std::string o1 = fresh_dir("o1"), o2 = fresh_dir("o2"), o0 = fresh_dir("o0");
  run_prep({{in}, o1, 1 << 20, 0.1, 1, false}, tok());
  run_prep({{in}, o2, 1 << 20, 0.1, 2, false}, tok());
  run_prep({{in}, o0, 1 << 20, 0.0, 2, false}, tok());
  EXPECT_EQ(read_split(o1, "train"), read_split(o2, "train"));
  EXPECT_EQ(read_split(o1, "val"), read_split(o2, "val"));
  auto train = read_split(o1, "train"), val = read_split(o1, "val"), all = read_split(o0, "train");
  EXPECT_GT(val.size(), all.size() / 20);  // ~10% of the chunks
  EXPECT_LT(val.size(), all.size() / 5);
  // Same tokens, except each document split across both gets one more <|endoftext|>.
  auto non_eot = [](const std::vector<uint16_t>& v) {
    return std::count_if(v.begin(), v.end(),
                         [](uint16_t t) { return t != Gpt2Tokenizer::kEndOfText; });
  };
  EXPECT_EQ(non_eot(train) + non_eot(val), non_eot(all));
  for (auto* d : {&in, &o1, &o2, &o0}) fs::remove_all(*d);
}

TEST(Prep, ErrorsLeaveNothingBehind) {
  std::string in = fresh_dir("in3"), out = fresh_dir("out3");
  fs::create_directories(in);
  auto tmp_left = [&] {
    for (auto& e : fs::directory_iterator(fs::path(out).parent_path()))
      if (e.path().filename().string().rfind(fs::path(out).filename().string() + ".tmp", 0) == 0)
        return true;
    return false;
  };
  EXPECT_THROW(run_prep({{in}, out, 1 << 20, 0.01, 2, false}, tok()), UserError);  // empty
  EXPECT_THROW(run_prep({{in + "/missing.txt"}, out, 1 << 20, 0.01, 2, false}, tok()), UserError);
  write_file(in + "/ok.txt", "some text");
  std::ofstream(in + "/bad.gz") << "this is not gzip";
  EXPECT_THROW(run_prep({{in}, out, 1 << 20, 0.01, 2, false}, tok()), UserError);
  EXPECT_FALSE(fs::exists(out));
  EXPECT_FALSE(tmp_left());
  fs::remove(in + "/bad.gz");
  run_prep({{in}, out, 1 << 20, 0.0, 2, false}, tok());
  auto before = fs::last_write_time(out + "/manifest.json");
  EXPECT_THROW(run_prep({{in}, out, 1 << 20, 0.0, 2, false}, tok()), UserError);  // exists
  EXPECT_EQ(fs::last_write_time(out + "/manifest.json"), before);
  fs::remove_all(in);
  fs::remove_all(out);
}

// Each decoder reads files of several parts (gzip members, xz streams, zstd frames, one with
// a 256 MiB window that the library's default limit refuses) and refuses a truncated copy
// of each by name, never returning a short text.
TEST(Input, MultiPartFilesAreReadWholeAndTruncatedOnesRefused) {
  const std::string dir = fresh_dir("streams");
  fs::create_directories(dir);
  const std::string a = corpus_text(11, 700000), b = corpus_text(12, 300000);
  const std::vector<std::pair<std::string, std::string>> files = {
      {dir + "/two.txt.gz", gz_member(a) + gz_member(b)},
      {dir + "/two.txt.xz", xz_stream(a) + xz_stream(b)},
      {dir + "/two.txt.zst", zstd_frame(a) + zstd_frame(b)},
      {dir + "/long.txt.zst", zstd_frame(a, 28) + zstd_frame(b)},
  };
  for (const auto& [path, bytes] : files) {
    write_file(path, bytes);
    EXPECT_EQ(read_all(path), a + b) << path;
    const std::string cut = dir + "/cut-" + fs::path(path).filename().string();
    write_file(cut, bytes.substr(0, bytes.size() * 2 / 3));
    try {
      read_all(cut);
      ADD_FAILURE() << cut << " was read";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find(cut), std::string::npos) << e.what();
    }
  }
  // The default window limit really refuses the long frame (so the test above means
  // something): ZSTD_decompress's one-shot path uses the default parameters.
  {
    const std::string f = zstd_frame(a, 28);
    ZSTD_DCtx* d = ZSTD_createDCtx();
    std::string out(a.size(), '\0');
    ZSTD_inBuffer in{f.data(), f.size(), 0};
    ZSTD_outBuffer o{out.data(), out.size(), 0};
    EXPECT_TRUE(ZSTD_isError(ZSTD_decompressStream(d, &o, &in)));
    ZSTD_freeDCtx(d);
  }
  EXPECT_EQ(format_of("x/pile_00.jsonl.zst"), InputFormat::kJsonLines);
  EXPECT_EQ(format_of("a.json"), InputFormat::kJsonLines);
  EXPECT_EQ(format_of("a.txt.gz"), InputFormat::kText);
  EXPECT_EQ(format_of("jsonl"), InputFormat::kText);
  fs::remove_all(dir);
}

TEST(Jsonl, RecordsKeysFiltersAndReasons) {
  auto parse = [](JsonlRecords& r, std::string line) {
    line.append(JsonlRecords::kPadding, ' ');
    return r.parse(std::string_view(line).substr(0, line.size() - JsonlRecords::kPadding));
  };
  RecordFilter f;
  f.text_key = "doc.body";
  f.where = {parse_where("meta.set=Wiki"), parse_where("meta.year=2020")};
  JsonlRecords r(f);
  auto kept =
      parse(r, R"({"doc":{"body":"caf\u00e9 \ud83d\ude00"},"meta":{"set":"Wiki","year":2020}})");
  ASSERT_EQ(kept.kind, JsonlRecords::Kind::kKept) << kept.reason;
  EXPECT_EQ(std::string(kept.text), "caf\xc3\xa9 \xf0\x9f\x98\x80");
  EXPECT_EQ(parse(r, R"({"doc":{"body":"x"},"meta":{"set":"Web","year":2020}})").kind,
            JsonlRecords::Kind::kFiltered);
  // Values compare as text: the string "2020" matches, the number 2020.0 does not.
  EXPECT_EQ(parse(r, R"({"doc":{"body":"x"},"meta":{"set":"Wiki","year":"2020"}})").kind,
            JsonlRecords::Kind::kKept);
  EXPECT_EQ(parse(r, R"({"doc":{"body":"x"},"meta":{"set":"Wiki","year":2020.0}})").kind,
            JsonlRecords::Kind::kFiltered);
  EXPECT_EQ(parse(r, R"({"doc":{"body":"x"},"meta":{"set":"Wiki"}})").kind,
            JsonlRecords::Kind::kFiltered);  // no such key: no match
  auto reason = [&](const std::string& line) {
    auto rec = parse(r, line);
    EXPECT_EQ(rec.kind, JsonlRecords::Kind::kBad) << line;
    return rec.reason;
  };
  const std::string meta = R"("meta":{"set":"Wiki","year":2020})";
  EXPECT_EQ(reason("{" + meta + "}"), "no key 'doc.body'");
  EXPECT_EQ(reason(R"({"doc":{"body":7},)" + meta + "}"), "'doc.body' is a number, not a string");
  EXPECT_EQ(reason(R"({"doc":{"body":"\ud800"},)" + meta + "}"),
            "not JSON: a bad string escape (an unpaired \\u surrogate?)");
  EXPECT_EQ(reason("{\"doc\":{\"body\":\"\xff\"}," + meta + "}"), "invalid UTF-8");
  EXPECT_EQ(reason(R"({"doc":{"body":"x}})"), "not JSON: an unclosed string");
  EXPECT_EQ(reason(R"({"doc":{"body":"x"})"), "not JSON: missing or extra commas, braces or keys");
  EXPECT_EQ(reason("[1, 2]"), "an array, not an object");
  EXPECT_THROW(parse_where("novalue"), UserError);
  EXPECT_THROW(parse_where("a..b=1"), UserError);
  EXPECT_THROW(JsonlRecords(RecordFilter{"a.", {}}), UserError);
}

std::vector<uint16_t> eot_joined(const std::vector<std::string>& docs) {
  std::vector<uint16_t> want;
  Gpt2Tokenizer::Encoder enc(tok());
  for (const auto& t : docs) {
    if (t.empty()) continue;
    for (int id : enc.encode(t)) want.push_back(static_cast<uint16_t>(id));
    want.push_back(Gpt2Tokenizer::kEndOfText);
  }
  return want;
}

// Records become documents in file order, each ended by <|endoftext|>; --where keeps the
// matching ones; a folder mixes text and JSON Lines; the first bad line stops prep by
// FILE:LINE with nothing written, skip_bad counts them instead.
TEST(Prep, JsonLinesDocumentsFiltersAndBadRecords) {
  const std::string in = fresh_dir("jsonl"), out = fresh_dir("jsonl-out");
  std::vector<std::string> texts;
  std::string lines;
  for (int i = 0; i < 40; ++i) {
    texts.push_back(i == 7 ? "" : corpus_text(100 + i, 3000 + 997 * i));
    nlohmann::json j = {{"text", texts.back()}, {"meta", {{"set", i % 3 ? "A" : "B"}}}};
    lines += j.dump() + (i == 20 ? "\r\n\n" : "\n");
  }
  write_file(in + "/a.jsonl", lines);
  write_file(in + "/b.txt", "a plain text document");
  PrepOptions o{{in}, out, 1 << 20, 0.0, 2, false};
  PrepSummary s = run_prep(o, tok());
  std::vector<std::string> docs = texts;
  docs.push_back("a plain text document");
  EXPECT_EQ(read_split(out, "train"), eot_joined(docs));
  EXPECT_EQ(s.documents, 41u);
  fs::remove_all(out);

  o.records.where = {{"meta.set", "B"}};
  s = run_prep(o, tok());
  std::vector<std::string> b_docs;
  for (int i = 0; i < 40; i += 3) b_docs.push_back(texts[i]);
  b_docs.push_back("a plain text document");  // text files are not filtered
  EXPECT_EQ(read_split(out, "train"), eot_joined(b_docs));
  EXPECT_EQ(s.filtered, 26u);
  fs::remove_all(out);

  o.records.where.clear();
  write_file(in + "/a.jsonl", lines + "{\"text\": 1}\n" + lines + "nope\n");
  try {
    run_prep(o, tok());
    ADD_FAILURE() << "a bad record was accepted";
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()), in + "/a.jsonl:42: 'text' is a number, not a string");
  }
  EXPECT_FALSE(fs::exists(out));
  o.skip_bad = true;
  s = run_prep(o, tok());
  EXPECT_EQ(s.bad, 2u);
  ASSERT_EQ(s.first_bad.size(), 2u);
  EXPECT_EQ(s.first_bad[1],
            in + "/a.jsonl:84: not JSON: " +
                std::string("Problem while parsing an atom starting with the letter 'n'"));
  fs::remove_all(in);
  fs::remove_all(out);
}

// A text file larger than a piece is cut where whole-file chunking would cut it: the same
// tokens, and the same chunks in the validation split, as tokenizing it whole.
TEST(Prep, TextLargerThanAPieceEqualsWholeFileChunks) {
  const std::string in = fresh_dir("big"), out = fresh_dir("big-out");
  const std::string text = corpus_text(77, 19 << 20);
  write_file(in + "/big.txt", text);
  PrepSummary s = run_prep({{in}, out, 1 << 30, 0.05, 2, false}, tok());
  std::vector<size_t> cuts = chunk_cuts(text, 64 << 10);
  cuts.push_back(text.size());
  std::vector<uint16_t> train, val;
  Gpt2Tokenizer::Encoder enc(tok());
  size_t begin = 0;
  for (size_t k = 0; k < cuts.size(); ++k) {
    const bool is_val = std::floor((k + 1) * 0.05 + 0.5) > std::floor(k * 0.05 + 0.5);
    for (int id : enc.encode(std::string_view(text).substr(begin, cuts[k] - begin)))
      (is_val ? val : train).push_back(static_cast<uint16_t>(id));
    begin = cuts[k];
  }
  train.push_back(Gpt2Tokenizer::kEndOfText);
  val.push_back(Gpt2Tokenizer::kEndOfText);
  EXPECT_EQ(s.chunks, cuts.size());
  EXPECT_EQ(read_split(out, "train"), train);
  EXPECT_EQ(read_split(out, "val"), val);
  EXPECT_EQ(s.train_text_bytes + s.val_text_bytes, text.size());
  fs::remove_all(in);
  fs::remove_all(out);
}

TEST(Loader, SampleOrderIsAKeyedBijection) {
  for (uint64_t n : {1ull, 2ull, 3ull, 1000ull, 4097ull}) {
    SampleOrder o(n, 7);
    std::set<uint64_t> seen;
    for (uint64_t i = 0; i < n; ++i) seen.insert(o.at(0, i));
    EXPECT_EQ(seen.size(), n);
    EXPECT_EQ(*seen.rbegin(), n - 1);
  }
  SampleOrder a(1000, 7), b(1000, 8);
  int same_epoch = 0, same_seed = 0;
  for (uint64_t i = 0; i < 1000; ++i) {
    same_epoch += a.at(0, i) == a.at(1, i);
    same_seed += a.at(0, i) == b.at(0, i);
  }
  EXPECT_LT(same_epoch, 20);
  EXPECT_LT(same_seed, 20);
}

TEST(Loader, DataParallelSlicesPartitionTheGlobalBatch) {
  std::string in = fresh_dir("in4"), out = fresh_dir("out4");
  make_corpus(in);
  run_prep({{in}, out, 1 << 20, 0.0, 2, false}, tok());
  TokenDataset d = TokenDataset::open(out, "train");
  const int B = 8, T = 32;
  Loader whole(d, {B, T, 0, 1}, 123);
  std::set<uint64_t> epoch0;
  for (uint64_t step = 0; step < whole.steps_per_epoch(); ++step)
    for (int i = 0; i < B; ++i) epoch0.insert(whole.sample_of(step, i));
  EXPECT_EQ(epoch0.size(), whole.steps_per_epoch() * B);  // no sample twice in an epoch
  for (uint64_t step : {uint64_t{0}, uint64_t{5}, whole.steps_per_epoch() + 3}) {
    std::vector<int32_t> x(B * T), y(B * T);
    whole.batch(step, x.data(), y.data());
    for (int i = 0; i + 1 < T; ++i) EXPECT_EQ(x[i + 1], y[i]);  // targets are inputs shifted
    for (int R : {2, 4}) {
      std::vector<int32_t> xs, ys;
      for (int r = 0; r < R; ++r) {
        Loader part(d, {B, T, r, R}, 123);
        std::vector<int32_t> px(B / R * T), py(B / R * T);
        part.batch(step, px.data(), py.data());
        xs.insert(xs.end(), px.begin(), px.end());
        ys.insert(ys.end(), py.begin(), py.end());
      }
      EXPECT_EQ(xs, x);
      EXPECT_EQ(ys, y);
    }
  }
  EXPECT_THROW(Loader(d, {6, T, 0, 4}, 1), UserError);  // 6 does not split over 4 ranks
  // A sample offset (a rewind past data) moves every step along the same run of epochs,
  // across an epoch's end too: offset 2B + 3 puts slot i of step s where slot i + 3 of step
  // s + 2 was (carrying into the next step).
  Loader moved(d, {B, T, 0, 1}, 123);
  moved.set_sample_offset(2 * B + 3);
  for (uint64_t step : {uint64_t{0}, whole.steps_per_epoch() - 3, whole.steps_per_epoch() + 1})
    for (int i = 0; i < B; ++i) {
      const uint64_t at = (step + 2) * B + i + 3;
      EXPECT_EQ(moved.sample_of(step, i), whole.sample_of(at / B, static_cast<int>(at % B)))
          << "step " << step << " slot " << i;
    }
  fs::remove_all(in);
  fs::remove_all(out);
}

TEST(Loader, DamagedShardsAreReportedByName) {
  std::string in = fresh_dir("in5"), out = fresh_dir("out5");
  write_file(in + "/t.txt", corpus_text(9, 20000));
  run_prep({{in}, out, 1 << 20, 0.0, 1, false}, tok());
  std::string shard = out + "/train_000000.bin";
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('\x7f');
  }
  try {
    TokenDataset::open(out, "train");
    FAIL() << "a corrupt shard was accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("train_000000.bin"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("checksum"), std::string::npos) << e.what();
  }
  fs::resize_file(shard, fs::file_size(shard) - 7);
  try {
    TokenDataset::open(out, "train");
    FAIL() << "a truncated shard was accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
  }
  fs::remove_all(in);
  fs::remove_all(out);
}

// Findings of tests/fuzz (shard_fuzz, data_manifest_fuzz): a shard whose ids leave the
// vocabulary (the model would index outside its embedding) or whose token count wraps the
// byte size into agreement, and manifests of the wrong types or naming files outside the
// folder, are UserErrors naming the file. (Checked by reverting each check in shard.cc and
// loader.cc: the shard cases open, the manifests throw nlohmann's type_error.)
TEST(Loader, CraftedShardsAndManifestsAreRefused) {
  std::string dir = fresh_dir("crafted");
  fs::create_directories(dir);
  auto refused = [&](const std::string& what, const std::string& needle) {
    try {
      TokenDataset::open(dir, "train");
      ADD_FAILURE() << what << " was accepted";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << what << ": " << e.what();
    }
  };
  auto manifest = [&](const std::string& text) { write_file(dir + "/manifest.json", text); };
  write_shard(dir + "/train_000000.bin", {1, 2, 50257, 4}, 0, 0, Gpt2Tokenizer::kVocabSize);
  manifest(R"({"shards": [{"file": "train_000000.bin", "split": "train", "tokens": 4}]})");
  refused("a shard holding id 50257", "outside the vocabulary");
  // token_count = 2^63 + 4: twice it wraps to 8 bytes, the size of four tokens.
  write_shard(dir + "/train_000000.bin", {1, 2, 3, 4}, 0, 0, Gpt2Tokenizer::kVocabSize);
  {
    std::fstream f(dir + "/train_000000.bin", std::ios::in | std::ios::out | std::ios::binary);
    const uint64_t count = (uint64_t{1} << 63) + 4;
    f.seekp(16);
    f.write(reinterpret_cast<const char*>(&count), sizeof count);
  }
  refused("a shard whose token count wraps", "truncated or padded");
  write_shard(dir + "/train_000000.bin", {1, 2, 3, 4}, 0, 0, Gpt2Tokenizer::kVocabSize);
  EXPECT_EQ(TokenDataset::open(dir, "train").tokens(), 4u);
  manifest(R"({"shards": {"file": "train_000000.bin"}})");
  refused("shards as an object", "no \"shards\" array");
  manifest(R"({"shards": [{"file": 7, "split": "train", "tokens": 4}]})");
  refused("a file name that is a number", "manifest.json is damaged");
  manifest(R"({"shards": [{"file": "train_000000.bin", "split": "train", "tokens": "4"}]})");
  refused("a token count that is a string", "manifest.json is damaged");
  manifest(R"({"shards": [{"file": "../x/train_000000.bin", "split": "train", "tokens": 4}]})");
  refused("a shard outside the folder", "not a file name inside the folder");
  manifest("[1, 2]");
  refused("a manifest that is an array", "no \"shards\" array");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace loom::data
