#pragma once
// The machine constants of the performance model (docs/algorithms.md,
// "Performance model"): the alpha-beta-gamma costs of the network and the
// per-element costs of the host's passes over a gradient. A profile is
// either given (a link rate and a latency) or measured by
// `sparsecomm calibrate`, and is saved as JSON so that every prediction can
// name the profile it used.

#include <map>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

namespace sparsecomm::perf {

struct CostProfile {
  std::string name = "default";  // shown with every prediction
  std::string source;            // how the figures were obtained (command, machine, date)

  // Network: one message costs alpha + bytes * beta on each rank's link,
  // which carries beta in each direction at once (full duplex).
  double alpha_s = 0.0;              // per message (latency and per-call overhead)
  double beta_s_per_byte = 0.0;      // 1 / link rate in bytes per second
  double gamma_s_per_element = 0.0;  // adding one received float into a buffer

  // Host passes over float vectors, per element.
  double accumulate_s_per_element = 0.0;  // error feedback: a = g + e
  double update_s_per_element = 0.0;      // the optimizer step on one parameter
  // Selection, per element a rank reads, by scheme name; a scheme that is
  // not listed uses `default` (a missing `default` is 0).
  std::map<std::string, double, std::less<>> select_s_per_element;

  // Decoding a sparse result into the dense gradient: zeroing its d
  // elements, then adding each entry at its index. While the gradient fits
  // in the last-level cache (`cache_bytes`) an entry costs gamma; beyond
  // it, `scatter_s_per_element` (a cache miss per entry). Profiles written
  // before these fields existed read as 0: no fill cost and gamma always.
  double fill_s_per_element = 0.0;
  double scatter_s_per_element = 0.0;
  double cache_bytes = 0.0;  // 0: unknown, the gradient is taken to fit

  // The rest of a sparse exchange's host work, per entry. Packing: the
  // sender reads each value it sends out of the memory and subtracts it
  // (past the cache; within it, 2 gamma). Index runs: decoding one varint
  // index, and one entry through one level of the pairwise merge that
  // forms the union of n runs (ceil(log2 n) levels). Absent from older
  // profiles: 0, not modeled.
  double pack_s_per_element = 0.0;
  double index_decode_s_per_element = 0.0;
  double merge_s_per_element = 0.0;

  // The value codecs (collectives/value_codec.h), per value, by encoding name:
  // encoding at the sender (with the rounding's nonce, a hash of the
  // values) and decoding one received list. fp32 (a copy) is 0; a codec
  // not listed, as in profiles written before these fields, is 0.
  std::map<std::string, double, std::less<>> encode_s_per_value;
  std::map<std::string, double, std::less<>> decode_s_per_value;

  // PowerSGD's arithmetic on an R x C tensor at rank r (the two products
  // P = M Q and Q = M^T P, the reconstruction and the error update): R C
  // (low_rank_s_per_element + r low_rank_s_per_element_rank), passes over
  // the matrix plus products that grow with r. Absent from older profiles:
  // 0, not modeled.
  double low_rank_s_per_element = 0.0;
  double low_rank_s_per_element_rank = 0.0;

  // Framing on the rank's NIC beyond the payload, as its counters show:
  // bytes per short message (the transport's headers, the acknowledgement
  // the receiver returns) and per payload byte of a bulk transfer (a header
  // per packet, an acknowledgement per few). A message pays the larger of
  // the two. Only the predicted wire bytes use them; 0 (absent from older
  // profiles, or where calibrate could not read the counters) counts the
  // payload alone.
  double wire_bytes_per_message = 0.0;
  double wire_overhead_per_byte = 0.0;

  // The selection cost of `scheme` per element read.
  double select_cost(std::string_view scheme) const;
  // A codec's costs per value (0 where the profile has none).
  double encode_cost(std::string_view encoding) const;
  double decode_cost(std::string_view encoding) const;
  // The cost of adding one entry at a random index of a d-element gradient.
  double scatter_cost(double numel) const;
  // The cost of packing one value of a d-element memory (0 when the
  // profile has no packing cost).
  double pack_cost(double numel) const;
};

// A profile for a network given by its link rate (Gbit/s, each direction)
// and per-message latency (microseconds); host costs from the measured
// defaults of docs/algorithms.md. Throws InvalidArgument unless the rate is
// finite and > 0 and the latency finite and >= 0.
CostProfile network_profile(double link_gbit_per_s, double latency_us);

// The same network with every host cost 0 (reduction, accumulate, update,
// selection, decoding, packing, index runs), named so.
CostProfile without_host_costs(const CostProfile& profile);

// JSON in both directions. from_json checks every field (present, finite,
// >= 0; beta > 0; the host fields of the sparse exchange and the wire
// fields may be absent) and throws
// InvalidArgument naming the field; `origin` (e.g. a file name) is put in
// front of every message.
nlohmann::json to_json(const CostProfile& profile);
CostProfile profile_from_json(const nlohmann::json& json, std::string_view origin);

// Reads a profile file written by `sparsecomm calibrate` (or by hand):
// InvalidArgument naming the file when it is missing, not JSON or invalid.
CostProfile load_profile(const std::string& path);

// Writes it atomically (core/atomic_file.h).
void save_profile(const CostProfile& profile, const std::string& path);

}  // namespace sparsecomm::perf
