// A catalogue of wrong programs: each is a small SPMD program run through shard_map (global or
// local view) or value_and_grad that must fail with a Status (never a crash or a hang) whose
// message names the op, the offending type and the fix.
#include <functional>
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
#include "shardmap/einsum.h"
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


// ---- bugs planted in model code, on meshes of size 1 and 2 -------------------------------------
//
// Each case is a model fragment (a GPT block, or a Llama-style block: GQA, SwiGLU)
// with one classic bug, and the same fragment fixed. The types must reject the bug with the same
// cause on an axis of size 1 as on one of size 2 (where the local sizes often hide it, or name
// only shapes), and accept the fix on both. An axis of size 1 is typed exactly as one of size N.

struct Planted {
  const char* name;
  // The program on a mesh whose parallel axis has size n; fixed: the corrected program.
  std::function<absl::Status(int n, bool fixed)> run;
  std::vector<std::string> says;   // in the message on every mesh size
  std::vector<std::string> never;  // e.g. a cast proposed for a mistaken V
};

absl::Status RunFn(const ShardFn& fn, const Mesh& mesh, std::vector<PartitionSpec> in_specs,
                   std::vector<PartitionSpec> out_specs, const std::vector<Tensor>& inputs) {
  try {
    ShardMap f = shard_map(fn, mesh, std::move(in_specs), std::move(out_specs), Fast());
    return f(inputs).status();
  } catch (const OpError& e) {
    return e.status();
  }
}

// Sequence parallelism: x [b, s, h] sharded over tp along s; the MLP's column-parallel matmul
// needs the whole sequence. GPT: gelu; Llama: SwiGLU (silu(x w1) * (x w3)).
absl::Status SequenceParallelMlp(int n, bool fixed, bool swiglu) {
  ShardFn fn = [fixed, swiglu](const std::vector<Value>& in) -> std::vector<Value> {
    Value x = fixed ? all_gather(in[0], 1, "tp") : in[0];  // the forgotten all_gather
    Value h = swiglu ? silu(x.matmul(in[1])) * x.matmul(in[3]) : gelu(x.matmul(in[1]));
    return {reduce_scatter(h.matmul(in[2]), 1, "tp")};
  };
  return RunFn(fn, M({{"tp", n}}),
               {P(None, "tp", None), P(None, "tp"), P("tp", None), P(None, "tp")},
               {P(None, "tp", None)},
               {Rand({2, 4, 6}, 1), Rand({6, 8}, 2), Rand({8, 6}, 3), Rand({6, 8}, 4)});
}

// GQA: q [b, s, H, d] and k [b, t, KV, d] with heads sharded over tp; q's heads grouped as
// [kv, rep] keep the shard on the kv dim (matching k's), [rep, kv] put it on rep.
absl::Status GqaScores(int n, bool fixed) {
  const int64_t kv = 2, rep = 2;
  ShardFn fn = [=](const std::vector<Value>& in) -> std::vector<Value> {
    const Value& q = in[0];
    const int64_t kv_local = q.dim(2) / rep;
    Value q5 = fixed ? q.reshape({q.dim(0), q.dim(1), kv_local, rep, q.dim(3)})
                     : q.reshape({q.dim(0), q.dim(1), rep, kv_local, q.dim(3)});
    Value s = fixed ? einsum("bskrd,btkd->bkrst", q5, in[1])
                    : einsum("bsrkd,btkd->bkrst", q5, in[1]);
    return {s};
  };
  return RunFn(fn, M({{"tp", n}}), {P(None, None, "tp", None), P(None, None, "tp", None)},
               {P(None, "tp")}, {Rand({1, 3, kv * rep, 4}, 5), Rand({1, 3, kv, 4}, 6)});
}

// FSDP: the weight (and the embedding table) stored in shards over dp, gathered before use.
absl::Status FsdpMatmul(int n, bool fixed) {
  ShardFn fn = [fixed](const std::vector<Value>& in) -> std::vector<Value> {
    Value w = fixed ? all_gather(in[1], 0, "dp") : in[1];
    Value y = in[0].matmul(w);
    return {all_reduce(sum_partial(y * y, {}), "dp")};
  };
  return RunFn(fn, M({{"dp", n}}), {P("dp", None), P("dp", None)}, {P()},
               {Rand({4, 6}, 7), Rand({6, 4}, 8)});
}

absl::Status FsdpEmbedding(int n, bool fixed) {
  ShardFn fn = [fixed](const std::vector<Value>& in) -> std::vector<Value> {
    Value table = fixed ? all_gather(in[0], 0, "dp") : in[0];
    return {embedding(table, in[1])};
  };
  Tensor ids = Tensor::FromVector<int64_t>({4}, {0, 3, 5, 2});
  return RunFn(fn, M({{"dp", n}}), {P("dp", None), P("dp")}, {P("dp", None)},
               {Rand({6, 4}, 9), ids});
}

// A V whose layout a reshape lost, later all-reduced: the message names the reshape as the
// origin and proposes no cast (reinterpret would sum values that are no addends of one total).
// Fixed: the sharded dim moved outermost first, so the flat vector stays S0 and is gathered.
absl::Status LostLayoutThenAllReduce(int n, bool fixed) {
  ShardFn fn = [fixed](const std::vector<Value>& in) -> std::vector<Value> {
    const Value& x = in[0];  // [4, 6] sharded over tp along dim 1
    if (fixed) return {all_gather(x.transpose(0, 1).reshape({-1}), 0, "tp")};  // S0 kept
    return {all_reduce(x.reshape({-1}), "tp")};
  };
  return RunFn(fn, M({{"tp", n}}), {P(None, "tp")}, {P()}, {Rand({4, 6}, 12)});
}

