#include "loom/ckpt/gguf.h"

#include <cstring>
#include <filesystem>
#include <fstream>

#include "loom/ckpt/safetensors.h"
#include "loom/core/error.h"
#include "loom/core/file.h"

namespace loom::ckpt {

namespace {

constexpr uint64_t kAlignment = 32;  // general.alignment's default
enum GgufType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};

uint64_t aligned(uint64_t x, uint64_t to = kAlignment) {
  return (x + to - 1) / to * to;
}

// Little-endian bytes appended to a buffer (x86-64 and AArch64 are little-endian).
struct Out {
  std::string b;
  template <typename T>
  void pod(T v) {
    b.append(reinterpret_cast<const char*>(&v), sizeof v);
  }
  void str(const std::string& s) {
    pod<uint64_t>(s.size());
    b += s;
  }
  void value(const GgufValue& v) {
    struct Visit {
      Out& o;
      void operator()(uint32_t x) { o.pod<uint32_t>(kU32), o.pod(x); }
      void operator()(int32_t x) { o.pod<uint32_t>(kI32), o.pod(x); }
      void operator()(float x) { o.pod<uint32_t>(kF32), o.pod(x); }
      void operator()(bool x) { o.pod<uint32_t>(kBool), o.pod<uint8_t>(x ? 1 : 0); }
      void operator()(uint64_t x) { o.pod<uint32_t>(kU64), o.pod(x); }
      void operator()(const std::string& s) { o.pod<uint32_t>(kString), o.str(s); }
      void operator()(const std::vector<std::string>& a) {
        o.pod<uint32_t>(kArray), o.pod<uint32_t>(kString), o.pod<uint64_t>(a.size());
        for (const auto& s : a) o.str(s);
      }
      void operator()(const std::vector<int32_t>& a) {
        o.pod<uint32_t>(kArray), o.pod<uint32_t>(kI32), o.pod<uint64_t>(a.size());
        for (int32_t x : a) o.pod(x);
      }
      void operator()(const std::vector<float>& a) {
        o.pod<uint32_t>(kArray), o.pod<uint32_t>(kF32), o.pod<uint64_t>(a.size());
        for (float x : a) o.pod(x);
      }
    };
    std::visit(Visit{*this}, v);
  }
};

// Reads the header back, bounds-checked against the file.
class In {
 public:
  In(const std::string& path) : path_(path), f_(path, std::ios::binary) {
    if (!f_) throw UserError("cannot read " + path, "check the path");
    f_.seekg(0, std::ios::end);
    size_ = static_cast<uint64_t>(f_.tellg());
    f_.seekg(0);
  }
  template <typename T>
  T pod() {
    T v;
    bytes(&v, sizeof v);
    return v;
  }
  std::string str() {
    const uint64_t n = pod<uint64_t>();
    if (n > size_) bad("a string of " + std::to_string(n) + " bytes");
    std::string s(n, '\0');
    bytes(s.data(), n);
    return s;
  }
  uint64_t pos() { return static_cast<uint64_t>(f_.tellg()); }
  uint64_t size() const { return size_; }
  [[noreturn]] void bad(const std::string& why) {
    throw UserError(path_ + " is not a valid GGUF file: " + why,
                    "the file is damaged or truncated; export it again");
  }
  GgufValue value(uint32_t type) {
    switch (type) {
      case kU8:
        return static_cast<int32_t>(pod<uint8_t>());
      case kI8:
        return static_cast<int32_t>(pod<int8_t>());
      case kU16:
        return static_cast<int32_t>(pod<uint16_t>());
      case kI16:
        return static_cast<int32_t>(pod<int16_t>());
      case kU32:
        return pod<uint32_t>();
      case kI32:
        return pod<int32_t>();
      case kF32:
        return pod<float>();
      case kBool:
        return pod<uint8_t>() != 0;
      case kString:
        return str();
      case kU64:
      case kI64:
        return pod<uint64_t>();
      case kF64:
        return static_cast<float>(pod<double>());
      case kArray: {
        const uint32_t t = pod<uint32_t>();
        const uint64_t n = pod<uint64_t>();
        if (n > size_) bad("an array of " + std::to_string(n) + " elements");
        if (t == kString) {
          std::vector<std::string> a;
          for (uint64_t i = 0; i < n; ++i) a.push_back(str());
          return a;
        }
        if (t == kF32 || t == kF64) {
          std::vector<float> a;
          for (uint64_t i = 0; i < n; ++i) a.push_back(std::get<float>(value(t)));
          return a;
        }
        std::vector<int32_t> a;
        for (uint64_t i = 0; i < n; ++i) {
          GgufValue e = value(t);
          if (auto* x = std::get_if<int32_t>(&e))
            a.push_back(*x);
          else if (auto* u = std::get_if<uint32_t>(&e))
            a.push_back(static_cast<int32_t>(*u));
          else if (auto* w = std::get_if<uint64_t>(&e))
            a.push_back(static_cast<int32_t>(*w));
          else if (auto* b = std::get_if<bool>(&e))
            a.push_back(*b);
          else
            bad("an array of type " + std::to_string(t));
        }
        return a;
      }
      default:
        bad("metadata of unknown type " + std::to_string(type));
    }
  }

