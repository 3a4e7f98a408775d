#include "spmd_testing/one_device.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "autograd/value_and_grad.h"
#include "spmd_testing/placement.h"
#include "tensor/testing/compare.h"

namespace shardmap::spmd_testing {
namespace {

std::vector<int64_t> Unflatten(int64_t flat, const Shape& shape) {
  std::vector<int64_t> idx(shape.size());
  for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
    idx[d] = flat % shape[d];
    flat /= shape[d];
  }
  return idx;
}

std::string IndexString(const std::vector<int64_t>& idx) {
  return absl::StrCat("[", absl::StrJoin(idx, ","), "]");
}

// The first rank whose shard holds global index idx, and the index there.
std::string Holder(const Mesh& mesh, const PartitionSpec& spec, const Shape& global,
                   const std::vector<int64_t>& idx) {
  std::vector<int64_t> local = idx;
  for (int rank = 0; rank < mesh.size(); ++rank) {
    bool holds = true;
    for (int d = 0; d < spec.size() && d < static_cast<int>(global.size()); ++d) {
      const int blocks = spec.NumBlocks(mesh, d);
      const int64_t block_size = global[d] / blocks;
      if (block_size == 0) continue;
      holds = holds && spec.BlockIndex(mesh, rank, d) == idx[d] / block_size;
      local[d] = idx[d] % block_size;
    }
    if (holds) {
      std::string s = absl::StrCat(RankDescription(mesh, rank), ", local ",
                                   IndexString(local));
      if (!spec.unreduced().empty()) {
        absl::StrAppend(&s, "; summed over ", absl::StrJoin(spec.unreduced(), ","));
      }
      return s;
    }
  }
  return "no rank";
}

Mesh OneDeviceMesh(const MeshAxes& axes) {
  MeshAxes ones = axes;
  for (auto& a : ones) a.second = 1;
  return *Mesh::Create(ones);
}

ShardMap WithPlacement(const ShardMap& f, const DevicePlacement& placement) {
  ShardMapOptions o = f.options();
  o.placement = placement;
  o.collective_log = nullptr;
  return shard_map(f.fn(), f.mesh(), f.in_specs(), f.out_specs(), o);
}

// "output 1 (y)" or "output 1".
std::string Named(const char* kind, size_t k, const std::vector<std::string>& names) {
  if (k < names.size()) return absl::StrCat(kind, " ", k, " (", names[k], ")");
  return absl::StrCat(kind, " ", k);
}

struct Run {
  std::vector<Tensor> outputs;
  std::vector<Tensor> grads;
};

absl::StatusOr<Run> RunOnce(const ShardMap& f, const std::vector<Tensor>& inputs, bool grads) {
  if (grads) {
    absl::StatusOr<ShardMapGrads> r = value_and_grad(f)(inputs);
    if (!r.ok()) return r.status();
    return Run{std::move(r->outputs), std::move(r->grads)};
  }
  absl::StatusOr<std::vector<Tensor>> r = f(inputs);
  if (!r.ok()) return r.status();
  return Run{std::move(*r), {}};
}

}  // namespace

Tolerance DefaultTolerance(DType dtype) {
  switch (dtype) {
    case DType::kF64: return {1e-12, 1e-12};
    case DType::kF32: return {1e-5, 1e-5};
    case DType::kF16: return {2e-3, 2e-3};
    case DType::kBF16: return {1.6e-2, 1.6e-2};
    default: return {0, 0};
  }
}

std::string MeshAxesToString(const MeshAxes& axes) {
  std::vector<std::string> parts;
  for (const auto& [name, size] : axes) parts.push_back(absl::StrCat(name, ":", size));
  return absl::StrCat("{", absl::StrJoin(parts, ","), "}");
}

