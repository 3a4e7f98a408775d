// tp_bench's GPU profile: the parser (and its errors, naming the line), the line writers
// parsed back, and the intra-node link fitted from measured all_reduces.
#include "perfmodel/gpu_profile.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace shardmap::perfmodel {
namespace {

bool Contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST(GpuProfileTest, GemmShapeToStringAndFlops) {
  EXPECT_EQ(GemmShape({2, 4, 2, 4}).ToString(), "2 x 4x2x4");
  EXPECT_EQ(GemmShape({1, 8, 2, 4}).ToString(), "8x2x4");
  EXPECT_DOUBLE_EQ(GemmShape({3, 5, 7, 9}).Flops(), 2.0 * 3 * 5 * 7 * 9);
}

TEST(GpuProfileTest, ParsesAProfile) {
  const std::string text =
      "# a format sample\n"
      "device NVIDIA H100 80GB HBM3  \n"
      "gemm bf16 1 4096 2048 8192 0.000125\n"
      "gemm f32 32 128 64 128 2e-05   # batched\n"
      "\n"
      "collective all_reduce bf16 4 16777216 0.0003\n"
      "link all_gather 8 1048576 1.5e-05\n"
      "layer mlp/tp:2/tokens:4096/d:2048/sp/fwd_bwd/cuda_shared/bf16 0.0021 0.0025\n";
  absl::StatusOr<GpuProfile> p = ParseGpuProfile(text);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->device, "NVIDIA H100 80GB HBM3");
  EXPECT_DOUBLE_EQ(p->gemm_s.at({DType::kBF16, GemmShape{1, 4096, 2048, 8192}}), 0.000125);
  EXPECT_DOUBLE_EQ(p->gemm_s.at({DType::kF32, GemmShape{32, 128, 64, 128}}), 2e-5);
  EXPECT_DOUBLE_EQ(
      p->collective_s.at({CollectiveKind::kAllReduce, DType::kBF16, 4, 16777216.0}), 3e-4);
  EXPECT_DOUBLE_EQ(p->link_s.at({CollectiveKind::kAllGather, 8, 1048576.0}), 1.5e-5);
  const auto& l = p->layers.at("mlp/tp:2/tokens:4096/d:2048/sp/fwd_bwd/cuda_shared/bf16");
  EXPECT_DOUBLE_EQ(l.seconds, 0.0021);
  EXPECT_DOUBLE_EQ(l.fenced_seconds, 0.0025);
}

TEST(GpuProfileTest, WrittenLinesParseBack) {
  const std::string text = absl::StrCat(
      GemmLine(DType::kBF16, {3, 5, 7, 9}, 1.25e-4), "\n",
      CollectiveLine(CollectiveKind::kReduceScatter, DType::kF32, 8, 33554432, 4.5e-4), "\n",
      LinkLine(CollectiveKind::kAllReduce, 2, 1024, 1e-5), "\n",
      LayerLine("block/tp:8/tokens:64/d:128/fwd/cuda_shared/f32", 1e-3, 2e-3), "\n");
  absl::StatusOr<GpuProfile> p = ParseGpuProfile(text);
  ASSERT_TRUE(p.ok()) << p.status() << "\n" << text;
  EXPECT_DOUBLE_EQ(p->gemm_s.at({DType::kBF16, GemmShape{3, 5, 7, 9}}), 1.25e-4);
  EXPECT_DOUBLE_EQ(
      p->collective_s.at({CollectiveKind::kReduceScatter, DType::kF32, 8, 33554432.0}), 4.5e-4);
  EXPECT_DOUBLE_EQ(p->link_s.at({CollectiveKind::kAllReduce, 2, 1024.0}), 1e-5);
  EXPECT_DOUBLE_EQ(p->layers.at("block/tp:8/tokens:64/d:128/fwd/cuda_shared/f32").seconds, 1e-3);
}

TEST(GpuProfileTest, BadProfileLinesNameTheLine) {
  struct Case {
    std::string text, want;
  };
  for (const Case& c : std::vector<Case>{
           {"gemm f32 1 2 3 4 1e-3\ngemm f16 1 2 3 4 1e-3\n", "line 2"},
           {"gemm f32 1 2 3 1e-3\n", "gemm <f32|bf16> <batch>"},
           {"gemm f32 1 0 3 4 1e-3\n", "sizes >= 1"},
           {"gemm f32 1 2 3 4 -1\n", "seconds > 0"},
           {"gemm f32 1 2 3 4 nan\n", "seconds > 0"},
           {"collective all_to_all f32 2 8 1e-3\n", "all_reduce|all_gather|reduce_scatter"},
           {"link all_reduce 1 8 1e-3\n", "t >= 2"},
           {"layer mlp 1e-3\n", "layer <name> <seconds> <fenced_seconds>"},
           {"\n\nbogus 1 2\n", "line 3"},
       }) {
    absl::StatusOr<GpuProfile> p = ParseGpuProfile(c.text);
    ASSERT_FALSE(p.ok()) << c.text;
    EXPECT_TRUE(Contains(std::string(p.status().message()), c.want))
        << p.status() << " (want " << c.want << ")";
  }
}

TEST(GpuProfileTest, LinksFromMeasuredAllReduces) {
  GpuProfile p;
  EXPECT_TRUE(Contains(LinksFromProfile(p).intra_source, "NVLink"));
  EXPECT_TRUE(Contains(LinksFromProfile(p).inter_source, "400 Gb/s"));
  // all_reduce over 4 GPUs: 10 us + bytes * 5e-12 s/B -> bus bandwidth 2 * 3/4 / 5e-12 = 300 GB/s.
  p.link_s[{CollectiveKind::kAllReduce, 4, 1e6}] = 1e-5 + 1e6 * 5e-12;
  p.link_s[{CollectiveKind::kAllReduce, 4, 2e6}] = 1e-5 + 2e6 * 5e-12;
  p.link_s[{CollectiveKind::kAllReduce, 2, 1e6}] = 1.0;  // one size only at t = 2: not fitted
  const ClusterLinks l = LinksFromProfile(p);
  EXPECT_NEAR(l.intra.busbw, 300e9, 1e3);
  EXPECT_NEAR(l.intra.alpha_s, 1e-5, 1e-12);
  EXPECT_TRUE(Contains(l.intra_source, "measured: all_reduce over 4 GPUs")) << l.intra_source;
  EXPECT_DOUBLE_EQ(l.inter.busbw, 50e9);
}

}  // namespace
}  // namespace shardmap::perfmodel
