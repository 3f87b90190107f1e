#pragma once
// Learning-rate schedule: linear warm-up, then constant, step decay or
// cosine decay, as a pure function of the step (so a resumed run continues
// exactly).

#include <cstdint>
#include <string_view>
#include <vector>

namespace sparsecomm {

enum class LrDecay { kNone, kStep, kCosine };

// "none", "step" or "cosine"; InvalidArgument otherwise.
LrDecay parse_lr_decay(std::string_view name);
std::string_view lr_decay_name(LrDecay decay);

struct LrScheduleOptions {
  double base = 0.05;
  std::int64_t warmup_steps = 0;  // linear from base/warmup_steps up to base
  LrDecay decay = LrDecay::kNone;
  std::vector<std::int64_t> milestones;  // kStep: multiply by gamma at each
  double gamma = 0.1;
  std::int64_t total_steps = 0;  // kCosine: reaches min_factor*base at the end
  double min_factor = 0.0;
};

class LrSchedule {
 public:
  // InvalidArgument for a non-positive base, negative warm-up, gamma outside
  // (0, 1], cosine without total steps, unsorted milestones.
  explicit LrSchedule(LrScheduleOptions options);
  double at(std::int64_t step) const;
  const LrScheduleOptions& options() const { return options_; }

 private:
  LrScheduleOptions options_;
};

}  // namespace sparsecomm
