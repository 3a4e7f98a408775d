// What the README says happens to the usual mistakes in its first example, checked: where the
// error comes from (which op, which rule) and what it says. Also the two ways of writing the
// loss over a dp-sharded batch, against the tp-only loss.
#include <iostream>
#include <string>
#include <vector>

#include "autograd/value_and_grad.h"
#include "gtest/gtest.h"
#include "shardmap/collective_ops.h"
#include "shardmap/ops.h"
#include "shardmap/shard_map.h"
#include "spmd_testing/testing.h"
#include "tensor/random.h"

namespace {

using namespace shardmap;

// x [4, 8], w1 [8, 12], w2 [12, 8], b [8].
std::vector<Tensor> Inputs(DType dtype = DType::kF32) {
  return {RandomNormal({4, 8}, 1, 0, 1, dtype), RandomNormal({8, 12}, 2, 0, 1, dtype),
          RandomNormal({12, 8}, 3, 0, 1, dtype), RandomNormal({8}, 4, 0, 1, dtype)};
}

const std::vector<PartitionSpec> kInSpecs = {P(), P(None, "tp"), P("tp", None), P()};

// Runs `fn` on tp = 3 with value_and_grad; the rejection's message is printed for the README.
::testing::AssertionResult Rejected(ShardFn fn, std::vector<PartitionSpec> out_specs,
                                    const std::vector<std::string>& fragments) {
  ShardMap f = shard_map(fn, *Mesh::Create({{"tp", 3}}), kInSpecs, std::move(out_specs));
  ::testing::AssertionResult r =
      spmd_testing::RejectedWith([&] { return value_and_grad(f)(Inputs()); }, fragments);
  std::cout << r.message() << "\n";
  return r;
}

TEST(ReadmeMistakes, ForgottenAllReduceWithTheLossAfterItFailsAtTheSquare) {
  // y is a pending sum (P) over tp; y * y would square each device's part: the P * P rule.
  EXPECT_TRUE(Rejected(
      [](const std::vector<Value>& in) -> std::vector<Value> {
        Value y = gelu(in[0].matmul(in[1])).matmul(in[2]);
        return {sum(y * y, {}), y};
      },
      {P(), P()},
      {"mul: multiplies two partial sums (P*P)", "operands: a=f32[4,8]{tp:P}, b=f32[4,8]{tp:P}",
       "Fix: all_reduce one operand first"}));
}

TEST(ReadmeMistakes, ForgottenAllReduceReturnedAsIsFailsAtTheOutputCheck) {
  EXPECT_TRUE(Rejected(
      [](const std::vector<Value>& in) -> std::vector<Value> {
        Value y = gelu(in[0].matmul(in[1])).matmul(in[2]);
        return {sum_partial(y, {}), y};
      },
      {P().Unreduced({"tp"}), P()},
      {"output 1 is f32[4,8]{tp:P} but its out_spec is P()", "pending sum (P)",
       "Fix: all_reduce(output1, \"tp\") before returning"}));
}

TEST(ReadmeMistakes, BiasBeforeTheAllReduceFailsAtTheAdd) {
  EXPECT_TRUE(Rejected(
      [](const std::vector<Value>& in) -> std::vector<Value> {
        Value y = all_reduce(gelu(in[0].matmul(in[1])).matmul(in[2]) + in[3], "tp");
        return {sum(y * y, {}), y};
      },
      {P(), P()}, {"add: combines operand a, a partial sum (P), with a replicated (R) value",
                   "'bias added before the all-reduce' bug", "add the bias after the reduction"}));
}

TEST(ReadmeMistakes, SumOverADpShardedBatchIsRefused) {
  ShardFn fn = [](const std::vector<Value>& in) -> std::vector<Value> {
    Value y = all_reduce(gelu(in[0].matmul(in[1])).matmul(in[2]), "tp");
    return {sum(y * y, {})};
  };
  ShardMap f = shard_map(fn, *Mesh::Create({{"dp", 2}, {"tp", 3}}),
                         {P("dp"), P(None, "tp"), P("tp", None)}, {P()});
  std::vector<Tensor> in = Inputs();
  in.pop_back();  // no bias
  ::testing::AssertionResult r = spmd_testing::RejectedWith(
      [&] { return value_and_grad(f)(in); },
      {"sum: reduces dim 0, which is sharded (S0)", "on axis 'dp'",
       "Fix: call sum_partial(x, dims)"});
  std::cout << r.message() << "\n";
  EXPECT_TRUE(r);
}

// The dp-sharded loss both ways equals the loss of the tp-only program (f64: exact to rounding).
TEST(ReadmeDpBatch, BothWaysEqualTheTpOnlyLoss) {
  std::vector<Tensor> in = Inputs(DType::kF64);
  in.pop_back();  // no bias
  auto mlp = [](const std::vector<Value>& in) {
    return all_reduce(gelu(in[0].matmul(in[1])).matmul(in[2]), "tp");
  };
  ShardMap tp_only = shard_map(
      [&](const std::vector<Value>& in) -> std::vector<Value> {
        Value y = mlp(in);
        return {sum(y * y, {})};
      },
      *Mesh::Create({{"tp", 3}}), {P(), P(None, "tp"), P("tp", None)}, {P()});
  const Mesh mesh = *Mesh::Create({{"dp", 2}, {"tp", 3}});
  const std::vector<PartitionSpec> in_specs = {P("dp"), P(None, "tp"), P("tp", None)};
  ShardMap reduced = shard_map(
      [&](const std::vector<Value>& in) -> std::vector<Value> {
        Value y = mlp(in);
        return {all_reduce(sum_partial(y * y, {}), "dp")};
      },
      mesh, in_specs, {P()});
  ShardMap unreduced = shard_map(
      [&](const std::vector<Value>& in) -> std::vector<Value> {
        Value y = mlp(in);
        return {sum_partial(y * y, {})};
      },
      mesh, in_specs, {P().Unreduced({"dp"})});
  absl::StatusOr<ShardMapGrads> want = value_and_grad(tp_only)(in);
  ASSERT_TRUE(want.ok()) << want.status();
  for (ShardMap* f : {&reduced, &unreduced}) {
    absl::StatusOr<ShardMapGrads> got = value_and_grad(*f)(in);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE(spmd_testing::TensorsNear(got->outputs[0], want->outputs[0], 1e-9, 1e-12));
    for (int k = 0; k < 3; ++k) {
      EXPECT_TRUE(spmd_testing::TensorsNear(got->grads[k], want->grads[k], 1e-9, 1e-12))
          << "gradient " << k;
    }
  }
}

}  // namespace
