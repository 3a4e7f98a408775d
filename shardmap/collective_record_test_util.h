// Forwarding header: collective_record_test_util.h moved to shardmap/runtime/collective_record_test_util.h (shardmap/README.md, "Rooms").
// Existing includes keep compiling; new code includes the new path.
#ifndef SHARDMAP_SHARDMAP_COLLECTIVE_RECORD_TEST_UTIL_H_
#define SHARDMAP_SHARDMAP_COLLECTIVE_RECORD_TEST_UTIL_H_

#include "shardmap/runtime/collective_record_test_util.h"  // IWYU pragma: export

#endif  // SHARDMAP_SHARDMAP_COLLECTIVE_RECORD_TEST_UTIL_H_
