#include "models/planner/hardware_profile.h"

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "perfmodel/gpu_profile.h"

namespace shardmap::planner {
namespace {

constexpr char kMinimal[] = R"(# a comment
name tiny
source somewhere
memory_bytes 1e9
memory_bandwidth 1e10   # trailing comment
gemm f32 16 1e9
gemm f32 256 4e9
link intra 1e-6 1e9
)";

TEST(HardwareProfileTest, ShippedProfilesParseWithSources) {
  for (const char* name : {"a100_node", "h100_node", "h200_node"}) {
    absl::StatusOr<HardwareProfile> p = LoadHardwareProfile(name);
    ASSERT_TRUE(p.ok()) << name << ": " << p.status();
    EXPECT_EQ(p->name, name);
    EXPECT_GE(p->sources.size(), 3u);
    EXPECT_EQ(p->gpus_per_node, 8);
    EXPECT_GT(p->inter.busbw, 0);
    EXPECT_LT(p->inter.busbw, p->intra.busbw);
    EXPECT_GE(p->peak_flops.at(DType::kBF16), 312e12);
  }
  // A100: the measured 267.9 TFLOP/s ceiling for large GEMMs, the roofline below it for thin
  // ones (a smallest dimension of 64: 64 flops per byte at 1.63 TB/s).
  absl::StatusOr<HardwareProfile> a100 = LoadHardwareProfile("a100_node");
  ASSERT_TRUE(a100.ok());
  GemmWork big{.m = 8192, .n = 8192, .k = 8192, .dtype = DType::kBF16};
  EXPECT_NEAR(big.flops() / *a100->GemmSeconds(big), 267.9e12, 1e9);
  GemmWork thin{.m = 8192, .n = 8192, .k = 64, .dtype = DType::kBF16};
  EXPECT_NEAR(thin.flops() / *a100->GemmSeconds(thin), 64 * 1.63e12, 1e11);  // 4 digits
  EXPECT_NEAR(a100->memory_bytes, 85.06e9, 1e7);
  EXPECT_DOUBLE_EQ(a100->overlap, 0);  // no overlap constant in any shipped profile
  EXPECT_GT(LoadHardwareProfile("h200_node")->memory_bytes,
            LoadHardwareProfile("h100_node")->memory_bytes);
  // The shipped set is models/planner/profiles/*.txt, as hardware_profile.h names it (no
  // cpu_reference: a CPU profile is measured, measure_cpu.h).
  EXPECT_EQ(ShippedProfileNames(),
            (std::vector<std::string>{"a100_node", "h100_node", "h200_node"}));
  EXPECT_DOUBLE_EQ(LoadHardwareProfile("h100_node")->overlap, 0);
}

TEST(HardwareProfileTest, UnknownProfileNamesTheShippedOnes) {
  absl::StatusOr<HardwareProfile> p = LoadHardwareProfile("tpu_v9");
  EXPECT_EQ(p.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(p.status().message(), "h100_node")) << p.status();
}

TEST(HardwareProfileTest, GemmRateInterpolatesLogLinearlyAndClamps) {
  absl::StatusOr<HardwareProfile> p = ParseHardwareProfile(kMinimal);
  ASSERT_TRUE(p.ok()) << p.status();
  // min dim 64 is halfway between 16 and 256 in log2: rate 2.5e9.
  GemmWork g{.m = 64, .n = 1000, .k = 1000};
  EXPECT_NEAR(*p->GemmSeconds(g), g.flops() / 2.5e9, 1e-12);
  GemmWork small{.m = 2, .n = 2, .k = 2, .count = 3};
  EXPECT_NEAR(*p->GemmSeconds(small), 48 / 1e9, 1e-18);
  GemmWork big{.batch = 2, .m = 1000, .n = 1000, .k = 1000};
  EXPECT_NEAR(*p->GemmSeconds(big), 4e9 / 4e9, 1e-12);
  GemmWork bf{.m = 8, .n = 8, .k = 8, .dtype = DType::kBF16};
  EXPECT_TRUE(absl::StrContains(p->GemmSeconds(bf).status().message(), "no GEMM rate for bf16"));
}

TEST(HardwareProfileTest, ShapeExactRateReplacesTheCurveForThatShapeOnly) {
  HardwareProfile p = *ParseHardwareProfile(kMinimal);
  // Curve rate for min dim 64: 2.5e9 (above). The exact entry is for the transposed-b product.
  GemmWork nt{.batch = 2, .m = 64, .n = 1000, .k = 1000, .count = 3, .trans_b = true};
  p.gemm_exact[GemmKey::Of(nt)] = 1e9;
  EXPECT_NEAR(*p.GemmSeconds(nt), nt.flops() / 1e9, 1e-12);  // count 3 included
  // Same dims, other layout, batch or dtype: the curve.
  GemmWork nn = nt;
  nn.trans_b = false;
  EXPECT_NEAR(*p.GemmSeconds(nn), nn.flops() / 2.5e9, 1e-12);
  GemmWork ta = nt;
  ta.trans_a = true;
  EXPECT_NEAR(*p.GemmSeconds(ta), ta.flops() / 2.5e9, 1e-12);
  GemmWork b1 = nt;
  b1.batch = 1;
  EXPECT_NEAR(*p.GemmSeconds(b1), b1.flops() / 2.5e9, 1e-12);
  GemmWork bf = nt;
  bf.dtype = DType::kBF16;
  EXPECT_FALSE(p.GemmSeconds(bf).ok());  // no bf16 curve, and the exact entry is f32
  p.gemm_exact[GemmKey::Of(bf)] = 5e9;
  EXPECT_NEAR(*p.GemmSeconds(bf), bf.flops() / 5e9, 1e-12);
}

TEST(HardwareProfileTest, ShapeExactRatesRoundTripAndBadLinesAreNamed) {
  HardwareProfile p = *ParseHardwareProfile(kMinimal);
  p.gemm_exact[{.batch = 16, .m = 64, .n = 64, .k = 32, .trans_b = true}] = 3.5e9;
  p.gemm_exact[{.batch = 1, .m = 1024, .n = 384, .k = 128, .trans_a = true}] = 7.25e9;
  absl::StatusOr<HardwareProfile> back = ParseHardwareProfile(p.ToText());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->gemm_exact, p.gemm_exact);
  for (const char* bad : {"gemm_shape f32 1 2 3 4 0 0", "gemm_shape f32 0 2 3 4 0 0 1e9",
                          "gemm_shape f32 1 2 3 4 2 0 1e9", "gemm_shape f32 1 2.5 3 4 0 0 1e9",
                          "gemm_shape f32 1 2 3 4 0 0 0", "gemm_shape q8 1 2 3 4 0 0 1e9"}) {
    absl::StatusOr<HardwareProfile> q = ParseHardwareProfile(absl::StrCat(kMinimal, bad, "\n"));
    EXPECT_EQ(q.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_TRUE(absl::StrContains(q.status().message(), "line 9")) << q.status();
    EXPECT_TRUE(absl::StrContains(q.status().message(), "gemm_shape <dtype>")) << q.status();
  }
}

TEST(HardwareProfileTest, OtherOpsAreBandwidthOrFlopBound) {
  HardwareProfile p = *ParseHardwareProfile(kMinimal);
  EXPECT_NEAR(*p.OtherSeconds({"gelu", DType::kF32, 1e9, 1e10}), 1.0, 1e-12);
  p.vector_flops = 1e8;
  EXPECT_NEAR(*p.OtherSeconds({"gelu", DType::kF32, 1e9, 1e10}), 10.0, 1e-12);
  OtherWork attn{"attention", DType::kF32, 4e9, 0, true};
  EXPECT_NEAR(*p.OtherSeconds(attn), 1.0, 1e-12);  // the largest GEMM rate
  p.attention[DType::kF32] = 2e9;
  EXPECT_NEAR(*p.OtherSeconds(attn), 2.0, 1e-12);
}

TEST(HardwareProfileTest, MeasuredOpRateReplacesBandwidthForThatOpAndDtypeOnly) {
  HardwareProfile p = *ParseHardwareProfile(kMinimal);
  p.vector_flops = 1e8;
  p.op_rate[{"layer_norm", DType::kF32}] = 2.5e9;
  // Its own rate, bytes only (the measured rate already includes its arithmetic).
  EXPECT_NEAR(*p.OtherSeconds({"layer_norm", DType::kF32, 1e9, 1e10}), 4.0, 1e-12);
  // Another dtype or name: the bandwidth and flop bound as before.
  EXPECT_NEAR(*p.OtherSeconds({"layer_norm", DType::kF64, 1e9, 1e10}), 10.0, 1e-12);
  EXPECT_NEAR(*p.OtherSeconds({"gelu", DType::kF32, 1e6, 1e10}), 1.0, 1e-12);
  absl::StatusOr<HardwareProfile> back = ParseHardwareProfile(p.ToText());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->op_rate, p.op_rate);
  for (const char* bad : {"op_rate layer_norm f32", "op_rate layer_norm f32 0",
                          "op_rate layer_norm q8 1e9", "op_rate layer_norm f32 -1e9"}) {
    absl::StatusOr<HardwareProfile> q = ParseHardwareProfile(absl::StrCat(kMinimal, bad, "\n"));
    EXPECT_EQ(q.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_TRUE(absl::StrContains(q.status().message(), "line 9")) << q.status();
    EXPECT_TRUE(absl::StrContains(q.status().message(), "op_rate <op> <dtype>")) << q.status();
  }
}

TEST(HardwareProfileTest, SharedOpRatesApplyByTheRanksComputingAtOnce) {
  HardwareProfile p = *ParseHardwareProfile(kMinimal);
  p.op_rate[{"add", DType::kF32}] = 4e9;  // 1 GB: 0.25 s alone
  p.shared_op_rate_threads = 3;
  p.shared_op_rate[{"add", DType::kF32}] = 1e9;  // 1 s with 3 ranks at once
  const OtherWork add{"add", DType::kF32, 0, 1e9};
  EXPECT_NEAR(*p.OtherSeconds(add), 0.25, 1e-12);  // one rank (concurrent_ranks 1)
  EXPECT_NEAR(*p.ForConcurrentRanks(1).OtherSeconds(add), 0.25, 1e-12);
  EXPECT_NEAR(*p.ForConcurrentRanks(2).OtherSeconds(add), 0.625, 1e-12);  // halfway, linear
  EXPECT_NEAR(*p.ForConcurrentRanks(3).OtherSeconds(add), 1.0, 1e-12);
  EXPECT_NEAR(*p.ForConcurrentRanks(8).OtherSeconds(add), 1.0, 1e-12);  // no more than measured
  // A shared rate faster than the lone one (the lone measurement's noise) does not lower it.
  p.shared_op_rate[{"add", DType::kF32}] = 8e9;
  EXPECT_NEAR(*p.ForConcurrentRanks(3).OtherSeconds(add), 0.25, 1e-12);
  p.shared_op_rate[{"add", DType::kF32}] = 1e9;
  // A kind without a shared rate keeps its own price (the bandwidth, 1e10 B/s here).
  EXPECT_NEAR(*p.ForConcurrentRanks(3).OtherSeconds({"mul", DType::kF32, 0, 1e9}), 0.1, 1e-12);
  absl::StatusOr<HardwareProfile> back = ParseHardwareProfile(p.ToText());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->shared_op_rate, p.shared_op_rate);
  EXPECT_EQ(back->shared_op_rate_threads, 3);
  for (const char* bad : {"shared_op_rate 1 add f32 1e9", "shared_op_rate 2.5 add f32 1e9",
                          "shared_op_rate 2 add q8 1e9", "shared_op_rate 2 add f32 0",
                          "shared_op_rate 2 add f32", "shared_op_rate 2 add f32 1e9\n"
                                                      "shared_op_rate 3 mul f32 1e9"}) {
    absl::StatusOr<HardwareProfile> q = ParseHardwareProfile(absl::StrCat(kMinimal, bad, "\n"));
    EXPECT_EQ(q.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_TRUE(absl::StrContains(q.status().message(), "shared_op_rate <threads >= 2"))
        << q.status();
  }
}

TEST(HardwareProfileTest, OversubscribedSyncIsLinearBetweenEntriesAndZeroWithinTheCores) {
  HardwareProfile p = *ParseHardwareProfile(
      absl::StrCat(kMinimal, "cores 2\noversubscribed_sync 4 2e-3\noversubscribed_sync 8 6e-3\n"));
  EXPECT_EQ(p.OversubscribedSyncSeconds(2), 0);  // a core each
  EXPECT_NEAR(p.OversubscribedSyncSeconds(3), 1e-3, 1e-15);  // from 0 at the cores
  EXPECT_EQ(p.OversubscribedSyncSeconds(4), 2e-3);
  EXPECT_NEAR(p.OversubscribedSyncSeconds(6), 4e-3, 1e-15);
  EXPECT_EQ(p.OversubscribedSyncSeconds(16), 6e-3);  // above the last: the nearest
  absl::StatusOr<HardwareProfile> back = ParseHardwareProfile(p.ToText());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->oversubscribed_sync, p.oversubscribed_sync);
  p.cores = 1.99;  // effective cores just under the threads: almost nothing at 2 ranks
  EXPECT_LT(p.OversubscribedSyncSeconds(2), 1e-5);
  p.cores = 0;  // a device each (GPUs): never
  EXPECT_EQ(p.OversubscribedSyncSeconds(16), 0);
  for (const char* bad : {"oversubscribed_sync 1 1e-3", "oversubscribed_sync 4.5 1e-3",
                          "oversubscribed_sync 4 -1", "oversubscribed_sync 4"}) {
    absl::StatusOr<HardwareProfile> q = ParseHardwareProfile(absl::StrCat(kMinimal, bad, "\n"));
    EXPECT_EQ(q.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_TRUE(absl::StrContains(q.status().message(), "oversubscribed_sync <ranks >= 2>"))
        << q.status();
  }
}

TEST(HardwareProfileTest, RoundTripsThroughText) {
  HardwareProfile p = *LoadHardwareProfile("h100_node");
  p.fitted[{"all_reduce", 4}] = {1e-5, 2e-10};
  absl::StatusOr<HardwareProfile> q = ParseHardwareProfile(p.ToText());
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->ToText(), p.ToText());
}

