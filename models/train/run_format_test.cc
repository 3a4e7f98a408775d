#include "models/train/run_format.h"

#include <cmath>
#include <limits>

#include "gtest/gtest.h"

namespace shardmap {
namespace {

TEST(RunFormatTest, Bytes) {
  EXPECT_EQ(Bytes(0), "0 B");
  EXPECT_EQ(Bytes(1023), "1023 B");
  EXPECT_EQ(Bytes(1536), "1.5 KiB");
  EXPECT_EQ(Bytes(3 << 20), "3.0 MiB");
  EXPECT_EQ(Bytes(int64_t{5} << 30), "5.0 GiB");
}

TEST(RunFormatTest, DurationsAtEachScale) {
  EXPECT_EQ(Duration(0), "0.0s");
  EXPECT_EQ(Duration(12.34), "12.3s");
  EXPECT_EQ(Duration(245), "4m05s");
  EXPECT_EQ(Duration(7384), "2h03m");
  EXPECT_EQ(Duration(99 * 86400.0), "2376h00m");
  EXPECT_EQ(Duration(200 * 86400.0), "200 days");
}

// A huge --steps made the ETA overflow an int ("-2147483648h"): every size prints a positive,
// readable duration, and what is not a duration prints "?".
TEST(RunFormatTest, HugeDurationsDoNotOverflow) {
  EXPECT_EQ(Duration(3600.0 * 2147483648.0), "2.4e+05 years");
  EXPECT_EQ(Duration(1e30), "3.2e+22 years");
  EXPECT_EQ(Duration(std::numeric_limits<double>::max()), "5.7e+300 years");
  EXPECT_EQ(Duration(std::numeric_limits<double>::infinity()), "?");
  EXPECT_EQ(Duration(std::nan("")), "?");
  EXPECT_EQ(Duration(-1), "?");
}

}  // namespace
}  // namespace shardmap
