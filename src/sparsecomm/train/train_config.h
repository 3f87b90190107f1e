#pragma once
// Everything that defines a training run, as plain data (no LibTorch):
// the CLI fills it from flags and a JSON config file, the trainer runs it,
// and the run directory's config.json is exactly to_json() of it, so
// `sparsecomm train --config RUN/config.json` reproduces the run.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace sparsecomm {

struct TrainConfig {
  // World.
  std::string backend = "auto";  // auto | thread | mpi
  int workers = 4;               // thread backend: ranks; mpi: 0 or the job size
  int threads = 0;               // LibTorch intra-op threads per rank (0: auto)
  double timeout_s = 0.0;        // a wait longer than this fails, naming the peer (0: the
                                 // default, 60 s or SPARSECOMM_TIMEOUT_MS)

  // Model and data.
  std::string model = "cnn";  // mlp | cnn | resnet18 | wide-mlp | char-lstm | dlrm
  // fashion-mnist | synthetic (images) | fortunes (text) | click-log (dlrm)
  std::string dataset = "fashion-mnist";
  // Where the dataset's files are; "" : the Debian package's (data_dir_of).
  std::string data_dir;
  std::int64_t train_samples = 0;  // 0: the whole training split; else its first N
  std::int64_t test_samples = 0;   // 0: the whole test split; else its first N
                                   // (click-log: the rows generated, 10M and 200k by default)

  // The click model's embedding tables (model dlrm; train/click_trainer.cc).
  std::int64_t embedding_cap = 2000000;     // rows per table at most (Criteo's fields, capped)
  std::int64_t embedding_dim = 16;          // floats per row
  std::string embedding_exchange = "auto";  // allgather | sparse-allreduce | sharded | dense | auto
  std::string embedding_optimizer = "adagrad";  // adagrad (row-wise) | sgd (lazy, no momentum)
  std::string embedding_values = "fp32";        // the rows on the wire: fp32 | bf16 | fp16
  double embedding_lr = 0.05;  // the tables' learning rate (scaled by --lr's schedule)

  // Synchronization.
  std::string method = "exdyna";                      // dense, skipreduce, or a sparsifier
  double density = 0.01;                              // for methods that take a density
  std::map<std::string, std::string> method_options;  // key=value, the method's own
  std::string nonfinite = "stop";                     // stop | skip
  double bucket_mb = 0.0;  // pipelining: bucket size in MiB (0: synchronize after backward)
  // Tensors averaged densely beside the method instead of sparsified
  // (sync/dense_layers.h): fewer elements than this (0: none), or a name
  // matching one of these shell patterns.
  std::int64_t min_numel = 0;
  std::vector<std::string> exclude;
  // Hosts of this many consecutive ranks (sync/two_level.h): > 1, the ranks
  // of a host average their gradients first and the method runs between
  // hosts only, on one leader per host. 1: every rank is a host. 0
  // (--ranks-per-host auto): from the ranks' host names, at the start
  // (detect_host_topology).
  int ranks_per_host = 1;

  // Local steps (all-reduce mode; optim/outer_loop.h): > 0: each rank takes
  // this many steps of the optimizer on its own data, then the method
  // synchronizes the pseudo-gradient and an outer SGD step moves the anchor.
  // 0: the method synchronizes every step's gradient.
  std::int64_t local_steps = 0;
  // The outer step: by default the plain average of the ranks' rounds (lr 1,
  // no momentum), which beat DiLoCo's Nesterov step (lr 0.7, momentum 0.9)
  // on both models in rounds of 10 and 32, and of 100 on the transformer
  // (docs/benchmarks/local-steps.md, "Which outer step").
  double outer_lr = 1.0;        // the outer step's learning rate
  double outer_momentum = 0.0;  // its momentum (0: none)
  bool outer_nesterov = false;
  // The one-round-delayed variant: a round's exchange runs while the next
  // round's local steps do, and its outer step lands at that round's end.
  bool outer_overlap = false;

  // Parameter-server mode (servers > 0): `workers` workers train, `servers`
  // servers own shards of the parameters; the world is workers + servers
  // ranks. 0: all-reduce data parallelism.
  int servers = 0;
  std::string sync;                   // bsp | asp | ssp | dssp ("" : bsp; needs servers > 0)
  std::int64_t staleness = 0;         // ssp: s
  std::int64_t staleness_low = 0;     // dssp: s_L
  std::int64_t staleness_high = 0;    // dssp: s_U (>= s_L)
  std::vector<std::string> slowdown;  // "RANK:FACTOR" | "random:FACTOR" (see Slowdowns)

