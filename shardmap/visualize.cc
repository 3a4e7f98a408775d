#include "shardmap/visualize.h"

#include <algorithm>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "shardmap/runtime/context.h"

namespace shardmap {

namespace {

std::string Range(const char* what, int64_t lo, int64_t len) {
  if (len == 1) return absl::StrCat(what, " ", lo);
  return absl::StrCat(what, " ", lo, "-", lo + len - 1);
}

std::string Pad(std::string s, size_t w) {
  if (s.size() < w) s.append(w - s.size(), ' ');
  return s;
}

}  // namespace

std::string VisualizeSharding(const Mesh& mesh, const PartitionSpec& spec,
                              absl::Span<const int64_t> global_shape) {
  std::string out = absl::StrCat(ShapeToString(global_shape), " sharded ", spec.ToString(),
                                 " over ", mesh.ShortString(), "\n");
  if (absl::Status s = spec.Validate(mesh, global_shape, "value"); !s.ok()) {
    return out + "  (invalid: " + std::string(s.message()) + ")\n";
  }
  const int rank = static_cast<int>(global_shape.size());
  int nr = rank >= 1 && spec.size() >= 1 ? spec.NumBlocks(mesh, 0) : 1;
  int nc = rank >= 2 && spec.size() >= 2 ? spec.NumBlocks(mesh, 1) : 1;
  // For dims past 1 that are sharded, a cell lists the ranks of every block along them.
  std::vector<std::vector<std::vector<int>>> cells(nr, std::vector<std::vector<int>>(nc));
  for (int r = 0; r < mesh.size(); ++r) {
    int i = rank >= 1 && spec.size() >= 1 ? spec.BlockIndex(mesh, r, 0) : 0;
    int j = rank >= 2 && spec.size() >= 2 ? spec.BlockIndex(mesh, r, 1) : 0;
    cells[i][j].push_back(r);
  }
  int64_t rl = rank >= 1 ? global_shape[0] / nr : 1;
  int64_t cl = rank >= 2 ? global_shape[1] / nc : 1;
  std::vector<std::vector<std::string>> text(nr + 1, std::vector<std::string>(nc + 1));
  for (int j = 0; j < nc; ++j) text[0][j + 1] = rank >= 2 ? Range("cols", j * cl, cl) : "";
  for (int i = 0; i < nr; ++i) {
    text[i + 1][0] = rank >= 1 ? Range("rows", i * rl, rl) : "scalar";
    for (int j = 0; j < nc; ++j) text[i + 1][j + 1] = absl::StrJoin(cells[i][j], ",");
  }
  size_t w = 0;
  for (auto& row : text) {
    for (auto& c : row) w = std::max(w, c.size());
  }
  for (auto& row : text) {
    std::string line = "  ";
    for (auto& c : row) line += Pad(c, w + 2);
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  for (int d = 2; d < spec.size(); ++d) {
    if (!spec.dim_axes(d).empty()) {
      absl::StrAppend(&out, "  dim ", d, " is split over (", absl::StrJoin(spec.dim_axes(d), ","),
                      "): each cell lists the ranks of all its blocks\n");
    }
  }
  return out;
}

std::string Visualize(const Value& v) {
  RankContext& ctx = RankContext::Get("Visualize");
  const Mesh& mesh = ctx.mesh();
  std::vector<std::vector<std::string>> dims(std::max(v.rank(), 0));
  std::vector<std::string> notes;
  for (int i = 0; i < mesh.num_axes(); ++i) {
    AxisType t = v.type[i];
    const std::string& a = mesh.axis_names()[i];
    if (t.is_sharded() && t.dim < v.rank()) {
      dims[t.dim].push_back(a);
    } else if (t.kind == AxisKind::kP) {
      notes.push_back(absl::StrCat("pending sum (P) over '", a, "'"));
    } else if (t.kind == AxisKind::kV) {
      notes.push_back(absl::StrCat("varies over '", a, "' with an unknown layout (V)"));
    }
  }
  while (!dims.empty() && dims.back().empty()) dims.pop_back();
  PartitionSpec spec(dims);
  Shape global = spec.GlobalShape(mesh, v.shape());
  std::string out = absl::StrCat("local ", v.ToString(), " as global:\n",
                                 VisualizeSharding(mesh, spec, global));
  for (const std::string& n : notes) absl::StrAppend(&out, "  note: ", n, "\n");
  return out;
}

}  // namespace shardmap
