// Every op family on the meta device against the same op on the CPU: outputs of the same shape,
// dtype and definedness (on meta), the same OpCounter records, the same MemoryTracker figures,
// the same error messages on bad input, and a clear error for mixed meta/CPU operands.
#include <functional>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tensor/memory_tracker.h"
#include "tensor/op_counter.h"
#include "tensor/ops/attention.h"
#include "tensor/ops/elementwise.h"
#include "tensor/ops/linear.h"
#include "tensor/ops/matmul.h"
#include "tensor/ops/multi_tensor.h"
#include "tensor/ops/nn.h"
#include "tensor/ops/reduce.h"
#include "tensor/ops/routing.h"
#include "tensor/ops/shape_ops.h"
#include "tensor/random.h"
#include "tensor/testing/test_util.h"

namespace shardmap {
namespace {

using testing::RandomTensor;
using Tensors = std::vector<Tensor>;

const Device kCpu = Device::Cpu();
const Device kMeta = Device::Meta();

Tensor R(absl::Span<const int64_t> shape, DType dt, uint32_t seed, Device dev, double lo = -2,
         double hi = 2) {
  return RandomTensor(shape, dt, seed, lo, hi).To(dev);
}
Tensor Ids(absl::Span<const int64_t> shape, std::vector<int64_t> v, Device dev,
           DType dt = DType::kI64) {
  return Tensor::FromVector<int64_t>(shape, v, dt).To(dev);
}

struct Case {
  std::string name;
  std::function<Tensors(Device)> inputs;    // made outside the tracker
  std::function<Tensors(Tensors&)> run;      // the op(s); returns every output
};

struct Observed {
  Tensors outs;
  std::vector<OpCount> ops;
  int64_t live = 0, peak = 0, allocated = 0, allocations = 0;
};

Observed Observe(const Case& c, Device dev) {
  Tensors in = c.inputs(dev);
  Observed o;
  MemoryTracker mem;
  OpCounter counter;
  o.outs = c.run(in);
  o.ops = counter.ops();
  o.live = mem.live_bytes();
  o.peak = mem.peak_bytes();
  o.allocated = mem.allocated_bytes();
  o.allocations = mem.allocations();
  return o;
}

std::vector<Case> AllCases() {
  std::vector<Case> cases;
  auto add = [&](std::string name, std::function<Tensors(Device)> in,
                 std::function<Tensors(Tensors&)> run) {
    cases.push_back({std::move(name), std::move(in), std::move(run)});
  };
  for (DType dt : {DType::kF32, DType::kF64, DType::kBF16}) {
    const std::string t = std::string("_") + DTypeName(dt);
    // elementwise
    add("add" + t, [=](Device d) { return Tensors{R({3, 5}, dt, 1, d), R({3, 5}, dt, 2, d)}; },
        [](Tensors& x) { return Tensors{Add(x[0], x[1])}; });
    add("add_broadcast" + t,
        [=](Device d) { return Tensors{R({4, 1, 5}, dt, 1, d), R({3, 5}, dt, 2, d)}; },
        [](Tensors& x) { return Tensors{Add(x[0], x[1]), Mul(x[1], x[0])}; });
    add("binary" + t, [=](Device d) { return Tensors{R({7}, dt, 1, d), R({1}, dt, 2, d, 1, 2)}; },
        [](Tensors& x) { return Tensors{Sub(x[0], x[1]), Div(x[0], x[1])}; });
    add("unary" + t, [=](Device d) { return Tensors{R({2, 9}, dt, 3, d, 0.5, 2)}; },
        [](Tensors& x) {
          return Tensors{AddScalar(x[0], 1), MulScalar(x[0], 2), Neg(x[0]), Exp(x[0]),
                         Log(x[0]),          Tanh(x[0]),         Relu(x[0]), Sqrt(x[0]),
                         Gelu(x[0]),         Gelu(x[0], GeluApprox::kNone), Silu(x[0])};
        });
    add("grads" + t, [=](Device d) { return Tensors{R({4, 6}, dt, 1, d), R({4, 6}, dt, 2, d)}; },
        [](Tensors& x) {
          return Tensors{ReluGrad(x[0], x[1]), GeluGrad(x[0], x[1]),
                         GeluGrad(x[0], x[1], GeluApprox::kNone), SiluGrad(x[0], x[1]),
                         TanhGrad(x[0], x[1])};
        });
    add("add_in_place" + t,
        [=](Device d) { return Tensors{R({5, 3}, dt, 1, d), R({5, 3}, dt, 2, d)}; },
        [](Tensors& x) {
          AddInPlace(x[0], x[1]);
          return Tensors{x[0]};
        });
    // reductions
    add("reduce" + t, [=](Device d) { return Tensors{R({3, 4, 5}, dt, 1, d)}; },
        [](Tensors& x) {
          return Tensors{Sum(x[0], {1}), Mean(x[0], {0, 2}, true), Max(x[0], {-1}),
                         Min(x[0], {}), ArgMax(x[0], 1), ArgMax(x[0], -1, true),
                         SumToShape(x[0], {4, 1})};
        });
    // matmul and linear
    add("matmul" + t,
        [=](Device d) {
          return Tensors{R({5, 3}, dt, 1, d), R({3, 4}, dt, 2, d), R({2, 5, 3}, dt, 3, d),
                         R({2, 4, 3}, dt, 4, d)};
        },
        [](Tensors& x) {
          return Tensors{Matmul(x[0], x[1]), Matmul(x[0], x[0], true, false),
                         Matmul(x[2], x[1]), Matmul(x[2], x[3], false, true)};
        });
    add("linear" + t,
        [=](Device d) {
          return Tensors{R({2, 3, 4}, dt, 1, d), R({4, 6}, dt, 2, d), R({6}, dt, 3, d)};
        },
        [](Tensors& x) {
          Tensors out;
          for (auto e : {LinearEpilogue::kNone, LinearEpilogue::kBias, LinearEpilogue::kGelu,
                         LinearEpilogue::kBiasGelu}) {
            const bool bias = e == LinearEpilogue::kBias || e == LinearEpilogue::kBiasGelu;
            for (auto a : {GeluApprox::kTanh, GeluApprox::kNone}) {
              LinearResult r = Linear(x[0], x[1], bias ? x[2] : Tensor(), e, a);
              out.push_back(r.y);
              out.push_back(r.pre);
            }
          }
          return out;
        });
    add("linear_backward" + t,
        [=](Device d) {
          return Tensors{R({2, 3, 6}, dt, 1, d), R({4, 6}, dt, 2, d), R({2, 3, 4}, dt, 3, d)};
        },
        [](Tensors& x) {
          LinearGeluGrads g = LinearGeluBackward(x[0], x[1], x[2]);
          LinearGeluGrads g2 = LinearGeluBackward(x[0], x[1], x[2], false, GeluApprox::kNone);
          LinearWeightGrads w = LinearWeightGrad(x[2], x[0]);
          LinearWeightGrads w2 = LinearWeightGrad(x[2], x[0], false);
          return Tensors{g.dpre, g.dbias, g2.dpre, g2.dbias, w.dw, w.db, w2.dw, w2.db,
                         BiasGrad(x[0]), BiasGrad(x[1].Reshape({24}))};
        });
    add("matmul_accumulate" + t,
        [=](Device d) {
          const DType acc = dt == DType::kF64 ? DType::kF64 : DType::kF32;
          return Tensors{R({3, 4}, acc, 1, d), R({5, 3}, dt, 2, d), R({5, 4}, dt, 3, d)};
        },
        [](Tensors& x) {
          MatmulAccumulate(x[0], x[1], x[2], true, false);
          return Tensors{x[0]};
        });
    // nn
    add("softmax" + t, [=](Device d) { return Tensors{R({3, 4, 5}, dt, 1, d), R({3, 4, 5}, dt, 2, d)}; },
        [](Tensors& x) {
          return Tensors{Softmax(x[0], 1), LogSoftmax(x[0], -1), SoftmaxBackward(x[0], x[1], 0),
                         LogSoftmaxBackward(x[0], x[1], 2)};
        });
    add("norms" + t,
        [=](Device d) {
          return Tensors{R({2, 3, 8}, dt, 1, d), R({8}, dt, 2, d), R({8}, dt, 3, d),
                         R({2, 3, 8}, dt, 4, d)};
        },
        [](Tensors& x) {
          LayerNormResult ln = LayerNorm(x[0], x[1], x[2], 1e-5);
          LayerNormResult ln0 = LayerNorm(x[0], Tensor(), Tensor(), 1e-5);
          LayerNormGrads lg = LayerNormBackward(x[0], x[1], ln.mean, ln.rstd, x[3]);
          LayerNormGrads lg0 = LayerNormBackward(x[0], Tensor(), ln0.mean, ln0.rstd, x[3]);
          RmsNormResult rn = RmsNorm(x[0], x[1], 1e-5);
          RmsNormGrads rg = RmsNormBackward(x[0], x[1], rn.rstd, x[3]);
          RmsNormGrads rg0 = RmsNormBackward(x[0], Tensor(), rn.rstd, x[3]);
          return Tensors{ln.y,  ln.mean,   ln.rstd,  ln0.y,  lg.dx,  lg.dgamma, lg.dbeta,
                         lg0.dx, lg0.dgamma, lg0.dbeta, rn.y, rn.rstd, rg.dx,  rg.dgamma,
                         rg0.dx, rg0.dgamma};
        });
    add("embedding" + t,
        [=](Device d) {
          return Tensors{R({10, 4}, dt, 1, d), Ids({2, 3}, {0, 9, 3, 3, 1, 0}, d, DType::kI32),
                         R({2, 3, 4}, dt, 2, d)};
        },
        [](Tensors& x) {
          return Tensors{Embedding(x[0], x[1]), EmbeddingBackward(x[1], x[2], 10)};
        });
    add("cross_entropy" + t,
        [=](Device d) {
          return Tensors{R({4, 7}, dt, 1, d), Ids({4}, {0, 6, -100, 2}, d), R({4}, dt, 2, d)};
        },
        [dt](Tensors& x) {
          Tensor loss = CrossEntropy(x[0], x[1]);
          Tensor dloss = Cast(x[2], loss.dtype());
          return Tensors{loss, CrossEntropyBackward(x[0], x[1], dloss)};
        });
    add("causal" + t, [=](Device d) { return Tensors{R({2, 3, 4, 6}, dt, 1, d)}; },
        [](Tensors& x) {
          return Tensors{CausalMask(x[0]), CausalMask(x[0], 2, -1e4), CausalSoftmax(x[0]),
                         CausalSoftmax(x[0], -1)};
        });
    add("attention" + t,
        [=](Device d) {
          return Tensors{R({2, 3, 2, 4}, dt, 1, d), R({2, 5, 2, 4}, dt, 2, d),
                         R({2, 5, 2, 4}, dt, 3, d), R({2, 3, 2, 4}, dt, 4, d)};
        },
        [](Tensors& x) {
          CausalAttentionResult r = CausalAttention(x[0], x[1], x[2], 0.5, 2);
          CausalAttentionGrads g =
              CausalAttentionBackward(x[0], x[1], x[2], r.out, r.lse, x[3], 0.5, 2);
          return Tensors{r.out, r.lse, g.dq, g.dk, g.dv};
        });
    // routing
    add("routing" + t,
        [=](Device d) {
          return Tensors{R({3, 6}, dt, 1, d), R({3, 2}, dt, 2, d), Ids({4}, {2, -1, 0, 2}, d),
                         R({2, 2, 3}, dt, 3, d)};
        },
        [](Tensors& x) {
          TopKResult tk = TopK(x[0], 2);
          return Tensors{tk.values,
                         tk.indices,
                         TopKBackward(x[1], tk.indices, 6),
                         GatherRows(x[3], x[2]),
                         ScatterAddRows(x[3].Reshape({4, 3}), x[2], 5),
                         LocalIndices(x[2], 1, 2),
                         LocalIndices(x[2], 0, 3, 3)};
        });
    // multi-tensor
    add("multi_tensor" + t,
        [=](Device d) {
          return Tensors{R({3, 4}, dt, 1, d), R({5}, dt, 2, d),
                         R({}, dt == DType::kF64 ? dt : DType::kF32, 3, d, 0.1, 0.9)};
        },
        [](Tensors& x) {
          Tensor ss = SumOfSquares({x[0], x[1]});
          Tensor coef = ClipCoefficient(ss, 1.0);
          ScaleInPlace({x[0], x[1]}, x[2]);
          return Tensors{ss, coef, x[0], x[1]};
        });
    // layout
    add("shape_ops" + t,
        [=](Device d) { return Tensors{R({2, 3, 4}, dt, 1, d), R({2, 2, 4}, dt, 2, d)}; },
        [](Tensors& x) {
          Tensors out{Transpose(x[0], 0, 2), Permute(x[0], {1, 2, 0}), Permute(x[0], {0, 1, 2}),
                      Slice(x[0], 0, 1, 1), Slice(x[0], 1, 1, 2), Concat({x[0], x[1]}, 1),
                      Cast(x[0], DType::kF64), Cast(x[0], DType::kBF16), Cast(x[0], x[0].dtype())};
          for (Tensor& p : Split(x[0], 2, {1, 3})) out.push_back(p);
          for (Tensor& p : Chunk(x[0], 1, 3)) out.push_back(p);
          Tensor whole = x[0].Clone();
          SliceAssign(whole, 1, 1, x[1]);
          out.push_back(whole);
          out.push_back(x[0].Reshape({6, -1}).SliceRows(1, 3));
          return out;
        });
  }
  return cases;
}

// The same sequence of ops on a device, for the whole-step tracker test: a two-layer MLP with
// a cross-entropy loss, forward, backward and an SGD update, in bf16 weights (casts, scratch).
struct StepResult {
  std::vector<OpCount> ops;
  int64_t live = 0, peak = 0, allocated = 0, allocations = 0, peak_after_reset = 0;
  double loss = 0;
};

StepResult MlpStep(Device dev, DType dt) {
  Tensor x = R({8, 16}, dt, 1, dev), w1 = R({16, 32}, dt, 2, dev), b1 = R({32}, dt, 3, dev);
  Tensor w2 = R({32, 10}, dt, 4, dev), gamma = R({32}, dt, 5, dev), beta = R({32}, dt, 6, dev);
  Tensor targets = Ids({8}, {0, 1, 2, 3, 4, 5, 6, 9}, dev);
  StepResult r;
  MemoryTracker mem;
  OpCounter counter;
  {
    LinearResult h = Linear(x, w1, b1, LinearEpilogue::kBiasGelu);
    LayerNormResult ln = LayerNorm(h.y, gamma, beta, 1e-5);
    Tensor logits = Matmul(ln.y, w2);
    Tensor loss = Mean(CrossEntropy(logits, targets), {});
    r.loss = loss.item();  // host read: 0 on meta
    Tensor dloss = Tensor::Full(targets.shape(), 1.0 / 8, loss.dtype(), dev);
    Tensor dlogits = CrossEntropyBackward(logits, targets, dloss);
    Tensor dw2 = Matmul(ln.y, dlogits, true, false);
    Tensor dln = Matmul(dlogits, w2, false, true);
    LayerNormGrads lg = LayerNormBackward(h.y, gamma, ln.mean, ln.rstd, dln);
    mem.ResetPeak();
    LinearGeluGrads hg = LinearGeluBackward(lg.dx, Tensor::Ones({32, 32}, dt, dev), h.pre);
    LinearWeightGrads wg = LinearWeightGrad(x, hg.dpre);
    std::vector<Tensor> grads{dw2, wg.dw, wg.db, lg.dgamma, lg.dbeta};
    Tensor coef = ClipCoefficient(SumOfSquares(grads), 1.0);
    ScaleInPlace(grads, Cast(coef, DType::kF32));
    w1 = Sub(w1, MulScalar(wg.dw, 0.1));
    w2 = Sub(w2, MulScalar(dw2, 0.1));
    r.peak_after_reset = mem.peak_bytes();
  }
  r.ops = counter.ops();
  r.live = mem.live_bytes();
  r.peak = mem.peak_bytes();
  r.allocated = mem.allocated_bytes();
  r.allocations = mem.allocations();
  return r;
}

void ExpectSameOps(const std::vector<OpCount>& cpu, const std::vector<OpCount>& meta) {
  ASSERT_EQ(cpu.size(), meta.size());
  for (size_t i = 0; i < cpu.size(); ++i) {
    SCOPED_TRACE(cpu[i].op);
    EXPECT_EQ(cpu[i].op, meta[i].op);
    EXPECT_EQ(cpu[i].dtype, meta[i].dtype);
    EXPECT_EQ(cpu[i].flops, meta[i].flops);
    EXPECT_EQ(cpu[i].bytes, meta[i].bytes);
    EXPECT_EQ(cpu[i].gemm.has_value(), meta[i].gemm.has_value());
    if (cpu[i].gemm && meta[i].gemm) {
      EXPECT_EQ(cpu[i].gemm->batch, meta[i].gemm->batch);
      EXPECT_EQ(cpu[i].gemm->m, meta[i].gemm->m);
      EXPECT_EQ(cpu[i].gemm->n, meta[i].gemm->n);
      EXPECT_EQ(cpu[i].gemm->k, meta[i].gemm->k);
    }
  }
}

TEST(MetaOps, EveryOpFamilyMatchesTheCpu) {
  for (const Case& c : AllCases()) {
    SCOPED_TRACE(c.name);
    const Observed cpu = Observe(c, kCpu);
    const Observed meta = Observe(c, kMeta);
    ASSERT_EQ(cpu.outs.size(), meta.outs.size());
    for (size_t i = 0; i < cpu.outs.size(); ++i) {
      SCOPED_TRACE(i);
      ASSERT_EQ(cpu.outs[i].defined(), meta.outs[i].defined());
      if (!cpu.outs[i].defined()) continue;
      EXPECT_EQ(cpu.outs[i].ShapeString(), meta.outs[i].ShapeString());
      EXPECT_TRUE(cpu.outs[i].device() == kCpu);
      EXPECT_TRUE(meta.outs[i].is_meta());
    }
    EXPECT_FALSE(cpu.ops.empty());
    ExpectSameOps(cpu.ops, meta.ops);
    EXPECT_EQ(cpu.live, meta.live);
    EXPECT_EQ(cpu.peak, meta.peak);
    EXPECT_EQ(cpu.allocated, meta.allocated);
    EXPECT_EQ(cpu.allocations, meta.allocations);
    EXPECT_GE(cpu.peak, cpu.live);
  }
}

TEST(MetaOps, TrainingStepHasTheCpuMemoryAndOpsExactly) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dt));
    const StepResult cpu = MlpStep(kCpu, dt);
    const StepResult meta = MlpStep(kMeta, dt);
    ExpectSameOps(cpu.ops, meta.ops);
    EXPECT_EQ(cpu.live, meta.live);
    EXPECT_EQ(cpu.peak, meta.peak);
    EXPECT_EQ(cpu.peak_after_reset, meta.peak_after_reset);
    EXPECT_EQ(cpu.allocated, meta.allocated);
    EXPECT_EQ(cpu.allocations, meta.allocations);
    EXPECT_GT(cpu.peak, 0);
    EXPECT_LE(cpu.peak_after_reset, cpu.peak);
    EXPECT_NE(cpu.loss, 0);
    EXPECT_EQ(meta.loss, 0);  // shape-only values read as zero
  }
}

