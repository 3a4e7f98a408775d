// ppermute_start / Wait(): the same numbers, types and gradients as ppermute (f64, 1 to 4
// devices, two-axis meshes), the backward's transfers ordered so that they overlap too, and the
// error paths (bad pairs, types, waiting twice or never, mismatched ranks) failing without hangs.
#include "shardmap/runtime/async_collectives.h"

#include <mutex>
#include <string>
#include <vector>

#include "autograd/value_and_grad.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shardmap/ops/collective_ops.h"
#include "shardmap/runtime/context.h"
#include "shardmap/ops/ops.h"
#include "shardmap/shard_map.h"
#include "spmd_testing/collectives.h"
#include "tensor/error.h"
#include "tests/test_util.h"

namespace shardmap {
namespace {

using ::testing::HasSubstr;
using testing::Rand;
using Pairs = std::vector<std::pair<int, int>>;

Pairs Ring(int n) {
  Pairs p;
  for (int i = 0; i < n; ++i) p.push_back({i, (i + 1) % n});
  return p;
}

// loss = sum(permute(x * w)^2) with the permute blocking or not; x S0 on tp, w replicated (R,
// so its gradient goes through the R -> P rule of the transpose).
ShardFn PermuteLoss(bool async, Pairs pairs) {
  return [async, pairs](const std::vector<Value>& p) -> std::vector<Value> {
    Value v = p[0] * p[1];
    Value y;
    if (async) {
      PendingPpermute h = ppermute_start(v, "tp", pairs);
      y = h.Wait();
    } else {
      y = ppermute(v, "tp", pairs);
    }
    return {sum_partial(y * y, {}), y};
  };
}

TEST(AsyncCollectivesTest, SameValuesTypesAndGradientsAsPpermute) {
  for (int n : {1, 2, 3, 4}) {
    for (const Pairs& pairs : {Ring(n), Pairs{{0, n - 1}}}) {
      SCOPED_TRACE(absl::StrCat("tp=", n, " pairs=", pairs.size()));
      Mesh mesh = *Mesh::Create({{"dp", 2}, {"tp", n}});
      std::vector<Tensor> in = {Rand({2 * n * 3, 5}, 1), Rand({5}, 2)};
      std::vector<PartitionSpec> specs = {P({"dp", "tp"}), P()};
      std::vector<PartitionSpec> outs = {P().Unreduced({"dp", "tp"}), P({"dp", "tp"})};
      std::vector<CollectiveRecord> log;
      ShardMapOptions o;
      o.collective_log = &log;
      auto got = value_and_grad(shard_map(PermuteLoss(true, pairs), mesh, specs, outs, o))(in);
      ASSERT_TRUE(got.ok()) << got.status();
      auto want = value_and_grad(shard_map(PermuteLoss(false, pairs), mesh, specs, outs))(in);
      ASSERT_TRUE(want.ok()) << want.status();
      EXPECT_TRUE(testing::TensorsBitwiseEqual(got->outputs[1], want->outputs[1]));
      EXPECT_TENSOR_NEAR(got->outputs[0], want->outputs[0], 1e-12);
      EXPECT_TENSOR_NEAR(got->grads[0], want->grads[0], 1e-12);
      EXPECT_TENSOR_NEAR(got->grads[1], want->grads[1], 1e-12);
      spmd_testing::ExpectCollectives(mesh, log, {spmd_testing::Ppermute("tp").Bytes(3 * 5 * 8)},
                                      {spmd_testing::Ppermute("tp").Bytes(3 * 5 * 8)});
    }
  }
}

// The types are ppermute's: S0 in, V out (the rule does not know where the blocks went).
TEST(AsyncCollectivesTest, ResultTypeIsPpermutes) {
  Mesh mesh = *Mesh::Create({{"dp", 2}, {"tp", 3}});
  std::mutex mu;
  std::vector<std::string> types;
  absl::Status s = RunSpmd(mesh, [&](RankContext& ctx) {
    Value x(Tensor::Ones({2, 3}, DType::kF64), [&] {
      SpmdType t(2);
      t[1] = AxisType::Sharded(0);
      t.set_mesh_id(ctx.mesh().id());
      return t;
    }());
    PendingPpermute h = ppermute_start(x, "tp", Ring(3));
    Value y = h.Wait();
    Value z = ppermute(x, "tp", Ring(3));
    std::lock_guard<std::mutex> l(mu);
    types.push_back(y.ToString());
    EXPECT_EQ(y.ToString(), z.ToString());
  });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(types[0], "f64[2,3]{dp:R,tp:V}");
}

// The transposes swap roles: Wait()'s VJP starts the backward transfer and the start's VJP waits
// for it, so the backward of what ran between them (here an all_reduce, whose transpose logs an
// all_reduce) is issued while the backward transfer is in flight: after it in rank 0's log.
TEST(AsyncCollectivesTest, BackwardTransferOverlapsTheBackwardOfTheMiddle) {
  Mesh mesh = *Mesh::Create({{"tp", 3}});
  ShardFn fn = [](const std::vector<Value>& p) -> std::vector<Value> {
    PendingPpermute h = ppermute_start(p[0], "tp", Ring(3));
    Value m = all_reduce(sum_partial(p[1] * p[1], {}), "tp");  // the "compute" in between
    Value y = h.Wait();
    return {sum_partial(y * y, {}) + convert(m, "tp", Convert::kRToP)};
  };
  std::vector<CollectiveRecord> log;
  ShardMapOptions o;
  o.collective_log = &log;
  auto got = value_and_grad(shard_map(fn, mesh, {P("tp"), P("tp")}, {P().Unreduced({"tp"})}, o))(
      {Rand({6, 2}, 3), Rand({6, 2}, 4)});
  ASSERT_TRUE(got.ok()) << got.status();
  std::vector<std::string> order;
  for (const CollectiveRecord& r : log) {
    order.push_back(absl::StrCat(r.backward ? "bwd:" : "fwd:", r.op));
  }
  EXPECT_THAT(order, ::testing::ElementsAre("fwd:ppermute", "fwd:all_reduce", "bwd:ppermute",
                                            "bwd:all_reduce"));
}

// Per-rank outcomes of a program expected to fail everywhere.
struct Failures {
  std::mutex mu;
  std::vector<std::string> by_rank;
  explicit Failures(int n) : by_rank(n) {}
  template <typename F>
  void Run(int rank, F&& f) {
    try {
      f();
    } catch (const OpError& e) {
      std::lock_guard<std::mutex> l(mu);
      by_rank[rank] = std::string(e.status().message());
      throw;
    }
  }
};

collectives::InProcessOptions ShortTimeout() {
  collectives::InProcessOptions o;
  o.timeout = absl::Seconds(20);
  return o;
}

TEST(AsyncCollectivesTest, MismatchedShapesFailEveryRankWithoutHanging) {
  const absl::Time t0 = absl::Now();
  Mesh mesh = *Mesh::Create({{"tp", 4}});
  Failures f(4);
  SpmdOptions o;
  o.comm = ShortTimeout();
  absl::Status s = RunSpmd(mesh, [&](RankContext& ctx) {
    f.Run(ctx.rank(), [&] {
      // Rank 1 holds a [3,2] block where the others hold [2,3] (same element count).
      Tensor t = ctx.rank() == 1 ? Tensor::Ones({3, 2}, DType::kF64)
                                 : Tensor::Ones({2, 3}, DType::kF64);
      Value x = Value::Replicated(t);
      PendingPpermute h = ppermute_start(x, "tp", Ring(4));
      Value y = h.Wait();
      all_reduce(sum_partial(y, {}), "tp");  // ranks whose partners matched fail here
    });
  }, o);
  EXPECT_THAT(s.message(), HasSubstr("mismatched ppermutes")) << s;
  EXPECT_THAT(s.message(), HasSubstr("f64[3,2]"));
  for (int r = 0; r < 4; ++r) EXPECT_FALSE(f.by_rank[r].empty()) << "rank " << r;
  EXPECT_LT(absl::Now() - t0, absl::Seconds(10));
}

TEST(AsyncCollectivesTest, WaitingTwiceOrNeverIsAnError) {
  Mesh mesh = *Mesh::Create({{"tp", 3}});
  absl::Status twice = RunSpmd(mesh, [&](RankContext&) {
    PendingPpermute h = ppermute_start(Value::Replicated(Tensor::Ones({2})), "tp", Ring(3));
    Value y = h.Wait();
    Value again = h.Wait();
  });
  EXPECT_THAT(twice.message(), HasSubstr("already waited")) << twice;
  absl::Status never = RunSpmd(mesh, [&](RankContext& ctx) {
    {
      PendingPpermute h = ppermute_start(Value::Replicated(Tensor::Ones({2})), "tp", Ring(3));
      Value y;
      if (ctx.rank() != 2) y = h.Wait();  // rank 2 drops its handle
    }
    all_reduce(sum_partial(vary(Value::Replicated(Tensor::Ones({2})), "tp"), {}), "tp");
  });
  EXPECT_THAT(std::string(never.message()), HasSubstr("never waited")) << never;
  EXPECT_THAT(std::string(never.message()), HasSubstr("ppermute_start over tp"));
}

// Unwinding from another error drops the handle quietly: that error is reported.
TEST(AsyncCollectivesTest, AnErrorBeforeWaitIsTheOneReported) {
  Mesh mesh = *Mesh::Create({{"tp", 2}});
  absl::Status s = RunSpmd(mesh, [&](RankContext& ctx) {
    PendingPpermute h = ppermute_start(Value::Replicated(Tensor::Ones({2})), "tp", Ring(2));
    if (ctx.rank() == 1) OpFail("the user's own error");
    Value y = h.Wait();
  });
  EXPECT_THAT(s.message(), HasSubstr("the user's own error")) << s;
}

TEST(AsyncCollectivesTest, BadPairsAndTypesAreRejected) {
  Mesh mesh = *Mesh::Create({{"tp", 2}});
  for (const Pairs& bad : {Pairs{{0, 2}}, Pairs{{0, 1}, {1, 1}}}) {
    absl::Status s = RunSpmd(mesh, [&](RankContext&) {
      PendingPpermute h = ppermute_start(Value::Replicated(Tensor::Ones({2})), "tp", bad);
      Value y = h.Wait();
    });
    EXPECT_THAT(s.message(), HasSubstr("invalid pair")) << s;
  }
  absl::Status s = RunSpmd(mesh, [&](RankContext&) {
    Value p = sum_partial(vary(Value::Replicated(Tensor::Ones({2})), "tp"), {});  // P on tp
    PendingPpermute h = ppermute_start(p, "tp", Ring(2));
    Value y = h.Wait();
  });
  EXPECT_THAT(s.message(), HasSubstr("ppermute_start")) << s;
  EXPECT_THAT(s.message(), HasSubstr("P")) << s;
}

}  // namespace
}  // namespace shardmap
