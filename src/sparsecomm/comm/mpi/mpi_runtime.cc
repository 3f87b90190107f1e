// MPI's lifetime in this process (mpi_runtime.h).

#define OMPI_SKIP_MPICXX 1  // the C API only: no deprecated C++ bindings
#define MPICH_SKIP_MPICXX 1

#include "sparsecomm/comm/mpi/mpi_runtime.h"

#include <algorithm>
#include <atomic>
#include <string>

#include <fmt/format.h>
#include <mpi.h>

#include "sparsecomm/core/errors.h"

namespace sparsecomm {

bool mpi_initialized() {
  int flag = 0;
  MPI_Initialized(&flag);
  return flag != 0;
}

bool mpi_finalized() {
  int flag = 0;
  MPI_Finalized(&flag);
  return flag != 0;
}

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) {
    return fmt::format("MPI error code {}", code);
  }
  return std::string(text, static_cast<std::size_t>(std::max(length, 0)));
}

int mpi_error_class(int code) {
  int cls = code;
  MPI_Error_class(code, &cls);
  return cls;
}

namespace {

// Set just before MPI_Abort: the exit path must not finalize after it.
std::atomic<bool> abort_called{false};

std::string thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE:
      return "MPI_THREAD_MULTIPLE";
    default:
      return fmt::format("thread level {}", level);
  }
}

// MPI's lifetime in this process: initialized on the first call of ensure(),
// finalized by the destructor of the function-local static at exit (unless
// the job was aborted, or MPI was initialized by someone else, who then also
// finalizes it). Communicators are created after it, so static ones are
// destroyed (and their MPI_Comm freed) before MPI_Finalize.
class MpiRuntime {
 public:
  static void ensure() { static MpiRuntime runtime; }

  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;

  ~MpiRuntime() {
    if (owner_ && !abort_called.load() && !mpi_finalized()) MPI_Finalize();
  }

 private:
  MpiRuntime() {
    if (mpi_finalized()) {
      throw CommError("[mpi] MPI was already finalized in this process; it cannot be used again");
    }
    int provided = MPI_THREAD_SINGLE;
    if (!mpi_initialized()) {
      const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
      if (rc != MPI_SUCCESS) {
        throw CommError("[mpi] MPI_Init_thread failed: " + mpi_error_text(rc));
      }
      owner_ = true;
    } else {
      MPI_Query_thread(&provided);
    }
    if (provided < MPI_THREAD_SERIALIZED) {
      const std::string message = fmt::format(
          "[mpi] MPI provides only {}; sparsecomm needs MPI_THREAD_SERIALIZED or higher",
          thread_level_name(provided));
      if (owner_) MPI_Finalize();
      throw NotSupported(message);
    }
    // Errors on the world (MPI_Comm_dup) are returned, not fatal.
    if (owner_) MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  }

  bool owner_ = false;
};

}  // namespace

void ensure_mpi_runtime() { MpiRuntime::ensure(); }

void note_mpi_abort() { abort_called.store(true); }

}  // namespace sparsecomm
