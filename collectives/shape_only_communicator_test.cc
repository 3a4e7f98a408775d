#include "collectives/shape_only_communicator.h"

#include <cstring>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardmap::collectives {
namespace {

using ::testing::HasSubstr;

TEST(ShapeOnlyCommunicatorTest, CreateChecksSizeAndRank) {
  EXPECT_TRUE(ShapeOnlyCommunicator::Create(4096, 4095).ok());
  absl::Status s = ShapeOnlyCommunicator::Create(0, 0).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("world size 0"));
  s = ShapeOnlyCommunicator::Create(7, 7).status();
  EXPECT_THAT(std::string(s.message()), HasSubstr("rank 7 is outside [0, 7)"));
  s = ShapeOnlyCommunicator::Create(7, -1).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
}

TEST(ShapeOnlyCommunicatorTest, CallsTouchNoBuffer) {
  ShapeOnlyCommunicator comm(5, 3);
  EXPECT_EQ(comm.size(), 5);
  EXPECT_EQ(comm.rank(), 3);
  EXPECT_THAT(comm.name(), HasSubstr("world(5) rank 3"));
  std::vector<float> send(15, 7.0f), recv(15, -1.0f);
  const std::vector<float> send0 = send, recv0 = recv;
  const std::vector<size_t> counts = {1, 2, 3, 4, 5};
  EXPECT_TRUE(comm.AllReduce(send.data(), recv.data(), 3, DataType::kF32, ReduceOp::kSum).ok());
  EXPECT_TRUE(comm.AllGather(send.data(), recv.data(), 3, DataType::kF32).ok());
  EXPECT_TRUE(comm.ReduceScatter(send.data(), recv.data(), 3, DataType::kF32, ReduceOp::kMax).ok());
  EXPECT_TRUE(comm.AllToAll(send.data(), recv.data(), 3, DataType::kF32).ok());
  EXPECT_TRUE(comm.AllGatherV(send.data(), recv.data(), counts, DataType::kF32).ok());
  EXPECT_TRUE(comm.ReduceScatterV(send.data(), recv.data(), counts, DataType::kF32,
                                  ReduceOp::kAvg).ok());
  EXPECT_TRUE(comm.AllToAllV(send.data(), counts, recv.data(), counts, DataType::kF32).ok());
  EXPECT_TRUE(comm.Broadcast(recv.data(), 3, DataType::kF32, 0).ok());
  EXPECT_TRUE(comm.Send(send.data(), 3, DataType::kF32, 4).ok());
  EXPECT_TRUE(comm.Recv(recv.data(), 3, DataType::kF32, 0).ok());
  const std::vector<std::pair<int, int>> ring = {{0, 1}, {1, 2}, {2, 3}, {3, 4}, {4, 0}};
  EXPECT_TRUE(comm.Ppermute(send.data(), recv.data(), 3, DataType::kF32, ring).ok());
  EXPECT_TRUE(comm.Barrier().ok());
  EXPECT_EQ(send, send0);  // nothing read into or written out of the buffers
  EXPECT_EQ(recv, recv0);
  EXPECT_EQ(comm.calls(), 12);
}

