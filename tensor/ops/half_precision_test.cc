// bf16/f16 CPU ops (the references the GPU kernels are tested against) checked against the same op
// computed in f64 from the same (exactly widened) inputs and rounded once to the 16-bit dtype.
// Every element must be within one unit in the last place of that dtype, and at least 90% must
// equal the once-rounded value exactly: a kernel that accumulated in 16 bits, or rounded twice,
// fails. f32 side outputs (LayerNorm mean/rstd, the CrossEntropy loss) are checked at 1e-6.
#include <cmath>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tensor/ops/nn.h"
#include "tensor/ops/reduce.h"
#include "tensor/ops/shape_ops.h"
#include "tensor/testing/compare.h"
#include "tensor/testing/test_util.h"

namespace shardmap {
namespace {

using testing::RandomTensor;

const DType kHalf[] = {DType::kBF16, DType::kF16};

Tensor F64(const Tensor& t) { return Cast(t, DType::kF64); }

// Relative size of one unit in the last place (for values in [1, 2)).
double Ulp(DType t) { return t == DType::kBF16 ? 1.0 / 128 : 1.0 / 1024; }

void ExpectRoundedOnce(const Tensor& got, const Tensor& want64, const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_EQ(got.shape(), want64.shape());
  const DType t = got.dtype();
  if (t == DType::kF32) {
    EXPECT_TRUE(testing::TensorsNear(got, Cast(want64, DType::kF32), 1e-6, 1e-6));
    return;
  }
  const Tensor want = Cast(want64, t);
  // One ulp of the larger of the two values; tiny absolute slack for results that cancel to ~0.
  EXPECT_TRUE(testing::TensorsNear(got, want, 1e-6, Ulp(t)));
  int64_t exact = 0;
  for (int64_t i = 0; i < got.numel(); ++i) exact += got.at(i) == want.at(i) ? 1 : 0;
  EXPECT_GE(exact, got.numel() * 9 / 10)
      << exact << " of " << got.numel() << " equal the f64 result rounded once";
}

TEST(HalfPrecisionTest, LayerNormForwardAndBackward) {
  for (DType t : kHalf) {
    const Tensor x = RandomTensor({37, 96}, t, 1, -3, 5),
                 gamma = RandomTensor({96}, t, 2, 0.5, 1.5);
    const Tensor beta = RandomTensor({96}, t, 3), dy = RandomTensor({37, 96}, t, 4);
    const LayerNormResult h = LayerNorm(x, gamma, beta, 1e-5);
    const LayerNormResult d = LayerNorm(F64(x), F64(gamma), F64(beta), 1e-5);
    const std::string n = DTypeName(t);
    ExpectRoundedOnce(h.y, d.y, n + " layer_norm y");
    ExpectRoundedOnce(h.mean, d.mean, n + " layer_norm mean");
    ExpectRoundedOnce(h.rstd, d.rstd, n + " layer_norm rstd");
    const LayerNormGrads hg = LayerNormBackward(x, gamma, h.mean, h.rstd, dy);
    const LayerNormGrads dg =
        LayerNormBackward(F64(x), F64(gamma), F64(h.mean), F64(h.rstd), F64(dy));
    ExpectRoundedOnce(hg.dx, dg.dx, n + " layer_norm dx");
    ExpectRoundedOnce(hg.dgamma, dg.dgamma, n + " layer_norm dgamma");
    ExpectRoundedOnce(hg.dbeta, dg.dbeta, n + " layer_norm dbeta");
  }
}

TEST(HalfPrecisionTest, RmsNormForwardAndBackward) {
  for (DType t : kHalf) {
    const Tensor x = RandomTensor({29, 80}, t, 5, -3, 3),
                 gamma = RandomTensor({80}, t, 6, 0.5, 1.5);
    const Tensor dy = RandomTensor({29, 80}, t, 7);
    const RmsNormResult h = RmsNorm(x, gamma, 1e-6);
    const RmsNormResult d = RmsNorm(F64(x), F64(gamma), 1e-6);
    const std::string n = DTypeName(t);
    ExpectRoundedOnce(h.y, d.y, n + " rms_norm y");
    ExpectRoundedOnce(h.rstd, d.rstd, n + " rms_norm rstd");
    const RmsNormGrads hg = RmsNormBackward(x, gamma, h.rstd, dy);
    const RmsNormGrads dg = RmsNormBackward(F64(x), F64(gamma), F64(h.rstd), F64(dy));
    ExpectRoundedOnce(hg.dx, dg.dx, n + " rms_norm dx");
    ExpectRoundedOnce(hg.dgamma, dg.dgamma, n + " rms_norm dgamma");
  }
}

TEST(HalfPrecisionTest, SoftmaxAndLogSoftmaxForwardAndBackward) {
  for (DType t : kHalf) {
    const Tensor x = RandomTensor({23, 70}, t, 8, -6, 6), dy = RandomTensor({23, 70}, t, 9);
    const std::string n = DTypeName(t);
    const Tensor y = Softmax(x, -1), ly = LogSoftmax(x, -1);
    ExpectRoundedOnce(y, Softmax(F64(x), -1), n + " softmax");
    ExpectRoundedOnce(ly, LogSoftmax(F64(x), -1), n + " log_softmax");
    ExpectRoundedOnce(SoftmaxBackward(y, dy, -1), SoftmaxBackward(F64(y), F64(dy), -1),
                      n + " softmax_backward");
    ExpectRoundedOnce(LogSoftmaxBackward(ly, dy, -1), LogSoftmaxBackward(F64(ly), F64(dy), -1),
                      n + " log_softmax_backward");
  }
}

TEST(HalfPrecisionTest, CrossEntropyForwardAndBackward) {
  for (DType t : kHalf) {
    const Tensor logits = RandomTensor({41, 33}, t, 10, -6, 6);
    std::vector<int64_t> ids;
    for (int i = 0; i < 41; ++i) ids.push_back(i % 5 == 0 ? -100 : (i * 7) % 33);
    const Tensor targets = Tensor::FromVector<int64_t>({41}, ids);
    const Tensor dloss = RandomTensor({41}, DType::kF32, 11, 0.5, 2);
    const std::string n = DTypeName(t);
    const Tensor loss = CrossEntropy(logits, targets);
    EXPECT_EQ(loss.dtype(), DType::kF32);
    ExpectRoundedOnce(loss, CrossEntropy(F64(logits), targets), n + " cross_entropy");
    ExpectRoundedOnce(CrossEntropyBackward(logits, targets, dloss),
                      CrossEntropyBackward(F64(logits), targets, F64(dloss)),
                      n + " cross_entropy_backward");
  }
}

TEST(HalfPrecisionTest, Reductions) {
  for (DType t : kHalf) {
    // 300 terms: a 16-bit running sum would lose several bits; f32 accumulation rounded once not.
    const Tensor x = RandomTensor({6, 300, 5}, t, 12);
    const std::string n = DTypeName(t);
    for (const std::vector<int>& dims :
         {std::vector<int>{1}, std::vector<int>{0, 2}, std::vector<int>{}}) {
      const std::string d = n + " dims " + std::to_string(dims.size());
      ExpectRoundedOnce(Sum(x, dims), Sum(F64(x), dims), d + " sum");
      ExpectRoundedOnce(Mean(x, dims), Mean(F64(x), dims), d + " mean");
      // Max/Min pick an element: exact.
      EXPECT_TRUE(testing::TensorsBitwiseEqual(Max(x, dims), Cast(Max(F64(x), dims), t))) << d;
      EXPECT_TRUE(testing::TensorsBitwiseEqual(Min(x, dims), Cast(Min(F64(x), dims), t))) << d;
    }
  }
}

}  // namespace
}  // namespace shardmap
