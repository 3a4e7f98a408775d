// The CUDA nn ops (through the public ops of tensor/ops/nn.h on GPU tensors) against the CPU ops.
// Without a GPU every GPU test skips; ErrorsEverywhere runs on any machine.
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#if SHARDMAP_HAS_CUDA
#include <cuda_runtime.h>
#endif
#include "tensor/cuda/device_memory.h"
#include "tensor/cuda/runtime.h"
#include "tensor/error.h"
#include "tensor/ops/nn.h"
#include "tensor/ops/shape_ops.h"
#include "tensor/testing/test_util.h"

namespace shardmap {
namespace {

using testing::ExpectAllClose;
using testing::RandomTensor;

constexpr DType kFloats[] = {DType::kF32, DType::kF64, DType::kBF16, DType::kF16};

Tensor Gpu(const Tensor& t) { return t.defined() ? t.To(Device::Cuda(0)) : t; }

// (rtol, atol) for results of `dtype`: f32 1e-5, f64 1e-12, bf16/f16 two units in the last
// place. atol_scale widens atol for sums over many terms.
std::pair<double, double> Tol(DType dtype, double atol_scale) {
  switch (dtype) {
    case DType::kF64: return {1e-12, 1e-12 * atol_scale};
    case DType::kBF16: return {2.0 / 128, 1e-3 * atol_scale};
    case DType::kF16: return {2.0 / 1024, 1e-3 * atol_scale};
    default: return {1e-5, 1e-5 * atol_scale};
  }
}

// A GPU result against the CPU result: same definedness, dtype, shape; values within Tol.
void ExpectMatches(const Tensor& gpu, const Tensor& cpu, const std::string& what,
                   double atol_scale = 1) {
  ASSERT_EQ(gpu.defined(), cpu.defined()) << what;
  if (!cpu.defined()) return;
  EXPECT_TRUE(gpu.is_cuda()) << what;
  const Tensor g = gpu.To(Device::Cpu());
  ASSERT_EQ(g.dtype(), cpu.dtype()) << what;
  ASSERT_EQ(g.shape(), cpu.shape()) << what << ": " << g.ShapeString() << " vs "
                                    << cpu.ShapeString();
  const auto [rtol, atol] = Tol(cpu.dtype(), atol_scale);
  ExpectAllClose(g, cpu.ToVector<double>(), rtol, atol, what);
}

std::string Name(const char* op, const Tensor& t, DType d = DType::kF32) {
  return std::string(op) + " " + t.ShapeString() + " " + DTypeName(d);
}

Tensor RandomIds(absl::Span<const int64_t> shape, int64_t v, DType dtype, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int64_t> dist(0, v - 1);
  std::vector<int64_t> ids(NumElements(shape));
  for (int64_t& i : ids) i = dist(rng);
  return Tensor::FromVector<int64_t>(shape, ids, dtype);
}

// ---------------------------------------------------------------- softmax

struct SoftmaxCase {
  std::vector<int64_t> shape;
  int dim;
};
// Rows of up to 1024 elements take a warp, longer ones a block; rows are kept in shared memory
// when they fit (47 KiB per block), so {9,1000} and {2,13000} also cover the uncached paths;
// {2,12000} is cached just under the bound; {2,12280} (f32 forward) and {2,6140} (f32
// backward, f64 forward) fit 48 KiB but not with the kernels' static scratch beside them, so a
// launch with them cached would fail: they must take the uncached path. The 47 KiB bound itself:
// a block's row of 12032 (f32 forward) or 6016 (f32 backward, f64 forward) elements is cached,
// one more is not; a warp's rows (8 a block) of 752 (f32 backward, f64 forward) or 376 (f64
// backward) elements are cached, one more are not.
const std::vector<SoftmaxCase>& SoftmaxCases() {
  static const auto* cases = new std::vector<SoftmaxCase>{
      {{0, 5}, -1},   {{1, 1}, -1},   {{1, 7}, -1},    {{7, 13}, -1},  {{3, 5, 33}, 2},
      {{4, 1500}, 1}, {{2, 3, 4}, 0}, {{2, 3, 4}, 1},  {{5, 1}, 0},    {{3, 1025}, -1},
      {{2, 70000}, -1}, {{1, 250007}, -1}, {{9, 1000}, -1}, {{2, 13000}, -1},
      {{2, 12000}, -1}, {{2, 12280}, -1}, {{2, 6140}, -1}, {{2, 12032}, -1}, {{2, 12033}, -1},
      {{2, 6016}, -1}, {{2, 6017}, -1}, {{9, 752}, -1}, {{9, 753}, -1}, {{9, 376}, -1},
      {{9, 377}, -1}, {{5, 31}, -1}, {{3, 40, 31}, 1}};
  return *cases;
}

TEST(NnCudaTest, SoftmaxAndLogSoftmaxForwardBackward) {
  SKIP_WITHOUT_GPU();
  uint32_t seed = 1;
  for (const SoftmaxCase& c : SoftmaxCases()) {
    for (DType dt : kFloats) {
      const Tensor x = RandomTensor(c.shape, dt, seed++, -4, 4);
      const Tensor dy = RandomTensor(c.shape, dt, seed++);
      const Tensor gx = Gpu(x), gdy = Gpu(dy);
      const std::string n = Name("softmax", x, dt) + " dim " + std::to_string(c.dim);
      const Tensor y = Softmax(x, c.dim), ly = LogSoftmax(x, c.dim);
      ExpectMatches(Softmax(gx, c.dim), y, n);
      ExpectMatches(LogSoftmax(gx, c.dim), ly, "log_" + n);
      ExpectMatches(SoftmaxBackward(Gpu(y), gdy, c.dim), SoftmaxBackward(y, dy, c.dim),
                    n + " backward");
      ExpectMatches(LogSoftmaxBackward(Gpu(ly), gdy, c.dim), LogSoftmaxBackward(ly, dy, c.dim),
                    "log_" + n + " backward", /*atol_scale=*/4);
    }
  }
}

TEST(NnCudaTest, SoftmaxInfinities) {
  SKIP_WITHOUT_GPU();
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const Tensor x = Tensor::FromVector<double>({7, 4}, {-inf, -inf, -inf, -inf,  // all -inf: NaN
                                                       0, -inf, 1, -inf,         // masked
                                                       1, 2, 3, 4,
                                                       nan, 1, 2, 3,    // NaN first: all NaN
                                                       -inf, nan, 0, 1,
                                                       1, inf, 0, 2,    // one +inf: all NaN
                                                       inf, -inf, inf, 0});
  for (DType dt : kFloats) {
    const Tensor xd = Tensor::FromVector<double>(x.shape(), x.ToVector<double>(), dt);
    ExpectMatches(Softmax(Gpu(xd), -1), Softmax(xd, -1), Name("softmax inf", xd, dt));
    ExpectMatches(LogSoftmax(Gpu(xd), -1), LogSoftmax(xd, -1), Name("log_softmax inf", xd, dt));
    // The same rows along dim 0 (the strided-lane kernel).
    const Tensor xt = Transpose(xd, 0, 1);
    ExpectMatches(Softmax(Gpu(xt), 0), Softmax(xt, 0), Name("softmax inf dim 0", xt, dt));
    ExpectMatches(LogSoftmax(Gpu(xt), 0), LogSoftmax(xt, 0), Name("log_softmax inf dim 0", xt, dt));
    // Rows of 8 (each row twice): the register-resident kernel for bf16/f16 too.
    std::vector<double> wide;
    for (int64_t r = 0; r < 7; ++r) {
      for (int rep = 0; rep < 2; ++rep) {
        for (int64_t j = 0; j < 4; ++j) wide.push_back(x.at(r * 4 + j));
      }
    }
    const Tensor xw = Tensor::FromVector<double>({7, 8}, wide, dt);
    ExpectMatches(Softmax(Gpu(xw), -1), Softmax(xw, -1), Name("softmax inf rows of 8", xw, dt));
    ExpectMatches(LogSoftmax(Gpu(xw), -1), LogSoftmax(xw, -1),
                  Name("log_softmax inf rows of 8", xw, dt));
  }
}

// Logit rows holding +inf or NaN give NaN losses and gradients, as on the CPU.
TEST(NnCudaTest, CrossEntropyInfinities) {
  SKIP_WITHOUT_GPU();
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const Tensor x = Tensor::FromVector<double>({4, 4}, {1, inf, 0, 2,
                                                       inf, -inf, inf, 0,
                                                       -inf, 1, 0, 2,
                                                       0, nan, 1, 2});
  const Tensor targets = Tensor::FromVector<int64_t>({4}, {0, 1, 3, 2});
  const Tensor dloss = Tensor::Ones({4}, DType::kF32);
  for (DType dt : kFloats) {
    const Tensor xd = Tensor::FromVector<double>(x.shape(), x.ToVector<double>(), dt);
    ExpectMatches(CrossEntropy(Gpu(xd), Gpu(targets)), CrossEntropy(xd, targets),
                  Name("cross_entropy inf", xd, dt));
    ExpectMatches(CrossEntropyBackward(Gpu(xd), Gpu(targets), Gpu(dloss)),
                  CrossEntropyBackward(xd, targets, dloss), Name("cross_entropy_backward inf", xd, dt));
  }
}

// ---------------------------------------------------------------- norms

const std::vector<std::vector<int64_t>>& NormShapes() {
  static const auto* shapes = new std::vector<std::vector<int64_t>>{
      {0, 8}, {1, 1}, {7, 13}, {2, 3, 33}, {5, 2000}, {300, 40}, {3, 0}, {5}, {9, 1000},
      {2, 13000}, {2, 12280}, {2, 6140}, {2, 12032}, {2, 12033}, {2, 6016}, {2, 6017},
      {9, 752}, {9, 753}, {9, 31}};
  return *shapes;
}

TEST(NnCudaTest, LayerNormForwardBackward) {
  SKIP_WITHOUT_GPU();
  uint32_t seed = 100;
  for (const auto& shape : NormShapes()) {
    for (DType dt : kFloats) {
      const int64_t h = shape.back();
      const Tensor x = RandomTensor(shape, dt, seed++, -3, 5);
      const Tensor dy = RandomTensor(shape, dt, seed++);
      // gamma and beta in x's dtype, in f32 (mixed), or absent.
      for (int affine = 0; affine < 3; ++affine) {
        const DType pt = affine == 1 ? DType::kF32 : dt;
        const Tensor gamma = affine == 2 ? Tensor() : RandomTensor({h}, pt, seed++, 0.5, 1.5);
        const Tensor beta = affine == 2 ? Tensor() : RandomTensor({h}, pt, seed++);
        const std::string n = Name("layer_norm", x, dt) + " affine " + std::to_string(affine);
        const LayerNormResult c = LayerNorm(x, gamma, beta, 1e-5);
        const LayerNormResult g = LayerNorm(Gpu(x), Gpu(gamma), Gpu(beta), 1e-5);
        ExpectMatches(g.y, c.y, n + " y");
        ExpectMatches(g.mean, c.mean, n + " mean");
        ExpectMatches(g.rstd, c.rstd, n + " rstd", /*atol_scale=*/10);
        const LayerNormGrads cg = LayerNormBackward(x, gamma, c.mean, c.rstd, dy);
        const LayerNormGrads gg =
            LayerNormBackward(Gpu(x), Gpu(gamma), Gpu(c.mean), Gpu(c.rstd), Gpu(dy));
        ExpectMatches(gg.dx, cg.dx, n + " dx", 10);
        ExpectMatches(gg.dgamma, cg.dgamma, n + " dgamma", 100);
        ExpectMatches(gg.dbeta, cg.dbeta, n + " dbeta", 100);
      }
    }
  }
}

TEST(NnCudaTest, LayerNormBackwardTakesStatsOfAnyFloatDType) {
  SKIP_WITHOUT_GPU();
  const Tensor x = RandomTensor({6, 24}, DType::kF32, 7), dy = RandomTensor({6, 24}, DType::kF32, 8);
  const Tensor gamma = RandomTensor({24}, DType::kBF16, 9);
  const LayerNormResult r = LayerNorm(x, gamma, Tensor(), 1e-5);
  const Tensor mean = Cast(r.mean, DType::kF64), rstd = Cast(r.rstd, DType::kF16);
  const LayerNormGrads c = LayerNormBackward(x, gamma, mean, rstd, dy);
  const LayerNormGrads g = LayerNormBackward(Gpu(x), Gpu(gamma), Gpu(mean), Gpu(rstd), Gpu(dy));
  ExpectMatches(g.dx, c.dx, "dx", 10);
  ExpectMatches(g.dgamma, c.dgamma, "dgamma (bf16)");
  ExpectMatches(g.dbeta, c.dbeta, "dbeta (bf16)");
}

TEST(NnCudaTest, RmsNormForwardBackward) {
  SKIP_WITHOUT_GPU();
  uint32_t seed = 300;
  for (const auto& shape : NormShapes()) {
    for (DType dt : kFloats) {
      const int64_t h = shape.back();
      const Tensor x = RandomTensor(shape, dt, seed++, -3, 5);
      const Tensor dy = RandomTensor(shape, dt, seed++);
      for (int affine = 0; affine < 3; ++affine) {
        const DType pt = affine == 1 ? DType::kF32 : dt;
        const Tensor gamma = affine == 2 ? Tensor() : RandomTensor({h}, pt, seed++, 0.5, 1.5);
        const std::string n = Name("rms_norm", x, dt) + " affine " + std::to_string(affine);
        const RmsNormResult c = RmsNorm(x, gamma, 1e-6);
        const RmsNormResult g = RmsNorm(Gpu(x), Gpu(gamma), 1e-6);
        ExpectMatches(g.y, c.y, n + " y");
        ExpectMatches(g.rstd, c.rstd, n + " rstd", 10);
        const RmsNormGrads cg = RmsNormBackward(x, gamma, c.rstd, dy);
        const RmsNormGrads gg = RmsNormBackward(Gpu(x), Gpu(gamma), Gpu(c.rstd), Gpu(dy));
        ExpectMatches(gg.dx, cg.dx, n + " dx", 10);
        ExpectMatches(gg.dgamma, cg.dgamma, n + " dgamma", 100);
      }
    }
  }
}

// More rows than a grid's y or z dim could hold (65535). Softmax rows of 2 elements: more than
// the 2^20 blocks (8 rows each) the row kernels launch, so warps loop over a second row. Norms:
// the parameter gradients then use all 512 row chunks (137 rows each, the last one empty).
TEST(NnCudaTest, ManyRows) {
  SKIP_WITHOUT_GPU();
  {
    const Tensor x = RandomTensor({(int64_t{1} << 23) + 9, 2}, DType::kF32, 11, -4, 4);
    const Tensor dy = RandomTensor(x.shape(), DType::kF32, 12);
    const Tensor y = Softmax(x, -1), ly = LogSoftmax(x, -1);
    ExpectMatches(Softmax(Gpu(x), -1), y, "softmax many rows");
    ExpectMatches(LogSoftmax(Gpu(x), -1), ly, "log_softmax many rows");
    ExpectMatches(SoftmaxBackward(Gpu(y), Gpu(dy), -1), SoftmaxBackward(y, dy, -1),
                  "softmax_backward many rows");
  }
  uint32_t seed = 20;
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const Tensor x = RandomTensor({70000, 40}, dt, seed++, -3, 5);
    const Tensor dy = RandomTensor(x.shape(), dt, seed++);
    const Tensor gamma = RandomTensor({40}, dt, seed++, 0.5, 1.5);
    const Tensor beta = RandomTensor({40}, dt, seed++);
    const std::string n = Name("many rows", x, dt);
    const LayerNormResult c = LayerNorm(x, gamma, beta, 1e-5);
    const LayerNormResult g = LayerNorm(Gpu(x), Gpu(gamma), Gpu(beta), 1e-5);
    ExpectMatches(g.y, c.y, n + " layer_norm y");
    ExpectMatches(g.rstd, c.rstd, n + " layer_norm rstd", 10);
    const LayerNormGrads cg = LayerNormBackward(x, gamma, c.mean, c.rstd, dy);
    const LayerNormGrads gg =
        LayerNormBackward(Gpu(x), Gpu(gamma), Gpu(c.mean), Gpu(c.rstd), Gpu(dy));
    ExpectMatches(gg.dx, cg.dx, n + " layer_norm dx", 10);
    // Sums over 70000 rows of magnitude ~300, f32 on both sides in different orders (the CPU's
    // sequential one drifts by ~1e-3): atol 0.1 for f32, 1 for bf16 (ulp 2 there).
    const double sum_scale = dt == DType::kF32 ? 1e4 : 1e3;
    ExpectMatches(gg.dgamma, cg.dgamma, n + " layer_norm dgamma", sum_scale);
    ExpectMatches(gg.dbeta, cg.dbeta, n + " layer_norm dbeta", sum_scale);
    const RmsNormResult rc = RmsNorm(x, gamma, 1e-6);
    const RmsNormGrads rcg = RmsNormBackward(x, gamma, rc.rstd, dy);
    const RmsNormGrads rgg = RmsNormBackward(Gpu(x), Gpu(gamma), Gpu(rc.rstd), Gpu(dy));
    ExpectMatches(RmsNorm(Gpu(x), Gpu(gamma), 1e-6).y, rc.y, n + " rms_norm y");
    ExpectMatches(rgg.dx, rcg.dx, n + " rms_norm dx", 10);
    ExpectMatches(rgg.dgamma, rcg.dgamma, n + " rms_norm dgamma", sum_scale);

    const Tensor logits = RandomTensor({70000, 5}, dt, seed++, -6, 6);
    std::vector<int64_t> t = RandomIds({70000}, 5, DType::kI64, seed++).ToVector<int64_t>();
    for (size_t i = 0; i < t.size(); i += 7) t[i] = -100;
    const Tensor targets = Tensor::FromVector<int64_t>({70000}, t, DType::kI32);
    const Tensor dloss = RandomTensor({70000}, DType::kF32, seed++, 0.5, 2);
    ExpectMatches(CrossEntropy(Gpu(logits), Gpu(targets)), CrossEntropy(logits, targets),
                  n + " cross_entropy");
    ExpectMatches(CrossEntropyBackward(Gpu(logits), Gpu(targets), Gpu(dloss)),
                  CrossEntropyBackward(logits, targets, dloss), n + " cross_entropy_backward");
  }
}

// ---------------------------------------------------------------- embedding

TEST(NnCudaTest, EmbeddingForwardBackward) {
  SKIP_WITHOUT_GPU();
  uint32_t seed = 500;
  const std::vector<std::vector<int64_t>> id_shapes = {{0}, {1}, {5}, {2, 3}, {4, 64}};
  for (int64_t h : {0, 1, 7, 8, 64}) {
    for (DType dt : {DType::kF32, DType::kF64, DType::kBF16, DType::kF16, DType::kI32,
                     DType::kI64}) {
      const Tensor table = RandomTensor({11, h}, dt, seed++, -100, 100);
      for (DType it : {DType::kI32, DType::kI64}) {
        for (const auto& ids_shape : id_shapes) {
          const Tensor ids = RandomIds(ids_shape, 11, it, seed++);
          const std::string n = Name("embedding", table, dt) + " ids " + ids.ShapeString();
          const Tensor out = Embedding(Gpu(table), Gpu(ids));
          const Tensor want = Embedding(table, ids);
          ASSERT_EQ(out.shape(), want.shape()) << n;
          EXPECT_EQ(out.To(Device::Cpu()).ToVector<double>(), want.ToVector<double>()) << n;
          if (!IsFloating(dt)) continue;
          Shape dy_shape = ids.shape();
          dy_shape.push_back(h);
          const Tensor dy = RandomTensor(dy_shape, dt, seed++);
          // Repeated ids (64 draws from 11 rows) sum in token order, the CPU op's too.
          ExpectMatches(EmbeddingBackward(Gpu(ids), Gpu(dy), 11), EmbeddingBackward(ids, dy, 11),
                        n + " backward", 10);
          ExpectMatches(EmbeddingBackward(Gpu(ids), Gpu(dy), 20), EmbeddingBackward(ids, dy, 20),
                        n + " backward, more rows", 10);
        }
      }
    }
  }
}

// The backward sums each row's tokens in token order (a stable sort, no atomics): the same bits
// on every call, and exactly the f32 sums taken in that order on the host. With atomics the low
// bits vary with the scheduling of thousands of adds into 5 rows. A GPT-2-sized table (50257
// rows: 16 sort bits) with most rows unused, and an out-of-range id.
TEST(NnCudaTest, EmbeddingBackwardIsDeterministicInTokenOrder) {
  SKIP_WITHOUT_GPU();
  for (int64_t rows : {int64_t{5}, int64_t{50257}}) {
    constexpr int64_t kTokens = 8192, kH = 96;
    std::vector<int64_t> id_values(kTokens);
    std::mt19937 gen(77);
    for (int64_t i = 0; i < kTokens; ++i) {
      id_values[i] = rows == 5 ? static_cast<int64_t>(gen() % 5)
                               : static_cast<int64_t>(gen() % 64) * 781;
    }
    const Tensor ids = Tensor::FromVector<int64_t>({kTokens}, id_values).To(Device::Cuda(0));
    const Tensor dy = RandomTensor({kTokens, kH}, DType::kF32, 78, -1, 1);
    const Tensor a = EmbeddingBackward(ids, Gpu(dy), rows).To(Device::Cpu());
    const Tensor b = EmbeddingBackward(ids, Gpu(dy), rows).To(Device::Cpu());
    ASSERT_EQ(a.ToVector<float>(), b.ToVector<float>()) << rows << " rows: two calls differ";
    std::vector<float> want(static_cast<size_t>(rows * kH), 0.f);
    const float* d = dy.data<float>();
    for (int64_t i = 0; i < kTokens; ++i) {
      for (int64_t c = 0; c < kH; ++c) want[id_values[i] * kH + c] += d[i * kH + c];
    }
    EXPECT_EQ(a.ToVector<float>(), want) << rows << " rows: not the token-order f32 sums";
  }
  std::vector<int64_t> bad_ids = {1, 2, 7, 0};
  const Tensor ids = Tensor::FromVector<int64_t>({4}, bad_ids).To(Device::Cuda(0));
  const Tensor dy = RandomTensor({4, 8}, DType::kF32, 79).To(Device::Cuda(0));
  EXPECT_THROW(EmbeddingBackward(ids, dy, 5), OpError);
}

// With deferred index checks an op with a bad index returns, and the thread's next read back on
// the stream throws its error (naming the op and saying it was deferred); good ops never do,
// also past the 256 checks that may wait (the 257th waits for them).
TEST(NnCudaTest, DeferredIndexChecksThrowAtTheNextReadBack) {
  SKIP_WITHOUT_GPU();
  const bool before = cuda::DeferredIndexChecks();
  cuda::SetDeferredIndexChecks(true);
  const Tensor table = Gpu(RandomTensor({10, 8}, DType::kF32, 90));
  const Tensor good = Gpu(Tensor::FromVector<int64_t>({3}, {1, 9, 0}));
  const Tensor bad = Gpu(Tensor::FromVector<int64_t>({3}, {1, 10, 0}));
  for (int i = 0; i < 300; ++i) (void)Embedding(table, good);
  EXPECT_NO_THROW((void)Embedding(table, good).To(Device::Cpu()));
  Tensor out;
  EXPECT_NO_THROW(out = Embedding(table, bad));  // no sync here
  try {
    (void)out.To(Device::Cpu());
    ADD_FAILURE() << "the deferred check did not fire at the read back";
  } catch (const OpError& e) {
    EXPECT_NE(std::string(e.what()).find("embedding: id 10"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("deferred"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW((void)Embedding(table, good).To(Device::Cpu()));  // reported once
  const Tensor logits = Gpu(RandomTensor({2, 5}, DType::kF32, 91));
  const Tensor targets = Gpu(Tensor::FromVector<int64_t>({2}, {4, 7}));
  (void)CrossEntropy(logits, targets, -100);
  EXPECT_THROW(cuda::RunDeferredIndexChecks(0), OpError);
  cuda::SetDeferredIndexChecks(before);
}

// ---------------------------------------------------------------- cross-entropy

struct CeCase {
  std::vector<int64_t> logits_shape;
  int64_t ignore_index;
  int ignored_every;  // every k-th target set to ignore_index (0: none)
};

TEST(NnCudaTest, CrossEntropyForwardBackward) {
  SKIP_WITHOUT_GPU();
  const std::vector<CeCase> cases = {
      {{0, 5}, -100, 0},      {{1, 7}, -100, 0},     {{7, 13}, -100, 3},
      {{2, 3, 13}, 4, 2},     {{4, 2000}, -100, 2},  {{3, 1}, -100, 0},
      {{2, 70000}, -100, 0},  {{1, 250007}, -100, 0}, {{5, 6}, -100, 1}};
  uint32_t seed = 700;
  for (const CeCase& c : cases) {
    const int64_t v = c.logits_shape.back();
    const std::vector<int64_t> tshape(c.logits_shape.begin(), c.logits_shape.end() - 1);
    for (DType dt : kFloats) {
      for (DType it : {DType::kI32, DType::kI64}) {
        const Tensor logits = RandomTensor(c.logits_shape, dt, seed++, -6, 6);
        std::vector<int64_t> t = RandomIds(tshape, v, DType::kI64, seed++).ToVector<int64_t>();
        for (size_t i = 0; c.ignored_every > 0 && i < t.size(); i += c.ignored_every) {
          t[i] = c.ignore_index;
        }
        const Tensor targets = Tensor::FromVector<int64_t>(tshape, t, it);
        const std::string n = Name("cross_entropy", logits, dt) + " targets " +
                              targets.ShapeString() + " ignore " + std::to_string(c.ignore_index);
        ExpectMatches(CrossEntropy(Gpu(logits), Gpu(targets), c.ignore_index),
                      CrossEntropy(logits, targets, c.ignore_index), n);
        // dloss in f32 for every logits dtype (f64 logits: a cast on the way in).
        const Tensor dloss = RandomTensor(tshape, DType::kF32, seed++, 0.5, 2);
        ExpectMatches(CrossEntropyBackward(Gpu(logits), Gpu(targets), Gpu(dloss), c.ignore_index),
                      CrossEntropyBackward(logits, targets, dloss, c.ignore_index),
                      n + " backward");
      }
    }
  }
}

// ---------------------------------------------------------------- causal mask

TEST(NnCudaTest, CausalMask) {
  SKIP_WITHOUT_GPU();
  uint32_t seed = 900;
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<std::vector<int64_t>> shapes = {{4, 6}, {6, 4}, {2, 3, 5, 5}, {0, 3}, {1, 1}};
  for (const auto& shape : shapes) {
    for (DType dt : kFloats) {
      const Tensor x = RandomTensor(shape, dt, seed++);
      for (int64_t offset : {-2, 0, 3}) {
        for (double fill : {-inf, -1e4, 0.1}) {
          const std::string n = Name("causal_mask", x, dt) + " offset " +
                                std::to_string(offset) + " fill " + std::to_string(fill);
          ExpectMatches(CausalMask(Gpu(x), offset, fill), CausalMask(x, offset, fill), n);
        }
      }
    }
  }
}

// Rows with no visible key (offset < 0) are zeros on both devices, not NaN.
TEST(NnCudaTest, CausalSoftmax) {
  SKIP_WITHOUT_GPU();
  uint32_t seed = 950;
  // Warp rows, block rows kept in shared memory ({3, 40, 2000}) and re-read ({2, 5, 13000}).
  const std::vector<std::vector<int64_t>> shapes = {{4, 6},          {6, 4},    {2, 3, 5, 5},
                                                    {0, 3},          {1, 1},    {3, 40, 2000},
                                                    {2, 5, 13000}};
  for (const auto& shape : shapes) {
    for (DType dt : kFloats) {
      const Tensor x = RandomTensor(shape, dt, seed++);
      for (int64_t offset : {-100, -2, -1, 0, 3, 1990}) {
        const std::string n = Name("causal_softmax", x, dt) + " offset " + std::to_string(offset);
        ExpectMatches(CausalSoftmax(Gpu(x), offset), CausalSoftmax(x, offset), n);
      }
    }
  }
}

// ---------------------------------------------------------------- errors

// The GPU error message equals the CPU one (same checks, same wording).
template <typename Fn, typename Gn>
void ExpectSameError(Fn cpu, Gn gpu, std::initializer_list<const char*> fragments) {
  const absl::Status c = CatchOpError(cpu), g = CatchOpError(gpu);
  ASSERT_FALSE(g.ok()) << "expected an OpError on the GPU";
  EXPECT_EQ(g.code(), absl::StatusCode::kInvalidArgument) << g;
  EXPECT_EQ(g.message(), c.message());
  for (const char* f : fragments) {
    EXPECT_NE(std::string(g.message()).find(f), std::string::npos) << g << " lacks " << f;
  }
}

// No ids over a table of no rows: nothing to do, an empty gradient (not a launch error).
TEST(NnCudaTest, EmbeddingBackwardOfNothingIsEmpty) {
  SKIP_WITHOUT_GPU();
  const Tensor ids = Tensor::FromVector<int64_t>({0}, {}, DType::kI64);
  const Tensor dy = Tensor::Zeros({0, 4}, DType::kF32);
  const Tensor g = EmbeddingBackward(Gpu(ids), Gpu(dy), 0);
  EXPECT_EQ(g.ShapeString(), EmbeddingBackward(ids, dy, 0).ShapeString());
  EXPECT_EQ(g.numel(), 0);
  const Tensor g3 = EmbeddingBackward(Gpu(ids), Gpu(dy), 3);  // no ids, 3 rows: zeros
  ExpectMatches(g3, EmbeddingBackward(ids, dy, 3), "embedding backward of no ids");
}

TEST(NnCudaTest, BadIdsAndTargetsOnGpu) {
  SKIP_WITHOUT_GPU();
  for (DType it : {DType::kI32, DType::kI64}) {
    const Tensor table = RandomTensor({10, 4}, DType::kF32, 1);
    const Tensor ids = Tensor::FromVector<int64_t>({2, 3}, {1, 2, 3, 4, 10, -1}, it);
    ExpectSameError([&] { Embedding(table, ids); }, [&] { Embedding(Gpu(table), Gpu(ids)); },
                    {"embedding", "id 10", "[1,1]", "0 <= id < 10"});
    const Tensor dy = RandomTensor({2, 3, 4}, DType::kF32, 2);
    ExpectSameError([&] { EmbeddingBackward(ids, dy, 10); },
                    [&] { EmbeddingBackward(Gpu(ids), Gpu(dy), 10); },
                    {"embedding_backward", "id 10", "[1,1]"});
    // A table of no rows: every id is out of range (the first one is named), no empty launch.
    ExpectSameError([&] { EmbeddingBackward(ids, dy, 0); },
                    [&] { EmbeddingBackward(Gpu(ids), Gpu(dy), 0); },
                    {"embedding_backward", "id 1", "[0,0]", "0 <= id < 0"});
    const Tensor no_features = Tensor::Zeros({10, 0}, DType::kF32);
    ExpectSameError([&] { Embedding(no_features, ids); },
                    [&] { Embedding(Gpu(no_features), Gpu(ids)); }, {"id 10", "[1,1]"});

    const Tensor logits = RandomTensor({4, 5}, DType::kBF16, 3);
    const Tensor targets = Tensor::FromVector<int64_t>({4}, {0, -100, -3, 5}, it);
    ExpectSameError([&] { CrossEntropy(logits, targets); },
                    [&] { CrossEntropy(Gpu(logits), Gpu(targets)); },
                    {"cross_entropy", "target -3", "[2]", "ignore_index (-100)"});
    const Tensor dloss = Tensor::Ones({4}, DType::kF32);
    ExpectSameError([&] { CrossEntropyBackward(logits, targets, dloss); },
                    [&] { CrossEntropyBackward(Gpu(logits), Gpu(targets), Gpu(dloss)); },
                    {"cross_entropy_backward", "target -3", "[2]"});
  }
  // After an error the stream is still usable.
  const Tensor x = RandomTensor({3, 4}, DType::kF32, 4);
  ExpectMatches(Softmax(Gpu(x), -1), Softmax(x, -1), "softmax after errors");
}

#if SHARDMAP_HAS_CUDA
// While a stream is being captured into a CUDA graph no host sync is allowed, so bad ids and
// targets are not read back: they give zero rows / zero losses instead of an error (nn_ops.h).
TEST(NnCudaTest, BadIdsUnderGraphCaptureGiveZerosNotErrors) {
  SKIP_WITHOUT_GPU();
  const cuda::StreamHandle stream = cuda::NewStream(0);
  cuda::StreamScope scope(0, stream);
  const cudaStream_t cs = static_cast<cudaStream_t>(stream);
  const Tensor table = Gpu(RandomTensor({10, 4}, DType::kF32, 1));
  const Tensor ids = Gpu(Tensor::FromVector<int64_t>({3}, {1, 10, 2}));
  const Tensor logits = Gpu(RandomTensor({3, 5}, DType::kF32, 2));
  const Tensor targets = Gpu(Tensor::FromVector<int64_t>({3}, {4, 7, 0}));
  // Warm the allocator's cache for these sizes, outside the capture.
  for (int i = 0; i < 2; ++i) {
    Embedding(table, Gpu(Tensor::FromVector<int64_t>({3}, {1, 1, 2})));
    CrossEntropy(logits, Gpu(Tensor::FromVector<int64_t>({3}, {4, 1, 0})));
  }
  ASSERT_EQ(cudaStreamSynchronize(cs), cudaSuccess);
  Tensor rows, loss;
  ASSERT_EQ(cudaStreamBeginCapture(cs, cudaStreamCaptureModeRelaxed), cudaSuccess);
  const absl::Status st = CatchOpError([&] {
    rows = Embedding(table, ids);
    loss = CrossEntropy(logits, targets);
  });
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(cs, &graph), cudaSuccess);
  ASSERT_TRUE(st.ok()) << st;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, cs), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(cs), cudaSuccess);
  const std::vector<double> got = rows.To(Device::Cpu()).ToVector<double>();
  const std::vector<double> t = table.To(Device::Cpu()).ToVector<double>();
  for (int j = 0; j < 4; ++j) {
    EXPECT_EQ(got[j], t[4 + j]);       // id 1
    EXPECT_EQ(got[4 + j], 0.0);        // id 10: out of range, zero row
    EXPECT_EQ(got[8 + j], t[8 + j]);   // id 2
  }
  const Tensor cpu_logits = logits.To(Device::Cpu());
  const Tensor want = CrossEntropy(cpu_logits, Tensor::FromVector<int64_t>({3}, {4, -100, 0}));
  ExpectMatches(loss, want, "cross_entropy under capture (bad target 7: loss 0)");
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}
#endif  // SHARDMAP_HAS_CUDA

TEST(NnCudaTest, MixedDevicesAreAnError) {
  SKIP_WITHOUT_GPU();
  const Tensor table = RandomTensor({10, 4}, DType::kF32, 1);
  const Tensor ids = Tensor::FromVector<int64_t>({2}, {1, 2});
  testing::ExpectOpError([&] { Embedding(Gpu(table), ids); }, {"embedding", "different devices"});
  const Tensor x = RandomTensor({2, 4}, DType::kF32, 2);
  testing::ExpectOpError([&] { LayerNorm(Gpu(x), Tensor::Ones({4}), Tensor(), 1e-5); },
                         {"layer_norm", "different devices"});
  testing::ExpectOpError([&] { SoftmaxBackward(Gpu(x), x, -1); },
                         {"softmax_backward", "different devices"});
}

// Runs on every machine: argument errors read the same for GPU tensors, and without a GPU a
// CUDA tensor cannot be made at all.
TEST(NnCudaTest, ErrorsEverywhere) {
  if (!cuda::Available()) {
    const absl::Status s =
        CatchOpError([] { Tensor::Zeros({2, 3}, DType::kF32, Device::Cuda(0)); });
    EXPECT_FALSE(s.ok());
    EXPECT_EQ(CatchOpError([] { Softmax(Tensor::Zeros({2, 3}), 2); }).code(),
              absl::StatusCode::kInvalidArgument);
    return;
  }
  const Tensor x = RandomTensor({2, 3}, DType::kF32, 1);
  ExpectSameError([&] { Softmax(x, 2); }, [&] { Softmax(Gpu(x), 2); }, {"softmax", "dim 2"});
  ExpectSameError([&] { LayerNorm(x, Tensor::Ones({4}), Tensor(), 1e-5); },
                  [&] { LayerNorm(Gpu(x), Gpu(Tensor::Ones({4})), Tensor(), 1e-5); },
                  {"layer_norm", "gamma"});
}

}  // namespace
}  // namespace shardmap
