// The messages users were lost in: each names the op, the SPMD types and a fix that keeps the
// math (never a cast that would silence the error and give wrong numbers).
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shardmap/ops/collective_ops.h"
#include "shardmap/runtime/context.h"
#include "shardmap/ops/ops.h"
#include "shardmap/shard_map.h"
#include "tensor/error.h"

namespace shardmap {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

Mesh M(std::vector<std::pair<std::string, int>> axes) { return *Mesh::Create(std::move(axes)); }

std::string Message(const ShardMap& f, const std::vector<Tensor>& in) {
  absl::StatusOr<std::vector<Tensor>> r = f(in);
  EXPECT_FALSE(r.ok()) << "the wrong program was accepted";
  return r.ok() ? "" : std::string(r.status().message());
}

Tensor Ones(Shape s) { return Tensor::Ones(s, DType::kF64); }

// x sharded on its contracted dim, the weight whole: the kernel alone said only
// "f64[3,2] @ f64[4,5]: contracted dims differ". The types say it first, on any tp size.
TEST(ErrorMessages, MatmulOfAShardedActivationWithAWholeWeight) {
  for (int tp : {1, 2}) {
    ShardMap f([](const std::vector<Value>& in) -> std::vector<Value> {
      return {all_reduce(in[0].matmul(in[1]), "tp")};
    }, M({{"tp", tp}}), {P(None, "tp"), P()}, {P()});
    EXPECT_THAT(Message(f, {Ones({3, 4}), Ones({4, 5})}),
                AllOf(HasSubstr("matmul: a's contracted dim 1 ('k') is sharded over 'tp' but "
                                "b's dim 0 is whole (R)"),
                      HasSubstr("b=f64[4,5]{tp:R}"), HasSubstr("shard b's dim 0 over 'tp'"),
                      HasSubstr("all_gather(a, 1, \"tp\")"), Not(HasSubstr("reinterpret"))))
        << "tp=" << tp;
  }
}

// Contracted dims sharded over different axes: the shapes line up, so this used to pass the
// matmul and fail later at the all_reduce, whose suggested reinterpret gave wrong numbers.
TEST(ErrorMessages, ContractedDimsShardedOverDifferentAxes) {
  ShardMap f([](const std::vector<Value>& in) -> std::vector<Value> {
    return {all_reduce(in[0].matmul(in[1]), {"dp", "tp"})};
  }, M({{"dp", 2}, {"tp", 2}}), {P(None, "tp"), P("dp", None)}, {P()});
  EXPECT_THAT(Message(f, {Ones({3, 4}), Ones({4, 5})}),
              AllOf(HasSubstr("matmul"), HasSubstr("sharded over 'tp'"),
                    HasSubstr("sharded over 'dp'"), HasSubstr("same axis"),
                    Not(HasSubstr("reinterpret"))));
}

// y - target with y still a partial sum: not the "bias" bug, and the fix says which operand.
TEST(ErrorMessages, ForgottenAllReduceBeforeASubtraction) {
  ShardMap f([](const std::vector<Value>& in) -> std::vector<Value> {
    Value y = in[0].matmul(in[1]);  // row-parallel: P on tp
    Value d = sub(y, in[2]);
    return {sum(d * d, {})};
  }, M({{"tp", 2}}), {P(None, "tp"), P("tp", None), P()}, {P()});
  EXPECT_THAT(Message(f, {Ones({3, 4}), Ones({4, 5}), Ones({3, 5})}),
              AllOf(HasSubstr("sub"), HasSubstr("operand a"), HasSubstr("{tp:P}"),
                    HasSubstr("all_reduce"), Not(HasSubstr("bias"))));
}

TEST(ErrorMessages, AddingABiasBeforeTheAllReduceIsStillNamed) {
  ShardMap f([](const std::vector<Value>& in) -> std::vector<Value> {
    return {all_reduce(add(in[0].matmul(in[1]), in[2]), "tp")};
  }, M({{"tp", 2}}), {P(None, "tp"), P("tp", None), P()}, {P()});
  EXPECT_THAT(Message(f, {Ones({3, 4}), Ones({4, 5}), Ones({5})}),
              HasSubstr("bias added before the all-reduce"));
}

// The output check's fix uses the output's name, not a generic `y`.
TEST(ErrorMessages, OutputFixNamesTheOutput) {
  ShardMapOptions o;
  o.output_names = {"logits"};
  ShardMap f([](const std::vector<Value>& in) -> std::vector<Value> {
    return {in[0].matmul(in[1])};
  }, M({{"tp", 2}}), {P(None, "tp"), P("tp", None)}, {P()}, o);
  EXPECT_THAT(Message(f, {Ones({3, 4}), Ones({4, 5})}),
              AllOf(HasSubstr("'logits'"), HasSubstr("all_reduce(logits, \"tp\")"),
                    Not(HasSubstr("(y,"))));
}

// A collective only some ranks issue is reported as the typed collective, not only in the
// communicator's words.
TEST(ErrorMessages, CollectiveOnSomeRanksNamesTheTypedCollective) {
  SpmdOptions o;
  o.comm.timeout = absl::Seconds(20);
  absl::Status s = RunSpmd(M({{"tp", 3}}), [](RankContext& ctx) {
    Value x = vary(Value::Replicated(Tensor::Ones({2}, DType::kF32)), {"tp"});
    if (ctx.rank() != 1) (void)all_gather(x, 0, "tp");
  }, o);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("all_gather over tp of f32[2]")) << s;
}

TEST(ErrorMessages, SpecErrorsQuoteNamesOnce) {
  ShardMapOptions o;
  o.input_names = {"w1"};
  absl::StatusOr<ShardMap> f = ShardMap::Create(
      [](const std::vector<Value>& in) { return in; }, M({{"tp", 2}}), {P("sp")}, {P()}, o);
  ASSERT_FALSE(f.ok());
  EXPECT_THAT(std::string(f.status().message()),
              AllOf(HasSubstr("'w1'"), Not(HasSubstr("''w1''")), HasSubstr("'sp'")));
}

}  // namespace
}  // namespace shardmap
