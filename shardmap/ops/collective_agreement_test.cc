// Ranks that disagree on a collective (rank-dependent control flow, per-rank shapes) and values
// used under another mesh: each must fail with an error naming both sides, never return
// mismatched data with an OK status.
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "collectives/communicator.h"
#include "collectives/in_process.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shardmap/ops/collective_ops.h"
#include "shardmap/runtime/context.h"
#include "shardmap/ops/ops.h"
#include "shardmap/shard_map.h"
#include "tensor/error.h"

namespace shardmap {
namespace {

using ::testing::HasSubstr;

Mesh M(std::vector<std::pair<std::string, int>> axes) { return *Mesh::Create(std::move(axes)); }

SpmdOptions Fast() {
  SpmdOptions o;
  o.comm.timeout = absl::Seconds(20);
  return o;
}

// x = rank + 1 on every rank, R everywhere but typed V (per-device values).
Value PerRank(RankContext& ctx) {
  return vary(Value::Replicated(Tensor::Full({3}, ctx.rank() + 1.0, DType::kF64)),
              ctx.mesh().axis_names());
}

Value Sum(const Value& x, const char* axis) { return all_reduce(reinterpret(x, axis), axis); }

void ExpectMismatch(const absl::Status& s, std::vector<std::string> parts) {
  ASSERT_FALSE(s.ok()) << "ranks that disagree were accepted";
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("mismatched collectives")) << s;
  for (const std::string& p : parts) EXPECT_THAT(std::string(s.message()), HasSubstr(p)) << s;
}

// The example: rank 0 reduces over tp then dp, the others dp then tp. Before, the lazily
// split communicators paired peers of different groups and ranks held 6/16/16/16 with OK.
TEST(CollectiveAgreement, RankDependentAxisOrderFailsOnFirstUse) {
  for (auto axes : {std::vector<std::pair<std::string, int>>{{"dp", 2}, {"tp", 2}},
                    {{"dp", 3}, {"tp", 2}}, {{"dp", 2}, {"tp", 3}}}) {
    Mesh mesh = M(axes);
    absl::Status s = RunSpmd(mesh, [](RankContext& ctx) {
      Value x = PerRank(ctx);
      Value y = ctx.rank() == 0 ? Sum(Sum(x, "tp"), "dp") : Sum(Sum(x, "dp"), "tp");
      (void)y;
    }, Fast());
    ExpectMismatch(s, {"all_reduce over tp", "all_reduce over dp", "collective #1"});
  }
}

// The same disagreement after both communicators exist (created by an agreeing first step): the
// program-order numbers differ inside a group.
TEST(CollectiveAgreement, RankDependentAxisOrderFailsWhenCommunicatorsExist) {
  absl::Status s = RunSpmd(M({{"dp", 2}, {"tp", 2}}), [](RankContext& ctx) {
    Value x = PerRank(ctx);
    (void)Sum(Sum(x, "tp"), "dp");  // agreeing: both communicators are created
    Value y = ctx.rank() == 0 ? Sum(Sum(x, "tp"), "dp") : Sum(Sum(x, "dp"), "tp");
    (void)y;
  }, Fast());
  ExpectMismatch(s, {"collective #3", "collective #4"});
}

TEST(CollectiveAgreement, FirstCollectiveOverDifferentAxesFails) {
  absl::Status s = RunSpmd(M({{"dp", 2}, {"tp", 2}}), [](RankContext& ctx) {
    Value x = PerRank(ctx);
    (void)Sum(x, ctx.rank() % 2 == 0 ? "tp" : "dp");
  }, Fast());
  ExpectMismatch(s, {"over tp", "over dp"});
}

TEST(CollectiveAgreement, TransposedShapesWithEqualCountsFail) {
  for (int n : {2, 3}) {
    absl::Status s = RunSpmd(M({{"tp", n}}), [](RankContext& ctx) {
      Shape shape = ctx.rank() == 0 ? Shape{2, 3} : Shape{3, 2};
      Value x = vary(Value::Replicated(Tensor::Ones(shape, DType::kF32)), {"tp"});
      (void)all_gather(x, 0, "tp");
    }, Fast());
    ExpectMismatch(s, {"all_gather over tp of f32[2,3]", "all_gather over tp of f32[3,2]"});
  }
}

TEST(CollectiveAgreement, DifferentDtypesFail) {
  absl::Status s = RunSpmd(M({{"tp", 2}}), [](RankContext& ctx) {
    DType dt = ctx.rank() == 0 ? DType::kF32 : DType::kF64;
    (void)Sum(PerRank(ctx).tensor.dtype() == dt ? PerRank(ctx) : cast(PerRank(ctx), dt), "tp");
  }, Fast());
  ExpectMismatch(s, {"f32[3]", "f64[3]"});
}

// Agreeing programs are unaffected, on meshes of odd sizes; the reduction is the exact sum.
TEST(CollectiveAgreement, AgreeingProgramsGiveTheSum) {
  for (auto axes : {std::vector<std::pair<std::string, int>>{{"dp", 3}, {"tp", 2}},
                    {{"dp", 1}, {"tp", 5}}, {{"a", 2}, {"b", 3}, {"c", 1}}}) {
    Mesh mesh = M(axes);
    const double n = mesh.size();
    absl::Status s = RunSpmd(mesh, [&](RankContext& ctx) {
      Value x = PerRank(ctx);
      for (const std::string& a : ctx.mesh().axis_names()) x = Sum(x, a.c_str());
      if (x.tensor.at(0) != n * (n + 1) / 2) OpFail("rank ", ctx.rank(), " got ", x.tensor.at(0));
    }, Fast());
    EXPECT_TRUE(s.ok()) << s;
  }
}

// A communicator that ignores call tags, as the Gloo and NCCL backends do: it forwards every
// call to the in-process one and wraps the communicators its Split returns.
class TagBlind final : public collectives::Communicator {
 public:
  explicit TagBlind(collectives::Communicator* inner, std::unique_ptr<Communicator> owned = {})
      : inner_(inner), owned_(std::move(owned)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string name() const override { return "tag-blind " + inner_->name(); }
  absl::Status AllReduce(const void* s, void* r, size_t n, collectives::DataType t,
                         collectives::ReduceOp op) override {
    return inner_->AllReduce(s, r, n, t, op);
  }
  absl::Status AllGather(const void* s, void* r, size_t n, collectives::DataType t) override {
    return inner_->AllGather(s, r, n, t);
  }
  absl::Status ReduceScatter(const void* s, void* r, size_t n, collectives::DataType t,
                             collectives::ReduceOp op) override {
    return inner_->ReduceScatter(s, r, n, t, op);
  }
  absl::Status AllToAll(const void* s, void* r, size_t n, collectives::DataType t) override {
    return inner_->AllToAll(s, r, n, t);
  }
  absl::Status AllGatherV(const void* s, void* r, absl::Span<const size_t> c,
                          collectives::DataType t) override {
    return inner_->AllGatherV(s, r, c, t);
  }
  absl::Status ReduceScatterV(const void* s, void* r, absl::Span<const size_t> c,
                              collectives::DataType t, collectives::ReduceOp op) override {
    return inner_->ReduceScatterV(s, r, c, t, op);
  }
  absl::Status AllToAllV(const void* s, absl::Span<const size_t> sc, void* r,
                         absl::Span<const size_t> rc, collectives::DataType t) override {
    return inner_->AllToAllV(s, sc, r, rc, t);
  }
  absl::Status Broadcast(void* b, size_t n, collectives::DataType t, int root) override {
    return inner_->Broadcast(b, n, t, root);
  }
  absl::Status Send(const void* b, size_t n, collectives::DataType t, int peer) override {
    return inner_->Send(b, n, t, peer);
  }
  absl::Status Recv(void* b, size_t n, collectives::DataType t, int peer) override {
    return inner_->Recv(b, n, t, peer);
  }
  absl::Status Ppermute(const void* s, void* r, size_t n, collectives::DataType t,
                        absl::Span<const std::pair<int, int>> pairs) override {
    return inner_->Ppermute(s, r, n, t, pairs);
  }
  absl::Status Barrier() override { return inner_->Barrier(); }
  absl::StatusOr<std::unique_ptr<Communicator>> Split(int color, int key) override {
    absl::StatusOr<std::unique_ptr<Communicator>> c = inner_->Split(color, key);
    if (!c.ok() || *c == nullptr) return c;
    Communicator* raw = c->get();
    return std::unique_ptr<Communicator>(std::make_unique<TagBlind>(raw, *std::move(c)));
  }

 private:
  Communicator* inner_;
  std::unique_ptr<Communicator> owned_;
};

// On a backend that ignores tags, ranks whose first collectives name different axes still never
// share a communicator: the Split is keyed by the axis set and the group size is checked.
TEST(CollectiveAgreement, FirstCollectiveOverDifferentAxesFailsWithoutTags) {
  for (auto axes : {std::vector<std::pair<std::string, int>>{{"dp", 2}, {"tp", 2}},
                    {{"dp", 3}, {"tp", 2}}}) {
    Mesh mesh = M(axes);
    collectives::InProcessOptions o;
    o.timeout = absl::Seconds(20);
    absl::Status s = collectives::RunInProcess(mesh.size(), [&](collectives::Communicator& c) {
      TagBlind blind(&c);
      return RunOnCommunicator(blind, mesh, [](RankContext& ctx) {
        Value x = PerRank(ctx);
        (void)(ctx.rank() == 0 ? Sum(Sum(x, "tp"), "dp") : Sum(Sum(x, "dp"), "tp"));
      });
    }, o);
    ASSERT_FALSE(s.ok()) << "ranks grouped for different axis sets were accepted";
    EXPECT_THAT(std::string(s.message()), HasSubstr("different axes at the same point")) << s;
  }
}

// A Value typed under {dp,tp} used inside a program over {sp}: its axis types would be read
// against the wrong axes ({dp:R,tp:S0} became {sp:R}); now every op refuses it.
TEST(ForeignMesh, ValueFromAnotherMeshIsRefused) {
  Value kept;
  ASSERT_TRUE(RunSpmd(M({{"dp", 2}, {"tp", 2}}), [&](RankContext& ctx) {
                if (ctx.rank() == 0) {
                  kept = vary(Value::Replicated(Tensor::Ones({4}, DType::kF32)), {"tp"});
                }
              }).ok());
  for (auto axes : {std::vector<std::pair<std::string, int>>{{"sp", 4}},
                    {{"dp", 2}, {"cp", 2}}}) {
    absl::Status s = RunSpmd(M(axes), [&](RankContext& ctx) {
      Value here = Value::Replicated(Tensor::Ones({4}, DType::kF32));
      (void)add(here, kept);
    });
    ASSERT_FALSE(s.ok());
    EXPECT_THAT(std::string(s.message()), HasSubstr("belongs to another mesh")) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("add")) << s;
  }
  // The same values in collectives and as shard_map outputs.
  absl::Status s = RunSpmd(M({{"dp", 2}, {"cp", 2}}), [&](RankContext&) {
    (void)all_reduce(kept, "cp");
  });
  EXPECT_THAT(std::string(s.message()), HasSubstr("belongs to another mesh")) << s;
  ShardMap f = shard_map([&](const std::vector<Value>&) -> std::vector<Value> { return {kept}; },
                         M({{"dp", 2}, {"cp", 2}}), {}, {P()});
  absl::StatusOr<std::vector<Tensor>> out = f({});
  ASSERT_FALSE(out.ok());
  EXPECT_THAT(std::string(out.status().message()), HasSubstr("another mesh")) << out.status();
}

TEST(ForeignMesh, EqualMeshesShareValues) {
  Value kept;
  ASSERT_TRUE(RunSpmd(M({{"dp", 2}}), [&](RankContext& ctx) {
                if (ctx.rank() == 0) kept = Value::Replicated(Tensor::Ones({2}, DType::kF32));
              }).ok());
  absl::Status s = RunSpmd(M({{"dp", 2}}), [&](RankContext&) {
    Value y = add(Value::Replicated(Tensor::Ones({2}, DType::kF32)), kept);
    if (y.tensor.at(0) != 2.0) OpFail("wrong sum");
  });
  EXPECT_TRUE(s.ok()) << s;
}

TEST(MeshCreate, SizeOverflowIsAnError) {
  absl::StatusOr<Mesh> m = Mesh::Create({{"a", 65536}, {"b", 65536}});
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(std::string(m.status().message()), HasSubstr("overflows"));
  EXPECT_THAT(std::string(m.status().message()), HasSubstr("a:65536"));
  EXPECT_TRUE(Mesh::Create({{"a", 46340}, {"b", 46340}}).ok());  // 2^31 - 1 > 46340^2
}

}  // namespace
}  // namespace shardmap
