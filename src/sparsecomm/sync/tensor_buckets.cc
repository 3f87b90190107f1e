#include "sparsecomm/sync/tensor_buckets.h"

namespace sparsecomm {

std::vector<Range> tensor_buckets(std::span<const std::size_t> tensor_bytes,
                                  std::size_t bucket_bytes) {
  std::vector<Range> buckets;
  if (tensor_bytes.empty()) return buckets;
  if (bucket_bytes == 0) return {Range{0, tensor_bytes.size()}};
  std::size_t end = tensor_bytes.size();
  std::size_t bytes = 0;
  for (std::size_t i = tensor_bytes.size(); i-- > 0;) {
    bytes += tensor_bytes[i];
    if (bytes >= bucket_bytes || i == 0) {
      buckets.push_back({i, end});
      end = i;
      bytes = 0;
    }
  }
  return buckets;
}

}  // namespace sparsecomm
