#include "loom/ckpt/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

#include "loom/core/error.h"
#include "loom/core/file.h"

namespace loom::ckpt {
namespace fs = std::filesystem;

namespace {

constexpr uint64_t kMaxHeader = 100 << 20;  // the format's own limit

const char* dtype_code(DType t) {
  switch (t) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
    case DType::kF64:
      return "F64";
    case DType::kI32:
      return "I32";
    case DType::kI64:
      return "I64";
    default:
      throw InternalError("no safetensors dtype for " + std::string(dtype_name(t)));
  }
}

std::optional<DType> dtype_from_code(const std::string& s) {
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kF64, DType::kI32, DType::kI64})
    if (s == dtype_code(t)) return t;
  return std::nullopt;
}

// A descriptor closed on scope exit.
struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

void pread_all(int fd, void* out, size_t n, uint64_t offset, const std::string& path) {
  char* p = static_cast<char*>(out);
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, n, static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0)
      throw UserError("cannot read " + path + ": " +
                          (r == 0 ? "it is shorter than its header says" : errno_text(errno)),
                      "the file is damaged or truncated; export or download it again");
    p += r, n -= static_cast<size_t>(r), offset += static_cast<uint64_t>(r);
  }
}

}  // namespace

void encode_floats(DType dtype, const float* in, size_t n, void* out) {
  switch (dtype) {
    case DType::kF32:
      std::memcpy(out, in, n * sizeof(float));
      return;
    case DType::kF16: {
      auto* o = static_cast<uint16_t*>(out);
      for (size_t i = 0; i < n; ++i) o[i] = f32_to_f16(in[i]);
      return;
    }
    case DType::kBF16: {
      auto* o = static_cast<uint16_t*>(out);
      for (size_t i = 0; i < n; ++i) o[i] = f32_to_bf16(in[i]);
      return;
    }
    default:
      throw InternalError("encode_floats: " + std::string(dtype_name(dtype)));
  }
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  auto bad = [&](const std::string& why) {
    return UserError(path + " is not a valid safetensors file: " + why,
                     "the file is damaged or truncated; export or download it again");
  };
  Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (f.fd < 0) throw UserError("cannot read " + path + ": " + errno_text(errno), "check the path");
  std::error_code ec;
  const uint64_t size = fs::file_size(path, ec);
  if (ec || size < 8) throw bad("shorter than its 8-byte header length");
  uint64_t n = 0;
  pread_all(f.fd, &n, 8, 0, path);
  if (n > kMaxHeader || n > size - 8)
    throw bad("the header length " + std::to_string(n) + " exceeds the file (" +
              std::to_string(size) + " bytes)");
  std::string text(n, '\0');
  pread_all(f.fd, text.data(), n, 8, path);
  data_start_ = 8 + n;
  const uint64_t data_size = size - data_start_;
  nlohmann::json h = nlohmann::json::parse(text, nullptr, false);
  if (h.is_discarded() || !h.is_object()) throw bad("the header is not a JSON object");
  for (auto& [name, v] : h.items()) {
    if (name == "__metadata__") {
      if (!v.is_object()) throw bad("__metadata__ is not an object");
      for (auto& [k, m] : v.items())
        if (m.is_string()) metadata_[k] = m.get<std::string>();
      continue;
    }
    const std::string where = "tensor '" + name + "'";
    if (!v.is_object() || !v.contains("dtype") || !v["dtype"].is_string() || !v.contains("shape") ||
        !v["shape"].is_array() || !v.contains("data_offsets") || !v["data_offsets"].is_array() ||
        v["data_offsets"].size() != 2)
      throw bad(where + " lacks dtype, shape or data_offsets");
    SafetensorsTensor t;
    t.name = name;
    const auto dt = dtype_from_code(v["dtype"].get<std::string>());
    if (!dt)
      throw bad(where + " has dtype " + v["dtype"].dump() + ", not F32/F16/BF16/F64/I32/I64");
    t.dtype = *dt;
    uint64_t elems = 1;
    for (auto& d : v["shape"]) {
      // Bounded so the element count cannot overflow; the byte count check below does the rest.
      const uint64_t n = d.is_number_unsigned() ? d.get<uint64_t>() : UINT64_MAX;
      if (n > (1ull << 40) || (n && elems > (1ull << 48) / n))
        throw bad(where + " has a bad shape " + v["shape"].dump());
      t.shape.push_back(static_cast<int64_t>(n));
      elems *= n;
    }
    for (auto& o : v["data_offsets"])
      if (!o.is_number_unsigned()) throw bad(where + " has bad data_offsets");
    t.begin = v["data_offsets"][0].get<uint64_t>();
    t.end = v["data_offsets"][1].get<uint64_t>();
    if (t.begin > t.end || t.end > data_size)
      throw bad(where + ": its data_offsets [" + std::to_string(t.begin) + ", " +
                std::to_string(t.end) + "] run past the " + std::to_string(data_size) +
                " bytes of data (truncated, or the header is wrong)");
    if (t.end - t.begin != elems * dtype_size(t.dtype))
      throw bad(where + " has " + std::to_string(t.end - t.begin) + " bytes for shape " +
                v["shape"].dump() + " of " + v["dtype"].get<std::string>() + " (" +
                std::to_string(elems * dtype_size(t.dtype)) + " expected)");
    tensors_.push_back(std::move(t));
  }
  // Back to back, covering the data: no overlap (two tensors sharing bytes) and no hole.
  std::vector<const SafetensorsTensor*> by_offset;
  for (const auto& t : tensors_) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t at = 0;
  for (const auto* t : by_offset) {
    if (t->begin != at)
      throw bad("tensor '" + t->name + "' starts at byte " + std::to_string(t->begin) + ", not " +
                std::to_string(at) + (t->begin < at ? " (it overlaps another)" : " (a hole)"));
    at = t->end;
  }
  if (at != data_size)
    throw bad("the tensors end at byte " + std::to_string(at) + " of " + std::to_string(data_size) +
              " bytes of data");
}

