#include "loom/ckpt/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <thread>

#include "loom/core/check.h"
#include "loom/core/checksum.h"
#include "loom/core/error.h"
#include "loom/core/file.h"
#include "loom/core/tunable.h"

namespace loom::ckpt {
namespace fs = std::filesystem;

namespace {
// 2: pieces are regions of boxes (tensor parallelism); qkvw is (3,C,C). 1 is still read.
constexpr int kFormatVersion = 2;

std::string step_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08lld", static_cast<long long>(step));
  return buf;
}
std::string rank_name(const char* prefix, int rank, const char* ext) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%s-%05d.%s", prefix, rank, ext);
  return buf;
}

UserError io_error(const std::string& what, const std::string& path) {
  return UserError("cannot " + what + " " + path + ": " + std::strerror(errno),
                   "check the checkpoint folder, its permissions and the free disk space");
}

void write_all(int fd, const void* p, size_t n, const std::string& path) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t w = ::write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) throw io_error("write", path);
    c += w, n -= static_cast<size_t>(w);
  }
}

// This rank's data file and its index (the manifest's pieces for this file).
void write_rank(const std::string& dir, int rank, const std::vector<Piece>& pieces) {
  const std::string data = rank_name("data", rank, "bin");
  const std::string path = dir + "/" + data;
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw io_error("create", path);
  nlohmann::json index = nlohmann::json::array();
  uint64_t offset = 0;
  try {
    std::vector<float> chunk;
    for (const Piece& p : pieces) {
      const size_t bytes = static_cast<size_t>(p.region.count) * sizeof(float);
      Checksum64 sum;
      if (p.data) {
        write_all(fd, p.data, bytes, path);
        sum.update(p.data, bytes);
      } else {  // streamed from where the state lives
        constexpr int64_t kChunk = 1 << 20;
        chunk.resize(static_cast<size_t>(std::min(kChunk, p.region.count)));
        for (int64_t at = 0; at < p.region.count; at += kChunk) {
          const int64_t n = std::min(kChunk, p.region.count - at);
          p.fetch(at, n, chunk.data());
          write_all(fd, chunk.data(), static_cast<size_t>(n) * sizeof(float), path);
          sum.update(chunk.data(), static_cast<size_t>(n) * sizeof(float));
        }
      }
      nlohmann::json j = {
          {"tensor", p.tensor},     {"shape", p.shape},        {"file", data},
          {"offset", offset},       {"begin", p.region.begin}, {"count", p.region.count},
          {"checksum", sum.value()}};
      if (!p.region.start.empty() && p.region.extent != p.shape)
        j["start"] = p.region.start, j["extent"] = p.region.extent;
      index.push_back(std::move(j));
      offset += bytes;
    }
    if (::fsync(fd) != 0) throw io_error("fsync", path);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  write_file_atomic(dir + "/" + rank_name("index", rank, "json"), index.dump());
}

Shape json_shape(const nlohmann::json& j, const char* key, const Shape& fallback) {
  return j.contains(key) ? j[key].get<Shape>() : fallback;
}

// The pieces of a tensor tile it exactly: the distinct boxes are disjoint and cover the
// tensor, and the ranges within each box tile the box. "" when they do, else what is wrong.
// (Writers check it as an invariant; the reader refuses a manifest that breaks it.)
std::string tiling_problem(const std::string& name, const nlohmann::json& t) {
  const Shape shape = t["shape"].get<Shape>();
  std::map<std::pair<Shape, Shape>, std::vector<std::pair<int64_t, int64_t>>> boxes;
  for (const auto& p : t["pieces"])
    boxes[{json_shape(p, "start", Shape(shape.size(), 0)), json_shape(p, "extent", shape)}]
        .push_back({p["begin"], p["count"]});
  int64_t covered = 0;
  for (auto& [box, ranges] : boxes) {
    const auto& [start, extent] = box;
    for (size_t d = 0; d < shape.size(); ++d)
      if (!(start[d] >= 0 && extent[d] >= 0 && start[d] + extent[d] <= shape[d]))
        return "a piece of " + name + " lies outside the tensor";
    std::sort(ranges.begin(), ranges.end());
    int64_t at = 0;
    for (const auto& [begin, count] : ranges) {
      if (begin != at) return "pieces of " + name + " do not tile a box of it";
      at += count;
    }
    if (at != numel(extent)) return "pieces of " + name + " do not cover a box of it";
    covered += at;
    for (const auto& [other, unused] : boxes) {
      if (other <= box) continue;
      bool overlap = true;
      for (size_t d = 0; d < shape.size(); ++d)
        overlap = overlap && std::max(start[d], other.first[d]) <
                                 std::min(start[d] + extent[d], other.first[d] + other.second[d]);
      if (overlap) return "pieces of " + name + " overlap";
    }
  }
  if (covered != numel(shape)) return "pieces of " + name + " do not cover it";
  return "";
}

void check_tiling(const std::string& name, const nlohmann::json& t) {
  const std::string problem = tiling_problem(name, t);
  LOOM_CHECK_MSG(problem.empty(), problem);
}

// A manifest read from disk is outside input: every field the reader will use is checked
// for its type and range before any is used, so a damaged or hand-edited manifest is a
// UserError naming what is wrong, never an exception from the JSON library, a read outside
// the folder or the tensor, or an allocation of what a number claims. "" when it is sound.
std::string manifest_problem(const nlohmann::json& m) {
  using nlohmann::json;
  constexpr int64_t kMaxElements = int64_t{1} << 46;  // 256 TiB of fp32: no overflow below
  auto count_ok = [](const json& j) { return j.is_number_integer() && j.get<int64_t>() >= 0; };
  auto shape_ok = [&](const json& j, size_t rank) {
    if (!j.is_array() || (rank != SIZE_MAX && j.size() != rank) || j.size() > 8) return false;
    int64_t n = 1;
    for (const json& d : j) {
      if (!count_ok(d) || d.get<int64_t>() > kMaxElements) return false;
      n *= d.get<int64_t>();
      if (n > kMaxElements) return false;
    }
    return true;
  };
  if (!m.is_object()) return "it is not a JSON object";
  if (!m.contains("meta") || !m["meta"].is_object()) return "\"meta\" is not an object";
  if (!m.contains("tensors") || !m["tensors"].is_object()) return "\"tensors\" is not an object";
  for (const auto& [name, t] : m["tensors"].items()) {
    const std::string where = "tensor '" + name + "'";
    if (!t.is_object() || !t.contains("shape") || !shape_ok(t["shape"], SIZE_MAX))
      return where + " has no valid shape (an array of up to 8 sizes)";
    if (!t.contains("pieces") || !t["pieces"].is_array()) return where + " has no \"pieces\" array";
    const size_t rank = t["shape"].size();
    for (const json& p : t["pieces"]) {
      if (!p.is_object()) return where + " has a piece that is not an object";
      if (!p.contains("file") || !p["file"].is_string()) return where + ": a piece names no file";
      const std::string file = p["file"];
      if (!plain_file_name(file))
        return where + ": piece file '" + file + "' is not a file name inside the checkpoint";
      for (const char* key : {"offset", "begin", "count"})
        if (!p.contains(key) || !count_ok(p[key]) || p[key].get<int64_t>() > kMaxElements * 4)
          return where + ": a piece's \"" + key + "\" is not a non-negative integer";
      if (!p.contains("checksum") || !p["checksum"].is_number_unsigned())
        return where + ": a piece has no checksum";
      if (p.contains("start") != p.contains("extent"))
        return where + ": a piece has a start without an extent or the reverse";
      if (p.contains("start") && !(shape_ok(p["start"], rank) && shape_ok(p["extent"], rank)))
        return where + ": a piece's start/extent do not match the tensor's rank";
    }
    if (std::string problem = tiling_problem(name, t); !problem.empty()) return problem;
  }
  return "";
}

// Rank 0: the per-rank indexes become one manifest whose pieces tile every tensor.
nlohmann::json merge(const std::string& dir, int world, const nlohmann::json& meta, int64_t step) {
  nlohmann::json tensors = nlohmann::json::object();
  for (int r = 0; r < world; ++r) {
    const std::string ipath = dir + "/" + rank_name("index", r, "json");
    for (const auto& p : nlohmann::json::parse(read_file(ipath))) {
      auto& t = tensors[p["tensor"].get<std::string>()];
      if (t.is_null())
        t = {{"shape", p["shape"]}, {"dtype", "f32"}, {"pieces", nlohmann::json::array()}};
      LOOM_CHECK_MSG(t["shape"] == p["shape"],
                     "ranks disagree on the shape of " + p["tensor"].get<std::string>());
      nlohmann::json piece = p;
      piece.erase("tensor"), piece.erase("shape");
      t["pieces"].push_back(std::move(piece));
    }
    fs::remove(ipath);
  }
  for (auto& [name, t] : tensors.items()) check_tiling(name, t);
  return {{"format", "loom-checkpoint"},
          {"version", kFormatVersion},
          {"step", step},
          {"world_size", world},
          {"meta", meta},
          {"tensors", tensors}};
}

std::vector<fs::path> complete_checkpoints(const std::string& root) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    if (e.is_directory() && name.starts_with("step_") && fs::exists(e.path() / "manifest.json"))
      out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Whether a complete checkpoint was saved after a step whose loss and gradients were
// finite (its meta's "finite"; checkpoints that predate the flag were).
bool finite_checkpoint(const fs::path& dir) {
  try {
    const nlohmann::json m = nlohmann::json::parse(read_file((dir / "manifest.json").string()));
    return m.at("meta").value("finite", true);
  } catch (const std::exception&) {
    return true;  // unreadable: Reader names the problem when it is opened
  }
}

// Rotation: the newest `keep` finite checkpoints stay, and every checkpoint newer than the
// oldest of them; the rest go. A run of non-finite steps never pushes the last finite
// checkpoint out.
void rotate(const std::string& root, int keep) {
  const std::vector<fs::path> all = complete_checkpoints(root);
  size_t oldest_kept = all.size(), finite = 0;
  for (size_t i = all.size(); i-- > 0 && finite < static_cast<size_t>(keep);)
    if (finite_checkpoint(all[i])) oldest_kept = i, ++finite;
  if (finite < static_cast<size_t>(keep)) return;  // fewer than keep finite ones: all stay
  for (size_t i = 0; i < oldest_kept; ++i) fs::remove_all(all[i]);
}
}  // namespace