TEST(ShapeOnlyCommunicatorTest, FillOutputsFillsEveryOutputAndNothingElse) {
  ShapeOnlyCommunicator comm(3, 1);
  comm.set_fill_outputs(true);
  std::vector<double> send(9, 5.0), recv(9, -1.0), send0;
  auto reset = [&] { recv.assign(9, -1.0); };
  auto zeros = [&](size_t n) {  // the first n of recv are 0, the rest untouched; send intact
    for (size_t i = 0; i < recv.size(); ++i) EXPECT_EQ(recv[i], i < n ? 0.0 : -1.0) << i;
    EXPECT_EQ(send, send0);
  };
  auto own = [&](std::vector<double> want) {  // reductions: this rank's own contribution
    want.resize(9, -1.0);
    EXPECT_EQ(recv, want);
  };
  for (size_t i = 0; i < send.size(); ++i) send[i] = 5.0 + i;
  send0 = send;
  ASSERT_TRUE(comm.AllReduce(send.data(), recv.data(), 2, DataType::kF64, ReduceOp::kSum).ok());
  own({5, 6});
  reset();
  ASSERT_TRUE(comm.AllGather(send.data(), recv.data(), 2, DataType::kF64).ok());
  zeros(6);
  reset();
  ASSERT_TRUE(comm.ReduceScatter(send.data(), recv.data(), 2, DataType::kF64, ReduceOp::kSum).ok());
  own({7, 8});  // chunk 1 of 3
  reset();
  ASSERT_TRUE(comm.AllToAll(send.data(), recv.data(), 3, DataType::kF64).ok());
  zeros(9);
  reset();
  const std::vector<size_t> counts = {1, 4, 2};
  ASSERT_TRUE(comm.AllGatherV(send.data(), recv.data(), counts, DataType::kF64).ok());
  zeros(7);
  reset();
  ASSERT_TRUE(comm.ReduceScatterV(send.data(), recv.data(), counts, DataType::kF64,
                                  ReduceOp::kSum).ok());
  own({6, 7, 8, 9});  // rank 1's 4 after rank 0's 1
  reset();
  ASSERT_TRUE(comm.Broadcast(recv.data(), 3, DataType::kF64, 0).ok());
  zeros(3);
  reset();
  ASSERT_TRUE(comm.Broadcast(recv.data(), 3, DataType::kF64, 1).ok());  // the root keeps its own
  zeros(0);
  ASSERT_TRUE(comm.Recv(recv.data(), 5, DataType::kF64, 0).ok());
  zeros(5);
  reset();
  ASSERT_TRUE(comm.Ppermute(send.data(), recv.data(), 4, DataType::kF64, {{0, 1}}).ok());
  zeros(4);
  // Sub-groups inherit it.
  ShapeOnlyCommunicator world(6, 4, [](int, int key) -> absl::StatusOr<SplitGroup> {
    return SplitGroup{2, key};
  });
  world.set_fill_outputs(true);
  world.set_memory_space(MemorySpace{.meta = true});
  std::unique_ptr<Communicator> sub = *world.Split(0, 1);
  EXPECT_TRUE(sub->memory_space().meta);
  reset();
  ASSERT_TRUE(sub->AllGather(send.data(), recv.data(), 3, DataType::kF64).ok());
  zeros(6);
}

TEST(ShapeOnlyCommunicatorTest, NullBuffersAreFine) {
  // Meta tensors have no data: a real backend would refuse null buffers, this one never reads.
  ShapeOnlyCommunicator comm(3, 0);
  EXPECT_TRUE(comm.AllReduce(nullptr, nullptr, 1 << 30, DataType::kBF16, ReduceOp::kSum).ok());
  EXPECT_TRUE(comm.AllGather(nullptr, nullptr, 1 << 30, DataType::kF16).ok());
  EXPECT_TRUE(comm.Ppermute(nullptr, nullptr, 8, DataType::kI64, {{0, 1}}).ok());
}

