// The trainer on real LibTorch models and real data: data-parallel dense
// training equals single-rank training on the concatenated batch, resuming
// is bit-exact, corrupt checkpoints are refused, every method trains, bad
// options fail clearly.

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "error_message.h"
#include "sparsecomm/comm/thread/thread_world.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/state_io.h"
#include "sparsecomm/optim/sgd.h"
#include "sparsecomm/report/run_files.h"
#include "sparsecomm/sync/gradient_sync.h"
#include "sparsecomm/train/checkpoint.h"
#include "sparsecomm/train/data_parallel.h"
#include "sparsecomm/train/models.h"
#include "sparsecomm/train/trainer.h"
#include "train/train_checks.h"

namespace sparsecomm {
namespace {

namespace fs = std::filesystem;

TEST(DataParallel, DenseOverRanksEqualsOneRankOnTheConcatenatedBatch) {
  constexpr int kWorld = 4;
  constexpr std::int64_t kPerRank = 8;
  constexpr int kSteps = 5;
  torch::manual_seed(7);
  const torch::Tensor images = torch::randn({kSteps, kWorld * kPerRank, 1, 28, 28});
  const torch::Tensor labels = torch::randint(0, 10, {kSteps, kWorld * kPerRank});

  auto train = [&](Communicator& comm, std::int64_t batch_begin, std::int64_t batch_size) {
    std::shared_ptr<Model> model;
    {
      static std::mutex mutex;
      std::lock_guard lock(mutex);
      torch::manual_seed(1);
      model = make_model("mlp", 10);
    }
    DataParallel ddp(*model, comm, make_gradient_sync("dense", SchemeOptions{}));
    FlatSgd sgd(SgdOptions{0.9, false, 1e-4});
    for (int t = 0; t < kSteps; ++t) {
      ddp.zero_grad();
      const auto x = images[t].narrow(0, batch_begin, batch_size);
      const auto y = labels[t].narrow(0, batch_begin, batch_size);
      torch::nn::functional::cross_entropy(model->forward(x), y).backward();
      ddp.synchronize();
      sgd.step(ddp.parameters(), ddp.gradients(), 0.1);
    }
    return std::vector<float>(ddp.parameters().begin(), ddp.parameters().end());
  };

  std::vector<float> single;
  run_thread_world(1, [&](Communicator& comm) { single = train(comm, 0, kWorld * kPerRank); });
  std::vector<std::vector<float>> replicas(kWorld);
  run_thread_world(kWorld, [&](Communicator& comm) {
    replicas[comm.rank()] = train(comm, comm.rank() * kPerRank, kPerRank);
  });
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_EQ(replicas[r].size(), single.size());
    EXPECT_EQ(replicas[r], replicas[0]) << "replicas diverged on rank " << r;
    double max_diff = 0.0;
    for (std::size_t i = 0; i < single.size(); ++i) {
      max_diff = std::max(max_diff, std::abs(double{replicas[r][i]} - single[i]));
    }
    EXPECT_LT(max_diff, 1e-5) << "rank " << r;
  }
}

TEST(DataParallel, ParametersAndGradientsLiveInTheFlatBuffers) {
  run_thread_world(2, [](Communicator& comm) {
    torch::manual_seed(static_cast<std::uint64_t>(comm.rank()));  // replicas differ before
    auto model = make_model("cnn", 10);
    DataParallel ddp(*model, comm, make_gradient_sync("dense", SchemeOptions{}));
    std::size_t offset = 0;
    for (const auto& p : model->parameters()) {
      EXPECT_EQ(p.data_ptr<float>(), ddp.parameters().data() + offset);
      EXPECT_EQ(p.grad().data_ptr<float>(), ddp.gradients().data() + offset);
      offset += static_cast<std::size_t>(p.numel());
    }
    EXPECT_EQ(offset, ddp.numel());
    // The constructor broadcast rank 0's parameters.
    std::vector<float> mine(ddp.parameters().begin(), ddp.parameters().end());
    std::vector<float> root = mine;
    comm.broadcast(std::as_writable_bytes(std::span<float>(root)), 0);
    EXPECT_EQ(mine, root);
    // A gradient replaced by user code is copied back in.
    model->zero_grad(/*set_to_none=*/true);
    ddp.synchronize();
    EXPECT_EQ(model->parameters()[0].grad().data_ptr<float>(), ddp.gradients().data());
  });
}

using testing::short_run;

TEST(Trainer, EveryMethodTrainsTheMlpWithTheLossGoingDown) {
  const testing::ScratchDir scratch("every_method");
  for (const SyncMethodInfo& method : sync_methods()) {
    TrainConfig config = short_run(method.name, scratch.path() / method.name);
    if (method.name == "skipreduce") config.method_options["min_elements"] = "0";
    // Random-k with error feedback sends each coordinate about every 1/c
    // steps, so its updates are ~1/c times staler and larger: it needs a
    // smaller step (at 0.05 it diverges with momentum 0.9).
    if (method.name == "randomk") config.lr = 0.02;
    // DeMo's step moves every coordinate by lr (the sign of the mean): an
    // AdamW-sized rate, not SGD's.
    if (method.name == "demo") config.lr = 2e-3;
    const nlohmann::json summary = run_training(config);
    const report::RunData run = report::load_run(config.out);
    ASSERT_EQ(run.steps.size(), 64u) << method.name;
    double first = 0.0, last = 0.0;
    for (int i = 0; i < 10; ++i) {
      first += run.steps[static_cast<std::size_t>(i)].loss;
      last += run.steps[run.steps.size() - 1 - static_cast<std::size_t>(i)].loss;
    }
    EXPECT_LT(last, 0.8 * first) << method.name << ": the loss did not go down";
    EXPECT_GT(summary.at("test_accuracy").get<double>(), 0.5) << method.name;
    EXPECT_EQ(summary.at("method"), method.name);
    // The ranks' compute times, gathered after training: a spread and a
    // wait for the slowest rank, both set and non-negative.
    EXPECT_GE(summary.at("compute_spread_s").get<double>(), 0.0) << method.name;
    EXPECT_GE(summary.at("arrival_wait_s").get<double>(), 0.0) << method.name;
  }
}

// Deferred evaluation evaluates the same parameters at the same points as
// evaluating during training, and its time is not training wall time; a
// checkpoint evaluates what is pending, so a stopped and resumed run has
// every evaluation too.
TEST(Trainer, DeferredEvaluationMatchesEvaluatingDuringTraining) {
  const testing::ScratchDir scratch("deferred");
  TrainConfig now = short_run("topk", scratch.path() / "now");
  now.deterministic = true;
  now.eval_every = 16;
  run_training(now);
  TrainConfig later = now;
  later.out = (scratch.path() / "later").string();
  later.eval_deferred = true;
  const nlohmann::json summary = run_training(later);
  TrainConfig stopped = later;
  stopped.out = (scratch.path() / "stopped").string();
  stopped.stop_at_step = 40;
  run_training(stopped);
  stopped.stop_at_step = 0;
  run_training(stopped, nullptr, stopped.out);

  const report::RunData a = report::load_run(now.out);
  for (const std::string& dir : {later.out, stopped.out}) {
    const report::RunData b = report::load_run(dir);
    ASSERT_EQ(b.evals.size(), 4u) << dir;  // steps 16, 32, 48, 64
    ASSERT_EQ(a.evals.size(), b.evals.size());
    for (std::size_t i = 0; i < a.evals.size(); ++i) {
      EXPECT_EQ(a.evals[i].step, b.evals[i].step) << dir;
      EXPECT_EQ(a.evals[i].test_accuracy, b.evals[i].test_accuracy) << dir << " eval " << i;
      EXPECT_DOUBLE_EQ(a.evals[i].test_loss, b.evals[i].test_loss) << dir << " eval " << i;
      EXPECT_DOUBLE_EQ(a.evals[i].train_loss, b.evals[i].train_loss) << dir << " eval " << i;
      if (i > 0) {
        EXPECT_GE(b.evals[i].wall_s, b.evals[i - 1].wall_s) << dir;
      }
    }
  }
  const report::RunData b = report::load_run(later.out);
  EXPECT_LE(b.evals.back().wall_s, summary.at("wall_s").get<double>());
}

TEST(Trainer, ResumingGivesBitIdenticalParameters) {
  const testing::ScratchDir scratch("resume");
  for (const std::string method : {"dense", "exdyna"}) {
    TrainConfig half = short_run(method, scratch.path() / (method + "-half"));
    testing::expect_resume_matches_uninterrupted(
        short_run(method, scratch.path() / (method + "-whole")), half, 32, method);
    // Metrics continue: one record per step, no step twice.
    EXPECT_EQ(report::load_run(half.out).steps.size(), 64u);
  }
}

// A stop requested in the middle of step 20 is agreed by every rank after
// it (whichever rank the request reached first): the run checkpoints at 21
// and resumes from there bit for bit.
TEST(Trainer, AStopRequestCheckpointsAfterTheStepAndResumesBitForBit) {
  const testing::ScratchDir scratch("stop_request");
  testing::expect_stop_resumes_bit_for_bit(short_run("exdyna", scratch.path() / "whole"),
                                           short_run("exdyna", scratch.path() / "stopped"), 20, 21);
}

// With local steps the ranks agree only where a round closes (no round
// trip inside a round): a request during step 20 stops after step 24.
TEST(Trainer, WithLocalStepsAStopWaitsForTheRoundToClose) {
  const testing::ScratchDir scratch("stop_local_steps");
  TrainConfig whole = short_run("topk", scratch.path() / "whole");
  whole.local_steps = 8;
  TrainConfig stopped = whole;
  stopped.out = (scratch.path() / "stopped").string();
  testing::expect_stop_resumes_bit_for_bit(whole, stopped, 20, 24);
}

// A crash after the ranks wrote checkpoint 48 but before it was committed
// (injected through the test hook): checkpoint 32 stays the latest and
// usable, and the run resumed from it ends bit-identical to an
// uninterrupted one.
TEST(Trainer, ACrashBetweenWritingAndCommittingKeepsThePreviousCheckpoint) {
  const testing::ScratchDir scratch("checkpoint_fault");
  TrainConfig whole = short_run("exdyna", scratch.path() / "whole");
  whole.checkpoint_every = 1000;  // only the final checkpoint
  run_training(whole);

  TrainConfig faulty = short_run("exdyna", scratch.path() / "faulty");
  faulty.checkpoint_every = 16;
  set_checkpoint_fault_hook([](std::int64_t step, int rank) {
    if (step == 48 && rank == 1) throw Error("injected crash after writing checkpoint 48");
  });
  EXPECT_THROW(run_training(faulty), std::exception);
  set_checkpoint_fault_hook(nullptr);
  ASSERT_EQ((*latest_checkpoint(faulty.out))["step"], 32);
  EXPECT_TRUE(fs::exists(fs::path(faulty.out) / "checkpoints" / "step-48" / "rank1.state"));
  EXPECT_TRUE(fs::exists(fs::path(faulty.out) / "failure.json"));

  TrainConfig rest = faulty;
  rest.out.clear();
  rest.checkpoint_every = 1000;
  run_training(rest, nullptr, faulty.out);
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_EQ(testing::checkpoint_parameters(whole.out, rank),
              testing::checkpoint_parameters(faulty.out, rank))
        << "rank " << rank;
  }
  EXPECT_EQ(report::load_run(faulty.out).steps.size(), 64u);
  EXPECT_FALSE(fs::exists(fs::path(faulty.out) / "failure.json"));
  EXPECT_FALSE(fs::exists(fs::path(faulty.out) / "checkpoints" / "step-48"));
}

