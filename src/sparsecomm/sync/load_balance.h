#pragma once
// Load imbalance of a sparse step and its counting floor.
//
// imbalance = n * max_r |I_r| / sum_r |I_r| - 1 (0 when nothing is
// selected): how much longer the busiest rank's share is than the average.
//
// Selections are counts of rare events, so even a perfect balancer that
// gives every rank the same expected share sees an imbalance: K elements
// assigned to n ranks uniformly at random give about
// z_n * sqrt((1 - 1/n) / (K/n)), z_n the expected maximum of n standard
// normals (z_4 ~ 1.03, z_16 ~ 1.77, z_64 ~ 2.41). imbalance_floor()
// simulates that assignment exactly, so a measured imbalance can be read
// against what no balancer can beat.

#include <cstddef>
#include <cstdint>
#include <span>

namespace sparsecomm {

double imbalance_of(std::span<const std::size_t> counts);

// The expected imbalance of `total` elements dropped uniformly at random on
// `ranks` ranks (multinomial), the mean over `trials` simulated steps with a
// fixed seed: deterministic. 0 when ranks <= 1 or total == 0.
double imbalance_floor(int ranks, std::int64_t total, int trials = 4000);

}  // namespace sparsecomm
