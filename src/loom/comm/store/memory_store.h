// An in-process store for ranks that run as threads of one test.
#pragma once

#include <condition_variable>
#include <map>
#include <mutex>

#include "loom/comm/store/store.h"

namespace loom::comm {

class MemoryStore : public Store {
 public:
  MemoryStore();
  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, Deadline deadline) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired) override;
  bool remove(const std::string& key) override;
  void wait(const std::vector<std::string>& keys, Deadline deadline) override;
  bool check(const std::vector<std::string>& keys) override;
  std::unique_ptr<Store> clone() override;

  // The shared table; also used by TcpStoreServer so both behave the same.
  struct Table {
    std::mutex mu;
    std::condition_variable cv;
    std::map<std::string, std::string> kv;
  };
  explicit MemoryStore(std::shared_ptr<Table> table) : table_(std::move(table)) {}

 private:
  std::shared_ptr<Table> table_;
};

}  // namespace loom::comm
