#pragma once
// What a person sees of a run on rank 0: a progress bar with ETA on a
// terminal (plain lines otherwise), one line per evaluation, the summary at
// the end.

#include <memory>
#include <string>

#include "sparsecomm/train/trainer.h"

namespace sparsecomm::cli {

// The observer `train` and `train --compare` hand the trainer; `label`
// starts its lines (the method, or a compared run's label).
std::unique_ptr<TrainObserver> make_console_reporter(std::string label);

}  // namespace sparsecomm::cli
