#include "sparsecomm/train/train_config.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/rng.h"
#include "sparsecomm/data/fashion_mnist.h"
#include "sparsecomm/data/text_corpus.h"
#include "sparsecomm/optim/lr_schedule.h"
#include "sparsecomm/optim/optimizer.h"
#include "sparsecomm/ps/sync_model.h"
#include "sparsecomm/sync/gradient_sync.h"

namespace sparsecomm {

NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(
    TrainConfig, backend, workers, threads, timeout_s, model, dataset, data_dir, train_samples,
    test_samples, embedding_cap, embedding_dim, embedding_exchange, embedding_optimizer,
    embedding_values, embedding_lr, method, density, method_options, nonfinite, bucket_mb,
    min_numel, exclude, ranks_per_host, local_steps, outer_lr, outer_momentum, outer_nesterov,
    outer_overlap, servers, sync, staleness, staleness_low, staleness_high, slowdown, optimizer,
    beta1, beta2, adam_eps, compress, freeze_variance_after, epochs, max_steps, batch, lr, momentum,
    nesterov, weight_decay, warmup_epochs, lr_decay, lr_milestones, lr_gamma, seed, deterministic,
    eval_every, eval_deferred, out, checkpoint_every, stop_at_step, record_gradients, record_steps,
    timeline, plots)

const std::vector<std::string>& model_names() {
  static const std::vector<std::string> names = {"mlp",
                                                 "cnn",
                                                 "resnet18",
                                                 "wide-mlp",
                                                 "char-lstm",
                                                 "char-transformer",
                                                 "char-transformer-w64",
                                                 "char-transformer-w256",
                                                 "dlrm"};
  return names;
}

const std::vector<std::string>& dataset_names() {
  static const std::vector<std::string> names = {"fashion-mnist", "synthetic", "fortunes",
                                                 "click-log"};
  return names;
}

bool is_char_transformer(std::string_view model) { return model.starts_with("char-transformer"); }

InputKind model_input(const std::string& model) {
  if (model == "char-lstm" || is_char_transformer(model)) return InputKind::kText;
  if (model == "dlrm") return InputKind::kClicks;
  return InputKind::kImages;
}

InputKind dataset_input(const std::string& dataset) {
  if (dataset == "fortunes") return InputKind::kText;
  if (dataset == "click-log") return InputKind::kClicks;
  return InputKind::kImages;
}

std::int64_t dataset_classes(const std::string& dataset) {
  return dataset_is_text(dataset) ? static_cast<std::int64_t>(kTextVocabularySize) : 10;
}

std::string data_dir_of(const TrainConfig& config) {
  if (!config.data_dir.empty()) return config.data_dir;
  if (config.dataset == "fashion-mnist") return kFashionMnistDirectory;
  if (config.dataset == "fortunes") return kFortunesDirectory;
  return "";
}

nlohmann::json model_defaults(const std::string& model) {
  if (model == "dlrm") return {{"dataset", "click-log"}};
  if (is_char_transformer(model)) {
    return {{"dataset", "fortunes"},
            {"optimizer", "adamw"},
            {"lr", 3e-3},
            {"weight_decay", 0.1},
            {"beta2", 0.99}};
  }
  return nlohmann::json::object();
}

namespace {

void require(bool ok, std::string_view field, const std::string& problem) {
  if (!ok) throw InvalidArgument(fmt::format("--{}: {}", field, problem));
}

bool one_of(const std::string& value, const std::vector<std::string>& allowed) {
  return std::find(allowed.begin(), allowed.end(), value) != allowed.end();
}

// The world, the model and its dataset.
void validate_world_and_data(const TrainConfig& c) {
  require(one_of(c.backend, {"auto", "thread", "mpi"}), "backend",
          fmt::format("'{}' is not a backend; valid: auto, thread, mpi", c.backend));
  require(c.workers >= 0 && c.workers <= 1024, "workers",
          fmt::format("{} workers: give 1..1024 (0 only under mpirun: the job's size)", c.workers));
  require(c.threads >= 0 && c.threads <= 256, "threads",
          fmt::format("{} threads per rank: give 0 (auto) .. 256", c.threads));
  require(c.timeout_s >= 0.0 && std::isfinite(c.timeout_s), "timeout",
          fmt::format("timeout {} s must be >= 0 (0: the default)", c.timeout_s));
  require(one_of(c.model, model_names()), "model",
          fmt::format("'{}' is not a model; valid: {}", c.model, fmt::join(model_names(), ", ")));
  require(
      one_of(c.dataset, dataset_names()), "dataset",
      fmt::format("'{}' is not a dataset; valid: {}", c.dataset, fmt::join(dataset_names(), ", ")));
  {
    const InputKind reads = model_input(c.model);
    const std::string_view needs = reads == InputKind::kText     ? "fortunes"
                                   : reads == InputKind::kClicks ? "click-log"
                                                                 : "fashion-mnist or synthetic";
    const std::string_view kind = reads == InputKind::kText     ? "text"
                                  : reads == InputKind::kClicks ? "click rows"
                                                                : "images";
    require(reads == dataset_input(c.dataset), "model",
            fmt::format("model {} reads {}: it needs --dataset {}, not {} (char-lstm and "
                        "char-transformer train on fortunes, dlrm on click-log)",
                        c.model, kind, needs, c.dataset));
  }
}

// The click model's own settings, and what it does not support yet.
void validate_click_model(const TrainConfig& c) {
  require(c.embedding_cap >= 1 && c.embedding_cap <= (std::int64_t{1} << 31), "embedding-cap",
          fmt::format("{} rows per table: give 1 .. 2^31", c.embedding_cap));
  require(c.embedding_dim >= 1 && c.embedding_dim <= 1024, "embedding-dim",
          fmt::format("{} floats per row: give 1 .. 1024", c.embedding_dim));
  require(
      one_of(c.embedding_exchange, {"auto", "allgather", "sparse-allreduce", "sharded", "dense"}),
      "embedding-exchange",
      fmt::format("'{}': valid are auto, allgather, sparse-allreduce, sharded, dense",
                  c.embedding_exchange));
  require(one_of(c.embedding_optimizer, {"adagrad", "sgd"}), "embedding-optimizer",
          fmt::format("'{}': valid are adagrad, sgd", c.embedding_optimizer));
  require(one_of(c.embedding_values, {"fp32", "bf16", "fp16"}), "embedding-values",
          fmt::format("'{}': valid are fp32, bf16, fp16", c.embedding_values));
  require(c.embedding_values == "fp32" || c.embedding_exchange != "dense", "embedding-values",
          fmt::format("--embedding-values {}: the dense comparison all-reduces fp32; use it "
                      "with allgather, sparse-allreduce, sharded or auto",
                      c.embedding_values));
  require(c.embedding_lr > 0.0 && std::isfinite(c.embedding_lr), "embedding-lr",
          fmt::format("{} must be > 0", c.embedding_lr));
  const std::string_view not_yet = "is not available for the click model (dlrm) yet";
  require(!ps_mode(c), "servers", fmt::format("parameter-server mode {}; drop --servers", not_yet));
  require(c.record_gradients.empty(), "record-gradients",
          fmt::format("gradient traces {}", not_yet));
  require(!c.eval_deferred, "eval-deferred", fmt::format("--eval-deferred {}", not_yet));
}

// The synchronization method and what goes with it.
void validate_method(const TrainConfig& c) {
  require(c.train_samples >= 0, "train-samples", "must be >= 0 (0: all)");
  require(c.test_samples >= 0, "test-samples", "must be >= 0 (0: all)");
  require(find_sync_method(c.method) != nullptr, "method",
          fmt::format("'{}' is not a synchronization method; valid: {}", c.method,
                      sync_method_names()));
  require(c.density > 0.0 && c.density <= 1.0, "density",
          fmt::format("{} must lie in (0, 1] (e.g. 0.01 for 1%)", c.density));
  require(one_of(c.nonfinite, {"stop", "skip"}), "nonfinite",
          fmt::format("'{}': valid are stop, skip", c.nonfinite));
  require(c.bucket_mb >= 0.0 && std::isfinite(c.bucket_mb), "bucket-mb",
          fmt::format("{} MiB: give 0 (no pipelining) or a positive bucket size", c.bucket_mb));
  require(c.min_numel >= 0, "min-numel",
          fmt::format("{}: give 0 (sparsify every tensor) or the size below which tensors are "
                      "averaged densely, e.g. 1024",
                      c.min_numel));
  require(c.ranks_per_host >= 0 && c.ranks_per_host <= 1024, "ranks-per-host",
          fmt::format("{}: give the ranks each host runs, 1..1024 (1: one rank per host), or "
                      "auto (from the ranks' host names)",
                      c.ranks_per_host));
  require(c.workers == 0 || c.ranks_per_host == 0 || c.workers % c.ranks_per_host == 0,
          "ranks-per-host",
          fmt::format("{} ranks per host do not divide the {} ranks into hosts; give a divisor "
                      "of {}",
                      c.ranks_per_host, c.workers, c.workers));
  if (c.ranks_per_host != 1) {
    require(c.servers == 0, "ranks-per-host",
            "two-level exchanges are for all-reduce mode; drop --servers or --ranks-per-host");
    require(c.model != "dlrm", "ranks-per-host",
            "the click model's tables are exchanged on one level; drop --ranks-per-host");
    require(!c.outer_overlap, "ranks-per-host",
            "--outer-overlap synchronizes on a thread of its own, which two-level exchanges do "
            "not take yet; drop one of them");
  }
  require(c.timeline.empty() || c.servers == 0, "timeline",
          "the timeline does not record parameter-server mode yet (its servers run no step "
          "loop); drop --timeline or --servers");
  require(
      c.servers >= 0 && c.servers <= (1 << 24), "servers",
      fmt::format("{} servers: give 0 (all-reduce) or >= 1 (parameter-server mode)", c.servers));
}

// --local-steps and its outer step: all-reduce training of a LibTorch model,
// the gradient compressed (the round's pseudo-gradient is what the method sends).
void validate_local_steps(const TrainConfig& c) {
  require(c.local_steps >= 0 && c.local_steps <= (1 << 20), "local-steps",
          fmt::format("{}: give 0 (synchronize every step) or the steps per round, e.g. 32",
                      c.local_steps));
  if (c.local_steps == 0) {
    const TrainConfig defaults;
    require(c.outer_lr == defaults.outer_lr && c.outer_momentum == defaults.outer_momentum &&
                c.outer_nesterov == defaults.outer_nesterov &&
                c.outer_overlap == defaults.outer_overlap,
            "outer-lr",
            "--outer-lr, --outer-momentum, --outer-nesterov and --outer-overlap set the outer "
            "step of --local-steps H: add it, or drop them");
    return;
  }
  require(c.outer_lr > 0.0 && std::isfinite(c.outer_lr), "outer-lr",
          fmt::format("{} must be > 0 (1: the plain average; DiLoCo uses 0.7)", c.outer_lr));
  require(c.outer_momentum >= 0.0 && c.outer_momentum < 1.0, "outer-momentum",
          fmt::format("{} must lie in [0, 1)", c.outer_momentum));
  require(!c.outer_nesterov || c.outer_momentum > 0.0, "outer-nesterov",
          "Nesterov needs --outer-momentum > 0 (or --outer-nesterov false)");
  const std::string_view without =
      ps_mode(c)                    ? "parameter-server mode (its workers push every step)"
      : model_reads_clicks(c.model) ? "the click model (its tables synchronize rows per step)"
      : c.compress != "gradient"    ? "--compress update (the round sends its pseudo-gradient)"
      : c.freeze_variance_after > 0 ? "--freeze-variance-after (its dense steps synchronize)"
      : c.bucket_mb > 0.0           ? "--bucket-mb (the pseudo-gradient exists only after the "
                                      "round's last step, so nothing overlaps backward)"
      : !c.record_gradients.empty() ? "--record-gradients (inner steps synchronize nothing)"
                                    : "";
  require(without.empty(), "local-steps",
          fmt::format("local steps do not combine with {}", without));
}

// Parameter-server settings: only with --servers, and what that mode lacks.
void validate_servers(const TrainConfig& c) {
  if (!ps_mode(c)) {
    require(c.sync.empty(), "sync",
            fmt::format("'{}' needs parameter servers: add --servers S (S >= 1)", c.sync));
    require(c.staleness == 0 && c.staleness_low == 0 && c.staleness_high == 0, "staleness",
            "staleness bounds need parameter servers: add --servers S and --sync ssp|dssp");
  } else {
    const std::string sync = c.sync.empty() ? "bsp" : c.sync;
    require(one_of(sync, {"bsp", "asp", "ssp", "dssp"}), "sync",
            fmt::format("'{}' is not a synchronization model; valid: bsp, asp, ssp, dssp", sync));
    require(c.staleness >= 0, "staleness",
            fmt::format("{}: the staleness bound must be >= 0", c.staleness));
    require(c.staleness_low >= 0, "staleness-low",
            fmt::format("{}: the staleness bound must be >= 0", c.staleness_low));
    require(c.staleness_high >= 0, "staleness-high",
            fmt::format("{}: the staleness bound must be >= 0", c.staleness_high));
    require(sync == "ssp" || c.staleness == 0, "staleness",
            fmt::format("--staleness is SSP's bound; --sync {} takes none{}", sync,
                        sync == "dssp" ? " (use --staleness-low and --staleness-high)" : ""));
    require(sync == "dssp" || (c.staleness_low == 0 && c.staleness_high == 0), "staleness-low",
            fmt::format("--staleness-low/--staleness-high are DSSP's bounds; --sync {} takes none",
                        sync));
    require(c.staleness_high >= c.staleness_low, "staleness-high",
            fmt::format("s_U = {} is below s_L = {}: DSSP needs s_L <= s_U", c.staleness_high,
                        c.staleness_low));
    // Which push methods each sync model allows: validate_ps_options (ps/).
    require(c.nonfinite == "stop", "nonfinite",
            "parameter-server mode stops on NaN/inf gradients; drop --nonfinite skip");
    require(c.bucket_mb == 0.0, "bucket-mb",
            "pipelining is not available in parameter-server mode; drop --bucket-mb");
    require(c.min_numel == 0 && c.exclude.empty(), "min-numel",
            "dense tensors beside a sparse method (--min-numel, --exclude) are for all-reduce "
            "mode; parameter-server pushes sparsify the whole gradient");
    require(c.record_gradients.empty(), "record-gradients",
            "gradient traces are not supported in parameter-server mode");
    require(!c.deterministic, "deterministic",
            "--deterministic is for all-reduce mode; BSP with dense pushes is already "
            "order-independent on the servers");
  }
}

// The schedule's length, the batch and the optimizer.
void validate_optimizer(const TrainConfig& c) {
  require(c.epochs >= 1, "epochs", fmt::format("{} epochs: give at least 1", c.epochs));
  require(c.max_steps >= 0, "max-steps", "must be >= 0 (0: epochs * steps per epoch)");
  require(c.batch >= 1 && c.batch <= 65536, "batch",
          fmt::format("batch {} must be 1..65536", c.batch));
  require(c.lr > 0.0 && std::isfinite(c.lr), "lr",
          fmt::format("learning rate {} must be > 0", c.lr));
  require(one_of(c.optimizer, optimizer_names()), "optimizer",
          fmt::format("'{}' is not an optimizer; valid: {}", c.optimizer,
                      fmt::join(optimizer_names(), ", ")));
  require(c.beta1 >= 0.0 && c.beta1 < 1.0, "beta1", fmt::format("{} must lie in [0, 1)", c.beta1));
  require(c.beta2 >= 0.0 && c.beta2 < 1.0, "beta2", fmt::format("{} must lie in [0, 1)", c.beta2));
  require(c.adam_eps > 0.0 && std::isfinite(c.adam_eps), "adam-eps",
          fmt::format("{} must be > 0", c.adam_eps));
  require(one_of(c.compress, {"gradient", "update"}), "compress",
          fmt::format("'{}': valid are gradient, update", c.compress));
  require(c.compress == "gradient" || c.optimizer == "adamw", "compress",
          fmt::format("--compress update synchronizes AdamW's local direction: it needs "
                      "--optimizer adamw (with {} compress the gradient)",
                      c.optimizer));
  require(c.optimizer != "muon" || !ps_mode(c), "optimizer",
          "Muon orthogonalizes whole matrices, and a parameter server's shards split them: "
          "use --optimizer adamw or sgd with --servers");
  require(c.freeze_variance_after >= 0, "freeze-variance-after",
          fmt::format("{}: give 0 (off) or the number of dense steps before AdamW's second "
                      "moment freezes",
                      c.freeze_variance_after));
  require(c.freeze_variance_after == 0 || c.optimizer == "adamw", "freeze-variance-after",
          "a frozen variance is AdamW's: add --optimizer adamw");
  require(c.freeze_variance_after == 0 || c.compress == "gradient", "freeze-variance-after",
          "--freeze-variance-after compresses the gradient under a frozen variance; "
          "--compress update keeps the moments local: choose one");
  require(c.compress == "gradient" || c.bucket_mb == 0.0, "compress",
          "--compress update computes each rank's AdamW direction after backward, so buckets "
          "cannot be synchronized while backward runs: drop --bucket-mb");
  if (ps_mode(c) || model_reads_clicks(c.model)) {
    const std::string_view where = ps_mode(c) ? "parameter-server mode" : "the click model (dlrm)";
    require(c.compress == "gradient", "compress",
            fmt::format("--compress update is for all-reduce training, not {}", where));
    require(c.freeze_variance_after == 0, "freeze-variance-after",
            fmt::format("--freeze-variance-after is for all-reduce training, not {}", where));
  }
  require(c.momentum >= 0.0 && c.momentum < 1.0, "momentum",
          fmt::format("{} must lie in [0, 1)", c.momentum));
  require(!c.nesterov || c.momentum > 0.0, "nesterov", "Nesterov needs --momentum > 0");
  require(c.weight_decay >= 0.0, "weight-decay", "must be >= 0");
}

}  // namespace

void validate(const TrainConfig& c) {
  validate_world_and_data(c);
  if (model_reads_clicks(c.model)) validate_click_model(c);
  validate_method(c);
  validate_servers(c);
  parse_slowdowns(c);
  validate_optimizer(c);
  validate_local_steps(c);
  require(c.warmup_epochs >= 0.0, "warmup-epochs", "must be >= 0");
  parse_lr_decay(c.lr_decay);
  require(std::is_sorted(c.lr_milestones.begin(), c.lr_milestones.end()), "lr-milestones",
          "give the epochs in increasing order");
  require(c.lr_gamma > 0.0 && c.lr_gamma <= 1.0, "lr-gamma", "must lie in (0, 1]");
  require(c.eval_every >= 0, "eval-every", "must be >= 0 (0: at each epoch's end)");
  require(c.checkpoint_every >= 0, "checkpoint-every", "must be >= 0 (0: off)");
  require(c.stop_at_step >= 0, "stop-at-step", "must be >= 0 (0: run to the end)");
  require(c.record_steps >= 1, "record-steps", "must be >= 1");
}

std::string sync_model_name(const TrainConfig& c) {
  const std::string sync = c.sync.empty() ? "bsp" : c.sync;
  if (sync == "ssp") return make_sync_model(sync, c.staleness).name();
  if (sync == "dssp") return make_sync_model(sync, c.staleness_low, c.staleness_high).name();
  return make_sync_model(sync).name();
}

double Slowdowns::factor(int worker, int workers, std::int64_t step) const {
  double f = 1.0;
  if (const auto it = fixed.find(worker); it != fixed.end()) f = it->second;
  if (roaming > 1.0 && workers > 0) {
    // A counter-based draw: every rank computes the same one for (seed, step).
    constexpr std::uint64_t kSlowdownSalt = 0x736c6f77646f776eull;  // "slowdown"
    const std::uint64_t drawn =
        Philox(seed ^ kSlowdownSalt)
            .below(static_cast<std::uint64_t>(workers), static_cast<std::uint64_t>(step), 0);
    if (drawn == static_cast<std::uint64_t>(worker)) f *= roaming;
  }
  return f;
}

Slowdowns parse_slowdowns(const TrainConfig& c) {
  Slowdowns out;
  out.seed = c.seed;
  bool have_random = false;
  for (const std::string& item : c.slowdown) {
    const auto colon = item.find(':');
    const std::string who = colon == std::string::npos ? item : item.substr(0, colon);
    const bool random = who == "random";
    int rank = -1;
    double factor = 0.0;
    bool ok = colon != std::string::npos;
    if (ok) {
      try {
        std::size_t used = 0;
        if (!random) {
          rank = std::stoi(who, &used);
          ok = used == who.size();
        }
        const std::string f = item.substr(colon + 1);
        factor = std::stod(f, &used);
        ok = ok && used == f.size();
      } catch (const std::exception&) {
        ok = false;
      }
    }
    require(
        ok, "slowdown",
        fmt::format("'{}': give RANK:FACTOR (e.g. 1:2) or random:FACTOR (e.g. random:2)", item));
    require(factor >= 1.0 && std::isfinite(factor), "slowdown",
            fmt::format("'{}': factor {} must be >= 1 (the worker sleeps (FACTOR-1) x its "
                        "compute time each step)",
                        item, factor));
    if (random) {
      require(!have_random, "slowdown", "random:FACTOR is given twice");
      have_random = true;
      out.roaming = factor;
      continue;
    }
    require(rank >= 0, "slowdown", fmt::format("'{}': rank {} must be >= 0", item, rank));
    require(!out.fixed.count(rank), "slowdown", fmt::format("rank {} is given twice", rank));
    require(c.workers == 0 || rank < c.workers, "slowdown",
            fmt::format("'{}': rank {} is not a worker (workers are ranks 0..{}{})", item, rank,
                        c.workers - 1, ps_mode(c) ? "; servers follow them" : ""));
    out.fixed[rank] = factor;
  }
  return out;
}

nlohmann::json to_json(const TrainConfig& config) {
  nlohmann::json json;
  to_json(json, config);
  return json;
}

void update_from_json(TrainConfig& config, const nlohmann::json& json, const std::string& origin) {
  if (!json.is_object()) {
    throw InvalidArgument(
        fmt::format("{}: a training configuration must be a JSON object", origin));
  }
  const nlohmann::json known = to_json(TrainConfig{});
  for (const auto& [key, value] : json.items()) {
    if (!known.contains(key)) {
      std::vector<std::string> keys;
      for (const auto& [name, unused] : known.items()) keys.push_back(name);
      throw InvalidArgument(
          fmt::format("{}: unknown key '{}'; valid keys: {}", origin, key, fmt::join(keys, ", ")));
    }
    // A whole-number field takes only a JSON integer its type holds: the
    // reader casts any number it is given (a float past the type's range is
    // undefined behaviour), so the kind is checked first and the value read
    // back after.
    const bool whole = known[key].is_number_integer();
    if (whole && !value.is_number_integer()) {
      throw InvalidArgument(
          fmt::format("{}: key '{}' needs a whole number; got {}", origin, key, value.dump()));
    }
    nlohmann::json merged = to_json(config);
    merged[key] = value;
    try {
      from_json(merged, config);
    } catch (const nlohmann::json::exception& e) {
      throw InvalidArgument(fmt::format("{}: key '{}' has a value of the wrong type ({}): {}",
                                        origin, key, value.dump(), e.what()));
    }
    if (whole && to_json(config)[key].dump() != value.dump()) {  // == equates -1 and 2^64-1
      throw InvalidArgument(fmt::format("{}: key '{}' = {} is out of range (it reads back as {})",
                                        origin, key, value.dump(), to_json(config)[key].dump()));
    }
  }
}

std::map<std::string, std::string> effective_method_options(const TrainConfig& config) {
  std::map<std::string, std::string> options = config.method_options;
  const SyncMethodInfo* info = find_sync_method(config.method);
  if (info == nullptr) return options;
  const auto takes = [&](std::string_view option) {
    return std::any_of(info->options.begin(), info->options.end(),
                       [&](const OptionSpec& s) { return s.name == option; });
  };
  if (takes("density") && !options.count("density")) {
    options["density"] = fmt::format("{}", config.density);
  }
  // With AdamW on the gradient, a sparsifier's memory is EF21 unless one is
  // named: AdamW then normalizes a dense estimate of the mean gradient, not
  // bursts of accumulated gradients (docs/algorithms.md, "Optimizers and
  // compression"). Parameter-server pushes keep error feedback (the servers
  // hold no estimate), and so do local steps (the round's pseudo-gradient is
  // sent once; error feedback carries what it left behind to the next round).
  if (config.optimizer == "adamw" && config.compress == "gradient" && !ps_mode(config) &&
      config.local_steps == 0 && takes("memory") && !options.count("memory")) {
    options["memory"] = "ef21";
  }
  // Rounds of local steps: the spike clip off unless asked for.
  if (config.local_steps > 0) return round_options(config.method, std::move(options));
  return options;
}

}  // namespace sparsecomm
