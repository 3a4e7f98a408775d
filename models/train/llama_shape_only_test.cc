// Shape-only Llama steps against real ones (the GPT-2 twin is gpt_shape_only_test.cc): the
// profiler runs any registered model's own per-device program, so a small Llama 3 (grouped-query
// attention with 2 kv heads of 4, SwiGLU, an untied head) profiled on the meta device and on the
// CPU has exactly the collectives, the MemoryTracker peak, the parameter bytes and the FLOPs a
// real CPU step measures on each rank, on dp, FSDP, tp + SP, pp and cp; and its FSDP gathers
// move the parameter table's bytes counted from Llama's shapes (K/V at kv_heads' width, three
// MLP matrices), not a GPT block's.
#include <map>
#include <mutex>
#include <string>

#include "gtest/gtest.h"
#include "models/llama/llama_model.h"
#include "models/train/gpt_shape_only.h"
#include "models/train/gpt_test_util.h"
#include "shardmap/collective_recorder.h"
#include "shardmap/spmd_runner.h"
#include "tensor/memory_tracker.h"
#include "tensor/op_counter.h"

namespace shardmap {
namespace {

const LlamaConfig kLlama{.layers = 2, .d_model = 16, .heads = 4, .kv_heads = 2, .ffn_dim = 40,
                         .vocab = 48, .seq = 8};

// The parameter table's elements from Llama's shapes (independent of LlamaLayout's table):
// per block q [H hd, d], k and v [kv hd, d], o [d, H hd], gate and up [f, d], down [d, f], two
// norms [d]; embed_tokens and lm_head [V, d], the final norm [d].
double LlamaElements(const LlamaConfig& c) {
  const double d = c.d_model, hd = d / c.heads;
  const double block = 2 * d * c.heads * hd + 2 * d * c.kv_heads * hd + 3 * d * c.ffn_dim + 2 * d;
  return c.layers * block + 2.0 * c.vocab * d + d;
}

struct RankTruth {
  std::vector<CollectiveRecord> log;
  int64_t peak = 0;
  double flops = 0;
};

// A real one-step train on CPU threads, each rank measured on its own thread.
std::map<int, RankTruth> RealStep(const Model& model, TrainOptions o) {
  struct Probes {
    CollectiveRecorder* rec;
    MemoryTracker* mem;
    OpCounter* ops;
    size_t ops_at_step = 0;
  };
  std::mutex mu;
  std::map<int, Probes> probes;
  std::map<int, RankTruth> truth;
  o.hooks.spmd_runner = [&](const Mesh& mesh, const std::function<void(RankContext&)>& body) {
    return RunSpmd(mesh, [&](RankContext& ctx) {
      MemoryTracker mem;
      OpCounter ops;
      CollectiveRecorder rec;
      {
        std::lock_guard<std::mutex> lock(mu);
        probes[ctx.rank()] = Probes{&rec, &mem, &ops};
      }
      body(ctx);
    });
  };
  o.hooks.on_phase = [&](const char* phase) {
    const int rank = RankContext::Current()->rank();
    std::lock_guard<std::mutex> lock(mu);
    Probes& p = probes[rank];
    if (std::string(phase) == "step") {
      p.rec->Clear();
      p.ops_at_step = p.ops->ops().size();
    } else if (std::string(phase) == "end") {
      RankTruth& t = truth[rank];
      t.log = p.rec->records(rank);
      t.peak = p.mem->peak_bytes();
      for (size_t i = p.ops_at_step; i < p.ops->ops().size(); ++i) t.flops += p.ops->ops()[i].flops;
    }
  };
  absl::StatusOr<TrainResult> r =
      TrainGpt(model, model.Init(3), gpt_testing::Tokens(4000, model.shape().vocab), o);
  EXPECT_TRUE(r.ok()) << r.status();
  return truth;
}

struct Case {
  std::string name, mesh;
  bool sp = false;
  int64_t batch = 4, microbatches = 1;
};

class ShapeOnlyLlamaTest : public ::testing::TestWithParam<Case> {};

TEST_P(ShapeOnlyLlamaTest, EveryRankMatchesTheRealStep) {
  const Case& k = GetParam();
  absl::StatusOr<Mesh> mesh = ParseMesh(k.mesh);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  absl::StatusOr<LlamaLayout> layout = LlamaLayout::Create(*mesh, kLlama, k.sp);
  ASSERT_TRUE(layout.ok()) << layout.status();
  TrainOptions o;
  o.batch = k.batch;
  o.pipeline.microbatches = k.microbatches;
  o.optimizer.clip = 0;  // the one data-dependent branch (gpt_shape_only_test.cc)
  const std::map<int, RankTruth> truth = RealStep(*layout, o);
  ASSERT_EQ(truth.size(), static_cast<size_t>(mesh->size()));
  for (const Device device : {Device::Cpu(), Device::Meta()}) {
    SCOPED_TRACE(device.ToString());
    for (int rank = 0; rank < mesh->size(); ++rank) {
      SCOPED_TRACE(RankDescription(*mesh, rank));
      absl::StatusOr<StepProfile> p = ProfileGptRank(*layout, o, rank, "", device);
      ASSERT_TRUE(p.ok()) << p.status();
      const RankTruth& t = truth.at(rank);
      ASSERT_EQ(p->collectives.size(), t.log.size());
      for (size_t i = 0; i < t.log.size(); ++i) {
        SCOPED_TRACE(i);
        EXPECT_EQ(p->collectives[i].op, t.log[i].op);
        EXPECT_EQ(p->collectives[i].bytes, t.log[i].bytes);
        EXPECT_EQ(p->collectives[i].backward, t.log[i].backward);
      }
      EXPECT_EQ(p->peak_bytes, t.peak);
      EXPECT_DOUBLE_EQ(p->flops, t.flops);
      EXPECT_GT(p->flops, 0);
      EXPECT_EQ(p->optimizer_bytes, 2 * p->parameter_bytes);  // AdamW's two moments
      EXPECT_GT(p->activation_peak_bytes, 0);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Meshes, ShapeOnlyLlamaTest,
    ::testing::Values(Case{.name = "single", .mesh = "dp=1"},
                      Case{.name = "dp2", .mesh = "dp=2"},
                      Case{.name = "fsdp2_tp2_sp", .mesh = "dp_shard=2,tp=2", .sp = true},
                      Case{.name = "pp2_1f1b", .mesh = "pp=2", .microbatches = 2},
                      Case{.name = "dp2_cp2", .mesh = "dp=2,cp=2"}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

// One device holds the whole table in f32; FSDP's forward gathers bring each rank the other
// halves, so its gathered blocks sum to half the table: K/V at 2 heads' width, not 4.
TEST(ShapeOnlyLlama, ParameterBytesAreLlamasTable) {
  absl::StatusOr<LlamaLayout> one = LlamaLayout::Create(Mesh(), kLlama, false);
  ASSERT_TRUE(one.ok()) << one.status();
  TrainOptions o;
  o.batch = 2;
  absl::StatusOr<std::vector<StepProfile>> p = ProfileGptStep(*one, o);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ((*p)[0].parameter_bytes, LlamaElements(kLlama) * 4);
  absl::StatusOr<LlamaLayout> fsdp = LlamaLayout::Create(*ParseMesh("dp_shard=2"), kLlama, false);
  ASSERT_TRUE(fsdp.ok()) << fsdp.status();
  absl::StatusOr<std::vector<StepProfile>> q = ProfileGptStep(*fsdp, o);
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ((*q)[0].parameter_bytes, LlamaElements(kLlama) * 4 / 2);
  double gathered = 0;
  for (const CollectiveTraffic& c : (*q)[0].collectives) {
    if (c.op == "all_gather" && !c.backward) gathered += c.bytes;
  }
  EXPECT_EQ(gathered, LlamaElements(kLlama) * 4 / 2);
}

}  // namespace
}  // namespace shardmap
