// cuBLASLt GEMMs against the CPU: Matmul for every dtype, transpose and batch form, odd and
// empty sizes; the fused linear epilogues (tensor/ops/linear.h) against their CPU references; the
// beta = 1 accumulation; the plan cache and the allocation-free steady state. Skips without a GPU.
#include <cstdint>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tensor/cuda/device_memory.h"
#include "tensor/cuda/gemm/internal/autotune.h"
#include "tensor/cuda/gemm/ops.h"
#include "tensor/cuda/graph.h"
#include "tensor/cuda/runtime.h"
#include "tensor/ops/linear.h"
#include "tensor/ops/matmul.h"
#include "tensor/ops/shape_ops.h"
#include "tensor/testing/test_util.h"

namespace shardmap {
namespace {

using cuda::gemm_internal::AutotuneEnabled;
using cuda::gemm_internal::TuningAllowed;
using testing::ExpectAllClose;
using testing::RandomTensor;

const Device kGpu = Device::Cuda(0);

Tensor Gpu(const Tensor& t) { return t.To(kGpu); }
Tensor Cpu(const Tensor& t) { return t.To(Device::Cpu()); }

// GPU vs CPU of the same dtype. f32: TF32 would miss 1e-4 by far; bf16/f16: a couple of ulps of
// the output (both sides accumulate in f32 and round once, in different orders).
double Rtol(DType t) {
  switch (t) {
    case DType::kF64: return 1e-10;
    case DType::kF32: return 1e-4;
    case DType::kBF16: return 2.0 / 128;
    default: return 2.0 / 1024;
  }
}
double Atol(DType t) { return t == DType::kF64 ? 1e-10 : Rtol(t) * 0.5; }

// extra_atol widens the tolerance where the GPU may legitimately differ more: cuBLASLt's GELU
// may use a fast tanh (~5e-4 absolute), and its bias gradient may sum already-rounded outputs.
void ExpectMatches(const Tensor& gpu, const Tensor& cpu, const std::string& what,
                   double extra_atol = 0) {
  ASSERT_TRUE(gpu.is_cuda()) << what;
  ASSERT_EQ(gpu.ShapeString(), cpu.ShapeString()) << what;
  ExpectAllClose(Cpu(gpu), cpu.ToVector<double>(), Rtol(cpu.dtype()),
                 Atol(cpu.dtype()) + extra_atol, what);
}

constexpr double kGeluAtol = 2e-3;

std::string Name(DType t, int64_t m, int64_t k, int64_t n, bool ta, bool tb) {
  return std::string(DTypeName(t)) + " m=" + std::to_string(m) + " k=" + std::to_string(k) +
         " n=" + std::to_string(n) + (ta ? " ^T" : "") + (tb ? " @^T" : "");
}

const DType kAllDTypes[] = {DType::kF32, DType::kF64, DType::kBF16, DType::kF16};

TEST(GemmCudaTest, MatmulAllDTypesTransposesAndOddSizes) {
  SKIP_WITHOUT_GPU();
  const int64_t sizes[][3] = {{1, 1, 1}, {7, 13, 129}, {129, 7, 13}, {13, 129, 7}, {64, 128, 32}};
  uint32_t seed = 1;
  for (DType dt : kAllDTypes) {
    for (const auto& s : sizes) {
      const int64_t m = s[0], k = s[1], n = s[2];
      for (bool ta : {false, true}) {
        for (bool tb : {false, true}) {
          const Tensor a = RandomTensor(ta ? Shape{k, m} : Shape{m, k}, dt, seed++, -1, 1);
          const Tensor b = RandomTensor(tb ? Shape{n, k} : Shape{k, n}, dt, seed++, -1, 1);
          ExpectMatches(Matmul(Gpu(a), Gpu(b), ta, tb), Matmul(a, b, ta, tb),
                        Name(dt, m, k, n, ta, tb));
        }
      }
    }
  }
}

TEST(GemmCudaTest, BatchedAndFoldedLeadingDims) {
  SKIP_WITHOUT_GPU();
  uint32_t seed = 100;
  for (DType dt : kAllDTypes) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        const Tensor a = RandomTensor(ta ? Shape{3, 2, 13, 7} : Shape{3, 2, 7, 13}, dt, seed++,
                                      -1, 1);
        const Tensor b = RandomTensor(tb ? Shape{3, 2, 5, 13} : Shape{3, 2, 13, 5}, dt, seed++,
                                      -1, 1);
        ExpectMatches(Matmul(Gpu(a), Gpu(b), ta, tb), Matmul(a, b, ta, tb),
                      std::string("batched ") + Name(dt, 7, 13, 5, ta, tb));
      }
    }
    // Rank-3 a times rank-2 b: leading dims fold into m.
    for (bool tb : {false, true}) {
      const Tensor x = RandomTensor({4, 7, 13}, dt, seed++, -1, 1);
      const Tensor w = RandomTensor(tb ? Shape{9, 13} : Shape{13, 9}, dt, seed++, -1, 1);
      ExpectMatches(Matmul(Gpu(x), Gpu(w), false, tb), Matmul(x, w, false, tb),
                    std::string("folded ") + Name(dt, 28, 13, 9, false, tb));
    }
  }
}