TEST(MetaOps, RandomOnMetaAllocatesOnly) {
  MemoryTracker mem;
  Tensor n = RandomNormal({3, 4}, 7, 0, 1, DType::kBF16, kMeta);
  Tensor u = RandomUniform({5}, 7, 0, 1, DType::kF32, kMeta);
  Tensor i = RandomInts({6}, 10, 7, kMeta);
  EXPECT_EQ(n.ShapeString(), "bf16[3,4]");
  EXPECT_TRUE(n.is_meta() && u.is_meta() && i.is_meta());
  EXPECT_EQ(i.dtype(), DType::kI64);
  EXPECT_EQ(mem.allocated_bytes(), 3 * 4 * 2 + 5 * 4 + 6 * 8);
  // The CPU fill of bf16 draws an f64 block first: scratch, so the same figure.
  MemoryTracker cpu_mem;
  Tensor c = RandomNormal({3, 4}, 7, 0, 1, DType::kBF16, kCpu);
  EXPECT_EQ(cpu_mem.allocated_bytes(), 3 * 4 * 2);
  EXPECT_EQ(cpu_mem.peak_bytes(), 3 * 4 * 2);
  testing::ExpectOpError([] { RandomNormal({2}, 1, 0, 1, DType::kI32, kMeta); },
                         {"random_normal", "not floating"});
}

