#include "sparsecomm/comm/group_view.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "sparsecomm/core/errors.h"

namespace sparsecomm {

GroupView::GroupView(Communicator& world, std::vector<int> members)
    : world_(world), members_(std::move(members)) {
  const bool ascending = std::adjacent_find(members_.begin(), members_.end(),
                                            [](int a, int b) { return a >= b; }) == members_.end();
  const bool in_world =
      !members_.empty() && members_.front() >= 0 && members_.back() < world.size();
  const auto self = std::find(members_.begin(), members_.end(), world.rank());
  if (!ascending || !in_world || self == members_.end()) {
    throw InvalidArgument(world.where() +
                          fmt::format("a group of ranks [{}] must be ascending ranks of the world "
                                      "of {} that include this rank",
                                      fmt::join(members_, ", "), world.size()));
  }
  rank_ = static_cast<int>(self - members_.begin());
  set_timeout(world.timeout());
}

Request GroupView::isend(std::span<const std::byte> data, int dst, int tag) {
  check_peer_and_tag(dst, tag, "isend");
  bytes_sent_ += data.size();
  return world_.isend(data, world_rank(dst), tag);
}

Request GroupView::irecv(std::span<std::byte> data, int src, int tag) {
  check_peer_and_tag(src, tag, "irecv");
  bytes_received_ += data.size();
  return world_.irecv(data, world_rank(src), tag);
}

}  // namespace sparsecomm