const DoubleTunable kSavePause(
    "LOOM_TEST_SAVE_PAUSE_S", 0,
    "seconds a checkpoint save waits between writing its data and the manifest (tests only)");

std::string save(const SaveOptions& opt, const std::vector<Piece>& pieces,
                 const nlohmann::json& meta) {
  LOOM_CHECK(opt.world == 1 || opt.barrier);
  auto barrier = [&] {
    if (opt.world > 1) opt.barrier();
  };
  const std::string name = step_name(opt.step);
  const std::string staging = opt.root + "/." + name + ".tmp";
  const std::string final_dir = opt.root + "/" + name;
  if (opt.rank == 0) {
    fs::create_directories(opt.root);
    // Staging folders of interrupted saves are garbage; complete checkpoints are not touched.
    for (const auto& e : fs::directory_iterator(opt.root))
      if (e.path().filename().string().ends_with(".tmp")) fs::remove_all(e.path());
    fs::create_directories(staging);
  }
  barrier();
  write_rank(staging, opt.rank, pieces);
  if (const double pause = kSavePause.get(); pause > 0) {  // tests kill ranks in this window
    std::fprintf(stderr, "loom: checkpoint step %lld data written, pausing %.1f s\n",
                 static_cast<long long>(opt.step), pause);
    std::this_thread::sleep_for(std::chrono::duration<double>(pause));
  }
  barrier();
  if (opt.rank == 0) {
    write_file_atomic(staging + "/manifest.json",
                      merge(staging, opt.world, meta, opt.step).dump(1));
    fsync_dir(staging);
    // Saving a step twice (a resumed run ending where it started) replaces the old copy
    // only once the new one is complete.
    const std::string old = opt.root + "/." + name + ".old";
    if (fs::exists(final_dir)) fs::rename(final_dir, old);
    fs::rename(staging, final_dir);
    fsync_dir(opt.root);
    fs::remove_all(old);
    rotate(opt.root, opt.keep);
  }
  barrier();
  return final_dir;
}

