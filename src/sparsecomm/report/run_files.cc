#include "sparsecomm/report/run_files.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>

#include <fcntl.h>
#include <unistd.h>

#include <fmt/format.h>

#include "sparsecomm/core/atomic_file.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/json_numbers.h"

namespace sparsecomm::report {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr const char* kWrittenBy =
    "`sparsecomm train --out DIR` writes config.json and metrics.jsonl, and summary.json at "
    "the end of the run";

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw InvalidArgument(
        fmt::format("[report] cannot open {}: {}", path.string(), std::strerror(errno)));
  }
  std::ostringstream text;
  text << in.rdbuf();
  return std::move(text).str();
}

json parse_json_file(const fs::path& path) {
  try {
    json value = json::parse(read_file(path));
    if (!value.is_object()) {
      throw InvalidArgument(fmt::format("[report] {} is not a JSON object (it is {})",
                                        path.string(), value.type_name()));
    }
    return value;
  } catch (const json::exception& e) {
    throw InvalidArgument(
        fmt::format("[report] {} is not valid JSON: {}", path.string(), e.what()));
  }
}

// `where` names the file (and line) for error messages.
double number_field(const json& object, const char* key, const std::string& where) {
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) return kNaN;
  if (!it->is_number()) {
    throw InvalidArgument(
        fmt::format("[report] {}: \"{}\" is a {}; expected a number", where, key, it->type_name()));
  }
  return it->get<double>();
}

std::int64_t integer_field(const json& object, const char* key, const std::string& where) {
  const auto it = object.find(key);
  const auto value = it == object.end() ? std::nullopt : json_integer<std::int64_t>(*it);
  if (!value) {
    throw InvalidArgument(fmt::format("[report] {}: \"{}\" must be an integer", where, key));
  }
  return *value;
}

std::string string_field(const json& object, const char* key, const std::string& where) {
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) return {};
  if (!it->is_string()) {
    throw InvalidArgument(
        fmt::format("[report] {}: \"{}\" is a {}; expected a string", where, key, it->type_name()));
  }
  return it->get<std::string>();
}

StepRecord parse_step(const json& o, const std::string& where) {
  StepRecord r;
  r.step = integer_field(o, "step", where);
  r.epoch = number_field(o, "epoch", where);
  r.wall_s = number_field(o, "wall_s", where);
  r.lr = number_field(o, "lr", where);
  r.loss = number_field(o, "loss", where);
  r.compute_s = number_field(o, "compute_s", where);
  r.selection_s = number_field(o, "selection_s", where);
  r.exchange_s = number_field(o, "exchange_s", where);
  r.update_s = number_field(o, "update_s", where);
  r.density_ratio = number_field(o, "density_ratio", where);
  r.imbalance = number_field(o, "imbalance", where);
  r.bytes_sent = number_field(o, "bytes_sent", where);
  r.bytes_received = number_field(o, "bytes_received", where);
  r.residual_norm = number_field(o, "residual_norm", where);
  r.selected = number_field(o, "selected", where);
  r.union_size = number_field(o, "union_size", where);
  r.target = number_field(o, "target", where);
  r.numel = number_field(o, "numel", where);
  r.overlapped_s = number_field(o, "overlapped_s", where);
  if (o.contains("host_bytes_sent")) r.host_bytes_sent = number_field(o, "host_bytes_sent", where);
  if (const auto s = o.find("synchronized"); s != o.end() && s->is_boolean()) {
    r.synchronized = s->get<bool>();
  }
  if (const auto e = o.find("embedding"); e != o.end() && e->is_object()) {
    r.embedding_bytes_sent = number_field(*e, "bytes_sent", where);
    r.embedding_touched_rows = number_field(*e, "touched_rows", where);
    r.embedding_union_rows = number_field(*e, "union_rows", where);
  }
  return r;
}

EvalRecord parse_eval(const json& o, const std::string& where) {
  EvalRecord r;
  r.step = integer_field(o, "step", where);
  r.epoch = number_field(o, "epoch", where);
  r.wall_s = number_field(o, "wall_s", where);
  r.test_accuracy = number_field(o, "test_accuracy", where);
  r.test_loss = number_field(o, "test_loss", where);
  r.train_loss = number_field(o, "train_loss", where);
  r.test_auc = number_field(o, "test_auc", where);
  return r;
}

