// Host-side checks of the tensor-core attention's eligibility, kernel choice (environment
// variable included) and shared-memory layouts: every WMMA operand origin 32-byte aligned,
// ldm multiples of 8 (16-bit) and 4 (f32), regions disjoint and within sm_90's 227 KiB.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tensor/cuda/attention/attention_ops.h"
#include "tensor/cuda/attention/tc_tiling.h"
#include "tensor/error.h"

namespace shardmap::cuda::attention_kernels {
namespace {

TEST(TcEligibility, Bf16AndF16AtHeadDim64And128Only) {
  for (DType t : {DType::kBF16, DType::kF16}) {
    EXPECT_TRUE(TensorCoreEligible(t, 64));
    EXPECT_TRUE(TensorCoreEligible(t, 128));
    for (int64_t d : {1, 16, 32, 63, 65, 96, 127, 129, 256}) EXPECT_FALSE(TensorCoreEligible(t, d));
  }
  for (DType t : {DType::kF32, DType::kF64, DType::kI32}) {
    EXPECT_FALSE(TensorCoreEligible(t, 64));
    EXPECT_FALSE(TensorCoreEligible(t, 128));
  }
  EXPECT_TRUE(UseTensorCores(DType::kBF16, 64, AttentionKernel::kAuto, true));
  EXPECT_TRUE(UseTensorCores(DType::kF16, 128, AttentionKernel::kTensorCore, true));
  EXPECT_FALSE(UseTensorCores(DType::kBF16, 64, AttentionKernel::kSimt, true));
  EXPECT_FALSE(UseTensorCores(DType::kBF16, 64, AttentionKernel::kAuto, false));  // unaligned
  EXPECT_FALSE(UseTensorCores(DType::kF32, 64, AttentionKernel::kAuto, true));
}

// The regions of a layout in byte ranges [begin, end).
struct Region {
  const char* name;
  size_t begin, end;
};

void CheckLayout(const TcLayout& l, const std::vector<Region>& regions) {
  EXPECT_LE(l.total, kTcMaxSmem);
  for (const Region& r : regions) {
    SCOPED_TRACE(r.name);
    EXPECT_EQ(r.begin % 128, 0u);
    EXPECT_LE(r.end, l.total);
    for (const Region& o : regions) {
      if (&o != &r) {
        EXPECT_TRUE(r.end <= o.begin || o.end <= r.begin) << "overlaps " << o.name;
      }
    }
  }
}

TEST(TcLayout, RegionsAreAlignedDisjointAndFit) {
  for (int hd : {64, 128}) {
    SCOPED_TRACE(testing::Message() << "head_dim " << hd);
    const size_t half_tile = size_t{2} * kTcRows * TcHalfLd(hd);
    const size_t score = size_t{4} * kTcRows * kTcScoreLd;
    const size_t prob = size_t{2} * kTcRows * kTcProbLd;
    const TcLayout f = TcForwardLayout(hd);
    CheckLayout(f, {{"q", f.a, f.a + half_tile},
                    {"k", f.b, f.b + half_tile},
                    {"v", f.c, f.c + half_tile},
                    {"s", f.s, f.s + score},
                    {"p", f.p, f.p + prob},
                    {"o", f.o, f.o + size_t{4} * kTcRows * TcOutLd(hd)},
                    {"stats", f.stats, f.stats + size_t{4} * 2 * kTcRows}});
    const TcLayout g = TcBackwardLayout(hd);
    CheckLayout(g, {{"a", g.a, g.a + half_tile},
                    {"b", g.b, g.b + half_tile},
                    {"c", g.c, g.c + half_tile},
                    {"d", g.d, g.d + half_tile},
                    {"s", g.s, g.s + score},
                    {"dp", g.dp, g.dp + score},
                    {"p", g.p, g.p + prob},
                    {"ds", g.ds, g.ds + prob},
                    {"stats", g.stats, g.stats + size_t{4} * 2 * kTcRows}});
    // The backward kernels stage each warp's f32 output rows in s + dp (contiguous).
    EXPECT_EQ(g.dp, g.s + score);
    EXPECT_LE(kTcWarps * TcWarpOutStage(hd), 2 * score);
    EXPECT_EQ(TcWarpOutStage(hd) % 32, 0u);
    // Both exceed the default 48 KiB (the launcher raises the limit) and leave room for 2
    // blocks per SM at head_dim 64.
    EXPECT_GT(f.total, 48u * 1024);
    EXPECT_GT(g.total, 48u * 1024);
    if (hd == 64) {
      EXPECT_LE(2 * g.total, kTcMaxSmem);
    }
  }
}

// WMMA: ldm a multiple of 8 elements for 16-bit tiles and of 4 for f32; every fragment origin
// (row multiple of 16, column multiple of 16) 32-byte aligned given a 128-byte aligned region.
TEST(TcLayout, FragmentOriginsAre32ByteAligned) {
  for (int hd : {64, 128}) {
    EXPECT_EQ(TcHalfLd(hd) % 8, 0);
    EXPECT_EQ(TcOutLd(hd) % 4, 0);
    EXPECT_EQ((TcHalfLd(hd) * 2) % 16, 0);  // 16-byte vector stores of staged rows
    for (int r = 0; r < kTcRows; r += kTcFrag) {
      for (int c = 0; c < hd; c += kTcFrag) {
        EXPECT_EQ((size_t{2} * (r * TcHalfLd(hd) + c)) % 32, 0u);
        EXPECT_EQ((size_t{4} * (r * TcOutLd(hd) + c)) % 32, 0u);
      }
      for (int c = 0; c < kTcCols; c += kTcFrag) {
        EXPECT_EQ((size_t{4} * (r * kTcScoreLd + c)) % 32, 0u);
        EXPECT_EQ((size_t{2} * (r * kTcProbLd + c)) % 32, 0u);
      }
    }
    // A warp's output staging: rows [0, 16) of [16][hd + 4] f32 from w * TcWarpOutStage.
    for (int w = 0; w < kTcWarps; ++w) EXPECT_EQ((w * TcWarpOutStage(hd)) % 32, 0u);
  }
  EXPECT_EQ(kTcScoreLd % 4, 0);
  EXPECT_EQ(kTcProbLd % 8, 0);
  EXPECT_EQ(kTcRows, kTcWarps * kTcFrag);
  EXPECT_EQ(kTcCols % (2 * kTcFrag), 0);  // lane pairs split the columns
}

TEST(TcLayout, RowBlocksCoverEveryRow) {
  EXPECT_EQ(TcRowBlocks(0), 0);
  EXPECT_EQ(TcRowBlocks(1), 1);
  EXPECT_EQ(TcRowBlocks(64), 1);
  EXPECT_EQ(TcRowBlocks(65), 2);
  EXPECT_EQ(TcRowBlocks(1024), 16);
}

// Sets SHARDMAP_ATTENTION_KERNEL for one scope and restores it after.
class ScopedKernelEnv {
 public:
  explicit ScopedKernelEnv(const char* value) {
    const char* old = std::getenv(kName);
    had_ = old != nullptr;
    if (had_) old_ = old;
    if (value == nullptr) {
      unsetenv(kName);
    } else {
      setenv(kName, value, 1);
    }
  }
  ~ScopedKernelEnv() {
    if (had_) {
      setenv(kName, old_.c_str(), 1);
    } else {
      unsetenv(kName);
    }
  }

