// Shape-only Llama steps against real ones (the GPT-2 twin is gpt_shape_only_test.cc): the
// profiler runs any registered model's own per-device program, so a small Llama 3 (grouped-query
// attention with 2 kv heads of 4, SwiGLU, an untied head) profiled on the meta device and on the
// CPU has exactly the collectives, the MemoryTracker peak, the parameter bytes and the FLOPs a
// real CPU step measures on each rank, on dp, FSDP, tp + SP, pp and cp; and its FSDP gathers
// move the parameter table's bytes counted from Llama's shapes (K/V at kv_heads' width, three
// MLP matrices), not a GPT block's.
// One known difference: shardmap/rope_ops.cc rotates f32/f64 CPU tensors in one fused loop and
// every other tensor (meta, CUDA, bf16) by the composed slices, negation and products, so an
// f32 meta profile counts the composed form's temporaries and FLOPs (what a CUDA step runs, the
// planner's case) where the CPU step ran the loop. bf16 compute takes the composed form on
// both: there the meta profile is exact too, but for the rotary tables' copy to the device.
#include <map>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "models/llama/llama_model.h"
#include "models/train/gpt_shape_only.h"
#include "models/train/shape_only_truth.h"
#include "shardmap/rank_context.h"

namespace shardmap {
namespace {

using shape_only_testing::RankTruth;
using shape_only_testing::RealStep;

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

struct Case {
  std::string name, mesh;
  bool sp = false;
  int64_t batch = 4, microbatches = 1;
  bool bf16 = false;
};

class ShapeOnlyLlamaTest : public ::testing::TestWithParam<Case> {};

TEST_P(ShapeOnlyLlamaTest, EveryRankMatchesTheRealStep) {
  const Case& k = GetParam();
  absl::StatusOr<Mesh> mesh = ParseMesh(k.mesh);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  LlamaConfig cfg = kLlama;
  if (k.bf16) cfg.compute = DType::kBF16;
  absl::StatusOr<LlamaLayout> layout = LlamaLayout::Create(*mesh, cfg, k.sp);
  ASSERT_TRUE(layout.ok()) << layout.status();
  TrainOptions o;
  o.batch = k.batch;
  o.pipeline.microbatches = k.microbatches;
  o.optimizer.clip = 0;  // the one data-dependent branch (gpt_shape_only_test.cc)
  // The rotary tables are cached per process (llama_model.cc): the step that first makes them
  // holds them too. A first real step warms the cache, so every measured step reads it.
  RealStep(*layout, o);
  const std::map<int, RankTruth> truth = RealStep(*layout, o);
  ASSERT_EQ(truth.size(), static_cast<size_t>(mesh->size()));
  std::vector<Device> exact = {Device::Cpu()};
  if (k.bf16) exact.push_back(Device::Meta());  // the composed rope on both (see above)
  for (const Device device : exact) {
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
      // bf16 on meta: the cached host rotary tables (cos, sin [rows, 1, head_dim]) are copied
      // to the step's device each step, as a CUDA step copies them; the CPU step reads them.
      const int64_t rows = k.batch / layout->batch_ways() * kLlama.seq / layout->cp_ways();
      const int64_t tables = device.is_meta() ? 2 * rows * layout->shape().head_dim() * 2 : 0;
      EXPECT_EQ(p->peak_bytes, t.peak + tables);
      EXPECT_DOUBLE_EQ(p->flops, t.flops);
      EXPECT_GT(p->flops, 0);
      EXPECT_EQ(p->optimizer_bytes, 2 * p->parameter_bytes);  // AdamW's two moments
      EXPECT_GT(p->activation_peak_bytes, 0);
    }
  }
  if (k.bf16) return;
  // f32 on meta: the same collectives and parameters; the composed rope's FLOPs and
  // temporaries on top (a few of its elementwise ops per rotated element, per block and pass).
  for (int rank = 0; rank < mesh->size(); ++rank) {
    SCOPED_TRACE(RankDescription(*mesh, rank));
    absl::StatusOr<StepProfile> p = ProfileGptRank(*layout, o, rank, "", Device::Meta());
    absl::StatusOr<StepProfile> cpu = ProfileGptRank(*layout, o, rank, "", Device::Cpu());
    ASSERT_TRUE(p.ok() && cpu.ok()) << p.status() << cpu.status();
    ASSERT_EQ(p->collectives.size(), cpu->collectives.size());
    EXPECT_EQ(p->collective_bytes, cpu->collective_bytes);
    EXPECT_EQ(p->parameter_bytes, cpu->parameter_bytes);
    const double rotated = 2.0 * kLlama.layers * o.batch * kLlama.seq *
                           (kLlama.heads + kLlama.kv_heads) * (kLlama.d_model / kLlama.heads);
    EXPECT_GT(p->flops, cpu->flops);
    EXPECT_LE(p->flops - cpu->flops, 8 * rotated);
    EXPECT_GE(p->peak_bytes, cpu->peak_bytes);
    EXPECT_LE(p->peak_bytes - cpu->peak_bytes, 4 * rotated);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Meshes, ShapeOnlyLlamaTest,
    ::testing::Values(Case{.name = "single", .mesh = "dp=1"},
                      Case{.name = "dp2", .mesh = "dp=2"},
                      Case{.name = "fsdp2_tp2_sp", .mesh = "dp_shard=2,tp=2", .sp = true},
                      Case{.name = "pp2_1f1b", .mesh = "pp=2", .microbatches = 2},
                      Case{.name = "dp2_cp2", .mesh = "dp=2,cp=2"},
                      Case{.name = "single_bf16", .mesh = "dp=1", .bf16 = true},
                      Case{.name = "fsdp2_tp2_sp_bf16", .mesh = "dp_shard=2,tp=2", .sp = true,
                           .bf16 = true}),
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
