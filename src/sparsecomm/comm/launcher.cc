#include "sparsecomm/comm/launcher.h"

#include <charconv>
#include <cstdlib>
#include <cstring>

namespace sparsecomm {

bool launched_by_mpirun() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"}) {
    if (std::getenv(name) != nullptr) return true;
  }
  return false;
}

std::optional<int> launcher_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"}) {
    const char* text = std::getenv(name);
    if (text == nullptr) continue;
    const char* end = text + std::strlen(text);
    int rank = -1;
    const auto [last, error] = std::from_chars(text, end, rank);
    if (error == std::errc{} && last == end && rank >= 0) return rank;
  }
  return std::nullopt;
}

}  // namespace sparsecomm
