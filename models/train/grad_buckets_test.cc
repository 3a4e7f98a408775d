// GradientBuckets: bitwise ReduceGradients (values and types) for gradients of every kind
// (P over dp, over dp and tp, V on tp and P on dp, nothing pending), f32 and f64, on meshes of
// 1-5 data-parallel devices, at bucket sizes from one gradient per bucket to one bucket for
// all; the bucket count follows the size; the misuse errors.
#include "models/train/grad_buckets.h"

#include <mutex>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/train/strategies.h"
#include "shardmap/context.h"
#include "spmd_testing/testing.h"
#include "tensor/error.h"
#include "tests/test_util.h"

namespace shardmap {
namespace {

using ::testing::HasSubstr;
using testing::Rand;

// Gradient k of rank r: kinds cycling through the cases above, odd shapes, mixed dtypes.
std::vector<Value> Gradients(const Mesh& mesh, int rank) {
  std::vector<Value> g;
  const int dp = mesh.AxisIndex("dp"), tp = mesh.AxisIndex("tp");
  for (int k = 0; k < 9; ++k) {
    SpmdType t(mesh.num_axes());
    switch (k % 4) {
      case 0: t[dp] = AxisType::P(); break;
      case 1: t[dp] = AxisType::P(); t[tp] = AxisType::P(); break;
      case 2: t[dp] = AxisType::P(); t[tp] = AxisType::Sharded(k % 2); break;
      case 3: t[tp] = AxisType::Sharded(0); break;  // nothing pending
    }
    const DType dtype = k % 3 == 1 ? DType::kF32 : DType::kF64;
    g.emplace_back(Rand({k + 1, 3 + k % 2}, 1000 * rank + k, dtype), t);
  }
  return g;
}

TEST(GradientBucketsTest, BitwiseReduceGradientsAtEveryBucketSize) {
  for (int dp : {1, 2, 3, 5}) {
    Mesh mesh = *Mesh::Create({{"dp", dp}, {"tp", 2}});
    for (int64_t bucket : {int64_t{1}, int64_t{100}, int64_t{400}, kDefaultBucketBytes}) {
      SCOPED_TRACE(absl::StrCat("dp=", dp, " bucket=", bucket));
      std::mutex mu;
      std::vector<int> started;
      absl::Status s = RunSpmd(mesh, [&](RankContext& ctx) {
        NoGradScope no_tape;
        std::vector<Value> want = Gradients(mesh, ctx.rank());
        ReduceGradients(mesh, want);
        std::vector<Value> g = Gradients(mesh, ctx.rank());
        GradientBuckets buckets(mesh, static_cast<int>(g.size()), bucket);
        for (int k = static_cast<int>(g.size()) - 1; k >= 0; --k) buckets.Add(k, g[k]);
        const int n = buckets.started();
        std::vector<Value> got = buckets.Finish();
        ASSERT_EQ(got.size(), want.size());
        for (size_t k = 0; k < got.size(); ++k) {
          EXPECT_TRUE(testing::TensorsBitwiseEqual(got[k].tensor, want[k].tensor)) << k;
          EXPECT_EQ(got[k].type, want[k].type) << k;
          EXPECT_EQ(got[k].dtype(), want[k].dtype()) << k;
        }
        std::lock_guard<std::mutex> lock(mu);
        started.push_back(n);
      });
      ASSERT_TRUE(s.ok()) << s;
      // Started before Finish: every pending gradient alone at 1 byte; none of the partial ones
      // at 25 MiB.
      for (int n : started) {
        if (bucket == 1) {
          EXPECT_EQ(n, 7);  // 9 gradients, 2 with nothing pending
        }
        if (bucket == kDefaultBucketBytes) {
          EXPECT_EQ(n, 0);
        }
        EXPECT_EQ(n, started[0]);
      }
    }
  }
}

TEST(GradientBucketsTest, MisuseIsAClearError) {
  SingleRankContext one{*Mesh::Create({{"dp", 1}})};
  EXPECT_THAT([] { GradientBuckets b(Mesh(), 2, 0); },
              ::testing::ThrowsMessage<OpError>(HasSubstr("it must be positive")));
  SpmdType p(1);
  p[0] = AxisType::P();
  GradientBuckets b(one.ctx().mesh(), 2, 100);
  b.Add(0, Value(Rand({3}, 1), p));
  EXPECT_THAT([&] { b.Add(0, Value(Rand({3}, 1), p)); },
              ::testing::ThrowsMessage<OpError>(HasSubstr("already added")));
  EXPECT_THAT([&] { b.Add(2, Value(Rand({3}, 1), p)); },
              ::testing::ThrowsMessage<OpError>(HasSubstr("out of range")));
  EXPECT_THAT([&] { (void)b.Finish(); },
              ::testing::ThrowsMessage<OpError>(HasSubstr("gradient 1 was never added")));
}

}  // namespace
}  // namespace shardmap
