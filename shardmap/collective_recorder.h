// Forwarding header: collective_recorder.h moved to shardmap/runtime/collective_recorder.h (shardmap/README.md, "Rooms").
// Existing includes keep compiling; new code includes the new path.
#ifndef SHARDMAP_SHARDMAP_COLLECTIVE_RECORDER_H_
#define SHARDMAP_SHARDMAP_COLLECTIVE_RECORDER_H_

#include "shardmap/runtime/collective_recorder.h"  // IWYU pragma: export

#endif  // SHARDMAP_SHARDMAP_COLLECTIVE_RECORDER_H_