TEST(ShapeOnlyCommunicatorTest, ValidatesLikeARealBackend) {
  ShapeOnlyCommunicator comm(4, 1);
  auto msg = [](const absl::Status& s) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    return std::string(s.message());
  };
  EXPECT_THAT(msg(comm.AllReduce(nullptr, nullptr, 1, static_cast<DataType>(99), ReduceOp::kSum)),
              HasSubstr("invalid DataType value 99"));
  EXPECT_THAT(msg(comm.ReduceScatter(nullptr, nullptr, 1, DataType::kF32,
                                     static_cast<ReduceOp>(42))),
              HasSubstr("invalid ReduceOp value 42"));
  const std::vector<size_t> three = {1, 1, 1};
  EXPECT_THAT(msg(comm.AllGatherV(nullptr, nullptr, three, DataType::kF32)),
              HasSubstr("counts has 3 entries but the group has 4 ranks"));
  EXPECT_THAT(msg(comm.ReduceScatterV(nullptr, nullptr, three, DataType::kF32, ReduceOp::kSum)),
              HasSubstr("3 entries"));
  const std::vector<size_t> s4 = {1, 2, 3, 4}, r4 = {1, 5, 3, 4};
  EXPECT_THAT(msg(comm.AllToAllV(nullptr, s4, nullptr, three, DataType::kF32)),
              HasSubstr("recv_counts has 3 entries"));
  EXPECT_THAT(msg(comm.AllToAllV(nullptr, s4, nullptr, r4, DataType::kF32)),
              HasSubstr("sends itself 2 elements but expects 5"));
  EXPECT_THAT(msg(comm.Broadcast(nullptr, 1, DataType::kF32, 4)),
              HasSubstr("root 4 is not a rank of this group of 4"));
  EXPECT_THAT(msg(comm.Broadcast(nullptr, 1, DataType::kF32, -1)), HasSubstr("root -1"));
  EXPECT_THAT(msg(comm.Send(nullptr, 1, DataType::kF32, 1)), HasSubstr("peer 1 must be another"));
  EXPECT_THAT(msg(comm.Recv(nullptr, 1, DataType::kF32, 4)), HasSubstr("peer 4"));
  EXPECT_THAT(msg(comm.Ppermute(nullptr, nullptr, 1, DataType::kF32, {{0, 4}})),
              HasSubstr("pair (0, 4) names a rank outside [0, 4)"));
  EXPECT_THAT(msg(comm.Ppermute(nullptr, nullptr, 1, DataType::kF32, {{0, 1}, {0, 2}})),
              HasSubstr("rank 0 appears twice as a source"));
  EXPECT_THAT(msg(comm.Ppermute(nullptr, nullptr, 1, DataType::kF32, {{0, 2}, {1, 2}})),
              HasSubstr("rank 2 appears twice as a destination"));
  EXPECT_THAT(msg(comm.Ppermute(nullptr, nullptr, 1, DataType::kF32, {{-1, 2}})),
              HasSubstr("outside"));
  // A swap and a rank that is both a source and a destination are fine.
  EXPECT_TRUE(comm.Ppermute(nullptr, nullptr, 1, DataType::kF32, {{0, 3}, {3, 0}}).ok());
}

TEST(ShapeOnlyCommunicatorTest, SplitNeedsAResolver) {
  ShapeOnlyCommunicator plain(8, 2);
  absl::StatusOr<std::unique_ptr<Communicator>> s = plain.Split(0, 2);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("SplitResolver"));
  // A negative color is "not in any group", resolver or not.
  absl::StatusOr<std::unique_ptr<Communicator>> none = plain.Split(-1, 0);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, nullptr);
}

TEST(ShapeOnlyCommunicatorTest, SplitUsesTheResolver) {
  // 8 ranks as 2 rows of 4: color = row, key = column.
  std::vector<std::pair<int, int>> asked;
  ShapeOnlyCommunicator world(8, 6, [&](int color, int key) -> absl::StatusOr<SplitGroup> {
    asked.push_back({color, key});
    if (color > 1) return absl::InvalidArgumentError("no such row");
    return SplitGroup{4, key};
  });
  absl::StatusOr<std::unique_ptr<Communicator>> row = world.Split(1, 2);
  ASSERT_TRUE(row.ok()) << row.status();
  EXPECT_EQ((*row)->size(), 4);
  EXPECT_EQ((*row)->rank(), 2);
  EXPECT_THAT((*row)->name(), HasSubstr("split(color=1)"));
  EXPECT_FALSE((*row)->memory_space().meta);
  EXPECT_EQ(asked, (std::vector<std::pair<int, int>>{{1, 2}}));
  // The sub-group validates against its own size.
  EXPECT_FALSE((*row)->Broadcast(nullptr, 1, DataType::kF32, 4).ok());
  EXPECT_TRUE((*row)->Broadcast(nullptr, 1, DataType::kF32, 3).ok());
  // Its own Split has no resolver.
  EXPECT_EQ((*row)->Split(0, 0).status().code(), absl::StatusCode::kFailedPrecondition);
  // Resolver errors come back as they are; a bad group is an internal error.
  EXPECT_THAT(std::string(world.Split(5, 0).status().message()), HasSubstr("no such row"));
  ShapeOnlyCommunicator bad(2, 0, [](int, int) -> absl::StatusOr<SplitGroup> {
    return SplitGroup{2, 2};
  });
  EXPECT_EQ(bad.Split(0, 0).status().code(), absl::StatusCode::kInternal);
}

}  // namespace
}  // namespace shardmap::collectives
