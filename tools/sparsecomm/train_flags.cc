#include "train_flags.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "sparsecomm/comm/launcher.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/data/fashion_mnist.h"
#include "sparsecomm/data/text_corpus.h"
#include "sparsecomm/sparsify/options.h"
#include "sparsecomm/sync/gradient_sync.h"
#include "sparsecomm/sync/two_level.h"
#include "world_flags.h"

namespace sparsecomm::cli {
namespace {

// --ranks-per-host: "auto" (kDetectRanksPerHost) or a whole number (its
// range is checked with the configuration).
int parse_ranks_per_host(const std::string& text) {
  if (text == "auto") return kDetectRanksPerHost;
  int value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size()) {
    throw InvalidArgument(
        fmt::format("--ranks-per-host '{}': give the ranks each host runs (e.g. 8) or auto", text));
  }
  return value;
}

namespace fs = std::filesystem;

// The flags that set no TrainConfig field, or whose text is parsed in the
// callback rather than copied: every other flag of `train` sets the field
// named by config_key_of, and the callback refuses a flag that does not.
constexpr std::array<std::string_view, 15> kFlagsBesideTheConfig = {
    "help",        "config",          "resume",          "compare",
    "no-plots",    "method-option",   "lr-milestones",   "density",
    "convergence", "target-loss",     "target-accuracy", "link-gbit",
    "latency-us",  "network-profile", "compute-ms"};

// The config JSON key that a flag sets: its long name with '-' as '_'
// ("--max-steps" -> max_steps; --timeout: timeout_s); empty for the flags
// above.
std::string config_key_of(const CLI::Option& option) {
  const std::vector<std::string>& names = option.get_lnames();
  if (names.empty()) return {};
  const std::string& name = names.front();
  if (std::find(kFlagsBesideTheConfig.begin(), kFlagsBesideTheConfig.end(), name) !=
      kFlagsBesideTheConfig.end()) {
    return {};
  }
  if (name == "timeout") return "timeout_s";
  std::string key = name;
  std::replace(key.begin(), key.end(), '-', '_');
  return key;
}

void load_config_file(TrainConfig& config, const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    throw InvalidArgument(fmt::format("--config {}: cannot open the file", path));
  }
  const nlohmann::json json = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) {
    throw InvalidArgument(fmt::format("--config {}: not valid JSON", path));
  }
  update_from_json(config, json, path);
}

// The flags of `train`, by group, each bound to its TrainConfig field.
void add_train_world_flags(CLI::App* cmd, TrainConfig& c) {
  cmd->add_option("--workers,-n", c.workers,
                  "ranks (thread backend); under mpirun: the job size. With --servers S: the "
                  "number of workers, and the world is workers + S ranks (mpirun -n W+S)")
      ->capture_default_str();
  cmd->add_option("--servers", c.servers,
                  "parameter-server mode: S servers own shards of the parameters and W = "
                  "--workers workers push gradients and pull parameters (0: all-reduce). "
                  "Push methods: dense, topk, threshold, randomk, dgc, gaussiank under every "
                  "--sync; micro, exdyna, exdyna-faithful, cltk, deft under bsp only. No "
                  "checkpoints, --resume or --bucket-mb in this mode yet")
      ->capture_default_str();
  cmd->add_option("--sync", c.sync,
                  "parameter-server synchronization: bsp (default) | asp | ssp | dssp")
      ->capture_default_str();
  cmd->add_option("--staleness", c.staleness, "ssp: a worker may be at most s steps ahead")
      ->capture_default_str();
  cmd->add_option("--staleness-low", c.staleness_low, "dssp: the lower bound s_L")
      ->capture_default_str();
  cmd->add_option("--staleness-high", c.staleness_high,
                  "dssp: the upper bound s_U (the server grants up to s_U - s_L extra steps)")
      ->capture_default_str();
  cmd->add_option("--slowdown", c.slowdown,
                  "RANK:FACTOR (repeatable): that worker sleeps (FACTOR - 1) x its compute time "
                  "each step, a persistent straggler; random:FACTOR: at each step one worker, "
                  "drawn from the seed, is slowed so (transient stragglers). Compute time: the "
                  "thread's CPU time with one intra-op thread, so ranks sharing cores do not "
                  "change how slow it is; else wall time");
  add_backend_flag(*cmd, c.backend);
  cmd->add_option("--threads", c.threads,
                  "LibTorch intra-op threads per rank (0: 1 per thread rank; under mpirun the "
                  "cores shared among the local ranks)")
      ->capture_default_str();
}

