// Host-side checks of the fused attention's tiling, causal bounds and size checks (no GPU).
#include <algorithm>
#include <cstdint>
#include <string>

#include "gtest/gtest.h"
#include "tensor/cuda/attention/attention_ops.h"
#include "tensor/cuda/attention/tiling.h"
#include "tensor/error.h"

namespace shardmap::cuda::attention_kernels {
namespace {

TEST(AttentionTiling, PaddedHeadDim) {
  EXPECT_EQ(PaddedHeadDim(0), 0);
  EXPECT_EQ(PaddedHeadDim(1), 32);
  EXPECT_EQ(PaddedHeadDim(32), 32);
  EXPECT_EQ(PaddedHeadDim(33), 64);
  EXPECT_EQ(PaddedHeadDim(64), 64);
  EXPECT_EQ(PaddedHeadDim(72), 128);
  EXPECT_EQ(PaddedHeadDim(128), 128);
  EXPECT_EQ(PaddedHeadDim(129), 0);
}

// Every launch shape stays within sm_90's limits: threads per block a multiple of the warp and
// <= 1024, groups dividing the warp (the shuffles stay inside a warp), and shared memory under
// the opt-in maximum (227 KiB); above 48 KiB the launcher raises the kernel's limit.
TEST(AttentionTiling, LaunchShapesFitSm90) {
  for (int acc : {4, 8}) {
    for (int64_t d : {1, 8, 32, 40, 64, 80, 96, 128}) {
      for (const AttentionTiling& t :
           {ForwardTiling(24, 1023, d, acc), KeyGradTiling(24, 1023, d, acc)}) {
        SCOPED_TRACE(testing::Message() << "acc " << acc << " d " << d);
        ASSERT_GT(t.d_pad, 0);
        EXPECT_GE(t.d_pad, d);
        EXPECT_EQ(t.group * kPerThread, t.d_pad);
        EXPECT_EQ(32 % t.group, 0);
        EXPECT_EQ(t.threads, t.rows * t.group);
        EXPECT_EQ(t.threads % 32, 0);
        EXPECT_LE(t.threads, 1024);
        EXPECT_LE(t.smem, 227u * 1024);
      }
    }
  }
  // f32 tiles stay under the default 48 KiB (no attribute call on the hot path).
  EXPECT_LE(ForwardTiling(1, 1, 128, 4).smem, 48u * 1024);
  EXPECT_LE(KeyGradTiling(1, 1, 128, 4).smem, 48u * 1024);
}

TEST(AttentionTiling, BlocksCoverEveryRow) {
  const AttentionTiling f = ForwardTiling(/*batch_heads=*/6, /*tq=*/129, 64, 4);
  EXPECT_EQ(f.row_blocks, 3);  // 64 + 64 + 1
  EXPECT_EQ(f.blocks, 18);
  EXPECT_EQ(f.smem, 2u * 32 * 64 * 4);
  const AttentionTiling g = KeyGradTiling(6, 33, 64, 4);
  EXPECT_EQ(g.row_blocks, 2);  // 32 + 1
  EXPECT_EQ(g.blocks, 12);
  EXPECT_EQ(g.smem, (2u * 32 * 64 + 2 * 32) * 4);
  EXPECT_EQ(ForwardTiling(6, 0, 64, 4).blocks, 0);
  EXPECT_EQ(ForwardTiling(1, 5, 64, 8).tile, 16);  // f64 stages fewer keys
}

// VisibleKeyEnd / FirstQuerySeeing against the definition (key j visible to query i iff
// j <= i + offset), for every block of small problems and offsets of both signs.
TEST(AttentionTiling, CausalBoundsMatchTheMask) {
  for (int64_t tq : {1, 5, 64, 65, 130}) {
    for (int64_t tk : {1, 5, 64, 65, 130}) {
      for (int64_t off : {-tq - 1, int64_t{-3}, int64_t{0}, int64_t{2}, tk - tq, tk}) {
        for (int64_t first = 0; first < tq; first += 64) {
          int64_t want_end = 0;
          for (int64_t i = first; i < std::min(tq, first + 64); ++i) {
            for (int64_t j = 0; j < tk; ++j) {
              if (j <= i + off) want_end = std::max(want_end, j + 1);
            }
          }
          EXPECT_EQ(VisibleKeyEnd(first, 64, tq, tk, off), want_end)
              << "tq " << tq << " tk " << tk << " off " << off << " first " << first;
        }
        for (int64_t kf = 0; kf < tk; kf += 32) {
          // No query before FirstQuerySeeing sees any key of the block [kf, kf + 32).
          const int64_t f = FirstQuerySeeing(kf, off);
          for (int64_t i = 0; i < std::min(f, tq); ++i) {
            for (int64_t j = kf; j < std::min(tk, kf + 32); ++j) EXPECT_GT(j, i + off);
          }
          if (f < tq && f > 0) {
            EXPECT_LE(kf, f + off);  // the first one does see key kf
          }
        }
      }
    }
  }
}

TEST(AttentionSizes, HeadDimAndGridLimitsAreClearErrors) {
  EXPECT_NO_THROW(CheckCudaAttentionSizes(2, 12, 1024, 1024, 64));
  EXPECT_NO_THROW(CheckCudaAttentionSizes(2, 12, 1023, 1023, 100));
  try {
    CheckCudaAttentionSizes(2, 12, 16, 16, 256);
    FAIL() << "expected an OpError";
  } catch (const OpError& e) {
    const std::string m = e.status().ToString();
    EXPECT_NE(m.find("head_dim 256"), std::string::npos) << m;
    EXPECT_NE(m.find("materialised path"), std::string::npos) << m;
  }
  EXPECT_THROW(CheckCudaAttentionSizes(int64_t{1} << 20, 1 << 10, 1 << 12, 1 << 12, 64),
               OpError);
}

}  // namespace
}  // namespace shardmap::cuda::attention_kernels
