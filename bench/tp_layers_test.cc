// The TP layer cases of tp_bench (bench/tp_layers.h): the async TP row, the case checks, and the
// GPU backends: without a GPU they fail with the reason; with one (the GPU bundle runs this test)
// a small layer runs on virtual ranks sharing GPU 0 in f32 and bf16, timed by CUDA events.
#include "bench/tp_layers.h"

#include <string>

#include "gtest/gtest.h"
#include "tensor/cuda/runtime.h"

namespace shardmap::bench {
namespace {

bool Contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST(TpLayersTest, NamesCarryTheBackendAndDtypeOnGpus) {
  LayerCase c{Layer::kMlp, 2, true, true, 512, 512};
  EXPECT_EQ(c.Name(), "mlp/tp:2/tokens:512/d:512/sp/fwd_bwd");
  c.backend = Backend::kSharedGpu;
  c.dtype = DType::kBF16;
  EXPECT_EQ(c.Name(), "mlp/tp:2/tokens:512/d:512/sp/fwd_bwd/cuda_shared/bf16");
  c.layer = Layer::kAsyncMlp;
  c.backend = Backend::kGpuPerRank;
  EXPECT_EQ(c.Name(), "async_tp_mlp/tp:2/tokens:512/d:512/sp/fwd_bwd/cuda_per_gpu/bf16");
}

// Async TP runs its rings (ppermutes), not the SP MLP's all_gather / reduce_scatter, and costs
// the plain MLP's FLOPs.
TEST(TpLayersTest, AsyncTpRowRunsItsRings) {
  for (int tp : {2, 3}) {
    LayerCase c{Layer::kAsyncMlp, tp, true, true, /*tokens=*/12, /*d=*/4 * tp};
    c.head_dim = 4;
    SCOPED_TRACE(c.Name());
    absl::StatusOr<LayerTiming> t = RunLayer(c, 0, 1);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->seconds.size(), 1u);
    EXPECT_GT(t->seconds[0], 0);
    EXPECT_EQ(t->comm.by_op.count("all_gather"), 0u);
    EXPECT_EQ(t->comm.by_op.count("reduce_scatter"), 0u);
    EXPECT_GT(t->comm.by_op.count("ppermute") + t->comm.by_op.count("ppermute_start"), 0u);
    LayerCase mlp = c;
    mlp.layer = Layer::kMlp;
    EXPECT_DOUBLE_EQ(LayerFlops(c), LayerFlops(mlp));
    absl::StatusOr<LayerTiming> one = RunUnsharded(c, 0, 1);
    ASSERT_TRUE(one.ok()) << one.status();
  }
}

TEST(TpLayersTest, BadCasesAreErrors) {
  struct Case {
    LayerCase c;
    std::string want;
  };
  LayerCase async_no_sp{Layer::kAsyncMlp, 2, false, true, 12, 8};
  LayerCase sp_odd_tokens{Layer::kMlp, 2, true, true, 13, 8};
  sp_odd_tokens.seq_len = 13;
  LayerCase bf16_cpu{Layer::kMlp, 2, false, true, 12, 8};
  bf16_cpu.dtype = DType::kBF16;
  LayerCase f16_gpu{Layer::kMlp, 2, false, true, 12, 8};
  f16_gpu.dtype = DType::kF16;
  f16_gpu.backend = Backend::kSharedGpu;
  for (const Case& k : std::vector<Case>{{async_no_sp, "async TP (collective matmul) is the "
                                                       "sequence-parallel MLP; set sp"},
                                         {sp_odd_tokens, "tokens must be a multiple of tp"},
                                         {bf16_cpu, "the CPU backend runs f32 only"},
                                         {f16_gpu, "dtype f16 is not f32 or bf16"}}) {
    LayerCase c = k.c;
    c.head_dim = 4;
    absl::StatusOr<LayerTiming> t = RunLayer(c, 0, 1);
    ASSERT_FALSE(t.ok()) << c.Name();
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(Contains(std::string(t.status().message()), k.want)) << t.status();
  }
}

TEST(TpLayersTest, GpuBackendsWithoutAGpuFailWithTheReason) {
  if (cuda::Available()) GTEST_SKIP() << "a GPU is visible: GpuRowsRunOnOneGpu covers it";
  for (Backend b : {Backend::kSharedGpu, Backend::kGpuPerRank}) {
    LayerCase c{Layer::kMlp, 2, false, true, 12, 8};
    c.head_dim = 4;
    c.backend = b;
    absl::StatusOr<LayerTiming> t = RunLayer(c, 0, 1);
    ASSERT_FALSE(t.ok());
    EXPECT_EQ(t.status().code(), absl::StatusCode::kFailedPrecondition) << t.status();
    EXPECT_TRUE(Contains(std::string(t.status().message()), cuda::UnavailableReason()))
        << t.status();
    t = RunUnsharded(c, 0, 1);
    ASSERT_FALSE(t.ok());
    EXPECT_EQ(t.status().code(), absl::StatusCode::kFailedPrecondition) << t.status();
  }
  absl::StatusOr<double> s = TimeOnGpu([] {}, 0, 1);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
}

// On a GPU: every layer at TP 1 and 3 (a non-power-of-two count of virtual ranks on GPU 0), SP
// on and off, f32 and bf16, forward + backward: runs, and every step has an event time.
TEST(TpLayersTest, GpuRowsRunOnOneGpu) {
  if (!cuda::Available()) GTEST_SKIP() << "no GPU: " << cuda::UnavailableReason();
  for (Layer layer : {Layer::kColumn, Layer::kRow, Layer::kMlp, Layer::kAttention, Layer::kBlock,
                      Layer::kAsyncMlp}) {
    for (int tp : {1, 3}) {
      for (bool sp : {false, true}) {
        if (layer == Layer::kAsyncMlp && !sp) continue;
        for (DType dt : {DType::kF32, DType::kBF16}) {
          LayerCase c{layer, tp, sp, true, /*tokens=*/24, /*d=*/12};
          c.head_dim = 4;
          c.seq_len = 12;
          c.backend = Backend::kSharedGpu;
          c.dtype = dt;
          SCOPED_TRACE(c.Name());
          absl::StatusOr<LayerTiming> t = RunLayer(c, 1, 2);
          ASSERT_TRUE(t.ok()) << t.status();
          ASSERT_EQ(t->seconds.size(), 2u);
          ASSERT_EQ(t->fenced_seconds.size(), 2u);
          for (double s : t->seconds) EXPECT_GT(s, 0);
          absl::StatusOr<LayerTiming> one = RunUnsharded(c, 0, 1);
          ASSERT_TRUE(one.ok()) << one.status();
          EXPECT_GT(one->seconds[0], 0);
        }
      }
    }
  }
  absl::StatusOr<double> s = TimeOnGpu([] {}, 1, 3);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_GE(*s, 0);
}

}  // namespace
}  // namespace shardmap::bench
