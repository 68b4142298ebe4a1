// A namespace inside another store: every key gets "<prefix>/" in front, so a sub-group's
// rendezvous cannot collide with its parent's.
#pragma once

#include <memory>

#include "loom/comm/store/store.h"

namespace loom::comm {

class PrefixStore : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> base)
      : prefix_(std::move(prefix) + "/"), base_(std::move(base)) {}

  void set(const std::string& key, const std::string& value) override {
    base_->set(prefix_ + key, value);
  }
  std::string get(const std::string& key, Deadline deadline) override {
    return base_->get(prefix_ + key, deadline);
  }
  int64_t add(const std::string& key, int64_t delta) override {
    return base_->add(prefix_ + key, delta);
  }
  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired) override {
    return base_->compare_set(prefix_ + key, expected, desired);
  }
  bool remove(const std::string& key) override { return base_->remove(prefix_ + key); }
  void wait(const std::vector<std::string>& keys, Deadline deadline) override {
    base_->wait(prefixed(keys), deadline);
  }
  bool check(const std::vector<std::string>& keys) override { return base_->check(prefixed(keys)); }
  std::unique_ptr<Store> clone() override {
    return std::make_unique<PrefixStore>(prefix_.substr(0, prefix_.size() - 1), base_->clone());
  }
  std::string local_host() const override { return base_->local_host(); }
  const std::string& prefix() const { return prefix_; }

 private:
  std::vector<std::string> prefixed(const std::vector<std::string>& keys) const {
    std::vector<std::string> out;
    out.reserve(keys.size());
    for (const auto& k : keys) out.push_back(prefix_ + k);
    return out;
  }
  std::string prefix_;
  std::shared_ptr<Store> base_;
};

}  // namespace loom::comm