void read_metrics(const fs::path& path, RunData& run, bool keep_lines) {
  const std::string text = read_file(path);
  // Split into lines (the last may lack its '\n'), dropping blank ones.
  std::vector<std::pair<std::size_t, std::string_view>> lines;  // (1-based number, text)
  std::size_t number = 0;
  for (std::size_t start = 0; start < text.size();) {
    const std::size_t end = std::min(text.find('\n', start), text.size());
    ++number;
    std::string_view line(text.data() + start, end - start);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.find_first_not_of(" \t") != std::string_view::npos) lines.emplace_back(number, line);
    start = end + 1;
  }
  std::map<std::string, std::size_t> unknown_kinds;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const auto [line_number, line] = lines[i];
    const std::string where = fmt::format("{} line {}", path.string(), line_number);
    json object;
    try {
      object = json::parse(line);
    } catch (const json::parse_error& e) {
      if (i + 1 == lines.size()) {
        run.warnings.push_back(fmt::format(
            "{}: the last line is incomplete (the run was probably stopped while writing it); "
            "ignored",
            where));
        break;
      }
      throw InvalidArgument(fmt::format("[report] {}: not valid JSON: {}", where, e.what()));
    }
    if (!object.is_object()) {
      throw InvalidArgument(
          fmt::format("[report] {}: expected a JSON object, found {}", where, object.type_name()));
    }
    const auto kind = object.find("kind");
    if (kind == object.end() || !kind->is_string()) {
      throw InvalidArgument(
          fmt::format("[report] {}: no string \"kind\" (expected \"step\" or \"eval\")", where));
    }
    const auto& name = kind->get_ref<const std::string&>();
    if (name == "step") {
      run.steps.push_back(parse_step(object, where));
      if (keep_lines) run.step_lines.push_back(std::move(object));
    } else if (name == "eval") {
      run.evals.push_back(parse_eval(object, where));
      if (keep_lines) run.eval_lines.push_back(std::move(object));
    } else {
      ++unknown_kinds[name];
    }
  }
  for (const auto& [name, count] : unknown_kinds) {
    run.warnings.push_back(
        fmt::format("{}: {} line(s) of unknown kind \"{}\" ignored", path.string(), count, name));
  }
}

// Overwrites the fields of `summary` that summary.json has.
void apply_summary_json(const json& s, const fs::path& path, RunSummary& summary) {
  const std::string where = path.string();
  const auto number = [&](const json& object, const char* key, double& field) {
    if (object.contains(key)) field = number_field(object, key, where);
  };
  const auto text = [&](const char* key, std::string& field) {
    if (s.contains(key)) field = string_field(s, key, where);
  };
  text("method", summary.method);
  text("sync", summary.sync);
  if (summary.sync == "allreduce") summary.sync.clear();
  text("model", summary.model);
  text("backend", summary.backend);
  if (s.contains("workers")) summary.workers = static_cast<int>(integer_field(s, "workers", where));
  if (s.contains("steps")) summary.steps = integer_field(s, "steps", where);
  number(s, "epochs", summary.epochs);
  number(s, "test_accuracy", summary.test_accuracy);
  number(s, "best_test_accuracy", summary.best_test_accuracy);
  number(s, "wall_s", summary.wall_s);
  number(s, "bytes_per_rank_per_step", summary.bytes_per_rank_per_step);
  number(s, "host_bytes_per_rank_per_step", summary.host_bytes_per_rank_per_step);
  number(s, "density_ratio_mean", summary.density_ratio_mean);
  number(s, "imbalance_mean", summary.imbalance_mean);
  number(s, "samples_per_s", summary.samples_per_s);
  if (const auto it = s.find("time_breakdown_s"); it != s.end()) {
    if (!it->is_object()) {
      throw InvalidArgument(
          fmt::format("[report] {}: \"time_breakdown_s\" must be an object", where));
    }
    number(*it, "compute", summary.time_breakdown_s.compute);
    number(*it, "selection", summary.time_breakdown_s.selection);
    number(*it, "exchange", summary.time_breakdown_s.exchange);
    number(*it, "update", summary.time_breakdown_s.update);
  }
}

// Sum and mean over the finite values only.
struct Accumulator {
  double sum = 0;
  std::size_t count = 0;
  void add(double v) {
    if (std::isfinite(v)) {
      sum += v;
      ++count;
    }
  }
  double total() const { return count == 0 ? kNaN : sum; }
  double mean() const { return count == 0 ? kNaN : sum / static_cast<double>(count); }
};

std::string directory_name(const fs::path& dir) {
  fs::path normal = dir.lexically_normal();
  if (!normal.has_filename()) normal = normal.parent_path();
  std::string name = normal.filename().string();
  if (name.empty() || name == "." || name == "..") {
    std::error_code error;
    const fs::path absolute = fs::weakly_canonical(fs::absolute(dir, error), error);
    name = absolute.filename().string();
  }
  return name.empty() ? dir.string() : name;
}

}  // namespace

