#pragma once
// train's --density auto and --method auto (docs/algorithms.md, "Time to accuracy"): the
// density of the run's method that a convergence profile and the
// performance model predict to reach the target soonest on the given
// network, chosen once before training.

#include <optional>
#include <string>

#include <CLI/CLI.hpp>

#include "sparsecomm/train/train_config.h"

namespace sparsecomm::cli {

struct AutoDensityFlags {
  bool requested = false;  // --density auto
  std::string convergence;
  std::optional<double> target_loss;
  std::optional<double> target_accuracy;  // percent
  std::optional<double> link_gbit;
  std::optional<double> latency_us;
  std::string network_profile;       // a cost profile from `sparsecomm calibrate`
  std::optional<double> compute_ms;  // this cluster's compute per step (default: the profile's)
};

// Adds --convergence, --target-loss, --target-accuracy, the network
// (--link-gbit and --latency-us, or --network-profile) and --compute-ms to
// train (beside the config: they choose its density).
void add_auto_density_flags(CLI::App* cmd, AutoDensityFlags& flags);

// InvalidArgument when a flag above is given without --density auto.
void check_auto_density_flags(const AutoDensityFlags& flags);

// Sets `config`'s density (and, for --method auto, its method) to the
// configuration predicted to reach the target soonest, logging the pick.
// InvalidArgument, saying what to do, for a method without a density, a
// profile of another model or batch, a missing target, a network missing or
// given twice, or a
// profile without a configuration of the run's method, rounds and options
// that reached the target on every seed.
void choose_auto_configuration(TrainConfig& config, const AutoDensityFlags& flags);

}  // namespace sparsecomm::cli
