#include "shardmap/type_rules.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace shardmap {
namespace {

const std::vector<std::string> kNames = {"dp", "tp"};

// A two-axis type: dp as given, tp = R.
SpmdType On0(AxisType a) {
  SpmdType t(2);
  t[0] = a;
  return t;
}

// Which of R, I, V, P (as a string of the accepted ones) rule c accepts on axis 0.
std::string Accepted(Collective c, int dim = 0) {
  std::string out;
  for (AxisType a : {AxisType::R(), AxisType::I(), AxisType::V(), AxisType::P()}) {
    if (!CheckCollective(CollectiveRuleFor(c), On0(a), 1u, dim)) out += KindName(a.kind);
  }
  return out;
}

TEST(CollectiveRules, AcceptedKindsPerOp) {
  EXPECT_EQ(Accepted(Collective::kAllReduceSum), "P");
  EXPECT_EQ(Accepted(Collective::kAllReduceMeanMaxMin), "V");
  EXPECT_EQ(Accepted(Collective::kAllGather), "V");
  EXPECT_EQ(Accepted(Collective::kReduceScatter), "P");
  EXPECT_EQ(Accepted(Collective::kAllToAll), "V");
  EXPECT_EQ(Accepted(Collective::kAllToAllSizes), "V");
  EXPECT_EQ(Accepted(Collective::kPpermute), "RV");
  EXPECT_EQ(Accepted(Collective::kBroadcast), "RV");
  EXPECT_EQ(Accepted(Collective::kConvertIToR), "I");
  EXPECT_EQ(Accepted(Collective::kConvertRToP), "R");
  EXPECT_EQ(Accepted(Collective::kReinterpret), "V");
  EXPECT_EQ(Accepted(Collective::kVary), "RV");
}

TEST(CollectiveRules, AxesOutsideTheMaskAreNotChecked) {
  SpmdType t(2);
  t[0] = AxisType::P();
  t[1] = AxisType::R();  // all_reduce(sum) over dp only: tp's R is fine
  EXPECT_FALSE(CheckCollective(CollectiveRuleFor(Collective::kAllReduceSum), t, 1u, -1));
  auto no = CheckCollective(CollectiveRuleFor(Collective::kAllReduceSum), t, 3u, -1);
  ASSERT_TRUE(no);
  EXPECT_EQ(no->axis, 1);
}

TEST(CollectiveRules, RejectionTexts) {
  auto no = CheckCollective(CollectiveRuleFor(Collective::kAllReduceSum), On0(AxisType::V()), 1u,
                            -1);
  ASSERT_TRUE(no);
  EXPECT_EQ(no->axis, 0);
  EXPECT_EQ(no->rule, "takes a partial sum (P), but x is V");
  EXPECT_NE(no->fix.find("reinterpret(x, axis) (V->P)"), std::string::npos);

  no = CheckCollective(CollectiveRuleFor(Collective::kAllGather), On0(AxisType::P()), 1u, 1);
  ASSERT_TRUE(no);
  EXPECT_EQ(no->rule, "takes shards (S1 or V), but x is P");
  EXPECT_NE(no->fix.find("reduce_scatter(x, 1, axis)"), std::string::npos);

  no = CheckCollective(CollectiveRuleFor(Collective::kReinterpret), On0(AxisType::R()), 1u, -1);
  ASSERT_TRUE(no);
  EXPECT_EQ(no->rule, "takes V, but x is R");
  EXPECT_NE(no->fix.find("Convert::kRToP"), std::string::npos);
}

TEST(CollectiveRules, EveryRejectedKindHasAFix) {
  for (int c = 0; c < static_cast<int>(Collective::kCount); ++c) {
    const CollectiveRule& r = CollectiveRuleFor(static_cast<Collective>(c));
    for (AxisType a : {AxisType::R(), AxisType::I(), AxisType::V(), AxisType::P()}) {
      auto no = CheckCollective(r, On0(a), 1u, 0);
      if (!no) continue;
      EXPECT_NE(no->rule.find(std::string("but x is ") + KindName(a.kind)), std::string::npos)
          << r.name;
      EXPECT_FALSE(no->fix.empty()) << r.name;
    }
  }
}

TEST(CollectiveRules, ShardsOfAnotherDim) {
  // all_gather of dim 0 of an S1 value: its own rule and fix.
  auto no = CheckCollective(CollectiveRuleFor(Collective::kAllGather), On0(AxisType::Sharded(1)),
                            1u, 0);
  ASSERT_TRUE(no);
  EXPECT_EQ(no->rule, "gathers dim 0 but x is sharded along dim 1");
  EXPECT_EQ(no->fix, "gather dim 1, or all_to_all to move the sharding");
  EXPECT_FALSE(CheckCollective(CollectiveRuleFor(Collective::kAllGather),
                               On0(AxisType::Sharded(0)), 1u, 0));
  no = CheckCollective(CollectiveRuleFor(Collective::kAllToAll), On0(AxisType::Sharded(1)), 1u,
                       0);
  ASSERT_TRUE(no);
  EXPECT_EQ(no->rule, "takes shards of the concat dim (S0 or V), but x is S1");
  EXPECT_EQ(no->fix, "pass concat_dim=1 matching the dim x is sharded along");
  // ppermute moves any V, whatever dim it shards.
  EXPECT_FALSE(CheckCollective(CollectiveRuleFor(Collective::kPpermute),
                               On0(AxisType::Sharded(1)), 1u, 0));
}

std::string Result(Collective c, AxisType a, int dim = 0, bool invariant = false) {
  return CollectiveResult(CollectiveRuleFor(c), On0(a), 1u, dim, invariant).ToString(kNames);
}

TEST(CollectiveRules, ResultKinds) {
  EXPECT_EQ(Result(Collective::kAllReduceSum, AxisType::P()), "{dp:R,tp:R}");
  EXPECT_EQ(Result(Collective::kAllReduceSum, AxisType::P(), -1, true), "{dp:I,tp:R}");
  EXPECT_EQ(Result(Collective::kAllReduceMeanMaxMin, AxisType::V()), "{dp:R,tp:R}");
  EXPECT_EQ(Result(Collective::kAllGather, AxisType::Sharded(0)), "{dp:R,tp:R}");
  EXPECT_EQ(Result(Collective::kReduceScatter, AxisType::P(), 1), "{dp:S1,tp:R}");
  EXPECT_EQ(Result(Collective::kAllToAll, AxisType::Sharded(0), 1), "{dp:S1,tp:R}");
  EXPECT_EQ(Result(Collective::kPpermute, AxisType::Sharded(0)), "{dp:V,tp:R}");
  EXPECT_EQ(Result(Collective::kBroadcast, AxisType::V()), "{dp:R,tp:R}");
  EXPECT_EQ(Result(Collective::kConvertIToR, AxisType::I()), "{dp:R,tp:R}");
  EXPECT_EQ(Result(Collective::kConvertRToP, AxisType::R()), "{dp:P,tp:R}");
  EXPECT_EQ(Result(Collective::kReinterpret, AxisType::V()), "{dp:P,tp:R}");
  EXPECT_EQ(Result(Collective::kVary, AxisType::R()), "{dp:V,tp:R}");
  EXPECT_EQ(Result(Collective::kVary, AxisType::Sharded(1)), "{dp:S1,tp:R}");
}

TEST(CollectiveRules, GatherOfAMajorAxisUnshardsMinorAxesOfThatDim) {
  // {dp:S0, tp:S0}: gathering dp (the major axis) leaves tp's pieces non-contiguous (V);
  // gathering tp keeps dp's S0.
  SpmdType t(2);
  t[0] = AxisType::Sharded(0);
  t[1] = AxisType::Sharded(0);
  const CollectiveRule& g = CollectiveRuleFor(Collective::kAllGather);
  EXPECT_EQ(CollectiveResult(g, t, 1u, 0, false).ToString(kNames), "{dp:R,tp:V}");
  EXPECT_EQ(CollectiveResult(g, t, 2u, 0, false).ToString(kNames), "{dp:S0,tp:R}");
  SpmdType p(2);
  p[0] = AxisType::P();
  p[1] = AxisType::Sharded(0);
  EXPECT_EQ(CollectiveResult(CollectiveRuleFor(Collective::kReduceScatter), p, 1u, 0, false)
                .ToString(kNames),
            "{dp:S0,tp:V}");
}

TEST(ErasedRules, JoinTakesTheLargerKindAndDropsDims) {
  SpmdType a(2), b(2);
  a[0] = AxisType::Sharded(0);
  b[0] = AxisType::P();
  b[1] = AxisType::I();
  EXPECT_EQ(ErasedJoin(a, b).ToString(kNames), "{dp:P,tp:I}");
  EXPECT_EQ(ErasedUnary(a).ToString(kNames), "{dp:V,tp:R}");
}

}  // namespace
}  // namespace shardmap
