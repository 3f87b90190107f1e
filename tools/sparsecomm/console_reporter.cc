#include "console_reporter.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include <fmt/format.h>

#include "cli_util.h"
#include "sparsecomm/core/timer.h"
#include "sparsecomm/train/run_writer.h"

namespace sparsecomm::cli {
namespace {

class ConsoleReporter final : public TrainObserver {
 public:
  explicit ConsoleReporter(std::string label)
      : label_(std::move(label)), terminal_(isatty(fileno(stderr)) != 0) {}

  void on_start(const RunInfo& info) override {
    info_ = info;
    const std::string world =
        info.servers > 0 ? fmt::format("{} workers + {} server{} ({})", info.workers, info.servers,
                                       info.servers == 1 ? "" : "s", info.sync)
                         : fmt::format("{} ranks", info.workers);
    fmt::print(
        "[{}] {} ({} backend, {} intra-op thread{} each), {} parameters{}, {} steps "
        "({} per epoch){} -> {}\n",
        label_, world, info.backend, info.threads, info.threads == 1 ? "" : "s", info.numel,
        info.embedding_numel > 0
            ? fmt::format(" + {} in embedding tables (row-sparse)", info.embedding_numel)
            : "",
        info.total_steps, info.steps_per_epoch,
        info.first_step > 0 ? fmt::format(", resumed at step {}", info.first_step) : "",
        info.run_dir);
    if (info.buckets > 1 || info.pipelining.rfind("not pipelined: ", 0) == 0) {
      fmt::print("[{}] {}\n", label_, info.pipelining);
    }
    std::fflush(stdout);
    clock_ = Stopwatch();
  }

  void on_step(const TrainStep& s) override {
    window_.steps += 1;
    window_.loss += s.loss;
    window_.compute += s.compute_s;
    window_.selection += s.selection_s;
    window_.exchange += s.exchange_s;
    window_.update += s.update_s;
    window_.bytes += static_cast<double>(s.sync.bytes_sent);
    // K/k and imbalance: only the steps after the settling phase, as in
    // summary.json (the whole window when the run is shorter), and only
    // those that synchronized (local steps: a round's last).
    const bool settled = s.step >= kSettleSteps || info_.total_steps <= kSettleSteps;
    if (s.synchronized && settled) {
      window_.judged += 1;
      window_.density += s.sync.density_ratio;
      window_.imbalance += s.sync.imbalance;
    } else if (s.synchronized) {
      window_.settling = true;
    }
    window_.overlapped += s.sync.overlapped_s;
    if (!terminal_ || clock_.seconds() < next_draw_s_) return;
    next_draw_s_ = clock_.seconds() + 0.2;
    const std::int64_t done = s.step + 1;
    const std::int64_t per_epoch = info_.steps_per_epoch;
    const std::int64_t in_epoch = (done - 1) % per_epoch + 1;
    const double rate = static_cast<double>(done - info_.first_step) / clock_.seconds();
    const double eta = rate > 0 ? static_cast<double>(per_epoch - in_epoch) / rate : 0.0;
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(kWidth * in_epoch / per_epoch);
    fmt::print(stderr, "\r  epoch {:>3} [{}{}] {:>3}% {}/{}  loss {:.4f}  ETA {:>4.0f}s ",
               (done - 1) / per_epoch + 1, std::string(static_cast<std::size_t>(filled), '#'),
               std::string(static_cast<std::size_t>(kWidth - filled), '.'),
               100 * in_epoch / per_epoch, in_epoch, per_epoch, s.loss, eta);
    bar_drawn_ = true;
  }

  void on_eval(const TrainEval& e) override {
    if (bar_drawn_) fmt::print(stderr, "\r{:<100}\r", "");
    bar_drawn_ = false;
    if (e.deferred) {
      // After training: the phase times of each window are gone; accuracy only.
      if (!deferred_header_) fmt::print("  evaluated after training (--eval-deferred):\n");
      deferred_header_ = true;
      fmt::print(
          "  epoch {:>6.2f}  step {:>6}  train loss {:.4f}  test acc {:6.2f}%  test loss {:.4f}  "
          "[{:.0f}s]\n",
          e.epoch, e.step, e.train_loss, 100.0 * e.test_accuracy, e.test_loss, e.wall_s);
      std::fflush(stdout);
      return;
    }
    const double n = std::max(1.0, window_.steps);
    const double judged = std::max(1.0, window_.judged);
    const std::string density =
        window_.judged > 0
            ? fmt::format(
                  "K/k {:.3f}  imbalance {:.3f}{}", window_.density / judged,
                  window_.imbalance / judged,
                  window_.settling ? fmt::format(" (from step {})", kSettleSteps) : std::string())
            : fmt::format("K/k, imbalance: settling (to step {})", kSettleSteps);
    fmt::print(
        "  epoch {:>6.2f}  train loss {:.4f}  test acc {:6.2f}%  test loss {:.4f}  {}  "
        "{}/rank/step  time: compute {:.1f}s selection {:.2f}s exchange {:.2f}s update {:.2f}s  "
        "{}[{:.0f}s]\n",
        e.epoch, e.train_loss, 100.0 * e.test_accuracy, e.test_loss, density,
        format_bytes(window_.bytes / n), window_.compute, window_.selection, window_.exchange,
        window_.update, overlap_text(), e.wall_s);
    std::fflush(stdout);
    window_ = {};
  }

 private:
  // "overlap 32%  " when pipelined: the share of selection + exchange done
  // while backward ran.
  std::string overlap_text() const {
    const double communication = window_.selection + window_.exchange;
    if (!(info_.buckets > 1) || communication <= 0) return "";
    return fmt::format("overlap {:.0f}%  ", 100.0 * window_.overlapped / communication);
  }

  bool deferred_header_ = false;
  struct Window {
    double steps = 0, loss = 0, compute = 0, selection = 0, exchange = 0, update = 0, bytes = 0,
           overlapped = 0, density = 0, imbalance = 0;
    double judged = 0;      // steps whose K/k and imbalance count (after settling)
    bool settling = false;  // some steps of the window were still settling
  };
  std::string label_;
  bool terminal_;
  RunInfo info_;
  Stopwatch clock_;
  double next_draw_s_ = 0.0;
  bool bar_drawn_ = false;
  Window window_;
};

}  // namespace

std::unique_ptr<TrainObserver> make_console_reporter(std::string label) {
  return std::make_unique<ConsoleReporter>(std::move(label));
}

}  // namespace sparsecomm::cli