void add_train_data_flags(CLI::App* cmd, TrainConfig& c) {
  cmd->add_option(
         "--model", c.model,
         "mlp | cnn | resnet18 | wide-mlp (images) | char-lstm | char-transformer[-w64|-w256] "
         "(text; AdamW; widths 128, 64, 256) | dlrm (clicks: 169M-parameter tables)")
      ->capture_default_str();
  cmd->add_option("--dataset", c.dataset,
                  "fashion-mnist | synthetic (images) | fortunes (text: Debian's fortunes "
                  "package) | click-log (generated; the default for --model dlrm)")
      ->capture_default_str();
  cmd->add_option("--embedding-cap", c.embedding_cap,
                  "dlrm: rows per embedding table at most (Criteo's 26 field sizes, capped)")
      ->capture_default_str();
  cmd->add_option("--embedding-dim", c.embedding_dim, "dlrm: floats per embedding row")
      ->capture_default_str();
  cmd->add_option("--embedding-exchange", c.embedding_exchange,
                  "dlrm: how the tables' touched rows are summed: allgather | sparse-allreduce | "
                  "sharded (each rank stores 1/n of the rows and serves them: the batch's rows "
                  "pulled, their gradient pushed) | dense (the whole table gradient, ring "
                  "all-reduced: the baseline) | auto (the cheaper of the first two by the last "
                  "step's rows)")
      ->capture_default_str();
  cmd->add_option("--embedding-optimizer", c.embedding_optimizer,
                  "dlrm: the tables' lazy optimizer: adagrad (row-wise) | sgd")
      ->capture_default_str();
  cmd->add_option("--embedding-values", c.embedding_values,
                  "dlrm: the rows' values on the wire: fp32 | bf16 | fp16 (half the bytes; "
                  "every rank adds the same rounded rows)")
      ->capture_default_str();
  cmd->add_option("--embedding-lr", c.embedding_lr,
                  "dlrm: the tables' learning rate (follows --lr's warm-up and decay)")
      ->capture_default_str();
  cmd->add_option("--data-dir", c.data_dir,
                  fmt::format("where the dataset's files are (default: {} for fashion-mnist, {} "
                              "for fortunes)",
                              kFashionMnistDirectory, kFortunesDirectory));
  cmd->add_option("--train-samples", c.train_samples, "use the first N training samples (0: all)")
      ->capture_default_str();
  cmd->add_option("--test-samples", c.test_samples, "use the first N test samples (0: all)")
      ->capture_default_str();
}

