#include "sparsecomm/comm/host_names.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <span>

#include <fmt/format.h>

#include "sparsecomm/core/errors.h"

namespace sparsecomm {

std::string this_host_name() {
  if (const char* given = std::getenv("SPARSECOMM_HOST_NAME"); given != nullptr && *given != 0) {
    const std::string name(given);
    if (name.size() >= kHostNameBytes) {
      throw InvalidArgument(
          fmt::format("SPARSECOMM_HOST_NAME holds {} bytes; give a host name under {}", name.size(),
                      kHostNameBytes));
    }
    return name;
  }
  std::array<char, kHostNameBytes> name{};
  if (gethostname(name.data(), name.size() - 1) != 0) {
    throw CommError(std::string("[comm] gethostname failed: ") + std::strerror(errno));
  }
  return std::string(name.data());
}

std::vector<int> host_of_each_rank(Communicator& comm) {
  std::array<char, kHostNameBytes> mine{};
  const std::string name = this_host_name();
  std::copy(name.begin(), name.end(), mine.begin());
  const auto world = static_cast<std::size_t>(comm.size());
  std::vector<char> all(world * kHostNameBytes);
  comm.allgather(std::as_bytes(std::span<const char>(mine)),
                 std::as_writable_bytes(std::span<char>(all)));
  std::vector<std::string> names;
  std::vector<int> host(world);
  for (std::size_t r = 0; r < world; ++r) {
    const char* block = all.data() + r * kHostNameBytes;
    const std::string peer(block, strnlen(block, kHostNameBytes));
    const auto known = std::find(names.begin(), names.end(), peer);
    host[r] = static_cast<int>(known - names.begin());
    if (known == names.end()) names.push_back(peer);
  }
  return host;
}

}  // namespace sparsecomm