const SafetensorsTensor* SafetensorsFile::find(const std::string& name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

std::vector<float> SafetensorsFile::read_f32(const std::string& name) const {
  const SafetensorsTensor* t = find(name);
  if (!t) throw UserError(path_ + " has no tensor '" + name + "'", "is it a GPT-2 model file?");
  Fd f{::open(path_.c_str(), O_RDONLY | O_CLOEXEC)};
  if (f.fd < 0)
    throw UserError("cannot read " + path_ + ": " + errno_text(errno), "check the path");
  const size_t n = static_cast<size_t>(numel(t->shape));
  std::vector<float> out(n);
  if (t->dtype == DType::kF32) {
    pread_all(f.fd, out.data(), n * 4, data_start_ + t->begin, path_);
    return out;
  }
  std::vector<char> raw(t->end - t->begin);
  pread_all(f.fd, raw.data(), raw.size(), data_start_ + t->begin, path_);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(load_element(t->dtype, raw.data(), i));
  return out;
}

void write_safetensors(const std::string& path, const std::vector<SafetensorsTensor>& tensors,
                       const std::function<void(size_t, std::vector<float>&)>& fill,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  uint64_t at = 0;
  for (const auto& t : tensors) {
    const uint64_t bytes = static_cast<uint64_t>(numel(t.shape)) * dtype_size(t.dtype);
    h[t.name] = {
        {"dtype", dtype_code(t.dtype)}, {"shape", t.shape}, {"data_offsets", {at, at + bytes}}};
    at += bytes;
  }
  std::string text = h.dump();
  text.append((8 - (8 + text.size()) % 8) % 8, ' ');  // the data starts 8-byte aligned
  AtomicFileWriter out(path);
  const uint64_t n = text.size();
  out.write(&n, 8);
  out.write(text.data(), text.size());
  std::vector<float> values;
  std::vector<char> bytes;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const size_t count = static_cast<size_t>(numel(tensors[i].shape));
    values.assign(count, 0.0f);
    fill(i, values);
    if (values.size() != count)
      throw InternalError("write_safetensors: " + tensors[i].name + " filled with " +
                          std::to_string(values.size()) + " values, not " + std::to_string(count));
    if (tensors[i].dtype == DType::kF32) {
      out.write(values.data(), count * 4);
    } else {
      bytes.resize(count * dtype_size(tensors[i].dtype));
      encode_floats(tensors[i].dtype, values.data(), count, bytes.data());
      out.write(bytes.data(), bytes.size());
    }
  }
  out.commit();
}

}  // namespace loom::ckpt