RunSummary derive_summary(const json& config, std::span<const StepRecord> steps,
                          std::span<const EvalRecord> evals) {
  RunSummary s;
  const auto config_string = [&](const char* key) {
    const auto it = config.find(key);
    return it != config.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  s.method = config_string("method");
  // A config field as an integer of type T, or 0 when absent or not one.
  const auto integer = [&]<typename T = std::int64_t>(const char* key, T = {}) {
    const auto v = config.find(key);
    return v == config.end() ? T{0} : json_integer<T>(*v).value_or(0);
  };
  if (integer("servers", int{}) > 0) {
    s.sync = config_string("sync").empty() ? "bsp" : config_string("sync");
    if (s.sync == "ssp") s.sync += fmt::format(":{}", integer("staleness"));
    if (s.sync == "dssp") {
      s.sync += fmt::format(":{}:{}", integer("staleness_low"), integer("staleness_high"));
    }
  }
  s.model = config_string("model");
  s.backend = config_string("backend");
  s.workers = integer("workers", int{});
  s.steps = static_cast<std::int64_t>(steps.size());
  s.epochs = kNaN;
  s.wall_s = kNaN;
  for (const StepRecord& r : steps) {
    if (std::isfinite(r.epoch))
      s.epochs = std::isnan(s.epochs) ? r.epoch : std::max(s.epochs, r.epoch);
    if (std::isfinite(r.wall_s))
      s.wall_s = std::isnan(s.wall_s) ? r.wall_s : std::max(s.wall_s, r.wall_s);
  }
  s.test_accuracy = kNaN;
  s.best_test_accuracy = kNaN;
  s.test_loss = evals.empty() ? kNaN : evals.back().test_loss;
  s.test_auc = evals.empty() ? kNaN : evals.back().test_auc;
  for (const EvalRecord& r : evals) {
    if (std::isfinite(r.epoch))
      s.epochs = std::isnan(s.epochs) ? r.epoch : std::max(s.epochs, r.epoch);
    if (std::isfinite(r.wall_s))
      s.wall_s = std::isnan(s.wall_s) ? r.wall_s : std::max(s.wall_s, r.wall_s);
    if (std::isfinite(r.test_accuracy)) {
      s.test_accuracy = r.test_accuracy;
      s.best_test_accuracy = std::isnan(s.best_test_accuracy)
                                 ? r.test_accuracy
                                 : std::max(s.best_test_accuracy, r.test_accuracy);
    }
  }
  Accumulator compute, selection, exchange, update, bytes, host_bytes, density, imbalance;
  for (const StepRecord& r : steps) {
    compute.add(r.compute_s);
    selection.add(r.selection_s);
    exchange.add(r.exchange_s);
    update.add(r.update_s);
    bytes.add(r.bytes_sent + r.embedding_bytes_sent);
    host_bytes.add(r.host_bytes_sent);
    if (r.synchronized) {
      density.add(r.density_ratio);
      imbalance.add(r.imbalance);
    }
  }
  s.time_breakdown_s = {compute.total(), selection.total(), exchange.total(), update.total()};
  s.bytes_per_rank_per_step = bytes.mean();
  s.host_bytes_per_rank_per_step = host_bytes.mean();
  s.density_ratio_mean = density.mean();
  s.imbalance_mean = imbalance.mean();
  s.samples_per_s = kNaN;
  return s;
}

RunData load_run(const fs::path& dir, const LoadOptions& options) {
  std::error_code error;
  if (!fs::exists(dir, error)) {
    throw InvalidArgument(fmt::format("[report] run directory {} does not exist", dir.string()));
  }
  if (!fs::is_directory(dir, error)) {
    throw InvalidArgument(fmt::format("[report] {} is not a directory: give the run directory ({})",
                                      dir.string(), kWrittenBy));
  }
  const fs::path config_path = dir / "config.json";
  const fs::path metrics_path = dir / "metrics.jsonl";
  const fs::path summary_path = dir / "summary.json";
  std::vector<std::string> missing;
  if (!fs::is_regular_file(config_path, error)) missing.push_back("config.json");
  if (!fs::is_regular_file(metrics_path, error)) missing.push_back("metrics.jsonl");
  if (!missing.empty()) {
    throw InvalidArgument(fmt::format("[report] {} is not a run directory: {} missing ({})",
                                      dir.string(), fmt::join(missing, " and "), kWrittenBy));
  }
  RunData run;
  run.dir = dir;
  run.config = parse_json_file(config_path);
  read_metrics(metrics_path, run, options.keep_lines);
  run.summary = derive_summary(run.config, run.steps, run.evals);
  if (fs::is_regular_file(summary_path, error)) {
    run.summary_json = parse_json_file(summary_path);
    apply_summary_json(*run.summary_json, summary_path, run.summary);
  } else if (const fs::path failure_path = dir / "failure.json";
             fs::is_regular_file(failure_path, error)) {
    const json failure = parse_json_file(failure_path);
    run.summary_derived = true;
    run.failure = failure.value("error", std::string("(no error recorded)"));
    run.warnings.push_back(fmt::format("{}: the run failed after {} steps: {}", dir.string(),
                                       failure.value("steps_completed", std::int64_t{0}),
                                       *run.failure));
  } else {
    run.summary_derived = true;
    run.warnings.push_back(fmt::format(
        "{}: no summary.json (the run was interrupted or is still running): figures derived "
        "from metrics.jsonl ({} step and {} eval records)",
        dir.string(), run.steps.size(), run.evals.size()));
  }
  return run;
}

namespace {

json summary_json_of(const RunSummary& s) {
  const TimeBreakdown& t = s.time_breakdown_s;
  json out = {{"method", s.method},
              {"model", s.model},
              {"backend", s.backend},
              {"sync", s.sync},
              {"workers", s.workers},
              {"epochs", json_number(s.epochs)},
              {"steps", s.steps},
              {"test_accuracy", json_number(s.test_accuracy)},
              {"test_loss", json_number(s.test_loss)},
              {"test_auc", json_number(s.test_auc)},
              {"best_test_accuracy", json_number(s.best_test_accuracy)},
              {"wall_s", json_number(s.wall_s)},
              {"time_breakdown_s",
               {{"compute", json_number(t.compute)},
                {"selection", json_number(t.selection)},
                {"exchange", json_number(t.exchange)},
                {"update", json_number(t.update)}}},
              {"bytes_per_rank_per_step", json_number(s.bytes_per_rank_per_step)},
              {"density_ratio_mean", json_number(s.density_ratio_mean)},
              {"imbalance_mean", json_number(s.imbalance_mean)},
              {"samples_per_s", json_number(s.samples_per_s)}};
  if (s.host_bytes_per_rank_per_step > 0) {
    out["host_bytes_per_rank_per_step"] = json_number(s.host_bytes_per_rank_per_step);
  }
  return out;
}

}  // namespace

json run_json(const fs::path& dir) {
  const RunData run = load_run(dir, {.keep_lines = true});
  return {{"dir", run.dir.string()},
          {"config", run.config},
          {"summary", run.summary_json ? *run.summary_json : summary_json_of(run.summary)},
          {"summary_derived", run.summary_derived},
          {"failure", run.failure ? json(*run.failure) : json(nullptr)},
          {"warnings", run.warnings},
          {"steps", run.step_lines},
          {"evals", run.eval_lines}};
}

std::string run_name(const RunSummary& summary) {
  return summary.sync.empty() ? summary.method : summary.method + "@" + summary.sync;
}

std::vector<std::string> run_labels(std::span<const RunData> runs) {
  std::map<std::string, int> name_count;
  for (const RunData& run : runs) ++name_count[run_name(run.summary)];
  std::vector<std::string> labels;
  for (const RunData& run : runs) {
    const std::string name = run_name(run.summary);
    labels.push_back(run.summary.method.empty() || name_count[name] > 1 ? directory_name(run.dir)
                                                                        : name);
  }
  std::map<std::string, int> label_count, seen;
  for (const std::string& label : labels) ++label_count[label];
  for (std::size_t i = 0; i < labels.size(); ++i) {
    if (label_count[labels[i]] > 1) labels[i] += fmt::format(" #{}", ++seen[labels[i]]);
  }
  return labels;
}

void write_json_atomically(const fs::path& path, const json& value) {
  atomic_write(path, value.dump(2) + "\n");
}

void append_line(const fs::path& path, std::string_view line) {
  if (line.find('\n') != std::string_view::npos) {
    throw InvalidArgument(
        fmt::format("[report] append_line to {}: the line contains '\\n'", path.string()));
  }
  std::string data(line);
  data += '\n';
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    throw Error(fmt::format("[report] cannot open {}: {}", path.string(), std::strerror(errno)));
  }
  std::size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int saved = errno;
      ::close(fd);
      throw Error(fmt::format("[report] cannot write {}: {}", path.string(), std::strerror(saved)));
    }
    done += static_cast<std::size_t>(n);
  }
  if (::close(fd) != 0) {
    throw Error(fmt::format("[report] cannot write {}: {}", path.string(), std::strerror(errno)));
  }
}

}  // namespace sparsecomm::report