void add_train_sync_flags(CLI::App* cmd, TrainFlags& flags) {
  TrainConfig& c = flags.config;
  cmd->add_option(
         "--method,-m", c.method,
         "synchronization: " + sync_method_names() +
             ", or auto with --density auto (the profile's fastest configuration, its method "
             "options included)")
      ->capture_default_str();
  cmd->add_option("--density,-d", flags.density,
                  fmt::format("target density for sparsifying methods (0.01 = 1%; default {:g}), "
                              "or auto: chosen from a convergence profile for the network "
                              "(--convergence, a target, --link-gbit)",
                              c.density));
  add_auto_density_flags(cmd, flags.auto_density);
  cmd->add_option("--method-option,-o", flags.method_options,
                  "the method's own key=value options (repeatable); see `sparsecomm methods`");
  cmd->add_option("--nonfinite", c.nonfinite, "NaN/inf gradients: stop | skip")
      ->capture_default_str();
  cmd->add_option("--bucket-mb", c.bucket_mb,
                  "pipelining: synchronize buckets of this many MiB while backward runs (0: off)")
      ->capture_default_str();
  cmd->add_option_function<std::string>(
         "--ranks-per-host",
         [&c](const std::string& text) { c.ranks_per_host = parse_ranks_per_host(text); },
         "hosts of R consecutive ranks: a host's ranks average their gradients first (the fast "
         "link) and the method runs between hosts only, one leader per host, which keeps the "
         "host's residual (1: every rank a host; auto: from the ranks' host names, or "
         "SPARSECOMM_HOST_NAME where set)")
      ->default_str("1");
  cmd->add_option("--min-numel", c.min_numel,
                  "average tensors with fewer elements densely beside the method instead of "
                  "sparsifying them (biases, small layers; e.g. 1024); the density then counts "
                  "only the other tensors (0: sparsify every tensor)")
      ->capture_default_str();
  cmd->add_option(
      "--exclude", c.exclude,
      "average the tensors whose name matches this shell pattern densely (repeatable; "
      "e.g. 'fc2.*'; a pattern that matches no tensor is an error that lists the names)");
}

void add_train_optimizer_flags(CLI::App* cmd, TrainFlags& flags) {
  TrainConfig& c = flags.config;
  cmd->add_option("--epochs,-e", c.epochs, "epochs")->capture_default_str();
  cmd->add_option("--max-steps", c.max_steps, "total steps instead of whole epochs (0: off)")
      ->capture_default_str();
  cmd->add_option("--batch,-b", c.batch, "batch size per rank (global batch = workers x batch)")
      ->capture_default_str();
  cmd->add_option("--lr", c.lr, "learning rate (after warm-up)")->capture_default_str();
  cmd->add_option("--optimizer", c.optimizer,
                  "sgd | adamw (decoupled weight decay; Adam is adamw with --weight-decay 0) | "
                  "muon (orthogonalized momentum 0.95 on hidden matrices, adamw on the rest; "
                  "adamw's --lr and --weight-decay carry over)")
      ->capture_default_str();
  cmd->add_option("--beta1", c.beta1, "adamw: the first moment's decay")->capture_default_str();
  cmd->add_option("--beta2", c.beta2, "adamw: the second moment's decay")->capture_default_str();
  cmd->add_option("--adam-eps", c.adam_eps, "adamw: eps of the denominator")->capture_default_str();
  cmd->add_option("--compress", c.compress,
                  "what the method synchronizes: gradient | update (adamw: every rank runs the "
                  "moments on its own gradient and the method sends that AdamW direction, with "
                  "error feedback on it; docs/algorithms.md)")
      ->capture_default_str();
  cmd->add_option("--freeze-variance-after", c.freeze_variance_after,
                  "adamw: all-reduce the first N steps densely, then freeze the second moment "
                  "and let the method compress the gradient (1-bit Adam's design; 0: off)")
      ->capture_default_str();
  cmd->add_option("--momentum", c.momentum, "SGD momentum (DGC: its momentum correction instead)")
      ->capture_default_str();
  cmd->add_option("--nesterov", c.nesterov, "Nesterov momentum (true|false)")
      ->capture_default_str();
  cmd->add_option("--weight-decay", c.weight_decay,
                  "weight decay (sgd: L2 in the gradient; adamw: decoupled)")
      ->capture_default_str();
  cmd->add_option("--warmup-epochs", c.warmup_epochs, "linear learning-rate warm-up")
      ->capture_default_str();
  cmd->add_option("--lr-decay", c.lr_decay, "none | step | cosine")->capture_default_str();
  cmd->add_option("--lr-milestones", flags.lr_milestones,
                  "step decay: comma-separated epochs at which lr *= --lr-gamma");
  cmd->add_option("--lr-gamma", c.lr_gamma, "step decay factor")->capture_default_str();
  cmd->add_option("--local-steps", c.local_steps,
                  "local steps: each rank takes H optimizer steps on its own data, then the "
                  "method synchronizes the pseudo-gradient and the outer step moves the shared "
                  "parameters (by default to the ranks' average; 0: synchronize every step)")
      ->capture_default_str();
  cmd->add_option("--outer-lr", c.outer_lr,
                  "local steps: the outer step's learning rate (DiLoCo's: 0.7 with "
                  "--outer-momentum 0.9 --outer-nesterov true)")
      ->capture_default_str();
  cmd->add_option("--outer-momentum", c.outer_momentum,
                  "local steps: the outer step's momentum (0: none)")
      ->capture_default_str();
  cmd->add_option("--outer-nesterov", c.outer_nesterov,
                  "local steps: Nesterov outer momentum (true|false)")
      ->capture_default_str();
  cmd->add_flag("--outer-overlap", c.outer_overlap,
                "local steps: exchange a round's pseudo-gradient while the next round runs and "
                "apply it at that round's end (one round late; the run's last round waits)");
}

