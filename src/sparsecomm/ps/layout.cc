#include "sparsecomm/ps/layout.h"

#include <limits>

#include <fmt/format.h>

#include "sparsecomm/core/errors.h"

namespace sparsecomm {

ServerLayout::ServerLayout(std::size_t numel, int workers, int servers)
    : numel_(numel), workers_(workers), servers_(servers) {
  if (servers < 1) {
    throw InvalidArgument(
        fmt::format("[ps] {} servers: a parameter-server world needs at least 1 server", servers));
  }
  if (workers < 1) {
    throw InvalidArgument(fmt::format(
        "[ps] {} workers: a parameter-server world needs at least 1 worker besides its {} "
        "server(s); start more ranks or use fewer servers",
        workers, servers));
  }
  if (numel > std::numeric_limits<Index>::max()) {
    throw InvalidArgument(
        fmt::format("[ps] {} parameters: at most {} are supported (32-bit indices)", numel,
                    std::numeric_limits<Index>::max()));
  }
  if (static_cast<std::size_t>(servers) > numel) {
    throw InvalidArgument(
        fmt::format("[ps] {} servers for {} parameters: every server needs a shard of at least one "
                    "parameter; use at most {} servers",
                    servers, numel, numel));
  }
}

ServerLayout ServerLayout::for_world(std::size_t numel, int world_size, int servers) {
  if (servers >= world_size && servers >= 1) {
    throw InvalidArgument(fmt::format(
        "[ps] {} servers in a world of {} ranks: at least one rank must be a worker; use at most "
        "{} servers or start more ranks",
        servers, world_size, world_size - 1));
  }
  return ServerLayout(numel, world_size - servers, servers);
}

Range ServerLayout::shard(int server) const {
  if (server < 0 || server >= servers_) {
    throw InvalidArgument(
        fmt::format("[ps] server {} does not exist (there are {} servers)", server, servers_));
  }
  const auto s = static_cast<std::size_t>(server);
  const auto n = static_cast<std::size_t>(servers_);
  return {s * numel_ / n, (s + 1) * numel_ / n};
}

int ServerLayout::server_index(int rank) const {
  if (!is_server_rank(rank)) {
    throw InvalidArgument(fmt::format("[ps] rank {} is not a server; {}", rank, describe()));
  }
  return rank - workers_;
}

int ServerLayout::server_of(std::size_t index) const {
  if (index >= numel_) {
    throw InvalidArgument(fmt::format("[ps] index {} is outside the {} parameters", index, numel_));
  }
  // floor(s * d / S) <= index  <=>  s <= (index * S + S - 1) / d, roughly;
  // start from the estimate and correct by at most one.
  const auto n = static_cast<std::size_t>(servers_);
  auto s = static_cast<int>(index * n / numel_);
  while (s + 1 < servers_ && shard(s + 1).begin <= index) ++s;
  while (s > 0 && shard(s).begin > index) --s;
  return s;
}

std::string ServerLayout::describe() const {
  return fmt::format("{} worker(s) (ranks 0-{}), {} server(s) (ranks {}-{}), {} parameters",
                     workers_, workers_ - 1, servers_, workers_, world_size() - 1, numel_);
}

}  // namespace sparsecomm
