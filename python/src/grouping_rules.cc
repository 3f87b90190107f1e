// dense_tensors and tensor_buckets: the trainer's rules, so that the DDP
// hook groups tensors as the CLI does (--min-numel, --exclude, --bucket-mb).

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include <pybind11/stl.h>

#include "bindings.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/core/sparse.h"
#include "sparsecomm/sync/dense_layers.h"
#include "sparsecomm/sync/tensor_buckets.h"

namespace py = pybind11;

namespace sparsecomm::python {

// The trainer's rules, so that the DDP hook groups tensors as the CLI does.
void bind_grouping_rules(py::module_& m) {
  m.def(
      "dense_tensors",
      [](const std::vector<std::string>& names, const std::vector<std::size_t>& numels,
         std::size_t min_numel, const std::vector<std::string>& patterns) {
        if (names.size() != numels.size()) {
          throw InvalidArgument("dense_tensors: names and numels differ in length");
        }
        std::vector<LayerSpan> layers;
        for (std::size_t i = 0; i < names.size(); ++i) layers.push_back({names[i], 0, numels[i]});
        const DenseLayerRule rule{min_numel, patterns};
        dense_numel(rule, layers, "DDP",
                    {.min_numel = "min_numel",
                     .exclude = "exclude pattern",
                     .all_dense = "or use DDP's own all-reduce"});
        std::vector<bool> dense;
        for (const LayerSpan& layer : layers) dense.push_back(rule.matches(layer));
        return dense;
      },
      py::arg("names"), py::arg("numels"), py::arg("min_numel"), py::arg("patterns"),
      "Which tensors min_numel and the exclude patterns send densely (the CLI's --min-numel "
      "and --exclude); ValueError for a pattern that matches nothing or a rule that leaves "
      "nothing to sparsify.");
  m.def(
      "tensor_buckets",
      [](const std::vector<std::size_t>& tensor_bytes, std::size_t bucket_bytes) {
        std::vector<std::pair<std::size_t, std::size_t>> out;
        for (const Range& r : tensor_buckets(tensor_bytes, bucket_bytes)) {
          out.emplace_back(r.begin, r.end);
        }
        return out;
      },
      py::arg("tensor_bytes"), py::arg("bucket_bytes"),
      "Buckets of whole tensors as the CLI's --bucket-mb forms them: in reverse order, each "
      "closed at bucket_bytes or more; (begin, end) index ranges, in backward order.");
}

}  // namespace sparsecomm::python
