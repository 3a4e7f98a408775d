#include "shardmap/partition_spec.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace shardmap {

namespace {

PartitionSpec Spec(std::initializer_list<AxisNames*> dims) {
  std::vector<std::vector<std::string>> out;
  out.reserve(dims.size());
  for (AxisNames* d : dims) out.push_back(std::move(d->names));
  return PartitionSpec(std::move(out));
}

}  // namespace

PartitionSpec P() { return PartitionSpec(); }
PartitionSpec P(AxisNames d0) { return Spec({&d0}); }
PartitionSpec P(AxisNames d0, AxisNames d1) { return Spec({&d0, &d1}); }
PartitionSpec P(AxisNames d0, AxisNames d1, AxisNames d2) { return Spec({&d0, &d1, &d2}); }
PartitionSpec P(AxisNames d0, AxisNames d1, AxisNames d2, AxisNames d3) {
  return Spec({&d0, &d1, &d2, &d3});
}
PartitionSpec P(AxisNames d0, AxisNames d1, AxisNames d2, AxisNames d3, AxisNames d4) {
  return Spec({&d0, &d1, &d2, &d3, &d4});
}
PartitionSpec P(AxisNames d0, AxisNames d1, AxisNames d2, AxisNames d3, AxisNames d4,
                AxisNames d5) {
  return Spec({&d0, &d1, &d2, &d3, &d4, &d5});
}
PartitionSpec P(AxisNames d0, AxisNames d1, AxisNames d2, AxisNames d3, AxisNames d4,
                AxisNames d5, AxisNames d6) {
  return Spec({&d0, &d1, &d2, &d3, &d4, &d5, &d6});
}
PartitionSpec P(AxisNames d0, AxisNames d1, AxisNames d2, AxisNames d3, AxisNames d4,
                AxisNames d5, AxisNames d6, AxisNames d7) {
  return Spec({&d0, &d1, &d2, &d3, &d4, &d5, &d6, &d7});
}

PartitionSpec PartitionSpec::Unreduced(std::vector<std::string> axes) const {
  PartitionSpec s = *this;
  s.unreduced_ = std::move(axes);
  return s;
}

absl::Status PartitionSpec::ValidateAxes(const Mesh& mesh, const std::string& what) const {
  AxisMask used = 0;
  auto check = [&](const std::string& a) -> absl::Status {
    int i = mesh.AxisIndex(a);
    if (i < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "spec ", ToString(), " of '", what, "' names unknown mesh axis '", a, "' (mesh ",
          mesh.ShortString(), "); use one of the mesh's axis names"));
    }
    if (used & (1u << i)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "spec ", ToString(), " of '", what, "' uses mesh axis '", a,
          "' twice; an axis may split at most one dim (list several axes in one dim instead)"));
    }
    used |= 1u << i;
    return absl::OkStatus();
  };
  for (const auto& dim : dims_) {
    for (const std::string& a : dim) {
      if (absl::Status s = check(a); !s.ok()) return s;
    }
  }
  for (const std::string& a : unreduced_) {
    if (absl::Status s = check(a); !s.ok()) return s;
  }
  // Several axes on one dim must come in mesh order: collectives over several axes order their
  // devices that way, so any other order would silently permute the blocks.
  for (size_t d = 0; d < dims_.size(); ++d) {
    for (size_t k = 1; k < dims_[d].size(); ++k) {
      if (mesh.AxisIndex(dims_[d][k - 1]) > mesh.AxisIndex(dims_[d][k])) {
        return absl::InvalidArgumentError(absl::StrCat(
            "spec ", ToString(), " of '", what, "' lists axes (", absl::StrJoin(dims_[d], ","),
            ") for dim ", d, " out of mesh order (", mesh.ShortString(),
            "); list them in mesh order (first = major), or build a mesh with that axis order"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status PartitionSpec::Validate(const Mesh& mesh, absl::Span<const int64_t> global_shape,
                                     const std::string& what) const {
  if (absl::Status s = ValidateAxes(mesh, what); !s.ok()) return s;
  if (size() > static_cast<int>(global_shape.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec ", ToString(), " of '", what, "' has ", size(), " dims but the tensor ",
        ShapeToString(global_shape), " has rank ", global_shape.size(),
        "; drop the trailing entries"));
  }
  for (int d = 0; d < size(); ++d) {
    if (dims_[d].empty()) continue;
    int prod = NumBlocks(mesh, d);
    if (global_shape[d] % prod != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "while splitting dim ", d, " of '", what, "' (size ", global_shape[d], ") over axes (",
          absl::StrJoin(dims_[d], ","), ") of product ", prod, ": ", global_shape[d],
          " is not divisible by ", prod,
          "; pad the dim, change the mesh, or use split_sizes with an uneven collective"));
    }
  }
  return absl::OkStatus();
}

int PartitionSpec::NumBlocks(const Mesh& mesh, int d) const {
  int n = 1;
  for (const std::string& a : dims_[d]) n *= mesh.axis_size(mesh.AxisIndex(a));
  return n;
}

int PartitionSpec::BlockIndex(const Mesh& mesh, int rank, int d) const {
  int idx = 0;
  for (const std::string& a : dims_[d]) {
    int i = mesh.AxisIndex(a);
    idx = idx * mesh.axis_size(i) + mesh.Coord(rank, i);
  }
  return idx;
}

Shape PartitionSpec::LocalShape(const Mesh& mesh, absl::Span<const int64_t> global_shape) const {
  Shape s(global_shape.begin(), global_shape.end());
  for (int d = 0; d < size() && d < static_cast<int>(s.size()); ++d) s[d] /= NumBlocks(mesh, d);
  return s;
}

Shape PartitionSpec::GlobalShape(const Mesh& mesh, absl::Span<const int64_t> local_shape) const {
  Shape s(local_shape.begin(), local_shape.end());
  for (int d = 0; d < size() && d < static_cast<int>(s.size()); ++d) s[d] *= NumBlocks(mesh, d);
  return s;
}

SpmdType PartitionSpec::InputType(const Mesh& mesh, AxisType unnamed) const {
  SpmdType t(mesh.num_axes(), unnamed);
  t.set_mesh_id(mesh.id());
  for (int d = 0; d < size(); ++d) {
    for (const std::string& a : dims_[d]) t[mesh.AxisIndex(a)] = AxisType::Sharded(d);
  }
  for (const std::string& a : unreduced_) t[mesh.AxisIndex(a)] = AxisType::P();
  return t;
}

AxisMask PartitionSpec::ShardedMask(const Mesh& mesh) const {
  AxisMask m = 0;
  for (const auto& dim : dims_) {
    for (const std::string& a : dim) m |= 1u << mesh.AxisIndex(a);
  }
  return m;
}

AxisMask PartitionSpec::UnreducedMask(const Mesh& mesh) const {
  AxisMask m = 0;
  for (const std::string& a : unreduced_) m |= 1u << mesh.AxisIndex(a);
  return m;
}

std::string PartitionSpec::ToString() const {
  std::vector<std::string> parts;
  for (const auto& dim : dims_) {
    if (dim.empty()) {
      parts.push_back("None");
    } else if (dim.size() == 1) {
      parts.push_back(dim[0]);
    } else {
      parts.push_back(absl::StrCat("(", absl::StrJoin(dim, ","), ")"));
    }
  }
  std::string s = absl::StrCat("P(", absl::StrJoin(parts, ","));
  if (!unreduced_.empty()) {
    absl::StrAppend(&s, parts.empty() ? "" : ", ", "unreduced=", absl::StrJoin(unreduced_, ","));
  }
  return s + ")";
}

}  // namespace shardmap
