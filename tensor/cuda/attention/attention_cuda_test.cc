// The CUDA fused attention against the CPU reference (tensor/ops/attention.h, f64 sums) in every
// float dtype: forward (out, lse) and gradients, odd lengths, one head, head_dim 64 and 128 and
// odd ones, offsets that leave queries without keys. bf16/f16 at head_dim 64/128 run the
// tensor-core kernels, also forced against the SIMT kernels. Grouped-query cases give k and v
// fewer heads than q (the CPU reference is itself checked against repeated kv heads in
// tensor/ops/attention_test.cc). Skips without a GPU.
#include <algorithm>
#include <cmath>
#include <limits>

#include <cstdlib>
#include <string>

#include "gtest/gtest.h"
#include "tensor/cuda/attention/attention_ops.h"
#include "tensor/cuda/graph.h"
#include "tensor/cuda/runtime.h"
#include "tensor/ops/attention.h"
#include "tensor/ops/shape_ops.h"
#include "tensor/tensor.h"
#include "tensor/testing/compare.h"
#include "tensor/testing/test_util.h"

namespace shardmap {
namespace {

using testing::RandomTensor;
using testing::TensorsNear;

// Within rel * max|want|, with max|want| floored at 1e-3: a one-token problem has dq = dk = 0
// exactly (dP - delta vanishes), which the kernels reach only up to f32 rounding (dP and delta
// are summed in different orders).
::testing::AssertionResult TensorsNearScaled(const Tensor& got, const Tensor& want, double rel) {
  const Tensor w = want.To(Device::Cpu());
  double scale = 1e-3;
  for (int64_t i = 0; i < w.numel(); ++i) {
    const double a = std::fabs(w.at(i));
    if (std::isfinite(a) && a > scale) scale = a;
  }
  return TensorsNear(got, want, rel * scale) << " (atol is " << rel << " * max(1e-3, max|want|) "
                                              << scale << ")";
}

struct Case {
  int64_t b, tq, tk, h, d, offset;
  int64_t kvh = 0;  // kv heads (grouped-query attention); 0: h
  int64_t kv() const { return kvh == 0 ? h : kvh; }
};

double Tolerance(DType t, bool grad) {
  switch (t) {
    case DType::kF64: return 1e-12;
    case DType::kF32: return grad ? 2e-5 : 1e-5;
    default: return grad ? 3e-2 : 1e-2;  // bf16/f16 results: a rounding of the f32 result
  }
}

// P and dS round to the element type before their GEMMs (on top of the output rounding).
double TcTolerance(DType t, bool grad) {
  if (t == DType::kF16) return grad ? 1e-2 : 4e-3;
  return grad ? 4e-2 : 1.5e-2;
}

// The kernel kAuto picks: tensor cores for bf16/f16 at head_dim 64 and 128.
double AutoTolerance(DType t, int64_t head_dim, bool grad) {
  const double simt = Tolerance(t, grad);
  if (!cuda::attention_kernels::TensorCoreEligible(t, head_dim)) return simt;
  return std::max(simt, TcTolerance(t, grad));
}

class AttentionCudaTest : public ::testing::TestWithParam<std::tuple<Case, DType>> {};

TEST_P(AttentionCudaTest, MatchesCpuReference) {
  SKIP_WITHOUT_GPU();
  const auto [c, dtype] = GetParam();
  const Device gpu = Device::Cuda(0);
  const Tensor q = Cast(RandomTensor({c.b, c.tq, c.h, c.d}, DType::kF32, 1), dtype);
  const Tensor k = Cast(RandomTensor({c.b, c.tk, c.kv(), c.d}, DType::kF32, 2), dtype);
  const Tensor v = Cast(RandomTensor({c.b, c.tk, c.kv(), c.d}, DType::kF32, 3), dtype);
  const Tensor dout = Cast(RandomTensor({c.b, c.tq, c.h, c.d}, DType::kF32, 4), dtype);
  const double scale = 1 / std::sqrt(static_cast<double>(c.d));

  const CausalAttentionResult want = CausalAttention(q, k, v, scale, c.offset);
  const CausalAttentionResult got =
      CausalAttention(q.To(gpu), k.To(gpu), v.To(gpu), scale, c.offset);
  ASSERT_TRUE(got.out.is_cuda());
  const Tensor out = got.out.To(Device::Cpu()), lse = got.lse.To(Device::Cpu());
  EXPECT_TRUE(TensorsNearScaled(out, want.out, AutoTolerance(dtype, c.d, false)));
  EXPECT_TRUE(TensorsNearScaled(lse, want.lse, dtype == DType::kF64 ? 1e-12 : 1e-5));

  const CausalAttentionGrads gw =
      CausalAttentionBackward(q, k, v, want.out, want.lse, dout, scale, c.offset);
  const CausalAttentionGrads gg = CausalAttentionBackward(
      q.To(gpu), k.To(gpu), v.To(gpu), got.out, got.lse, dout.To(gpu), scale, c.offset);
  const double gtol = AutoTolerance(dtype, c.d, true);
  EXPECT_TRUE(TensorsNearScaled(gg.dq.To(Device::Cpu()), gw.dq, gtol));
  EXPECT_TRUE(TensorsNearScaled(gg.dk.To(Device::Cpu()), gw.dk, gtol));
  EXPECT_TRUE(TensorsNearScaled(gg.dv.To(Device::Cpu()), gw.dv, gtol));
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, AttentionCudaTest,
    ::testing::Combine(
        ::testing::Values(Case{2, 129, 129, 3, 64, 0},   // odd length over 2 query blocks
                          Case{1, 77, 77, 1, 128, 0},    // one head, head_dim 128
                          Case{2, 33, 33, 2, 40, 0},     // head_dim padded to 64
                          Case{1, 50, 90, 2, 16, 40},    // last query lines up with last key
                          Case{1, 70, 70, 2, 64, -5},    // the first queries see no key
                          Case{3, 1, 1, 1, 8, 0},        // one token
                          Case{1, 257, 257, 2, 96, 0},   // several key/query tiles
                          // Grouped-query attention (tensor cores at 64/128 for bf16/f16).
                          Case{2, 129, 129, 6, 64, 0, 2},  // 3 query heads per kv head
                          Case{1, 77, 77, 4, 128, 0, 1},   // multi-query, head_dim 128
                          Case{1, 50, 90, 4, 16, 40, 2},   // decoding-like offset
                          Case{2, 33, 33, 3, 40, -5, 1}),  // padded head_dim, masked rows
        ::testing::Values(DType::kF32, DType::kBF16, DType::kF16, DType::kF64)));

// The tensor-core kernels (bf16/f16, head_dim 64 and 128) against the CPU reference and against
// the SIMT kernels, forced through cuda::AttentionKernel: forward out and lse, all gradients.
struct TcCase {
  int64_t b, tq, tk, h, offset;
  int64_t kvh = 0;  // kv heads (grouped-query attention); 0: h
  int64_t kv() const { return kvh == 0 ? h : kvh; }
};

class AttentionTcTest
    : public ::testing::TestWithParam<std::tuple<TcCase, DType, int64_t /*head_dim*/>> {};

TEST_P(AttentionTcTest, MatchesCpuReferenceAndSimt) {
  SKIP_WITHOUT_GPU();
  const auto [c, dtype, d] = GetParam();
  const Device gpu = Device::Cuda(0);
  const Tensor q = Cast(RandomTensor({c.b, c.tq, c.h, d}, DType::kF32, 11), dtype);
  const Tensor k = Cast(RandomTensor({c.b, c.tk, c.kv(), d}, DType::kF32, 12), dtype);
  const Tensor v = Cast(RandomTensor({c.b, c.tk, c.kv(), d}, DType::kF32, 13), dtype);
  const Tensor dout = Cast(RandomTensor({c.b, c.tq, c.h, d}, DType::kF32, 14), dtype);
  const Tensor qg = q.To(gpu), kg = k.To(gpu), vg = v.To(gpu), dg = dout.To(gpu);
  const double scale = 1 / std::sqrt(static_cast<double>(d));
  using cuda::AttentionKernel;

  const CausalAttentionResult want = CausalAttention(q, k, v, scale, c.offset);
  const cuda::AttentionOutputs tc =
      cuda::CausalAttention(qg, kg, vg, scale, c.offset, AttentionKernel::kTensorCore);
  const cuda::AttentionOutputs simt =
      cuda::CausalAttention(qg, kg, vg, scale, c.offset, AttentionKernel::kSimt);
  const Tensor out = tc.out.To(Device::Cpu()), lse = tc.lse.To(Device::Cpu());
  EXPECT_TRUE(TensorsNearScaled(out, want.out, TcTolerance(dtype, false)));
  EXPECT_TRUE(TensorsNearScaled(lse, want.lse, 1e-5));
  EXPECT_TRUE(TensorsNearScaled(out, simt.out.To(Device::Cpu()),
                                TcTolerance(dtype, false) + Tolerance(dtype, false)));
  EXPECT_TRUE(TensorsNearScaled(lse, simt.lse.To(Device::Cpu()), 1e-5));

  const CausalAttentionGrads gw =
      CausalAttentionBackward(q, k, v, want.out, want.lse, dout, scale, c.offset);
  // Both GPU backwards from the same (tensor-core) forward, so they differ only in the kernels.
  const cuda::AttentionGrads gt = cuda::CausalAttentionBackward(
      qg, kg, vg, tc.out, tc.lse, dg, scale, c.offset, AttentionKernel::kTensorCore);
  const cuda::AttentionGrads gs = cuda::CausalAttentionBackward(
      qg, kg, vg, tc.out, tc.lse, dg, scale, c.offset, AttentionKernel::kSimt);
  const double tol = TcTolerance(dtype, true);
  const double tol_simt = tol + Tolerance(dtype, true);
  EXPECT_TRUE(TensorsNearScaled(gt.dq.To(Device::Cpu()), gw.dq, tol));
  EXPECT_TRUE(TensorsNearScaled(gt.dk.To(Device::Cpu()), gw.dk, tol));
  EXPECT_TRUE(TensorsNearScaled(gt.dv.To(Device::Cpu()), gw.dv, tol));
  EXPECT_TRUE(TensorsNearScaled(gt.dq.To(Device::Cpu()), gs.dq.To(Device::Cpu()), tol_simt));
  EXPECT_TRUE(TensorsNearScaled(gt.dk.To(Device::Cpu()), gs.dk.To(Device::Cpu()), tol_simt));
  EXPECT_TRUE(TensorsNearScaled(gt.dv.To(Device::Cpu()), gs.dv.To(Device::Cpu()), tol_simt));
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, AttentionTcTest,
    ::testing::Combine(
        ::testing::Values(TcCase{1, 1, 1, 1, 0},      // one token, one head
                          TcCase{2, 17, 17, 3, 0},    // shorter than a fragment
                          TcCase{1, 63, 63, 2, 0},    // one padded row
                          TcCase{2, 65, 65, 1, 0},    // one row into a second block
                          TcCase{1, 129, 129, 2, 0},  // three query blocks, padded keys
                          TcCase{1, 300, 300, 2, 0},  // several key and query tiles
                          TcCase{1, 50, 130, 2, 80},  // tq < tk: last query sees every key
                          TcCase{2, 100, 40, 1, -60},  // the first 60 queries see no key
                          TcCase{1, 70, 70, 2, -5},   // masked rows inside the first block
                          TcCase{1, 65, 200, 3, 135},  // offset across tile boundaries
                          TcCase{2, 129, 129, 4, 0, 2},  // grouped-query: 2 per kv head
                          TcCase{1, 1, 70, 8, 69, 2},    // one decoding query, 4 per kv head
                          TcCase{1, 100, 40, 3, -60, 1}),  // multi-query, unseen rows
        ::testing::Values(DType::kBF16, DType::kF16), ::testing::Values(int64_t{64}, 128)));

// kAuto takes the tensor cores for bf16/f16 at head_dim 64 (bit-identical to forcing them) and
// SHARDMAP_ATTENTION_KERNEL=simt turns them off (bit-identical to forcing SIMT).
TEST(AttentionCuda, AutoAndEnvironmentPickTheKernel) {
  SKIP_WITHOUT_GPU();
  using cuda::AttentionKernel;
  const Device gpu = Device::Cuda(0);
  const Tensor q = RandomTensor({2, 90, 2, 64}, DType::kBF16, 21).To(gpu);
  const Tensor k = RandomTensor({2, 90, 2, 64}, DType::kBF16, 22).To(gpu);
  const char* old = std::getenv("SHARDMAP_ATTENTION_KERNEL");
  const std::string saved = old == nullptr ? "" : old;
  unsetenv("SHARDMAP_ATTENTION_KERNEL");
  const Tensor tc = cuda::CausalAttention(q, k, k, 0.125, 0, AttentionKernel::kTensorCore).out;
  const Tensor simt = cuda::CausalAttention(q, k, k, 0.125, 0, AttentionKernel::kSimt).out;
  EXPECT_TENSOR_EQ(cuda::CausalAttention(q, k, k, 0.125, 0).out.To(Device::Cpu()),
                   tc.To(Device::Cpu()));
  setenv("SHARDMAP_ATTENTION_KERNEL", "simt", 1);
  EXPECT_TENSOR_EQ(cuda::CausalAttention(q, k, k, 0.125, 0).out.To(Device::Cpu()),
                   simt.To(Device::Cpu()));
  if (old == nullptr) {
    unsetenv("SHARDMAP_ATTENTION_KERNEL");
  } else {
    setenv("SHARDMAP_ATTENTION_KERNEL", saved.c_str(), 1);
  }
}

// The tensor-core forward and backward capture into a CUDA graph (no host sync, the shared-memory
// attribute set outside the stream) and replay to the eager results, bit for bit.
TEST(AttentionCuda, TensorCoreKernelsReplayInACudaGraph) {
  SKIP_WITHOUT_GPU();
  using cuda::AttentionKernel;
  const Device gpu = Device::Cuda(0);
  for (int64_t d : {64, 128}) {
    const Tensor q = RandomTensor({2, 130, 3, d}, DType::kF16, 31).To(gpu);
    const Tensor k = RandomTensor({2, 130, 3, d}, DType::kF16, 32).To(gpu);
    const Tensor v = RandomTensor({2, 130, 3, d}, DType::kF16, 33).To(gpu);
    const Tensor dout = RandomTensor({2, 130, 3, d}, DType::kF16, 34).To(gpu);
    auto step = [&](cuda::AttentionOutputs& f, cuda::AttentionGrads& g) {
      f = cuda::CausalAttention(q, k, v, 0.1, 0, AttentionKernel::kTensorCore);
      g = cuda::CausalAttentionBackward(q, k, v, f.out, f.lse, dout, 0.1, 0,
                                        AttentionKernel::kTensorCore);
    };
    cuda::AttentionOutputs fe, fg;
    cuda::AttentionGrads ge, gg;
    step(fe, ge);
    cuda::CudaGraph graph(0);
    ASSERT_TRUE(graph.Capture([&] { step(fg, gg); }).ok());
    ASSERT_TRUE(graph.Replay().ok());
    EXPECT_TENSOR_EQ(fg.out.To(Device::Cpu()), fe.out.To(Device::Cpu()));
    EXPECT_TENSOR_EQ(fg.lse.To(Device::Cpu()), fe.lse.To(Device::Cpu()));
    EXPECT_TENSOR_EQ(gg.dq.To(Device::Cpu()), ge.dq.To(Device::Cpu()));
    EXPECT_TENSOR_EQ(gg.dk.To(Device::Cpu()), ge.dk.To(Device::Cpu()));
    EXPECT_TENSOR_EQ(gg.dv.To(Device::Cpu()), ge.dv.To(Device::Cpu()));
  }
}

// NaN and inf in V at keys a query may not see must not reach that query's output: the SIMT
// kernel skips masked keys, and the tensor-core kernel (where P = 0 would still multiply them)
// must agree. Rows that see the bad keys are non-finite in both.
TEST(AttentionCuda, NonFiniteValuesAtMaskedKeysStayOutOfTheOutput) {
  SKIP_WITHOUT_GPU();
  using cuda::AttentionKernel;
  const Device gpu = Device::Cuda(0);
  constexpr int64_t kT = 130, kNanKey = 100, kInfKey = 129;
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    for (int64_t d : {64, 128}) {
      const Tensor q = Cast(RandomTensor({1, kT, 2, d}, DType::kF32, 41), dtype).To(gpu);
      const Tensor k = Cast(RandomTensor({1, kT, 2, d}, DType::kF32, 42), dtype).To(gpu);
      Tensor v32 = RandomTensor({1, kT, 2, d}, DType::kF32, 43);
      for (int64_t c = 0; c < d; ++c) {  // head 0 only: head 1 stays finite everywhere
        v32.data<float>()[(kNanKey * 2 + 0) * d + c] = std::numeric_limits<float>::quiet_NaN();
        v32.data<float>()[(kInfKey * 2 + 0) * d + c] = std::numeric_limits<float>::infinity();
      }
      const Tensor v = Cast(v32, dtype).To(gpu);
      const Tensor tc =
          cuda::CausalAttention(q, k, v, 0.1, 0, AttentionKernel::kTensorCore).out.To(
              Device::Cpu());
      const Tensor simt =
          cuda::CausalAttention(q, k, v, 0.1, 0, AttentionKernel::kSimt).out.To(Device::Cpu());
      int64_t leaked = 0, missing = 0;
      double worst = 0;
      for (int64_t i = 0; i < kT; ++i) {
        for (int64_t h = 0; h < 2; ++h) {
          for (int64_t c = 0; c < d; ++c) {
            const int64_t e = (i * 2 + h) * d + c;
            const bool sees_bad = h == 0 && i >= kNanKey;
            if (!sees_bad) {
              if (!std::isfinite(tc.at(e))) ++leaked;
              worst = std::max(worst, std::fabs(tc.at(e) - simt.at(e)));
            } else if (std::isfinite(tc.at(e)) || std::isfinite(simt.at(e))) {
              ++missing;
            }
          }
        }
      }
      EXPECT_EQ(leaked, 0) << DTypeName(dtype) << " d=" << d
                           << ": non-finite outputs at rows that see no bad key";
      EXPECT_EQ(missing, 0) << "rows that see a NaN value must be NaN";
      EXPECT_LT(worst, 2 * TcTolerance(dtype, false)) << "tensor-core vs SIMT on finite rows";
    }
  }
}

TEST(AttentionCuda, FullyMaskedRowsAreZeroWithMinusInfLse) {
  SKIP_WITHOUT_GPU();
  const Device gpu = Device::Cuda(0);
  const Tensor q = RandomTensor({1, 6, 1, 8}, DType::kF32, 5).To(gpu);
  const CausalAttentionResult r = CausalAttention(q, q, q, 1.0, /*q_offset=*/-3);
  const Tensor out = r.out.To(Device::Cpu()), lse = r.lse.To(Device::Cpu());
  for (int64_t i = 0; i < 3; ++i) {
    EXPECT_EQ(lse.at(i), -std::numeric_limits<double>::infinity());
    for (int64_t c = 0; c < 8; ++c) EXPECT_EQ(out.at(i * 8 + c), 0.0);
  }
}

// Both kernels (bf16 at head_dim 64 runs on tensor cores; head_dim 48 on SIMT) are bitwise
// deterministic: no atomics.
TEST(AttentionCuda, DeterministicBackward) {
  SKIP_WITHOUT_GPU();
  const Device gpu = Device::Cuda(0);
  for (int64_t d : {64, 48}) {
    const Tensor q = RandomTensor({2, 100, 2, d}, DType::kBF16, 6).To(gpu);
    const Tensor dout = RandomTensor({2, 100, 2, d}, DType::kBF16, 7).To(gpu);
    const CausalAttentionResult r = CausalAttention(q, q, q, 0.125);
    const CausalAttentionGrads a = CausalAttentionBackward(q, q, q, r.out, r.lse, dout, 0.125);
    const CausalAttentionGrads b = CausalAttentionBackward(q, q, q, r.out, r.lse, dout, 0.125);
    EXPECT_TENSOR_EQ(a.dk.To(Device::Cpu()), b.dk.To(Device::Cpu()));
    EXPECT_TENSOR_EQ(a.dv.To(Device::Cpu()), b.dv.To(Device::Cpu()));
    EXPECT_TENSOR_EQ(a.dq.To(Device::Cpu()), b.dq.To(Device::Cpu()));
  }
}

TEST(AttentionCuda, HeadDimOver128IsAClearError) {
  SKIP_WITHOUT_GPU();
  const Tensor q = Tensor::Zeros({1, 4, 1, 160}).To(Device::Cuda(0));
  testing::ExpectOpError([&] { CausalAttention(q, q, q, 1.0); },
                         {"head_dim 160", "materialised path"});
}

}  // namespace
}  // namespace shardmap