// Bad input gives the CPU's error, word for word, on meta.
TEST(MetaOps, BadInputGivesTheCpuError) {
  using Bad = std::function<void(Device)>;
  const std::vector<std::pair<std::string, Bad>> bad = {
      {"add_broadcast", [](Device d) { Add(R({2, 3}, DType::kF32, 1, d), R({4}, DType::kF32, 1, d)); }},
      {"add_dtype", [](Device d) { Add(R({2}, DType::kF32, 1, d), R({2}, DType::kF64, 1, d)); }},
      {"add_int", [](Device d) { Add(Ids({1}, {1}, d), Ids({1}, {1}, d)); }},
      {"exp_int", [](Device d) { Exp(Ids({1}, {1}, d)); }},
      {"add_scalar_int", [](Device d) { AddScalar(Ids({1}, {1}, d), 1); }},
      {"relu_grad_shape", [](Device d) { ReluGrad(R({2}, DType::kF32, 1, d), R({3}, DType::kF32, 1, d)); }},
      {"add_in_place_shape", [](Device d) { Tensor a = R({2}, DType::kF32, 1, d); AddInPlace(a, R({3}, DType::kF32, 1, d)); }},
      {"sum_dim_twice", [](Device d) { Sum(R({2, 3}, DType::kF32, 1, d), {1, -1}); }},
      {"max_empty", [](Device d) { Max(R({2, 0}, DType::kF32, 1, d), {1}); }},
      {"argmax_empty", [](Device d) { ArgMax(R({2, 0}, DType::kF32, 1, d), 1); }},
      {"argmax_dim", [](Device d) { ArgMax(R({2, 3}, DType::kF32, 1, d), 2); }},
      {"sum_to_shape", [](Device d) { SumToShape(R({2, 3}, DType::kF32, 1, d), {4}); }},
      {"matmul_inner", [](Device d) { Matmul(R({2, 3}, DType::kF32, 1, d), R({4, 5}, DType::kF32, 1, d)); }},
      {"matmul_rank", [](Device d) { Matmul(R({3}, DType::kF32, 1, d), R({3, 5}, DType::kF32, 1, d)); }},
      {"matmul_batch", [](Device d) { Matmul(R({2, 2, 3}, DType::kF32, 1, d), R({3, 3, 5}, DType::kF32, 1, d)); }},
      {"linear_bias", [](Device d) { Linear(R({2, 3}, DType::kF32, 1, d), R({3, 4}, DType::kF32, 1, d), R({5}, DType::kF32, 1, d), LinearEpilogue::kBias); }},
      {"linear_no_bias", [](Device d) { Linear(R({2, 3}, DType::kF32, 1, d), R({3, 4}, DType::kF32, 1, d), Tensor(), LinearEpilogue::kBiasGelu); }},
      {"linear_gelu_backward", [](Device d) { LinearGeluBackward(R({2, 4}, DType::kF32, 1, d), R({3, 4}, DType::kF32, 1, d), R({2, 5}, DType::kF32, 1, d)); }},
      {"linear_weight_grad", [](Device d) { LinearWeightGrad(R({2, 3}, DType::kF32, 1, d), R({3, 4}, DType::kF32, 1, d)); }},
      {"matmul_accumulate", [](Device d) { Tensor acc = R({2, 4}, DType::kF64, 1, d); MatmulAccumulate(acc, R({2, 3}, DType::kF32, 1, d), R({3, 4}, DType::kF32, 1, d)); }},
      {"bias_grad", [](Device d) { BiasGrad(R({}, DType::kF32, 1, d)); }},
      {"softmax_dim", [](Device d) { Softmax(R({2, 3}, DType::kF32, 1, d), 2); }},
      {"softmax_backward", [](Device d) { SoftmaxBackward(R({2, 3}, DType::kF32, 1, d), R({3, 2}, DType::kF32, 1, d), 0); }},
      {"layer_norm_gamma", [](Device d) { LayerNorm(R({2, 3}, DType::kF32, 1, d), R({4}, DType::kF32, 1, d), Tensor(), 1e-5); }},
      {"layer_norm_stats", [](Device d) { LayerNormBackward(R({2, 3}, DType::kF32, 1, d), Tensor(), R({3}, DType::kF32, 1, d), R({2}, DType::kF32, 1, d), R({2, 3}, DType::kF32, 1, d)); }},
      {"rms_norm_rank", [](Device d) { RmsNorm(R({}, DType::kF32, 1, d), Tensor(), 1e-5); }},
      {"embedding_rank", [](Device d) { Embedding(R({3}, DType::kF32, 1, d), Ids({1}, {0}, d)); }},
      {"embedding_ids", [](Device d) { Embedding(R({3, 2}, DType::kF32, 1, d), R({1}, DType::kF32, 1, d)); }},
      {"embedding_backward", [](Device d) { EmbeddingBackward(Ids({2}, {0, 1}, d), R({2, 3}, DType::kF32, 1, d), -1); }},
      {"cross_entropy", [](Device d) { CrossEntropy(R({2, 3}, DType::kF32, 1, d), Ids({3}, {0, 1, 2}, d)); }},
      {"cross_entropy_backward", [](Device d) { CrossEntropyBackward(R({2, 3}, DType::kF32, 1, d), Ids({2}, {0, 1}, d), R({3}, DType::kF32, 1, d)); }},
      {"causal_mask", [](Device d) { CausalMask(R({3}, DType::kF32, 1, d)); }},
      {"causal_softmax", [](Device d) { CausalSoftmax(Ids({2, 2}, {0, 0, 0, 0}, d)); }},
      {"attention_rank", [](Device d) { Tensor q = R({2, 3, 4}, DType::kF32, 1, d); CausalAttention(q, q, q, 1); }},
      {"attention_scale", [](Device d) { Tensor q = R({1, 2, 1, 4}, DType::kF32, 1, d); CausalAttention(q, q, q, INFINITY); }},
      {"attention_heads", [](Device d) { CausalAttention(R({1, 2, 1, 4}, DType::kF32, 1, d), R({1, 2, 2, 4}, DType::kF32, 1, d), R({1, 2, 2, 4}, DType::kF32, 1, d), 1); }},
      {"attention_lse", [](Device d) { Tensor q = R({1, 2, 1, 4}, DType::kF32, 1, d); CausalAttentionBackward(q, q, q, q, R({1, 1, 2}, DType::kF64, 1, d), q, 1); }},
      {"top_k", [](Device d) { TopK(R({2, 3}, DType::kF32, 1, d), 4); }},
      {"top_k_backward", [](Device d) { TopKBackward(R({2, 3}, DType::kF32, 1, d), Ids({2, 3}, {0, 0, 0, 0, 0, 0}, d), 2); }},
      {"gather_rows", [](Device d) { GatherRows(R({2, 3}, DType::kF32, 1, d), Ids({1, 1}, {0}, d)); }},
      {"scatter_add_rows", [](Device d) { ScatterAddRows(R({2, 3}, DType::kF32, 1, d), Ids({3}, {0, 0, 0}, d), 2); }},
      {"local_indices", [](Device d) { LocalIndices(Ids({2}, {0, 1}, d), 0, -1); }},
      {"sum_of_squares", [](Device d) { SumOfSquares({R({2}, DType::kF32, 1, d), Ids({1}, {0}, d)}); }},
      {"clip_coefficient", [](Device d) { ClipCoefficient(R({}, DType::kF32, 1, d), 0); }},
      {"scale_in_place", [](Device d) { ScaleInPlace({R({2}, DType::kF32, 1, d)}, R({2}, DType::kF32, 1, d)); }},
      {"transpose", [](Device d) { Transpose(R({2, 3}, DType::kF32, 1, d), 0, 2); }},
      {"permute", [](Device d) { Permute(R({2, 3}, DType::kF32, 1, d), {0, 0}); }},
      {"slice", [](Device d) { Slice(R({2, 3}, DType::kF32, 1, d), 1, 2, 2); }},
      {"concat", [](Device d) { Concat({R({2, 3}, DType::kF32, 1, d), R({2, 4}, DType::kF32, 1, d)}, 0); }},
      {"split", [](Device d) { Split(R({2, 3}, DType::kF32, 1, d), 1, {1, 1}); }},
      {"chunk", [](Device d) { Chunk(R({2, 3}, DType::kF32, 1, d), 1, 2); }},
      {"cast", [](Device d) { (void)d; Cast(Tensor(), DType::kF32); }},
      {"slice_assign", [](Device d) { Tensor w = R({2, 3}, DType::kF32, 1, d); SliceAssign(w, 1, 2, R({2, 2}, DType::kF32, 1, d)); }},
      {"reshape", [](Device d) { R({2, 3}, DType::kF32, 1, d).Reshape({4, -1}); }},
      {"item", [](Device d) { R({2, 3}, DType::kF32, 1, d).item(); }},
      {"at", [](Device d) { R({2, 3}, DType::kF32, 1, d).at(6); }},
      {"slice_rows", [](Device d) { R({2, 3}, DType::kF32, 1, d).SliceRows(1, 2); }},
      {"data_dtype", [](Device d) { R({2}, DType::kF32, 1, d).data<double>(); }},
  };
  for (const auto& [name, fn] : bad) {
    SCOPED_TRACE(name);
    const absl::Status cpu = CatchOpError([&] { fn(kCpu); });
    const absl::Status meta = CatchOpError([&] { fn(kMeta); });
    ASSERT_FALSE(cpu.ok()) << "the CPU case must fail";
    EXPECT_EQ(cpu, meta);
  }
}