std::string latest(const std::string& root) {
  auto all = complete_checkpoints(root);
  return all.empty() ? "" : all.back().string();
}

std::string latest_finite(const std::string& root) {
  auto all = complete_checkpoints(root);
  for (size_t i = all.size(); i-- > 0;)
    if (finite_checkpoint(all[i])) return all[i].string();
  return "";
}

Reader::Reader(const std::string& dir) : dir_(dir) {
  const std::string path = dir + "/manifest.json";
  if (!fs::exists(path))
    throw UserError("no checkpoint at " + dir + " (manifest.json missing)",
                    "pass a folder written by `loom train` (run.dir/ckpt/step_*)");
  try {
    manifest_ = nlohmann::json::parse(read_file(path));
  } catch (const nlohmann::json::exception& e) {
    throw UserError("checkpoint manifest " + path + " is not valid JSON: " + e.what(),
                    "the checkpoint is damaged; use an older one");
  }
  const bool ours = manifest_.is_object() && manifest_.contains("format") &&
                    manifest_["format"] == "loom-checkpoint" && manifest_.contains("version") &&
                    manifest_["version"].is_number_integer();
  const int64_t version = ours ? manifest_["version"].get<int64_t>() : 0;
  if (!ours || version < 1 || version > kFormatVersion)
    throw UserError(
        path + " is not a loom checkpoint of format version " + std::to_string(kFormatVersion),
        "it was written by another program or another loom version");
  if (std::string problem = manifest_problem(manifest_); !problem.empty())
    throw UserError("checkpoint manifest " + path + " is damaged: " + problem,
                    "the checkpoint is damaged; use an older one");
}

