// The GEMM plan cache's key and the autotuning policy (internal/autotune.h), on the host: which
// calls share a plan (and so its tuned algorithm), when tuning runs (never inside a graph
// capture, never when turned off), and how the winner is picked, with a fake timer.
#include <cmath>
#include <limits>
#include <set>
#include <vector>

#include "gtest/gtest.h"
#include "tensor/cuda/gemm/internal/autotune.h"
#include "tensor/cuda/runtime.h"
#include "tensor/cuda/gemm/internal/gemm.h"

namespace shardmap::cuda::gemm_internal {
namespace {

const void* At(uintptr_t address) { return reinterpret_cast<const void*>(address); }

GemmCall Base() {
  GemmCall g;
  g.ab_dtype = g.cd_dtype = DType::kBF16;
  g.m = 8192;
  g.n = 4096;
  g.k = 16384;
  g.a = At(0x10000);
  g.b = At(0x20000);
  g.c = reinterpret_cast<void*>(0x30000);
  return g;
}

TEST(GemmPlanKeyTest, SameShapeAndAlignmentShareAPlan) {
  GemmCall moved = Base();
  moved.a = At(0x7f0000);  // other addresses, same (256-byte) alignment class
  moved.c = reinterpret_cast<void*>(0x900100);
  EXPECT_EQ(KeyOf(moved), KeyOf(Base()));
  // Strides matter only for batched calls.
  GemmCall strided = Base();
  strided.stride_a = 123;
  EXPECT_EQ(KeyOf(strided), KeyOf(Base()));
  strided.batch = 2;
  GemmCall batched = Base();
  batched.batch = 2;
  EXPECT_NE(KeyOf(strided), KeyOf(batched));
}

TEST(GemmPlanKeyTest, EveryFieldThatChangesTheProblemChangesTheKey) {
  std::vector<GemmCall> calls(14, Base());
  calls[1].device = 1;
  calls[2].ab_dtype = calls[2].cd_dtype = DType::kF16;
  calls[3].cd_dtype = DType::kF32;
  calls[4].trans_a = true;
  calls[5].trans_b = true;
  calls[6].m = 8191;
  calls[7].n = 4097;
  calls[8].k = 16383;
  calls[9].batch = 3;
  calls[10].accumulate = true;
  calls[11].epilogue = Epilogue::kBias;
  calls[12].a = At(0x10002);  // 2-byte aligned: other kernels apply
  calls[13].epilogue = Epilogue::kGeluAuxBias;
  std::set<PlanKey> keys;
  for (const GemmCall& g : calls) keys.insert(KeyOf(g));
  EXPECT_EQ(keys.size(), calls.size());
}

TEST(GemmPlanKeyTest, AlignmentIsTheLargestPowerOfTwoUpTo256) {
  EXPECT_EQ(Alignment(nullptr), 256);
  EXPECT_EQ(Alignment(At(0x1000)), 256);
  EXPECT_EQ(Alignment(At(0x1080)), 128);
  EXPECT_EQ(Alignment(At(0x1002)), 2);
  EXPECT_EQ(Alignment(At(0x1001)), 1);
}

TEST(GemmAutotuneTest, EnvironmentSwitch) {
  EXPECT_TRUE(AutotuneEnabledFromEnv(nullptr));
  EXPECT_TRUE(AutotuneEnabledFromEnv("1"));
  EXPECT_TRUE(AutotuneEnabledFromEnv("on"));
  EXPECT_FALSE(AutotuneEnabledFromEnv("0"));
  EXPECT_FALSE(AutotuneEnabledFromEnv("off"));
  EXPECT_FALSE(AutotuneEnabledFromEnv("false"));
}

TEST(GemmAutotuneTest, DeterministicRunsNeverTuneByTiming) {
  EXPECT_TRUE(TuningAllowed(/*env_enabled=*/true, /*deterministic=*/false));
  EXPECT_FALSE(TuningAllowed(true, /*deterministic=*/true));
  EXPECT_FALSE(TuningAllowed(/*env_enabled=*/false, false));
  EXPECT_EQ(DecideTuning(TuningAllowed(true, true), false, false, 5), TuneAction::kUseCurrent);
}

TEST(GemmAutotuneTest, DeterministicSwitch) {
  EXPECT_FALSE(DeterministicFromEnv(nullptr));
  EXPECT_FALSE(DeterministicFromEnv("0"));
  EXPECT_FALSE(DeterministicFromEnv("no"));
  EXPECT_TRUE(DeterministicFromEnv("1"));
  EXPECT_TRUE(DeterministicFromEnv("ON"));
  EXPECT_TRUE(DeterministicFromEnv("true"));
  const bool before = Deterministic();
  SetDeterministic(true);
  EXPECT_TRUE(Deterministic());
  SetDeterministic(false);
  EXPECT_FALSE(Deterministic());
  SetDeterministic(before);
}

TEST(GemmAutotuneTest, TunesOnlyEagerUntunedPlansWithAChoice) {
  EXPECT_EQ(DecideTuning(true, false, false, 5), TuneAction::kTune);
  EXPECT_EQ(DecideTuning(true, /*capturing=*/true, false, 5), TuneAction::kUseCurrent);
  EXPECT_EQ(DecideTuning(/*enabled=*/false, false, false, 5), TuneAction::kUseCurrent);
  EXPECT_EQ(DecideTuning(true, false, /*tuned=*/true, 5), TuneAction::kUseCurrent);
  EXPECT_EQ(DecideTuning(true, false, false, /*candidates=*/1), TuneAction::kUseCurrent);
  EXPECT_EQ(DecideTuning(true, false, false, 0), TuneAction::kUseCurrent);
}

TEST(GemmAutotuneTest, PicksTheFastestWithAFakeTimer) {
  const double inf = std::numeric_limits<double>::infinity();
  auto pick = [](std::vector<double> ms) {
    std::vector<int> asked;
    const int best = PickFastest(static_cast<int>(ms.size()), [&](int i) {
      asked.push_back(i);
      return ms[i];
    });
    EXPECT_EQ(asked.size(), ms.size()) << "every candidate is timed once";
    return best;
  };
  EXPECT_EQ(pick({1.3, 1.1, 1.2}), 1);
  EXPECT_EQ(pick({1.0, 1.0, 2.0}), 0) << "ties keep the heuristic's order";
  EXPECT_EQ(pick({inf, 2.0, std::nan("")}), 1) << "failed candidates never win";
  EXPECT_EQ(pick({inf, inf}), 0) << "none ran: the heuristic's first";
  EXPECT_EQ(pick({}), 0);
  EXPECT_EQ(pick({-1.0, 3.0}), 1) << "a negative time is a broken measurement";
}

}  // namespace
}  // namespace shardmap::cuda::gemm_internal