TEST(GemmCudaTest, EmptyDims) {
  SKIP_WITHOUT_GPU();
  for (DType dt : kAllDTypes) {
    // k = 0: an empty sum is zero.
    const Tensor z = Matmul(Gpu(Tensor::Zeros({3, 0}, dt)), Gpu(Tensor::Zeros({0, 5}, dt)));
    ExpectAllClose(Cpu(z), std::vector<double>(15, 0.0), 0, 0, "k=0");
    // m = 0 and n = 0: empty outputs, no launch.
    EXPECT_EQ(Matmul(Gpu(Tensor::Zeros({0, 4}, dt)), Gpu(Tensor::Zeros({4, 5}, dt))).numel(), 0);
    EXPECT_EQ(Matmul(Gpu(Tensor::Zeros({2, 4}, dt)), Gpu(Tensor::Zeros({4, 0}, dt))).numel(), 0);
    EXPECT_EQ(Matmul(Gpu(Tensor::Zeros({0, 2, 4}, dt)), Gpu(Tensor::Zeros({0, 4, 3}, dt)))
                  .ShapeString(),
              std::string(DTypeName(dt)) + "[0,2,3]");
  }
}

TEST(GemmCudaTest, LinearEpiloguesMatchCpu) {
  SKIP_WITHOUT_GPU();
  uint32_t seed = 200;
  // n = 16: fused (aux ld % 8 == 0); n = 13: the composed fallback for GELU.
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (int64_t n : {16, 13}) {
      const Tensor x = RandomTensor({2, 7, 24}, dt, seed++, -1, 1);
      const Tensor w = RandomTensor({24, n}, dt, seed++, -0.5, 0.5);
      const Tensor b = RandomTensor({n}, dt, seed++, -1, 1);
      for (LinearEpilogue e : {LinearEpilogue::kBias, LinearEpilogue::kGelu,
                               LinearEpilogue::kBiasGelu}) {
        const bool has_bias = e != LinearEpilogue::kGelu;
        const LinearResult want = Linear(x, w, has_bias ? b : Tensor(), e);
        const LinearResult got = Linear(Gpu(x), Gpu(w), has_bias ? Gpu(b) : Tensor(), e);
        const std::string what = std::string(DTypeName(dt)) + " n=" + std::to_string(n) +
                                 " epilogue " + std::to_string(static_cast<int>(e));
        ExpectMatches(got.y, want.y, what + " y",
                      e == LinearEpilogue::kBias ? 0.0 : kGeluAtol);
        if (want.pre.defined()) ExpectMatches(got.pre, want.pre, what + " pre");
      }
    }
  }
}

