// RunShapeOnly: one rank's program, alone, logs exactly the collectives that rank logs in a
// real RunSpmd run of every rank (checked rank by rank, forward and backward, on meshes with
// odd axis sizes), on the meta device and on CPU; errors (rank out of range, a type error in
// the body) come back annotated; a mesh of thousands of ranks costs no more than a small one.
#include "shardmap/runtime/shape_only.h"

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "autograd/tape.h"
#include "autograd/value_and_grad.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shardmap/ops/collective_ops.h"
#include "shardmap/runtime/collective_record_test_util.h"
#include "shardmap/runtime/collective_recorder.h"
#include "shardmap/ops/ops.h"
#include "shardmap/partition_spec.h"
#include "shardmap/runtime/spmd_runner.h"
#include "tensor/memory_tracker.h"

namespace shardmap {
namespace {

using ::testing::HasSubstr;

// A Megatron MLP over tp with a dp batch, a ring ppermute over dp, the loss all_reduced over dp,
// and the gradients reduced as a data-parallel trainer does (all_reduce, or reduce_scatter where
// dp divides the rows). Shapes depend on the mesh only; values never steer control flow.
void MlpStep(RankContext& ctx) {
  const Mesh& mesh = ctx.mesh();
  const Device dev = ctx.device();
  const int dp = mesh.axis_size(mesh.AxisIndex("dp"));
  Tape tape;
  Value x(Tensor::Ones({4, 6}, DType::kF32, dev), P("dp", None).InputType(mesh));
  Value w1 = tape.Watch(Value(Tensor::Full({6, 5}, 0.1, DType::kF32, dev),
                              P(None, "tp").InputType(mesh)));
  Value w2 = tape.Watch(Value(Tensor::Full({5, 6}, 0.2, DType::kF32, dev),
                              P("tp", None).InputType(mesh)));
  Value loss;
  {
    ScopedRecorder rec(&tape);
    Value y = all_reduce(gelu(x.matmul(w1)).matmul(w2), "tp");
    std::vector<std::pair<int, int>> ring;
    for (int i = 0; i < dp; ++i) ring.push_back({i, (i + 1) % dp});
    y = y + ppermute(y, "dp", ring);
    loss = sum_partial(y * y, {});
  }
  std::vector<Value> grads = tape.Backward(loss, LossSeed(loss), {w1, w2});
  NoGradScope no_tape;
  for (Value& g : grads) {
    g = g.tensor.dim(0) % dp == 0 ? reduce_scatter(g, 0, "dp") : all_reduce(g, "dp");
  }
  const double l = all_reduce(loss, "dp").item();
  (void)l;  // read on the host as a trainer reads its loss (0 on meta)
}

class ShapeOnlyLogTest : public ::testing::TestWithParam<bool /*meta*/> {};

TEST_P(ShapeOnlyLogTest, EveryRankLogsWhatItLogsInARealRun) {
  for (const auto& axes : std::vector<std::vector<std::pair<std::string, int>>>{
           {{"dp", 3}, {"tp", 1}}, {{"dp", 2}, {"tp", 5}}, {{"dp", 3}, {"tp", 2}}}) {
    const Mesh mesh = *Mesh::Create(axes);
    SCOPED_TRACE(mesh.ShortString());
    // The real run, every rank a thread (its recorder must not outlive it: the shape-only runs
    // below record on this thread).
    auto real = std::make_unique<CollectiveRecorder>();
    std::map<int, int64_t> real_peak;
    std::mutex mu;
    ASSERT_TRUE(RunSpmd(mesh, [&](RankContext& ctx) {
                  MemoryTracker mem;
                  MlpStep(ctx);
                  std::lock_guard<std::mutex> lock(mu);
                  real_peak[ctx.rank()] = mem.peak_bytes();
                }).ok());
    std::map<int, std::vector<CollectiveRecord>> real_records;
    std::map<int, std::string> real_text;
    for (int rank = 0; rank < mesh.size(); ++rank) {
      real_records[rank] = real->records(rank);
      real_text[rank] = real->ToString(rank);
    }
    real.reset();
    ShapeOnlyOptions o;
    if (!GetParam()) o.device = Device::Cpu();
    for (int rank = 0; rank < mesh.size(); ++rank) {
      SCOPED_TRACE(rank);
      CollectiveRecorder shape_only;
      MemoryTracker mem;
      absl::Status s = RunShapeOnly(
          mesh, rank,
          [&](RankContext& ctx) {
            EXPECT_EQ(ctx.rank(), rank);
            EXPECT_EQ(ctx.device().is_meta(), GetParam());
            MlpStep(ctx);
          },
          o);
      ASSERT_TRUE(s.ok()) << s;
      EXPECT_EQ(shape_only.ranks(), std::vector<int>{rank});
      EXPECT_FALSE(shape_only.records(rank).empty());
      ExpectSameRecords(shape_only.records(rank), real_records[rank]);
      EXPECT_EQ(shape_only.ToString(rank), real_text[rank]);
      // The tracker counts the same blocks on meta and on CPU (tensor/memory_tracker.h).
      EXPECT_EQ(mem.peak_bytes(), real_peak[rank]);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(MetaAndCpu, ShapeOnlyLogTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Meta" : "Cpu"; });

TEST(ShapeOnly, ThousandsOfRanks) {
  // 4096 ranks; the last one. Nothing per rank of the world is built.
  const Mesh mesh = *Mesh::Create({{"dp", 512}, {"tp", 8}});
  CollectiveRecorder rec;
  absl::Status s = RunShapeOnly(mesh, 4095, [](RankContext& ctx) {
                SpmdType type(2, AxisType::V());
                type[1] = AxisType::P();  // a pending sum over tp
                Value x(Tensor::Empty({1 << 12, 1 << 12}, DType::kBF16, ctx.device()), type);
                Value y = all_reduce(x, "tp");
                Value z = all_gather(y, 0, "dp");
                EXPECT_EQ(z.tensor.dim(0), 512 << 12);
                EXPECT_TRUE(z.tensor.is_meta());
              });
  ASSERT_TRUE(s.ok()) << s;
  const std::vector<CollectiveRecord> r = rec.records(4095);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_STREQ(r[0].op, "all_reduce");
  EXPECT_EQ(r[0].axes, *mesh.Mask({"tp"}));
  EXPECT_EQ(r[0].bytes, int64_t{2} << 24);
  EXPECT_EQ(r[0].dtype, DType::kBF16);
  EXPECT_STREQ(r[1].op, "all_gather");
  EXPECT_EQ(r[1].axes, *mesh.Mask({"dp"}));
}

TEST(ShapeOnly, GroupsComeFromTheMesh) {
  const Mesh mesh = *Mesh::Create({{"pp", 3}, {"dp", 7}, {"tp", 4}});
  ASSERT_TRUE(RunShapeOnly(mesh, 50, [&](RankContext& ctx) {
                for (const std::vector<std::string>& axes :
                     std::vector<std::vector<std::string>>{
                         {"tp"}, {"dp"}, {"pp"}, {"dp", "tp"}, {"pp", "tp"}, {"pp", "dp"}}) {
                  const AxisMask m = *mesh.Mask(axes);
                  collectives::Communicator& c = ctx.Comm(m);
                  EXPECT_EQ(c.size(), mesh.GroupSize(m)) << mesh.MaskToString(m);
                  EXPECT_EQ(c.rank(), mesh.GroupIndex(50, m)) << mesh.MaskToString(m);
                }
                EXPECT_EQ(ctx.Comm(*mesh.Mask({"pp", "dp", "tp"})).size(), 84);
              }).ok());
  // A color no group of this rank has.
  collectives::ShapeOnlyCommunicator::SplitResolver resolve = MeshSplitResolver(mesh, 50);
  absl::StatusOr<collectives::SplitGroup> bad = resolve(3, 0);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("names no group"));
}

TEST(ShapeOnly, Errors) {
  const Mesh mesh = *Mesh::Create({{"dp", 3}, {"tp", 2}});
  absl::Status s = RunShapeOnly(mesh, 6, [](RankContext&) {});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("rank 6 is outside the 6 ranks"));
  EXPECT_FALSE(RunShapeOnly(mesh, -1, [](RankContext&) {}).ok());
  ShapeOnlyOptions gpu;
  gpu.device = Device::Cuda(0);
  s = RunShapeOnly(mesh, 0, [](RankContext&) {}, gpu);
  EXPECT_THAT(std::string(s.message()), HasSubstr("use the meta device"));
  EXPECT_FALSE(RunShapeOnly(mesh, 0, nullptr).ok());
  // The typed layer's checks run: an unknown axis, a shape error, both annotated with the rank.
  s = RunShapeOnly(mesh, 5, [](RankContext& ctx) {
    Value x(Tensor::Empty({4, 6}, DType::kF32, ctx.device()), SpmdType(2, AxisType::V()));
    all_reduce(x, "cp");
  });
  EXPECT_THAT(std::string(s.message()), HasSubstr("rank 5 (dp=2,tp=1)"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("cp"));
  s = RunShapeOnly(mesh, 1, [](RankContext& ctx) {
    Value a(Tensor::Empty({4, 6}, DType::kF32, ctx.device()), SpmdType(2));
    Value b(Tensor::Empty({5, 6}, DType::kF32, ctx.device()), SpmdType(2));
    a.matmul(b);
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  // A reduce_scatter whose group does not divide the dim fails as it would in a real run.
  s = RunShapeOnly(mesh, 0, [](RankContext& ctx) {
    Value x(Tensor::Empty({4, 6}, DType::kF32, ctx.device()), SpmdType(2, AxisType::V()));
    x.type[0] = AxisType::P();
    reduce_scatter(x, 0, "dp");
  });
  EXPECT_FALSE(s.ok());
}

}  // namespace
}  // namespace shardmap
