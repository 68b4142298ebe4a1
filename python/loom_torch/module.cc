// `import loom_torch` registers the "loom" backend with torch.distributed:
//   import loom_torch, torch.distributed as dist
//   dist.init_process_group(backend="loom", init_method=..., rank=..., world_size=...)
#include <pybind11/chrono.h>
#include <torch/python.h>

#include "process_group.h"

PYBIND11_MODULE(loom_torch, m) {
  m.doc() = "loom's collectives as a torch.distributed backend named 'loom'";
  m.def("create_process_group", &loom_torch::ProcessGroupLoom::create,
        "the creator torch.distributed calls: (store, rank, size, timeout)");
  m.attr("torch_version") = TORCH_VERSION;
  py::object backend = py::module::import("torch.distributed").attr("Backend");
#if TORCH_VERSION_MAJOR >= 2
  backend.attr("register_backend")("loom", m.attr("create_process_group"), false,
                                   py::make_tuple("cpu"));
#else
  backend.attr("register_backend")("loom", m.attr("create_process_group"));
#endif
}
