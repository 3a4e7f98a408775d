// The ring (collective-matmul) SP layers against the plain SP layers of gpt_layers.h: outputs
// and the gradients of every input in f64 to 1e-12, at tp = 1, 2, 3, 4 (and dp x tp) with odd
// sizes, in checked and erased mode; the collective log shows the rings; bad uses fail clearly.
#include "models/parallel/async_tp.h"

#include <functional>
#include <string>
#include <vector>

#include "autograd/value_and_grad.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/parallel/layers.h"
#include "shardmap/collective_ops.h"
#include "shardmap/context.h"
#include "shardmap/ops.h"
#include "shardmap/shard_map.h"
#include "spmd_testing/collectives.h"
#include "tests/test_util.h"

namespace shardmap {
namespace {

using ::testing::HasSubstr;
using testing::Rand;

// Odd sizes: 3 rows per device, d = 5, 7 hidden columns per device.
constexpr int64_t kRowsPerDevice = 3, kD = 5, kHiddenPerDevice = 7;

// fn(inputs, ring) -> the layer's output; the loss is the sum of its squares (a P share).
using Layer = std::function<Value(const std::vector<Value>&, bool ring)>;

struct Case {
  std::string name;
  Layer layer;
  std::vector<Tensor> inputs;
  std::vector<PartitionSpec> in_specs;
  PartitionSpec out_spec;
  int ppermutes_per_step;  // ring transfers per tp step, forward (and backward)
  int64_t bytes;           // each transfer's bytes
};

void ExpectRingMatchesPlain(const Case& c, const Mesh& mesh, TypeCheck check) {
  SCOPED_TRACE(absl::StrCat(c.name, " on ", mesh.ShortString(),
                            check == TypeCheck::kOn ? "" : " (erased)"));
  auto program = [&](bool ring) {
    return [&c, ring](const std::vector<Value>& p) -> std::vector<Value> {
      Value y = c.layer(p, ring);
      return {sum_partial(y * y, {}), y};
    };
  };
  std::vector<PartitionSpec> outs = {P().Unreduced({"dp", "tp"}), c.out_spec};
  if (mesh.AxisIndex("dp") < 0) outs[0] = P().Unreduced({"tp"});
  std::vector<CollectiveRecord> log;
  ShardMapOptions o;
  o.check = check;
  o.collective_log = &log;
  auto got = value_and_grad(shard_map(program(true), mesh, c.in_specs, outs, o))(c.inputs);
  ASSERT_TRUE(got.ok()) << got.status();
  o.collective_log = nullptr;
  auto want = value_and_grad(shard_map(program(false), mesh, c.in_specs, outs, o))(c.inputs);
  ASSERT_TRUE(want.ok()) << want.status();
  for (int k = 0; k < 2; ++k) EXPECT_TENSOR_NEAR(got->outputs[k], want->outputs[k], 1e-12);
  for (size_t k = 0; k < c.inputs.size(); ++k) {
    EXPECT_TENSOR_NEAR(got->grads[k], want->grads[k], 1e-12) << "input " << k;
  }
  const int n = mesh.axis_size(mesh.AxisIndex("tp"));
  if (n == 1) {
    spmd_testing::ExpectCollectives(mesh, log, {}, {});
  } else {
    const int rings = c.ppermutes_per_step * (n - 1);
    spmd_testing::ExpectCollectives(mesh, log, {spmd_testing::Ppermute("tp", rings).Bytes(c.bytes)},
                                    {spmd_testing::Ppermute("tp", rings).Bytes(c.bytes)});
  }
}

std::vector<Case> Cases(int tp, int dp) {
  const int64_t rows = kRowsPerDevice * tp * dp, hidden = kHiddenPerDevice * tp;
  const PartitionSpec rows_spec = dp > 1 ? P({"dp", "tp"}) : P("tp");
  const TensorParallel par{"tp", /*sp=*/true};
  const int64_t block_bytes = kRowsPerDevice * kD * 8;
  std::vector<Case> cases;
  cases.push_back({"column", [par](const std::vector<Value>& p, bool ring) {
                     return ring ? RingColumnParallelLinear{p[1], p[2], par}(p[0])
                                 : ColumnParallelLinear{p[1], p[2], par}(p[0]);
                   },
                   {Rand({rows, kD}, 1), Rand({kD, hidden}, 2), Rand({hidden}, 3)},
                   {rows_spec, P(None, "tp"), P("tp")},
                   dp > 1 ? P("dp", "tp") : P(None, "tp"), 1, block_bytes});
  cases.push_back({"row", [par](const std::vector<Value>& p, bool ring) {
                     return ring ? RingRowParallelLinear{p[1], p[2], par}(p[0])
                                 : RowParallelLinear{p[1], p[2], par}(p[0]);
                   },
                   {Rand({rows, hidden}, 4), Rand({hidden, kD}, 5), Rand({kD}, 6)},
                   {dp > 1 ? P("dp", "tp") : P(None, "tp"), P("tp", None), P()},
                   rows_spec, 1, block_bytes});
  cases.push_back({"mlp", [par](const std::vector<Value>& p, bool ring) {
                     if (ring) {
                       return RingMlp{RingColumnParallelLinear{p[1], p[2], par},
                                      RingRowParallelLinear{p[3], p[4], par}}(p[0]);
                     }
                     return Mlp{ColumnParallelLinear{p[1], p[2], par},
                                RowParallelLinear{p[3], p[4], par}}(p[0]);
                   },
                   {Rand({rows, kD}, 7), Rand({kD, hidden}, 8), Rand({hidden}, 9),
                    Rand({hidden, kD}, 10), Rand({kD}, 11)},
                   {rows_spec, P(None, "tp"), P("tp"), P("tp", None), P()},
                   rows_spec, 2, block_bytes});
  return cases;
}

TEST(AsyncTpTest, RingLayersMatchThePlainSpLayers) {
  for (int tp : {1, 2, 3, 4}) {
    Mesh mesh = *Mesh::Create({{"tp", tp}});
    for (const Case& c : Cases(tp, 1)) ExpectRingMatchesPlain(c, mesh, TypeCheck::kOn);
  }
}

TEST(AsyncTpTest, RingLayersMatchOnDpTimesTpAndErased) {
  Mesh mesh = *Mesh::Create({{"dp", 2}, {"tp", 3}});
  for (const Case& c : Cases(3, 2)) {
    ExpectRingMatchesPlain(c, mesh, TypeCheck::kOn);
    ExpectRingMatchesPlain(c, mesh, TypeCheck::kErased);
  }
}

TEST(AsyncTpTest, BadUsesFailClearly) {
  Mesh mesh = *Mesh::Create({{"tp", 2}});
  auto run = [&](std::function<void(const Value& w, const Value& b)> body) {
    return RunSpmd(mesh, [&](RankContext&) {
      body(Value::Replicated(Tensor::Ones({4, 3}, DType::kF64)),
           Value::Replicated(Tensor::Ones({3}, DType::kF64)));
    });
  };
  absl::Status no_sp = run([](const Value& w, const Value& b) {
    (void)RingColumnParallelLinear{w, b, {"tp", false}}(Value::Replicated(Tensor::Ones({2, 4})));
  });
  EXPECT_THAT(no_sp.message(), HasSubstr("set tp.sp")) << no_sp;
  absl::Status odd_rows = run([](const Value& w, const Value& b) {
    (void)RingRowParallelLinear{w, b, {"tp", true}}(
        vary(Value::Replicated(Tensor::Ones({3, 4}, DType::kF64)), "tp"));
  });
  EXPECT_THAT(odd_rows.message(), HasSubstr("multiple of the tp size")) << odd_rows;
  absl::Status blocks = run([](const Value& w, const Value& b) {
    (void)RingRowParallelLinear{w, b, {"tp", true}}(
        std::vector<Value>{Value::Replicated(Tensor::Ones({1, 4}, DType::kF64))});
  });
  EXPECT_THAT(blocks.message(), HasSubstr("1 row blocks for 2 devices")) << blocks;
}

}  // namespace
}  // namespace shardmap