TEST(MetaOps, MixedMetaAndCpuOperandsAreAnError) {
  const Tensor c = R({2, 3}, DType::kF32, 1, kCpu), m = R({2, 3}, DType::kF32, 1, kMeta);
  const Tensor cg = R({3}, DType::kF32, 1, kCpu), m4 = R({1, 2, 1, 4}, DType::kF32, 1, kMeta);
  const std::vector<std::pair<std::string, std::function<void()>>> mixed = {
      {"add", [&] { Add(c, m); }},
      {"mul", [&] { Mul(m, c); }},
      {"matmul", [&] { Matmul(c, m, false, true); }},
      {"linear", [&] { Linear(m, R({3, 4}, DType::kF32, 1, kCpu), Tensor(), LinearEpilogue::kNone); }},
      {"layer_norm", [&] { LayerNorm(m, cg, Tensor(), 1e-5); }},
      {"add_in_place", [&] { Tensor a = c; AddInPlace(a, m); }},
      {"causal_attention", [&] { CausalAttention(m4, m4.To(kCpu), m4, 1); }},
      {"embedding", [&] { Embedding(m, Ids({1}, {0}, kCpu)); }},
      {"cross_entropy", [&] { CrossEntropy(m, Ids({2}, {0, 1}, kCpu)); }},
      {"concat", [&] { Concat({c, m}, 0); }},
      {"slice_assign", [&] { Tensor w = c; SliceAssign(w, 0, 0, m.SliceRows(0, 1)); }},
      {"sum_of_squares", [&] { SumOfSquares({m, c}); }},
      {"scale_in_place", [&] { ScaleInPlace({m}, Tensor::Scalar(1)); }},
      {"gather_rows", [&] { GatherRows(m, Ids({1}, {0}, kCpu)); }},
  };
  for (const auto& [name, fn] : mixed) {
    SCOPED_TRACE(name);
    const absl::Status s = CatchOpError(fn);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find("meta"), std::string::npos) << s;
    EXPECT_NE(s.message().find("cpu"), std::string::npos) << s;
  }
}

}  // namespace
}  // namespace shardmap
