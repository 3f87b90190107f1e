#pragma once
// Who is who in a parameter-server world, and which server owns which part
// of the flat parameter vector.
//
// A world of W + S ranks: ranks [0, W) are the workers (so rank 0, the rank
// that writes reports, is a worker), ranks [W, W + S) the servers. Server s
// (rank W + s) owns the contiguous shard [s*d/S, (s+1)*d/S) of the d
// parameters: shard sizes differ by at most one element. Server 0 (rank W)
// also runs the clock/consistency controller.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "sparsecomm/core/sparse.h"

namespace sparsecomm {

class ServerLayout {
 public:
  // `numel` parameters (d), `workers` (W) and `servers` (S). InvalidArgument
  // for W < 1, S < 1, S > d, or d >= 2^32 (indices are 32-bit).
  ServerLayout(std::size_t numel, int workers, int servers);
  // The layout of a world of `world_size` ranks with `servers` of them
  // servers: W = world_size - S (so S < world_size).
  static ServerLayout for_world(std::size_t numel, int world_size, int servers);

  std::size_t numel() const { return numel_; }
  int workers() const { return workers_; }
  int servers() const { return servers_; }
  int world_size() const { return workers_ + servers_; }

  // Shard s's range of the flat vector (0 <= s < S).
  Range shard(int server) const;
  int server_rank(int server) const { return workers_ + server; }
  int worker_rank(int worker) const { return worker; }
  bool is_server_rank(int rank) const { return rank >= workers_ && rank < world_size(); }
  bool is_worker_rank(int rank) const { return rank >= 0 && rank < workers_; }
  // Index of the server at `rank` (InvalidArgument if it is not a server).
  int server_index(int rank) const;
  // The server that owns flat index i.
  int server_of(std::size_t index) const;
  // The controller's rank (server 0).
  int controller_rank() const { return workers_; }

  // "3 workers (ranks 0-2), 2 servers (ranks 3-4), 1000 parameters".
  std::string describe() const;

 private:
  std::size_t numel_;
  int workers_;
  int servers_;
};

}  // namespace sparsecomm
