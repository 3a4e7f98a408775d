// shard_map error paths that are easy to miss: an undefined input, an in_spec with unreduced
// axes, fn returning the wrong number of outputs, ranks returning different local shapes or
// dtypes, bf16 partial outputs (summed in f32, rounded once); and size-0 tensors through the
// global view and the typed collectives. Every error is a Status that says what and how to fix.
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shardmap/ops/collective_ops.h"
#include "shardmap/ops/ops.h"
#include "shardmap/shard_map.h"
#include "shardmap/sharding.h"
#include "tensor/ops/shape_ops.h"
#include "tests/test_util.h"

namespace shardmap {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::Rand;

ShardFn Identity() {
  return [](const std::vector<Value>& v) -> std::vector<Value> { return v; };
}

TEST(ShardMapErrorsTest, UndefinedInputIsAnErrorNamingIt) {
  Mesh mesh = *Mesh::Create({{"tp", 2}});
  ShardMapOptions named;
  named.input_names = {"x", "w"};
  absl::StatusOr<std::vector<Tensor>> r =
      shard_map(Identity(), mesh, {P(), P("tp")}, {P(), P("tp")}, named)({Rand({2}, 1), Tensor()});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), AllOf(HasSubstr("'w'"), HasSubstr("undefined")));
}

TEST(ShardMapErrorsTest, InSpecWithUnreducedAxesIsRejected) {
  Mesh mesh = *Mesh::Create({{"dp", 2}, {"tp", 2}});
  absl::StatusOr<std::vector<Tensor>> r =
      shard_map(Identity(), mesh, {P("dp").Unreduced({"tp"})}, {P("dp")})({Rand({4}, 1)});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), AllOf(HasSubstr("input 0"), HasSubstr("unreduced")));
}

TEST(ShardMapErrorsTest, WrongNumberOfOutputsIsAnError) {
  Mesh mesh = *Mesh::Create({{"tp", 3}});
  ShardFn two = [](const std::vector<Value>& v) -> std::vector<Value> { return {v[0], v[0]}; };
  absl::StatusOr<std::vector<Tensor>> r = shard_map(two, mesh, {P()}, {P()})({Rand({2}, 1)});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), AllOf(HasSubstr("2 outputs"), HasSubstr("1 out_specs")));
  ShardFn none = [](const std::vector<Value>&) -> std::vector<Value> { return {}; };
  r = shard_map(none, mesh, {P()}, {P(), P()})({Rand({2}, 1)});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), AllOf(HasSubstr("0 outputs"), HasSubstr("2 out_specs")));
}

// fn returns a local tensor whose shape (or dtype) depends on the rank: the types cannot see it,
// the assembly must refuse it instead of placing garbage.
TEST(ShardMapErrorsTest, RanksReturningDifferentShapesOrDtypesAreAnError) {
  Mesh mesh = *Mesh::Create({{"tp", 3}});
  for (TypeCheck check : {TypeCheck::kOn, TypeCheck::kErased}) {
    ShardMapOptions o;
    o.check = check;
    ShardFn by_shape = [](const std::vector<Value>& v) -> std::vector<Value> {
      const int64_t rows = 1 + RankContext::Current()->rank();
      return {Value(Tensor::Zeros({rows, 2}, DType::kF64), v[0].type)};
    };
    absl::StatusOr<std::vector<Tensor>> r =
        shard_map(by_shape, mesh, {P("tp")}, {P("tp")}, o)({Rand({3, 2}, 1)});
    ASSERT_FALSE(r.ok());
    EXPECT_THAT(r.status().message(),
                AllOf(HasSubstr("rank 1 returned f64[2,2] but rank 0 returned f64[1,2]"),
                      HasSubstr("same local shape")));
    ShardFn by_dtype = [](const std::vector<Value>& v) -> std::vector<Value> {
      const DType t = RankContext::Current()->rank() == 2 ? DType::kF32 : DType::kF64;
      return {Value(Tensor::Zeros({1, 2}, t), v[0].type)};
    };
    r = shard_map(by_dtype, mesh, {P("tp")}, {P("tp")}, o)({Rand({3, 2}, 1)});
    ASSERT_FALSE(r.ok());
    EXPECT_THAT(r.status().message(), HasSubstr("rank 2 returned f32[1,2] but rank 0 returned"));
  }
}

TEST(ShardMapErrorsTest, RanksReturningDifferentDtypesForAPartialSumAreAnError) {
  Mesh mesh = *Mesh::Create({{"tp", 2}});
  ShardFn fn = [](const std::vector<Value>& v) -> std::vector<Value> {
    const DType t = RankContext::Current()->rank() == 1 ? DType::kF16 : DType::kBF16;
    return {Value(Tensor::Ones({2}, t), SpmdType(1, AxisType::P()))};
  };
  absl::StatusOr<std::vector<Tensor>> r =
      shard_map(fn, mesh, {P()}, {P().Unreduced({"tp"})})({Rand({2}, 1)});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("different dtypes"));
}