TEST(HardwareProfileTest, ErrorsNameTheLineOrTheMissingKey) {
  auto err = [](const std::string& text) {
    return std::string(ParseHardwareProfile(text).status().message());
  };
  EXPECT_TRUE(absl::StrContains(err(std::string(kMinimal) + "gemm f32 x 1\n"),
                                "line 9 'gemm f32 x 1': expected 'gemm <dtype>"));
  EXPECT_TRUE(absl::StrContains(err(std::string(kMinimal) + "warp_speed 9\n"), "line 9"));
  EXPECT_TRUE(absl::StrContains(err(std::string(kMinimal) + "gemm q8 16 1e9\n"), "line 9"));
  EXPECT_TRUE(absl::StrContains(err(std::string(kMinimal) + "overlap 1.5\n"), "fraction"));
  EXPECT_TRUE(absl::StrContains(err(std::string(kMinimal) + "link intra 1e-6 -1\n"), "line 9"));
  EXPECT_TRUE(absl::StrContains(err(std::string(kMinimal) + "memory_bytes nan\n"), "line 9"));
  EXPECT_TRUE(absl::StrContains(err("memory_bytes 1\n"), "no 'name' line"));
  EXPECT_TRUE(absl::StrContains(err("name a\nmemory_bandwidth 1\n"), "no 'memory_bytes'"));
  EXPECT_TRUE(absl::StrContains(err("name a\nmemory_bytes 1\ngemm f32 1 1\nlink intra 0 1\n"),
                                "no 'memory_bandwidth'"));
  EXPECT_TRUE(absl::StrContains(err("name a\nmemory_bytes 1\nmemory_bandwidth 1\nlink intra 0 1\n"),
                                "no 'gemm'"));
  EXPECT_TRUE(absl::StrContains(err("name a\nmemory_bytes 1\nmemory_bandwidth 1\ngemm f32 1 1\n"),
                                "no 'link intra'"));
  EXPECT_TRUE(absl::StrContains(
      err(std::string(kMinimal) + "memory_reserved_bytes 2e9\n"), "memory_reserved_bytes >="));
}

