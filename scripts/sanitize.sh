#!/usr/bin/env bash
# Builds the tests with a sanitizer and runs them (ctest), each kind in its
# own build directory:
#
#   scripts/sanitize.sh address [CTEST_ARGS ...]   ASan + UBSan over every layer: the
#                                                  LibTorch trainer and the MPI suites
#                                                  included (build-asan/)
#   scripts/sanitize.sh thread  [CTEST_ARGS ...]   TSan over the torch-free layers on the
#                                                  thread backend, without MPI (build-tsan/)
#
# Both build with assertions on (no NDEBUG) at -O1 -g1. A report ends the test
# that made it (no recovery), so the run fails. Suppressions, each with its
# reason, are in tests/sanitizers/ (lsan.supp: OpenMPI's process-lifetime
# allocations; tsan.supp: the exception_ptr count inside uninstrumented
# libstdc++). TSan leaves out LibTorch, whose OpenMP runtime is not
# instrumented (TSan would report its synchronization as races), and
# OpenMPI, likewise uninstrumented. Run scripts/setup.sh first (CI does,
# through test.sh).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
kind="${1:-}"
shift || true
# density_test's stream tests run long synthetic streams (300 steps of 10^6
# elements on 4 or 8 ranks) that the sanitizers slow past ctest's 300 s per
# test; their
# threads run the same sync step and collectives that sync_test,
# exchange_test and density_test's spike test check under the sanitizer.
SLOW_STREAMS='^density_test[.]Stream/'
case "$kind" in
  address)
    build="${SPARSECOMM_ASAN_BUILD_DIR:-$ROOT/build-asan}"
    flags=(-DSPARSECOMM_SANITIZE=address,undefined -DSPARSECOMM_WITH_TORCH=ON -DSPARSECOMM_WITH_MPI=ON)
    export ASAN_OPTIONS="detect_leaks=1:detect_stack_use_after_return=1:strict_init_order=1:check_initialization_order=1"
    # OpenMPI is built without frame pointers: the fast unwinder stops inside
    # it, and a leak suppressed by library (lsan.supp) needs the whole stack,
    # so the suites under mpiexec (label mpi) record every allocation with the
    # slow unwinder. It costs a DWARF unwind per malloc, so the other tests
    # (our code has frame pointers) keep the fast one.
    mpi_asan_options="$ASAN_OPTIONS:fast_unwind_on_malloc=0"
    # OpenMPI's components stay loaded so their frames keep their names.
    export OMPI_MCA_mca_base_component_disable_dlclose=1
    export LSAN_OPTIONS="suppressions=$ROOT/tests/sanitizers/lsan.supp:print_suppressions=0"
    export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
    # The trainer's paths are sampled, not all run: its tests spend most of
    # their time in LibTorch, which is not instrumented. Left out here, each
    # with what covers its code under ASan: the LSTM's and the transformer's
    # learning tests (the LSTM's trace test, text_corpus_test, the
    # transformer's shape and causality tests, the AdamW resume test);
    # every method training the MLP (gradient_sync_test runs every method
    # in-process); the SGD resume and the deferred evaluation (the AdamW
    # resume, the crash and damaged-checkpoint tests, ps_train_test's
    # background evaluation); the CLI's threads-against-MPI determinism
    # (the click model's determinism test runs the CLI under mpiexec); the
    # signal tests' nine runs of the CLI (4 minutes under ASan; the stop
    # request's checkpoint and resume run in-process in train_test's stop
    # tests, and the signal's delivery is the kernel's). The
    # worlds of 7 and 8 thread ranks take the paths of the worlds of 2-6
    # (pairs, folds of a non-power of two, trees), as under TSan. The
    # fingerprint's determinism shards (3.5 minutes under ASan) are the
    # Release pass's, as under TSan: their exchanges run in sync_test's
    # cases here. Of the CLI's pilot tests (each trains 2-5 CNN runs)
    # cli.convergence_plan runs here: pilots, `convergence` and `plan`'s
    # choice, the code that --density auto and --method auto call; the
    # auto runs' resume is train_test's stop tests' code.
    trainer_sample='^train_test[.](Char(Lstm[.]TrainsOnATinyCorpus|Transformer[.]TrainsWithAdamW)WellAboveChance'
    trainer_sample+='|Trainer[.](EveryMethodTrainsTheMlpWithTheLossGoingDown|ResumingGivesBitIdenticalParameters'
    trainer_sample+='|DeferredEvaluationMatchesEvaluatingDuringTraining))$|^train_deterministic_test$'
    trainer_sample+='|^train_signal_stop_test$'
    cli_pilots='^cli[.](convergence_mixed_batches|train_density_auto|train_method_auto_takes_the_options)$'
    exclude=(-E "$SLOW_STREAMS|$trainer_sample|$cli_pilots|^sync_fingerprint_determinism/|/n[78]( |$)")
    ;;
  thread)
    build="${SPARSECOMM_TSAN_BUILD_DIR:-$ROOT/build-tsan}"
    flags=(-DSPARSECOMM_SANITIZE=thread -DSPARSECOMM_WITH_TORCH=OFF -DSPARSECOMM_WITH_MPI=OFF)
    export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$ROOT/tests/sanitizers/tsan.supp"
    # Worlds of 7 and 8 thread ranks (a quarter of TSan's test time) take the
    # same synchronization paths as the worlds of 2-6 (pairs, folds of a
    # non-power of two, trees); they run in the Release pass. Binaries that
    # never start a second thread (label one_thread, tests/CMakeLists.txt)
    # have no race to find. sync_test's conservation cases run once per
    # value format; the formats differ in the codec, not in how threads
    # meet, so TSan runs the fp32 cases (ASan and Release run all). The
    # fingerprint's determinism shards (5 minutes under TSan) run every
    # method's options through the same exchanges as sync_test's cases;
    # their determinism is the Release pass's to check.
    exclude=(-E "$SLOW_STREAMS|/n[78]( |$)|^sync_test[.]AllSchemes/Conservation[.].*_(fp16|bf16|int[248]|sign|nat)|^sync_fingerprint_determinism/"
             -LE one_thread)
    ;;
  *)
    echo "sanitize.sh: say which sanitizer: 'address' (ASan + UBSan) or 'thread' (TSan)" >&2
    exit 2
    ;;
esac

# -g1: line tables and function names, all a report's stack needs; full
# debug info made LibTorch's files compile 1.4 times as long.
cmake -S "$ROOT" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g1" \
  -DCMAKE_C_FLAGS_DEBUG="-O1 -g1" -DSPARSECOMM_WERROR=ON "${flags[@]}" >/dev/null
cmake --build "$build" -j "$(nproc)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
run_ctest() { ctest --test-dir "$build" --output-on-failure -j "$(nproc)" "${exclude[@]}" "$@"; }
if [[ $kind == address ]]; then
  # Three passes; the script fails if any did. The trainer's determinism
  # tests (label trainer) run the CLI under mpiexec, and the slow unwinder
  # made them 6 times as slow (196 s against 32 s for the click model's), so
  # they run with the fast one and without leak checking: they still catch
  # every memory error, the trainer's leaks are checked in-process
  # (train_test), and the MPI backend's by the other mpi suites.
  status=0
  run_ctest -LE mpi "$@" || status=$?
  ASAN_OPTIONS=$mpi_asan_options run_ctest -L mpi -LE trainer "$@" || status=$?
  ASAN_OPTIONS=${ASAN_OPTIONS/detect_leaks=1/detect_leaks=0} run_ctest -L trainer "$@" || status=$?
  exit "$status"
fi
run_ctest "$@"
