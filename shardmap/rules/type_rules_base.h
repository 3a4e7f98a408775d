// What every type rule returns on a rejection (the first rejected axis, the rule and the fix),
// shared by the rule families of type_rules.h.
#ifndef SHARDMAP_SHARDMAP_RULES_TYPE_RULES_BASE_H_
#define SHARDMAP_SHARDMAP_RULES_TYPE_RULES_BASE_H_

#include <string>

#include "shardmap/spmd_type.h"

namespace shardmap {

struct Rejection {
  int axis;          // the first rejected mesh axis
  std::string rule;  // "takes a partial sum (P), but x is V"
  std::string fix;
};

const char* KindName(AxisKind k);  // "R", "I", "V", "P"

}  // namespace shardmap

#endif  // SHARDMAP_SHARDMAP_RULES_TYPE_RULES_BASE_H_
