// Type rules of the typed ops (docs/design.md section 4.2) and the content of their error messages.
// Types are per axis, independent of the axis sizes, so a one-rank mesh of size-1 axes suffices.
#include "shardmap/ops/ops.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shardmap/runtime/context.h"
#include "shardmap/runtime/tape_hook.h"
#include "shardmap/value.h"
#include "shardmap/visualize.h"
#include "tensor/error.h"

namespace shardmap {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

class OpsTest : public ::testing::Test {
 protected:
  OpsTest() : ctx_(*Mesh::Create({{"dp", 1}, {"tp", 1}})) {}

  // A value of the given shape typed {dp:a, tp:b}.
  Value Make(std::vector<int64_t> shape, AxisType dp, AxisType tp) {
    SpmdType t(2);
    t[0] = dp;
    t[1] = tp;
    return Value(Tensor::Ones(absl::Span<const int64_t>(shape)), t);
  }
  static std::string Type(const Value& v) { return v.type.ToString({"dp", "tp"}); }

  std::string ErrorOf(const std::function<void()>& f) {
    absl::Status s = CatchOpError(f);
    EXPECT_FALSE(s.ok());
    return std::string(s.message());
  }

  SingleRankContext ctx_;
  const AxisType R = AxisType::R(), I = AxisType::I(), V = AxisType::V(), Pt = AxisType::P();
  static AxisType S(int d) { return AxisType::Sharded(d); }
};

TEST_F(OpsTest, LinearRules) {
  EXPECT_EQ(Type(Make({2, 3}, R, R) + Make({2, 3}, R, R)), "{dp:R,tp:R}");
  EXPECT_EQ(Type(Make({2, 3}, Pt, Pt) + Make({2, 3}, Pt, Pt)), "{dp:P,tp:P}");
  EXPECT_EQ(Type(Make({2, 3}, I, I) - Make({2, 3}, I, I)), "{dp:I,tp:I}");
  // R + V = V; a replicated bias keeps the sharded dim (broadcast from the right).
  EXPECT_EQ(Type(Make({2, 3}, S(0), R) + Make({3}, R, R)), "{dp:S0,tp:R}");
  EXPECT_EQ(Type(Make({2, 3}, V, S(1)) + Make({2, 3}, S(0), S(1))), "{dp:V,tp:S1}");
  // Different sharded dims: plain V.
  EXPECT_EQ(Type(Make({2, 2}, S(0), R) + Make({2, 2}, S(1), R)), "{dp:V,tp:R}");
}

TEST_F(OpsTest, BiasBeforeAllReduceIsAnError) {
  Value yp = Make({4, 8}, R, Pt), b = Make({8}, R, R);
  std::string msg = ErrorOf([&] { yp + b; });
  EXPECT_THAT(msg, AllOf(HasSubstr("add"), HasSubstr("partial sum (P)"),
                         HasSubstr("bias added before the all-reduce"), HasSubstr("axis 'tp'"),
                         HasSubstr("a=f32[4,8]{dp:R,tp:P}"), HasSubstr("b=f32[8]{dp:R,tp:R}"),
                         HasSubstr("Fix: all_reduce")));
  EXPECT_THAT(ErrorOf([&] { yp - Make({4, 8}, R, V); }), HasSubstr("varying (V)"));
  EXPECT_THAT(ErrorOf([&] { yp + 1.0; }), AllOf(HasSubstr("add_scalar"), HasSubstr("P")));
}

TEST_F(OpsTest, InvariantMixesWithNothingElse) {
  std::string msg = ErrorOf([&] { Make({2}, I, R) * Make({2}, R, R); });
  EXPECT_THAT(msg, AllOf(HasSubstr("mul"), HasSubstr("invariant (I)"), HasSubstr("axis 'dp'"),
                         HasSubstr("convert(x, axis, I->R)")));
  EXPECT_THAT(ErrorOf([&] { Make({2, 2}, R, I).matmul(Make({2, 2}, R, V)); }),
              HasSubstr("invariant (I)"));
}

TEST_F(OpsTest, MultilinearRules) {
  EXPECT_EQ(Type(Make({2}, Pt, R) * Make({2}, R, R)), "{dp:P,tp:R}");
  EXPECT_EQ(Type(Make({2}, S(0), R) * Make({2}, R, S(0))), "{dp:S0,tp:S0}");
  EXPECT_THAT(ErrorOf([&] { Make({2}, Pt, R) * Make({2}, Pt, R); }),
              AllOf(HasSubstr("P*P"), HasSubstr("all_reduce one operand")));
  EXPECT_THAT(ErrorOf([&] { Make({2}, Pt, R) * Make({2}, V, R); }),
              HasSubstr("partial sum (P) by a varying (V)"));
  EXPECT_THAT(ErrorOf([&] { Make({2}, R, R) / Make({2}, R, Pt); }),
              HasSubstr("divisor is a partial sum"));
  EXPECT_EQ(Type(Make({2}, R, Pt) / Make({2}, R, R)), "{dp:R,tp:P}");
}

TEST_F(OpsTest, MatmulRules) {
  // Column-parallel: R @ S1 = S1. Row-parallel: S1 @ S0 = P. Batch dim stays S0.
  Value x = Make({4, 8}, S(0), R), w1 = Make({8, 6}, R, S(1)), w2 = Make({6, 8}, R, S(0));
  Value h = x.matmul(w1);
  EXPECT_EQ(Type(h), "{dp:S0,tp:S1}");
  EXPECT_EQ(Type(h.matmul(w2)), "{dp:S0,tp:P}");
  // Transposed flags move the roles: (w1^T)^T.
  EXPECT_EQ(Type(matmul(x, Make({6, 8}, R, S(0)), false, true)), "{dp:S0,tp:S1}");
  // Batched: both sharded on the batch dim.
  EXPECT_EQ(Type(matmul(Make({2, 3, 4}, S(0), R), Make({2, 4, 5}, S(0), R))), "{dp:S0,tp:R}");
  // Rank-3 activations with a rank-2 weight: a sharded free dim stays.
  EXPECT_EQ(Type(Make({2, 3, 4}, R, S(1)).matmul(Make({4, 5}, R, R))), "{dp:R,tp:S1}");
  // One operand P with R: P.
  EXPECT_EQ(Type(Make({2, 2}, R, Pt).matmul(Make({2, 2}, R, R))), "{dp:R,tp:P}");
  EXPECT_THAT(ErrorOf([&] { Make({2, 2}, R, Pt).matmul(Make({2, 2}, R, S(0))); }),
              AllOf(HasSubstr("matmul"), HasSubstr("varying")));
}

TEST_F(OpsTest, NonlinearRejectsPartial) {
  Value yp = Make({2, 3}, R, Pt);
  std::string msg = ErrorOf([&] { gelu(yp); });
  EXPECT_THAT(msg, AllOf(HasSubstr("gelu is nonlinear"), HasSubstr("axis 'tp'"),
                         HasSubstr("x=f32[2,3]{dp:R,tp:P}"), HasSubstr("all_reduce(x, \"tp\")")));
  for (auto f : std::vector<std::function<Value(const Value&)>>{
           [](const Value& v) { return exp(v); }, [](const Value& v) { return relu(v); },
           [](const Value& v) { return tanh(v); }, [](const Value& v) { return silu(v); }}) {
    EXPECT_FALSE(CatchOpError([&] { f(yp); }).ok());
  }
  EXPECT_EQ(Type(gelu(Make({2}, S(0), I))), "{dp:S0,tp:I}");
}

TEST_F(OpsTest, ReductionsOverShardedDims) {
  Value x = Make({4, 6}, S(0), S(1));
  std::string msg = ErrorOf([&] { x.sum({1}); });
  EXPECT_THAT(msg, AllOf(HasSubstr("sum"), HasSubstr("dim 1"), HasSubstr("sharded (S1)"),
                         HasSubstr("sum_partial(x, dims)"), HasSubstr("axis 'tp'")));
  EXPECT_THAT(ErrorOf([&] { x.mean({0}); }), HasSubstr("sum_partial"));
  EXPECT_EQ(Type(sum_partial(x, {1})), "{dp:S0,tp:P}");
  EXPECT_EQ(Type(sum_partial(x, {0})), "{dp:P,tp:S0}");  // dim 1 becomes dim 0
  EXPECT_EQ(Type(sum_partial(x, {0}, true)), "{dp:P,tp:S1}");
  EXPECT_EQ(Type(sum_partial(x, {})), "{dp:P,tp:P}");
  EXPECT_EQ(Type(Make({4, 6}, S(0), R).sum({1})), "{dp:S0,tp:R}");
}

TEST_F(OpsTest, LayoutTracksShardedDims) {
  Value x = Make({4, 3, 5}, S(0), S(2));
  EXPECT_EQ(Type(x.transpose(0, 2)), "{dp:S2,tp:S0}");
  EXPECT_EQ(Type(permute(x, {1, 2, 0})), "{dp:S2,tp:S1}");
  // Merging dims 0,1: S0 is the major dim of the group, kept; S2 stays at the new dim 1.
  EXPECT_EQ(Type(x.reshape({12, 5})), "{dp:S0,tp:S1}");
  // Merging dims 1,2: S2 is the minor dim of its group, lost.
  EXPECT_EQ(Type(x.reshape({4, 15})), "{dp:S0,tp:V}");
  // Splitting dim 0 keeps S on the major part.
  EXPECT_EQ(Type(x.reshape({2, 2, 3, 5})), "{dp:S0,tp:S3}");
  EXPECT_EQ(Type(slice(x, 0, 1, 2)), "{dp:V,tp:S2}");
  EXPECT_EQ(Type(slice(x, 1, 1, 2)), "{dp:S0,tp:S2}");
  EXPECT_EQ(Type(concat({x, x}, 2)), "{dp:S0,tp:V}");
}

TEST_F(OpsTest, ErasedModeSkipsRulesAndKeepsKinds) {
  ctx_.ctx().set_check(TypeCheck::kErased);
  Value y = Make({2, 3}, R, Pt) + Make({3}, R, R);  // an error when checked
  EXPECT_EQ(y.type[0].kind, AxisKind::kR);
  EXPECT_EQ(Type(gelu(Make({2}, S(0), R))), "{dp:S0,tp:R}");
  EXPECT_EQ(Type(Make({2, 2}, S(0), R).matmul(Make({2, 2}, R, R))), "{dp:V,tp:R}");
  ctx_.ctx().set_check(TypeCheck::kOn);
}

TEST_F(OpsTest, OpsOutsideAContextFail) {
  absl::Status s;
  std::thread t([&] { s = CatchOpError([] { Value::Replicated(Tensor::Ones({2})); }); });
  t.join();
  EXPECT_THAT(s.message(), HasSubstr("no SPMD context"));
}

TEST_F(OpsTest, NoRecordingWithoutTapeOrInNoGradScope) {
  Value x = Make({2}, R, R);
  x.node = 0;  // pretend it is on a tape
  EXPECT_EQ((x * x).node, -1);  // no recorder installed: nothing recorded
  struct Counting : TapeRecorder {
    int n = 0;
    void Record(const char*, std::initializer_list<const Value*>, Value& out, VjpFn) override {
      out.node = n++;
    }
  } rec;
  ScopedRecorder scope(&rec);
  EXPECT_GE((x * x).node, 0);
  EXPECT_EQ((Make({2}, R, R) * 2.0).node, -1);  // constants are not recorded
  {
    NoGradScope no_grad;
    EXPECT_EQ((x * x).node, -1);
  }
  EXPECT_EQ(rec.n, 1);
}

TEST_F(OpsTest, VisualizeValue) {
  std::string s = Visualize(Make({4, 6}, S(0), Pt));
  EXPECT_THAT(s, AllOf(HasSubstr("local f32[4,6]{dp:S0,tp:P}"), HasSubstr("rows 0-3"),
                       HasSubstr("pending sum (P) over 'tp'")));
}

}  // namespace
}  // namespace shardmap