// The bias epilogue adds in f32 before the one rounding to bf16 (linear_test's
// HalfOutputsAreRoundedOnce on the GPU): 1 + 3/1024 + 3/1024 rounds to 1 + 1/128, where rounding
// the product first would give 1.
TEST(GemmCudaTest, BiasEpilogueRoundsOnce) {
  SKIP_WITHOUT_GPU();
  const Tensor x = Tensor::FromVector<float>({1, 2}, {1.0f, 3.0f / 1024}, DType::kBF16);
  const Tensor w = Tensor::FromVector<float>({2, 1}, {1.0f, 1.0f}, DType::kBF16);
  const Tensor b = Tensor::FromVector<float>({1}, {3.0f / 1024}, DType::kBF16);
  const LinearResult r = Linear(Gpu(x), Gpu(w), Gpu(b), LinearEpilogue::kBias);
  EXPECT_EQ(Cpu(r.y).at(0), 1.0 + 1.0 / 128);
}

TEST(GemmCudaTest, GeluBackwardWeightGradAndBiasGradMatchCpu) {
  SKIP_WITHOUT_GPU();
  uint32_t seed = 300;
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (int64_t n : {16, 13}) {
      const Tensor dy = RandomTensor({2, 9, 24}, dt, seed++, -1, 1);
      const Tensor w2 = RandomTensor({n, 24}, dt, seed++, -0.5, 0.5);
      const Tensor pre = RandomTensor({2, 9, n}, dt, seed++, -2, 2);
      const std::string what = std::string(DTypeName(dt)) + " n=" + std::to_string(n);
      for (bool bias_grad : {true, false}) {
        const LinearGeluGrads want = LinearGeluBackward(dy, w2, pre, bias_grad);
        const LinearGeluGrads got = LinearGeluBackward(Gpu(dy), Gpu(w2), Gpu(pre), bias_grad);
        ExpectMatches(got.dpre, want.dpre, what + " dpre", kGeluAtol);
        ASSERT_EQ(got.dbias.defined(), bias_grad);
        // 18 rows: the sum of 18 dpre values, each possibly rounded to dt first.
        const double rows_atol = 18 * (kGeluAtol + 2 * Rtol(dt));
        if (bias_grad) ExpectMatches(got.dbias, want.dbias, what + " dbias", rows_atol);
      }
      const Tensor x = RandomTensor({2, 9, n}, dt, seed++, -1, 1);
      const LinearWeightGrads want = LinearWeightGrad(x, dy);
      const LinearWeightGrads got = LinearWeightGrad(Gpu(x), Gpu(dy));
      ExpectMatches(got.dw, want.dw, what + " dw");
      ExpectMatches(got.db, want.db, what + " db");
      ExpectMatches(BiasGrad(Gpu(dy)), BiasGrad(dy), what + " BiasGrad");
    }
  }
}