void add_train_run_flags(CLI::App* cmd, TrainFlags& flags) {
  TrainConfig& c = flags.config;
  cmd->add_option("--seed", c.seed, "seed of initialization and data order")->capture_default_str();
  cmd->add_flag("--deterministic", c.deterministic,
                "bit-identical across runs and backends: 1 intra-op thread, our ring all-reduce, "
                "fixed shard order");
  cmd->add_option("--eval-every", c.eval_every, "also evaluate every N steps (0: per epoch)")
      ->capture_default_str();
  cmd->add_flag("--eval-deferred", c.eval_deferred,
                "keep the parameters at each evaluation point and evaluate them after training, "
                "so that evaluation takes none of the training's wall time (time-to-accuracy "
                "comparisons)");
  cmd->add_option("--out", c.out, "run directory (default runs/<method>-<model>-<time>)");
  cmd->add_option("--checkpoint-every", c.checkpoint_every, "checkpoint every N steps (0: off)")
      ->capture_default_str();
  cmd->add_option("--stop-at-step", c.stop_at_step,
                  "stop after this step with a checkpoint (resume with --resume)")
      ->capture_default_str();
  cmd->add_option("--resume", flags.resume, "continue the run in DIR from its latest checkpoint");
  cmd->add_option("--record-gradients", c.record_gradients,
                  "write a gradient trace to DIR (format: docs/algorithms.md, \"Gradient "
                  "traces\")");
  cmd->add_option("--record-steps", c.record_steps, "steps to record")->capture_default_str();
  cmd->add_option("--timeline", c.timeline,
                  "write every rank's phases (compute, selection, exchange, each blocking wait on "
                  "a peer, update, evaluation, checkpoint) as a Chrome trace to FILE, for "
                  "Perfetto or chrome://tracing (docs/timeline.md)");
  cmd->add_option("--timeout", c.timeout_s,
                  "seconds a rank waits for a peer before failing (0: 60 s or "
                  "SPARSECOMM_TIMEOUT_MS)")
      ->capture_default_str();
  cmd->add_flag("--no-plots", flags.no_plots, "do not draw PNG plots");
  cmd->add_option("--compare", flags.compare,
                  "train each of these in turn (comma-separated) on the same seed and data, then "
                  "print one table and draw comparison plots; an item is METHOD or, with "
                  "--servers, METHOD@SYNC (bsp, asp, ssp, dssp with the --staleness flags, or "
                  "ssp:S, dssp:L:U), e.g. topk@bsp,topk@ssp:2,topk@dssp:1:4");
}

}  // namespace