TEST(HardwareProfileTest, FromTpBenchProfileTakesMeasuredGemmsAndLinks) {
  absl::StatusOr<perfmodel::GpuProfile> m = perfmodel::ParseGpuProfile(
      "device Test GPU\n"
      "gemm bf16 1 4096 4096 4096 2e-4\n"    // 1.37e12 flops / 2e-4 s = 6.87e14
      "gemm bf16 1 4096 1024 4096 1e-4\n"    // min dim 1024: 3.4e14
      "link all_reduce 8 1000000 2e-5\n"
      "link all_reduce 8 100000000 5e-4\n");
  ASSERT_TRUE(m.ok()) << m.status();
  absl::StatusOr<HardwareProfile> p = FromTpBenchProfile(*m, *LoadHardwareProfile("h100_node"));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->name, "h100_node_measured");
  ASSERT_EQ(p->gemm.at(DType::kBF16).size(), 2u);
  EXPECT_NEAR(p->gemm.at(DType::kBF16)[1].second, 2.0 * 4096 * 4096 * 4096 / 2e-4, 1e3);
  EXPECT_NEAR(p->gemm.at(DType::kBF16)[0].first, 1024, 0);
  EXPECT_NE(p->intra.busbw, 360e9);  // fitted from the link lines
  EXPECT_TRUE(absl::StrContains(p->sources.back(), "Test GPU"));
  EXPECT_FALSE(FromTpBenchProfile(perfmodel::GpuProfile{}, *p).ok());
}

