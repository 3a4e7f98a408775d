#include "shardmap/mesh.h"

#include <ostream>

#include <cstdint>
#include <limits>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace shardmap {

absl::StatusOr<Mesh> Mesh::Create(std::vector<std::pair<std::string, int>> axes) {
  if (axes.size() > static_cast<size_t>(kMaxMeshAxes)) {
    return absl::InvalidArgumentError(absl::StrCat("mesh has ", axes.size(),
                                                   " axes; at most ", kMaxMeshAxes,
                                                   " are supported"));
  }
  Mesh m;
  absl::flat_hash_set<std::string> seen;
  for (auto& [name, size] : axes) {
    if (name.empty()) return absl::InvalidArgumentError("mesh axis names must be non-empty");
    if (!seen.insert(name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("mesh axis name '", name, "' is used twice; axis names must be unique"));
    }
    if (size < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("mesh axis '", name, "' has size ", size, "; sizes must be >= 1"));
    }
    m.names_.push_back(name);
    m.sizes_.push_back(size);
  }
  int64_t product = 1;
  for (size_t i = 0; i < m.sizes_.size(); ++i) {
    product *= m.sizes_[i];  // each factor < 2^31 and product < 2^31 before: no int64 overflow
    if (product > std::numeric_limits<int>::max()) {
      std::vector<std::string> parts;
      for (auto& [name, size] : axes) parts.push_back(absl::StrCat(name, ":", size));
      return absl::InvalidArgumentError(absl::StrCat(
          "mesh {", absl::StrJoin(parts, ","), "} has more than ",
          std::numeric_limits<int>::max(), " devices (the product of its axis sizes overflows)"));
    }
  }
  m.strides_.assign(m.sizes_.size(), 1);
  for (int i = static_cast<int>(m.sizes_.size()) - 2; i >= 0; --i) {
    m.strides_[i] = m.strides_[i + 1] * m.sizes_[i + 1];
  }
  m.size_ = static_cast<int>(product);
  m.id_ = m.ComputeId();
  return m;
}

uint32_t Mesh::ComputeId() const {
  if (names_.empty()) return kNoAxesId;
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
  for (size_t i = 0; i < names_.size(); ++i) {
    for (char c : names_[i]) mix(static_cast<unsigned char>(c));
    mix(0x100u + static_cast<uint64_t>(sizes_[i]));
  }
  const uint32_t id = static_cast<uint32_t>(h ^ (h >> 32));
  return id == 0 ? 1 : id;  // 0 means "no mesh" in SpmdType
}

int Mesh::AxisIndex(const std::string& name) const {
  for (int i = 0; i < num_axes(); ++i) {
    if (names_[i] == name) return i;
  }
  return -1;
}

absl::StatusOr<int> Mesh::AxisSizeOf(const std::string& name) const {
  int i = AxisIndex(name);
  if (i < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown mesh axis '", name, "' (mesh ", ShortString(), ")"));
  }
  return sizes_[i];
}

std::vector<int> Mesh::Coords(int rank) const {
  std::vector<int> c(num_axes());
  for (int i = 0; i < num_axes(); ++i) c[i] = Coord(rank, i);
  return c;
}

int Mesh::RankAt(absl::Span<const int> coords) const {
  int r = 0;
  for (int i = 0; i < num_axes(); ++i) r += coords[i] * strides_[i];
  return r;
}

absl::StatusOr<AxisMask> Mesh::Mask(const std::vector<std::string>& axes) const {
  AxisMask mask = 0;
  for (const std::string& a : axes) {
    int i = AxisIndex(a);
    if (i < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown mesh axis '", a, "' (mesh ", ShortString(), "); use one of its axis names"));
    }
    if (mask & (1u << i)) {
      return absl::InvalidArgumentError(
          absl::StrCat("mesh axis '", a, "' is named twice in the axis list"));
    }
    mask |= 1u << i;
  }
  return mask;
}

int Mesh::GroupSize(AxisMask mask) const {
  int n = 1;
  for (int i = 0; i < num_axes(); ++i) {
    if (mask & (1u << i)) n *= sizes_[i];
  }
  return n;
}

int Mesh::GroupColor(int rank, AxisMask mask) const {
  int c = 0;
  for (int i = 0; i < num_axes(); ++i) {
    if (!(mask & (1u << i))) c = c * sizes_[i] + Coord(rank, i);
  }
  return c;
}

