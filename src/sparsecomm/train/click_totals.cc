#include "sparsecomm/train/click_totals.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <fstream>
#include <span>
#include <string>

#include <fmt/format.h>

#include "sparsecomm/comm/typed.h"

namespace sparsecomm {

void ClickTotals::add(const EmbeddingStep& e) {
  steps += 1;
  touched += static_cast<double>(e.touched_rows);
  if (table_touched.size() != e.table_touched.size()) {
    table_touched.assign(e.table_touched.size(), 0.0);
  }
  for (std::size_t f = 0; f < e.table_touched.size(); ++f) {
    table_touched[f] += static_cast<double>(e.table_touched[f]);
  }
  union_rows += static_cast<double>(e.union_rows);
  bytes_sent += static_cast<double>(e.bytes_sent);
  bytes_received += static_cast<double>(e.bytes_received);
  exchange_s += e.exchange_s;
  update_s += e.update_s;
  by_exchange[e.exchange] = by_exchange.value(e.exchange, 0) + 1;
}

nlohmann::json ClickTotals::to_json() const {
  return {{"steps", steps},
          {"touched", touched},
          {"union_rows", union_rows},
          {"bytes_sent", bytes_sent},
          {"bytes_received", bytes_received},
          {"exchange_s", exchange_s},
          {"update_s", update_s},
          {"table_touched", table_touched},
          {"by_exchange", by_exchange}};
}

void ClickTotals::from_json(const nlohmann::json& j) {
  steps = j.at("steps").get<std::int64_t>();
  touched = j.at("touched").get<double>();
  union_rows = j.at("union_rows").get<double>();
  bytes_sent = j.at("bytes_sent").get<double>();
  bytes_received = j.at("bytes_received").get<double>();
  exchange_s = j.at("exchange_s").get<double>();
  update_s = j.at("update_s").get<double>();
  table_touched = j.at("table_touched").get<std::vector<double>>();
  by_exchange = j.at("by_exchange");
}

TableFingerprint fingerprint_tables(Communicator& comm, const EmbeddingTables& tables,
                                    bool sharded) {
  TableFingerprint mine{tables.row_hash_sum(), tables.abs_sum()};
  if (!sharded) return mine;
  const auto n = static_cast<std::size_t>(comm.size());
  const std::array<std::uint64_t, 2> words{mine.hash, std::bit_cast<std::uint64_t>(mine.abs_sum)};
  std::vector<std::uint64_t> all(2 * n);
  comm.allgather(bytes_of(std::span<const std::uint64_t>(words)),
                 writable_bytes_of(std::span<std::uint64_t>(all)));
  TableFingerprint sum;
  for (std::size_t q = 0; q < n; ++q) {
    sum.hash += all[2 * q];
    sum.abs_sum += std::bit_cast<double>(all[2 * q + 1]);
  }
  return sum;
}

nlohmann::json embedding_summary(const TableLayout& tables, const TrainConfig& config, int ranks,
                                 std::size_t resident_parameters, const ClickTotals& totals,
                                 const TableFingerprint& fingerprint) {
  const double steps = static_cast<double>(std::max<std::int64_t>(1, totals.steps));
  const int n = ranks;
  const double table_bytes = static_cast<double>(tables.numel() * sizeof(float));
  std::vector<double> table_touched;
  for (const double t : totals.table_touched) table_touched.push_back(t / steps);
  return {{"tables", tables.tables()},
          {"rows", tables.rows()},
          {"width", tables.width()},
          {"parameters", tables.numel()},
          {"exchange", config.embedding_exchange},
          {"optimizer", config.embedding_optimizer},
          {"values", config.embedding_values},
          {"mean_touched_rows", totals.touched / steps},
          {"mean_table_touched_rows", table_touched},
          {"mean_union_rows", totals.union_rows / steps},
          {"mean_bytes_sent", totals.bytes_sent / steps},
          {"mean_bytes_received", totals.bytes_received / steps},
          {"dense_allreduce_bytes", 2.0 * (n - 1) / n * table_bytes},
          {"mean_exchange_s", totals.exchange_s / steps},
          {"mean_update_s", totals.update_s / steps},
          {"steps_by_exchange", totals.by_exchange},
          {"resident_parameters_per_rank", resident_parameters},
          // The final tables: a hash of their bits and the sum of |values|,
          // so that runs can be compared without storing 0.7 GB.
          {"table_hash", fmt::format("{:016x}", fingerprint.hash)},
          {"table_abs_sum", fingerprint.abs_sum}};
}

std::uint64_t peak_resident_bytes() {
  std::ifstream status("/proc/self/status");
  std::string key;
  while (status >> key) {
    if (key == "VmHWM:") {
      std::uint64_t kib = 0;
      status >> kib;
      return kib * 1024;
    }
    status.ignore(1 << 12, '\n');
  }
  return 0;
}

}  // namespace sparsecomm