void add_train_flags(CLI::App* cmd, TrainFlags& flags) {
  cmd->add_option("--config", flags.config_file,
                  "JSON file of settings (a run's config.json reproduces it); flags override it");
  add_train_world_flags(cmd, flags.config);
  add_train_data_flags(cmd, flags.config);
  add_train_sync_flags(cmd, flags);
  add_train_optimizer_flags(cmd, flags);
  add_train_run_flags(cmd, flags);
}

TrainConfig config_from_flags(const TrainFlags& flags, const CLI::App& cmd) {
  TrainConfig config;
  const std::string file =
      !flags.config_file.empty()
          ? flags.config_file
          : (!flags.resume.empty() ? (fs::path(flags.resume) / "config.json").string() : "");
  if (!file.empty()) load_config_file(config, file);
  // Every flag the user gave overrides the file.
  const TrainConfig& given = flags.config;
  nlohmann::json overrides = nlohmann::json::object();
  const nlohmann::json given_json = to_json(given);
  for (const CLI::Option* option : cmd.get_options()) {
    const std::string key = config_key_of(*option);
    if (key.empty()) continue;
    if (!given_json.contains(key)) {
      throw std::logic_error(fmt::format(
          "train: the flag --{} sets no TrainConfig field '{}'; bind it to one or list it in "
          "kFlagsBesideTheConfig",
          option->get_lnames().front(), key));
    }
    if (option->count() > 0) overrides[key] = given_json.at(key);
  }
  // A model named on the command line brings its own defaults (its
  // dataset, the transformer's optimizer) for the settings not given.
  if (overrides.contains("model")) {
    const nlohmann::json defaults = model_defaults(overrides["model"].get<std::string>());
    for (const auto& [key, value] : defaults.items()) {
      if (!overrides.contains(key)) overrides[key] = value;
    }
  }
  update_from_json(config, overrides, "the command line");
  if (!flags.resume.empty()) {
    // A resumed run continues in its own directory and, unless told
    // otherwise, to its end: the stop that wrote the checkpoint is done.
    if (cmd.count("--out") == 0) config.out.clear();
    if (cmd.count("--stop-at-step") == 0) config.stop_at_step = 0;
  }
  if (cmd.count("--density") > 0 && flags.density != "auto") {
    const char* end = flags.density.data() + flags.density.size();
    double density = 0.0;
    const auto [rest, error] = std::from_chars(flags.density.data(), end, density);
    if (error != std::errc() || rest != end) {
      throw InvalidArgument(
          fmt::format("--density '{}' is neither a number (0.01 = 1%) nor auto", flags.density));
    }
    config.density = density;
    // A density the method would not read is a mistake, not a setting
    // (--compare's methods take it where they can).
    const SyncMethodInfo* info = find_sync_method(config.method);
    if (flags.compare.empty() && info != nullptr &&
        std::none_of(info->options.begin(), info->options.end(),
                     [](const OptionSpec& o) { return o.name == "density"; })) {
      throw InvalidArgument(fmt::format(
          "--density {} does not apply to -m {}, which has no density (its options: `sparsecomm "
          "methods`; DeMo sends -o topk coefficients per chunk, PowerSGD -o rank): drop -d",
          flags.density, config.method));
    }
  }
  if (!flags.method_options.empty()) {
    SchemeOptions parsed;
    for (const std::string& item : flags.method_options) parsed.set(item);
    for (const auto& [key, value] : parsed.values()) config.method_options[key] = value;
  }
  if (!flags.lr_milestones.empty()) {
    config.lr_milestones.clear();
    for (const std::string& item : split_list(flags.lr_milestones, "--lr-milestones")) {
      config.lr_milestones.push_back(std::stod(item));
    }
  }
  if (flags.no_plots) config.plots = false;
  // Under mpirun the job's size is the number of workers unless given.
  if (launched_by_mpirun() && cmd.count("--workers") == 0 && file.empty()) config.workers = 0;
  return config;
}

}  // namespace sparsecomm::cli
