// Forwarding header: type_rules_nn.h moved to shardmap/rules/type_rules_nn.h (shardmap/README.md, "Rooms").
// Existing includes keep compiling; new code includes the new path.
#ifndef SHARDMAP_SHARDMAP_TYPE_RULES_NN_H_
#define SHARDMAP_SHARDMAP_TYPE_RULES_NN_H_

#include "shardmap/rules/type_rules_nn.h"  // IWYU pragma: export

#endif  // SHARDMAP_SHARDMAP_TYPE_RULES_NN_H_