bool Reader::has(const std::string& tensor) const {
  return manifest_["tensors"].contains(tensor);
}

std::vector<std::string> Reader::tensors() const {
  std::vector<std::string> names;
  for (const auto& [name, t] : manifest_["tensors"].items()) names.push_back(name);
  return names;
}

Shape Reader::shape(const std::string& tensor) const {
  if (!has(tensor))
    throw UserError("checkpoint " + dir_ + " has no tensor '" + tensor + "'",
                    "was it written for another model config?");
  return manifest_["tensors"][tensor]["shape"].get<Shape>();
}

// Piece i of tensor, read whole and checksummed.
std::vector<float> Reader::piece_data(const std::string& tensor, size_t i) const {
  const auto& p = manifest_["tensors"][tensor]["pieces"][i];
  const std::string path = dir_ + "/" + p["file"].get<std::string>();
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw io_error("open", path);
  // The manifest's numbers are checked for range, not against the file: a piece that claims
  // more than the file holds is refused before its buffer is allocated.
  struct stat st {};
  const uint64_t offset = p["offset"].get<uint64_t>(), count = p["count"].get<uint64_t>();
  if (::fstat(fd, &st) != 0 || offset + count * sizeof(float) > static_cast<uint64_t>(st.st_size)) {
    ::close(fd);
    throw UserError("checkpoint file " + path + " is truncated (tensor " + tensor + ")",
                    "the checkpoint is damaged; use an older one");
  }
  std::vector<float> buf(count);
  const size_t bytes = buf.size() * sizeof(float);
  const ssize_t got = ::pread(fd, buf.data(), bytes, static_cast<off_t>(offset));
  ::close(fd);
  if (got != static_cast<ssize_t>(bytes))
    throw UserError("checkpoint file " + path + " is truncated (tensor " + tensor + ")",
                    "the checkpoint is damaged; use an older one");
  if (checksum64(buf.data(), bytes) != p["checksum"].get<uint64_t>())
    throw UserError("checkpoint file " + path + " fails its checksum (tensor " + tensor + ")",
                    "the checkpoint is damaged; use an older one");
  return buf;
}