std::vector<Planted> Catalogue() {
  const std::vector<std::string> no_cast = {"reinterpret", "convert("};
  return {
      {"gpt_sp_forgotten_all_gather",
       [](int n, bool f) { return SequenceParallelMlp(n, f, false); },
       {"matmul: a's dim 1 ('m') is sharded and b's dim 1 ('n') is sharded over 'tp'",
        "a=f64[2,", "{tp:S1}", "all_gather one operand over 'tp' first", "as_varying"},
       no_cast},
      {"llama_swiglu_sp_forgotten_all_gather",
       [](int n, bool f) { return SequenceParallelMlp(n, f, true); },
       {"matmul: a's dim 1 ('m') is sharded and b's dim 1 ('n') is sharded over 'tp'",
        "sequence parallelism"},
       no_cast},
      {"llama_gqa_heads_grouped_rep_kv", GqaScores,
       {"einsum(\"bsrkd,btkd->bkrst\")", "a's dim 2 ('r') is sharded and b's dim 2 ('k') is "
        "sharded over 'tp'", "[kv, rep], not [rep, kv]"},
       no_cast},
      {"fsdp_weight_used_without_gather", FsdpMatmul,
       {"matmul: a's dim 0 ('m') is sharded and b's dim 0 ('k') is sharded over 'dp'",
        "b's sharded dim is contracted", "FSDP: the weight"},
       no_cast},
      {"fsdp_embedding_table_without_gather", FsdpEmbedding,
       {"embedding: the table's rows are sharded (S0) but the ids vary",
        "all_gather(table, 0, axis) before the lookup", "table=f64[", "{dp:S0}"},
       {}},
      {"reshape_lost_the_layout_then_all_reduce", LostLayoutThenAllReduce,
       {"all_reduce(sum): takes a partial sum (P), but x is V",
        "x is V (layout unknown) on 'tp' since reshape to f64[", "Fix: at reshape",
        "Do not cast the V away"},
       {"say so with reinterpret"}},
  };
}

TEST(PlantedBugs, SameVerdictOnAxesOfSizeOneAndTwoAndTheFixIsAccepted) {
  for (const Planted& c : Catalogue()) {
    for (int n : {1, 2}) {
      SCOPED_TRACE(absl::StrCat(c.name, " on an axis of size ", n));
      const absl::Status bad = c.run(n, false);
      ASSERT_FALSE(bad.ok()) << "the planted bug was accepted";
      EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument) << bad;
      const std::string msg(bad.message());
      for (const std::string& s : c.says) {
        EXPECT_NE(msg.find(s), std::string::npos) << "missing \"" << s << "\" in: " << msg;
      }
      for (const std::string& s : c.never) {
        EXPECT_EQ(msg.find(s), std::string::npos) << "proposes \"" << s << "\": " << msg;
      }
      const absl::Status good = c.run(n, true);
      EXPECT_TRUE(good.ok()) << "the fixed program was refused: " << good;
    }
  }
}

// The opt-in: blocks of per-device products (ring attention's scores against a rotating K
// block) declared with as_varying are accepted, and the V they give is combined as meant.
TEST(PlantedBugs, AsVaryingDeclaresIntendedBlocks) {
  for (int n : {1, 2}) {
    ShardFn fn = [](const std::vector<Value>& in) -> std::vector<Value> {
      Value s = einsum("sd,td->st", as_varying(in[0], "cp"), in[1]);
      return {all_reduce(sum_partial(s, {}), "cp")};
    };
    const absl::Status declared =
        RunFn(fn, M({{"cp", n}}), {P("cp", None), P("cp", None)}, {P()},
              {Rand({4, 3}, 13), Rand({4, 3}, 14)});
    EXPECT_TRUE(declared.ok()) << "n=" << n << ": " << declared;
    ShardFn undeclared = [](const std::vector<Value>& in) -> std::vector<Value> {
      return {all_reduce(sum_partial(einsum("sd,td->st", in[0], in[1]), {}), "cp")};
    };
    ExpectError(RunFn(undeclared, M({{"cp", n}}), {P("cp", None), P("cp", None)}, {P()},
                      {Rand({4, 3}, 13), Rand({4, 3}, 14)}),
                {"a's dim 0 ('s') is sharded and b's dim 0 ('t') is sharded over 'cp'",
                 "as_varying(x, \"cp\")"});
  }
}

// Shape errors carry the operands' SPMD types (and a V's origin).
TEST(PlantedBugs, ShapeErrorsNameTheTypes) {
  ShardFn fn = [](const std::vector<Value>& in) -> std::vector<Value> {
    return {in[0] + in[1]};  // [4, 6] + [5]: no broadcast
  };
  ExpectError(RunFn(fn, M({{"tp", 2}}), {P(), P()}, {P()}, {Rand({4, 6}, 15), Rand({5}, 16)}),
              {"SPMD types (add): a=f64[4,6]{tp:R}, b=f64[5]{tp:R}"});
}

}  // namespace
}  // namespace shardmap