 private:
  void bytes(void* out, uint64_t n) {
    if (pos() + n > size_) bad("it ends inside its header (truncated)");
    f_.read(static_cast<char*>(out), static_cast<std::streamsize>(n));
    if (!f_) bad("a read failed");
  }
  std::string path_;
  std::ifstream f_;
  uint64_t size_ = 0;
};

}  // namespace

uint32_t ggml_type_of(DType t) {
  switch (t) {
    case DType::kF32:
      return 0;
    case DType::kF16:
      return 1;
    case DType::kBF16:
      return 30;
    default:
      throw InternalError("no ggml type for " + std::string(dtype_name(t)));
  }
}

void GgufWriter::write(const std::string& path,
                       const std::function<void(size_t, std::vector<float>&)>& fill) const {
  Out h;
  h.b = "GGUF";
  h.pod<uint32_t>(3);
  h.pod<uint64_t>(tensors_.size());
  h.pod<uint64_t>(meta_.size());
  for (const auto& [key, v] : meta_) h.str(key), h.value(v);
  uint64_t offset = 0;
  for (const GgufTensor& t : tensors_) {
    h.str(t.name);
    h.pod<uint32_t>(static_cast<uint32_t>(t.shape.size()));
    for (auto d = t.shape.rbegin(); d != t.shape.rend(); ++d)
      h.pod<uint64_t>(static_cast<uint64_t>(*d));
    h.pod<uint32_t>(ggml_type_of(t.dtype));
    h.pod<uint64_t>(offset);
    offset = aligned(offset + static_cast<uint64_t>(numel(t.shape)) * dtype_size(t.dtype));
  }
  h.b.append(aligned(h.b.size()) - h.b.size(), '\0');
  AtomicFileWriter out(path);
  out.write(h.b.data(), h.b.size());
  std::vector<float> values;
  std::vector<char> bytes;
  const char zeros[kAlignment] = {};
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const GgufTensor& t = tensors_[i];
    const size_t n = static_cast<size_t>(numel(t.shape));
    values.assign(n, 0.0f);
    fill(i, values);
    if (values.size() != n) throw InternalError("GgufWriter: " + t.name + " filled wrongly");
    bytes.resize(n * dtype_size(t.dtype));
    encode_floats(t.dtype, values.data(), n, bytes.data());
    out.write(bytes.data(), bytes.size());
    out.write(zeros, aligned(bytes.size()) - bytes.size());
  }
  out.commit();
}

GgufFile::GgufFile(const std::string& path) {
  In in(path);
  file_size = in.size();
  char magic[4];
  for (char& c : magic) c = in.pod<char>();
  if (std::memcmp(magic, "GGUF", 4) != 0) in.bad("no GGUF magic");
  version = in.pod<uint32_t>();
  if (version != 2 && version != 3) in.bad("version " + std::to_string(version));
  const uint64_t n_tensors = in.pod<uint64_t>(), n_meta = in.pod<uint64_t>();
  if (n_tensors > in.size() || n_meta > in.size()) in.bad("impossible counts");
  for (uint64_t i = 0; i < n_meta; ++i) {
    std::string key = in.str();
    const uint32_t type = in.pod<uint32_t>();
    meta[key] = in.value(type);
  }
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensor t;
    t.name = in.str();
    const uint32_t nd = in.pod<uint32_t>();
    if (nd > 8) in.bad("tensor " + t.name + " has " + std::to_string(nd) + " dimensions");
    uint64_t elems = 1;
    for (uint32_t d = 0; d < nd; ++d) {
      const uint64_t n = in.pod<uint64_t>();
      if (n > (1ull << 40) || (n && elems > (1ull << 48) / n))
        in.bad("tensor " + t.name + " has an impossible shape");
      elems *= n;
      t.shape.insert(t.shape.begin(), static_cast<int64_t>(n));
    }
    const uint32_t type = in.pod<uint32_t>();
    t.dtype = type == 0    ? DType::kF32
              : type == 1  ? DType::kF16
              : type == 30 ? DType::kBF16
                           : DType::kU8;
    t.offset = in.pod<uint64_t>();
    tensors.push_back(std::move(t));
  }
  uint64_t alignment = kAlignment;
  if (auto it = meta.find("general.alignment"); it != meta.end())
    if (auto* a = std::get_if<uint32_t>(&it->second); a && *a > 0) alignment = *a;
  data_start = aligned(in.pos(), alignment);
  for (const auto& t : tensors)
    if (t.dtype != DType::kU8 &&
        data_start + t.offset + static_cast<uint64_t>(numel(t.shape)) * dtype_size(t.dtype) >
            file_size)
      in.bad("tensor " + t.name + " runs past the end of the file (truncated)");
}

}  // namespace loom::ckpt