void Reader::read(const std::string& tensor, int64_t begin, int64_t count, float* out) const {
  read(tensor, shape(tensor), Region{{}, {}, begin, count}, out);
}

// Every piece whose elements may meet the region's (their flat index spans overlap) is
// loaded; the elements of the intersection of the two boxes are visited in runs that are
// contiguous in the tensor and in both boxes, and each run's part that lies in both element
// ranges is copied.
void Reader::read(const std::string& tensor, const Shape& want_shape, const Region& q,
                  float* out) const {
  const Shape stored = shape(tensor);  // throws if absent
  if (numel(stored) != numel(want_shape))
    throw UserError("checkpoint tensor " + tensor + " has " + std::to_string(numel(stored)) +
                        " elements, the model's has " + std::to_string(numel(want_shape)),
                    "was it written for another model config?");
  const bool same_shape = stored == want_shape;
  const Shape& shape = want_shape;
  const Shape q_start = q.start.empty() ? Shape(shape.size(), 0) : q.start;
  const Shape q_extent = q.extent.empty() ? shape : q.extent;
  auto flat_of = [&](const Shape& st, const Shape& ex, int64_t pos) {
    return box_flat_index(shape, st, ex, pos);
  };
  const int64_t q_lo = flat_of(q_start, q_extent, q.begin);
  const int64_t q_hi = flat_of(q_start, q_extent, q.begin + q.count - 1);
  const auto& pieces = manifest_["tensors"][tensor]["pieces"];
  int64_t copied = 0;
  for (size_t i = 0; i < pieces.size() && q.count > 0; ++i) {
    const auto& pj = pieces[i];
    const bool whole = !pj.contains("start");
    if (!whole && !same_shape)
      throw UserError("checkpoint tensor " + tensor + " is stored with another shape",
                      "was it written for another model config?");
    const Shape p_start = whole ? Shape(shape.size(), 0) : pj["start"].get<Shape>();
    const Shape p_extent = whole ? shape : pj["extent"].get<Shape>();
    const int64_t p_begin = pj["begin"], p_count = pj["count"];
    if (p_count == 0 || flat_of(p_start, p_extent, p_begin + p_count - 1) < q_lo ||
        flat_of(p_start, p_extent, p_begin) > q_hi)
      continue;
    Shape i_start(shape.size()), i_extent(shape.size());
    bool empty = false;
    for (size_t d = 0; d < shape.size(); ++d) {
      i_start[d] = std::max(p_start[d], q_start[d]);
      i_extent[d] = std::min(p_start[d] + p_extent[d], q_start[d] + q_extent[d]) - i_start[d];
      empty = empty || i_extent[d] <= 0;
    }
    if (empty) continue;
    const std::vector<float> data = piece_data(tensor, i);
    for_each_box_run(
        shape, i_start, i_extent, 0, numel(i_extent), [&](int64_t, int64_t flat, int64_t len) {
          const int64_t pp = box_position(shape, p_start, p_extent, flat);
          const int64_t qp = box_position(shape, q_start, q_extent, flat);
          const int64_t lo = std::max({int64_t{0}, p_begin - pp, q.begin - qp});
          const int64_t hi = std::min({len, p_begin + p_count - pp, q.begin + q.count - qp});
          if (lo >= hi) return;
          std::copy(data.begin() + (pp + lo - p_begin), data.begin() + (pp + hi - p_begin),
                    out + (qp + lo - q.begin));
          copied += hi - lo;
        });
  }
  LOOM_CHECK_MSG(copied == q.count, "checkpoint pieces of " + tensor + " do not cover the read");
}

}  // namespace loom::ckpt
