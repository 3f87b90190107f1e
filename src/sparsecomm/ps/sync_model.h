#pragma once
// Synchronization models of the parameter server (docs/algorithms.md,
// "Synchronization models") and DSSP's grant rule, as pure
// functions. c_p is worker p's clock: the number of steps it has pushed.
//
//   bsp          every worker waits at a barrier each step (SSP with s = 0,
//                plus one summed optimizer step per step on the servers)
//   asp          nobody waits; pushes are applied on arrival
//   ssp:S        p may begin a step only if c_p - min_q c_q <= S
//   dssp:L:U     SSP(L), but a worker at the bound may be granted
//                r in [0, U - L] extra steps (dssp_grant), so it never runs
//                more than U ahead

#include <cstdint>
#include <string>
#include <string_view>

namespace sparsecomm {

enum class SyncModelKind { kBsp, kAsp, kSsp, kDssp };

struct SyncModel {
  SyncModelKind kind = SyncModelKind::kBsp;
  std::int64_t staleness = 0;        // SSP: s; DSSP: s_L; BSP and ASP: 0
  std::int64_t staleness_upper = 0;  // DSSP: s_U; otherwise equal to staleness

  // The validated constructors: InvalidArgument for s < 0, s_L < 0 or
  // s_U < s_L.
  static SyncModel bsp() { return {}; }
  static SyncModel asp() { return {SyncModelKind::kAsp, 0, 0}; }
  static SyncModel ssp(std::int64_t staleness);
  static SyncModel dssp(std::int64_t lower, std::int64_t upper);

  // "bsp", "asp", "ssp:3", "dssp:1:4" (what parse_sync_model reads back).
  std::string name() const;
  // Whether workers ask the controller before each step (all but ASP).
  bool gated() const { return kind != SyncModelKind::kAsp; }
};

// By name with separate bounds (for a CLI with --staleness flags): "bsp" and
// "asp" take no bounds (they must be 0), "ssp" takes `staleness`, "dssp"
// takes `staleness` (s_L) and `staleness_upper` (s_U).
SyncModel make_sync_model(std::string_view name, std::int64_t staleness = 0,
                          std::int64_t staleness_upper = 0);
// "bsp" | "asp" | "ssp:S" | "dssp:L:U"; InvalidArgument naming what is wrong.
SyncModel parse_sync_model(std::string_view spec);
// "bsp, asp, ssp:S, dssp:L:U" for messages.
std::string sync_model_names();

// DSSP's choice of extra steps for a worker that reached the bound s_L.
// From the requesting (fast) worker's last push time and last push interval
// and the slowest worker's, predict the fast worker's next pushes
// F_i = fast_last + i * fast_interval (i = 0 .. r_max) and the slowest's
// S_j = slow_last + j * slow_interval (j = 1 .. r_max); return the r whose
// F_r lies closest to any S_j (ties: the smaller r), so the fast worker
// waits as little as possible. r_max = s_U - s_L; 0 when r_max is 0.
// InvalidArgument for r_max < 0 or a negative or non-finite interval.
std::int64_t dssp_grant(double fast_last, double fast_interval, double slow_last,
                        double slow_interval, std::int64_t r_max);

}  // namespace sparsecomm
