// Test helper: two ranks' collective logs (CollectiveRecorder::records, RankContext's log) are
// the same call for call: op, axes, bytes, direction and dtype.
//
//   ExpectSameRecords(recorder.records(rank), real_run_records[rank]);
#ifndef SHARDMAP_SHARDMAP_RUNTIME_COLLECTIVE_RECORD_TEST_UTIL_H_
#define SHARDMAP_SHARDMAP_RUNTIME_COLLECTIVE_RECORD_TEST_UTIL_H_

#include <vector>

#include "gtest/gtest.h"
#include "shardmap/runtime/rank_context.h"

namespace shardmap {

inline void ExpectSameRecords(const std::vector<CollectiveRecord>& got,
                              const std::vector<CollectiveRecord>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t k = 0; k < got.size(); ++k) {
    SCOPED_TRACE(k);
    EXPECT_STREQ(got[k].op, want[k].op);
    EXPECT_EQ(got[k].axes, want[k].axes);
    EXPECT_EQ(got[k].bytes, want[k].bytes);
    EXPECT_EQ(got[k].backward, want[k].backward);
    EXPECT_EQ(got[k].dtype, want[k].dtype);
  }
}

}  // namespace shardmap

#endif  // SHARDMAP_SHARDMAP_RUNTIME_COLLECTIVE_RECORD_TEST_UTIL_H_
