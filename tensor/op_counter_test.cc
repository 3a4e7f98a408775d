// OpCounter: each op family's FLOPs and bytes against hand-computed values (op_counter.h's
// formulas), nesting, the outermost-op rule, and per-thread counting.
#include "tensor/op_counter.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensor/error.h"
#include "tensor/ops/attention.h"
#include "tensor/ops/elementwise.h"
#include "tensor/ops/linear.h"
#include "tensor/ops/matmul.h"
#include "tensor/ops/multi_tensor.h"
#include "tensor/ops/nn.h"
#include "tensor/ops/reduce.h"
#include "tensor/ops/routing.h"
#include "tensor/ops/shape_ops.h"

namespace shardmap {
namespace {

const Device kMeta = Device::Meta();

Tensor M(absl::Span<const int64_t> shape, DType dt = DType::kF32) {
  return Tensor::Empty(shape, dt, kMeta);
}

// The one op recorded by fn, on meta and on the CPU (which must agree).
OpCount Only(const std::function<void(Device)>& fn) {
  std::vector<OpCount> meta, cpu;
  {
    OpCounter c;
    fn(kMeta);
    meta = c.ops();
  }
  {
    OpCounter c;
    fn(Device::Cpu());
    cpu = c.ops();
  }
  EXPECT_EQ(meta.size(), 1u);
  EXPECT_EQ(cpu.size(), 1u);
  if (meta.size() != 1 || cpu.size() != 1) return {};
  EXPECT_EQ(meta[0].op, cpu[0].op);
  EXPECT_EQ(meta[0].flops, cpu[0].flops);
  EXPECT_EQ(meta[0].bytes, cpu[0].bytes);
  return meta[0];
}

Tensor Z(absl::Span<const int64_t> shape, Device d, DType dt = DType::kF32) {
  return Tensor::Zeros(shape, dt, d);
}

TEST(OpCounter, MatmulIsTwoBMNK) {
  const OpCount c = Only([](Device d) { Matmul(Z({8, 64}, d), Z({64, 32}, d)); });
  EXPECT_EQ(c.op, "matmul");
  EXPECT_EQ(c.flops, 2.0 * 8 * 32 * 64);
  EXPECT_EQ(c.bytes, (8 * 64 + 64 * 32 + 8 * 32) * 4.0);
  ASSERT_TRUE(c.gemm.has_value());
  EXPECT_EQ(c.gemm->batch, 1);
  EXPECT_EQ(c.gemm->m, 8);
  EXPECT_EQ(c.gemm->n, 32);
  EXPECT_EQ(c.gemm->k, 64);

  // Batched, transposed rhs, bf16 (2-byte operands): [3,5,7] @ [3,4,7]^T.
  const OpCount b = Only([](Device d) {
    Matmul(Z({3, 5, 7}, d, DType::kBF16), Z({3, 4, 7}, d, DType::kBF16), false, true);
  });
  EXPECT_EQ(b.flops, 2.0 * 3 * 5 * 4 * 7);
  EXPECT_EQ(b.bytes, (3 * 5 * 7 + 3 * 4 * 7 + 3 * 5 * 4) * 2.0);
  EXPECT_EQ(b.gemm->batch, 3);
  EXPECT_TRUE(b.gemm->trans_b);
  EXPECT_EQ(b.dtype, DType::kBF16);

  // Leading dims of the lhs fold into rows: [2,3,4] @ [4,5] is one 6x5x4 GEMM.
  const OpCount f = Only([](Device d) { Matmul(Z({2, 3, 4}, d), Z({4, 5}, d)); });
  EXPECT_EQ(f.gemm->batch, 1);
  EXPECT_EQ(f.gemm->m, 6);
  EXPECT_EQ(f.flops, 2.0 * 6 * 5 * 4);
}

TEST(OpCounter, LinearCountsItsGemmAndEpilogueAsOneOp) {
  // x [2,3,4] @ w [4,6] + bias, GELU (tanh: 8 flops) on 36 outputs; y and pre written.
  const OpCount c = Only([](Device d) {
    Linear(Z({2, 3, 4}, d), Z({4, 6}, d), Z({6}, d), LinearEpilogue::kBiasGelu);
  });
  EXPECT_EQ(c.op, "linear");
  EXPECT_EQ(c.flops, 2.0 * 6 * 6 * 4 + 36 * (1 + 8));
  EXPECT_EQ(c.bytes, (24 + 24 + 6 + 2 * 36) * 4.0);
  EXPECT_EQ(c.gemm->m, 6);
  EXPECT_EQ(c.gemm->k, 4);
  const OpCount none = Only([](Device d) {
    Linear(Z({5, 4}, d), Z({4, 6}, d), Tensor(), LinearEpilogue::kNone);
  });
  EXPECT_EQ(none.flops, 2.0 * 5 * 6 * 4);
  EXPECT_EQ(none.bytes, (20 + 24 + 30) * 4.0);

  // Backward: dh = dy [6,8] @ w[5,8]^T, gelu grad 14 + bias 1 per element of pre [6,5].
  const OpCount gb = Only([](Device d) {
    LinearGeluBackward(Z({6, 8}, d), Z({5, 8}, d), Z({6, 5}, d));
  });
  EXPECT_EQ(gb.flops, 2.0 * 6 * 5 * 8 + 30 * 15);
  EXPECT_EQ(gb.bytes, (48 + 40 + 2 * 30 + 5) * 4.0);
  EXPECT_TRUE(gb.gemm->trans_b);
  // dw = x[2,3,4]^T @ dy[2,3,6] over 6 rows, db: 36 adds.
  const OpCount wg = Only([](Device d) { LinearWeightGrad(Z({2, 3, 4}, d), Z({2, 3, 6}, d)); });
  EXPECT_EQ(wg.flops, 2.0 * 4 * 6 * 6 + 36);
  EXPECT_EQ(wg.gemm->m, 4);
  EXPECT_EQ(wg.gemm->n, 6);
  EXPECT_EQ(wg.gemm->k, 6);
  EXPECT_TRUE(wg.gemm->trans_a);
  EXPECT_EQ(wg.bytes, (24 + 36 + 24 + 6) * 4.0);
  // acc[3,4] += a[5,3]^T @ b[5,4]
  const OpCount acc = Only([](Device d) {
    Tensor a = Z({3, 4}, d);
    MatmulAccumulate(a, Z({5, 3}, d), Z({5, 4}, d), true, false);
  });
  EXPECT_EQ(acc.flops, 2.0 * 3 * 4 * 5 + 12);
  EXPECT_EQ(acc.bytes, (15 + 20 + 2 * 12) * 4.0);
  const OpCount bg = Only([](Device d) { BiasGrad(Z({7, 3}, d)); });
  EXPECT_EQ(bg.flops, 21);
  EXPECT_EQ(bg.bytes, (21 + 3) * 4.0);
}

// sum over i < tq of clamp(i + off + 1, 0, tk), by brute force.
double BrutePairs(int64_t tq, int64_t tk, int64_t off) {
  double n = 0;
  for (int64_t i = 0; i < tq; ++i) n += std::clamp<int64_t>(i + off + 1, 0, tk);
  return n;
}

TEST(OpCounter, CausalAttentionCountsTheVisiblePairs) {
  // b=2, h=3, d=8, tq=tk=4: 10 visible pairs per (b, h): 4d + 5 flops each.
  const OpCount c = Only([](Device d) {
    Tensor q = Z({2, 4, 3, 8}, d);
    CausalAttention(q, q, q, 0.5);
  });
  EXPECT_EQ(c.op, "causal_attention");
  EXPECT_EQ(c.flops, 10.0 * 6 * (4 * 8 + 5));
  EXPECT_EQ(c.bytes, (4 * 192 + 2 * 3 * 4) * 4.0);  // q, k, v read, out written, lse f32
  EXPECT_FALSE(c.gemm.has_value());
  // Every offset and length against brute force, incl. offsets past either end.
  for (int64_t tq : {1, 3, 5}) {
    for (int64_t tk : {1, 4, 6}) {
      for (int64_t off = -tq - 3; off <= tk + 2; ++off) {
        SCOPED_TRACE(testing::Message() << tq << " " << tk << " " << off);
        OpCounter counter;
        CausalAttention(M({1, tq, 1, 2}), M({1, tk, 1, 2}), M({1, tk, 1, 2}), 1, off);
        CausalAttentionBackward(M({1, tq, 1, 2}), M({1, tk, 1, 2}), M({1, tk, 1, 2}),
                                M({1, tq, 1, 2}), M({1, 1, tq}), M({1, tq, 1, 2}), 1, off);
        const double pairs = BrutePairs(tq, tk, std::clamp<int64_t>(off, -tq - 1, tk));
        EXPECT_EQ(counter.ops()[0].flops, pairs * (4 * 2 + 5));
        EXPECT_EQ(counter.ops()[1].flops, pairs * (10 * 2 + 5));
      }
    }
  }
  // Non-causal limit: the full rectangle (offset >= tk - 1).
  OpCounter full;
  CausalAttention(M({1, 3, 1, 2}), M({1, 5, 1, 2}), M({1, 5, 1, 2}), 1, 4);
  EXPECT_EQ(full.flops(), 15.0 * 13);
}

TEST(OpCounter, ElementwiseNormsAndReductions) {
  EXPECT_EQ(Only([](Device d) { Add(Z({4, 5}, d), Z({5}, d)); }).flops, 20);
  EXPECT_EQ(Only([](Device d) { Add(Z({4, 5}, d), Z({5}, d)); }).bytes, (20 + 5 + 20) * 4.0);
  EXPECT_EQ(Only([](Device d) { Gelu(Z({10}, d)); }).flops, 80);
  EXPECT_EQ(Only([](Device d) { Gelu(Z({10}, d), GeluApprox::kNone); }).flops, 50);
  EXPECT_EQ(Only([](Device d) { GeluGrad(Z({10}, d), Z({10}, d)); }).flops, 140);
  EXPECT_EQ(Only([](Device d) { Exp(Z({10}, d, DType::kBF16)); }).bytes, 40);
  EXPECT_EQ(Only([](Device d) { MulScalar(Z({10}, d), 3); }).flops, 10);
  EXPECT_EQ(Only([](Device d) { Silu(Z({10}, d)); }).flops, 40);
  // layer_norm: 8 per element; x read, y written, gamma, beta, mean and rstd.
  const OpCount ln = Only([](Device d) { LayerNorm(Z({6, 16}, d), Z({16}, d), Z({16}, d), 1e-5); });
  EXPECT_EQ(ln.flops, 8.0 * 96);
  EXPECT_EQ(ln.bytes, (2 * 96 + 16 + 16 + 2 * 6) * 4.0);
  EXPECT_EQ(Only([](Device d) { RmsNorm(Z({6, 16}, d), Z({16}, d), 1e-5); }).flops, 5.0 * 96);
  EXPECT_EQ(Only([](Device d) { Softmax(Z({6, 16}, d), -1); }).flops, 5.0 * 96);
  EXPECT_EQ(Only([](Device d) {
              CrossEntropy(Z({6, 16}, d), Z({6}, d, DType::kI64));
            }).bytes,
            (96 + 6) * 4.0 + 6 * 8);
  EXPECT_EQ(Only([](Device d) { Sum(Z({6, 16}, d), {1}); }).flops, 96);
  EXPECT_EQ(Only([](Device d) { Sum(Z({6, 16}, d), {1}); }).bytes, (96 + 6) * 4.0);
  EXPECT_EQ(Only([](Device d) { Transpose(Z({6, 16}, d), 0, 1); }).flops, 0);
  EXPECT_EQ(Only([](Device d) { Transpose(Z({6, 16}, d), 0, 1); }).bytes, 2 * 96 * 4.0);
  EXPECT_EQ(Only([](Device d) { Cast(Z({6, 16}, d), DType::kBF16); }).bytes, 96 * 6.0);
  EXPECT_EQ(Only([](Device d) {
              Embedding(Z({9, 4}, d), Z({3}, d, DType::kI32));
            }).bytes,
            3 * 4 + 2 * 12 * 4.0);
  // The whole list: 2 flops per element.
  EXPECT_EQ(Only([](Device d) { SumOfSquares({Z({3, 4}, d), Z({5}, d)}); }).flops, 34);
  EXPECT_EQ(Only([](Device d) { Concat({Z({2, 3}, d), Z({2, 1}, d)}, 1); }).bytes, 2 * 8 * 4.0);
}

TEST(OpCounter, BackwardRoutingAndMultiTensorOps) {
  // x [6,16] f32, rows 6: dx written, x and dy read, gamma read, dgamma and dbeta written.
  const OpCount lnb = Only([](Device d) {
    LayerNormBackward(Z({6, 16}, d), Z({16}, d), Z({6}, d), Z({6}, d), Z({6, 16}, d));
  });
  EXPECT_EQ(lnb.flops, 12.0 * 96);
  EXPECT_EQ(lnb.bytes, (3 * 96 + 16 + 6 + 6 + 2 * 16) * 4.0);
  const OpCount rnb = Only([](Device d) {
    RmsNormBackward(Z({6, 16}, d), Tensor(), Z({6}, d), Z({6, 16}, d));
  });
  EXPECT_EQ(rnb.flops, 9.0 * 96);
  EXPECT_EQ(rnb.bytes, (3 * 96 + 6) * 4.0);
  const OpCount sb = Only([](Device d) { SoftmaxBackward(Z({4, 5}, d), Z({4, 5}, d), 1); });
  EXPECT_EQ(sb.flops, 4.0 * 20);
  EXPECT_EQ(sb.bytes, 3 * 20 * 4.0);
  EXPECT_EQ(Only([](Device d) { CausalSoftmax(Z({2, 4, 4}, d)); }).flops, 5.0 * 32);
  const OpCount ceb = Only([](Device d) {
    CrossEntropyBackward(Z({3, 7}, d), Z({3}, d, DType::kI32), Z({3}, d));
  });
  EXPECT_EQ(ceb.flops, 4.0 * 21);
  EXPECT_EQ(ceb.bytes, 2 * 21 * 4.0 + 3 * 4 + 3 * 4);
  const OpCount eb = Only([](Device d) {
    EmbeddingBackward(Z({2, 3}, d, DType::kI64), Z({2, 3, 4}, d, DType::kBF16), 10);
  });
  EXPECT_EQ(eb.flops, 24);
  EXPECT_EQ(eb.bytes, 6 * 8 + 24 * 2 + 40 * 2.0);
  const OpCount tk = Only([](Device d) { TopK(Z({3, 8}, d), 2); });
  EXPECT_EQ(tk.flops, 24);
  EXPECT_EQ(tk.bytes, 24 * 4 + 6 * 4 + 6 * 8.0);
  const OpCount gr = Only([](Device d) { GatherRows(Z({5, 4}, d), Z({3}, d, DType::kI64)); });
  EXPECT_EQ(gr.flops, 0);
  EXPECT_EQ(gr.bytes, 3 * 8 + 2 * 12 * 4.0);
  const OpCount sa = Only([](Device d) {
    ScatterAddRows(Z({3, 4}, d), Z({3}, d, DType::kI64), 5);
  });
  EXPECT_EQ(sa.flops, 12);
  EXPECT_EQ(sa.bytes, 12 * 4 + 3 * 8 + 20 * 4.0);
  const OpCount am = Only([](Device d) { ArgMax(Z({3, 8}, d), 1); });
  EXPECT_EQ(am.flops, 24);
  EXPECT_EQ(am.bytes, 24 * 4 + 3 * 8.0);
  const OpCount aip = Only([](Device d) {
    Tensor acc = Z({7}, d);
    AddInPlace(acc, Z({7}, d));
  });
  EXPECT_EQ(aip.flops, 7);
  EXPECT_EQ(aip.bytes, 3 * 7 * 4.0);
  const OpCount sc = Only([](Device d) { ScaleInPlace({Z({3}, d), Z({2, 2}, d)}, Z({}, d)); });
  EXPECT_EQ(sc.flops, 7);
  EXPECT_EQ(sc.bytes, 2 * 7 * 4.0);
  const OpCount cc = Only([](Device d) { ClipCoefficient(Z({}, d, DType::kF64), 1.0); });
  EXPECT_EQ(cc.flops, 4);
  EXPECT_EQ(cc.bytes, 16);
}

TEST(OpCounter, OnlyTheOutermostOpIsRecorded) {
  // bf16 add on the CPU casts to f32 and back; linear composes matmul, add and gelu there: each
  // is still one record.
  OpCounter c;
  Add(Z({4}, Device::Cpu(), DType::kBF16), Z({4}, Device::Cpu(), DType::kBF16));
  Linear(Z({2, 3}, Device::Cpu()), Z({3, 4}, Device::Cpu()), Z({4}, Device::Cpu()),
         LinearEpilogue::kBiasGelu, GeluApprox::kNone);
  ASSERT_EQ(c.ops().size(), 2u);
  EXPECT_EQ(c.ops()[0].op, "add");
  EXPECT_EQ(c.ops()[1].op, "linear");
  // Identity casts and reshapes run no kernel: nothing recorded.
  Cast(Z({4}, kMeta), DType::kF32);
  Z({4}, kMeta).Reshape({2, 2});
  EXPECT_EQ(c.ops().size(), 2u);
  // A failing op records nothing.
  EXPECT_THROW(Matmul(M({2, 3}), M({4, 5})), OpError);
  EXPECT_EQ(c.ops().size(), 2u);
}

TEST(OpCounter, NestedCountersAndTotals) {
  OpCounter outer;
  Matmul(M({4, 8}), M({8, 2}));
  {
    OpCounter inner;
    Add(M({10}), M({10}));
    Gelu(M({10}));
    EXPECT_EQ(inner.ops().size(), 2u);
    EXPECT_EQ(inner.flops(), 10 + 80);
    EXPECT_EQ(inner.gemm_flops(), 0);
  }
  Relu(M({3}));
  EXPECT_EQ(outer.ops().size(), 4u);
  EXPECT_EQ(outer.flops(), 2 * 4 * 2 * 8 + 10 + 80 + 3);
  EXPECT_EQ(outer.gemm_flops(), 2 * 4 * 2 * 8);
  EXPECT_EQ(outer.bytes(), (32 + 16 + 8) * 4.0 + 30 * 4 + 20 * 4 + 6 * 4);
  const std::string s = outer.Summary();
  EXPECT_THAT(s, ::testing::HasSubstr("matmul"));
  EXPECT_THAT(s, ::testing::HasSubstr("gelu"));
  EXPECT_THAT(s, ::testing::HasSubstr("total"));
  outer.Clear();
  EXPECT_TRUE(outer.ops().empty());
  RecordOpCount({"all_reduce_local_sum", DType::kF32, 7, 8, std::nullopt});
  EXPECT_EQ(outer.flops(), 7);
}

TEST(OpCounter, EachThreadCountsItsOwnOps) {
  constexpr int kThreads = 5;
  std::vector<double> flops(kThreads);
  std::vector<std::thread> threads;
  for (int r = 0; r < kThreads; ++r) {
    threads.emplace_back([r, &flops] {
      OpCounter c;
      for (int i = 0; i <= r; ++i) Matmul(M({2, 3}), M({3, 4}));
      flops[r] = c.flops();
    });
  }
  OpCounter main_thread;
  for (std::thread& t : threads) t.join();
  EXPECT_TRUE(main_thread.ops().empty());
  for (int r = 0; r < kThreads; ++r) EXPECT_EQ(flops[r], (r + 1) * 48.0);
}

TEST(OpCounter, NothingIsRecordedWithoutACounter) {
  Matmul(M({2, 3}), M({3, 4}));  // no counter: must not crash or leak into a later one
  OpCounter c;
  EXPECT_TRUE(c.ops().empty());
}

TEST(OpCounter, TimedCounterTimesEachOpWithinTheWallClock) {
  const Tensor small = Z({16}, Device::Cpu());
  const Tensor big = Z({1 << 22}, Device::Cpu());  // 16 MiB: milliseconds of exp, not nanoseconds
  const auto t0 = std::chrono::steady_clock::now();
  OpCounter c(OpCounter::kTimed);
  EXPECT_TRUE(c.timed());
  Exp(small);
  Exp(big);
  Linear(Z({64, 64}, Device::Cpu()), Z({64, 64}, Device::Cpu()), Z({64}, Device::Cpu()),
         LinearEpilogue::kBiasGelu, GeluApprox::kNone);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(c.ops().size(), 3u);
  double total = 0;
  for (const OpCount& o : c.ops()) {
    EXPECT_GT(o.seconds, 0) << o.op;
    total += o.seconds;
  }
  EXPECT_LE(total, wall);
  // 2^18 times the elements: far more time whatever the machine's load.
  EXPECT_GT(c.ops()[1].seconds, 10 * c.ops()[0].seconds);
}

TEST(OpCounter, OnlyATimedInnermostCounterGetsTimes) {
  OpCounter timed(OpCounter::kTimed);
  {
    OpCounter untimed;  // innermost and untimed: nobody's records are timed
    Exp(Z({1024}, Device::Cpu()));
    ASSERT_EQ(untimed.ops().size(), 1u);
    EXPECT_EQ(untimed.ops()[0].seconds, 0);
  }
  ASSERT_EQ(timed.ops().size(), 1u);
  EXPECT_EQ(timed.ops()[0].seconds, 0);
  Exp(Z({1024}, Device::Cpu()));
  // A failing op records nothing, so it times nothing (and leaves earlier records alone).
  EXPECT_THROW(Matmul(Z({2, 3}, Device::Cpu()), Z({4, 5}, Device::Cpu())), OpError);
  ASSERT_EQ(timed.ops().size(), 2u);
  EXPECT_GT(timed.ops()[1].seconds, 0);
  EXPECT_EQ(timed.ops()[0].seconds, 0);
  // Meta ops run no kernel but are timed alike (their checks and bookkeeping).
  Exp(M({1024}));
  ASSERT_EQ(timed.ops().size(), 3u);
  EXPECT_GE(timed.ops()[2].seconds, 0);
  OpCounter plain;
  EXPECT_FALSE(plain.timed());
}

}  // namespace
}  // namespace shardmap