// A commit removes the checkpoints before it and nothing after it: a
// parameter server's worker does not wait for rank 0's commit and may be
// writing the next checkpoint meanwhile (its file vanished under it once).
TEST(Checkpoint, ACommitRemovesOnlyOlderCheckpoints) {
  const testing::ScratchDir scratch("commit_keeps_newer");
  const fs::path run = scratch.path() / "run";
  const std::vector<std::byte> payload(16, std::byte{7});
  for (const std::int64_t step : {8, 16, 24}) write_rank_checkpoint(run, step, 1, payload);
  fs::create_directories(run / "checkpoints" / "step-notes");
  commit_checkpoint(run, 16, 2, nlohmann::json::object());
  EXPECT_EQ((*latest_checkpoint(run))["step"], 16);
  EXPECT_FALSE(fs::exists(run / "checkpoints" / "step-8"));
  EXPECT_EQ(read_rank_checkpoint(run, 16, 1), payload);
  EXPECT_EQ(read_rank_checkpoint(run, 24, 1), payload);
  EXPECT_TRUE(fs::exists(run / "checkpoints" / "step-notes"));
}

// Every way a checkpoint can be damaged on disk is refused when resuming,
// with an error that names the damaged file; nothing is trained from it.
TEST(Trainer, ADamagedCheckpointIsRefusedNamingTheFile) {
  const testing::ScratchDir scratch("damaged");
  TrainConfig config = short_run("topk", scratch.path() / "run");
  config.stop_at_step = 10;
  run_training(config);
  const fs::path checkpoints = scratch.path() / "run" / "checkpoints";
  const fs::path rank2 = checkpoints / "step-10" / "rank2.state";
  ASSERT_TRUE(fs::exists(rank2));

  struct Damage {
    std::string name;
    std::function<void(const fs::path& checkpoints)> apply;
    std::string file;    // what the error must name
    std::string reason;  // and what it must say
  };
  const auto flip_byte = [](const fs::path& file, std::streamoff at) {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    char byte = 0;
    f.seekg(at);
    f.read(&byte, 1);
    byte = static_cast<char>(byte ^ 0x10);
    f.seekp(at);
    f.write(&byte, 1);
  };
  const auto overwrite = [](const fs::path& file, const std::string& text) {
    std::ofstream(file, std::ios::binary | std::ios::trunc) << text;
  };
  const std::vector<Damage> damages = {
      {"a flipped bit", [&](const fs::path& c) { flip_byte(c / "step-10" / "rank2.state", 100); },
       "rank2.state", "corrupt"},
      {"a truncated rank file",
       [&](const fs::path& c) {
         const fs::path f = c / "step-10" / "rank2.state";
         fs::resize_file(f, fs::file_size(f) / 2);
       },
       "rank2.state", ""},
      {"an empty rank file",
       [&](const fs::path& c) { overwrite(c / "step-10" / "rank1.state", ""); }, "rank1.state", ""},
      {"a missing rank file", [&](const fs::path& c) { fs::remove(c / "step-10" / "rank3.state"); },
       "rank3.state", "missing"},
      {"latest.json that is not JSON",
       [&](const fs::path& c) { overwrite(c / "latest.json", "{\"step\": 10, \"wor"); },
       "latest.json", "corrupt"},
      {"latest.json with a negative step",
       [&](const fs::path& c) { overwrite(c / "latest.json", R"({"step": -3, "world": 4})"); },
       "latest.json", "corrupt"},
      {"latest.json with a step past any integer",
       [&](const fs::path& c) { overwrite(c / "latest.json", R"({"step": 1e300, "world": 4})"); },
       "latest.json", "corrupt"},
      {"latest.json with a step as a string",
       [&](const fs::path& c) { overwrite(c / "latest.json", R"({"step": "10", "world": 4})"); },
       "latest.json", "corrupt"},
      {"latest.json naming a step that was never written",
       [&](const fs::path& c) {
         overwrite(c / "latest.json", R"({"step": 12, "world": 4, "fingerprint": {}})");
       },
       "step-12", "missing"},
  };
  for (const Damage& damage : damages) {
    const fs::path copy = scratch.path() / "copy";
    fs::remove_all(copy);
    fs::copy(scratch.path() / "run", copy, fs::copy_options::recursive);
    damage.apply(copy / "checkpoints");
    TrainConfig rest = config;
    rest.stop_at_step = 0;
    rest.out.clear();
    const std::string message =
        testing::error_message([&] { run_training(rest, nullptr, copy.string()); });
    EXPECT_NE(message.find(damage.file), std::string::npos)
        << damage.name << ": the error does not name " << damage.file << ": " << message;
    EXPECT_NE(message.find(damage.reason), std::string::npos)
        << damage.name << ": the error does not say '" << damage.reason << "': " << message;
  }
}

