// all_gather_flat_start against all_gather of each shard alone (the independent reference):
// values, types and gradients bitwise on 1, 2, 3 and 5 devices with shards gathered along
// different dims and odd sizes, on a 2-axis mesh (HSDP's shape), in another dtype; one call each
// way in the log; a gathered value nothing uses gets zeros; and the error paths.
// reduce_scatter_flat_start (the backward alone) against reduce_scatter of each gradient alone.
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "autograd/tape.h"
#include "autograd/value_and_grad.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shardmap/runtime/async_collectives.h"
#include "shardmap/ops/collective_ops.h"
#include "shardmap/runtime/context.h"
#include "shardmap/runtime/flat_gather.h"
#include "shardmap/ops/ops.h"
#include "shardmap/shard_map.h"
#include "shardmap/rules/type_rules.h"
#include "spmd_testing/testing.h"
#include "tensor/error.h"
#include "tests/test_util.h"

namespace shardmap {
namespace {

using testing::Rand;

// Three shards on mesh {dp: 2, fsdp: n}: a [3, 5] gathered along dim 1, a [7] vector along
// dim 0 (V: layout unknown), a [5, 2, 3] along dim 1. Different per rank.
std::vector<Value> Shards(const RankContext& ctx) {
  const uint64_t seed = 100 + 10 * ctx.rank();
  SpmdType s1(2), v(2), s1b(2);
  s1[1] = AxisType::Sharded(1);
  v[1] = AxisType::V();
  s1b[1] = AxisType::Sharded(1);
  return {Value(Rand({3, 5}, seed), s1), Value(Rand({7}, seed + 1), v),
          Value(Rand({5, 2, 3}, seed + 2), s1b)};
}
const std::vector<int> kDims = {1, 0, 1};

// loss = sum_k sum(gathered_k * c_k) (+ gathered_k^2), the gathers flat or one by one.
// `skip`: a shard whose gathered value the loss does not use (-1: none).
struct Result {
  std::vector<Value> gathered;
  std::vector<Value> grads;
};
Result GatherAndDifferentiate(RankContext& ctx, bool flat, int skip, bool bf16) {
  Tape tape;
  std::vector<Value> shards = Shards(ctx);
  for (Value& s : shards) s = tape.Watch(s);
  Result r;
  Value loss;
  {
    ScopedRecorder rec(&tape);
    std::optional<DType> dt;
    if (bf16) dt = DType::kBF16;
    if (flat) {
      // Two in flight (shards 0-1, then 2), waited in start order: in the backward the second
      // one's reduce-scatter runs while the first one's cotangents are packed.
      PendingFlatGather a = all_gather_flat_start({shards[0], shards[1]}, {kDims[0], kDims[1]},
                                                  "fsdp", dt);
      PendingFlatGather b = all_gather_flat_start({shards[2]}, {kDims[2]}, "fsdp", dt);
      r.gathered = a.Wait();
      r.gathered.push_back(b.Wait()[0]);
    } else {
      for (size_t k = 0; k < shards.size(); ++k) {
        Value y = all_gather(shards[k], kDims[k], "fsdp");
        r.gathered.push_back(bf16 ? cast(y, DType::kBF16) : y);
      }
    }
    for (size_t k = 0; k < r.gathered.size(); ++k) {
      if (static_cast<int>(k) == skip) continue;
      Value y = bf16 ? cast(r.gathered[k], DType::kF64) : r.gathered[k];
      Value term = sum_partial(y * y * (1.0 + static_cast<double>(k)), {});
      loss = loss.defined() ? loss + term : term;
    }
  }
  r.grads = tape.Backward(loss, LossSeed(loss), shards);
  return r;
}

TEST(FlatGatherTest, BitwiseEachShardsAllGatherWithGradients) {
  for (int n : {1, 2, 3, 5}) {
    for (bool bf16 : {false, true}) {
      SCOPED_TRACE(absl::StrCat("fsdp=", n, bf16 ? " bf16" : " f64"));
      Mesh mesh = *Mesh::Create({{"dp", 2}, {"fsdp", n}});
      std::mutex mu;
      std::vector<std::string> failures;
      std::vector<CollectiveRecord> flat_log;
      absl::Status s = RunSpmd(mesh, [&](RankContext& ctx) {
        Result want = GatherAndDifferentiate(ctx, false, -1, bf16);
        const size_t before = ctx.collective_log().size();
        Result got = GatherAndDifferentiate(ctx, true, -1, bf16);
        std::lock_guard<std::mutex> lock(mu);
        for (size_t k = 0; k < 3; ++k) {
          if (!testing::TensorsBitwiseEqual(got.gathered[k].tensor, want.gathered[k].tensor) ||
              got.gathered[k].type != want.gathered[k].type) {
            failures.push_back(absl::StrCat("rank ", ctx.rank(), " gathered ", k));
          }
          if (!testing::TensorsBitwiseEqual(got.grads[k].tensor, want.grads[k].tensor) ||
              got.grads[k].type != want.grads[k].type) {
            failures.push_back(absl::StrCat("rank ", ctx.rank(), " grad ", k, ": ",
                                            got.grads[k].ToString(), " vs ",
                                            want.grads[k].ToString()));
          }
        }
        if (ctx.rank() == 0) {
          flat_log.assign(ctx.collective_log().begin() + before, ctx.collective_log().end());
        }
      });
      ASSERT_TRUE(s.ok()) << s;
      EXPECT_TRUE(failures.empty()) << absl::StrJoin(failures, "\n");
      if (n == 1) continue;  // a group of one logs nothing on the CPU
      // Per flat call one gather forward and one reduce-scatter backward, of the packed bytes.
      const int64_t a = 15 + 7, b = 30;
      ASSERT_EQ(flat_log.size(), 4u);
      EXPECT_STREQ(flat_log[0].op, "all_gather");
      EXPECT_FALSE(flat_log[0].backward);
      EXPECT_EQ(flat_log[0].bytes, a * (bf16 ? 2 : 8));
      EXPECT_EQ(flat_log[1].bytes, b * (bf16 ? 2 : 8));
      EXPECT_STREQ(flat_log[2].op, "reduce_scatter");
      EXPECT_TRUE(flat_log[2].backward);
      EXPECT_EQ(flat_log[2].bytes, n * b * 8);  // the second gather's, whose Wait() came last
      EXPECT_EQ(flat_log[3].bytes, n * a * 8);
    }
  }
}

TEST(FlatGatherTest, AGatheredValueNothingUsesGetsAZeroGradient) {
  Mesh mesh = *Mesh::Create({{"dp", 2}, {"fsdp", 3}});
  std::mutex mu;
  std::vector<std::string> failures;
  absl::Status s = RunSpmd(mesh, [&](RankContext& ctx) {
    for (int skip : {0, 1, 2}) {
      Result want = GatherAndDifferentiate(ctx, false, skip, false);
      Result got = GatherAndDifferentiate(ctx, true, skip, false);
      std::lock_guard<std::mutex> lock(mu);
      for (size_t k = 0; k < 3; ++k) {
        if (!testing::TensorsBitwiseEqual(got.grads[k].tensor, want.grads[k].tensor)) {
          failures.push_back(absl::StrCat("skip ", skip, " grad ", k));
        }
      }
    }
  });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(failures.empty()) << absl::StrJoin(failures, "\n");
}

// Records the OpError message of f, or "no error".
using ExpectError = std::function<void(const std::function<void()>&)>;

// Runs `calls` on each of 3 ranks (fsdp=3); all ranks' ExpectError records, rank by rank.
std::vector<std::string> ErrorsOnThreeRanks(
    const std::function<void(RankContext&, const ExpectError&)>& calls) {
  Mesh mesh = *Mesh::Create({{"fsdp", 3}});
  std::mutex mu;
  std::vector<std::string> errors;
  absl::Status s = RunSpmd(mesh, [&](RankContext& ctx) {
    std::vector<std::string> mine;
    calls(ctx, [&](const std::function<void()>& f) {
      try {
        f();
        mine.push_back("no error");
      } catch (const OpError& e) {
        mine.push_back(e.what());
      }
    });
    std::lock_guard<std::mutex> lock(mu);
    errors.insert(errors.end(), mine.begin(), mine.end());
  });
  EXPECT_TRUE(s.ok()) << s;
  return errors;
}

TEST(FlatGatherTest, MisuseIsAClearError) {
  const std::vector<std::string> errors =
      ErrorsOnThreeRanks([](RankContext& ctx, const ExpectError& expect_error) {
    SpmdType s0(1), p(1);
    s0[0] = AxisType::Sharded(0);
    p[0] = AxisType::P();
    const Value a(Rand({2, 3}, 1 + ctx.rank()), s0);
    const Value b(Rand({4}, 2, DType::kF32), s0);
    expect_error([&] { (void)all_gather_flat_start({}, {}, "fsdp"); });
    expect_error([&] { (void)all_gather_flat_start({a}, {0, 1}, "fsdp"); });
    expect_error([&] { (void)all_gather_flat_start({a, b}, {0, 0}, "fsdp"); });
    expect_error([&] { (void)all_gather_flat_start({a, Value(a.tensor, p)}, {0, 0}, "fsdp"); });
    expect_error([&] { (void)all_gather_flat_start({a}, {1}, "fsdp"); });  // sharded along 0
    PendingFlatGather g = all_gather_flat_start({a}, {0}, "fsdp");
    (void)g.Wait();
    expect_error([&] { (void)g.Wait(); });
  });
  ASSERT_EQ(errors.size(), 18u);
  const std::vector<std::string> want = {"no shards", "pass the gathered dim",
                                         "one dtype and device", "takes shards",
                                         "gathers dim 1", "already waited"};
  for (size_t i = 0; i < errors.size(); ++i) {
    EXPECT_THAT(errors[i], ::testing::HasSubstr(want[i % want.size()])) << i;
  }
}

// Full gradients of Shards' gathered values (R on both axes: P on both), different per rank.
std::vector<Value> FullGrads(const RankContext& ctx, int n) {
  const uint64_t seed = 500 + 10 * ctx.rank();
  SpmdType p(2);
  p[0] = AxisType::P();
  p[1] = AxisType::P();
  return {Value(Rand({3, 5 * n}, seed), p), Value(Rand({7 * n}, seed + 1), p),
          Value(Rand({5, 2 * n, 3}, seed + 2), p)};
}

TEST(FlatScatterTest, BitwiseEachGradientsReduceScatter) {
  for (int n : {1, 2, 3, 5}) {
    SCOPED_TRACE(absl::StrCat("fsdp=", n));
    Mesh mesh = *Mesh::Create({{"dp", 2}, {"fsdp", n}});
    std::mutex mu;
    std::vector<std::string> failures;
    std::vector<CollectiveRecord> flat_log;
    absl::Status s = RunSpmd(mesh, [&](RankContext& ctx) {
      const std::vector<Value> grads = FullGrads(ctx, n);
      std::vector<SpmdType> shard_types;
      for (const Value& x : Shards(ctx)) shard_types.push_back(x.type);
      std::vector<Value> want;
      for (size_t k = 0; k < grads.size(); ++k) {
        want.push_back(reduce_scatter(grads[k], kDims[k], "fsdp"));
      }
      const size_t before = ctx.collective_log().size();
      PendingFlatScatter started = reduce_scatter_flat_start(grads, kDims, "fsdp", shard_types);
      std::vector<Value> got = started.Wait();
      std::lock_guard<std::mutex> lock(mu);
      if (got.size() != 3) {
        failures.push_back(absl::StrCat("rank ", ctx.rank(), ": ", got.size(), " results"));
        return;
      }
      for (size_t k = 0; k < 3; ++k) {
        const SpmdType want_type = CotangentType(want[k].type, shard_types[k]);
        if (!testing::TensorsBitwiseEqual(got[k].tensor, want[k].tensor) ||
            got[k].type != want_type) {
          failures.push_back(absl::StrCat("rank ", ctx.rank(), " grad ", k, ": ",
                                          got[k].ToString(), " vs ", want[k].ToString()));
        }
      }
      if (ctx.rank() == 0) {
        flat_log.assign(ctx.collective_log().begin() + before, ctx.collective_log().end());
      }
    });
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_TRUE(failures.empty()) << absl::StrJoin(failures, "\n");
    if (n == 1) continue;
    ASSERT_EQ(flat_log.size(), 1u);  // one call of the packed bytes
    EXPECT_STREQ(flat_log[0].op, "reduce_scatter");
    EXPECT_EQ(flat_log[0].bytes, n * (15 + 7 + 30) * 8);
  }
}

TEST(FlatScatterTest, MisuseIsAClearError) {
  const std::vector<std::string> errors =
      ErrorsOnThreeRanks([](RankContext& ctx, const ExpectError& expect_error) {
    SpmdType s0(1), p(1), r(1);
    s0[0] = AxisType::Sharded(0);
    p[0] = AxisType::P();
    const Value g(Rand({6, 2}, 1 + ctx.rank()), p);
    expect_error([&] { (void)reduce_scatter_flat_start({}, {}, "fsdp", {}); });
    expect_error([&] { (void)reduce_scatter_flat_start({g}, {0, 1}, "fsdp", {s0}); });
    expect_error([&] {
      (void)reduce_scatter_flat_start({g, Value(Rand({3}, 2, DType::kF32), p)}, {0, 0}, "fsdp",
                                      {s0, s0});
    });
    expect_error([&] { (void)reduce_scatter_flat_start({Value(g.tensor, r)}, {0}, "fsdp", {s0}); });
    expect_error([&] { (void)reduce_scatter_flat_start({g}, {1}, "fsdp", {s0}); });  // 2 % 3
    PendingFlatScatter ok = reduce_scatter_flat_start({g}, {0}, "fsdp", {s0});
    (void)ok.Wait();
    expect_error([&] { (void)ok.Wait(); });
  });
  ASSERT_EQ(errors.size(), 18u);
  const std::vector<std::string> want = {"no gradients", "one of each per gradient",
                                         "one dtype and device", "reduce_scatter_flat_start",
                                         "not divisible", "already waited"};
  for (size_t i = 0; i < errors.size(); ++i) {
    EXPECT_THAT(errors[i], ::testing::HasSubstr(want[i % want.size()])) << i;
  }
}

// A rank that fails between the start and Wait() fails the program on every rank: no hang.
TEST(FlatGatherTest, ARankThatFailsWithAGatherInFlightFailsEveryRank) {
  Mesh mesh = *Mesh::Create({{"fsdp", 3}});
  absl::Status s = RunSpmd(mesh, [&](RankContext& ctx) {
    SpmdType s0(1);
    s0[0] = AxisType::Sharded(0);
    PendingFlatGather g = all_gather_flat_start({Value(Rand({2, 3}, 1), s0)}, {0}, "fsdp");
    if (ctx.rank() == 1) OpFail("rank 1 gives up");
    (void)g.Wait();
    (void)all_reduce(Value(Rand({2}, 1), [] { SpmdType t(1); t[0] = AxisType::P(); return t; }()),
                     "fsdp");
  });
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("rank 1 gives up"));
}

}  // namespace
}  // namespace shardmap