// Operands that are views at an odd element offset (2-byte aligned bf16/f16, 4-byte f32): the
// plan for the same shape with 256-byte aligned pointers exists already and must not be reused
// (the heuristic's algorithm may need 16-byte alignment); the results match the CPU.
TEST(GemmCudaTest, MisalignedViewsGetTheirOwnPlans) {
  SKIP_WITHOUT_GPU();
  uint32_t seed = 950;
  const int64_t m = 64, k = 32, n = 48;
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    const std::string what = DTypeName(dt);
    const Tensor a = RandomTensor({m, k}, dt, seed++, -1, 1);
    const Tensor b = RandomTensor({k, n}, dt, seed++, -1, 1);
    const Tensor bias = RandomTensor({n}, dt, seed++, -1, 1);
    // The same values one element into a larger device buffer.
    auto misaligned = [&](const Tensor& t) {
      const Tensor flat = Gpu(Concat({Tensor::Zeros({1}, dt), t.Reshape({t.numel()})}, 0));
      return flat.SliceRows(1, t.numel()).Reshape(t.shape());
    };
    const Tensor ga = misaligned(a), gb = misaligned(b), gbias = misaligned(bias);
    ASSERT_NE(reinterpret_cast<uintptr_t>(ga.raw_data()) % 16, 0u) << what;
    ExpectMatches(Matmul(Gpu(a), Gpu(b)), Matmul(a, b), what + " aligned");
    ExpectMatches(Matmul(ga, gb), Matmul(a, b), what + " misaligned a, b");
    ExpectMatches(Matmul(ga, Gpu(b)), Matmul(a, b), what + " misaligned a");
    ExpectMatches(Linear(Gpu(a), Gpu(b), Gpu(bias), LinearEpilogue::kBias).y,
                  Linear(a, b, bias, LinearEpilogue::kBias).y, what + " aligned bias");
    ExpectMatches(Linear(ga, gb, gbias, LinearEpilogue::kBias).y,
                  Linear(a, b, bias, LinearEpilogue::kBias).y, what + " misaligned bias");
  }
}

// Empty weight gradients: dw is empty or zero, but db is still dy's row sum whenever dy has rows
// (x with no features), and zero only when there are no rows.
TEST(GemmCudaTest, WeightGradWithEmptyDims) {
  SKIP_WITHOUT_GPU();
  uint32_t seed = 900;
  for (DType dt : kAllDTypes) {
    const std::string what = std::string(DTypeName(dt));
    const Tensor dy = RandomTensor({2, 3, 5}, dt, seed++, -1, 1);
    const Tensor x0 = Tensor::Zeros({2, 3, 0}, dt);  // k = 0 features
    const LinearWeightGrads want = LinearWeightGrad(x0, dy);
    const LinearWeightGrads got = LinearWeightGrad(Gpu(x0), Gpu(dy));
    EXPECT_EQ(got.dw.ShapeString(), want.dw.ShapeString()) << what;
    ExpectMatches(got.db, want.db, what + " db of x [2,3,0]");
    const Tensor x1 = RandomTensor({0, 4}, dt, seed++, -1, 1);  // no rows
    const Tensor dy1 = Tensor::Zeros({0, 5}, dt);
    const LinearWeightGrads got1 = LinearWeightGrad(Gpu(x1), Gpu(dy1));
    ExpectAllClose(Cpu(got1.dw), std::vector<double>(20, 0.0), 0, 0, what + " dw, no rows");
    ExpectAllClose(Cpu(got1.db), std::vector<double>(5, 0.0), 0, 0, what + " db, no rows");
  }
}

// The forward epilogues are fused on Hopper for bf16 (cuBLASLt offers BIAS and GELU_AUX_BIAS
// there): no refusal may be counted. The backward ones (DGELU_BGRAD with a transposed weight,
// BGRADA) are reported, since a refusal only costs speed (the composed path is exact).
TEST(GemmCudaTest, EpiloguesAreFused) {
  SKIP_WITHOUT_GPU();
  const Tensor x = Gpu(RandomTensor({64, 32}, DType::kBF16, 800, -1, 1));
  const Tensor w = Gpu(RandomTensor({32, 64}, DType::kBF16, 801, -1, 1));
  const Tensor b = Gpu(RandomTensor({64}, DType::kBF16, 802, -1, 1));
  const int64_t u0 = cuda::GetGemmStats().unsupported;
  Linear(x, w, b, LinearEpilogue::kBias);
  Linear(x, w, b, LinearEpilogue::kBiasGelu);
  EXPECT_EQ(cuda::GetGemmStats().unsupported, u0) << "bias / gelu_aux_bias epilogue refused";
  const LinearResult h = Linear(x, w, b, LinearEpilogue::kBiasGelu);
  const int64_t u1 = cuda::GetGemmStats().unsupported;
  const Tensor dy = Gpu(RandomTensor({64, 32}, DType::kBF16, 803, -1, 1));
  const Tensor w2 = Gpu(RandomTensor({64, 32}, DType::kBF16, 804, -1, 1));
  LinearGeluBackward(dy, w2, h.pre);
  const int64_t u2 = cuda::GetGemmStats().unsupported;
  LinearWeightGrad(x, h.pre);
  const int64_t u3 = cuda::GetGemmStats().unsupported;
  std::printf("fused: dgelu_bgrad %s, weight grad + bgrad %s\n", u2 == u1 ? "yes" : "NO (composed)",
              u3 == u2 ? "yes" : "NO (two GEMMs)");
}

