#pragma once
// A communicator over some ranks of another (the ranks of one host, the
// hosts' leaders): rank i of the view is rank members[i] of `world`.
// Point-to-point goes to `world` with the peer translated, on the same tag;
// the collectives are Communicator's defaults over it (no native ones).
//
// Views of one world live side by side when no pair of ranks talks in two
// of them (a host's view and the leaders' view never share a pair: two
// leaders are never on one host) or, where a pair does talk in two (a view
// and the world itself), both ranks enter their collectives in the same
// order: messages from one rank to another on one tag arrive in the order
// they were sent.

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "sparsecomm/comm/communicator.h"

namespace sparsecomm {

class GroupView final : public Communicator {
 public:
  // `members`: ascending ranks of `world`, this rank among them;
  // InvalidArgument otherwise. Takes `world`'s timeout.
  GroupView(Communicator& world, std::vector<int> members);

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }
  std::string_view backend() const override { return world_.backend(); }
  Request isend(std::span<const std::byte> data, int dst, int tag) override;
  Request irecv(std::span<std::byte> data, int src, int tag) override;

  // Bytes this rank has sent and posted to receive through the view.
  std::uint64_t bytes_sent() const { return bytes_sent_; }
  std::uint64_t bytes_received() const { return bytes_received_; }

  // The world rank of the view's rank `member`.
  int world_rank(int member) const { return members_[static_cast<std::size_t>(member)]; }
  std::span<const int> members() const { return members_; }

 private:
  Communicator& world_;
  std::vector<int> members_;
  int rank_ = 0;
  std::uint64_t bytes_sent_ = 0;
  std::uint64_t bytes_received_ = 0;
};

}  // namespace sparsecomm