TEST(HardwareProfileTest, CollectivesBenchJsonBecomesFittedCosts) {
  const std::string json = R"({"context": {}, "benchmarks": [
    {"name": "all_reduce/backend:in_process/world:4/bytes:1000", "real_time": 110, "time_unit": "us"},
    {"name": "all_reduce/backend:in_process/world:4/bytes:101000", "real_time": 210, "time_unit": "us"},
    {"name": "all_gather/backend:in_process/world:2/bytes:2000", "real_time": 10, "time_unit": "us"},
    {"name": "all_gather/backend:in_process/world:2/bytes:4000", "real_time": 20, "time_unit": "us"},
    {"name": "all_reduce/backend:gloo/world:4/bytes:1000", "real_time": 9999, "time_unit": "us"},
    {"name": "BM_Memcpy/4096", "real_time": 1, "time_unit": "us"}]})";
  absl::StatusOr<HardwareProfile> p = WithCollectivesBench(json, *ParseHardwareProfile(kMinimal));
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->fitted.size(), 2u);
  const FittedCollective ar = p->fitted.at({"all_reduce", 4});
  EXPECT_NEAR(ar.alpha_s, 109e-6, 1e-9);  // 110 us less 1000 bytes at 1 ns
  EXPECT_NEAR(ar.seconds_per_byte, 1e-9, 1e-15);
  // all_gather: bytes per rank = bytes / world: 1000 and 2000 bytes -> 10 us and 20 us.
  EXPECT_NEAR(p->fitted.at({"all_gather", 2}).seconds_per_byte, 1e-8, 1e-14);
  EXPECT_FALSE(WithCollectivesBench("not json", *p).ok());
  EXPECT_FALSE(WithCollectivesBench(R"({"benchmarks": []})", *p).ok());
}

}  // namespace
}  // namespace shardmap::planner
