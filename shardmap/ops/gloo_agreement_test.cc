// Collective agreement on the Gloo backend (each rank a thread with its own Gloo communicator over
// loopback): ranks that issue collectives over different axis groups in different orders, or
// with per-rank shapes, fail on Gloo too, naming both calls. Gloo compares the typed layer's
// CallTag in the call descriptor it exchanges before every collective.
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "collectives/gloo_communicator.h"
#include "collectives/gloo_threads.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shardmap/ops/collective_ops.h"
#include "shardmap/runtime/context.h"
#include "shardmap/ops/ops.h"
#include "tensor/error.h"

namespace shardmap {
namespace {

using ::testing::HasSubstr;

Mesh M(std::vector<std::pair<std::string, int>> axes) { return *Mesh::Create(std::move(axes)); }

// Runs body on mesh.size() Gloo ranks; every rank's status.
std::vector<absl::Status> RunOnGloo(const Mesh& mesh,
                                    const std::function<void(RankContext&)>& body) {
  collectives::GlooOptions o;
  o.timeout = absl::Seconds(30);
  return collectives::RunGlooThreadsEach(
      mesh.size(),
      [&](collectives::Communicator& c) { return RunOnCommunicator(c, mesh, body); }, o);
}

Value PerRank(RankContext& ctx) {
  return vary(Value::Replicated(Tensor::Full({3}, ctx.rank() + 1.0, DType::kF64)),
              ctx.mesh().axis_names());
}

Value Sum(const Value& x, const char* axis) { return all_reduce(reinterpret(x, axis), axis); }

// The example after both axis communicators exist (so no Split is involved): rank 0
// reduces over tp then dp, the others dp then tp. Rank 0's tp call (its collective #3) meets
// rank 1's (its #4): the tags differ, and both ranks fail naming the two calls.
TEST(GlooAgreement, AxisOrderThatDiffersAcrossRanksFailsNamingBothCalls) {
  for (auto axes : {std::vector<std::pair<std::string, int>>{{"dp", 2}, {"tp", 2}},
                    {{"dp", 3}, {"tp", 2}}}) {
    Mesh mesh = M(axes);
    SCOPED_TRACE(mesh.ShortString());
    std::vector<absl::Status> all = RunOnGloo(mesh, [](RankContext& ctx) {
      Value x = PerRank(ctx);
      Value warm = Sum(Sum(x, "tp"), "dp");  // every rank in the same order: both groups exist
      if (warm.tensor.at(0) != ctx.mesh().size() * (ctx.mesh().size() + 1) / 2.0) {
        OpFail("wrong warm-up sum ", warm.tensor.at(0));
      }
      (void)(ctx.rank() == 0 ? Sum(Sum(x, "tp"), "dp") : Sum(Sum(x, "dp"), "tp"));
    });
    bool named = false;
    for (size_t r = 0; r < all.size(); ++r) {
      EXPECT_FALSE(all[r].ok()) << "rank " << r << " returned OK";
      const std::string m(all[r].message());
      if (all[r].code() == absl::StatusCode::kInvalidArgument &&
          absl::StrContains(m, "mismatched collectives")) {
        EXPECT_THAT(m, HasSubstr("all_reduce over tp")) << m;
        EXPECT_THAT(m, HasSubstr("collective #3")) << m;
        EXPECT_THAT(m, HasSubstr("collective #4")) << m;
        named = true;
      }
    }
    EXPECT_TRUE(named) << "no rank named the mismatched calls";
  }
}

// Ranks whose first collectives name different axes: caught at the Split that would create the
// axis communicator, by the tags.
TEST(GlooAgreement, FirstCollectiveOverDifferentAxesFails) {
  Mesh mesh = M({{"dp", 2}, {"tp", 2}});
  std::vector<absl::Status> all = RunOnGloo(mesh, [](RankContext& ctx) {
    Value x = PerRank(ctx);
    (void)(ctx.rank() == 0 ? Sum(x, "tp") : Sum(x, "dp"));
  });
  for (size_t r = 0; r < all.size(); ++r) {
    EXPECT_EQ(all[r].code(), absl::StatusCode::kInvalidArgument) << all[r];
    EXPECT_THAT(std::string(all[r].message()),
                testing::AllOf(HasSubstr("mismatched collectives"),
                               HasSubstr("all_reduce over tp"), HasSubstr("all_reduce over dp")))
        << all[r];
  }
}

// Equal element counts, different shapes ([2,3] vs [3,2]): Gloo's count check passes, the tag's
// shape does not.
TEST(GlooAgreement, ShapesWithEqualCountsThatDifferFail) {
  Mesh mesh = M({{"tp", 3}});
  std::vector<absl::Status> all = RunOnGloo(mesh, [](RankContext& ctx) {
    Shape s = ctx.rank() == 1 ? Shape{3, 2} : Shape{2, 3};
    Value x = vary(Value::Replicated(Tensor::Ones(s, DType::kF32)), {"tp"});
    (void)all_gather(x, 0, "tp");
  });
  for (size_t r = 0; r < all.size(); ++r) {
    EXPECT_EQ(all[r].code(), absl::StatusCode::kInvalidArgument) << all[r];
    EXPECT_THAT(std::string(all[r].message()),
                testing::AllOf(HasSubstr("mismatched collectives"), HasSubstr("[2,3]"),
                               HasSubstr("[3,2]")))
        << all[r];
  }
}

// Agreeing ranks are unaffected: the sums are right.
TEST(GlooAgreement, AgreeingRanksGetTheSums) {
  Mesh mesh = M({{"dp", 3}, {"tp", 2}});
  std::vector<absl::Status> all = RunOnGloo(mesh, [](RankContext& ctx) {
    Value y = Sum(Sum(PerRank(ctx), "dp"), "tp");
    if (y.tensor.at(2) != 21.0) OpFail("wrong sum ", y.tensor.at(2));
  });
  for (size_t r = 0; r < all.size(); ++r) EXPECT_TRUE(all[r].ok()) << all[r];
}

}  // namespace
}  // namespace shardmap
