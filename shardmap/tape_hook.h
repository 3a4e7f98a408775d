// Forwarding header: tape_hook.h moved to shardmap/runtime/tape_hook.h (shardmap/README.md, "Rooms").
// Existing includes keep compiling; new code includes the new path.
#ifndef SHARDMAP_SHARDMAP_TAPE_HOOK_H_
#define SHARDMAP_SHARDMAP_TAPE_HOOK_H_

#include "shardmap/runtime/tape_hook.h"  // IWYU pragma: export

#endif  // SHARDMAP_SHARDMAP_TAPE_HOOK_H_
