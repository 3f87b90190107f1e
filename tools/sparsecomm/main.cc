// The sparsecomm command-line tool: parses the command line and runs one
// subcommand; every error ends in one clear line and a non-zero exit (and,
// inside an MPI job, in MPI_Abort so no other rank is left waiting).

#include <cstdio>
#include <exception>
#include <string>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "bench_collectives.h"
#include "bench_exchange.h"
#include "bench_pipeline.h"
#include "bench_sparsifiers.h"
#include "calibrate_command.h"
#include "convergence_command.h"
#include "plan_command.h"
#include "report_command.h"
#include "sparsecomm/comm/launcher.h"
#include "sparsecomm/comm/mpi/mpi_communicator.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/log.h"
#include "train_command.h"

namespace {

int fail(const std::string& message) {
  if (sparsecomm::launched_by_mpirun()) {
    sparsecomm::mpi_abort_job("sparsecomm: error: " + message, 1);
  }
  sparsecomm::logger().error("{}", message);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"sparsecomm: communication-efficient data-parallel training"};
  app.require_subcommand(1);
  sparsecomm::cli::add_train_command(app);
  sparsecomm::cli::add_methods_command(app);
  sparsecomm::cli::add_report_command(app);
  sparsecomm::cli::add_plan_command(app);
  sparsecomm::cli::add_convergence_command(app);
  sparsecomm::cli::add_calibrate_command(app);
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks that verify, then time");
  bench->require_subcommand(1);
  sparsecomm::cli::add_bench_collectives_command(*bench);
  sparsecomm::cli::add_bench_exchange_command(*bench);
  sparsecomm::cli::add_bench_sparsifiers_command(*bench);
  sparsecomm::cli::add_bench_pipeline_command(*bench);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    return fail(e.what());
  }
  return 0;
}
