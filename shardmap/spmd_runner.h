// Forwarding header: spmd_runner.h moved to shardmap/runtime/spmd_runner.h (shardmap/README.md, "Rooms").
// Existing includes keep compiling; new code includes the new path.
#ifndef SHARDMAP_SHARDMAP_SPMD_RUNNER_H_
#define SHARDMAP_SHARDMAP_SPMD_RUNNER_H_

#include "shardmap/runtime/spmd_runner.h"  // IWYU pragma: export

#endif  // SHARDMAP_SHARDMAP_SPMD_RUNNER_H_
