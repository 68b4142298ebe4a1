#include "loom/comm/tuning.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>

#include "loom/comm/algorithms/table.h"
#include "loom/core/error.h"
#include "loom/core/tunable.h"

namespace loom::comm {
namespace {

const DoubleTunable kShmAlpha("LOOM_SHM_ALPHA_US", 0.4, "cost-model latency of one shm step, us");
const DoubleTunable kShmGbps("LOOM_SHM_GBPS", 12.0, "cost-model bandwidth of shm, GB/s");
const DoubleTunable kTcpAlpha("LOOM_TCP_ALPHA_US", 30.0, "cost-model latency of one TCP step, us");
const DoubleTunable kTcpGbps("LOOM_TCP_GBPS", 1.7, "cost-model bandwidth of TCP, GB/s");
const BytesTunable kSharedAllreduceMin("LOOM_SHARED_ALLREDUCE_MIN", 1 << 20,
                                       "allreduces of at least this many bytes on one machine use "
                                       "the shared algorithm (0: never chosen on its own)");
const BytesTunable kSharedReduceScatterMin(
    "LOOM_SHARED_REDUCE_SCATTER_MIN", 1 << 20,
    "reduce-scatters of at least this many input bytes on one machine use the shared "
    "algorithm (0: never chosen on its own)");
const StringTunable kTuningFile("LOOM_TUNING_FILE", "",
                                "measured algorithm table (loom bench --calibrate FILE) used "
                                "instead of the cost model where it has the topology and op");

bool is_pow2(int n) {
  return n > 0 && (n & (n - 1)) == 0;
}
// Every rank's buffers of `bytes` are in shared memory (Topology::shared_from).
bool shared_buffers(const Topology& t, size_t bytes) {
  return t.shared_from > 0 && bytes >= t.shared_from;
}
int ceil_log2(int n) {
  int l = 0;
  while ((1 << l) < n) ++l;
  return l;
}

}  // namespace

int Topology::max_local() const {
  size_t m = 0;
  for (const auto& h : hosts) m = std::max(m, h.size());
  return static_cast<int>(m);
}

std::string Topology::describe() const {
  std::ostringstream os;
  os << size << " ranks on " << nhosts() << " host(s)";
  if (force_tcp) os << ", TCP forced";
  if (oversubscribed) os << ", oversubscribed";
  return os.str();
}

TuningTable::Key TuningTable::key_of(const Topology& t) {
  return {t.nhosts(), t.max_local(), t.size, t.force_tcp};
}

const TuningTable::Entry* TuningTable::lookup(OpKind op, size_t bytes, const Topology& t) const {
  auto it = tables.find(key_of(t));
  if (it == tables.end()) return nullptr;
  const Entry* best = nullptr;
  double best_d = 0;
  for (const Entry& e : it->second) {
    if (e.op != op) continue;
    const double d = std::abs(std::log2(static_cast<double>(std::max<size_t>(bytes, 1))) -
                              std::log2(static_cast<double>(std::max<size_t>(e.bytes, 1))));
    if (!best || d < best_d) best = &e, best_d = d;
  }
  return best;
}

TuningTable TuningTable::load(const std::string& path) {
  std::ifstream f(path);
  const std::string hint = "write it with loom bench --calibrate " + path +
                           " on these machines, or unset LOOM_TUNING_FILE";
  if (!f) throw UserError("cannot read LOOM_TUNING_FILE " + path, hint);
  const nlohmann::json j = nlohmann::json::parse(f, nullptr, false);
  TuningTable t;
  try {
    if (j.is_discarded()) throw std::invalid_argument("not JSON");
    for (const auto& tab : j.at("tables")) {
      Key k{tab.at("nhosts").get<int>(), tab.at("local").get<int>(), tab.at("ranks").get<int>(),
            tab.at("force_tcp").get<bool>()};
      auto& entries = t.tables[k];
      for (const auto& e : tab.at("entries")) {
        auto op = parse_op(e.at("op").get<std::string>());
        auto algo = parse_algo(e.at("algo").get<std::string>());
        if (!op || !algo || *algo == Algo::kAuto)
          throw std::invalid_argument("unknown op or algorithm in " + e.dump());
        entries.push_back({*op, e.at("bytes").get<size_t>(), *algo,
                           e.value("us", std::map<std::string, double>{})});
      }
    }
  } catch (const std::exception& e) {
    throw UserError("LOOM_TUNING_FILE " + path + " is not a tuning table: " + e.what(), hint);
  }
  return t;
}

std::string TuningTable::to_json() const {
  nlohmann::json tabs = nlohmann::json::array();
  for (const auto& [k, entries] : tables) {
    nlohmann::json es = nlohmann::json::array();
    for (const Entry& e : entries)
      es.push_back(
          {{"op", op_name(e.op)}, {"bytes", e.bytes}, {"algo", algo_name(e.algo)}, {"us", e.us}});
    tabs.push_back({{"nhosts", k.nhosts},
                    {"local", k.local},
                    {"ranks", k.ranks},
                    {"force_tcp", k.force_tcp},
                    {"entries", es}});
  }
  return nlohmann::json{{"version", 1}, {"tables", tabs}}.dump(1);
}

CostModel CostModel::from_env() {
  CostModel m{{kShmAlpha.get(), kShmGbps.get()}, {kTcpAlpha.get(), kTcpGbps.get()}, nullptr};
  const std::string path = kTuningFile.get();
  if (!path.empty()) {
    // Loaded once per process and file (every communicator of a job reads the same one).
    static std::mutex mu;
    static std::map<std::string, std::shared_ptr<const TuningTable>> loaded;
    std::lock_guard<std::mutex> lock(mu);
    auto& t = loaded[path];
    if (!t) t = std::make_shared<const TuningTable>(TuningTable::load(path));
    m.measured = t;
  }
  return m;
}

std::vector<Algo> valid_algos(OpKind op, const Topology& topo) {
  std::vector<Algo> v;
  for (const algo::AlgoRow& r : algo::algo_table())
    if (r.op == op && (!r.valid || r.valid(topo))) v.push_back(r.algo);
  return v;
}

double predict_us(OpKind op, Algo algo, size_t bytes, const Topology& topo, const CostModel& m) {
  const int n = topo.size;
  if (n <= 1) return 0;
  // The slowest link a flat algorithm crosses.
  LinkCost l = topo.all_shm() ? m.shm : m.tcp;
  double alpha = l.alpha_us;
  double gbps = l.gbps;
  if (topo.all_shm() && topo.oversubscribed) {
    alpha *= 6;  // each step costs a yield to the rank that holds the core
    gbps /= 2;   // and the cores are shared
  }
  const double B = static_cast<double>(bytes);
  const double us_per_byte = 1e-3 / gbps;
  // rd and direct make an extra local pass over what they receive (a staging copy, or a
  // reduction reading a peer's whole buffer); ring reduces N/n-sized blocks while in cache.
  const double pass = 1.5;
  const int L = ceil_log2(n);
  const int rd_steps = L + (is_pow2(n) ? 0 : 2);
  switch (op) {
    case OpKind::kAllreduce:
      switch (algo) {
        case Algo::kRing:
          return 2.0 * (n - 1) * (alpha + B / n * us_per_byte);
        case Algo::kRd:
          return rd_steps * (alpha + pass * B * us_per_byte);
        case Algo::kDirect:
          return alpha + 0.25 * alpha * (n - 2) + pass * (n - 1) * B * us_per_byte;
        case Algo::kTree:
          return 2.0 * L * alpha + 2.5 * B * us_per_byte;
        case Algo::kShared: {
          // Two steps, each a message to every peer; each rank reads n blocks of B/n and
          // writes them n times in one pass, with no staging copy through the rings (the
          // 0.75 against ring's 1 for n = 2). Below its minimum the other algorithms' small-
          // message paths win, and from heap buffers it is ring after a descriptor exchange.
          // Where every rank's buffers of this size are shared (topo.shared_from), the model
          // decides from any size: from shared buffers it wins from 4-16 KiB on (2-4 ranks,
          // docs/perf.md).
          const int64_t min = kSharedAllreduceMin.get();
          if (min <= 0) return std::numeric_limits<double>::infinity();
          if (!shared_buffers(topo, bytes) && B < static_cast<double>(min))
            return std::numeric_limits<double>::infinity();
          return 2.0 * alpha * (1 + 0.25 * (n - 2)) + 0.75 * B * us_per_byte;
        }
        case Algo::kHier: {
          int h = topo.nhosts(), k = topo.max_local();
          double local = 2.0 * (m.shm.alpha_us + (k - 1) * B * 1e-3 / m.shm.gbps);
          double inter = 2.0 * (h - 1) * (m.tcp.alpha_us + B / h * 1e-3 / m.tcp.gbps);
          return std::max(local, inter) + m.tcp.alpha_us * 2;  // pipelined: the slower level
        }
        default:
          break;
      }
      break;
    case OpKind::kAllgather:
    case OpKind::kReduceScatter:
      switch (algo) {
        case Algo::kRing:
          return (n - 1) * (alpha + B / n * us_per_byte);
        case Algo::kShared: {
          // Reduce-scatter only (the table has no shared allgather row): two steps, each a
          // message to every peer; each rank reads its block of every input once, where
          // ring passes partial sums around (the 0.75 as for the allreduce). On 2 ranks
          // ring is that single pass already (each reads the other's block, in place from
          // shared buffers) in one step fewer: measured 0.87-1.01x, so not chosen there.
          // It reads the inputs in place (B bytes each), each rank writing its own output.
          const int64_t min = kSharedReduceScatterMin.get();
          if (n < 3 || min <= 0) return std::numeric_limits<double>::infinity();
          if (!shared_buffers(topo, bytes) && B < static_cast<double>(min))
            return std::numeric_limits<double>::infinity();
          return 2.0 * alpha * (1 + 0.25 * (n - 2)) + 0.75 * (n - 1) * B / n * us_per_byte;
        }
        case Algo::kRd:  // across TCP its rounds do not overlap: 13% behind ring measured
          return L * alpha + (n - 1) * B / n * us_per_byte * (topo.all_shm() ? 1.0 : 1.1);
        case Algo::kDirect:
          return alpha + 0.25 * alpha * (n - 2) +
                 (n - 1) * B / n * us_per_byte * (topo.all_shm() ? 1.0 : 1.1);
        case Algo::kHier: {
          // Both are pipelined in chunks (allgather: chunk c's local gather, c-1's exchange
          // between leaders and c-2's hand-out run at once), so the slower level sets the
          // time: a leader moves about (k-1) B over shared memory and (h-1)/h B over its link.
          // (The allgather was modelled as the sum of the two until 4 x 2 from 64 MiB picked
          // ring at 78-81% of the link; hier ran at 79-86% there, 97-98% up to 16 MiB:
          // docs/perf-history.md "Across machines at 10 Gbit/s".)
          const int h = topo.nhosts(), k = topo.max_local();
          const double local = m.shm.alpha_us + (k - 1) * B * 1e-3 / m.shm.gbps;
          const double inter = m.tcp.alpha_us + (h - 1) * B / h * 1e-3 / m.tcp.gbps;
          return std::max(local, inter) + 2 * m.shm.alpha_us + m.tcp.alpha_us;
        }
        default:
          break;
      }
      break;
    case OpKind::kBroadcast:
    case OpKind::kReduce: {
      const double chunk = 256.0 * 1024;
      switch (algo) {
        case Algo::kTree:
          return L * alpha + B * us_per_byte + (L - 1) * std::min(B, chunk) * us_per_byte;
        case Algo::kDirect:
          return alpha + (n - 1) * B * us_per_byte;
        case Algo::kRing:
          return (n - 1) * alpha + B * us_per_byte + (n - 2) * std::min(B, chunk) * us_per_byte;
        default:
          break;
      }
      break;
    }
    default:
      return alpha + B * us_per_byte;
  }
  return std::numeric_limits<double>::infinity();
}

Algo choose_algo(OpKind op, size_t bytes, const Topology& topo, const CostModel& m,
                 Algo requested) {
  std::vector<Algo> valid = valid_algos(op, topo);
  if (requested != Algo::kAuto && std::find(valid.begin(), valid.end(), requested) != valid.end())
    return requested;
  if (m.measured)
    if (const TuningTable::Entry* e = m.measured->lookup(op, bytes, topo))
      if (std::find(valid.begin(), valid.end(), e->algo) != valid.end()) return e->algo;
  Algo best = valid.front();
  double best_t = std::numeric_limits<double>::infinity();
  for (Algo a : valid) {
    double t = predict_us(op, a, bytes, topo, m);
    if (t < best_t) {
      best_t = t;
      best = a;
    }
  }
  return best;
}

}  // namespace loom::comm
