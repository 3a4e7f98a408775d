// Typed collectives: forward numbers against the whole-tensor reference, type rules and their
// messages, and failure behaviour (an erroring rank never hangs the others).
#include "shardmap/ops/collective_ops.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shardmap/runtime/context.h"
#include "shardmap/ops/ops.h"
#include "shardmap/shard_map.h"
#include "shardmap/sharding.h"
#include "tensor/error.h"
#include "tensor/ops/elementwise.h"
#include "tensor/ops/matmul.h"
#include "tensor/ops/reduce.h"
#include "tensor/ops/shape_ops.h"
#include "tests/test_util.h"

namespace shardmap {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::Rand;

Tensor Run1(const Mesh& mesh, ShardFn fn, std::vector<Tensor> in, std::vector<PartitionSpec> ins,
            PartitionSpec out) {
  absl::StatusOr<std::vector<Tensor>> r = shard_map(fn, mesh, ins, {out})(in);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? (*r)[0] : Tensor();
}

TEST(CollectiveOpsTest, ForwardMatchesWholeTensorReference) {
  for (int n : {2, 3, 5}) {
    SCOPED_TRACE(n);
    Mesh mesh = *Mesh::Create({{"x", n}});
    Tensor a = Rand({n * 2, 3}, 1);
    // all_reduce(sum_partial) == global column sums, on every rank.
    Tensor s = Run1(mesh, [](const std::vector<Value>& v) -> std::vector<Value> {
      return {all_reduce(sum_partial(v[0], {0}), "x")};
    }, {a}, {P("x")}, P());
    EXPECT_TENSOR_NEAR(s, Sum(a, {0}), 1e-12);
    // all_gather(S0) == the whole tensor.
    Tensor g = Run1(mesh, [](const std::vector<Value>& v) -> std::vector<Value> {
      return {all_gather(v[0], 0, "x")};
    }, {a}, {P("x")}, P());
    EXPECT_TRUE(testing::TensorsBitwiseEqual(g, a));
    // max/min over devices of their shards == max/min over the row blocks.
    Tensor b = Rand({n, 4}, 2);
    Tensor mx = Run1(mesh, [](const std::vector<Value>& v) -> std::vector<Value> {
      return {all_reduce(v[0], "x", To::kR, ReduceKind::kMax)};
    }, {b}, {P("x")}, P());
    EXPECT_TENSOR_NEAR(mx, Max(b, {0}, true), 0);
    Tensor mean = Run1(mesh, [](const std::vector<Value>& v) -> std::vector<Value> {
      return {all_reduce(v[0], "x", To::kI, ReduceKind::kMean)};
    }, {b}, {P("x")}, P());
    EXPECT_TENSOR_NEAR(mean, Mean(b, {0}, true), 1e-12);
    // all_to_all: S0 -> S1 keeps the global tensor.
    Tensor c = Rand({n * 2, n * 3}, 3);
    Tensor t = Run1(mesh, [](const std::vector<Value>& v) -> std::vector<Value> {
      return {all_to_all(v[0], 1, 0, "x")};
    }, {c}, {P("x")}, P(None, "x"));
    EXPECT_TRUE(testing::TensorsBitwiseEqual(t, c));
    // ppermute by one: block i moves to i+1.
    std::vector<std::pair<int, int>> ring;
    for (int i = 0; i < n; ++i) ring.push_back({i, (i + 1) % n});
    Tensor pr = Run1(mesh, [ring](const std::vector<Value>& v) -> std::vector<Value> {
      return {ppermute(v[0], "x", ring)};
    }, {b}, {P("x")}, P("x"));
    EXPECT_TRUE(testing::TensorsBitwiseEqual(Slice(pr, 0, 1, n - 1), Slice(b, 0, 0, n - 1)));
    EXPECT_TRUE(testing::TensorsBitwiseEqual(Slice(pr, 0, 0, 1), Slice(b, 0, n - 1, 1)));
    // broadcast from root 1 == block 1.
    Tensor bc = Run1(mesh, [](const std::vector<Value>& v) -> std::vector<Value> {
      return {broadcast(v[0], "x", 1)};
    }, {b}, {P("x")}, P());
    EXPECT_TRUE(testing::TensorsBitwiseEqual(bc, Slice(b, 0, 1, 1)));
    // convert(R->P) summed at the boundary == the value once (not n times).
    Tensor once = Run1(mesh, [](const std::vector<Value>& v) -> std::vector<Value> {
      return {convert(v[0], "x", Convert::kRToP)};
    }, {b}, {P()}, P().Unreduced({"x"}));
    EXPECT_TENSOR_NEAR(once, b, 0);
    // Uneven reduce_scatter/all_gather with split_sizes.
    std::vector<int64_t> sizes;
    int64_t total = 0;
    for (int i = 0; i < n; ++i) sizes.push_back(i % 2 + 1), total += i % 2 + 1;
    // Every rank contributes its own [total, 2] slab (the S0 block of u, summed over its one
    // row: P on x); rank i must hold rows [start_i, start_i + sizes[i]) of the sum of all slabs.
    Tensor u = Rand({n, total, 2}, 4);
    const Tensor usum = Sum(u, {0});
    Tensor back = Run1(mesh, [sizes, usum](const std::vector<Value>& v) -> std::vector<Value> {
      Value sh = reduce_scatter(sum_partial(v[0], {0}), 0, "x", sizes);
      const int me = axis_index("x");
      int64_t start = 0;
      for (int k = 0; k < me; ++k) start += sizes[k];
      EXPECT_TENSOR_NEAR(sh.tensor, Slice(usum, 0, start, sizes[me]), 1e-15);
      return {all_gather(sh, 0, "x", sizes)};
    }, {u}, {P("x")}, P());
    EXPECT_TENSOR_NEAR(back, usum, 1e-15);
    // Uneven all_to_all: uneven row blocks -> uneven column blocks, gathered back whole.
    Tensor sq = Rand({total, total}, 6);
    Tensor a2a = Run1(mesh, [sizes](const std::vector<Value>& v) -> std::vector<Value> {
      int me = axis_index("x");
      int64_t start = 0;
      for (int k = 0; k < me; ++k) start += sizes[k];
      Value rows = slice(vary(v[0], "x"), 0, start, sizes[me]);
      Value cols = all_to_all(rows, 1, 0, "x", sizes, sizes);
      EXPECT_EQ(cols.dim(0), v[0].dim(0));
      EXPECT_EQ(cols.dim(1), sizes[me]);
      return {all_gather(cols, 1, "x", sizes)};
    }, {sq}, {P()}, P());
    EXPECT_TRUE(testing::TensorsBitwiseEqual(a2a, sq));
  }
}

TEST(CollectiveOpsTest, SeveralAxesFollowMeshOrder) {
  Mesh mesh = *Mesh::Create({{"dp", 2}, {"tp", 3}});
  Tensor a = Rand({12, 2}, 5);
  Tensor g = Run1(mesh, [](const std::vector<Value>& v) -> std::vector<Value> {
    return {all_gather(v[0], 0, {"dp", "tp"})};
  }, {a}, {P({"dp", "tp"})}, P());
  EXPECT_TRUE(testing::TensorsBitwiseEqual(g, a));
  // Gathering the minor axis only keeps S0 on the major one.
  Tensor h = Run1(mesh, [](const std::vector<Value>& v) -> std::vector<Value> {
    Value r = all_gather(v[0], 0, "tp");
    EXPECT_EQ(r.type.ToString({"dp", "tp"}), "{dp:S0,tp:R}");
    return {r};
  }, {a}, {P({"dp", "tp"})}, P("dp"));
  EXPECT_TRUE(testing::TensorsBitwiseEqual(h, a));
  // Gathering the major axis only: the minor one loses its S (blocks are not contiguous).
  absl::Status s = RunSpmd(mesh, [&](RankContext& ctx) {
    Value v(ShardOf(a, mesh, P({"dp", "tp"}), ctx.rank()), P({"dp", "tp"}).InputType(mesh));
    EXPECT_EQ(all_gather(v, 0, "dp").type.ToString({"dp", "tp"}), "{dp:R,tp:V}");
  });
  EXPECT_TRUE(s.ok()) << s;
}

TEST(CollectiveOpsTest, TypeErrorsNameTheFix) {
  SingleRankContext one(*Mesh::Create({{"dp", 1}, {"tp", 1}}));
  auto err = [](const std::function<void()>& f) {
    return std::string(CatchOpError(f).message());
  };
  SpmdType v(2, AxisType::V()), r(2, AxisType::R()), p(2, AxisType::P());
  Value xv(Tensor::Ones({2, 2}), v), xr(Tensor::Ones({2, 2}), r), xp(Tensor::Ones({2, 2}), p);
  EXPECT_THAT(err([&] { all_reduce(xv, "tp"); }),
              AllOf(HasSubstr("all_reduce(sum)"), HasSubstr("axis 'tp'"), HasSubstr("reinterpret"),
                    HasSubstr("x=f32[2,2]{dp:V,tp:V}")));
  EXPECT_THAT(err([&] { all_reduce(xr, "tp"); }), HasSubstr("already the same on every device"));
  EXPECT_THAT(err([&] { all_reduce(xp, "tp", To::kR, ReduceKind::kMax); }),
              HasSubstr("ReduceKind::kSum"));
  EXPECT_THAT(err([&] { all_gather(xp, 0, "tp"); }), HasSubstr("reduce_scatter"));
  Value s1(Tensor::Ones({2, 2}), [] {
    SpmdType t(2);
    t[1] = AxisType::Sharded(1);
    return t;
  }());
  EXPECT_THAT(err([&] { all_gather(s1, 0, "tp"); }),
              AllOf(HasSubstr("sharded along dim 1"), HasSubstr("all_to_all")));
  EXPECT_THAT(err([&] { reduce_scatter(xr, 0, "tp"); }), HasSubstr("partial sum (P)"));
  EXPECT_THAT(err([&] { convert(xr, "tp", Convert::kIToR); }), HasSubstr("takes I"));
  EXPECT_THAT(err([&] { reinterpret(xr, "tp"); }), HasSubstr("Convert::kRToP"));
  EXPECT_THAT(err([&] { all_reduce(xp, "pp"); }), HasSubstr("unknown mesh axis 'pp'"));
  EXPECT_THAT(err([&] { all_to_all(xp, 0, 1, "tp"); }), HasSubstr("all_to_all"));
  EXPECT_THAT(err([&] { ppermute(xv, "tp", {{0, 0}, {0, 0}}); }), HasSubstr("invalid pair"));
  // Types only change on the named axes.
  EXPECT_EQ(all_reduce(xp, "tp").type.ToString({"dp", "tp"}), "{dp:P,tp:R}");
  EXPECT_EQ(axis_index("tp"), 0);
}

// AxesWhere names the axes of a kind in mesh order; all_reduce_partial resolves every pending
// sum in one collective over exactly those axes, and is the identity (no collective) when none.
TEST(CollectiveOpsTest, AllReducePartialResolvesExactlyThePendingAxes) {
  for (auto [dp, tp] : {std::pair{2, 3}, std::pair{3, 1}}) {
    SCOPED_TRACE(absl::StrCat("dp=", dp, " tp=", tp));
    Mesh mesh = *Mesh::Create({{"dp", dp}, {"tp", tp}, {"cp", 2}});
    Tensor x = Rand({dp * 2, tp * 5}, 7), w = Rand({tp * 5, 3}, 8);
    std::vector<CollectiveRecord> log;
    ShardMapOptions o;
    o.collective_log = &log;
    // x S0 on dp and S1 on tp, w S0 on tp: x @ w is S0 on dp and P on tp; summing its rows
    // leaves P on dp and tp (R on cp).
    ShardFn fn = [](const std::vector<Value>& in) -> std::vector<Value> {
      Value partial = sum_partial(in[0].matmul(in[1]), {0});
      EXPECT_EQ(AxesWhere(partial, AxisKind::kP).names, (std::vector<std::string>{"dp", "tp"}));
      EXPECT_EQ(AxesWhere(partial, AxisKind::kR).names, (std::vector<std::string>{"cp"}));
      EXPECT_TRUE(AxesWhere(partial, AxisKind::kI).empty());
      Value whole = all_reduce_partial(partial);
      Value again = all_reduce_partial(whole);  // nothing pending: x itself, no collective
      EXPECT_EQ(again.tensor.raw_data(), whole.tensor.raw_data());
      return {again};
    };
    absl::StatusOr<std::vector<Tensor>> r =
        shard_map(fn, mesh, {P("dp", "tp"), P("tp", None)}, {P()}, o)({x, w});
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TENSOR_NEAR((*r)[0], Sum(Matmul(x, w), {0}), 1e-12);
    ASSERT_EQ(log.size(), 1u);
    EXPECT_STREQ(log[0].op, "all_reduce");
    EXPECT_EQ(mesh.MaskToString(log[0].axes), "(dp,tp)");
  }
}

TEST(CollectiveOpsTest, AFailingRankDoesNotHangTheOthers) {
  Mesh mesh = *Mesh::Create({{"tp", 3}});
  absl::Status s = RunSpmd(mesh, [&](RankContext& ctx) {
    Value x = Value::Replicated(Tensor::Ones({2}));
    if (ctx.rank() == 1) OpFail("rank 1 gives up");
    all_reduce(convert(x, "tp", Convert::kRToP), "tp");
  });
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("rank 1 gives up"));
}

}  // namespace
}  // namespace shardmap
