// The optimised CPU kernels (kernels.h, products through gemm.h's oneDNN) as a Backend.
#pragma once

#include <memory>

#include "loom/kernels/backend.h"

namespace loom::kernels::cpu {

std::unique_ptr<Backend> make_backend(Precision p);

}  // namespace loom::kernels::cpu
