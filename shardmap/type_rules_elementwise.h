// Forwarding header: type_rules_elementwise.h moved to shardmap/rules/type_rules_elementwise.h (shardmap/README.md, "Rooms").
// Existing includes keep compiling; new code includes the new path.
#ifndef SHARDMAP_SHARDMAP_TYPE_RULES_ELEMENTWISE_H_
#define SHARDMAP_SHARDMAP_TYPE_RULES_ELEMENTWISE_H_

#include "shardmap/rules/type_rules_elementwise.h"  // IWYU pragma: export

#endif  // SHARDMAP_SHARDMAP_TYPE_RULES_ELEMENTWISE_H_
