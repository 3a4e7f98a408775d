// Forwarding header: type_rules_collective.h moved to shardmap/rules/type_rules_collective.h (shardmap/README.md, "Rooms").
// Existing includes keep compiling; new code includes the new path.
#ifndef SHARDMAP_SHARDMAP_TYPE_RULES_COLLECTIVE_H_
#define SHARDMAP_SHARDMAP_TYPE_RULES_COLLECTIVE_H_

#include "shardmap/rules/type_rules_collective.h"  // IWYU pragma: export

#endif  // SHARDMAP_SHARDMAP_TYPE_RULES_COLLECTIVE_H_
