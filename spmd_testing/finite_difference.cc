#include "spmd_testing/finite_difference.h"

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "autograd/value_and_grad.h"
#include "spmd_testing/placement.h"

namespace shardmap::spmd_testing {
namespace {

// Evenly spread flat indices of an n-element tensor, first and last included.
std::vector<int64_t> Probes(int64_t n, int max_probes) {
  std::vector<int64_t> idx;
  if (n <= max_probes) {
    for (int64_t i = 0; i < n; ++i) idx.push_back(i);
    return idx;
  }
  for (int k = 0; k < max_probes; ++k) idx.push_back(k * (n - 1) / (max_probes - 1));
  return idx;
}

absl::StatusOr<double> Loss(const ShardMap& f, const std::vector<Tensor>& inputs) {
  absl::StatusOr<std::vector<Tensor>> out = f(inputs);
  if (!out.ok()) return out.status();
  if (out->empty() || (*out)[0].numel() != 1) {
    return absl::InvalidArgumentError("output 0 of the shard_map must be the scalar loss");
  }
  return (*out)[0].item();
}

std::string Name(const ShardMap& f, size_t k) {
  const auto& names = f.options().input_names;
  return k < names.size() ? absl::StrCat("input ", k, " (", names[k], ")")
                          : absl::StrCat("input ", k);
}

}  // namespace

::testing::AssertionResult GradientsMatchFiniteDifferences(
    const ShardMap& f_in, const std::vector<Tensor>& inputs,
    const FiniteDifferenceOptions& options) {
  ShardMapOptions o = f_in.options();
  o.placement = options.placement.value_or(TestPlacement());
  o.collective_log = nullptr;
  const ShardMap f = shard_map(f_in.fn(), f_in.mesh(), f_in.in_specs(), f_in.out_specs(), o);
  MeshAxes axes;
  for (int a = 0; a < f.mesh().num_axes(); ++a) {
    axes.push_back({f.mesh().axis_names()[a], f.mesh().axis_size(a)});
  }
  const std::string mesh = MeshAxesToString(axes);
  for (size_t k = 0; k < inputs.size(); ++k) {
    if (IsFloating(inputs[k].dtype()) && inputs[k].dtype() != DType::kF64) {
      return ::testing::AssertionFailure()
             << Name(f, k) << " is " << DTypeName(inputs[k].dtype())
             << ": finite differences need f64 inputs (Cast(x, DType::kF64), or build them in "
                "f64)";
    }
  }
  absl::StatusOr<ShardMapGrads> g = value_and_grad(f)(inputs);
  if (!g.ok()) {
    return ::testing::AssertionFailure() << "value_and_grad on " << mesh
                                         << " failed: " << g.status();
  }
  std::vector<std::string> problems;
  // Where each gradient element lives: an R input's gradient is summed over those axes.
  const std::vector<PartitionSpec> grad_specs = f.GradientSpecs();
  std::vector<Tensor> probe(inputs.begin(), inputs.end());
  for (size_t k = 0; k < inputs.size(); ++k) {
    if (!IsFloating(inputs[k].dtype())) continue;
    const Tensor base = inputs[k].To(Device::Cpu());
    const Tensor grad = g->grads[k].To(Device::Cpu());
    for (int64_t i : Probes(base.numel(), options.max_probes)) {
      Tensor t = base.Clone();
      double* p = t.data<double>();
      const double x = p[i];
      p[i] = x + options.eps;
      probe[k] = t;
      absl::StatusOr<double> up = Loss(f, probe);
      p[i] = x - options.eps;
      absl::StatusOr<double> down = Loss(f, probe);
      probe[k] = inputs[k];
      if (!up.ok() || !down.ok()) {
        return ::testing::AssertionFailure()
               << "forward run on " << mesh << " failed: " << (up.ok() ? down : up).status();
      }
      const double fd = (*up - *down) / (2 * options.eps);
      const double got = grad.at(i);
      const double tol = options.tolerance.atol + options.tolerance.rtol * std::fabs(fd);
      if (!(std::fabs(got - fd) <= tol)) {
        problems.push_back(absl::StrCat(
            "mesh ", mesh, ": d loss / d ", Name(f, k), " ", base.ShapeString(), " at ",
            LocateElement(f.mesh(), grad_specs[k], base.shape(), i), ": value_and_grad ", got,
            ", finite difference ", fd, " |diff| ", std::fabs(got - fd), " > tol ", tol));
      }
    }
  }
  if (problems.empty()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << absl::StrJoin(problems, "\n");
}

}  // namespace shardmap::spmd_testing
