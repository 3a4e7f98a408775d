#include "models/planner/cost_model.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "gtest/gtest.h"

namespace shardmap::planner {
namespace {

HardwareProfile Node() {
  HardwareProfile p;
  p.name = "test";
  p.gpus_per_node = 4;
  p.memory_bytes = 100;
  p.memory_bandwidth = 1e9;
  p.gemm[DType::kF32] = {{1, 1e9}};
  p.intra = {1e-5, 1e9};
  p.inter = {1e-4, 1e8};
  return p;
}

TEST(RingSecondsTest, MatchesHandCalculations) {
  const Link link{2e-6, 100e9};
  // all_reduce of 1 GB over 8: alpha + 2 * 7/8 * 1e9 / 1e11 = 2e-6 + 0.0175
  EXPECT_NEAR(*RingSeconds("all_reduce", 8, 1e9, link), 2e-6 + 0.0175, 1e-12);
  // reduce_scatter of a 1 GB input over 4: alpha + 3/4 * 1e9 / 1e11
  EXPECT_NEAR(*RingSeconds("reduce_scatter", 4, 1e9, link), 2e-6 + 0.0075, 1e-12);
  // all_gather: each rank contributes 0.25 GB of a 1 GB output over 4: the same as reduce_scatter
  EXPECT_NEAR(*RingSeconds("all_gather", 4, 0.25e9, link), 2e-6 + 0.0075, 1e-12);
  EXPECT_NEAR(*RingSeconds("all_to_all", 4, 1e9, link), 2e-6 + 0.0075, 1e-12);
  EXPECT_NEAR(*RingSeconds("ppermute", 2, 1e9, link), 2e-6 + 0.01, 1e-12);
  EXPECT_EQ(*RingSeconds("all_reduce", 1, 1e9, link), 0.0);  // no group, no cost
  EXPECT_FALSE(RingSeconds("broadcastish", 4, 1, link).ok());
  EXPECT_FALSE(RingSeconds("all_reduce", 4, 1, Link{0, 0}).ok());
}

TEST(SpansNodesTest, FollowsMeshOrder) {
  // pp=2, dp=4, tp=2 on nodes of 4 GPUs: tp (stride 1) inside, dp (stride 2, span 8) across,
  // pp (stride 8) across.
  MeshShape m{{"pp", "dp", "tp"}, {2, 4, 2}};
  EXPECT_FALSE(SpansNodes(m, {"tp"}, 4));
  EXPECT_TRUE(SpansNodes(m, {"dp"}, 4));
  EXPECT_TRUE(SpansNodes(m, {"pp"}, 4));
  EXPECT_FALSE(SpansNodes(m, {"dp"}, 8));
  EXPECT_TRUE(SpansNodes(m, {"pp"}, 8));
  EXPECT_TRUE(SpansNodes(m, {"dp", "tp"}, 4));
}

// Against every member of the first and the last rank's groups, listed by coordinates, on
// odd sizes and nodes that do not divide the mesh's strides.
TEST(SpansNodesTest, EqualsTheGroupsMembersNodes) {
  const MeshShape meshes[] = {{{"pp", "dp", "tp"}, {3, 5, 2}},
                              {{"dp_replicate", "dp_shard", "cp", "tp"}, {2, 3, 2, 3}},
                              {{"pp", "ep", "tp"}, {2, 6, 4}}};
  const std::vector<std::vector<int>> subsets = {{0}, {1}, {2}, {0, 1}, {1, 2}, {0, 2}, {0, 1, 2}};
  for (const MeshShape& m : meshes) {
    for (int gpn : {1, 2, 3, 4, 5, 8, 12, 1000}) {
      for (const std::vector<int>& sub : subsets) {
        std::vector<std::string> axes;
        for (int i : sub) axes.push_back(m.axes[i + (m.axes.size() > 3 ? 1 : 0)]);
        bool spans = false;
        for (int rank : {0, m.world() - 1}) {
          // Members: the ranks whose coordinates off `axes` equal rank's.
          std::set<int> nodes;
          for (int r = 0; r < m.world(); ++r) {
            bool member = true;
            int stride = 1;
            for (int i = static_cast<int>(m.axes.size()) - 1; i >= 0; --i) {
              const bool free = std::count(axes.begin(), axes.end(), m.axes[i]) > 0;
              if (!free && (r / stride) % m.sizes[i] != (rank / stride) % m.sizes[i]) {
                member = false;
              }
              stride *= m.sizes[i];
            }
            if (member) nodes.insert(r / gpn);
          }
          spans = spans || nodes.size() > 1;
        }
        EXPECT_EQ(SpansNodes(m, axes, gpn), spans) << m.ToString() << " gpn " << gpn;
      }
    }
  }
}

TEST(CollectiveSecondsTest, PicksTheLinkAndFittedEntries) {
  HardwareProfile p = Node();
  MeshShape m{{"dp", "tp"}, {2, 4}};
  CollectiveWork tp{"all_reduce", {"tp"}, 4, 1e6};
  CollectiveWork dp{"all_reduce", {"dp"}, 2, 1e6};
  EXPECT_NEAR(*CollectiveSeconds(tp, m, p), 1e-5 + 2 * 0.75 * 1e6 / 1e9, 1e-12);
  EXPECT_NEAR(*CollectiveSeconds(dp, m, p), 1e-4 + 2 * 0.5 * 1e6 / 1e8, 1e-12);
  p.fitted[{"all_reduce", 4}] = {1e-3, 1e-9};
  EXPECT_NEAR(*CollectiveSeconds(tp, m, p), 1e-3 + 1e-3, 1e-12);
  p.inter = {};
  p.fitted.clear();
  EXPECT_FALSE(CollectiveSeconds(dp, m, p).ok());  // crosses nodes, no inter link
}

TEST(PipelineSecondsTest, GpipeBubbleIsTheTextbookOne) {
  // p = 4, m = 8, f = 1, b = 2: (m+p-1)(f+b) = 33, bubble (p-1)/(m+p-1) = 3/11.
  double bubble = 0;
  PipelineSpec spec{4, 8, "gpipe"};
  EXPECT_NEAR(*PipelineSeconds(spec, {1, 1, 1, 1}, {2, 2, 2, 2}, 0, &bubble), 33, 1e-9);
  EXPECT_NEAR(bubble, 3.0 / 11, 1e-12);
  // A boundary transfer after every one of the 2(m+p-1) ticks.
  EXPECT_NEAR(*PipelineSeconds(spec, {1, 1, 1, 1}, {2, 2, 2, 2}, 0.5, &bubble), 33 + 11, 1e-9);
}

TEST(PipelineSecondsTest, OneFOneBInLockstep) {
  // Equal forward and backward: 2(m+p-1) ticks of 1, the same bubble as GPipe.
  double bubble = 0;
  PipelineSpec spec{4, 8, "1f1b"};
  EXPECT_NEAR(*PipelineSeconds(spec, {1, 1, 1, 1}, {1, 1, 1, 1}, 0, &bubble), 22, 1e-9);
  EXPECT_NEAR(bubble, 3.0 / 11, 1e-12);
  // b = 2f: ticks that mix a forward and a backward last a backward, so lockstep 1F1B takes at
  // least GPipe's time.
  EXPECT_GE(*PipelineSeconds(spec, {1, 1, 1, 1}, {2, 2, 2, 2}, 0, &bubble), 33 - 1e-9);
  // One stage: accumulation, no bubble.
  EXPECT_NEAR(*PipelineSeconds({1, 4, "1f1b"}, {1}, {2}, 0, &bubble), 12, 1e-9);
  EXPECT_NEAR(bubble, 0, 1e-12);
  EXPECT_FALSE(PipelineSeconds({4, 8, "zigzag"}, {1, 1, 1, 1}, {1, 1, 1, 1}, 0, &bubble).ok());
  EXPECT_FALSE(PipelineSeconds({4, 8, "1f1b"}, {1, 1}, {1, 1}, 0, &bubble).ok());
}

TEST(PipelineSecondsTest, StagesSharingCoresRunABusyTickInTurn) {
  // GPipe p = 4, m = 4, f = 1, b = 2, one rank per stage on 2 cores (share 1/2). Forward ticks
  // have 1, 2, 3, 4, 3, 2, 1 busy stages: 1 + 1 + 1.5 + 2 + 1.5 + 1 + 1 = 9 (x f), backward the
  // same (x b): 27, against 21 with a core each and 16 x 3 / 2 = 24 for perfect packing.
  double bubble = 0;
  PipelineSpec spec{4, 4, "gpipe"};
  EXPECT_NEAR(*PipelineSeconds(spec, {1, 1, 1, 1}, {2, 2, 2, 2}, 0, &bubble), 21, 1e-9);
  EXPECT_NEAR(*PipelineSeconds(spec, {1, 1, 1, 1}, {2, 2, 2, 2}, 0, &bubble, 0.5), 27, 1e-9);
  // Busy 48 stage-units over 4 stages x 27: the idle share.
  EXPECT_NEAR(bubble, 1 - 48.0 / (4 * 27), 1e-12);
  // As many cores as ranks (share 1/4 x 4 stages <= 1 per tick): the lockstep time.
  EXPECT_NEAR(*PipelineSeconds(spec, {1, 1, 1, 1}, {2, 2, 2, 2}, 0, &bubble, 0.25), 21, 1e-9);
  // Two ranks per stage on 2 cores (share 1): every tick's whole work in turn, 48.
  EXPECT_NEAR(*PipelineSeconds(spec, {1, 1, 1, 1}, {2, 2, 2, 2}, 0, &bubble, 1.0), 48, 1e-9);
}

TEST(PredictStepTest, OverlapOffExposesEveryCollective) {
  HardwareProfile p = Node();
  p.gpus_per_node = 8;
  RoleWork w;
  w.gemms.push_back({.m = 100, .n = 100, .k = 50});  // 1e6 flops at 1e9 = 1 ms
  w.others.push_back({"gelu", DType::kF32, 0, 1e6});  // 1e6 bytes at 1e9 = 1 ms
  w.op_count = 10;
  p.op_overhead_s = 1e-4;                              // 1 ms
  w.collectives.push_back({"all_reduce", {"tp"}, 4, 1e6, false, "tp"});         // 1.51 ms
  w.collectives.push_back({"reduce_scatter", {"dp_shard"}, 2, 8e6, true, "fsdp"});  // 4.01 ms
  MeshShape m{{"dp_shard", "tp"}, {2, 4}};
  StepOptions off;
  off.overlap = false;
  absl::StatusOr<StepPrediction> s = PredictStep({w}, m, {}, p, off);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_NEAR(s->compute_s, 3e-3, 1e-12);
  EXPECT_NEAR(s->blocking_comm_s, 1.51e-3, 1e-12);
  EXPECT_NEAR(s->overlapped_comm_s, 4.01e-3, 1e-12);
  EXPECT_NEAR(s->exposed_comm_s, 4.01e-3, 1e-12);
  EXPECT_NEAR(s->step_s, 3e-3 + 1.51e-3 + 4.01e-3, 1e-12);
  EXPECT_DOUBLE_EQ(s->bytes_by_kind.at("reduce_scatter dp_shard"), 8e6);
  // Shared cores: 8 ranks on 2 cores run 4x slower, and nothing overlaps even when asked.
  p.cores = 2;
  absl::StatusOr<StepPrediction> shared = PredictStep({w}, m, {}, p, off);
  EXPECT_NEAR(shared->step_s, 4 * s->step_s, 1e-12);
  EXPECT_NEAR(PredictStep({w}, m, {}, p)->step_s, shared->step_s, 1e-12);
  // Bad options are errors.
  StepOptions bad;
  bad.bucket_bytes = 0;
  EXPECT_FALSE(PredictStep({w}, m, {}, p, bad).ok());
  bad = StepOptions{};
  bad.fsdp_prefetch = 0;
  EXPECT_FALSE(PredictStep({w}, m, {}, p, bad).ok());
}

TEST(PredictStepTest, OverlapOnSchedulesFsdpPerLayerInTheComputeDtype) {
  HardwareProfile p = Node();
  p.gpus_per_node = 8;
  p.intra = {0, 1e9};
  RoleWork w;
  w.layers = 2;
  w.gemms.push_back({.m = 100, .n = 100, .k = 300});  // 6 ms: 2 fwd + 4 bwd
  // Logged as the shape-only step ran them: this rank's f32 shard (4 MB) gathered once; the
  // overlapped trainer gathers it in bf16. The rank's other parameters (no dimension dp_shard
  // divides) stay whole: they are not FSDP traffic.
  w.param_bytes = 1e9;
  w.collectives.push_back({"all_gather", {"dp_shard"}, 2, 4e6, false, "fsdp"});
  w.collectives.push_back({"reduce_scatter", {"dp_shard"}, 2, 8e6, true, "fsdp"});
  MeshShape m{{"dp_shard"}, {2}};
  StepOptions o;
  o.gather_scale = 0.5;
  absl::StatusOr<StepPrediction> s = PredictStep({w}, m, {}, p, o);
  ASSERT_TRUE(s.ok()) << s.status();
  // One gather: ring all_gather of 2 x 2 MB over 2 ranks = 2 ms (1 ms a layer); one
  // reduce-scatter of 8 MB = 4 ms (2 ms a layer).
  // Forward: g0 0-1, c0 1-2, g1 1-2, c1 2-3. Backward: g0 0-1, g1 1-2, b0 1-3, r0 3-5, b1 3-5,
  // r1 5-7: 3 + 7 ms.
  EXPECT_NEAR(s->step_s, 10e-3, 1e-12);
  EXPECT_NEAR(s->exposed_comm_s, 4e-3, 1e-12);
  // Keeping the gathered parameters: no backward gathers (b0 0-2, r0 2-4, b1 2-4, r1 4-6).
  o.reshard_after_forward = false;
  EXPECT_NEAR(PredictStep({w}, m, {}, p, o)->step_s, 3e-3 + 6e-3, 1e-12);
}

// Two layers of 6 ms of compute (2 forward + 4 backward) whose shard of 4 MB (f32) is gathered
// once and whose gradients (8 MB) are reduce-scattered once over dp_shard=2.
RoleWork FsdpExample() {
  RoleWork w;
  w.layers = 2;
  w.gemms.push_back({.m = 100, .n = 100, .k = 300});
  w.param_bytes = 4e6;
  w.collectives.push_back({"all_gather", {"dp_shard"}, 2, 4e6, false, "fsdp"});
  w.collectives.push_back({"reduce_scatter", {"dp_shard"}, 2, 8e6, true, "fsdp"});
  return w;
}

// FsdpExample's two ranks sharing one core over a 1 GB/s simulated link, gathering in bf16.
HardwareProfile SharedCoreLink() {
  HardwareProfile p = Node();
  p.intra = {0, 1e9};
  p.cores = 1;
  return p;
}

StepOptions OnSimulatedLink() {
  StepOptions o;
  o.gather_scale = 0.5;
  o.simulated_link = true;
  return o;
}

TEST(PredictStepTest, ASimulatedLinkOverlapsOnSharedCores) {
  // The FSDP example above on 2 ranks sharing 1 core: compute stretches 2x (12 ms: forward 4,
  // backward 8), the sleeping link does not; with overlap the gathers / reduce-scatters hide
  // but the forward's and the backward's first gathers (1 ms each) and the last reduce-scatter
  // (2 ms).
  HardwareProfile p = SharedCoreLink();
  const RoleWork w = FsdpExample();
  const MeshShape m{{"dp_shard"}, {2}};
  StepOptions o = OnSimulatedLink();
  absl::StatusOr<StepPrediction> s = PredictStep({w}, m, {}, p, o);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_NEAR(s->step_s, 12e-3 + 1e-3 + 1e-3 + 2e-3, 1e-12);
  // Inline collectives on shared cores (the plain CPU profile): all of them block, stretched.
  o.simulated_link = false;
  EXPECT_NEAR(PredictStep({w}, m, {}, p, o)->step_s, 12e-3 + 2 * (4e-3 + 4e-3), 1e-12);
}

TEST(PredictStepTest, SimulatedRanksComputingAtOnceShareTheOpsSpeeds) {
  // 1 GB of adds: 1 s alone, 3 s with 2 ranks at once (measured shared rate). Two ranks on two
  // cores compute at once; one rank, or a profile without cores (GPUs), alone.
  HardwareProfile p = Node();
  p.cores = 2;
  p.op_rate[{"add", DType::kF32}] = 1e9;
  p.shared_op_rate_threads = 2;
  p.shared_op_rate[{"add", DType::kF32}] = 1e9 / 3;
  RoleWork w;
  w.others.push_back({"add", DType::kF32, 0, 1e9});
  StepOptions o;
  o.overlap = false;
  EXPECT_NEAR(PredictStep({w}, {{"dp"}, {2}}, {}, p, o)->step_s, 3.0, 1e-9);
  EXPECT_NEAR(PredictStep({w}, {{"dp"}, {2}}, {}, p, o)->other_s, 3.0, 1e-9);
  EXPECT_NEAR(PredictStep({w}, {{"dp"}, {1}}, {}, p, o)->step_s, 1.0, 1e-9);
  // Four ranks on two cores: two at a time (3 s each), each rank's compute stretched 2x.
  EXPECT_NEAR(PredictStep({w}, {{"dp"}, {4}}, {}, p, o)->step_s, 6.0, 1e-9);
  p.cores = 0;
  EXPECT_NEAR(PredictStep({w}, {{"dp"}, {2}}, {}, p, o)->step_s, 1.0, 1e-9);
}

TEST(PredictStepTest, ASimulatedLinksStartedCallsTakeTheirInProcessWorkFromCompute) {
  // The FSDP example of ASimulatedLinkOverlapsOnSharedCores with the in-process collectives'
  // fits beneath the link (lane_cpu): each pass's gather (2 MB in the compute dtype) 1 ms +
  // 1e-9 s/B, its regather (the first of 2 layers: 1/2 of it), the reduce-scatter 8 MB at
  // 2e-9 s/B; all of it stretched 2x (two ranks on one core), the forward's share in the forward.
  HardwareProfile p = SharedCoreLink();
  const RoleWork w = FsdpExample();
  const MeshShape m{{"dp_shard"}, {2}};
  StepOptions o = OnSimulatedLink();
  const double without = PredictStep({w}, m, {}, p, o)->compute_s;
  p.lane_cpu[{"all_gather", 2}] = {1e-3, 1e-9};
  p.lane_cpu[{"reduce_scatter", 2}] = {0, 2e-9};
  const double lane = (1e-3 + 2e6 * 1e-9) * 1.5 + 8e6 * 2e-9;
  absl::StatusOr<StepPrediction> s = PredictStep({w}, m, {}, p, o);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_NEAR(s->compute_s, without + 2 * lane, 1e-12);
  // Blocking calls (overlap off) run their in-process work inside the link's time: no charge;
  // nor on a plain CPU profile (no simulated link: the collectives are priced as they run).
  o.overlap = false;
  EXPECT_NEAR(PredictStep({w}, m, {}, p, o)->compute_s, without, 1e-12);
  o.overlap = true;
  o.simulated_link = false;
  EXPECT_NEAR(PredictStep({w}, m, {}, p, o)->compute_s, without, 1e-12);
}

TEST(PredictStepTest, OverlapOnReducesGradientsInBucketsNotPerParameter) {
  HardwareProfile p = Node();
  p.gpus_per_node = 8;
  p.intra = {1e-3, 1e9};  // a large alpha: paid per bucket, not per logged parameter
  RoleWork w;
  w.layers = 2;
  w.gemms.push_back({.m = 100, .n = 100, .k = 300});  // 6 ms: backward 4 ms
  // 100 parameters' gradients of 0.1 MB each, logged one all_reduce apiece (10 MB in all).
  for (int i = 0; i < 100; ++i) {
    w.collectives.push_back({"all_reduce", {"dp"}, 2, 1e5, false, "grad"});
  }
  MeshShape m{{"dp"}, {2}};
  StepOptions o;
  o.bucket_bytes = 5e6;  // two buckets: 1 ms + 5 ms each (alpha + 2 (n-1)/n 5 MB / 1 GB/s)
  absl::StatusOr<StepPrediction> s = PredictStep({w}, m, {}, p, o);
  ASSERT_TRUE(s.ok()) << s.status();
  // Backward: bucket 0 final at 2 + 2 = 4 ms (after the 2 ms forward), reduced 4-10; bucket 1
  // final at 6 ms, reduced 10-16.
  EXPECT_NEAR(s->step_s, 16e-3, 1e-12);
  o.overlap = false;  // every logged all_reduce in turn: 100 x (1 ms + 0.1 ms)
  EXPECT_NEAR(PredictStep({w}, m, {}, p, o)->step_s, 6e-3 + 100 * 1.1e-3, 1e-12);
}

TEST(PredictStepTest, RanksBeyondTheCoresPayTheSyncCostAtEachCollective) {
  HardwareProfile p = Node();
  p.gpus_per_node = 8;
  RoleWork w;
  w.gemms.push_back({.m = 100, .n = 100, .k = 50});                      // 1 ms
  w.collectives.push_back({"all_reduce", {"tp"}, 4, 1e3, false, "tp"});   // 10 us + 1.5 us
  w.collectives.push_back({"all_reduce", {"tp"}, 4, 1e3, true, "tp"});
  w.collectives.push_back({"convert_invariant", {"tp"}, 4, 1e3, false, "tp"});  // local: 0
  MeshShape m{{"tp"}, {4}};
  p.cores = 2;
  absl::StatusOr<StepPrediction> plain = PredictStep({w}, m, {}, p);
  ASSERT_TRUE(plain.ok()) << plain.status();
  // 4 ranks on 2 cores that each wait 2 ms per collective: 2 x 2 ms, not 2 x 23 us; the
  // conversion moves nothing and waits for nobody.
  p.oversubscribed_sync = {{4, 2e-3}, {8, 6e-3}};
  absl::StatusOr<StepPrediction> synced = PredictStep({w}, m, {}, p);
  ASSERT_TRUE(synced.ok()) << synced.status();
  EXPECT_NEAR(synced->blocking_comm_s, 4e-3, 1e-12);
  EXPECT_NEAR(synced->step_s - plain->step_s, 4e-3 - plain->blocking_comm_s, 1e-12);
  EXPECT_NEAR(synced->seconds_by_kind.at("all_reduce tp"), 4e-3, 1e-12);
  // A collective dearer than the wait keeps its own cost.
  p.oversubscribed_sync = {{4, 1e-6}};
  EXPECT_NEAR(PredictStep({w}, m, {}, p)->step_s, plain->step_s, 1e-15);
  // Groups no larger than the cores (their members run together), and FSDP / gradient
  // collectives (runs of them, one parameter after another): their own cost.
  p.oversubscribed_sync = {{4, 2e-3}};
  for (const CollectiveWork& c :
       {CollectiveWork{"all_reduce", {"tp"}, 2, 1e3, false, "tp"},
        CollectiveWork{"all_gather", {"dp_shard"}, 4, 1e3, false, "fsdp"},
        CollectiveWork{"all_reduce", {"dp"}, 4, 1e3, false, "grad"}}) {
    RoleWork one = w;
    one.collectives = {c};
    RoleWork none = w;
    none.collectives.clear();
    EXPECT_LT(PredictStep({one}, m, {}, p)->step_s - PredictStep({none}, m, {}, p)->step_s, 1e-4)
        << c.op << " " << c.phase;
  }
  // A group of 2 on 1.9 effective cores (a shared machine's reading of 2) runs together too.
  p.cores = 1.9;
  {
    RoleWork pair = w;
    pair.collectives = {CollectiveWork{"all_reduce", {"tp"}, 2, 1e3, false, "tp"}};
    RoleWork none = w;
    none.collectives.clear();
    EXPECT_LT(PredictStep({pair}, m, {}, p)->step_s - PredictStep({none}, m, {}, p)->step_s, 1e-4);
  }
  p.cores = 2;
  // As many cores as ranks: nothing to wait for.
  p.oversubscribed_sync = {{4, 2e-3}};
  p.cores = 4;
  EXPECT_NEAR(PredictStep({w}, m, {}, p)->blocking_comm_s, plain->blocking_comm_s / 2, 1e-12);
}

TEST(PredictStepTest, PipelineStagesGatherTheirFsdpUnitsOncePerStep) {
  // pp=2 x dp_shard=2, 2 layers a stage, 6 ms of compute a stage (per microbatch of m: 2/m ms
  // forward, 4/m backward). The stage logs its shard (4 MB, f32) gathered once per step and its
  // gradients (8 MB) reduce-scattered once; the overlapped stage gathers in bf16 (2 ms on a
  // 1 GB/s link), the reduce-scatter takes 4 ms.
  HardwareProfile p = Node();
  p.gpus_per_node = 8;
  p.intra = {0, 1e9};
  auto stage = [](int s, bool fsdp) {
    RoleWork w;
    w.pp_stage = s;
    w.layers = 2;
    w.gemms.push_back({.m = 100, .n = 100, .k = 300});
    if (fsdp) {
      w.collectives.push_back({"all_gather", {"dp_shard"}, 2, 4e6, false, "fsdp"});
      w.collectives.push_back({"reduce_scatter", {"dp_shard"}, 2, 8e6, true, "fsdp"});
    }
    return w;
  };
  const MeshShape m{{"pp", "dp_shard"}, {2, 2}};
  StepOptions o;
  o.gather_scale = 0.5;
  for (int mb : {2, 4}) {
    SCOPED_TRACE(mb);
    const PipelineSpec spec{2, mb, "1f1b"};
    const double plain = PredictStep({stage(0, false), stage(1, false)}, m, spec, p, o)->step_s;
    absl::StatusOr<StepPrediction> s = PredictStep({stage(0, true), stage(1, true)}, m, spec, p, o);
    ASSERT_TRUE(s.ok()) << s.status();
    // What stage 0's first forward cannot hide of 4 ms of gathers, and its last backward of
    // 4 ms of reduce-scatters.
    const double f = 2e-3 / mb, b = 4e-3 / mb;
    const double first = *FsdpForwardSeconds({.layers = 2, .compute_s = f, .gather_s = 2e-3});
    const double last = *FsdpBackwardSeconds({.layers = 2, .compute_s = b, .reduce_s = 4e-3});
    EXPECT_NEAR(s->step_s, plain + (first - f) + (last - b), 1e-12);
    // The reference schedule: every FSDP call blocks, once per step, as logged (4 + 4 ms).
    o.overlap = false;
    EXPECT_NEAR(PredictStep({stage(0, true), stage(1, true)}, m, spec, p, o)->step_s,
                PredictStep({stage(0, false), stage(1, false)}, m, spec, p, o)->step_s + 8e-3,
                1e-12);
    o.overlap = true;
  }
}

TEST(PredictStepTest, PipelineUsesTheSlowestStagePerTick) {
  HardwareProfile p = Node();
  RoleWork a, b;
  a.pp_stage = 0;
  b.pp_stage = 1;
  a.gemms.push_back({.m = 100, .n = 100, .k = 150});  // 3 ms: 1 fwd + 2 bwd
  b.gemms.push_back({.m = 100, .n = 100, .k = 300});  // 6 ms: 2 fwd + 4 bwd
  MeshShape m{{"pp"}, {2}};
  PipelineSpec spec{2, 1, "gpipe"};
  absl::StatusOr<StepPrediction> s = PredictStep({a, b}, m, spec, p);
  ASSERT_TRUE(s.ok()) << s.status();
  // m = 1: F0 on stage 0 (1), F0 on stage 1 (2), B0 on 1 (4), B0 on 0 (2): 9 ms.
  EXPECT_NEAR(s->step_s, 9e-3, 1e-12);
  EXPECT_NEAR(s->bubble, 1 - 9.0 / 18, 1e-12);
  // On one shared core the two stages' 9 ms of work run one after the other, bubble or not:
  // max(timetable 9 ms, (3 + 6) / 1) = 9 ms; with 4 microbatches the timetable is
  // F ticks 0.25 0.5 0.5 0.5 0.5, B ticks 1 1 1 1 0.5: 6.75 ms, but the work is still 9 ms.
  p.cores = 1;
  EXPECT_NEAR(PredictStep({a, b}, m, {2, 4, "gpipe"}, p)->step_s, 9e-3, 1e-12);
  p.cores = 0;
  EXPECT_NEAR(PredictStep({a, b}, m, {2, 4, "gpipe"}, p)->step_s, 6.75e-3, 1e-12);
  EXPECT_FALSE(PredictStep({a}, m, spec, p).ok());  // stage 1 missing
  b.pp_stage = 5;
  EXPECT_FALSE(PredictStep({a, b}, m, spec, p).ok());
}

}  // namespace
}  // namespace shardmap::planner
