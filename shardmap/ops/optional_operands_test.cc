// Optional operands: the ops that document an operand as optional (layer_norm's gamma and beta,
// rms_norm's gamma) accept an undefined Value for it on any mesh, in checked and erased mode,
// forward and backward; a left-out operand is never mistaken for a value of another mesh. Ops
// whose operands are required name the undefined operand instead.
//
// References: a naive per-row normalisation (forward), f64 central differences and the same
// function on one device (gradients).
#include <cmath>
#include <string>
#include <vector>

#include "autograd/value_and_grad.h"
#include "gtest/gtest.h"
#include "shardmap/ops/collective_ops.h"
#include "shardmap/ops/einsum.h"
#include "shardmap/ops/nn_ops.h"
#include "shardmap/ops/ops.h"
#include "shardmap/ops/routing_ops.h"
#include "shardmap/shard_map.h"
#include "spmd_testing/testing.h"
#include "tensor/random.h"

namespace shardmap {
namespace {

enum class Norm { kLayer, kRms };

struct NormCase {
  Norm norm;
  bool gamma;
  bool beta;  // layer_norm only
  TypeCheck check;

  std::string Name() const {
    return absl::StrCat(norm == Norm::kLayer ? "layer_norm" : "rms_norm", "(x, ",
                        gamma ? "gamma" : "Value()",
                        norm == Norm::kLayer ? (beta ? ", beta" : ", Value()") : "", ") ",
                        check == TypeCheck::kOn ? "checked" : "erased");
  }
};

std::vector<NormCase> AllCases() {
  std::vector<NormCase> cases;
  for (TypeCheck check : {TypeCheck::kOn, TypeCheck::kErased}) {
    for (bool g : {false, true}) {
      for (bool b : {false, true}) cases.push_back({Norm::kLayer, g, b, check});
      cases.push_back({Norm::kRms, g, false, check});
    }
  }
  return cases;
}

constexpr double kLayerEps = 1e-5, kRmsEps = 1e-6;

// Inputs: x and the loss weights w (rows sharded over dp), then gamma and beta when present (R).
// Outputs: the loss sum(norm(x) * w) and norm(x).
spmd_testing::ShardMapFactory NormFactory(const NormCase& c) {
  return [c](const Mesh& mesh) {
    ShardFn fn = [c](const std::vector<Value>& in) -> std::vector<Value> {
      size_t k = 2;
      const Value gamma = c.gamma ? in[k++] : Value();
      const Value beta = c.beta ? in[k++] : Value();
      Value y = c.norm == Norm::kLayer ? layer_norm(in[0], gamma, beta, kLayerEps)
                                       : rms_norm(in[0], gamma, kRmsEps);
      return {all_reduce(sum_partial(y * in[1], {}), "dp"), y};
    };
    std::vector<PartitionSpec> in_specs = {P("dp", None), P("dp", None)};
    if (c.gamma) in_specs.push_back(P());
    if (c.beta) in_specs.push_back(P());
    ShardMapOptions o;
    o.check = c.check;
    return shard_map(fn, mesh, in_specs, {P(), P("dp", None)}, o);
  };
}

std::vector<Tensor> NormInputs(const NormCase& c, int64_t rows, int64_t hidden) {
  std::vector<Tensor> in = {RandomNormal({rows, hidden}, 11, 0.5, 2.0, DType::kF64),
                            RandomNormal({rows, hidden}, 12, 0.0, 1.0, DType::kF64)};
  if (c.gamma) in.push_back(RandomNormal({hidden}, 13, 1.0, 0.5, DType::kF64));
  if (c.beta) in.push_back(RandomNormal({hidden}, 14, 0.0, 0.5, DType::kF64));
  return in;
}

// The normalisation by loops, on whole tensors.
Tensor NaiveNorm(const NormCase& c, const std::vector<Tensor>& in) {
  const Tensor& x = in[0];
  const int64_t rows = x.dim(0), h = x.dim(1);
  size_t k = 2;
  const Tensor gamma = c.gamma ? in[k++] : Tensor();
  const Tensor beta = c.beta ? in[k++] : Tensor();
  std::vector<double> y(rows * h);
  for (int64_t r = 0; r < rows; ++r) {
    double mean = 0, sq = 0;
    for (int64_t j = 0; j < h; ++j) mean += x.at(r * h + j);
    mean /= h;
    if (c.norm == Norm::kRms) mean = 0;
    for (int64_t j = 0; j < h; ++j) sq += (x.at(r * h + j) - mean) * (x.at(r * h + j) - mean);
    const double rstd = 1.0 / std::sqrt(sq / h + (c.norm == Norm::kLayer ? kLayerEps : kRmsEps));
    for (int64_t j = 0; j < h; ++j) {
      double v = (x.at(r * h + j) - mean) * rstd;
      if (gamma.defined()) v *= gamma.at(j);
      if (beta.defined()) v += beta.at(j);
      y[r * h + j] = v;
    }
  }
  return Tensor::FromVector<double>({rows, h}, y);
}

TEST(OptionalOperands, NormsWithAndWithoutWeightsMatchNaiveLoops) {
  for (const NormCase& c : AllCases()) {
    SCOPED_TRACE(c.Name());
    const std::vector<Tensor> in = NormInputs(c, 6, 5);
    absl::StatusOr<std::vector<Tensor>> out = NormFactory(c)(*Mesh::Create({{"dp", 3}}))(in);
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_TENSOR_NEAR((*out)[1], NaiveNorm(c, in), 1e-12);
  }
}

TEST(OptionalOperands, NormsShardedMatchOneDeviceWithGradients) {
  for (const NormCase& c : AllCases()) {
    SCOPED_TRACE(c.Name());
    EXPECT_TRUE(spmd_testing::ShardedMatchesOneDevice(NormFactory(c),
                                                 {{{"dp", 3}}, {{"dp", 2}, {"tp", 3}}},
                                                 NormInputs(c, 6, 5)));
  }
}

TEST(OptionalOperands, NormGradientsMatchFiniteDifferences) {
  for (const NormCase& c : AllCases()) {
    SCOPED_TRACE(c.Name());
    EXPECT_TRUE(spmd_testing::GradientsMatchFiniteDifferences(
        NormFactory(c)(*Mesh::Create({{"dp", 3}})), NormInputs(c, 6, 5)));
  }
}

// The gradients of present weights are those of the same norm with the absent ones made
// explicit (gamma = 1, beta = 0): leaving a weight out changes nothing else.
TEST(OptionalOperands, AbsentWeightsEqualIdentityWeights) {
  const Mesh mesh = *Mesh::Create({{"dp", 2}, {"tp", 3}});
  for (TypeCheck check : {TypeCheck::kOn, TypeCheck::kErased}) {
    const NormCase bare{Norm::kLayer, false, false, check};
    const NormCase full{Norm::kLayer, true, true, check};
    std::vector<Tensor> in = NormInputs(bare, 4, 7);
    std::vector<Tensor> explicit_in = in;
    explicit_in.push_back(Tensor::Ones({7}, DType::kF64));
    explicit_in.push_back(Tensor::Zeros({7}, DType::kF64));
    absl::StatusOr<ShardMapGrads> a = value_and_grad(NormFactory(bare)(mesh))(in);
    absl::StatusOr<ShardMapGrads> b = value_and_grad(NormFactory(full)(mesh))(explicit_in);
    ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
    EXPECT_TENSOR_NEAR(a->outputs[1], b->outputs[1], 1e-14);
    EXPECT_TENSOR_NEAR(a->grads[0], b->grads[0], 1e-13);
    EXPECT_TENSOR_NEAR(a->grads[1], b->grads[1], 1e-13);
  }
}

// A defined weight of another mesh is still refused as foreign (the check is skipped only for
// an absent operand).
TEST(OptionalOperands, DefinedWeightOfAnotherMeshIsStillRefused) {
  const Mesh mesh = *Mesh::Create({{"dp", 2}});
  for (TypeCheck check : {TypeCheck::kOn, TypeCheck::kErased}) {
    for (Norm norm : {Norm::kLayer, Norm::kRms}) {
      ShardFn fn = [norm](const std::vector<Value>& in) -> std::vector<Value> {
        const Value foreign(Tensor::Ones({5}, DType::kF64), SpmdType(2));  // two axes, not one
        return {norm == Norm::kLayer ? layer_norm(in[0], Value(), foreign)
                                     : rms_norm(in[0], foreign)};
      };
      ShardMapOptions o;
      o.check = check;
      ShardMap f = shard_map(fn, mesh, {P("dp", None)}, {P("dp", None)}, o);
      EXPECT_TRUE(spmd_testing::RejectedWith(
          [&] { return f({RandomNormal({4, 5}, 1, 0, 1, DType::kF64)}); },
          {norm == Norm::kLayer ? "layer_norm" : "rms_norm", "another mesh"}));
    }
  }
}

// Required operands left undefined: the op names itself and says the Value is undefined (not
// "another mesh"), in both modes, on a mesh with axes and on one without.
TEST(OptionalOperands, UndefinedRequiredOperandsAreNamedAsUndefined) {
  struct Case {
    const char* op;
    std::function<Value(const Value& x)> call;
  };
  const std::vector<Case> cases = {
      {"layer_norm", [](const Value&) { return layer_norm(Value(), Value(), Value()); }},
      {"rms_norm", [](const Value&) { return rms_norm(Value(), Value()); }},
      {"add", [](const Value& x) { return x + Value(); }},
      {"mul", [](const Value& x) { return Value() * x; }},
      {"gelu", [](const Value&) { return gelu(Value()); }},
      {"matmul", [](const Value& x) { return matmul(x, Value()); }},
      {"sum", [](const Value&) { return sum(Value(), {}); }},
      {"reshape", [](const Value&) { return reshape(Value(), {1}); }},
      {"einsum", [](const Value& x) { return einsum("ij,jk->ik", x, Value()); }},
      {"einsum", [](const Value&) { return einsum("ij->ji", Value()); }},
      {"softmax", [](const Value&) { return softmax(Value(), -1); }},
      {"embedding", [](const Value& x) { return embedding(Value(), x); }},
      {"gather_rows", [](const Value& x) { return gather_rows(x, Value()); }},
      {"all_reduce", [](const Value&) { return all_reduce(Value(), "dp"); }},
      {"all_gather", [](const Value&) { return all_gather(Value(), 0, "dp"); }},
      {"reduce_scatter", [](const Value&) { return reduce_scatter(Value(), 0, "dp"); }},
      {"ppermute", [](const Value&) { return ppermute(Value(), "dp", {{0, 1}, {1, 0}}); }},
      {"vary", [](const Value&) { return vary(Value(), "dp"); }},
  };
  for (const std::vector<std::pair<std::string, int>>& axes :
       std::vector<std::vector<std::pair<std::string, int>>>{{{"dp", 2}}, {{"dp", 1}}}) {
    const Mesh mesh = *Mesh::Create(axes);
    for (TypeCheck check : {TypeCheck::kOn, TypeCheck::kErased}) {
      for (const Case& c : cases) {
        SCOPED_TRACE(absl::StrCat(c.op, " on ", mesh.ShortString(),
                                  check == TypeCheck::kOn ? " checked" : " erased"));
        ShardFn fn = [&c](const std::vector<Value>& in) -> std::vector<Value> {
          return {c.call(in[0])};
        };
        ShardMapOptions o;
        o.check = check;
        ShardMap f = shard_map(fn, mesh, {P()}, {P()}, o);
        const absl::Status s = f({Tensor::Ones({2, 2}, DType::kF64)}).status();
        EXPECT_TRUE(spmd_testing::RejectedWith([&] { return s; }, {c.op, "undefined Value"}));
        EXPECT_EQ(std::string(s.message()).find("another mesh"), std::string::npos) << s;
      }
    }
  }
}

}  // namespace
}  // namespace shardmap
