// Forwarding header: einsum.h moved to shardmap/ops/einsum.h (shardmap/README.md, "Rooms").
// Existing includes keep compiling; new code includes the new path.
#ifndef SHARDMAP_SHARDMAP_EINSUM_H_
#define SHARDMAP_SHARDMAP_EINSUM_H_

#include "shardmap/ops/einsum.h"  // IWYU pragma: export

#endif  // SHARDMAP_SHARDMAP_EINSUM_H_
