#include "loom/kernels/backend.h"

#include "loom/core/error.h"
#include "loom/kernels/cpu/backend.h"
#include "loom/kernels/reference/backend.h"

namespace loom::kernels {

const char* backend_names() {
  return "cpu, reference";
}

std::unique_ptr<Backend> make_backend(const std::string& name, Precision p) {
  if (name == "cpu") return cpu::make_backend(p);
  if (name == "reference") return reference::make_backend(p);
  throw UserError("unknown kernel backend '" + name + "'",
                  std::string("train.backend is one of: ") + backend_names());
}

}  // namespace loom::kernels
