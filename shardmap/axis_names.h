// AxisNames: a list of mesh axis names as per-device code writes it. Collectives take one
// (the axes they communicate over) and each dim of a PartitionSpec is one (the axes that shard
// it, the first one major); None is the empty list (an unsharded dim).
//
//   all_reduce(x, "tp");                 // one axis
//   all_reduce(x, {"dp", "cp"});         // several, reduced as one group
//   P({"dp", "cp"}, "tp");               // dim 0 over dp x cp, dim 1 over tp
//   P(None, "tp");                       // dim 0 unsharded
#ifndef SHARDMAP_SHARDMAP_AXIS_NAMES_H_
#define SHARDMAP_SHARDMAP_AXIS_NAMES_H_

#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

namespace shardmap {

struct NoneType {};
inline constexpr NoneType None{};

struct AxisNames {
  AxisNames() = default;
  AxisNames(NoneType) {}
  AxisNames(const char* a) : names{a} {}
  AxisNames(std::string a) : names{std::move(a)} {}
  AxisNames(std::initializer_list<const char*> list) {
    for (const char* a : list) names.emplace_back(a);
  }
  AxisNames(std::vector<std::string> list) : names(std::move(list)) {}

  bool empty() const { return names.empty(); }

  std::vector<std::string> names;
};

// The collectives' spelling (collective_ops.h).
using Axes = AxisNames;

}  // namespace shardmap

#endif  // SHARDMAP_SHARDMAP_AXIS_NAMES_H_