TEST(Trainer, AMismatchedCheckpointIsRefused) {
  const testing::ScratchDir scratch("mismatch");
  TrainConfig config = short_run("dense", scratch.path() / "run");
  config.stop_at_step = 4;
  run_training(config);
  TrainConfig other = config;
  other.stop_at_step = 0;
  other.out.clear();
  other.batch = 16;
  try {
    run_training(other, nullptr, config.out);
    FAIL() << "a checkpoint of another batch size was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("batch"), std::string::npos) << e.what();
  }
}

TEST(Trainer, BadOptionsFailClearly) {
  const testing::ScratchDir scratch("bad");
  auto message = [&](TrainConfig c) { return testing::error_message([&] { run_training(c); }); };
  TrainConfig c = short_run("topk", scratch.path() / "a");
  c.model = "vgg";
  EXPECT_NE(message(c).find("mlp, cnn, resnet18, wide-mlp"), std::string::npos);
  c = short_run("nosuch", scratch.path() / "b");
  EXPECT_NE(message(c).find("dense, skipreduce"), std::string::npos);
  c = short_run("topk", scratch.path() / "c");
  c.density = 1.5;
  EXPECT_NE(message(c).find("--density"), std::string::npos);
  c = short_run("topk", scratch.path() / "d");
  c.method_options["bogus"] = "1";
  EXPECT_NE(message(c).find("bogus"), std::string::npos);
  c = short_run("topk", scratch.path() / "e");
  c.batch = 4096;
  EXPECT_NE(message(c).find("--batch"), std::string::npos);
  c = short_run("topk", scratch.path() / "f");
  c.data_dir = (scratch.path() / "nowhere").string();
  EXPECT_NE(message(c).find("apt-get install dataset-fashion-mnist"), std::string::npos);
  // An existing run is never overwritten.
  c = short_run("dense", scratch.path() / "g");
  c.max_steps = 2;
  run_training(c);
  EXPECT_NE(message(c).find("already holds a run"), std::string::npos);
}