TEST(GemmCudaTest, MatmulAccumulateIsBetaOne) {
  SKIP_WITHOUT_GPU();
  uint32_t seed = 400;
  for (DType dt : kAllDTypes) {
    const DType acc_dt = dt == DType::kF64 ? DType::kF64 : DType::kF32;
    const Tensor a = RandomTensor({33, 7}, dt, seed++, -1, 1);
    const Tensor b = RandomTensor({33, 20}, dt, seed++, -1, 1);
    const Tensor acc0 = RandomTensor({7, 20}, acc_dt, seed++);
    Tensor want = acc0.Clone();
    MatmulAccumulate(want, a, b, /*trans_a=*/true, false);
    MatmulAccumulate(want, a, b, true, false);
    Tensor got = Gpu(acc0);
    MatmulAccumulate(got, Gpu(a), Gpu(b), true, false);
    MatmulAccumulate(got, Gpu(a), Gpu(b), true, false);
    // f32 accumulators: f32 tolerance even for bf16 operands (no rounding to bf16).
    ExpectMatches(got, want, std::string("accumulate ") + DTypeName(dt));
  }
}

// A new shape's first call times the heuristic's candidates (into scratch: the accumulated C
// stays exact) and keeps the winner; later calls time nothing and give the same bits.
TEST(GemmCudaTest, AutotuneOnFirstUseKeepsResultsAndTunesOnce) {
  SKIP_WITHOUT_GPU();
  const Tensor a = RandomTensor({520, 264}, DType::kBF16, 600, -1, 1);
  const Tensor b = RandomTensor({264, 392}, DType::kBF16, 601, -1, 1);
  const Tensor acc0 = RandomTensor({520, 392}, DType::kF32, 602);
  const cuda::GemmStats s0 = cuda::GetGemmStats();
  Tensor got = Gpu(acc0);
  MatmulAccumulate(got, Gpu(a), Gpu(b), false, false);
  const cuda::GemmStats s1 = cuda::GetGemmStats();
  // The plan's candidates (cuBLASLt's heuristic answers; usually several for a bf16 GEMM of this
  // size): with two or more, tuning must have timed every one (a test that passed with tuning
  // never running would prove nothing); with one there is nothing to choose, and nothing is timed.
  const int64_t found = s1.candidates_found - s0.candidates_found;
  ASSERT_GE(found, 1) << "cuBLASLt offered no usable algorithm";
  if (TuningAllowed(AutotuneEnabled(), cuda::Deterministic()) && found >= 2) {
    EXPECT_EQ(s1.plans_tuned - s0.plans_tuned, 1) << "the first eager use did not tune the plan";
    EXPECT_EQ(s1.candidates_timed - s0.candidates_timed, found) << "not every candidate was timed";
  } else if (found == 1) {
    std::printf("cuBLASLt's heuristic returned 1 candidate for this shape: tuning not exercised\n");
    EXPECT_EQ(s1.plans_tuned, s0.plans_tuned) << "a plan with one candidate was tuned";
    EXPECT_EQ(s1.candidates_timed, s0.candidates_timed);
  } else {
    EXPECT_EQ(s1.plans_tuned, s0.plans_tuned) << "tuned although SHARDMAP_GEMM_AUTOTUNE=0 or "
                                                 "SHARDMAP_DETERMINISTIC is set";
  }
  Tensor want = acc0.Clone();
  MatmulAccumulate(want, a, b, false, false);
  ExpectMatches(got, want, "accumulate after tuning");
  const Tensor y1 = Matmul(Gpu(a), Gpu(b));
  const cuda::GemmStats s2 = cuda::GetGemmStats();
  const Tensor y2 = Matmul(Gpu(a), Gpu(b));
  const cuda::GemmStats s3 = cuda::GetGemmStats();
  EXPECT_EQ(s3.candidates_timed, s2.candidates_timed);
  EXPECT_EQ(Cpu(y1).ToVector<double>(), Cpu(y2).ToVector<double>());
  ExpectMatches(y1, Matmul(a, b), "matmul after tuning");
}