  // Optimization.
  std::string optimizer = "sgd";  // sgd | adamw (Adam: adamw with --weight-decay 0)
  double beta1 = 0.9;             // adamw
  double beta2 = 0.999;           // adamw
  double adam_eps = 1e-8;         // adamw
  // What the method synchronizes (optim/update_rule.h): gradient | update
  // (adamw: each rank's own AdamW direction, error feedback on it).
  std::string compress = "gradient";
  // adamw, compress gradient: > 0: the first N steps are all-reduced densely
  // while AdamW's second moment is estimated, then the moment freezes and
  // the method takes over (1-bit Adam's design). 0: off.
  std::int64_t freeze_variance_after = 0;
  int epochs = 5;
  std::int64_t max_steps = 0;  // 0: epochs * steps per epoch; else this many steps in all
  std::int64_t batch = 64;     // per rank; the global batch is workers * batch
  double lr = 0.1;
  double momentum = 0.9;
  bool nesterov = true;
  double weight_decay = 5e-4;  // sgd: L2 (coupled); adamw: decoupled
  double warmup_epochs = 0.5;
  std::string lr_decay = "cosine";    // none | step | cosine
  std::vector<double> lr_milestones;  // step decay: epochs at which lr *= lr_gamma
  double lr_gamma = 0.1;
  std::uint64_t seed = 42;
  bool deterministic = false;  // 1 intra-op thread, our ring (fixed order), fixed shards

  // Evaluation and output.
  std::int64_t eval_every = 0;        // also evaluate every N steps (0: at each epoch's end only)
  bool eval_deferred = false;         // keep the parameters at each evaluation point and evaluate
                                      // them after training (off the wall clock)
  std::string out;                    // run directory ("" : runs/<method>-<model>-<time>)
  std::int64_t checkpoint_every = 0;  // steps; 0: only at the end / on --stop-at
  std::int64_t stop_at_step = 0;      // stop (with a checkpoint) after this step; 0: run to the end
  std::string record_gradients;       // write a gradient trace here ("" : off)
  std::int64_t record_steps = 20;
  // --timeline FILE: every rank's phases as a Chrome trace (core/timeline.h,
  // docs/timeline.md); empty: none.
  std::string timeline;
  bool plots = true;  // draw PNG plots at the end
};

// Parameter-server mode helpers.
inline bool ps_mode(const TrainConfig& config) { return config.servers > 0; }
// The --sync model's canonical name ("bsp", "ssp:2", "dssp:1:4").
std::string sync_model_name(const TrainConfig& config);
// --slowdown: who is slowed, by how much, at which step. A slowed worker
// sleeps (factor - 1) x its compute time after computing (see Straggler).
struct Slowdowns {
  std::map<int, double> fixed;  // RANK:FACTOR: that worker at every step
  double roaming = 1.0;         // random:FACTOR: at each step one worker, drawn
                                // from (seed, step), the same draw on every rank
  std::uint64_t seed = 0;

  // The factor of `worker` (of `workers`) at `step`: the product of its
  // fixed factor and, if the draw picks it, the roaming one; 1 if not slowed.
  double factor(int worker, int workers, std::int64_t step) const;
};
// --slowdown parsed and validated (factor >= 1, each rank once, one random
// entry at most). Whether a fixed rank is a worker is checked once the world
// is known.
Slowdowns parse_slowdowns(const TrainConfig& config);

// The models `make_model` knows, in a fixed order.
const std::vector<std::string>& model_names();
// char-transformer and its size ladder (char-transformer-w64, -w256): text,
// AdamW's defaults.
bool is_char_transformer(std::string_view model);
// The datasets, in a fixed order: fashion-mnist and synthetic are images
// (10 classes), fortunes is text (samples of character ids, see
// src/sparsecomm/data/text_corpus.h).
const std::vector<std::string>& dataset_names();
// What a model reads and a dataset holds: they must agree.
enum class InputKind { kImages, kText, kClicks };
InputKind model_input(const std::string& model);
InputKind dataset_input(const std::string& dataset);
// Whether the model reads character ids (char-lstm) rather than images.
inline bool model_reads_text(const std::string& model) {
  return model_input(model) == InputKind::kText;
}
inline bool dataset_is_text(const std::string& dataset) {
  return dataset_input(dataset) == InputKind::kText;
}
// The click model (dlrm): trained by train_click_rank, not DataParallel alone.
inline bool model_reads_clicks(const std::string& model) {
  return model_input(model) == InputKind::kClicks;
}
// The number of classes of the dataset's labels: 10 for images, the
// character vocabulary (kTextVocabularySize) for text.
std::int64_t dataset_classes(const std::string& dataset);
// Where the dataset's files are: config.data_dir, or when that is empty the
// Debian package's directory ("" for synthetic, which reads none).
std::string data_dir_of(const TrainConfig& config);

// The settings a model brings when it is chosen on the command line and
// they are not given there: the click model's dataset (click-log); the
// transformer's dataset (fortunes) and optimizer (AdamW, its learning rate
// and weight decay). Empty for the other models.
nlohmann::json model_defaults(const std::string& model);

// Checks every field (and that the model reads what the dataset holds);
// InvalidArgument naming the field, the bad value and what is valid. Method
// options are checked when the method is built.
void validate(const TrainConfig& config);

nlohmann::json to_json(const TrainConfig& config);
// Strict: an unknown key or a value of the wrong type is an InvalidArgument
// naming the key (and `origin`, e.g. the file name). Missing keys keep the
// values already in `config`.
void update_from_json(TrainConfig& config, const nlohmann::json& json, const std::string& origin);

// The method's option map with `density` added when the method takes one
// and it is not set explicitly, and, with AdamW on the gradient in
// all-reduce mode, memory=ef21 when the method takes a memory and none is
// named.
std::map<std::string, std::string> effective_method_options(const TrainConfig& config);

}  // namespace sparsecomm