int Mesh::GroupIndex(int rank, AxisMask mask) const {
  int c = 0;
  for (int i = 0; i < num_axes(); ++i) {
    if (mask & (1u << i)) c = c * sizes_[i] + Coord(rank, i);
  }
  return c;
}

int Mesh::GroupMember(int rank, AxisMask mask, int index) const {
  std::vector<int> c = Coords(rank);
  for (int i = num_axes() - 1; i >= 0; --i) {
    if (mask & (1u << i)) {
      c[i] = index % sizes_[i];
      index /= sizes_[i];
    }
  }
  return RankAt(c);
}

std::vector<std::string> Mesh::AxisNamesOf(AxisMask mask) const {
  std::vector<std::string> names;
  for (int i = 0; i < num_axes(); ++i) {
    if (mask & (1u << i)) names.push_back(names_[i]);
  }
  return names;
}

std::string Mesh::MaskToString(AxisMask mask) const {
  const std::vector<std::string> parts = AxisNamesOf(mask);
  if (parts.size() == 1) return parts[0];
  return absl::StrCat("(", absl::StrJoin(parts, ","), ")");
}

absl::StatusOr<Mesh> Mesh::Submesh(const std::vector<std::string>& axes) const {
  absl::StatusOr<AxisMask> mask = Mask(axes);
  if (!mask.ok()) return mask.status();
  std::vector<std::pair<std::string, int>> kept;
  for (int i = 0; i < num_axes(); ++i) {
    if (*mask & (1u << i)) kept.push_back({names_[i], sizes_[i]});
  }
  return Create(std::move(kept));
}

absl::StatusOr<Mesh> Mesh::Flatten(const std::vector<std::string>& axes,
                                   std::string new_name) const {
  if (axes.empty()) return absl::InvalidArgumentError("Flatten needs at least one axis");
  std::vector<int> idx;
  for (const std::string& a : axes) {
    int i = AxisIndex(a);
    if (i < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("Flatten: unknown mesh axis '", a, "' (mesh ", ShortString(), ")"));
    }
    idx.push_back(i);
  }
  for (size_t k = 1; k < idx.size(); ++k) {
    if (idx[k] != idx[k - 1] + 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Flatten: axes (", absl::StrJoin(axes, ","), ") must be adjacent and in mesh order in ",
          ShortString(), " so the flattened axis keeps the rank order"));
    }
  }
  std::vector<std::pair<std::string, int>> out;
  for (int i = 0; i < num_axes(); ++i) {
    if (i == idx.front()) {
      int prod = 1;
      for (int j : idx) prod *= sizes_[j];
      out.push_back({new_name, prod});
    } else if (i > idx.front() && i <= idx.back()) {
      continue;
    } else {
      out.push_back({names_[i], sizes_[i]});
    }
  }
  return Create(std::move(out));
}

std::string Mesh::ShortString() const {
  std::vector<std::string> parts;
  for (int i = 0; i < num_axes(); ++i) parts.push_back(absl::StrCat(names_[i], ":", sizes_[i]));
  return absl::StrCat("Mesh{", absl::StrJoin(parts, ","), "}");
}

std::string Mesh::ToString() const {
  std::string s = ShortString();
  s += "\n";
  if (num_axes() == 0) return s + "  rank 0\n";
  int cols = sizes_.back();
  int rows = num_axes() >= 2 ? sizes_[num_axes() - 2] : 1;
  int blocks = size_ / (cols * rows);
  for (int b = 0; b < blocks; ++b) {
    int base = b * cols * rows;
    if (num_axes() > 2) {
      std::vector<int> c = Coords(base);
      std::vector<std::string> parts;
      for (int i = 0; i < num_axes() - 2; ++i) parts.push_back(absl::StrCat(names_[i], "=", c[i]));
      absl::StrAppend(&s, "  [", absl::StrJoin(parts, ","), "]\n");
    }
    absl::StrAppend(&s, "  ", num_axes() >= 2 ? absl::StrCat(names_[num_axes() - 2], "\\") : "",
                    names_.back(), ":");
    for (int c = 0; c < cols; ++c) absl::StrAppend(&s, "\t", c);
    s += "\n";
    for (int r = 0; r < rows; ++r) {
      absl::StrAppend(&s, "  ", num_axes() >= 2 ? absl::StrCat(r) : "");
      for (int c = 0; c < cols; ++c) absl::StrAppend(&s, "\t", base + r * cols + c);
      s += "\n";
    }
  }
  return s;
}

std::ostream& operator<<(std::ostream& os, const Mesh& mesh) {
  return os << mesh.ShortString();
}

}  // namespace shardmap