// A plan first met inside a graph capture is not timed there (no host sync in a capture): the
// graph uses the heuristic's first answer and the next eager call tunes the plan.
TEST(GemmCudaTest, AutotuneIsDeferredOutOfAGraphCapture) {
  SKIP_WITHOUT_GPU();
  const Tensor a = Gpu(RandomTensor({264, 136}, DType::kBF16, 610, -1, 1));
  const Tensor b = Gpu(RandomTensor({136, 200}, DType::kBF16, 611, -1, 1));
  Tensor y;
  cuda::CudaGraph graph(0);
  const cuda::GemmStats s0 = cuda::GetGemmStats();
  ASSERT_TRUE(graph.Capture([&] { y = Matmul(a, b); }).ok());
  const cuda::GemmStats s1 = cuda::GetGemmStats();
  EXPECT_EQ(s1.plans_tuned, s0.plans_tuned);
  EXPECT_EQ(s1.candidates_timed, s0.candidates_timed);
  ASSERT_TRUE(graph.Replay().ok());
  ExpectMatches(y, Matmul(Cpu(a), Cpu(b)), "captured matmul");
  const Tensor eager = Matmul(a, b);  // tunes now
  const cuda::GemmStats s2 = cuda::GetGemmStats();
  const int64_t found = s1.candidates_found - s0.candidates_found;  // the captured plan's
  ASSERT_GE(found, 1) << "cuBLASLt offered no usable algorithm";
  if (found == 1) {
    std::printf("cuBLASLt's heuristic returned 1 candidate for this shape: nothing to defer\n");
    EXPECT_EQ(s2.plans_tuned, s1.plans_tuned);
  } else if (TuningAllowed(AutotuneEnabled(), cuda::Deterministic())) {
    EXPECT_GT(s1.tunes_deferred, s0.tunes_deferred) << "the capture did not defer the tuning";
    EXPECT_EQ(s2.plans_tuned - s1.plans_tuned, 1) << "the eager call after did not tune";
    EXPECT_EQ(s2.candidates_timed - s1.candidates_timed, found);
  }
  ExpectMatches(eager, Matmul(Cpu(a), Cpu(b)), "eager matmul after the capture");
}

// --deterministic: no plan is tuned by timing (timings differ between processes), and the
// same call gives the same bits.
TEST(GemmCudaTest, DeterministicModeTimesNothing) {
  SKIP_WITHOUT_GPU();
  const bool before = cuda::Deterministic();
  cuda::SetDeterministic(true);
  const Tensor a = Gpu(RandomTensor({488, 328}, DType::kBF16, 620, -1, 1));
  const Tensor b = Gpu(RandomTensor({328, 216}, DType::kBF16, 621, -1, 1));
  const cuda::GemmStats s0 = cuda::GetGemmStats();
  const Tensor y1 = Matmul(a, b);
  const Tensor y2 = Matmul(a, b);
  const cuda::GemmStats s1 = cuda::GetGemmStats();
  cuda::SetDeterministic(before);
  EXPECT_EQ(s1.plans_tuned, s0.plans_tuned);
  EXPECT_EQ(s1.candidates_timed, s0.candidates_timed);
  EXPECT_EQ(Cpu(y1).ToVector<double>(), Cpu(y2).ToVector<double>());
  ExpectMatches(y1, Matmul(Cpu(a), Cpu(b)), "deterministic matmul");
}

