#include "loom/comm/store/memory_store.h"

#include <algorithm>

#include "loom/core/error.h"

namespace loom::comm {

MemoryStore::MemoryStore() : table_(std::make_shared<Table>()) {}

void MemoryStore::set(const std::string& key, const std::string& value) {
  {
    std::lock_guard<std::mutex> lock(table_->mu);
    table_->kv[key] = value;
  }
  table_->cv.notify_all();
}

std::string MemoryStore::get(const std::string& key, Deadline deadline) {
  wait({key}, deadline);
  std::lock_guard<std::mutex> lock(table_->mu);
  return table_->kv[key];
}

int64_t MemoryStore::add(const std::string& key, int64_t delta) {
  int64_t v;
  {
    std::lock_guard<std::mutex> lock(table_->mu);
    auto it = table_->kv.find(key);
    v = (it == table_->kv.end() || it->second.empty()) ? 0 : std::stoll(it->second);
    v += delta;
    table_->kv[key] = std::to_string(v);
  }
  table_->cv.notify_all();
  return v;
}

std::string MemoryStore::compare_set(const std::string& key, const std::string& expected,
                                     const std::string& desired) {
  std::string after;
  {
    std::lock_guard<std::mutex> lock(table_->mu);
    auto it = table_->kv.find(key);
    std::string current = it == table_->kv.end() ? std::string() : it->second;
    if (current == expected) {
      table_->kv[key] = desired;
      after = desired;
    } else {
      after = current;
    }
  }
  table_->cv.notify_all();
  return after;
}

bool MemoryStore::remove(const std::string& key) {
  std::lock_guard<std::mutex> lock(table_->mu);
  return table_->kv.erase(key) > 0;
}

void MemoryStore::wait(const std::vector<std::string>& keys, Deadline deadline) {
  std::unique_lock<std::mutex> lock(table_->mu);
  auto all_present = [&] {
    return std::all_of(keys.begin(), keys.end(),
                       [&](const std::string& k) { return table_->kv.count(k) > 0; });
  };
  if (!table_->cv.wait_until(lock, deadline.at(), all_present)) {
    std::string missing;
    for (const auto& k : keys)
      if (!table_->kv.count(k)) missing += (missing.empty() ? "" : ", ") + k;
    throw PeerError(PeerError::Kind::kTimeout,
                    "store: timed out waiting for keys [" + missing + "]");
  }
}

bool MemoryStore::check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(table_->mu);
  return std::all_of(keys.begin(), keys.end(),
                     [&](const std::string& k) { return table_->kv.count(k) > 0; });
}

std::unique_ptr<Store> MemoryStore::clone() {
  return std::make_unique<MemoryStore>(table_);
}

}  // namespace loom::comm
