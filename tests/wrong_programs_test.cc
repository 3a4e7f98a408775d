// A catalogue of wrong programs: each is a small SPMD program run through shard_map (global or
// local view) or value_and_grad that must fail with a Status (never a crash or a hang) whose
// message names the op, the offending type and the fix.
#include <stdexcept>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "autograd/value_and_grad.h"
#include "gtest/gtest.h"
#include "shardmap/collective_ops.h"
#include "shardmap/context.h"
#include "shardmap/nn_ops.h"
#include "shardmap/ops.h"
#include "shardmap/shard_map.h"
#include "shardmap/sharding.h"
#include "tensor/error.h"
#include "tensor/ops/shape_ops.h"
#include "tests/test_util.h"

namespace shardmap {
namespace {

using testing::Rand;

Mesh M(std::vector<std::pair<std::string, int>> axes) { return *Mesh::Create(std::move(axes)); }

ShardMapOptions Fast() {
  ShardMapOptions o;
  o.comm.timeout = absl::Seconds(5);
  return o;
}

// Runs f on inputs (global view); the status must be an error.
absl::Status RunGlobal(const ShardFn& fn, const Mesh& mesh, std::vector<PartitionSpec> in_specs,
                       std::vector<PartitionSpec> out_specs, const std::vector<Tensor>& inputs,
                       ShardMapOptions opts = Fast()) {
  try {
    ShardMap f = shard_map(fn, mesh, std::move(in_specs), std::move(out_specs), std::move(opts));
    return f(inputs).status();
  } catch (const OpError& e) {
    return e.status();
  }
}

absl::Status RunGrad(const ShardFn& fn, const Mesh& mesh, std::vector<PartitionSpec> in_specs,
                     std::vector<PartitionSpec> out_specs, const std::vector<Tensor>& inputs) {
  try {
    return value_and_grad(shard_map(fn, mesh, std::move(in_specs), std::move(out_specs), Fast()))(
               inputs)
        .status();
  } catch (const OpError& e) {
    return e.status();
  }
}

void ExpectError(const absl::Status& s, std::vector<std::string> substrings) {
  ASSERT_FALSE(s.ok()) << "the wrong program was accepted";
  const std::string msg(s.message());
  for (const std::string& sub : substrings) {
    EXPECT_NE(msg.find(sub), std::string::npos) << "missing \"" << sub << "\" in: " << msg;
  }
  std::printf("[message] %s\n", msg.c_str());
}

ShardFn Identity() {
  return [](const std::vector<Value>& in) -> std::vector<Value> { return {in[0]}; };
}

// ---- bad specs ------------------------------------------------------------------------------

TEST(WrongSpecs, UnknownAxis) {
  ExpectError(RunGlobal(Identity(), M({{"tp", 2}}), {P("dp", None)}, {P("dp", None)},
                        {Rand({4, 2}, 1)}),
              {"unknown mesh axis 'dp'", "Mesh{tp:2}"});
}

TEST(WrongSpecs, AxisUsedTwice) {
  ExpectError(RunGlobal(Identity(), M({{"tp", 2}}), {P("tp", "tp")}, {P("tp", "tp")},
                        {Rand({4, 4}, 1)}),
              {"P(tp,tp)", "'tp' twice"});
}

TEST(WrongSpecs, SpecLongerThanRank) {
  ExpectError(RunGlobal(Identity(), M({{"tp", 2}}), {P("tp", None, None)}, {P("tp")},
                        {Rand({4, 4}, 1)}),
              {"P(tp,None,None)", "rank"});
}

TEST(WrongSpecs, IndivisibleDim) {
  // dim 0 of size 5 over (dp, tp) = 2 * 2 = 4 devices.
  ExpectError(RunGlobal(Identity(), M({{"dp", 2}, {"tp", 2}}), {P({"dp", "tp"}, None)},
                        {P({"dp", "tp"}, None)}, {Rand({5, 3}, 1)}),
              {"dim 0", "size 5", "(dp,tp)", "product 4"});
}

TEST(WrongSpecs, SeveralAxesOutOfMeshOrder) {
  ExpectError(RunGlobal(Identity(), M({{"dp", 2}, {"tp", 2}}), {P({"tp", "dp"}, None)},
                        {P({"tp", "dp"}, None)}, {Rand({4, 3}, 1)}),
              {"P((tp,dp),None)", "out of mesh order"});
}

TEST(WrongSpecs, WrongNumberOfInputs) {
  ExpectError(RunGlobal(Identity(), M({{"tp", 2}}), {P(), P()}, {P()}, {Rand({4}, 1)}),
              {"shard_map got 1 inputs", "2 in_specs"});
}

// ---- linearity and the pending-sum types -----------------------------------------------------

// The Megatron row-parallel matmul leaves y P on tp; adding the (R) bias before the all_reduce
// adds it tp times.
TEST(WrongTypes, BiasAddedBeforeAllReduce_PplusR) {
  ShardFn fn = [](const std::vector<Value>& p) -> std::vector<Value> {
    Value y = p[0].matmul(p[1]) + p[2];  // P + R
    return {all_reduce(y, "tp")};
  };
  ExpectError(RunGlobal(fn, M({{"tp", 2}}), {P(None, "tp"), P("tp", None), P()}, {P()},
                        {Rand({3, 4}, 1), Rand({4, 5}, 2), Rand({5}, 3)}),
              {"add:", "{tp:P}", "{tp:R}", "bias added before the all-reduce", "all_reduce"});
}

TEST(WrongTypes, PplusV) {
  ShardFn fn = [](const std::vector<Value>& p) -> std::vector<Value> {
    Value y = p[0].matmul(p[1]) + p[2];  // P + V (S0 rows of the column vector)
    return {all_reduce(y, "tp")};
  };
  ExpectError(RunGlobal(fn, M({{"tp", 2}}), {P(None, "tp"), P("tp", None), P("tp")}, {P()},
                        {Rand({2, 4}, 1), Rand({4, 2}, 2), Rand({4}, 3)}),
              {"add:", "{tp:P}", "{tp:S0}", "all_reduce"});
}

TEST(WrongTypes, PtimesP) {
  ShardFn fn = [](const std::vector<Value>& p) -> std::vector<Value> {
    Value y = p[0].matmul(p[1]);
    return {all_reduce(y * y, "tp")};
  };
  ExpectError(RunGlobal(fn, M({{"tp", 2}}), {P(None, "tp"), P("tp", None)}, {P()},
                        {Rand({3, 4}, 1), Rand({4, 5}, 2)}),
              {"mul:", "P*P", "{tp:P}", "all_reduce"});
}

TEST(WrongTypes, PtimesV) {
  ShardFn fn = [](const std::vector<Value>& p) -> std::vector<Value> {
    Value y = p[0].matmul(p[1]);  // P, [2,2]
    return {all_reduce(y * p[2], "tp")};  // V: S0 of a [4,2] tensor
  };
  ExpectError(RunGlobal(fn, M({{"tp", 2}}), {P(None, "tp"), P("tp", None), P("tp", None)},
                        {P()}, {Rand({2, 4}, 1), Rand({4, 2}, 2), Rand({4, 2}, 3)}),
              {"mul:", "{tp:P}", "{tp:S0}", "all_reduce"});
}

TEST(WrongTypes, GeluOnPendingSum) {
  ShardFn fn = [](const std::vector<Value>& p) -> std::vector<Value> {
    return {all_reduce(gelu(p[0].matmul(p[1])), "tp")};
  };
  ExpectError(RunGlobal(fn, M({{"tp", 2}}), {P(None, "tp"), P("tp", None)}, {P()},
                        {Rand({3, 4}, 1), Rand({4, 5}, 2)}),
              {"gelu:", "{tp:P}", "all_reduce(x, \"tp\")"});
}

TEST(WrongTypes, ExpOnPendingSum) {
  ShardFn fn = [](const std::vector<Value>& p) -> std::vector<Value> {
    return {all_reduce(exp(p[0].matmul(p[1])), "tp")};
  };
  ExpectError(RunGlobal(fn, M({{"tp", 3}}), {P(None, "tp"), P("tp", None)}, {P()},
                        {Rand({3, 6}, 1), Rand({6, 5}, 2)}),
              {"exp:", "{tp:P}", "all_reduce(x, \"tp\")"});
}

TEST(WrongTypes, SoftmaxOnPendingSum) {
  ShardFn fn = [](const std::vector<Value>& p) -> std::vector<Value> {
    return {all_reduce(softmax(p[0].matmul(p[1]), 1), "tp")};
  };
  ExpectError(RunGlobal(fn, M({{"tp", 2}}), {P(None, "tp"), P("tp", None)}, {P()},
                        {Rand({3, 4}, 1), Rand({4, 5}, 2)}),
              {"softmax:", "{tp:P}", "all_reduce(x, \"tp\")"});
}

TEST(WrongTypes, InvariantMixedWithReplicated) {
  ShardFn fn = [](const std::vector<Value>& p) -> std::vector<Value> { return {p[0] + p[1]}; };
  ShardMapOptions o = Fast();
  o.invariant_inputs = {0};
  ExpectError(RunGlobal(fn, M({{"tp", 2}}), {P(), P()}, {P()}, {Rand({3}, 1), Rand({3}, 2)}, o),
              {"add:", "{tp:I}", "{tp:R}", "convert"});
}

TEST(WrongTypes, ScalarAddedToPendingSum) {
  ShardFn fn = [](const std::vector<Value>& p) -> std::vector<Value> {
    return {all_reduce(p[0].matmul(p[1]) + 1.0, "tp")};
  };
  ExpectError(RunGlobal(fn, M({{"tp", 2}}), {P(None, "tp"), P("tp", None)}, {P()},
                        {Rand({3, 4}, 1), Rand({4, 5}, 2)}),
              {"add_scalar:", "{tp:P}", "all_reduce"});
}

TEST(WrongTypes, PlainSumOverShardedDim) {
  ShardFn fn = [](const std::vector<Value>& p) -> std::vector<Value> {
    return {sum(p[0], {0})};
  };
  ExpectError(RunGlobal(fn, M({{"dp", 2}}), {P("dp", None)}, {P()}, {Rand({4, 3}, 1)}),
              {"sum:", "{dp:S0}", "sum_partial(x, dims)"});
}

TEST(WrongTypes, DtypeMismatch) {
  ShardFn fn = [](const std::vector<Value>& p) -> std::vector<Value> { return {p[0] + p[1]}; };
  ExpectError(RunGlobal(fn, M({{"tp", 2}}), {P(), P()}, {P()},
                        {Rand({3}, 1, DType::kF32), Rand({3}, 2, DType::kF64)}),
              {"add:", "dtype mismatch", "f32[3] vs f64[3]", "cast"});
}

// ---- outputs --------------------------------------------------------------------------------

TEST(WrongOutputs, VaryingOutputUnderReplicatedSpec) {
  ExpectError(RunGlobal(Identity(), M({{"tp", 2}}), {P("tp", None)}, {P()}, {Rand({4, 3}, 1)}),
              {"output 0", "{tp:S0}", "P()", "all_gather(output0, 0, \"tp\")"});
}

TEST(WrongOutputs, PendingSumReturnedAsFinishedValue) {
  ShardFn fn = [](const std::vector<Value>& p) -> std::vector<Value> {
    return {p[0].matmul(p[1])};
  };
  ExpectError(RunGlobal(fn, M({{"tp", 2}}), {P(None, "tp"), P("tp", None)}, {P()},
                        {Rand({3, 4}, 1), Rand({4, 5}, 2)}),
              {"output 0", "{tp:P}", "all_reduce(output0, \"tp\")", "Unreduced"});
}

TEST(WrongOutputs, PendingSumUnderShardedSpec) {
  ShardFn fn = [](const std::vector<Value>& p) -> std::vector<Value> {
    return {p[0].matmul(p[1])};
  };
  ExpectError(RunGlobal(fn, M({{"tp", 2}}), {P(None, "tp"), P("tp", None)}, {P("tp", None)},
                        {Rand({4, 4}, 1), Rand({4, 5}, 2)}),
              {"output 0", "{tp:P}", "P(tp,None)", "reduce_scatter(output0, 0, \"tp\")"});
}

// ---- collectives ----------------------------------------------------------------------------

TEST(WrongCollectives, AxisNotInMesh) {
  ShardFn fn = [](const std::vector<Value>& p) -> std::vector<Value> {
    return {all_reduce(p[0].matmul(p[1]), "dp")};
  };
  ExpectError(RunGlobal(fn, M({{"tp", 2}}), {P(None, "tp"), P("tp", None)}, {P()},
                        {Rand({3, 4}, 1), Rand({4, 5}, 2)}),
              {"all_reduce:", "unknown mesh axis 'dp'"});
}

TEST(WrongCollectives, AllGatherOfReplicatedValue) {
  ShardFn fn = [](const std::vector<Value>& p) -> std::vector<Value> {
    return {all_gather(p[0], 0, "tp")};
  };
  ExpectError(RunGlobal(fn, M({{"tp", 2}}), {P()}, {P()}, {Rand({4, 3}, 1)}),
              {"all_gather:", "{tp:R}", "drop the all_gather"});
}

TEST(WrongCollectives, ReduceScatterOfNonPendingValue) {
  ShardFn fn = [](const std::vector<Value>& p) -> std::vector<Value> {
    return {reduce_scatter(p[0], 0, "tp")};
  };
  ExpectError(RunGlobal(fn, M({{"tp", 2}}), {P(None, "tp")}, {P("tp", None)}, {Rand({4, 4}, 1)}),
              {"reduce_scatter:", "{tp:S1}", "reinterpret"});
}

TEST(WrongCollectives, PpermuteBadPermutation) {
  ShardFn fn = [](const std::vector<Value>& p) -> std::vector<Value> {
    // Two sources send to device 1.
    return {ppermute(p[0], "tp", {{0, 1}, {2, 1}})};
  };
  ExpectError(RunGlobal(fn, M({{"tp", 3}}), {P("tp", None)}, {P("tp", None)}, {Rand({3, 2}, 1)}),
              {"ppermute:", "invalid pair (2,1)"});
}

TEST(WrongCollectives, PpermuteIndexOutOfRange) {
  ShardFn fn = [](const std::vector<Value>& p) -> std::vector<Value> {
    return {ppermute(p[0], "tp", {{0, 1}, {1, 5}})};
  };
  ExpectError(RunGlobal(fn, M({{"tp", 2}}), {P("tp", None)}, {P("tp", None)}, {Rand({2, 2}, 1)}),
              {"ppermute:", "invalid pair (1,5)", "2 devices"});
}

// (all_to_all(x, d, d, axes) with split_dim == concat_dim is accepted, as in JAX: it permutes
// chunks and is not a wrong program.)
TEST(WrongCollectives, AllToAllOfReplicatedValue) {
  ShardFn fn = [](const std::vector<Value>& p) -> std::vector<Value> {
    return {all_to_all(p[0], 0, 1, "tp")};
  };
  ExpectError(RunGlobal(fn, M({{"tp", 2}}), {P()}, {P("tp", None)}, {Rand({4, 4}, 1)}),
              {"all_to_all", "{tp:R}"});
}

TEST(WrongCollectives, AllToAllIndivisibleSplitDim) {
  ShardFn fn = [](const std::vector<Value>& p) -> std::vector<Value> {
    return {all_to_all(p[0], 0, 1, "tp")};  // local dim 0 has 3 rows, 2 devices
  };
  ExpectError(RunGlobal(fn, M({{"tp", 2}}), {P(None, "tp")}, {P("tp", None)}, {Rand({3, 4}, 1)}),
              {"all_to_all:", "split dim 0", "size 3", "not divisible"});
}

TEST(WrongCollectives, AllToAllDimOutOfRange) {
  ShardFn fn = [](const std::vector<Value>& p) -> std::vector<Value> {
    return {all_to_all(p[0], 2, 1, "tp")};
  };
  ExpectError(RunGlobal(fn, M({{"tp", 2}}), {P(None, "tp")}, {P(None, "tp")}, {Rand({4, 4}, 1)}),
              {"all_to_all:", "dim 2 out of range"});
}

// ---- per-device failures --------------------------------------------------------------------

TEST(WrongPerDevice, MatmulShapeMismatchNamesTheRank) {
  ShardFn fn = [](const std::vector<Value>& p) -> std::vector<Value> {
    return {p[0].matmul(p[1])};  // [3,4] @ [3,5]: well typed, wrong shapes
  };
  // Both ranks fail; whichever reports first is the one named, with the operands' types. (A
  // sharded contracted dim against a whole one is a type error: see PlantedBugs below.)
  ExpectError(RunGlobal(fn, M({{"tp", 2}}), {P(), P()}, {P()},
                        {Rand({3, 4}, 1), Rand({3, 5}, 2)}),
              {"rank ", "at mesh coordinates (tp=", "matmul:", "f64[3,4]{tp:R} @ f64[3,5]{tp:R}",
               "contracted dims differ"});
}

TEST(WrongPerDevice, ThrowingRankDoesNotHangOthers) {
  ShardFn fn = [](const std::vector<Value>& p) -> std::vector<Value> {
    if (axis_index("tp") == 1) throw std::runtime_error("rank one gave up");
    return {all_reduce(p[0].matmul(p[1]), "tp")};  // the others wait here
  };
  absl::Time start = absl::Now();
  ExpectError(RunGlobal(fn, M({{"tp", 3}}), {P(None, "tp"), P("tp", None)}, {P()},
                        {Rand({3, 6}, 1), Rand({6, 5}, 2)}),
              {"rank one gave up", "rank 1", "tp=1"});
  EXPECT_LT(absl::Now() - start, absl::Seconds(4)) << "peers waited for the timeout";
}

TEST(WrongPerDevice, OutOfRangeEmbeddingId) {
  ShardFn fn = [](const std::vector<Value>& p) -> std::vector<Value> {
    return {embedding(p[0], p[1])};
  };
  Tensor ids = Tensor::FromVector<int64_t>({2}, {1, 7});
  ExpectError(RunGlobal(fn, M({{"tp", 2}}), {P(), P()}, {P()}, {Rand({4, 3}, 1), ids}),
              {"embedding:", "id 7", "out of range", "0 <= id < 4"});
}

TEST(WrongPerDevice, ShardsOfDifferentShapesInLocalView) {
  Mesh mesh = M({{"tp", 2}});
  ShardMap f = shard_map(Identity(), mesh, {P("tp", None)}, {P("tp", None)}, Fast());
  absl::Status s = RunSpmd(mesh, [&](RankContext& ctx) {
    // Rank 0 passes a [2,3] shard, rank 1 a [3,3] one.
    Tensor local = Rand({ctx.rank() == 0 ? 2 : 3, 3}, 1);
    // Each shard alone fits the spec; CallLocal compares them across ranks before fn runs
    // (fn issues no collective, so nothing later would notice).
    (void)f.CallLocal({local});
  }, SpmdOptions{TypeCheck::kOn, Fast().comm});
  ExpectError(s, {"shard_map (local view)", "f64[2,3] on rank 0", "f64[3,3] on rank 1",
                  "Fix: pass each rank its own slice"});
}

TEST(WrongPerDevice, ShardsOfDifferentDtypesInLocalView) {
  Mesh mesh = M({{"dp", 3}});
  ShardMap f = shard_map(Identity(), mesh, {P("dp", None)}, {P("dp", None)}, Fast());
  absl::Status s = RunSpmd(mesh, [&](RankContext& ctx) {
    Tensor local = Rand({2, 3}, 1);
    if (ctx.rank() == 2) local = Cast(local, DType::kF32);  // Rand gives f64
    (void)f.CallLocal({local});
  }, SpmdOptions{TypeCheck::kOn, Fast().comm});
  ExpectError(s, {"shard_map (local view)", "f64[2,3] on rank 0 but f32[2,3] on rank 2"});
}

TEST(WrongGrad, VaryingLossGivenToValueAndGrad) {
  ShardFn fn = [](const std::vector<Value>& p) -> std::vector<Value> {
    return {sum(p[0] * p[0], {1})};  // [4] S0 on dp: V, not a scalar loss over the mesh
  };
  ExpectError(RunGrad(fn, M({{"dp", 2}}), {P("dp", None)}, {P("dp")}, {Rand({4, 3}, 1)}),
              {"value_and_grad:", "{dp:S0}", "varies (V)", "all_reduce(loss, \"dp\""});
}

}  // namespace
}  // namespace shardmap
