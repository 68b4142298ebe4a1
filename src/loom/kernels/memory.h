// Where a backend's buffers live. The model's activations, its scratch and its bf16 weight
// copies are Buffers that the backend allocates (Backend is a Memory), so a device with its
// own memory (a GPU) gives out device pointers and its kernels read them there; the model
// moves data between the host and the device only through to_host / from_host (the tokens
// in, the losses out).
//
// The two backends built today (cpu, reference) keep buffers in host memory: HostMemory,
// 64-byte aligned heap blocks, host_visible() — so the offloader and the tests may read a
// buffer through its pointer. Code that must also work on a device checks host_visible()
// or copies (docs/architecture.md: adding a backend).
#pragma once

#include <cstddef>
#include <cstring>
#include <memory>
#include <new>
#include <utility>

#include "loom/core/check.h"

namespace loom::kernels {

class Memory {
 public:
  virtual ~Memory() = default;
  // `bytes` (> 0) of the device's memory, 64-byte aligned, contents unspecified.
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* p) = 0;
  virtual void fill_zero(void* p, size_t bytes) = 0;
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;  // device to device
  virtual void to_host(void* host, const void* src, size_t bytes) = 0;
  virtual void from_host(void* dst, const void* host, size_t bytes) = 0;
  // Whether the host may read and write buffers through their pointers.
  virtual bool host_visible() const = 0;
};

// The heap: what CPU backends allocate from.
class HostMemory : public Memory {
 public:
  void* allocate(size_t bytes) override { return ::operator new (bytes, std::align_val_t{64}); }
  void deallocate(void* p) override { ::operator delete (p, std::align_val_t{64}); }
  void fill_zero(void* p, size_t bytes) override { std::memset(p, 0, bytes); }
  void copy(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void to_host(void* host, const void* src, size_t bytes) override {
    std::memcpy(host, src, bytes);
  }
  void from_host(void* dst, const void* host, size_t bytes) override {
    std::memcpy(dst, host, bytes);
  }
  bool host_visible() const override { return true; }
};
// The one HostMemory the CPU backends share.
inline const std::shared_ptr<Memory>& host_memory() {
  static const std::shared_ptr<Memory> m = std::make_shared<HostMemory>();
  return m;
}

// n elements of T in a Memory, owned (move-only). It keeps its memory alive: a model may
// change backends while buffers of the old one are still held.
template <typename T>
class Buffer {
 public:
  Buffer() = default;
  // n elements, zero.
  explicit Buffer(std::shared_ptr<Memory> mem, size_t n = 0) : mem_(std::move(mem)) { zeros(n); }
  Buffer(Buffer&& o) noexcept { swap(o); }
  Buffer& operator=(Buffer&& o) noexcept {
    Buffer(std::move(o)).swap(*this);
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { release(); }

  T* data() { return p_; }
  const T* data() const { return p_; }
  size_t size() const { return n_; }
  bool empty() const { return n_ == 0; }
  size_t capacity() const { return cap_; }  // elements the allocation holds
  size_t bytes() const { return n_ * sizeof(T); }
  const std::shared_ptr<Memory>& memory() const { return mem_; }

  // n elements, zero (the allocation reused when it holds them).
  void zeros(size_t n) {
    resize_discard(n);
    zero();
  }
  void zero() {
    if (n_) mem_->fill_zero(p_, bytes());
  }
  // n elements: the first ones kept, new ones zero (std::vector's resize).
  void resize(size_t n) {
    if (n > cap_) {
      Buffer grown(mem_, n);
      if (n_) mem_->copy(grown.p_, p_, bytes());
      swap(grown);
      mem_ = grown.mem_;
    } else if (n > n_) {
      mem_->fill_zero(p_ + n_, (n - n_) * sizeof(T));
    }
    n_ = n;
  }
  // n elements, contents unspecified (the allocation reused when it holds them).
  void resize_discard(size_t n) {
    if (n > cap_) {
      LOOM_CHECK(mem_);
      release();
      p_ = static_cast<T*>(mem_->allocate(n * sizeof(T)));
      cap_ = n;
    }
    n_ = n;
  }
  // n elements copied from src in the same memory.
  void copy_from(const T* src, size_t n) {
    resize_discard(n);
    if (n) mem_->copy(p_, src, n * sizeof(T));
  }
  void from_host(const T* host, size_t n) {
    resize_discard(n);
    if (n) mem_->from_host(p_, host, n * sizeof(T));
  }
  void to_host(T* host) const {
    if (n_) mem_->to_host(host, p_, bytes());
  }
  // The allocation, handed to a new buffer; this one keeps its memory, empty.
  Buffer take() {
    Buffer out(mem_);
    out.swap(*this);
    mem_ = out.mem_;
    return out;
  }
  // Frees the allocation (size and capacity 0); the memory stays for a later resize.
  void release() {
    if (p_) mem_->deallocate(p_);
    p_ = nullptr, n_ = cap_ = 0;
  }
  void swap(Buffer& o) noexcept {
    std::swap(mem_, o.mem_), std::swap(p_, o.p_), std::swap(n_, o.n_), std::swap(cap_, o.cap_);
  }

 private:
  std::shared_ptr<Memory> mem_;
  T* p_ = nullptr;
  size_t n_ = 0, cap_ = 0;
};

}  // namespace loom::kernels
