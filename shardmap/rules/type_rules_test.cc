#include "shardmap/rules/type_rules.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
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

// Each collective's transpose (the table's transpose column) is a typed collective that accepts
// the dual of the op's result, and gives the dual of the op's input: for every input type the
// op accepts, on one or both axes, with the other axis of any kind.
TEST(CollectiveTransposes, TransposeOfEveryRowGivesTheDualOfTheInput) {
  const std::vector<AxisType> kinds = {AxisType::R(), AxisType::I(),         AxisType::V(),
                                       AxisType::P(), AxisType::Sharded(0), AxisType::Sharded(1)};
  int checked = 0;
  for (int ci = 0; ci < static_cast<int>(Collective::kCount); ++ci) {
    const Collective c = static_cast<Collective>(ci);
    const CollectiveRule& r = CollectiveRuleFor(c);
    // The forward's dims: all_to_all checks concat_dim 0 and shards split_dim 1.
    const bool to_all = c == Collective::kAllToAll || c == Collective::kAllToAllSizes;
    const int check_dim = 0, result_dim = to_all ? 1 : 0;
    const bool has_i = r.result == CollectiveResultKind::kRorI ||
                       r.result == CollectiveResultKind::kGathered;
    for (bool invariant : {false, true}) {
      if (invariant && !has_i) continue;
      const CollectiveTranspose& tr = invariant ? r.transpose_invariant : r.transpose;
      for (AxisMask mask : {1u, 3u}) {
        for (AxisType a : kinds) {
          for (AxisType b : kinds) {
            SpmdType x(2);
            x[0] = a;
            x[1] = b;
            if (CheckCollective(r, x, mask, check_dim)) continue;  // rejected: no transpose
            SCOPED_TRACE(absl::StrCat(r.name, invariant ? " to I" : "", " of ",
                                      x.ToString(kNames), " over mask ", mask));
            const SpmdType y = CollectiveResult(r, x, mask, result_dim, invariant);
            if (tr.op != Collective::kCount) {
              // The transpose is itself a typed collective that accepts y's dual.
              const std::optional<Rejection> no =
                  CheckCollective(CollectiveRuleFor(tr.op), Dual(y), mask, result_dim);
              EXPECT_FALSE(no) << no->rule;
            }
            // The dual of x, or more precise: S(d) where x is a V of unknown layout (the
            // gradient of a V that a gather assembled is its shard of the gathered gradient).
            const SpmdType got =
                CollectiveCotangentType(c, x, mask, check_dim, result_dim, invariant);
            const SpmdType want = Dual(x);
            for (int i = 0; i < 2; ++i) {
              const bool refines = want[i].kind == AxisKind::kV && want[i].dim < 0 &&
                                   got[i].is_sharded();
              EXPECT_TRUE(got[i] == want[i] || refines)
                  << "axis " << i << ": " << got.ToString(kNames) << " is not "
                  << want.ToString(kNames);
            }
            ++checked;
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 100);
}

TEST(CollectiveTransposes, TableColumn) {
  auto op = [](Collective c, bool inv = false) {
    const CollectiveRule& r = CollectiveRuleFor(c);
    const CollectiveTranspose& t = inv ? r.transpose_invariant : r.transpose;
    return t.op == Collective::kCount ? std::string("local")
                                      : std::string(CollectiveRuleFor(t.op).name);
  };
  EXPECT_EQ(op(Collective::kAllReduceSum), "all_reduce(sum)");
  EXPECT_EQ(op(Collective::kAllReduceSum, true), "convert(I->R)");
  EXPECT_EQ(op(Collective::kAllReduceMeanMaxMin), "all_reduce(sum)");
  EXPECT_EQ(op(Collective::kAllReduceMeanMaxMin, true), "local");
  EXPECT_EQ(op(Collective::kAllGather), "reduce_scatter");
  EXPECT_EQ(op(Collective::kAllGather, true), "local");
  EXPECT_EQ(op(Collective::kReduceScatter), "all_gather");
  EXPECT_EQ(op(Collective::kAllToAll), "all_to_all");
  EXPECT_EQ(op(Collective::kPpermute), "ppermute");
  EXPECT_EQ(op(Collective::kBroadcast), "all_reduce(sum)");
  EXPECT_EQ(CollectiveRuleFor(Collective::kBroadcast).transpose.then, TransposeLocal::kKeepOnRoot);
  EXPECT_EQ(TransposeOf(Collective::kAllGather, true).then, TransposeLocal::kLocalChunk);
  EXPECT_EQ(TransposeOf(Collective::kAllReduceMeanMaxMin, false).then, TransposeLocal::kSpread);
  EXPECT_EQ(op(Collective::kConvertIToR), "all_reduce(sum)");
  EXPECT_TRUE(CollectiveRuleFor(Collective::kConvertIToR).transpose.invariant);
  EXPECT_EQ(op(Collective::kConvertRToP), "convert(R->P)");
  EXPECT_EQ(op(Collective::kReinterpret), "local");
  EXPECT_EQ(op(Collective::kVary), "local");
}

// CotangentType states the dual where the derived type is a valid, less precise form of it,
// and leaves everything else for the tape's check.
TEST(CollectiveTransposes, CotangentTypeRelaxesOnlyValidForms) {
  auto cot = [](AxisType derived, AxisType primal) {
    SpmdType d(1, derived), p(1, primal);
    return CotangentType(d, p)[0].ToString();
  };
  EXPECT_EQ(cot(AxisType::V(), AxisType::R()), "P");           // unpromotion
  EXPECT_EQ(cot(AxisType::R(), AxisType::Sharded(1)), "S1");   // same everywhere is one V
  EXPECT_EQ(cot(AxisType::I(), AxisType::V()), "V");
  EXPECT_EQ(cot(AxisType::V(), AxisType::Sharded(0)), "S0");
  EXPECT_EQ(cot(AxisType::Sharded(2), AxisType::Sharded(0)), "S2");  // the tape decides
  EXPECT_EQ(cot(AxisType::P(), AxisType::V()), "P");                 // a bug: left as is
  EXPECT_EQ(cot(AxisType::R(), AxisType::R()), "R");                 // a bug: left as is
  EXPECT_EQ(cot(AxisType::R(), AxisType::P()), "R");
  EXPECT_EQ(cot(AxisType::I(), AxisType::I()), "I");
}

TEST(ErasedRules, JoinTakesTheLargerKindAndDropsDims) {
  SpmdType a(2), b(2);
  a[0] = AxisType::Sharded(0);
  b[0] = AxisType::P();
  b[1] = AxisType::I();
  EXPECT_EQ(ErasedJoin(a, b).ToString(kNames), "{dp:P,tp:I}");
  EXPECT_EQ(ErasedUnary(a).ToString(kNames), "{dp:V,tp:R}");
}

// Types on a {dp, tp} mesh from two axis types.
SpmdType T2(AxisType dp, AxisType tp) {
  SpmdType t(2);
  t[0] = dp;
  t[1] = tp;
  return t;
}

const std::vector<int64_t> k4x8 = {4, 8};

TEST(ElementwiseRule, PartialPlusReplicatedIsTheBiasBug) {
  std::optional<Rejection> no;
  ElementwiseRule("add", T2(AxisType::R(), AxisType::P()), k4x8, T2(AxisType::R(), AxisType::R()),
                  k4x8, k4x8, /*multilinear=*/false, /*divide=*/false, no);
  ASSERT_TRUE(no);
  EXPECT_EQ(no->axis, 1);
  EXPECT_NE(no->rule.find("bias added before the all-reduce"), std::string::npos);
  EXPECT_NE(no->fix.find("all_reduce (or reduce_scatter) operand a"), std::string::npos);
  // sub names no bias.
  no.reset();
  ElementwiseRule("sub", T2(AxisType::R(), AxisType::R()), k4x8, T2(AxisType::R(), AxisType::P()),
                  k4x8, k4x8, false, false, no);
  ASSERT_TRUE(no);
  EXPECT_EQ(no->rule.find("bias"), std::string::npos);
  EXPECT_NE(no->rule.find("operand b"), std::string::npos);
}

TEST(ElementwiseRule, MultilinearRules) {
  std::optional<Rejection> no;
  // P * R = P; P + P = P.
  EXPECT_EQ(ElementwiseRule("mul", T2(AxisType::P(), AxisType::R()), k4x8,
                            T2(AxisType::R(), AxisType::R()), k4x8, k4x8, true, false, no)
                .ToString(kNames),
            "{dp:P,tp:R}");
  EXPECT_EQ(ElementwiseRule("add", T2(AxisType::P(), AxisType::R()), k4x8,
                            T2(AxisType::P(), AxisType::R()), k4x8, k4x8, false, false, no)
                .ToString(kNames),
            "{dp:P,tp:R}");
  EXPECT_FALSE(no);
  ElementwiseRule("mul", T2(AxisType::P(), AxisType::R()), k4x8, T2(AxisType::P(), AxisType::R()),
                  k4x8, k4x8, true, false, no);
  ASSERT_TRUE(no);
  EXPECT_NE(no->rule.find("P*P"), std::string::npos);
  no.reset();
  ElementwiseRule("div", T2(AxisType::R(), AxisType::R()), k4x8, T2(AxisType::P(), AxisType::R()),
                  k4x8, k4x8, true, true, no);
  ASSERT_TRUE(no);
  EXPECT_NE(no->rule.find("divisor is a partial sum"), std::string::npos);
  no.reset();
  ElementwiseRule("add", T2(AxisType::I(), AxisType::R()), k4x8, T2(AxisType::R(), AxisType::R()),
                  k4x8, k4x8, false, false, no);
  ASSERT_TRUE(no);
  EXPECT_EQ(no->axis, 0);
  EXPECT_NE(no->fix.find("I->R"), std::string::npos);
}

TEST(ElementwiseRule, ShardsFollowBroadcasting) {
  std::optional<Rejection> no;
  // S1 of [8] broadcast against [4,8] is S1 of the output; R promotes to the V's type.
  const std::vector<int64_t> k8 = {8};
  EXPECT_EQ(ElementwiseRule("add", T2(AxisType::Sharded(0), AxisType::R()), k8,
                            T2(AxisType::R(), AxisType::R()), k4x8, k4x8, false, false, no)
                .ToString(kNames),
            "{dp:S1,tp:R}");
  // A size-1 dim broadcast up loses the S.
  const std::vector<int64_t> k1x8 = {1, 8};
  EXPECT_EQ(ElementwiseRule("add", T2(AxisType::Sharded(0), AxisType::R()), k1x8,
                            T2(AxisType::R(), AxisType::R()), k4x8, k4x8, false, false, no)
                .ToString(kNames),
            "{dp:V,tp:R}");
  // Both S along different dims: plain V.
  EXPECT_EQ(ElementwiseRule("mul", T2(AxisType::Sharded(0), AxisType::R()), k4x8,
                            T2(AxisType::Sharded(1), AxisType::R()), k4x8, k4x8, true, false, no)
                .ToString(kNames),
            "{dp:V,tp:R}");
  EXPECT_FALSE(no);
  EXPECT_EQ(BroadcastDim(k8, 0, k4x8), 1);
  EXPECT_EQ(BroadcastDim(k1x8, 0, k4x8), -1);
}

TEST(MatmulRule, ColumnAndRowParallel) {
  std::optional<Rejection> no;
  // x [b, d] (dp:S0) @ w [d, f] (tp:S1): column-parallel, output {dp:S0, tp:S1}.
  EXPECT_EQ(MatmulRule(T2(AxisType::Sharded(0), AxisType::R()), 2,
                       T2(AxisType::R(), AxisType::Sharded(1)), 2, false, false, kNames, no)
                .ToString(kNames),
            "{dp:S0,tp:S1}");
  // h [b, f] (tp:S1) @ w2 [f, d] (tp:S0): both contracted dims sharded over tp, a partial sum.
  EXPECT_EQ(MatmulRule(T2(AxisType::R(), AxisType::Sharded(1)), 2,
                       T2(AxisType::R(), AxisType::Sharded(0)), 2, false, false, kNames, no)
                .ToString(kNames),
            "{dp:R,tp:P}");
  // Transposed b: w^T stored [d, f], contracted dim is b's 1.
  EXPECT_EQ(MatmulRule(T2(AxisType::R(), AxisType::Sharded(1)), 2,
                       T2(AxisType::R(), AxisType::Sharded(1)), 2, false, true, kNames, no)
                .ToString(kNames),
            "{dp:R,tp:P}");
  // P @ R = P.
  EXPECT_EQ(MatmulRule(T2(AxisType::P(), AxisType::R()), 2, T2(AxisType::R(), AxisType::R()), 2,
                       false, false, kNames, no)
                .ToString(kNames),
            "{dp:P,tp:R}");
  EXPECT_FALSE(no);
}

TEST(MatmulRule, ContractedDimsOverDifferentAxesAreRejected) {
  std::optional<Rejection> no;
  MatmulRule(T2(AxisType::Sharded(1), AxisType::R()), 2, T2(AxisType::R(), AxisType::Sharded(0)),
             2, false, false, kNames, no);
  ASSERT_TRUE(no);
  EXPECT_EQ(no->axis, 0);
  EXPECT_EQ(no->rule,
            "contracts a's dim sharded over 'dp' with b's dim sharded over 'tp': each device "
            "would pair slices that do not match");
  no.reset();
  MatmulRule(T2(AxisType::P(), AxisType::R()), 2, T2(AxisType::Sharded(1), AxisType::R()), 2,
             false, false, kNames, no);
  ASSERT_TRUE(no);
  EXPECT_NE(no->rule.find("partial sum (P) by a varying (V)"), std::string::npos);
}

// Sequence parallel x data parallel: the weight gradient x^T @ g contracts the token dim, held
// as S0 on dp and on tp by both operands (mesh order, so the same order): P on both axes.
TEST(MatmulRule, ContractedDimShardedOverTheSameAxesInBoth) {
  const SpmdType both = T2(AxisType::Sharded(0), AxisType::Sharded(0));
  std::optional<Rejection> no;
  EXPECT_EQ(MatmulRule(both, 2, both, 2, /*ta=*/true, false, kNames, no).ToString(kNames),
            "{dp:P,tp:P}");
  EXPECT_FALSE(no);
  // g's tp layout unknown (V, e.g. after a ppermute over tp), dp shared: accepted, P on dp and V
  // on tp (which the VJP turns into P for a replicated weight).
  const SpmdType g = T2(AxisType::Sharded(0), AxisType::V());
  EXPECT_EQ(MatmulRule(both, 2, g, 2, true, false, kNames, no).ToString(kNames), "{dp:P,tp:V}");
  EXPECT_FALSE(no);
  EXPECT_EQ(MatmulRule(g, 2, both, 2, true, false, kNames, no).ToString(kNames), "{dp:P,tp:V}");
  EXPECT_FALSE(no);
  // Still rejected: a's token dim over tp only, b's over dp only.
  MatmulRule(T2(AxisType::R(), AxisType::Sharded(0)), 2, T2(AxisType::Sharded(0), AxisType::R()),
             2, true, false, kNames, no);
  ASSERT_TRUE(no);
  EXPECT_EQ(no->axis, 0);
  EXPECT_EQ(no->rule,
            "contracts b's dim sharded over 'dp' with a's dim sharded over 'tp': each device "
            "would pair slices that do not match");
  // a's over (dp, tp), b's over dp and R on tp: dp pairs matching blocks, but on tp one
  // operand's sharded contracted dim meets a whole one: rejected on any mesh size (on a tp of
  // size 1 the local sizes would agree and hide it), naming both dims and the gather.
  no.reset();
  MatmulRule(both, 2, T2(AxisType::Sharded(0), AxisType::R()), 2, true, false, kNames, no);
  ASSERT_TRUE(no);
  EXPECT_EQ(no->axis, 1);
  EXPECT_EQ(no->rule,
            "a's contracted dim 0 ('k') is sharded over 'tp' but b's dim 0 is whole (R): each "
            "device would contract its slice against the whole dim");
  EXPECT_NE(no->fix.find("all_gather(a, 0, \"tp\") first"), std::string::npos) << no->fix;
  no.reset();
  MatmulRule(T2(AxisType::R(), AxisType::Sharded(0)), 2, T2(AxisType::R(), AxisType::R()), 2,
             true, false, kNames, no);
  ASSERT_TRUE(no);
  EXPECT_EQ(no->axis, 1);
  // The same with the sharded operand's layout declared unknown (as_varying): V, accepted.
  no.reset();
  EXPECT_EQ(MatmulRule(T2(AxisType::R(), AxisType::V()), 2, T2(AxisType::R(), AxisType::R()), 2,
                       true, false, kNames, no)
                .ToString(kNames),
            "{dp:R,tp:V}");
  EXPECT_FALSE(no);
}

// matmul is the contraction "...mk,kn->...mn": its rule is ContractionRule on those letters.
TEST(ContractionRule, MatmulIsTheEinsumMkKnMn) {
  auto letters = [](int ar, int br, bool ta, bool tb) {
    const internal::MatmulLetters l = internal::MatmulAsContraction(ar, br, ta, tb);
    return l.a + "," + l.b + "->" + l.out;
  };
  EXPECT_EQ(letters(2, 2, false, false), "mk,kn->mn");
  EXPECT_EQ(letters(2, 2, true, true), "km,nk->mn");
  EXPECT_EQ(letters(3, 2, false, false), "amk,kn->amn");
  EXPECT_EQ(letters(4, 4, false, true), "abmk,abnk->abmn");
  std::optional<Rejection> no;
  // Batched operands sharding the batch dim alike keep it; a's batch against b's free dim over
  // the same axis is rejected (each device would multiply unrelated slices), unless one
  // operand's layout is declared unknown (as_varying): then V.
  const SpmdType s0 = T2(AxisType::Sharded(0), AxisType::R());
  EXPECT_EQ(MatmulRule(s0, 3, s0, 3, false, false, kNames, no).ToString(kNames), "{dp:S0,tp:R}");
  MatmulRule(s0, 3, T2(AxisType::Sharded(1), AxisType::R()), 2, false, false, kNames, no);
  ASSERT_TRUE(no);
  EXPECT_EQ(no->rule,
            "a's dim 0 ('a') is sharded and b's dim 1 ('n') is sharded over 'dp': each device "
            "would multiply its slice of one by its slice of the other, a block whose layout is "
            "unknown (V) and that no collective repairs");
  EXPECT_NE(no->fix.find("as_varying(x, \"dp\")"), std::string::npos) << no->fix;
  EXPECT_EQ(no->fix.find("reinterpret"), std::string::npos) << no->fix;
  no.reset();
  EXPECT_EQ(MatmulRule(T2(AxisType::V(), AxisType::R()), 3, T2(AxisType::Sharded(1), AxisType::R()),
                       2, false, false, kNames, no)
                .ToString(kNames),
            "{dp:V,tp:R}");
  EXPECT_FALSE(no);
  // Attention scores as an einsum: batch over dp, heads over tp stay sharded (heads -> dim 1).
  const SpmdType q = T2(AxisType::Sharded(0), AxisType::Sharded(2));
  EXPECT_EQ(ContractionRule(q, "bthd", q, "bshd", "bhts", kNames, no).ToString(kNames),
            "{dp:S0,tp:S1}");
  // Two contracted letters sharded on one axis, one in each operand: rejected (never P).
  ContractionRule(T2(AxisType::Sharded(0), AxisType::R()), "ij",
                  T2(AxisType::Sharded(1), AxisType::R()), "ij", "", kNames, no);
  ASSERT_TRUE(no);
  EXPECT_EQ(no->axis, 0);
  EXPECT_NE(no->rule.find("a's dim 0 ('i') is sharded and b's dim 1 ('j') is sharded over 'dp'"),
            std::string::npos)
      << no->rule;
}

TEST(NonlinearRule, RejectsPartialSumsOnly) {
  std::optional<Rejection> no;
  EXPECT_EQ(NonlinearRule("gelu", T2(AxisType::Sharded(0), AxisType::I()), kNames, no)
                .ToString(kNames),
            "{dp:S0,tp:I}");
  EXPECT_FALSE(no);
  NonlinearRule("gelu", T2(AxisType::R(), AxisType::P()), kNames, no);
  ASSERT_TRUE(no);
  EXPECT_EQ(no->axis, 1);
  EXPECT_EQ(no->fix, "all_reduce(x, \"tp\") (or reduce_scatter) before gelu");
}

TEST(ReshapeRule, ShardStaysOnTheMajorDimOfItsBlock) {
  // Merging and splitting (global [4n,3,5] etc.): S lands where the elements before it agree.
  EXPECT_EQ(ReshapeDim({4, 3, 5}, {12, 5}, 0), 0);
  EXPECT_EQ(ReshapeDim({4, 3, 5}, {12, 5}, 2), 1);
  EXPECT_EQ(ReshapeDim({4, 3, 5}, {4, 15}, 2), -1);  // a minor dim of a merge: V
  EXPECT_EQ(ReshapeDim({4, 3, 5}, {2, 2, 3, 5}, 2), 3);
  EXPECT_EQ(ReshapeDim({4, 6}, {24}, 1), -1);
  EXPECT_EQ(ReshapeDim({6, 1}, {6}, 1), -1);  // no output dim after the 6
  EXPECT_EQ(ReshapeDim({4, 6}, {24}, 7), -1);
}

TEST(ReshapeRule, LocalSizeOneHeadsKeepTheirShard) {
  // [b, t, heads*hd] -> [b, t, heads, hd] with one head per device: the local shapes are
  // [2, 3, 4] -> [2, 3, 1, 4]; S stays on heads (dim 2), not head_dim.
  EXPECT_EQ(ReshapeDim({2, 3, 4}, {2, 3, 1, 4}, 2), 2);
  // With 2 heads per device the same.
  EXPECT_EQ(ReshapeDim({2, 3, 8}, {2, 3, 2, 4}, 2), 2);
  // The GPT qkv split [n, 3, e] -> [b, t, 3, h, hd] at one head per device.
  EXPECT_EQ(ReshapeDim({6, 3, 4}, {2, 3, 3, 1, 4}, 2), 3);
  // And back: [b, t, 1, hd] (S on heads) -> [b*t, hd], and a dropped size-1 dim before it.
  EXPECT_EQ(ReshapeDim({2, 3, 1, 4}, {6, 4}, 2), 1);
  // The GPT q slice [b, t, 1, h, hd] -> [b, t, h, hd] at one head per device: the shard (a
  // size-1 dim) stays on the size-1 dim left, not on head_dim.
  EXPECT_EQ(ReshapeDim({2, 3, 1, 1, 4}, {2, 3, 1, 4}, 3), 2);
  EXPECT_EQ(ReshapeDim({2, 3, 1, 1, 4}, {2, 3, 1, 4}, 2), 2);
  EXPECT_EQ(ReshapeDim({2, 3, 1, 1, 4}, {2, 3, 1, 1, 4}, 3), 3);  // the same shape
  EXPECT_EQ(ReshapeDim({1, 3, 4}, {1, 1, 3, 4}, 0), 0);
  // A sharded dim of local size 1 merged as the major dim of its group: [1, t, d] -> [t, d].
  EXPECT_EQ(ReshapeDim({1, 3, 4}, {3, 4}, 0), 0);
  // A size-1 dim inserted after a sharded dim leaves it alone: [b, t, h, hd] -> [b, t, h, 1, hd].
  EXPECT_EQ(ReshapeDim({2, 3, 1, 4}, {2, 3, 1, 1, 4}, 2), 2);
  EXPECT_EQ(ReshapeDim({2, 3, 2, 4}, {2, 3, 2, 1, 4}, 2), 2);
  EXPECT_EQ(ReshapeRule(T2(AxisType::Sharded(0), AxisType::Sharded(2)), {2, 3, 4}, {6, 1, 4})
                .ToString(kNames),
            "{dp:S0,tp:S1}");
  EXPECT_EQ(ReshapeRule(T2(AxisType::Sharded(1), AxisType::P()), {2, 3, 4}, {24})
                .ToString(kNames),
            "{dp:V,tp:P}");
}

TEST(ReshapeRule, SizeOneDimsBeforeTheShardKeepTheirCount) {
  // One decoding row: [1, h*hd] S1 -> [1, h, hd] keeps S on the heads, not the row dim.
  EXPECT_EQ(ReshapeDim({1, 10}, {1, 2, 5}, 1), 1);
  EXPECT_EQ(ReshapeDim({1, 5}, {1, 1, 5}, 1), 1);   // one head per device
  EXPECT_EQ(ReshapeDim({1, 2, 5}, {1, 10}, 1), 1);  // and back
  // Back at one head per device the local shapes are those of a dropped size-1 dim before a
  // size-1 shard: S stays on the size-1 dim (DecodeMergeHeads moves the heads dim first).
  EXPECT_EQ(ReshapeDim({1, 1, 5}, {1, 5}, 1), 0);
  EXPECT_EQ(ReshapeDim({1, 1, 5}, {1, 1, 5}, 1), 1);
  // [b, t, h*hd] with b = t = 1.
  EXPECT_EQ(ReshapeDim({1, 1, 21}, {1, 1, 3, 7}, 2), 2);
  EXPECT_EQ(ReshapeDim({1, 1, 7}, {1, 1, 1, 7}, 2), 2);
  // Fewer size-1 dims in the output: S goes to the dim that holds the elements.
  EXPECT_EQ(ReshapeDim({1, 1, 21}, {21}, 2), 0);
  EXPECT_EQ(ReshapeDim({1, 1, 21}, {1, 21}, 2), 1);
}

// Shards a global tensor of shape `global_in` (values 0, 1, ... in row-major order) over n
// ranks on dim d, reshapes each rank's block to `local_out` as the rank would, and joins the
// ranks' blocks on the output dim ReshapeDim gives. The result must be the unsharded reshape
// of the global tensor to `global_out`: that shape, and its values still 0, 1, ... in order.
void ExpectJoinedReshapeIsUnsharded(std::vector<int64_t> global_in, int d, int64_t n,
                                    std::vector<int64_t> local_out,
                                    std::vector<int64_t> global_out) {
  SCOPED_TRACE(absl::StrCat("global_in dim ", d, " over ", n, " ranks"));
  std::vector<int64_t> local_in = global_in;
  ASSERT_EQ(local_in[d] % n, 0);
  local_in[d] /= n;
  int64_t local_numel = 1;
  for (int64_t s : local_in) local_numel *= s;
  // Each rank's block in row-major order (a reshape keeps that order).
  std::vector<std::vector<int64_t>> blocks(n);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t flat = 0; flat < local_numel; ++flat) {
      int64_t rem = flat, global_flat = 0, stride = 1;
      for (int k = static_cast<int>(local_in.size()) - 1; k >= 0; --k) {
        int64_t i = rem % local_in[k];
        rem /= local_in[k];
        if (k == d) i += r * local_in[d];
        global_flat += i * stride;
        stride *= global_in[k];
      }
      blocks[r].push_back(global_flat);
    }
  }
  const int e = ReshapeDim(local_in, local_out, d);
  ASSERT_GE(e, 0);
  std::vector<int64_t> joined_shape = local_out;
  joined_shape[e] *= n;
  EXPECT_EQ(joined_shape, global_out) << "S" << e;
  if (joined_shape != global_out) return;
  std::vector<int64_t> joined;
  for (int64_t flat = 0; flat < n * local_numel; ++flat) {
    int64_t rem = flat, local_flat = 0, stride = 1, rank = 0;
    for (int k = static_cast<int>(joined_shape.size()) - 1; k >= 0; --k) {
      int64_t i = rem % joined_shape[k];
      rem /= joined_shape[k];
      if (k == e) {
        rank = i / local_out[e];
        i %= local_out[e];
      }
      local_flat += i * stride;
      stride *= local_out[k];
    }
    joined.push_back(blocks[rank][local_flat]);
  }
  for (int64_t flat = 0; flat < n * local_numel; ++flat) {
    ASSERT_EQ(joined[flat], flat) << "S" << e << " at " << flat;
  }
}

TEST(ReshapeRule, JoinedShardsEqualTheUnshardedReshape) {
  for (int64_t n : {2, 3, 5}) {
    // The decode row: [1, h*hd] -> [1, h, hd], heads 2n (odd hd) and n (one per rank).
    ExpectJoinedReshapeIsUnsharded({1, n * 2 * 7}, 1, n, {1, 2, 7}, {1, n * 2, 7});
    ExpectJoinedReshapeIsUnsharded({1, n * 7}, 1, n, {1, 1, 7}, {1, n, 7});
    ExpectJoinedReshapeIsUnsharded({1, n * 3, 5}, 1, n, {1, 15}, {1, n * 15});
    ExpectJoinedReshapeIsUnsharded({1, n, 5}, 1, n, {1, 1, 5}, {1, n, 5});
    // The GPT q slice at one head per device: [b, t, 1, h, hd] -> [b, t, h, hd].
    ExpectJoinedReshapeIsUnsharded({2, 3, 1, n, 5}, 3, n, {2, 3, 1, 5}, {2, 3, n, 5});
    ExpectJoinedReshapeIsUnsharded({1, 1, 1, n, 5}, 3, n, {1, 1, 1, 5}, {1, 1, n, 5});
    // Two size-1 dims before the shard ([b, t, h*hd] at b = t = 1), and one after it.
    ExpectJoinedReshapeIsUnsharded({1, 1, n * 3 * 5}, 2, n, {1, 1, 3, 5}, {1, 1, n * 3, 5});
    ExpectJoinedReshapeIsUnsharded({1, 1, n * 5}, 2, n, {1, 1, 1, 5}, {1, 1, n, 5});
    ExpectJoinedReshapeIsUnsharded({n * 3, 5, 1}, 0, n, {3, 5}, {n * 3, 5});
    ExpectJoinedReshapeIsUnsharded({1, n * 3, 1, 5}, 1, n, {1, 3, 5}, {1, n * 3, 5});
    ExpectJoinedReshapeIsUnsharded({n * 3, 5}, 0, n, {3, 1, 5}, {n * 3, 1, 5});
    // Heads at more rows, odd sizes: [b, t, h*hd] -> [b, t, h, hd] and the merge back.
    ExpectJoinedReshapeIsUnsharded({3, 5, n * 7}, 2, n, {3, 5, 1, 7}, {3, 5, n, 7});
    ExpectJoinedReshapeIsUnsharded({3, 5, n * 2, 7}, 2, n, {15, 14}, {15, n * 14});
    // A sharded leading dim merged as the major dim of its group.
    ExpectJoinedReshapeIsUnsharded({n, 3, 5}, 0, n, {15}, {n * 15});
  }
}

TEST(ReshapeRule, SameShardBlocksOnlyAcrossSizeOneDims) {
  EXPECT_TRUE(SameShardBlocks({2, 3, 1, 4}, 2, 3));
  EXPECT_TRUE(SameShardBlocks({2, 3, 1, 4}, 3, 2));
  EXPECT_TRUE(SameShardBlocks({2, 1, 1, 4}, 1, 3));
  EXPECT_FALSE(SameShardBlocks({2, 3, 1, 4}, 1, 2));
  EXPECT_FALSE(SameShardBlocks({2, 3, 1, 4}, 2, 4));
}

TEST(ReshapeRule, EmptyAndHugeShapesDoNotOverflow) {
  EXPECT_EQ(ReshapeDim({0, 5}, {0, 5}, 1), 1);
  const int64_t big = int64_t{1} << 40;
  EXPECT_EQ(ReshapeDim({big, big, 0, 3}, {0, 3}, 3), -1);
}

TEST(ReduceRule, ShardedReducedDimsNeedSumPartial) {
  const SpmdType x = T2(AxisType::Sharded(0), AxisType::Sharded(1));
  std::optional<Rejection> no;
  ReduceRule("sum", x, 2, {1}, false, false, true, kNames, no);
  ASSERT_TRUE(no);
  EXPECT_EQ(no->axis, 1);
  EXPECT_EQ(no->rule, "reduces dim 1, which is sharded (S1): a plain reduction would silently "
                      "ignore the other shards");
  EXPECT_NE(no->fix.find("sum_partial(x, dims)"), std::string::npos);
  no.reset();
  EXPECT_EQ(ReduceRule("sum_partial", x, 2, {1}, false, true, true, kNames, no).ToString(kNames),
            "{dp:S0,tp:P}");
  EXPECT_EQ(ReduceRule("sum_partial", x, 2, {0}, false, true, true, kNames, no).ToString(kNames),
            "{dp:P,tp:S0}");
  EXPECT_EQ(ReduceRule("sum_partial", x, 2, {0}, true, true, true, kNames, no).ToString(kNames),
            "{dp:P,tp:S1}");
  // All dims of a V of unknown layout: its share of the total.
  EXPECT_EQ(ReduceRule("sum_partial", T2(AxisType::V(), AxisType::R()), 2, {0, 1}, false, true,
                       true, kNames, no)
                .ToString(kNames),
            "{dp:P,tp:R}");
  EXPECT_FALSE(no);
  // A nonlinear reduction of a P.
  ReduceRule("norm", T2(AxisType::R(), AxisType::P()), 2, {1}, false, false, false, kNames, no);
  ASSERT_TRUE(no);
  EXPECT_EQ(no->axis, 1);
  EXPECT_NE(no->rule.find("nonlinear"), std::string::npos);
}

TEST(MaxRule, LocalMaxOfAShardedDimIsVarying) {
  const SpmdType x = T2(AxisType::Sharded(1), AxisType::R());
  std::optional<Rejection> no;
  EXPECT_EQ(MaxRule("local_max", x, {1}, true, true, kNames, no).ToString(kNames), "{dp:V,tp:R}");
  EXPECT_EQ(MaxRule("max", x, {0}, false, false, kNames, no).ToString(kNames), "{dp:S0,tp:R}");
  EXPECT_FALSE(no);
  MaxRule("max", x, {1}, true, false, kNames, no);
  ASSERT_TRUE(no);
  EXPECT_NE(no->fix.find("local_max"), std::string::npos);
}

TEST(NnRules, EmbeddingTakeAlongLastAndCrossEntropy) {
  std::optional<Rejection> no;
  AxisMask vocab = 0;
  // Vocab-parallel table (tp:S0) with replicated ids: a partial sum on tp.
  EXPECT_EQ(EmbeddingRule(T2(AxisType::R(), AxisType::Sharded(0)),
                          T2(AxisType::Sharded(0), AxisType::R()), 1, true, &vocab, no)
                .ToString(kNames),
            "{dp:S0,tp:P}");
  EXPECT_EQ(vocab, 2u);
  EXPECT_EQ(EmbeddingRule(T2(AxisType::R(), AxisType::Sharded(1)), T2(AxisType::R(), AxisType::R()),
                          2, true, &vocab, no)
                .ToString(kNames),
            "{dp:R,tp:S2}");
  EXPECT_FALSE(no);
  EmbeddingRule(T2(AxisType::R(), AxisType::Sharded(0)), T2(AxisType::R(), AxisType::V()), 1,
                true, &vocab, no);
  ASSERT_TRUE(no);
  EXPECT_NE(no->fix.find("all_gather(table, 0, axis) before the lookup"), std::string::npos)
      << no->fix;  // FSDP: gather the table
  EXPECT_NE(no->fix.find("all_gather the ids over that axis first"), std::string::npos)
      << no->fix;  // vocab-parallel: gather the ids
  no.reset();
  // Unchecked: only P is refused.
  EmbeddingRule(T2(AxisType::R(), AxisType::Sharded(0)), T2(AxisType::R(), AxisType::V()), 1,
                false, &vocab, no);
  EXPECT_FALSE(no);
  EmbeddingRule(T2(AxisType::P(), AxisType::R()), T2(AxisType::R(), AxisType::R()), 1, false,
                &vocab, no);
  ASSERT_TRUE(no);
  no.reset();
  EXPECT_EQ(TakeAlongLastRule(T2(AxisType::Sharded(0), AxisType::Sharded(1)), 2,
                              T2(AxisType::Sharded(0), AxisType::R()), true, &vocab, no)
                .ToString(kNames),
            "{dp:S0,tp:P}");
  EXPECT_EQ(vocab, 2u);
  EXPECT_FALSE(no);
  EXPECT_EQ(CrossEntropyRule(T2(AxisType::Sharded(0), AxisType::R()),
                             T2(AxisType::Sharded(0), AxisType::R()), kNames, no)
                .ToString(kNames),
            "{dp:S0,tp:R}");
  EXPECT_FALSE(no);
  CrossEntropyRule(T2(AxisType::Sharded(0), AxisType::R()), T2(AxisType::R(), AxisType::R()),
                   kNames, no);
  ASSERT_TRUE(no);
  EXPECT_EQ(no->rule, "logits and targets are distributed differently");
  no = CheckDimNotSharded(T2(AxisType::R(), AxisType::Sharded(1)), 1, "gather first");
  ASSERT_TRUE(no);
  EXPECT_EQ(no->axis, 1);
  EXPECT_FALSE(CheckDimNotSharded(T2(AxisType::R(), AxisType::Sharded(1)), 0, "x"));
}

TEST(LayoutRules, PermuteSliceBroadcast) {
  const SpmdType x = T2(AxisType::Sharded(0), AxisType::Sharded(2));
  EXPECT_EQ(PermuteRule(x, {2, 1, 0}, 3).ToString(kNames), "{dp:S2,tp:S0}");
  EXPECT_EQ(PermuteRule(x, {1, -1, 0}, 3).ToString(kNames), "{dp:S2,tp:S1}");
  EXPECT_EQ(SliceRule(x, 0).ToString(kNames), "{dp:V,tp:S2}");
  EXPECT_EQ(SliceRule(x, 1).ToString(kNames), "{dp:S0,tp:S2}");
  // [1, 3] -> [4, 1, 3]: dim 1 lands on 2; a broadcast size-1 dim loses S.
  EXPECT_EQ(BroadcastRule(T2(AxisType::Sharded(1), AxisType::Sharded(0)), {1, 3}, {4, 1, 3})
                .ToString(kNames),
            "{dp:S2,tp:S1}");
  EXPECT_EQ(BroadcastRule(T2(AxisType::Sharded(0), AxisType::R()), {1, 3}, {4, 3})
                .ToString(kNames),
            "{dp:V,tp:R}");
}

// The inline fast paths agree with the full rules on every pair of two-axis types (R, I, V,
// S0, S1, P per axis), with and without broadcasting, and fire exactly where they are meant to:
// elementwise on equal types (not P under a multilinear op; S only without broadcasting), matmul
// on R and V operands.
TEST(FastPaths, AgreeWithTheFullRulesAndFireWhereMeant) {
  const std::vector<AxisType> kinds = {AxisType::R(), AxisType::I(), AxisType::V(),
                                       AxisType::Sharded(0), AxisType::Sharded(1), AxisType::P()};
  std::vector<SpmdType> types;
  for (AxisType x : kinds) {
    for (AxisType y : kinds) types.push_back(T2(x, y));
  }
  auto has = [](const SpmdType& t, auto pred) {
    for (int i = 0; i < t.num_axes(); ++i) {
      if (pred(t[i])) return true;
    }
    return false;
  };
  const std::vector<int64_t> k4x8 = {4, 8}, k1x8 = {1, 8};
  const std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> shapes = {
      {k4x8, k4x8}, {k4x8, k1x8}, {k1x8, k4x8}};
  int elementwise_fired = 0, matmul_fired = 0;
  for (const SpmdType& a : types) {
    for (const SpmdType& b : types) {
      for (const auto& [as, bs] : shapes) {
        for (int mode = 0; mode < 3; ++mode) {  // add, mul, div
          const bool multilinear = mode > 0, divide = mode == 2;
          std::optional<Rejection> no_fast, no_full;
          const SpmdType fast = ElementwiseRule("add", a, as, b, bs, k4x8, multilinear, divide,
                                                no_fast);
          const SpmdType full = internal::ElementwiseRuleFull("add", a, as, b, bs, k4x8,
                                                              multilinear, divide, no_full);
          ASSERT_EQ(no_fast.has_value(), no_full.has_value())
              << a.ToString(kNames) << " " << b.ToString(kNames) << " mode " << mode;
          if (!no_full) {
            ASSERT_EQ(fast.ToString(kNames), full.ToString(kNames))
                << a.ToString(kNames) << " " << b.ToString(kNames) << " mode " << mode;
          } else {
            EXPECT_EQ(no_fast->rule, no_full->rule);
          }
          const bool broadcast = as != k4x8 || bs != k4x8;
          const bool meant =
              a == b && !(multilinear && has(a, [](AxisType x) { return x.kind == AxisKind::kP; })) &&
              !(broadcast && has(a, [](AxisType x) { return x.dim >= 0; }));
          const std::optional<SpmdType> fired =
              internal::ElementwiseFast(a, as, b, bs, k4x8, multilinear);
          EXPECT_EQ(fired.has_value(), meant)
              << a.ToString(kNames) << " " << b.ToString(kNames) << " mode " << mode;
          if (fired) {
            EXPECT_EQ(fired->ToString(kNames), full.ToString(kNames));
            ++elementwise_fired;
          }
        }
      }
      for (bool ta : {false, true}) {
        std::optional<Rejection> no_fast, no_full;
        const SpmdType fast = MatmulRule(a, 2, b, 2, ta, false, kNames, no_fast);
        const SpmdType full = internal::MatmulRuleFull(a, 2, b, 2, ta, false, kNames, no_full);
        ASSERT_EQ(no_fast.has_value(), no_full.has_value())
            << a.ToString(kNames) << " @ " << b.ToString(kNames);
        if (!no_full) {
          ASSERT_EQ(fast.ToString(kNames), full.ToString(kNames))
              << a.ToString(kNames) << " @ " << b.ToString(kNames);
        }
        auto r_or_v = [](AxisType x) {
          return x.kind == AxisKind::kR || (x.kind == AxisKind::kV && x.dim < 0);
        };
        const bool meant = !has(a, [&](AxisType x) { return !r_or_v(x); }) &&
                           !has(b, [&](AxisType x) { return !r_or_v(x); });
        const std::optional<SpmdType> fired = internal::MatmulFast(a, b);
        EXPECT_EQ(fired.has_value(), meant) << a.ToString(kNames) << " @ " << b.ToString(kNames);
        if (fired) {
          EXPECT_EQ(fired->ToString(kNames), full.ToString(kNames));
          ++matmul_fired;
        }
      }
    }
  }
  // 36 equal pairs x 3 shapes x 3 modes, less P under mul/div and S under broadcasting.
  EXPECT_GT(elementwise_fired, 100);
  EXPECT_EQ(matmul_fired, 4 * 4 * 2);  // {R, V}^2 per operand, both transposes
}

// Every pair of kinds (x, rows) through RowOpRule, as the rule states it per axis.
TEST(RoutingRule, RowOpKindsPerPair) {
  std::string table;
  for (AxisType x : {AxisType::R(), AxisType::I(), AxisType::V(), AxisType::P()}) {
    for (AxisType rows : {AxisType::R(), AxisType::I(), AxisType::V(), AxisType::P()}) {
      std::optional<Rejection> no;
      SpmdType t = RowOpRule(On0(x), On0(rows), no);
      table += absl::StrCat(KindName(x.kind), KindName(rows.kind), "=",
                            no ? "no" : KindName(t[0].kind), " ");
    }
  }
  EXPECT_EQ(table,
            "RR=R RI=no RV=V RP=no IR=I II=I IV=no IP=no VR=V VI=no VV=V VP=no PR=P PI=P PV=no "
            "PP=no ");
  std::optional<Rejection> no;
  RowOpRule(On0(AxisType::P()), On0(AxisType::V()), no);
  ASSERT_TRUE(no);
  EXPECT_EQ(no->axis, 0);
  EXPECT_NE(no->rule.find("row indices vary"), std::string::npos);
  EXPECT_NE(no->fix.find("all_reduce x first"), std::string::npos);
}

TEST(AttentionRule, QKVShardedAlike) {
  const SpmdType s2 = On0(AxisType::Sharded(2)), r = On0(AxisType::R());
  EXPECT_FALSE(AttentionShardedAlikeRule(s2, s2, s2));
  EXPECT_FALSE(AttentionShardedAlikeRule(r, r, On0(AxisType::I())));
  std::optional<Rejection> no = AttentionShardedAlikeRule(s2, s2, r);
  ASSERT_TRUE(no);
  EXPECT_EQ(no->rule.substr(0, 16), "q is S2 but v is");
  no = AttentionShardedAlikeRule(s2, On0(AxisType::Sharded(0)), s2);
  ASSERT_TRUE(no);
  EXPECT_NE(no->rule.find("k is S0"), std::string::npos);
  EXPECT_NE(no->fix.find("shard q, k and v alike"), std::string::npos);
}

}  // namespace
}  // namespace shardmap
