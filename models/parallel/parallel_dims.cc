#include "models/parallel/parallel_dims.h"

#include <map>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace shardmap {
namespace {

bool KnownAxis(const std::string& name) {
  for (const char* a : axis::kOrder) {
    if (name == a) return true;
  }
  return false;
}

std::string AxisList() { return absl::StrJoin(axis::kOrder, ", "); }

}  // namespace

absl::StatusOr<Mesh> ParseMesh(const std::string& text) {
  std::map<std::string, int> sizes;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    std::vector<std::string> kv = absl::StrSplit(part, '=');
    int n = 0;
    if (kv.size() != 2 || !absl::SimpleAtoi(kv[1], &n)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--mesh: '", part, "' is not axis=size (e.g. \"dp=2,tp=2\")"));
    }
    if (!KnownAxis(kv[0])) {
      return absl::InvalidArgumentError(absl::StrCat("--mesh: unknown axis '", kv[0],
                                                     "'; the axes are ", AxisList()));
    }
    if (n < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--mesh: axis '", kv[0], "' has size ", n, " (< 1)"));
    }
    if (!sizes.emplace(kv[0], n).second) {
      return absl::InvalidArgumentError(absl::StrCat("--mesh: axis '", kv[0], "' is given twice"));
    }
  }
  std::vector<std::pair<std::string, int>> axes;
  for (const char* a : axis::kOrder) {
    if (sizes.count(a)) axes.emplace_back(a, sizes[a]);
  }
  return Mesh::Create(axes);
}

absl::StatusOr<ParallelDims> ParallelDims::Create(const Mesh& mesh, bool sp) {
  for (const std::string& name : mesh.axis_names()) {
    if (!KnownAxis(name)) {
      return absl::InvalidArgumentError(absl::StrCat("GPT mesh ", mesh.ShortString(),
                                                     ": unknown axis '", name, "'; use ",
                                                     AxisList(), " (ParseMesh)"));
    }
  }
  const std::vector<std::string>& names = mesh.axis_names();
  for (size_t i = 0; i + 1 < names.size(); ++i) {
    if (names[i] == axis::kTp) {
      return absl::InvalidArgumentError(absl::StrCat(
          "GPT mesh ", mesh.ShortString(), ": tp must be the last axis (ParseMesh orders them)"));
    }
  }
  if (mesh.AxisIndex(axis::kPp) > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GPT mesh ", mesh.ShortString(), ": pp must be the first axis (ParseMesh orders them)"));
  }
  ParallelDims d;
  d.mesh_ = mesh;
  d.sp_ = sp;
  if (sp && !d.has(axis::kTp)) {
    return absl::InvalidArgumentError(
        "--sp (sequence parallelism) needs a tp axis in the mesh (e.g. dp=2,tp=2)");
  }
  for (const char* a : axis::kBatch) {
    if (d.has(a)) d.batch_axes_.push_back(a);
  }
  return d;
}

int ParallelDims::size(const char* axis) const {
  const int i = mesh_.AxisIndex(axis);
  return i < 0 ? 1 : mesh_.axis_size(i);
}

int ParallelDims::batch_ways() const {
  int n = 1;
  for (const std::string& a : batch_axes_) n *= size(a.c_str());
  return n;
}

}  // namespace shardmap