// A configuration file's whole-number fields take only integers their type
// holds: a float or an out-of-range integer is refused naming the key.
TEST(TrainConfigJson, WholeNumberFieldsTakeOnlyIntegersTheirTypeHolds) {
  const auto refusal = [](const char* text) {
    TrainConfig config;
    return testing::error_message(
        [&] { update_from_json(config, nlohmann::json::parse(text), "run.json"); });
  };
  EXPECT_NE(refusal(R"({"workers": 1e30})").find("key 'workers' needs a whole number; got 1e+30"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"batch": 32.5})").find("'batch' needs a whole number"), std::string::npos);
  EXPECT_NE(refusal(R"({"workers": 3000000000})").find("'workers' = 3000000000 is out of range"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"seed": -1})").find("run.json: key 'seed'"), std::string::npos);
  TrainConfig config;
  update_from_json(config, nlohmann::json::parse(R"({"workers": 6, "lr": 1, "max_steps": 9})"),
                   "run.json");
  EXPECT_EQ(config.workers, 6);
  EXPECT_EQ(config.lr, 1.0);
  EXPECT_EQ(config.max_steps, 9);
}

// --min-numel / --exclude: the small tensors are averaged densely, k counts
// only the others, and bad rules are refused before the run directory exists.
TEST(Trainer, SmallTensorsAreSentDenselyAndBadRulesAreRefused) {
  const testing::ScratchDir scratch("dense_layers");
  TrainConfig c = short_run("exdyna", scratch.path() / "run");
  c.min_numel = 1000;
  c.max_steps = 6;
  c.stop_at_step = 3;
  run_training(c);
  std::size_t biases = 0, numel = 0;
  {
    torch::manual_seed(0);
    const auto model = make_model("mlp", 10);
    for (const auto& p : model->parameters()) {
      numel += static_cast<std::size_t>(p.numel());
      if (p.numel() < 1000) biases += static_cast<std::size_t>(p.numel());
    }
  }
  ASSERT_GT(biases, 0u);
  const report::RunData run = report::load_run(c.out);
  ASSERT_EQ(run.steps.size(), 3u);
  std::ifstream metrics(fs::path(c.out) / "metrics.jsonl");
  int step_lines = 0;
  for (std::string text; std::getline(metrics, text);) {
    const nlohmann::json line = nlohmann::json::parse(text);
    if (line.at("kind") != "step") continue;
    ++step_lines;
    EXPECT_EQ(line.at("dense_numel").get<std::size_t>(), biases);
    EXPECT_EQ(line.at("numel").get<std::size_t>(), numel);
    EXPECT_EQ(line.at("target").get<std::size_t>(), target_count(c.density, numel - biases));
  }
  EXPECT_EQ(step_lines, 3);
  // Resuming without the rule would change the run: refused, naming it.
  TrainConfig other = c;
  other.min_numel = 0;
  other.stop_at_step = 0;
  other.out.clear();
  EXPECT_NE(testing::error_message([&] { run_training(other, nullptr, c.out); }).find("min_numel"),
            std::string::npos);

  auto refused = [&](TrainConfig bad, const std::string& expected) {
    bad.out = (scratch.path() / "bad").string();
    const std::string message = testing::error_message([&] { run_training(bad); });
    EXPECT_NE(message.find(expected), std::string::npos) << message;
    EXPECT_FALSE(fs::exists(bad.out)) << expected;
  };
  TrainConfig bad = short_run("exdyna", "");
  bad.exclude = {"nosuch.*"};
  refused(bad, "its tensors (elements) are: fc1.weight (");
  bad.exclude = {"*"};
  refused(bad, "no tensor of the mlp model to sparsify");
  bad.exclude.clear();
  bad.min_numel = -1;
  refused(bad, "--min-numel");
  bad = short_run("dgc", "");
  bad.min_numel = 1000;
  refused(bad, "no momentum");
  bad = short_run("topk", "");
  bad.min_numel = 1000;
  bad.servers = 1;
  refused(bad, "all-reduce mode");
}

TEST(Trainer, RecordsAGradientTraceInTheTraceFormat) {
  const testing::ScratchDir scratch("trace");
  const auto json = testing::record_trace(short_run("dense", scratch.path() / "run"),
                                          scratch.path() / "trace", 3);
  const auto numel = json.at("numel").get<std::uintmax_t>();
  EXPECT_EQ(json.at("world"), 4);
  EXPECT_EQ(json.at("steps"), 3);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(fs::file_size(scratch.path() / "trace" / ("rank" + std::to_string(r) + ".f32")),
              3 * numel * sizeof(float));
  }
}

}  // namespace
}  // namespace sparsecomm