// 16-bit partial outputs are summed in f32 and rounded once (never summed in 16 bits): the
// result equals the f64 sum of the bf16 parts, rounded to bf16 once.
TEST(ShardMapErrorsTest, Bf16PartialOutputsAreSummedInF32AndRoundedOnce) {
  Mesh mesh = *Mesh::Create({{"tp", 3}});
  // Parts chosen so a bf16 running sum would round differently: 1 + 2^-8 + 2^-8 in bf16 steps
  // loses both small terms (7 stored mantissa bits), the f32 sum keeps them: 1 + 2^-7 is a bf16 value.
  const std::vector<float> parts = {1.0f, 1.0f / 256, 1.0f / 256};
  ShardFn fn = [&](const std::vector<Value>&) -> std::vector<Value> {
    const float x = parts[RankContext::Current()->rank()];
    return {Value(Tensor::FromVector<float>({1}, {x}, DType::kBF16), SpmdType(1, AxisType::P()))};
  };
  absl::StatusOr<std::vector<Tensor>> r = shard_map(fn, mesh, {}, {P().Unreduced({"tp"})})({});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TENSOR_EQ((*r)[0], Tensor::FromVector<float>({1}, {1.0f + 1.0f / 128}, DType::kBF16));
}

// ---- size-0 tensors ------------------------------------------------------------------------

TEST(ShardMapSizeZeroTest, EmptyTensorsSplitAndAssemble) {
  Mesh mesh = *Mesh::Create({{"dp", 2}, {"tp", 3}});
  const Tensor a = Tensor::Zeros({0, 6}, DType::kF64), b = Tensor::Zeros({4, 0}, DType::kF32);
  absl::StatusOr<std::vector<Tensor>> r = shard_map(
      [](const std::vector<Value>& v) -> std::vector<Value> {
        EXPECT_EQ(v[0].ToString(), "f64[0,2]{dp:R,tp:S1}");
        EXPECT_EQ(v[1].ToString(), "f32[2,0]{dp:S0,tp:R}");
        return {v[0], v[1], sum_partial(v[1], {0})};
      },
      mesh, {P(None, "tp"), P("dp")}, {P(None, "tp"), P("dp"), P().Unreduced({"dp"})})({a, b});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TENSOR_EQ((*r)[0], a);
  EXPECT_TENSOR_EQ((*r)[1], b);
  EXPECT_TENSOR_EQ((*r)[2], Tensor::Zeros({0}, DType::kF32));
}

TEST(ShardMapSizeZeroTest, TypedCollectivesOnEmptyTensors) {
  Mesh mesh = *Mesh::Create({{"tp", 3}});
  absl::StatusOr<std::vector<Tensor>> r = shard_map(
      [](const std::vector<Value>& v) -> std::vector<Value> {
        const Value& x = v[0];  // f32[0,3] S1 on tp -> local [0,1]
        Value y = all_gather(x, 1, "tp");                      // [0,3] R
        Value s = all_reduce(sum_partial(x, {1}), "tp");       // [0] R
        Value m = all_reduce(x, "tp", To::kR, ReduceKind::kMax);  // [0,1] R... of V values
        Value z = reduce_scatter(convert(y, "tp", Convert::kRToP), 1, "tp");  // [0,1] S1
        Value t = all_to_all(x, 0, 1, "tp");                 // [0,3]
        Value p = ppermute(x, "tp", {{0, 1}, {1, 2}, {2, 0}});
        Value b = broadcast(x, "tp", 1);
        EXPECT_EQ(y.tensor.shape(), Shape({0, 3}));
        EXPECT_EQ(s.tensor.shape(), Shape({0}));
        EXPECT_EQ(m.tensor.shape(), Shape({0, 1}));
        EXPECT_EQ(z.tensor.shape(), Shape({0, 1}));
        EXPECT_EQ(t.tensor.shape(), Shape({0, 3}));
        EXPECT_EQ(p.tensor.shape(), Shape({0, 1}));
        EXPECT_EQ(b.tensor.shape(), Shape({0, 1}));
        return {y, s, z};
      },
      mesh, {P(None, "tp")}, {P(), P(), P(None, "tp")})({Tensor::Zeros({0, 3})});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TENSOR_EQ((*r)[0], Tensor::Zeros({0, 3}));
  EXPECT_TENSOR_EQ((*r)[1], Tensor::Zeros({0}));
  EXPECT_TENSOR_EQ((*r)[2], Tensor::Zeros({0, 3}));
}

}  // namespace
}  // namespace shardmap
