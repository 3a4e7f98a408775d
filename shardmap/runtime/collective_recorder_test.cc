// CollectiveRecorder: what a scope records (kind, axes, bytes, dtype, direction) against the
// per-rank log the ShardMap options return (an independent path), that nothing outside the
// scope is recorded, that recorders nest, that two ranks' recorders do not mix, that ranks
// append to a shared recorder concurrently, and that programs of other threads are not seen.
#include "shardmap/runtime/collective_recorder.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "autograd/value_and_grad.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shardmap/ops/collective_ops.h"
#include "shardmap/runtime/collective_record_test_util.h"
#include "shardmap/ops/ops.h"
#include "shardmap/shard_map.h"
#include "tensor/random.h"

namespace shardmap {
namespace {

using ::testing::ElementsAre;

// A Megatron MLP over tp (and a dp batch): one all_reduce over tp forward, its transpose
// backward, and the loss's all_reduce over dp.
ShardMap MakeMlp(const Mesh& mesh, ShardMapOptions o = {}) {
  ShardFn fn = [](const std::vector<Value>& in) -> std::vector<Value> {
    Value y = all_reduce(gelu(in[0].matmul(in[1])).matmul(in[2]), "tp");
    return {all_reduce(sum_partial(y * y, {}), "dp"), y};
  };
  return shard_map(fn, mesh, {P("dp", None), P(None, "tp"), P("tp", None)}, {P(), P("dp")}, o);
}

std::vector<Tensor> MlpInputs(DType dtype) {
  return {RandomNormal({4, 5}, 1, 0, 1, dtype), RandomNormal({5, 6}, 2, 0, 1, dtype),
          RandomNormal({6, 5}, 3, 0, 1, dtype)};
}

TEST(CollectiveRecorder, RecordsEveryRankOfValueAndGradWithoutRebuildingTheShardMap) {
  const Mesh mesh = *Mesh::Create({{"dp", 2}, {"tp", 3}});
  for (DType dtype : {DType::kF64, DType::kF32}) {
    SCOPED_TRACE(DTypeName(dtype));
    const std::vector<Tensor> in = MlpInputs(dtype);
    // The reference: rank 0's log through the options (the ShardMap rebuilt).
    std::vector<CollectiveRecord> log;
    ShardMapOptions o;
    o.collective_log = &log;
    ASSERT_TRUE(value_and_grad(MakeMlp(mesh, o))(in).ok());

    const ShardMap f = MakeMlp(mesh);
    CollectiveRecorder rec;
    EXPECT_EQ(rec.home_rank(), -1);
    absl::StatusOr<ShardMapGrads> r = value_and_grad(f)(in);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_THAT(rec.ranks(), ElementsAre(0, 1, 2, 3, 4, 5));
    ExpectSameRecords(rec.records(), log);
    ExpectSameRecords(rec.records(0), log);
    const AxisMask tp = *mesh.Mask({"tp"}), dp = *mesh.Mask({"dp"});
    const int64_t y_bytes = 2 * 5 * DTypeSize(dtype);  // each rank's [2, 5] block of y
    for (int rank = 0; rank < mesh.size(); ++rank) {
      SCOPED_TRACE(rank);
      EXPECT_EQ(rec.Count("all_reduce", tp, /*backward=*/false, rank), 1);
      EXPECT_EQ(rec.Count("all_reduce", tp, /*backward=*/true, rank), 1);
      EXPECT_EQ(rec.Count("all_reduce", dp, /*backward=*/false, rank), 1);
      EXPECT_EQ(rec.Count("all_reduce", dp, /*backward=*/true, rank), 1);
      EXPECT_EQ(rec.records(rank).size(), 4u);
      for (const CollectiveRecord& c : rec.records(rank)) {
        EXPECT_EQ(c.dtype, dtype);
        if (c.axes == tp) {
          EXPECT_EQ(c.bytes, y_bytes);
        }
      }
    }
    EXPECT_TRUE(rec.records(6).empty());
  }
}

TEST(CollectiveRecorder, RecordsNothingOutsideItsScopeAndNests) {
  const Mesh mesh = *Mesh::Create({{"dp", 1}, {"tp", 3}});
  const ShardMap f = MakeMlp(mesh);
  const std::vector<Tensor> in = MlpInputs(DType::kF64);
  ASSERT_TRUE(f(in).ok());  // before any recorder: never seen
  CollectiveRecorder outer;
  EXPECT_TRUE(outer.records().empty());
  {
    CollectiveRecorder inner;
    ASSERT_TRUE(f(in).ok());
    EXPECT_EQ(inner.records().size(), 2u);  // forward only: tp, then dp
    EXPECT_EQ(outer.records().size(), 2u);  // an inner recorder's records are the outer's too
    inner.Clear();
    EXPECT_TRUE(inner.records().empty());
    EXPECT_EQ(outer.records().size(), 2u);
  }
  // After the inner one ended: the outer one only. Backward: the transposes of both all_reduces.
  ASSERT_TRUE(value_and_grad(f)(in).ok());
  EXPECT_EQ(outer.records().size(), 6u);
  EXPECT_EQ(outer.Count("all_reduce", *mesh.Mask({"tp"}), true), 1);
}

// Made inside per-rank code, a recorder sees its rank's collectives from its construction on,
// while an outer recorder of the calling thread sees every rank's.
TEST(CollectiveRecorder, InsidePerRankCodeRecordsThatRankFromItsConstruction) {
  const Mesh mesh = *Mesh::Create({{"tp", 5}});
  std::vector<std::vector<CollectiveRecord>> per_rank(mesh.size());
  std::vector<std::vector<int>> seen_ranks(mesh.size());
  CollectiveRecorder outer;
  absl::Status s = RunSpmd(mesh, [&](RankContext& ctx) {
    const int r = ctx.rank();
    // Rank-dependent bytes: rank r holds r + 1 rows of the uneven gather.
    Value x(Tensor::Ones({r + 1, 3}, DType::kF32), P("tp").InputType(mesh));
    auto layer = std::make_unique<CollectiveRecorder>();
    if (r % 2 == 1) layer.reset();  // odd ranks: not yet
    all_gather(x, 0, "tp", {1, 2, 3, 4, 5});
    if (layer == nullptr) layer = std::make_unique<CollectiveRecorder>();
    EXPECT_EQ(layer->home_rank(), r);
    all_reduce(sum_partial(x, {0}), "tp");
    per_rank[r] = layer->records();
    seen_ranks[r] = layer->ranks();
  });
  ASSERT_TRUE(s.ok()) << s;
  for (int r = 0; r < mesh.size(); ++r) {
    SCOPED_TRACE(r);
    EXPECT_THAT(seen_ranks[r], ElementsAre(r));  // never another rank's
    const std::vector<CollectiveRecord>& got = per_rank[r];
    ASSERT_EQ(got.size(), r % 2 == 1 ? 1u : 2u);
    if (r % 2 == 0) {
      EXPECT_STREQ(got[0].op, "all_gather");
      EXPECT_EQ(got[0].bytes, (r + 1) * 3 * 4);
    }
    EXPECT_STREQ(got.back().op, "all_reduce");
    EXPECT_EQ(got.back().bytes, 3 * 4);
    EXPECT_EQ(got.back().dtype, DType::kF32);
    EXPECT_EQ(outer.records(r).size(), 2u);
    EXPECT_EQ(outer.records(r)[0].bytes, (r + 1) * 3 * 4);
  }
}

// The ranks of one program append to a shared recorder at once; each rank's records stay in its
// program order.
TEST(CollectiveRecorder, RanksAppendConcurrently) {
  const Mesh mesh = *Mesh::Create({{"dp", 7}});
  constexpr int kCalls = 40;
  CollectiveRecorder rec;
  absl::Status s = RunSpmd(mesh, [&](RankContext&) {
    Value x = Value::Replicated(Tensor::Ones({4}, DType::kF64));
    for (int k = 0; k < kCalls; ++k) {
      x = k % 2 == 0 ? all_reduce(reinterpret(vary(x, "dp"), "dp"), "dp")
                     : all_gather(vary(x, "dp"), 0, "dp", To::kR).reshape({7, 4}).sum({0});
    }
  });
  ASSERT_TRUE(s.ok()) << s;
  for (int r = 0; r < mesh.size(); ++r) {
    const std::vector<CollectiveRecord> got = rec.records(r);
    ASSERT_EQ(got.size(), static_cast<size_t>(kCalls));
    for (int k = 0; k < kCalls; ++k) {
      EXPECT_STREQ(got[k].op, k % 2 == 0 ? "all_reduce" : "all_gather") << r << " " << k;
    }
  }
}

TEST(CollectiveRecorder, ProgramsOfOtherThreadsAreNotRecorded) {
  const Mesh mesh = *Mesh::Create({{"dp", 1}, {"tp", 2}});
  const ShardMap f = MakeMlp(mesh);
  CollectiveRecorder rec;
  std::thread other([&] { EXPECT_TRUE(f(MlpInputs(DType::kF64)).ok()); });
  other.join();
  EXPECT_TRUE(rec.ranks().empty());
  ASSERT_TRUE(f(MlpInputs(DType::kF64)).ok());
  EXPECT_EQ(rec.ranks().size(), 2u);
}

TEST(CollectiveRecorder, PrintsOneLinePerRecordWithAxisNames) {
  const Mesh mesh = *Mesh::Create({{"dp", 2}, {"tp", 1}});
  const ShardMap f = MakeMlp(mesh);
  CollectiveRecorder rec;
  ASSERT_TRUE(value_and_grad(f)(MlpInputs(DType::kF32)).ok());
  EXPECT_EQ(rec.ToString(1),
            "all_reduce over tp: f32, 40 bytes\n"
            "all_reduce over dp: f32, 4 bytes\n"
            "all_reduce over dp: f32, 4 bytes (backward)\n"
            "all_reduce over tp: f32, 40 bytes (backward)\n");
  EXPECT_EQ(rec.Bytes(1), 88);
  EXPECT_EQ(rec.ToString(7), "");
}

}  // namespace
}  // namespace shardmap
