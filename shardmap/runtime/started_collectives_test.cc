// all_reduce_start / reduce_scatter_start / all_gather_start: bitwise the blocking ops' values
// and types (1, 2, 3 and 5 devices, odd sizes, several calls in flight waited in any order),
// all_gather_start's gradients equal all_gather's with the reduce-scatter logged in the
// backward, and the error paths (on a tape, waited twice, indivisible dims, ranks that disagree)
// failing every rank without a hang.
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "autograd/tape.h"
#include "autograd/value_and_grad.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shardmap/runtime/async_collectives.h"
#include "shardmap/ops/collective_ops.h"
#include "shardmap/runtime/context.h"
#include "shardmap/ops/ops.h"
#include "shardmap/shard_map.h"
#include "spmd_testing/collectives.h"
#include "spmd_testing/testing.h"
#include "tensor/error.h"
#include "tests/test_util.h"

namespace shardmap {
namespace {

using ::testing::HasSubstr;
using testing::Rand;

SpmdType OneAxis(AxisType t) {
  SpmdType s(1);
  s[0] = t;
  return s;
}

void ExpectSame(const Value& got, const Value& want, const std::string& what) {
  EXPECT_TRUE(testing::TensorsBitwiseEqual(got.tensor, want.tensor)) << what;
  EXPECT_EQ(got.type, want.type) << what;
  EXPECT_EQ(got.shape(), want.shape()) << what;
}

TEST(StartedCollectivesTest, BitwiseTheBlockingOpsWithSeveralInFlight) {
  for (int n : {1, 2, 3, 5}) {
    SCOPED_TRACE(absl::StrCat("dp=", n));
    Mesh mesh = *Mesh::Create({{"dp", n}});
    absl::Status s = RunSpmd(mesh, [&](RankContext& ctx) {
      NoGradScope no_tape;
      const uint64_t seed = 10 + ctx.rank();
      Value a(Rand({7, 3}, seed), OneAxis(AxisType::P()));
      Value b(Rand({2 * n, 5}, seed + 100, DType::kF32), OneAxis(AxisType::P()));
      Value c(Rand({3, n * 3}, seed + 200), OneAxis(AxisType::P()));
      Value d(Rand({n + 1, 4}, seed + 300), OneAxis(AxisType::Sharded(1)));
      // Four in flight, waited in an order other than the starts'.
      PendingValue ra = all_reduce_start(a, "dp");
      PendingValue rb = reduce_scatter_start(b, 0, "dp");
      PendingValue rc = reduce_scatter_start(c, 1, "dp");
      PendingValue gd = all_gather_start(d, 1, "dp");
      Value got_c = rc.Wait(), got_a = ra.Wait(), got_d = gd.Wait(), got_b = rb.Wait();
      ExpectSame(got_a, all_reduce(a, "dp"), "all_reduce");
      ExpectSame(got_b, reduce_scatter(b, 0, "dp"), "reduce_scatter dim 0");
      ExpectSame(got_c, reduce_scatter(c, 1, "dp"), "reduce_scatter dim 1");
      ExpectSame(got_d, all_gather(d, 1, "dp"), "all_gather dim 1");
    });
    EXPECT_TRUE(s.ok()) << s;
  }
}

// loss = sum(all_gather(x * w)^2), the gather blocking or started: the same loss and gradients,
// and the started one's backward reduce-scatters (logged as backward) like the blocking one's.
ShardFn GatherLoss(bool started) {
  return [started](const std::vector<Value>& p) -> std::vector<Value> {
    Value v = p[0] * p[1];
    Value y;
    if (started) {
      PendingValue h = all_gather_start(v, 0, "fsdp");
      Value other = p[1] * 2.0;  // recorded between the start and Wait()
      y = h.Wait() + sum(other, {});
    } else {
      y = all_gather(v, 0, "fsdp") + sum(p[1] * 2.0, {});
    }
    return {sum_partial(y * y, {})};
  };
}

TEST(StartedCollectivesTest, AllGatherStartHasAllGathersGradients) {
  for (int n : {1, 2, 3, 5}) {
    SCOPED_TRACE(absl::StrCat("fsdp=", n));
    Mesh mesh = *Mesh::Create({{"dp", 2}, {"fsdp", n}});
    std::vector<Tensor> in = {Rand({2 * n * 3, 5}, 1), Rand({5}, 2)};
    std::vector<PartitionSpec> specs = {P({"dp", "fsdp"}), P()};
    std::vector<PartitionSpec> outs = {P().Unreduced({"dp"})};
    std::vector<CollectiveRecord> log, want_log;
    ShardMapOptions o, wo;
    o.collective_log = &log;
    wo.collective_log = &want_log;
    auto got = value_and_grad(shard_map(GatherLoss(true), mesh, specs, outs, o))(in);
    ASSERT_TRUE(got.ok()) << got.status();
    auto want = value_and_grad(shard_map(GatherLoss(false), mesh, specs, outs, wo))(in);
    ASSERT_TRUE(want.ok()) << want.status();
    EXPECT_TRUE(testing::TensorsBitwiseEqual(got->outputs[0], want->outputs[0]));
    EXPECT_TRUE(testing::TensorsBitwiseEqual(got->grads[0], want->grads[0]));
    EXPECT_TRUE(testing::TensorsBitwiseEqual(got->grads[1], want->grads[1]));
    ASSERT_EQ(log.size(), want_log.size());
    for (size_t i = 0; i < log.size(); ++i) {
      EXPECT_STREQ(log[i].op, want_log[i].op) << i;
      EXPECT_EQ(log[i].backward, want_log[i].backward) << i;
      EXPECT_EQ(log[i].bytes, want_log[i].bytes) << i;
    }
  }
}

// FSDP2's param_dtype: the gather moves f32 (half the bytes of the f64 parameter) and equals
// cast(all_gather(x)); the backward reduces in f64, as cast's VJP then all_gather's transpose.
TEST(StartedCollectivesTest, AllGatherStartInAnotherDtypeIsGatherThenCast) {
  for (int n : {2, 3}) {
    SCOPED_TRACE(absl::StrCat("fsdp=", n));
    Mesh mesh = *Mesh::Create({{"fsdp", n}});
    auto loss = [](bool started) -> ShardFn {
      return [started](const std::vector<Value>& p) -> std::vector<Value> {
        Value v = p[0] * 3.0;
        Value y = started ? all_gather_start(v, 1, "fsdp", DType::kF32).Wait()
                          : cast(all_gather(v, 1, "fsdp"), DType::kF32);
        return {cast(sum_partial(y * y, {}), DType::kF64)};
      };
    };
    std::vector<Tensor> in = {Rand({4, 2 * n + 2 * n}, 5)};
    std::vector<PartitionSpec> specs = {P(None, "fsdp")};
    std::vector<CollectiveRecord> log, want_log;
    ShardMapOptions o, wo;
    o.collective_log = &log;
    wo.collective_log = &want_log;
    auto got = value_and_grad(shard_map(loss(true), mesh, specs, {P()}, o))(in);
    ASSERT_TRUE(got.ok()) << got.status();
    auto want = value_and_grad(shard_map(loss(false), mesh, specs, {P()}, wo))(in);
    ASSERT_TRUE(want.ok()) << want.status();
    EXPECT_TRUE(testing::TensorsBitwiseEqual(got->outputs[0], want->outputs[0]));
    EXPECT_TRUE(testing::TensorsBitwiseEqual(got->grads[0], want->grads[0]));
    ASSERT_EQ(log.size(), want_log.size());
    for (size_t i = 0; i < log.size(); ++i) {
      const bool gather = std::string(log[i].op) == "all_gather";
      EXPECT_EQ(log[i].bytes, gather ? want_log[i].bytes / 2 : want_log[i].bytes) << i;
      EXPECT_EQ(log[i].dtype, gather ? DType::kF32 : DType::kF64) << i;
    }
  }
}

TEST(StartedCollectivesTest, MisuseIsAClearError) {
  Mesh mesh = *Mesh::Create({{"dp", 3}});
  std::mutex mu;
  std::vector<std::string> errors;
  absl::Status s = RunSpmd(mesh, [&](RankContext& ctx) {
    auto expect_error = [&](const std::function<void()>& f) {
      try {
        f();
        std::lock_guard<std::mutex> lock(mu);
        errors.push_back("no error");
      } catch (const OpError& e) {
        std::lock_guard<std::mutex> lock(mu);
        errors.push_back(e.what());
      }
    };
    Value p(Rand({6, 2}, 1 + ctx.rank()), OneAxis(AxisType::P()));
    Tape tape;
    Value watched = tape.Watch(p);
    expect_error([&] {
      ScopedRecorder rec(&tape);
      (void)all_reduce_start(watched, "dp");
    });
    NoGradScope no_tape;
    expect_error([&] { (void)reduce_scatter_start(Value(Rand({4, 2}, 3), p.type), 0, "dp"); });
    PendingValue h = all_reduce_start(p, "dp");
    (void)h.Wait();
    expect_error([&] { (void)h.Wait(); });
    expect_error([&] { (void)all_reduce_start(Value(Rand({2}, 1), OneAxis(AxisType::R())), "dp"); });
  });
  EXPECT_TRUE(s.ok()) << s;
  ASSERT_EQ(errors.size(), 12u);
  int tape = 0, divisible = 0, twice = 0, type = 0;
  for (const std::string& e : errors) {
    tape += absl::StrContains(e, "being recorded on a tape");
    divisible += absl::StrContains(e, "not divisible by the 3 devices");
    twice += absl::StrContains(e, "already waited");
    type += absl::StrContains(e, "all_reduce_start");
  }
  EXPECT_EQ(tape, 3);
  EXPECT_EQ(divisible, 3);
  EXPECT_EQ(twice, 3);
  EXPECT_GE(type, 6) << absl::StrJoin(errors, "\n");
}

// A rank whose started call differs (shape) fails the call on every rank: no hang.
TEST(StartedCollectivesTest, RanksThatDisagreeFailEveryRank) {
  Mesh mesh = *Mesh::Create({{"dp", 3}});
  absl::Status s = RunSpmd(mesh, [&](RankContext& ctx) {
    NoGradScope no_tape;
    const int64_t rows = ctx.rank() == 1 ? 5 : 4;
    PendingValue h = all_reduce_start(Value(Rand({rows, 3}, 1), OneAxis(AxisType::P())), "dp");
    (void)h.Wait();
  });
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("all_reduce_start"));
}

}  // namespace
}  // namespace shardmap
