// `import loom_torch` registers the "loom" backend with torch.distributed:
//   import loom_torch, torch.distributed as dist
//   dist.init_process_group(backend="loom", init_method=..., rank=..., world_size=...)
// loom_torch.use_shared_memory() (or LOOM_TORCH_SHARED_MEMORY=1 at import) puts the storage
// of CPU tensors allocated afterwards in loom's shared memory (shared_allocator.h).
#include <pybind11/chrono.h>
#include <torch/python.h>

#include "loom/comm/algorithms/algorithms.h"
#include "loom/core/error.h"
#include "loom/core/tunable.h"
#include "process_group.h"
#include "shared_allocator.h"

namespace {

const loom::IntTunable kSharedMemory(
    "LOOM_TORCH_SHARED_MEMORY", 0,
    "1: at `import loom_torch`, CPU tensors' storage of LOOM_TORCH_SHARED_MIN bytes or more "
    "comes from loom's shared memory (loom_torch.use_shared_memory)");
const loom::BytesTunable kSharedMin("LOOM_TORCH_SHARED_MIN", 64 << 10,
                                    "smallest tensor storage (bytes) put in shared memory");
const loom::BytesTunable kSharedCache("LOOM_TORCH_SHARED_CACHE", int64_t{1} << 30,
                                      "freed shared storage (bytes) kept for reuse");

}  // namespace

PYBIND11_MODULE(loom_torch, m) {
  m.doc() = "loom's collectives as a torch.distributed backend named 'loom'";
  int64_t shared_on = 0, shared_min = 0, shared_cache = 0;
  try {
    shared_on = kSharedMemory.get(), shared_min = kSharedMin.get();
    shared_cache = kSharedCache.get();
  } catch (const loom::UserError& e) {  // a malformed LOOM_TORCH_SHARED_* value
    throw py::value_error(std::string(e.what()) + " (hint: " + e.hint() + ")");
  }
  if (shared_min < 0 || shared_cache < 0)
    throw py::value_error("LOOM_TORCH_SHARED_MIN and LOOM_TORCH_SHARED_CACHE must be >= 0");
  m.def("create_process_group", &loom_torch::ProcessGroupLoom::create,
        "the creator torch.distributed calls: (store, rank, size, timeout)");
  m.def(
      "use_shared_memory",
      [](bool enable, int64_t min_bytes, int64_t cache_bytes) {
        if (min_bytes < 0 || cache_bytes < 0)
          throw py::value_error(
              "loom_torch.use_shared_memory: min_bytes and cache_bytes "
              "must be >= 0");
        loom_torch::use_shared_memory(enable, static_cast<size_t>(min_bytes),
                                      static_cast<size_t>(cache_bytes));
      },
      py::arg("enable") = true, py::arg("min_bytes") = shared_min,
      py::arg("cache_bytes") = shared_cache,
      "CPU tensors allocated from now on with at least min_bytes of storage live in loom's "
      "shared memory, where the machine's other ranks read and write them directly (the "
      "single-copy and fused collectives); freed storage up to cache_bytes is reused. "
      "Shared pages stay shared with a fork()ed child.");
  m.def(
      "shared_memory_stats",
      [] {
        const loom_torch::SharedMemoryStats s = loom_torch::shared_memory_stats();
        py::dict d;
        d["enabled"] = s.enabled;
        d["live_bytes"] = s.live_bytes;
        d["cached_bytes"] = s.cached_bytes;
        d["made"] = s.made;
        d["reused"] = s.reused;
        d["released"] = s.released;
        return d;
      },
      "the shared-memory allocator's counters");
  m.def(
      "is_shared",
      [](const at::Tensor& t) {
        return t.device().is_cpu() && t.nbytes() > 0 &&
               loom_torch::in_shared_memory(t.data_ptr(), t.nbytes());
      },
      py::arg("tensor"), "whether the tensor's data lies in loom's shared memory");
  m.def("fused_allreduces", &loom::comm::algo::shared_allreduces_fused,
        "allreduces this process has run as the fused shared algorithm");
  m.attr("torch_version") = TORCH_VERSION;
  py::object backend = py::module::import("torch.distributed").attr("Backend");
#if TORCH_VERSION_MAJOR >= 2
  backend.attr("register_backend")("loom", m.attr("create_process_group"), false,
                                   py::make_tuple("cpu"));
#else
  backend.attr("register_backend")("loom", m.attr("create_process_group"));
#endif
  if (shared_on != 0)
    loom_torch::use_shared_memory(true, static_cast<size_t>(shared_min),
                                  static_cast<size_t>(shared_cache));
}
