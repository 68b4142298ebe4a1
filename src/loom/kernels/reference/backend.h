// The reference kernels (reference.h, plain loops) as a Backend: `train.backend = reference`.
#pragma once

#include <memory>

#include "loom/kernels/backend.h"

namespace loom::kernels::reference {

std::unique_ptr<Backend> make_backend(Precision p);

}  // namespace loom::kernels::reference