TEST(GemmCudaTest, PlanCacheHitsAndNoRawMallocInSteadyState) {
  SKIP_WITHOUT_GPU();
  const Tensor a = Gpu(RandomTensor({256, 96}, DType::kBF16, 500));
  const Tensor b = Gpu(RandomTensor({96, 128}, DType::kBF16, 501));
  const Tensor bias = Gpu(RandomTensor({128}, DType::kBF16, 502));
  auto step = [&] {
    Tensor y = Matmul(a, b);
    LinearResult r = Linear(a, b, bias, LinearEpilogue::kBiasGelu);
    (void)y;
    (void)r;
  };
  step();  // warm: plans, workspace, cached output blocks
  cuda::Synchronize(0);
  const cuda::GemmStats s0 = cuda::GetGemmStats();
  const int64_t raw0 = cuda::DeviceAllocator(0).stats().raw_allocs;
  for (int i = 0; i < 10; ++i) step();
  cuda::Synchronize(0);
  const cuda::GemmStats s1 = cuda::GetGemmStats();
  EXPECT_EQ(s1.plans_created, s0.plans_created);
  EXPECT_EQ(s1.heuristic_queries, s0.heuristic_queries);
  EXPECT_EQ(s1.workspaces, s0.workspaces);
  EXPECT_EQ(s1.plans_tuned, s0.plans_tuned) << "a plan is tuned once, on its first call";
  EXPECT_EQ(s1.candidates_timed, s0.candidates_timed);
  EXPECT_GE(s1.plan_hits - s0.plan_hits, 20);
  EXPECT_GE(s1.matmuls - s0.matmuls, 20);
  EXPECT_EQ(cuda::DeviceAllocator(0).stats().raw_allocs, raw0) << "cudaMalloc in steady state";
}

TEST(GemmCudaTest, RankThreadsOnTheirOwnStreams) {
  SKIP_WITHOUT_GPU();
  constexpr int kThreads = 4;
  std::vector<Tensor> a(kThreads), b(kThreads), want(kThreads), got(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    a[t] = RandomTensor({64 + t, 40}, DType::kF32, 600 + t, -1, 1);
    b[t] = RandomTensor({40, 48}, DType::kF32, 700 + t, -1, 1);
    want[t] = Matmul(a[t], b[t]);
  }
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      cuda::StreamScope scope(0, cuda::NewStream(0));
      Tensor ga = Gpu(a[t]), gb = Gpu(b[t]);
      Tensor y;
      for (int i = 0; i < 20; ++i) y = Matmul(ga, gb);
      got[t] = Cpu(y);
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    ExpectAllClose(got[t], want[t].ToVector<double>(), 1e-4, 1e-4,
                   "thread " + std::to_string(t));
  }
}

TEST(GemmCudaTest, MixedDevicesAreAnError) {
  SKIP_WITHOUT_GPU();
  const Tensor a = Tensor::Zeros({2, 3}), b = Tensor::Zeros({3, 4});
  testing::ExpectOpError([&] { Matmul(Gpu(a), b); }, {"matmul", "different devices"});
  Tensor acc = Tensor::Zeros({2, 4});
  testing::ExpectOpError([&] { MatmulAccumulate(acc, Gpu(a), Gpu(b)); },
                         {"matmul_accumulate", "different devices"});
}

TEST(GemmCudaTest, WithoutGpuTheReasonIsNamed) {
  if (cuda::Available()) GTEST_SKIP() << "has a GPU";
  EXPECT_FALSE(cuda::UnavailableReason().empty());
}

}  // namespace
}  // namespace shardmap
