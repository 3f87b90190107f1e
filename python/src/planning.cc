// The CLI's methods and their options, and the checks and choices of
// sparsecomm's planning (python/sparsecomm/planning.py): train's
// --density auto for a loop of one's own, and a convergence profile's checks.

#include <optional>
#include <string>
#include <vector>

#include <pybind11/stl.h>
#include <nlohmann/json.hpp>

#include "bindings.h"
#include "sparsecomm/core/errors.h"
#include "sparsecomm/perf/convergence.h"
#include "sparsecomm/perf/cost_profile.h"
#include "sparsecomm/perf/step_model.h"
#include "sparsecomm/sparsify/options.h"
#include "sparsecomm/sync/gradient_sync.h"

namespace py = pybind11;

namespace sparsecomm::python {

void bind_planning(py::module_& m) {
  // sparsecomm.choose_density (planning.py): train's --density auto for a
  // loop of one's own.
  m.def(
      "_choose_configuration",
      [](const std::string& convergence, const std::string& method,
         std::optional<double> target_loss, std::optional<double> target_accuracy, double link_gbit,
         double latency_us, const std::string& network_profile, std::optional<double> compute_s,
         int ranks, double numel, int local_steps, const std::string& options) {
        const perf::ConvergenceProfile profile = perf::load_convergence_profile(convergence);
        const perf::Target target =
            perf::target_from_flags(target_loss, target_accuracy, "choose_density");
        const std::vector<perf::ConfigurationOutcome> outcomes = perf::outcomes(profile, target);
        const perf::Scenario base{.ranks = ranks > 0 ? ranks : profile.ranks,
                                  .numel = numel,
                                  .compute_s = compute_s.value_or(profile.compute_s)};
        const perf::CostProfile network = network_profile.empty()
                                              ? perf::network_profile(link_gbit, latency_us)
                                              : perf::load_profile(network_profile);
        // Any method (method ""): every configuration of these rounds, with
        // its own options, which the result names.
        const std::optional<perf::DensityChoice> choice =
            method.empty() ? perf::choose_configuration(
                                 outcomes,
                                 [&](const perf::ConfigurationOutcome& o) {
                                   return o.local_steps == local_steps && !o.overlap;
                                 },
                                 base, network)
                           : perf::choose_configuration(outcomes, method, local_steps, false,
                                                        options, base, network);
        if (!choice) {
          throw InvalidArgument("choose_density: " + convergence + " has no configuration of " +
                                (method.empty() ? std::string("any method") : method) +
                                " with these rounds and options that reached " +
                                perf::describe(target) + " on every seed");
        }
        py::dict out;
        out["method"] = choice->outcome->method;
        out["density"] = choice->outcome->density;
        out["options"] = choice->outcome->options;
        out["configuration"] = choice->outcome->label;
        out["steps"] = choice->outcome->steps;
        out["step_s"] = choice->step_s;
        out["time_s"] = choice->time_s;
        out["profile_model"] = profile.model;
        return out;
      },
      py::arg("convergence"), py::arg("method"), py::arg("target_loss"), py::arg("target_accuracy"),
      py::arg("link_gbit"), py::arg("latency_us"), py::arg("network_profile"), py::arg("compute_s"),
      py::arg("ranks"), py::arg("numel"), py::arg("local_steps"), py::arg("options"));

  // sparsecomm.write_convergence_profile (planning.py): the checks
  // `plan` and --density auto apply when they read the file.
  m.def(
      "_check_convergence_profile",
      [](const std::string& text, const std::string& origin) {
        nlohmann::json json;
        try {
          json = nlohmann::json::parse(text);
        } catch (const nlohmann::json::exception& e) {
          throw InvalidArgument(origin + ": not JSON: " + e.what());
        }
        perf::convergence_profile_from_json(json, origin);
      },
      py::arg("text"), py::arg("origin"));

  m.def("methods", [] {
    std::vector<std::string> names;
    for (const SyncMethodInfo& info : sync_methods()) names.push_back(info.name);
    return names;
  });

  m.def(
      "device_methods",
      [] {
        std::vector<std::string> names;
        for (const SyncMethodInfo& info : sync_methods()) {
          if (info.device_path) names.push_back(info.name);
        }
        return names;
      },
      "The methods the DDP hook can run on the gradients' own device (selection='device').");

  m.def(
      "method_options",
      [](const std::string& method) {
        std::vector<std::string> names;
        for (const OptionSpec& option : sync_method(method).options) names.push_back(option.name);
        return names;
      },
      py::arg("method"));

  m.def("round_options", &round_options, py::arg("method"), py::arg("options"),
        "The options `method` runs with on local steps' rounds (the CLI's rule: the "
        "spike clip off unless clip_ratio is given).");
}

}  // namespace sparsecomm::python
