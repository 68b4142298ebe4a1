#include "loom/ckpt/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <thread>

#include "loom/core/check.h"
#include "loom/core/checksum.h"
#include "loom/core/error.h"
#include "loom/core/file.h"
#include "loom/core/tunable.h"

namespace loom::ckpt {
namespace fs = std::filesystem;

namespace {
constexpr int kFormatVersion = 1;

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
    for (const Piece& p : pieces) {
      const size_t bytes = static_cast<size_t>(p.count) * sizeof(float);
      write_all(fd, p.data, bytes, path);
      index.push_back({{"tensor", p.tensor},
                       {"shape", p.shape},
                       {"file", data},
                       {"offset", offset},
                       {"begin", p.begin},
                       {"count", p.count},
                       {"checksum", checksum64(p.data, bytes)}});
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
      t["pieces"].push_back({{"file", p["file"]},
                             {"offset", p["offset"]},
                             {"begin", p["begin"]},
                             {"count", p["count"]},
                             {"checksum", p["checksum"]}});
    }
    fs::remove(ipath);
  }
  for (auto& [name, t] : tensors.items()) {
    auto& pieces = t["pieces"];
    std::sort(pieces.begin(), pieces.end(),
              [](const auto& a, const auto& b) { return a["begin"] < b["begin"]; });
    int64_t numel = 1, at = 0;
    for (const auto& d : t["shape"]) numel *= d.get<int64_t>();
    for (const auto& p : pieces) {
      LOOM_CHECK_MSG(p["begin"].get<int64_t>() == at, "pieces of " + name + " do not tile it");
      at += p["count"].get<int64_t>();
    }
    LOOM_CHECK_MSG(at == numel, "pieces of " + name + " do not cover it");
  }
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
    auto all = complete_checkpoints(opt.root);
    for (size_t i = 0; i + opt.keep < all.size(); ++i) fs::remove_all(all[i]);
  }
  barrier();
  return final_dir;
}

std::string latest(const std::string& root) {
  auto all = complete_checkpoints(root);
  return all.empty() ? "" : all.back().string();
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
  if (manifest_.value("format", "") != "loom-checkpoint" ||
      manifest_.value("version", 0) != kFormatVersion)
    throw UserError(
        path + " is not a loom checkpoint of format version " + std::to_string(kFormatVersion),
        "it was written by another program or another loom version");
}

bool Reader::has(const std::string& tensor) const {
  return manifest_["tensors"].contains(tensor);
}

std::vector<int64_t> Reader::shape(const std::string& tensor) const {
  if (!has(tensor))
    throw UserError("checkpoint " + dir_ + " has no tensor '" + tensor + "'",
                    "was it written for another model config?");
  return manifest_["tensors"][tensor]["shape"].get<std::vector<int64_t>>();
}

void Reader::read(const std::string& tensor, int64_t begin, int64_t count, float* out) const {
  shape(tensor);  // throws if absent
  std::vector<float> buf;
  for (const auto& p : manifest_["tensors"][tensor]["pieces"]) {
    const int64_t pb = p["begin"], pc = p["count"];
    const int64_t lo = std::max(begin, pb), hi = std::min(begin + count, pb + pc);
    if (lo >= hi) continue;
    const std::string path = dir_ + "/" + p["file"].get<std::string>();
    int fd = ::open(path.c_str(), O_RDONLY);
    if (fd < 0) throw io_error("open", path);
    buf.resize(static_cast<size_t>(pc));
    const size_t bytes = buf.size() * sizeof(float);
    const ssize_t got = ::pread(fd, buf.data(), bytes, p["offset"].get<off_t>());
    ::close(fd);
    if (got != static_cast<ssize_t>(bytes))
      throw UserError("checkpoint file " + path + " is truncated (tensor " + tensor + ")",
                      "the checkpoint is damaged; use an older one");
    if (checksum64(buf.data(), bytes) != p["checksum"].get<uint64_t>())
      throw UserError("checkpoint file " + path + " fails its checksum (tensor " + tensor + ")",
                      "the checkpoint is damaged; use an older one");
    std::copy(buf.begin() + (lo - pb), buf.begin() + (hi - pb), out + (lo - begin));
  }
}

}  // namespace loom::ckpt
