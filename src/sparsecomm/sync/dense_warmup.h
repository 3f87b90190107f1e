#pragma once
// A method preceded by dense steps: steps 0 .. steps-1 are all-reduced
// densely (the dense method), the later ones go through `inner`. With
// AdamW's frozen variance (--freeze-variance-after N, optim/adamw.h) the
// dense steps are the ones in which the second moment is estimated, as
// in 1-bit Adam; their bytes are counted in the metrics like any step's.

#include <cstdint>
#include <memory>

#include "sparsecomm/sync/gradient_sync.h"

namespace sparsecomm {

// `inner` itself when steps is 0 or inner is dense.
std::unique_ptr<GradientSync> with_dense_warmup(std::unique_ptr<GradientSync> inner,
                                                std::int64_t steps, NonFinitePolicy nonfinite);

}  // namespace sparsecomm
