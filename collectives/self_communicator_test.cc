#include "collectives/self_communicator.h"

#include <vector>

#include "gtest/gtest.h"

namespace shardmap::collectives {
namespace {

TEST(SelfCommunicator, CollectivesCopyTheRanksOwnData) {
  SelfCommunicator self;
  EXPECT_EQ(self.rank(), 0);
  EXPECT_EQ(self.size(), 1);
  const std::vector<double> x = {1.5, -2, 3};
  std::vector<double> y(3, 0);
  ASSERT_TRUE(self.AllReduce(x.data(), y.data(), 3, DataType::kF64, ReduceOp::kSum).ok());
  EXPECT_EQ(y, x);
  y.assign(3, 0);
  ASSERT_TRUE(self.AllGather(x.data(), y.data(), 3, DataType::kF64).ok());
  EXPECT_EQ(y, x);
  y.assign(3, 0);
  const size_t counts[] = {2};
  ASSERT_TRUE(self.ReduceScatterV(x.data(), y.data(), counts, DataType::kF64, ReduceOp::kSum)
                  .ok());
  EXPECT_EQ(y, (std::vector<double>{1.5, -2, 0}));  // only counts[0] elements
  y.assign(3, 0);
  ASSERT_TRUE(self.AllToAllV(x.data(), counts, y.data(), counts, DataType::kF64).ok());
  EXPECT_EQ(y, (std::vector<double>{1.5, -2, 0}));
  std::vector<float> in_place = {4, 5};
  ASSERT_TRUE(
      self.AllReduce(in_place.data(), in_place.data(), 2, DataType::kF32, ReduceOp::kMax).ok());
  EXPECT_EQ(in_place, (std::vector<float>{4, 5}));
  ASSERT_TRUE(self.Broadcast(in_place.data(), 2, DataType::kF32, 0).ok());
  EXPECT_EQ(in_place, (std::vector<float>{4, 5}));
  EXPECT_TRUE(self.Barrier().ok());
}

TEST(SelfCommunicator, PpermuteWithoutAPairZeroFills) {
  SelfCommunicator self;
  const std::vector<int64_t> x = {7, 8};
  std::vector<int64_t> y = {1, 1};
  const std::pair<int, int> to_self[] = {{0, 0}};
  ASSERT_TRUE(self.Ppermute(x.data(), y.data(), 2, DataType::kI64, to_self).ok());
  EXPECT_EQ(y, x);
  ASSERT_TRUE(self.Ppermute(x.data(), y.data(), 2, DataType::kI64, {}).ok());
  EXPECT_EQ(y, (std::vector<int64_t>{0, 0}));
}

TEST(SelfCommunicator, PointToPointIsAnErrorAndSplitGivesAnotherSelf) {
  SelfCommunicator self;
  int v = 3;
  EXPECT_EQ(self.Send(&v, 1, DataType::kI32, 0).code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(self.Recv(&v, 1, DataType::kI32, 0).code(), absl::StatusCode::kUnimplemented);
  auto sub = self.Split(0, 0);
  ASSERT_TRUE(sub.ok());
  ASSERT_NE(*sub, nullptr);
  EXPECT_EQ((*sub)->size(), 1);
  auto none = self.Split(-1, 0);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, nullptr);  // a negative color is "not in any group", as for the other backends
}

}  // namespace
}  // namespace shardmap::collectives
