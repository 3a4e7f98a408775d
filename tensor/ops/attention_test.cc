// The CPU fused causal attention (the f64 reference) against the materialised path (batched
// matmul + causal_softmax + matmul) and against f64 finite differences.
#include "tensor/ops/attention.h"

#include <cmath>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "tensor/ops/elementwise.h"
#include "tensor/ops/matmul.h"
#include "tensor/ops/nn.h"
#include "tensor/ops/shape_ops.h"
#include "tensor/testing/compare.h"
#include "tensor/testing/test_util.h"

namespace shardmap {
namespace {

using testing::ExpectGradMatchesFiniteDiff;
using testing::ExpectOpError;
using testing::RandomTensor;

// The materialised path: [b,t,h,d] -> [b,h,t,d], scores, causal softmax, p v, back.
Tensor Materialised(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                    int64_t offset) {
  const Tensor qp = Permute(q, {0, 2, 1, 3}), kp = Permute(k, {0, 2, 1, 3}),
               vp = Permute(v, {0, 2, 1, 3});
  const Tensor p = CausalSoftmax(MulScalar(Matmul(qp, kp, false, true), scale), offset);
  return Permute(Matmul(p, vp), {0, 2, 1, 3});
}

struct Case {
  int64_t b, tq, tk, h, d, offset;
  int64_t kvh = 0;  // kv heads (grouped-query attention); 0: h
  int64_t kv() const { return kvh == 0 ? h : kvh; }
};

// x [b, t, kvh, d] with each kv head repeated rep times (head g * rep + r reads kv head g), by
// naive loops: the reference grouped-query attention is multi-head attention on these.
Tensor RepeatHeads(const Tensor& x, int64_t rep) {
  const int64_t b = x.dim(0), t = x.dim(1), g = x.dim(2), d = x.dim(3);
  std::vector<double> out;
  out.reserve(static_cast<size_t>(b * t * g * rep * d));
  for (int64_t i = 0; i < b * t; ++i) {
    for (int64_t h = 0; h < g * rep; ++h) {
      for (int64_t e = 0; e < d; ++e) out.push_back(x.at((i * g + h / rep) * d + e));
    }
  }
  return Tensor::FromVector<double>({b, t, g * rep, d}, out, x.dtype());
}

class AttentionCpuTest : public ::testing::TestWithParam<Case> {};

TEST_P(AttentionCpuTest, ForwardMatchesMaterialisedPath) {
  const Case c = GetParam();
  const Tensor q = RandomTensor({c.b, c.tq, c.h, c.d}, DType::kF64, 1);
  const Tensor k = RandomTensor({c.b, c.tk, c.kv(), c.d}, DType::kF64, 2);
  const Tensor v = RandomTensor({c.b, c.tk, c.kv(), c.d}, DType::kF64, 3);
  const double scale = 1 / std::sqrt(static_cast<double>(c.d));
  const int64_t rep = c.h / c.kv();
  const CausalAttentionResult r = CausalAttention(q, k, v, scale, c.offset);
  EXPECT_TENSOR_NEAR(
      r.out, Materialised(q, RepeatHeads(k, rep), RepeatHeads(v, rep), scale, c.offset), 1e-12);
  ASSERT_EQ(r.lse.shape(), (Shape{c.b, c.h, c.tq}));
  // lse against a direct logsumexp of the visible scores (naive loops).
  for (int64_t b = 0; b < c.b; ++b) {
    for (int64_t h = 0; h < c.h; ++h) {
      for (int64_t i = 0; i < c.tq; ++i) {
        const int64_t n = std::clamp<int64_t>(i + c.offset + 1, 0, c.tk);
        double sum = 0;
        for (int64_t j = 0; j < n; ++j) {
          double s = 0;
          for (int64_t e = 0; e < c.d; ++e) {
            s += q.at(((b * c.tq + i) * c.h + h) * c.d + e) *
                 k.at(((b * c.tk + j) * c.kv() + h / rep) * c.d + e);
          }
          sum += std::exp(s * scale);
        }
        const double got = r.lse.at((b * c.h + h) * c.tq + i);
        if (n == 0) {
          EXPECT_EQ(got, -std::numeric_limits<double>::infinity());
        } else {
          EXPECT_NEAR(got, std::log(sum), 1e-12);
        }
      }
    }
  }
}

TEST_P(AttentionCpuTest, GradientsMatchFiniteDifferences) {
  const Case c = GetParam();
  if (c.d > 16) GTEST_SKIP() << "finite differences run on the small head dims only";
  const Tensor q = RandomTensor({c.b, c.tq, c.h, c.d}, DType::kF64, 4);
  const Tensor k = RandomTensor({c.b, c.tk, c.kv(), c.d}, DType::kF64, 5);
  const Tensor v = RandomTensor({c.b, c.tk, c.kv(), c.d}, DType::kF64, 6);
  const double scale = 0.7;
  auto grads = [&](const Tensor& qq, const Tensor& kk, const Tensor& vv, const Tensor& dout) {
    const CausalAttentionResult r = CausalAttention(qq, kk, vv, scale, c.offset);
    return CausalAttentionBackward(qq, kk, vv, r.out, r.lse, dout, scale, c.offset);
  };
  ExpectGradMatchesFiniteDiff(
      q, [&](const Tensor& x) { return CausalAttention(x, k, v, scale, c.offset).out; },
      [&](const Tensor& x, const Tensor& w) { return grads(x, k, v, w).dq; });
  ExpectGradMatchesFiniteDiff(
      k, [&](const Tensor& x) { return CausalAttention(q, x, v, scale, c.offset).out; },
      [&](const Tensor& x, const Tensor& w) { return grads(q, x, v, w).dk; });
  ExpectGradMatchesFiniteDiff(
      v, [&](const Tensor& x) { return CausalAttention(q, k, x, scale, c.offset).out; },
      [&](const Tensor& x, const Tensor& w) { return grads(q, k, x, w).dv; });
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, AttentionCpuTest,
    ::testing::Values(Case{1, 1, 1, 1, 3, 0},     // one token, one head
                      Case{2, 7, 7, 3, 8, 0},     // odd length, batch > 1
                      Case{1, 5, 5, 1, 4, 0},     // one head
                      Case{2, 5, 9, 2, 4, 4},     // last query lines up with the last key
                      Case{1, 6, 4, 2, 4, -3},    // the first queries see no key
                      Case{2, 9, 9, 2, 64, 0},    // head_dim 64
                      Case{1, 11, 11, 2, 128, 0},  // head_dim 128, odd length
                      // Grouped-query attention: fewer kv heads than query heads.
                      Case{2, 7, 7, 6, 4, 0, 2},   // 3 query heads per kv head, odd length
                      Case{1, 5, 5, 4, 8, 0, 1},   // multi-query (one kv head)
                      Case{2, 3, 8, 6, 4, 5, 3},   // decoding: 3 queries after 5 cached keys
                      Case{1, 1, 9, 4, 64, 8, 2},  // one new token over a 9-key cache
                      Case{1, 6, 4, 3, 4, -3, 1}   // the first queries see no key
                      ));

TEST(AttentionCpu, HalfTypesComputeInF64AndRoundOnce) {
  const Tensor q = RandomTensor({2, 9, 2, 16}, DType::kF32, 7);
  const Tensor k = RandomTensor({2, 9, 2, 16}, DType::kF32, 8);
  const Tensor v = RandomTensor({2, 9, 2, 16}, DType::kF32, 9);
  for (DType t : {DType::kBF16, DType::kF16}) {
    const Tensor qh = Cast(q, t), kh = Cast(k, t), vh = Cast(v, t);
    const CausalAttentionResult r = CausalAttention(qh, kh, vh, 0.25);
    EXPECT_EQ(r.out.dtype(), t);
    EXPECT_EQ(r.lse.dtype(), DType::kF32);
    // The f64 result of the same (rounded) inputs, rounded once.
    const CausalAttentionResult w = CausalAttention(Cast(qh, DType::kF64), Cast(kh, DType::kF64),
                                                    Cast(vh, DType::kF64), 0.25);
    EXPECT_TENSOR_EQ(r.out, Cast(w.out, t));
    EXPECT_TENSOR_EQ(r.lse, Cast(w.lse, DType::kF32));
  }
}

TEST(AttentionCpu, NanOnlyReachesRowsThatSeeIt) {
  Tensor q = RandomTensor({1, 4, 1, 2}, DType::kF64, 10);
  Tensor k = RandomTensor({1, 4, 1, 2}, DType::kF64, 11);
  Tensor v = RandomTensor({1, 4, 1, 2}, DType::kF64, 12);
  v.data<double>()[2 * 2] = std::nan("");  // value of key 2
  const CausalAttentionResult r = CausalAttention(q, k, v, 1.0);
  for (int64_t i = 0; i < 4; ++i) {
    EXPECT_EQ(std::isnan(r.out.at(i * 2)), i >= 2) << "query " << i;
  }
  const Tensor dout = RandomTensor({1, 4, 1, 2}, DType::kF64, 13);
  const CausalAttentionGrads g = CausalAttentionBackward(q, k, v, r.out, r.lse, dout, 1.0);
  EXPECT_FALSE(std::isnan(g.dv.at(0)));  // key 0's value gradient never touches key 2's value
}

TEST(AttentionCpu, Errors) {
  const Tensor q = Tensor::Zeros({2, 4, 3, 8});
  ExpectOpError([&] { CausalAttention(Tensor::Zeros({4, 3, 8}), q, q, 1.0); },
                {"causal_attention", "q f32[4,3,8]", "rank 4"});
  ExpectOpError([&] { CausalAttention(q, Tensor::Zeros({2, 4, 3, 8}, DType::kF64), q, 1.0); },
                {"causal_attention", "dtype mismatch"});
  ExpectOpError([&] { CausalAttention(q, Tensor::Zeros({2, 4, 2, 8}), Tensor::Zeros({2, 4, 2, 8}),
                                      1.0); },
                {"causal_attention", "3 heads", "2 kv heads", "dividing"});
  ExpectOpError([&] { CausalAttention(q, Tensor::Zeros({2, 4, 3, 4}), Tensor::Zeros({2, 4, 3, 4}),
                                      1.0); },
                {"causal_attention", "head_dim"});
  ExpectOpError([&] { CausalAttention(q, q, Tensor::Zeros({2, 5, 3, 8}), 1.0); },
                {"causal_attention", "same shape"});
  ExpectOpError([&] { CausalAttention(q, q, Tensor::Zeros({2, 4, 3, 8}, DType::kI32), 1.0); },
                {"causal_attention", "v", "integer"});
  ExpectOpError([&] { CausalAttention(q, q, q, std::nan("")); }, {"scale", "finite"});
  const CausalAttentionResult r = CausalAttention(q, q, q, 1.0);
  ExpectOpError([&] { CausalAttentionBackward(q, q, q, r.out, Tensor::Zeros({2, 3, 5}), q, 1.0); },
                {"causal_attention_backward", "lse f32[2,3,5]", "f32[2,3,4]"});
  ExpectOpError([&] { CausalAttentionBackward(q, q, q, r.out, r.lse, Tensor::Zeros({2, 4, 3}),
                                              1.0); },
                {"causal_attention_backward", "dout"});
}

}  // namespace
}  // namespace shardmap
