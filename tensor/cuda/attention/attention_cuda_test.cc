// The CUDA fused attention against the CPU reference (tensor/ops/attention.h, f64 sums) in every
// float dtype: forward (out, lse) and gradients, odd lengths, one head, head_dim 64 and 128 and
// odd ones, offsets that leave queries without keys. Skips without a GPU.
#include <cmath>
#include <limits>

#include "gtest/gtest.h"
#include "tensor/cuda/runtime.h"
#include "tensor/ops/attention.h"
#include "tensor/ops/shape_ops.h"
#include "tensor/tensor.h"
#include "tensor/testing/compare.h"
#include "tensor/testing/test_util.h"

namespace shardmap {
namespace {

using testing::RandomTensor;
using testing::TensorsNearScaled;

struct Case {
  int64_t b, tq, tk, h, d, offset;
};

double Tolerance(DType t, bool grad) {
  switch (t) {
    case DType::kF64: return 1e-12;
    case DType::kF32: return grad ? 2e-5 : 1e-5;
    default: return grad ? 3e-2 : 1e-2;  // bf16/f16 results: a rounding of the f32 result
  }
}

class AttentionCudaTest : public ::testing::TestWithParam<std::tuple<Case, DType>> {};

TEST_P(AttentionCudaTest, MatchesCpuReference) {
  SKIP_WITHOUT_GPU();
  const auto [c, dtype] = GetParam();
  const Device gpu = Device::Cuda(0);
  const Tensor q = Cast(RandomTensor({c.b, c.tq, c.h, c.d}, DType::kF32, 1), dtype);
  const Tensor k = Cast(RandomTensor({c.b, c.tk, c.h, c.d}, DType::kF32, 2), dtype);
  const Tensor v = Cast(RandomTensor({c.b, c.tk, c.h, c.d}, DType::kF32, 3), dtype);
  const Tensor dout = Cast(RandomTensor({c.b, c.tq, c.h, c.d}, DType::kF32, 4), dtype);
  const double scale = 1 / std::sqrt(static_cast<double>(c.d));

  const CausalAttentionResult want = CausalAttention(q, k, v, scale, c.offset);
  const CausalAttentionResult got =
      CausalAttention(q.To(gpu), k.To(gpu), v.To(gpu), scale, c.offset);
  ASSERT_TRUE(got.out.is_cuda());
  const Tensor out = got.out.To(Device::Cpu()), lse = got.lse.To(Device::Cpu());
  EXPECT_TRUE(TensorsNearScaled(out, want.out, Tolerance(dtype, false)));
  EXPECT_TRUE(TensorsNearScaled(lse, want.lse, dtype == DType::kF64 ? 1e-12 : 1e-5));

  const CausalAttentionGrads gw =
      CausalAttentionBackward(q, k, v, want.out, want.lse, dout, scale, c.offset);
  const CausalAttentionGrads gg = CausalAttentionBackward(
      q.To(gpu), k.To(gpu), v.To(gpu), got.out, got.lse, dout.To(gpu), scale, c.offset);
  EXPECT_TRUE(TensorsNearScaled(gg.dq.To(Device::Cpu()), gw.dq, Tolerance(dtype, true)));
  EXPECT_TRUE(TensorsNearScaled(gg.dk.To(Device::Cpu()), gw.dk, Tolerance(dtype, true)));
  EXPECT_TRUE(TensorsNearScaled(gg.dv.To(Device::Cpu()), gw.dv, Tolerance(dtype, true)));
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
                          Case{1, 257, 257, 2, 96, 0}),  // several key/query tiles
        ::testing::Values(DType::kF32, DType::kBF16, DType::kF16, DType::kF64)));

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

TEST(AttentionCuda, DeterministicBackward) {
  SKIP_WITHOUT_GPU();
  const Device gpu = Device::Cuda(0);
  const Tensor q = RandomTensor({2, 100, 2, 64}, DType::kBF16, 6).To(gpu);
  const Tensor dout = RandomTensor({2, 100, 2, 64}, DType::kBF16, 7).To(gpu);
  const CausalAttentionResult r = CausalAttention(q, q, q, 0.125);
  const CausalAttentionGrads a = CausalAttentionBackward(q, q, q, r.out, r.lse, dout, 0.125);
  const CausalAttentionGrads b = CausalAttentionBackward(q, q, q, r.out, r.lse, dout, 0.125);
  EXPECT_TENSOR_EQ(a.dk.To(Device::Cpu()), b.dk.To(Device::Cpu()));
  EXPECT_TENSOR_EQ(a.dq.To(Device::Cpu()), b.dq.To(Device::Cpu()));
}

TEST(AttentionCuda, HeadDimOver128IsAClearError) {
  SKIP_WITHOUT_GPU();
  const Tensor q = Tensor::Zeros({1, 4, 1, 160}).To(Device::Cuda(0));
  testing::ExpectOpError([&] { CausalAttention(q, q, q, 1.0); },
                         {"head_dim 160", "materialised path"});
}

}  // namespace
}  // namespace shardmap
