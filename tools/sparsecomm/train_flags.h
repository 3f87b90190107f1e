#pragma once
// The flags of `sparsecomm train`, each bound to its TrainConfig field or
// kept for the command (a config file, --resume, --compare, --density
// auto), and the run's settings they make.

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "auto_density.h"
#include "sparsecomm/train/train_config.h"

namespace sparsecomm::cli {

struct TrainFlags {
  TrainConfig config;
  std::string config_file;
  std::vector<std::string> method_options;
  std::string compare;
  std::string resume;
  bool no_plots = false;
  std::string lr_milestones;
  std::string density;  // a number, or "auto" (auto_density.h)
  AutoDensityFlags auto_density;
};

// Adds every flag of `train` to `cmd`, bound to `flags`.
void add_train_flags(CLI::App* cmd, TrainFlags& flags);

// The run's settings: the config file's (or a resumed run's config.json),
// then every flag the user gave over them. InvalidArgument for a bad value.
TrainConfig config_from_flags(const TrainFlags& flags, const CLI::App& cmd);

}  // namespace sparsecomm::cli