std::string CompareAssembled(const Mesh& mesh, const PartitionSpec& spec, const std::string& what,
                             const Tensor& got, const Tensor& want, const Tolerance& tol) {
  ::testing::AssertionResult near = ::shardmap::testing::TensorsNear(got, want, tol.atol, tol.rtol);
  if (near) return "";
  std::string out = absl::StrCat(what, ": ", near.message());
  if (got.dtype() != want.dtype() || got.shape() != want.shape()) return out;
  // The element TensorsNear calls the worst (the largest difference among those out of
  // tolerance), compared one by one with the same rules, to say which rank holds it.
  const Tensor g = got.To(Device::Cpu()), w = want.To(Device::Cpu());
  int64_t worst = -1;
  double worst_diff = -1;
  for (int64_t i = 0; i < g.numel(); ++i) {
    const Tensor gi = Tensor::FromVector<double>({1}, {g.at(i)});
    const Tensor wi = Tensor::FromVector<double>({1}, {w.at(i)});
    if (::shardmap::testing::TensorsNear(gi, wi, tol.atol, tol.rtol)) continue;
    const double d = ::shardmap::testing::MaxAbsDiff(gi, wi);
    if (d > worst_diff) worst_diff = d, worst = i;
  }
  if (worst >= 0) {
    absl::StrAppend(&out, "; that element is ", LocateElement(mesh, spec, g.shape(), worst));
  }
  absl::StrAppend(&out, " (", DTypeName(g.dtype()), " tolerance)");
  return out;
}

std::string LocateElement(const Mesh& mesh, const PartitionSpec& spec, const Shape& shape,
                          int64_t flat) {
  const std::vector<int64_t> idx = Unflatten(flat, shape);
  return absl::StrCat(IndexString(idx), " (", Holder(mesh, spec, shape, idx), ")");
}

::testing::AssertionResult ShardedMatchesOneDevice(const ShardMapFactory& factory,
                                                   const std::vector<MeshAxes>& meshes,
                                                   const std::vector<Tensor>& inputs,
                                                   const OneDeviceOptions& options) {
  std::vector<std::string> problems;
  const DevicePlacement placement = options.placement.value_or(TestPlacement());
  for (const MeshAxes& axes : meshes) {
    const std::string label = absl::StrCat("mesh ", MeshAxesToString(axes));
    absl::StatusOr<Mesh> mesh = Mesh::Create(axes);
    if (!mesh.ok()) {
      problems.push_back(absl::StrCat(label, ": ", mesh.status().ToString()));
      continue;
    }
    const ShardMap sharded = WithPlacement(factory(*mesh), placement);
    const ShardMap single = WithPlacement(factory(OneDeviceMesh(axes)), DevicePlacement::Cpu());
    absl::StatusOr<Run> want = RunOnce(single, inputs, options.gradients);
    if (!want.ok()) {
      problems.push_back(absl::StrCat(label, ": the one-device run failed: ",
                                      want.status().ToString()));
      continue;
    }
    absl::StatusOr<Run> got = RunOnce(sharded, inputs, options.gradients);
    if (!got.ok()) {
      problems.push_back(
          absl::StrCat(label, ": the sharded run failed: ", got.status().ToString()));
      continue;
    }
    auto compare = [&](const PartitionSpec& spec, const std::string& what, const Tensor& g,
                       const Tensor& w) {
      if (!g.defined() && !w.defined()) return;
      const Tolerance tol = options.tolerance.value_or(DefaultTolerance(w.dtype()));
      std::string p = CompareAssembled(*mesh, spec, what, g, w, tol);
      if (!p.empty()) problems.push_back(absl::StrCat(label, ": ", p));
    };
    for (size_t k = 0; k < want->outputs.size() && k < got->outputs.size(); ++k) {
      compare(sharded.out_specs()[k], Named("output", k, sharded.options().output_names),
              got->outputs[k], want->outputs[k]);
    }
    const std::vector<PartitionSpec> grad_specs = sharded.GradientSpecs();
    for (size_t k = 0; k < want->grads.size() && k < got->grads.size(); ++k) {
      compare(grad_specs[k],
              absl::StrCat("gradient of ", Named("input", k, sharded.options().input_names)),
              got->grads[k], want->grads[k]);
    }
  }
  if (problems.empty()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << absl::StrJoin(problems, "\n");
}

}  // namespace shardmap::spmd_testing