 private:
  static constexpr const char* kName = "SHARDMAP_ATTENTION_KERNEL";
  bool had_ = false;
  std::string old_;
};

TEST(TcChoice, EnvironmentAndRequestsResolve) {
  using cuda::ResolveAttentionKernel;
  {
    ScopedKernelEnv env(nullptr);
    EXPECT_EQ(ResolveAttentionKernel(AttentionKernel::kAuto, DType::kBF16, 64),
              AttentionKernel::kTensorCore);
    EXPECT_EQ(ResolveAttentionKernel(AttentionKernel::kAuto, DType::kF32, 64),
              AttentionKernel::kSimt);
    EXPECT_EQ(ResolveAttentionKernel(AttentionKernel::kAuto, DType::kF16, 96),
              AttentionKernel::kSimt);
    EXPECT_EQ(ResolveAttentionKernel(AttentionKernel::kSimt, DType::kBF16, 128),
              AttentionKernel::kSimt);
    EXPECT_EQ(ResolveAttentionKernel(AttentionKernel::kTensorCore, DType::kF16, 128),
              AttentionKernel::kTensorCore);
  }
  {
    ScopedKernelEnv env("simt");
    EXPECT_EQ(ResolveAttentionKernel(AttentionKernel::kAuto, DType::kBF16, 64),
              AttentionKernel::kSimt);
    // An explicit request wins over the environment.
    EXPECT_EQ(ResolveAttentionKernel(AttentionKernel::kTensorCore, DType::kBF16, 64),
              AttentionKernel::kTensorCore);
  }
  for (const char* v : {"tc", "auto", ""}) {
    ScopedKernelEnv env(v);
    EXPECT_EQ(ResolveAttentionKernel(AttentionKernel::kAuto, DType::kBF16, 64),
              AttentionKernel::kTensorCore)
        << v;
  }
}

TEST(TcChoice, BadRequestsAreClearErrors) {
  {
    ScopedKernelEnv env("wmma");
    try {
      cuda::AttentionKernelFromEnv();
      FAIL() << "expected an OpError";
    } catch (const OpError& e) {
      const std::string m = e.status().ToString();
      EXPECT_NE(m.find("SHARDMAP_ATTENTION_KERNEL='wmma'"), std::string::npos) << m;
      EXPECT_NE(m.find("simt, tc, auto"), std::string::npos) << m;
    }
  }
  ScopedKernelEnv env(nullptr);
  try {
    cuda::ResolveAttentionKernel(AttentionKernel::kTensorCore, DType::kF32, 64);
    FAIL() << "expected an OpError";
  } catch (const OpError& e) {
    const std::string m = e.status().ToString();
    EXPECT_NE(m.find("bf16 or f16 with head_dim 64 or 128"), std::string::npos) << m;
    EXPECT_NE(m.find("f32 with head_dim 64"), std::string::npos) << m;
  }
  EXPECT_THROW(cuda::ResolveAttentionKernel(AttentionKernel::kTensorCore, DType::kBF16, 96),
               OpError);
}

}  // namespace
}  // namespace shardmap::cuda::attention_kernels
