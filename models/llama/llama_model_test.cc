// Llama 3 on the model contract: the SwiGLU width rule and presets, the registry and its
// refusals, the parameter table per mesh, RMSNorm and rope against naive loops, gradients
// against finite differences, the loss and every gradient on dp2xtp2, fsdp2xtp2+SP, fsdp2,
// HSDP, cp2 (+tp2+SP), tp2 (GQA), tp3 (odd sizes), recomputation and bf16 against one device
// (f64: 1e-12), and one device against an independent PyTorch model
// (bench/peers/llama_torch_check.py, its output committed in testdata/) to 1e-9 relative.
#include "models/llama/llama_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "autograd/value_and_grad.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/components/checkpoint.h"
#include "models/model/registry.h"
#include "models/parallel/ring_attention.h"
#include "shardmap/collective_ops.h"
#include "shardmap/nn_ops.h"
#include "shardmap/ops.h"
#include "shardmap/shard_map.h"
#include "spmd_testing/finite_difference.h"
#include "tensor/error.h"
#include "tensor/ops/shape_ops.h"
#include "tensor/random.h"

namespace shardmap {
namespace {

using ::testing::HasSubstr;

// ---- Shapes, presets, registry --------------------------------------------------------------

TEST(LlamaFfnDimTest, MetaRuleGivesTheReleasedWidths) {
  EXPECT_EQ(LlamaFfnDim(4096, 1024, 1.3), 14336);   // Llama 3 8B
  EXPECT_EQ(LlamaFfnDim(8192, 4096, 1.3), 28672);   // 70B
  EXPECT_EQ(LlamaFfnDim(16384, 4096, 1.2), 53248);  // 405B
  EXPECT_EQ(LlamaFfnDim(256, 256), 768);            // torchtitan debugmodel: int(2*1024/3)=682
  EXPECT_EQ(LlamaFfnDim(4096, 256), 11008);         // Llama 2 7B (no multiplier)
}

TEST(LlamaPresetTest, TorchtitanFlavours) {
  absl::StatusOr<LlamaConfig> c = LlamaPreset("llama3_8b");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->layers, 32);
  EXPECT_EQ(c->d_model, 4096);
  EXPECT_EQ(c->heads, 32);
  EXPECT_EQ(c->kv_heads, 8);
  EXPECT_EQ(c->ffn_dim, 14336);
  EXPECT_EQ(c->vocab, 128256);
  EXPECT_EQ(c->rope_theta, 500000);
  EXPECT_EQ(c->norm_eps, 1e-5);
  EXPECT_EQ(LlamaPreset("llama3_70b")->ffn_dim, 28672);
  EXPECT_EQ(LlamaPreset("llama3_405b")->ffn_dim, 53248);
  EXPECT_EQ(LlamaPreset("llama3_405b")->layers, 126);
  EXPECT_EQ(LlamaPreset("llama3_debug")->d_model, 256);
  EXPECT_THAT(LlamaPreset("llama3_7b").status().message(), HasSubstr("llama3_8b"));
  // Meta's 8B has 8.03e9 parameters: ours count all but the 525M embedding lookup.
  const double n = LlamaMatmulParameterCount(*c) + 128256.0 * 4096;
  EXPECT_NEAR(n / 1e9, 8.03, 0.005);
}

TEST(LlamaRegistryTest, CreatesFromPresetAndFlags) {
  ModelArgs a{.preset = "llama3_debug"};
  a.layers = 2;
  a.vocab = 128;
  a.seq = 16;
  a.kv_heads = 4;
  a.rope_theta = 10000;
  absl::StatusOr<std::unique_ptr<Model>> m = CreateModel("llama3", a, *ParseMesh("dp=1"), false);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->name(), "llama3");
  EXPECT_EQ((*m)->Describe(), "llama3 2 layers d 256 heads 16/4 kv ffn 768 vocab 128 seq 16");
  const auto* l = dynamic_cast<const LlamaLayout*>(m->get());
  ASSERT_NE(l, nullptr);
  EXPECT_EQ(l->config().rope_theta, 10000);
  EXPECT_EQ((*m)->params().size(), 3u + 2 * 9);  // embed, 9 per layer, norm, lm_head
}

// train's flags: without a preset kv_heads defaults to heads and ffn_dim to Meta's rule; 0
// means "the preset's".
TEST(LlamaRegistryTest, UnsetOrZeroFlagsTakeThePresetsOrTheRule) {
  ModelArgs plain;
  plain.d_model = 64;
  plain.heads = 4;
  LlamaConfig c = *LlamaConfigFromArgs(plain);
  EXPECT_EQ(c.kv_heads, 4);
  EXPECT_EQ(c.ffn_dim, 256);  // int(2 * 256 / 3) = 170 -> 256
  EXPECT_EQ(c.rope_theta, 500000);
  ModelArgs zeros{.preset = "llama3_8b"};
  zeros.kv_heads = 0;
  zeros.ffn_dim = 0;
  zeros.rope_theta = 0;
  zeros.norm_eps = 0;
  c = *LlamaConfigFromArgs(zeros);
  EXPECT_EQ(c.kv_heads, 8);
  EXPECT_EQ(c.ffn_dim, 14336);
  EXPECT_EQ(c.rope_theta, 500000);
  EXPECT_EQ(c.norm_eps, 1e-5);
  ModelArgs over{.preset = "llama3_8b"};
  over.kv_heads = 4;
  over.layers = 2;
  c = *LlamaConfigFromArgs(over);
  EXPECT_EQ(c.kv_heads, 4);
  EXPECT_EQ(c.layers, 2);
  EXPECT_EQ(c.d_model, 4096);
}

TEST(LlamaRegistryTest, RefusesWhatLlamaLacksAndBadShapes) {
  const Mesh one = *ParseMesh("dp=1");
  ModelArgs moe;
  moe.moe.experts = 4;
  EXPECT_THAT(CreateModel("llama3", moe, one, false).status().message(),
              HasSubstr("no mixture of experts"));
  ModelArgs kv;
  kv.kv_heads = 3;  // heads 4
  EXPECT_THAT(CreateModel("llama3", kv, one, false).status().message(),
              HasSubstr("not divisible by kv_heads"));
  ModelArgs odd;
  odd.d_model = 12;
  odd.heads = 4;  // head_dim 3
  odd.kv_heads = 4;
  EXPECT_THAT(CreateModel("llama3", odd, one, false).status().message(), HasSubstr("odd"));
  ModelArgs bad_preset{.preset = "llama2"};
  EXPECT_THAT(CreateModel("llama3", bad_preset, one, false).status().message(),
              HasSubstr("llama2"));
  ModelArgs dtype{.dtype = "f16"};
  EXPECT_THAT(CreateModel("llama3", dtype, one, false).status().message(), HasSubstr("--dtype"));
  ModelArgs theta;
  theta.rope_theta = 0.5;  // (0 means "the preset's")
  EXPECT_THAT(CreateModel("llama3", theta, one, false).status().message(),
              HasSubstr("rope_theta"));
  // tp=4 > kv_heads=2: Megatron would replicate kv heads; we refuse.
  ModelArgs gqa;
  gqa.kv_heads = 2;
  EXPECT_THAT(CreateModel("llama3", gqa, *ParseMesh("tp=4"), false).status().message(),
              HasSubstr("Megatron replicates kv heads"));
  EXPECT_THAT(CreateModel("llama3", ModelArgs{}, *ParseMesh("cp=3"), false).status().message(),
              HasSubstr("2*cp"));
  EXPECT_THAT(CreateModel("llama3", ModelArgs{}, *ParseMesh("ep=2"), false).status().message(),
              HasSubstr("ep"));
}

TEST(LlamaRegistryTest, PresetsLayOutOnProductionMeshes) {
  bool listed = false;
  for (const ModelSpec* m : RegisteredModels()) listed |= m->name == "llama3";
  EXPECT_TRUE(listed);
  // 8B on 8 GPUs of tp and 4-way FSDP: kv heads 8 split one per device; 405B on tp=8 too.
  for (const char* preset : {"llama3_8b", "llama3_405b"}) {
    SCOPED_TRACE(preset);
    absl::StatusOr<std::unique_ptr<Model>> m =
        CreateModel("llama3", ModelArgs{.preset = preset}, *ParseMesh("dp_shard=4,tp=8"), true);
    ASSERT_TRUE(m.ok()) << m.status();
    const ParamInfo& k = (*m)->params()[(*m)->Find("model.layers.0.self_attn.k_proj.weight")];
    EXPECT_EQ(k.global_shape[0], 8 * 128);
    EXPECT_EQ(k.fsdp_dim, 1);
  }
  EXPECT_THAT(CreateModel("llama3", ModelArgs{.preset = "llama3_8b"}, *ParseMesh("tp=16"), false)
                  .status()
                  .message(),
              HasSubstr("kv_heads 8 are not divisible by tp=16"));
  // The debug model's vocab (2048) and seq (2048) on cp=4 x tp=4.
  EXPECT_TRUE(CreateModel("llama3", ModelArgs{.preset = "llama3_debug"}, *ParseMesh("cp=4,tp=4"),
                          true)
                  .ok());
}

TEST(LlamaLayoutTest, ParameterTableOnFsdpTimesTp) {
  LlamaLayout l = *LlamaLayout::Create(*ParseMesh("dp_shard=2,tp=2"), LlamaConfig{}, true);
  auto info = [&](const std::string& name) { return l.params()[l.Find(name)]; };
  const ParamInfo q = info("model.layers.1.self_attn.q_proj.weight");
  EXPECT_EQ(q.global_shape, (Shape{32, 32}));
  EXPECT_EQ(q.spec.ToString(), PartitionSpec({{"tp"}, {"dp_shard"}}).ToString());
  EXPECT_EQ(q.fsdp_dim, 1);
  EXPECT_EQ(q.unit.kind, ModelUnit::kBlock);
  EXPECT_EQ(q.unit.block, 1);
  EXPECT_TRUE(q.decay);
  EXPECT_EQ(info("model.layers.0.self_attn.k_proj.weight").global_shape, (Shape{16, 32}));
  const ParamInfo o = info("model.layers.0.self_attn.o_proj.weight");
  EXPECT_EQ(o.spec.ToString(), PartitionSpec({{"dp_shard"}, {"tp"}}).ToString());
  const ParamInfo down = info("model.layers.0.mlp.down_proj.weight");
  EXPECT_EQ(down.global_shape, (Shape{32, 96}));
  EXPECT_EQ(down.fsdp_dim, 0);
  const ParamInfo norm = info("model.norm.weight");
  EXPECT_FALSE(norm.decay);
  EXPECT_EQ(norm.unit.kind, ModelUnit::kHead);
  EXPECT_EQ(norm.fsdp_dim, 0);
  EXPECT_EQ(info("lm_head.weight").unit.kind, ModelUnit::kHead);
  EXPECT_EQ(info("model.embed_tokens.weight").unit.kind, ModelUnit::kEmbed);
  for (const ParamInfo& p : l.params()) EXPECT_FALSE(p.tied_to_head) << p.name;
  EXPECT_EQ(l.CheckpointName(q), q.name);
  EXPECT_EQ(l.shape().heads, 4);
  EXPECT_EQ(l.shape().kv_heads, 2);
  const std::map<std::string, std::string> meta = l.ShapeMetadata();
  EXPECT_EQ(meta.at("model"), "llama3");
  EXPECT_EQ(meta.at("llama3.kv_heads"), "2");
  EXPECT_EQ(meta.at("llama3.ffn_dim"), "96");
  EXPECT_EQ(meta.at("llama3.rope_theta"), "500000");
}

TEST(LlamaLayoutTest, InitIsSeededNormalWithDepthScaledOutputs) {
  LlamaConfig c;
  c.layers = 3;
  c.dtype = DType::kF64;
  std::vector<NamedTensor> a = InitLlama(c, 5), b = InitLlama(c, 5), d = InitLlama(c, 6);
  auto stddev = [](const Tensor& t) {
    double s = 0;
    for (int64_t i = 0; i < t.numel(); ++i) s += t.at(i) * t.at(i);
    return std::sqrt(s / static_cast<double>(t.numel()));
  };
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].name, b[i].name);
    const Tensor& t = a[i].tensor;
    EXPECT_EQ(t.ToVector<double>(), b[i].tensor.ToVector<double>()) << a[i].name;
    if (t.rank() == 1) {
      EXPECT_EQ(t.at(0), 1.0) << a[i].name;
      continue;
    }
    EXPECT_NE(t.ToVector<double>(), d[i].tensor.ToVector<double>()) << a[i].name;
    double want = 0.02;
    for (int64_t layer = 0; layer < 3; ++layer) {
      const std::string l = absl::StrCat("model.layers.", layer, ".");
      if (a[i].name == l + "self_attn.o_proj.weight" || a[i].name == l + "mlp.down_proj.weight") {
        want = 0.02 / std::sqrt(2.0 * (layer + 1));
      }
    }
    EXPECT_NEAR(stddev(t), want, want * 0.2) << a[i].name;  // >= 1024 draws: ~2% spread
  }
}

TEST(LlamaFlopsTest, SixNPlusAttention) {
  LlamaConfig c;  // d 32, heads 4 (hd 8), kv 2, ffn 96, vocab 64, seq 8, 2 layers
  const double attn = 32 * 32 + 2 * 32 * 16 + 32 * 32, block = attn + 3 * 32 * 96 + 64;
  const double n = 2 * block + 32 + 64 * 32;
  EXPECT_EQ(LlamaMatmulParameterCount(c), n);
  EXPECT_EQ(LlamaFlopsPerToken(c), 6 * n + 12.0 * 2 * 4 * 8 * 8);
  EXPECT_EQ(LlamaLayout::Create(*ParseMesh("dp=1"), c, false)->FlopsPerToken(),
            LlamaFlopsPerToken(c));
}

// ---- The ops against naive loops ------------------------------------------------------------

// fn on one device (a mesh of one axis of size 1), whole tensors in and out.
std::vector<Tensor> OnOneDevice(const ShardFn& fn, const std::vector<Tensor>& in, int outs = 1) {
  absl::StatusOr<std::vector<Tensor>> r =
      ShardMap(fn, *ParseMesh("dp=1"), std::vector<PartitionSpec>(in.size()),
               std::vector<PartitionSpec>(outs))(in);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : std::vector<Tensor>();
}

TEST(LlamaOpsTest, RmsNormMatchesNaiveLoop) {
  Tensor x = RandomNormal({5, 12}, 1, 0, 1, DType::kF64);
  Tensor w = RandomNormal({12}, 2, 1, 0.3, DType::kF64);
  const double eps = 1e-5;
  Tensor y = OnOneDevice(
      [eps](const std::vector<Value>& in) {
        return std::vector<Value>{rms_norm(in[0], in[1], eps)};
      },
      {x, w})[0];
  for (int64_t r = 0; r < 5; ++r) {
    double ms = 0;
    for (int64_t j = 0; j < 12; ++j) ms += x.at(r * 12 + j) * x.at(r * 12 + j) / 12;
    for (int64_t j = 0; j < 12; ++j) {
      EXPECT_NEAR(y.at(r * 12 + j), x.at(r * 12 + j) / std::sqrt(ms + eps) * w.at(j), 1e-14);
    }
  }
}

TEST(LlamaOpsTest, RopeMatchesHfFormulaAndPositions) {
  const int64_t n = 6, heads = 3, hd = 8, half = 4;
  const double theta = 10000;
  std::vector<int64_t> pos = {0, 1, 2, 7, 100, 5};
  RopeTables t = MakeRopeTables(pos, hd, theta, DType::kF64);
  Tensor x = RandomNormal({n, heads, hd}, 3, 0, 1, DType::kF64);
  Tensor y = OnOneDevice(
      [](const std::vector<Value>& in) {
        return std::vector<Value>{ApplyRope(in[0], in[1], in[2])};
      },
      {x, t.cos, t.sin})[0];
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t i = 0; i < half; ++i) {  // the pair (i, i + half) rotates by pos * inv_freq_i
        const double a = pos[r] * std::pow(theta, -2.0 * i / hd);
        const int64_t base = (r * heads + h) * hd;
        const double x1 = x.at(base + i), x2 = x.at(base + half + i);
        EXPECT_NEAR(y.at(base + i), x1 * std::cos(a) - x2 * std::sin(a), 1e-13);
        EXPECT_NEAR(y.at(base + half + i), x2 * std::cos(a) + x1 * std::sin(a), 1e-13);
      }
    }
  }
  // Rows are batch-major sequences; an offset continues them; cp gives the chunks' positions.
  EXPECT_EQ(RopePositions(6, 3, 1, 0, 0), (std::vector<int64_t>{0, 1, 2, 0, 1, 2}));
  EXPECT_EQ(RopePositions(3, 3, 1, 0, 10), (std::vector<int64_t>{10, 11, 12}));
  // seq 8, cp 2: chunks of 2; device 1 holds chunks 1 and 2 -> positions 2,3,4,5.
  EXPECT_EQ(RopePositions(8, 8, 2, 1, 0), (std::vector<int64_t>{2, 3, 4, 5, 2, 3, 4, 5}));
  EXPECT_EQ(RopePositions(4, 8, 2, 0, 0), (std::vector<int64_t>{0, 1, 6, 7}));
}

// ---- The model on a mesh --------------------------------------------------------------------

struct LossGrads {
  double loss = 0;
  std::vector<Tensor> grads;  // params() order, global
};

// tokens [batch, seq + 1] -> the rows (ids, targets) of the batch in LoadBalancedRows order.
std::pair<Tensor, Tensor> Rows(const Tensor& tokens, int64_t seq, int batch_ways, int cp) {
  const int64_t batch = tokens.dim(0);
  std::vector<int64_t> ids, targets;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 0; t < seq; ++t) {
      ids.push_back(static_cast<int64_t>(tokens.at(b * (seq + 1) + t)));
      targets.push_back(static_cast<int64_t>(tokens.at(b * (seq + 1) + t + 1)));
    }
  }
  auto order = [&](const std::vector<int64_t>& v) {
    return LoadBalancedRows(Tensor::FromVector<int64_t>({batch, seq}, v), batch_ways, cp);
  };
  return {order(ids), order(targets)};
}

// The mean loss of the batch and the gradients of every parameter, run as the per-device code
// through shard_map + value_and_grad on `mesh_text`.
absl::StatusOr<LossGrads> RunLlama(const std::string& mesh_text, bool sp, const LlamaConfig& cfg,
                                   const std::vector<Tensor>& params, const Tensor& tokens) {
  absl::StatusOr<Mesh> mesh = ParseMesh(mesh_text);
  if (!mesh.ok()) return mesh.status();
  absl::StatusOr<LlamaLayout> made = LlamaLayout::Create(*mesh, cfg, sp);
  if (!made.ok()) return made.status();
  auto layout = std::make_shared<const LlamaLayout>(*std::move(made));
  const int64_t global_tokens = tokens.dim(0) * cfg.seq;
  auto [ids, targets] = Rows(tokens, cfg.seq, layout->batch_ways(), layout->cp_ways());
  std::vector<PartitionSpec> in_specs;
  for (const ParamInfo& p : layout->params()) in_specs.push_back(p.spec);
  in_specs.push_back(layout->RowSpec(false));
  in_specs.push_back(layout->RowSpec(false));
  const size_t np = layout->params().size();
  std::vector<std::string> reduce = layout->batch_axes();
  if (!layout->cp_axis().empty()) reduce.push_back(layout->cp_axis());
  ShardFn fn = [layout, np, global_tokens, reduce](const std::vector<Value>& in) {
    std::vector<Value> params(in.begin(), in.begin() + np);
    Value loss = ModelLoss(*layout, ParamUse(*layout, params), in[np], in[np + 1], global_tokens);
    return std::vector<Value>{reduce.empty() ? loss : all_reduce(loss, reduce)};
  };
  std::vector<Tensor> inputs = params;
  inputs.push_back(ids);
  inputs.push_back(targets);
  absl::StatusOr<ShardMapGrads> r =
      value_and_grad(ShardMap(fn, *mesh, in_specs, {PartitionSpec()}))(inputs);
  if (!r.ok()) return r.status();
  LossGrads out;
  out.loss = Cast(r->outputs[0], DType::kF64).at(0);
  out.grads.assign(r->grads.begin(), r->grads.begin() + np);
  return out;
}

LlamaConfig SmallF64() {
  LlamaConfig c;  // 2 layers, d 32, heads 4, kv 2 (GQA), ffn 96, vocab 64, seq 8
  c.dtype = DType::kF64;
  c.rope_theta = 10000;
  return c;
}

Tensor RandomTokens(int64_t batch, int64_t seq, int64_t vocab, uint64_t seed) {
  Tensor u = RandomUniform({batch, seq + 1}, seed, 0, static_cast<double>(vocab), DType::kF64);
  std::vector<double> v(u.numel());
  for (int64_t i = 0; i < u.numel(); ++i) v[i] = std::floor(u.at(i));
  return Tensor::FromVector<double>({batch, seq + 1}, v);
}

std::vector<Tensor> Globals(const std::vector<NamedTensor>& init) {
  std::vector<Tensor> v;
  for (const NamedTensor& t : init) v.push_back(t.tensor);
  return v;
}

// max |got - want| / (max |want| + tiny) over the tensor: a relative error of the whole tensor.
double RelDiff(const Tensor& got, const Tensor& want) {
  double diff = 0, scale = 1e-300;
  for (int64_t i = 0; i < want.numel(); ++i) {
    diff = std::max(diff, std::abs(got.at(i) - want.at(i)));
    scale = std::max(scale, std::abs(want.at(i)));
  }
  return diff / scale;
}

void ExpectSame(const LossGrads& got, const LossGrads& want, const LlamaConfig& c, double tol) {
  EXPECT_NEAR(got.loss, want.loss, tol * std::abs(want.loss));
  ASSERT_EQ(got.grads.size(), want.grads.size());
  const LlamaLayout one = *LlamaLayout::Create(*ParseMesh("dp=1"), c, false);
  for (size_t i = 0; i < want.grads.size(); ++i) {
    ASSERT_EQ(got.grads[i].shape(), want.grads[i].shape()) << one.params()[i].name;
    EXPECT_LE(RelDiff(Cast(got.grads[i], DType::kF64), Cast(want.grads[i], DType::kF64)), tol)
        << one.params()[i].name;
  }
}

struct MeshCase {
  std::string mesh;
  bool sp;
  RecomputeMode recompute = RecomputeMode::kNone;
};
void PrintTo(const MeshCase& c, std::ostream* os) {
  *os << c.mesh << (c.sp ? " +sp" : "") << " recompute " << static_cast<int>(c.recompute);
}
std::string CaseName(const ::testing::TestParamInfo<MeshCase>& p) {
  std::string s = p.param.mesh + (p.param.sp ? "_sp" : "");
  if (p.param.recompute == RecomputeMode::kFull) s += "_full";
  if (p.param.recompute == RecomputeMode::kSelective) s += "_selective";
  for (char& ch : s) {
    if (ch == '=' || ch == ',') ch = '_';
  }
  return s;
}

class LlamaShardedTest : public ::testing::TestWithParam<MeshCase> {};

TEST_P(LlamaShardedTest, LossAndGradientsMatchOneDevice) {
  LlamaConfig c = SmallF64();
  const std::vector<Tensor> params = Globals(InitLlama(c, 3));
  const Tensor tokens = RandomTokens(4, c.seq, c.vocab, 11);
  absl::StatusOr<LossGrads> want = RunLlama("dp=1", false, c, params, tokens);
  ASSERT_TRUE(want.ok()) << want.status();
  EXPECT_GT(want->loss, 3.5);  // ~log(64) = 4.16 at init
  c.recompute = GetParam().recompute;
  absl::StatusOr<LossGrads> got = RunLlama(GetParam().mesh, GetParam().sp, c, params, tokens);
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectSame(*got, *want, c, 1e-12);
}

INSTANTIATE_TEST_SUITE_P(
    Meshes, LlamaShardedTest,
    ::testing::Values(MeshCase{"dp=2,tp=2", false}, MeshCase{"dp_shard=2,tp=2", true},
                      MeshCase{"dp_shard=2", false}, MeshCase{"dp_replicate=2,dp_shard=2", false},
                      MeshCase{"tp=2", false}, MeshCase{"tp=2", true}, MeshCase{"cp=2", false},
                      MeshCase{"cp=2,tp=2", true},
                      MeshCase{"dp_shard=2,tp=2", true, RecomputeMode::kFull},
                      MeshCase{"cp=2", false, RecomputeMode::kSelective},
                      MeshCase{"tp=2", false, RecomputeMode::kSelective}),
    CaseName);

// A non-power-of-two mesh with odd sizes: tp=3, heads 6, kv 3 (one kv head per device), d 36
// (head_dim 6), ffn 45, vocab 51, seq 6, 3 sequences.
TEST(LlamaShardedOddTest, Tp3OddSizesMatchOneDevice) {
  LlamaConfig c = SmallF64();
  c.d_model = 36;
  c.heads = 6;
  c.kv_heads = 3;
  c.ffn_dim = 45;
  c.vocab = 51;
  c.seq = 6;
  const std::vector<Tensor> params = Globals(InitLlama(c, 4));
  const Tensor tokens = RandomTokens(3, c.seq, c.vocab, 12);
  absl::StatusOr<LossGrads> want = RunLlama("dp=1", false, c, params, tokens);
  ASSERT_TRUE(want.ok()) << want.status();
  for (bool sp : {false, true}) {
    SCOPED_TRACE(sp ? "tp=3 + sp" : "tp=3");
    absl::StatusOr<LossGrads> got = RunLlama("tp=3", sp, c, params, tokens);
    ASSERT_TRUE(got.ok()) << got.status();
    ExpectSame(*got, *want, c, 1e-12);
  }
  absl::StatusOr<LossGrads> dp3 = RunLlama("dp_shard=3", false, c, params, tokens);
  ASSERT_TRUE(dp3.ok()) << dp3.status();
  ExpectSame(*dp3, *want, c, 1e-12);
}

// Mixed precision: f32 master weights, bf16 compute on fsdp2 x tp2 + SP against the same on one
// device (bf16 rounding differs with the reduction order: loss within 1/256 relative).
TEST(LlamaShardedTest, Bf16MixedPrecisionTracksOneDevice) {
  LlamaConfig c = SmallF64();
  c.dtype = DType::kF32;
  c.compute = DType::kBF16;
  const std::vector<Tensor> params = Globals(InitLlama(c, 3));
  const Tensor tokens = RandomTokens(4, c.seq, c.vocab, 11);
  absl::StatusOr<LossGrads> one = RunLlama("dp=1", false, c, params, tokens);
  absl::StatusOr<LossGrads> got = RunLlama("dp_shard=2,tp=2", true, c, params, tokens);
  ASSERT_TRUE(one.ok()) << one.status();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->grads[0].dtype(), DType::kF32);  // gradients in the master dtype
  EXPECT_NEAR(got->loss, one->loss, one->loss / 256);
  LlamaConfig f64 = SmallF64();
  std::vector<Tensor> params64;
  for (const Tensor& t : params) params64.push_back(Cast(t, DType::kF64));
  absl::StatusOr<LossGrads> exact = RunLlama("dp=1", false, f64, params64, tokens);
  ASSERT_TRUE(exact.ok()) << exact.status();
  EXPECT_NEAR(one->loss, exact->loss, exact->loss / 128);
}

// The sharded backward against central differences of the sharded forward (f64).
TEST(LlamaGradientTest, MatchesFiniteDifferencesOnTp2Cp) {
  for (const char* mesh_text : {"tp=2", "cp=2"}) {
    SCOPED_TRACE(mesh_text);
    LlamaConfig c = SmallF64();
    c.layers = 1;
    Mesh mesh = *ParseMesh(mesh_text);
    auto layout = std::make_shared<const LlamaLayout>(*LlamaLayout::Create(mesh, c, false));
    const Tensor tokens = RandomTokens(2, c.seq, c.vocab, 13);
    auto [ids, targets] = Rows(tokens, c.seq, 1, layout->cp_ways());
    std::vector<PartitionSpec> specs;
    for (const ParamInfo& p : layout->params()) specs.push_back(p.spec);
    specs.push_back(layout->RowSpec(false));
    specs.push_back(layout->RowSpec(false));
    const size_t np = layout->params().size();
    const std::string cp = layout->cp_axis();
    ShardFn fn = [layout, np, cp](const std::vector<Value>& in) {
      std::vector<Value> params(in.begin(), in.begin() + np);
      Value loss = ModelLoss(*layout, ParamUse(*layout, params), in[np], in[np + 1], 16);
      return std::vector<Value>{cp.empty() ? loss : all_reduce(loss, cp)};
    };
    std::vector<Tensor> in = Globals(InitLlama(c, 8));
    for (Tensor& t : in) t = Cast(t, DType::kF64);
    for (size_t i = 0; i < in.size(); ++i) {  // larger weights: a visible nonlinearity
      in[i] = in[i].rank() == 1 ? RandomNormal(in[i].shape(), 40 + i, 1, 0.2, DType::kF64)
                                : RandomNormal(in[i].shape(), 40 + i, 0, 0.3, DType::kF64);
    }
    in.push_back(ids);
    in.push_back(targets);
    spmd_testing::FiniteDifferenceOptions o;
    o.max_probes = 6;
    EXPECT_TRUE(spmd_testing::GradientsMatchFiniteDifferences(ShardMap(fn, mesh, specs,
                                                                       {PartitionSpec()}),
                                                              in, o));
  }
}

// ---- The independent PyTorch model ----------------------------------------------------------

// bench/peers/llama_torch_check.py's shape (kept in step with its constants).
LlamaConfig TorchRef() {
  LlamaConfig c;
  c.layers = 2;
  c.d_model = 32;
  c.heads = 4;
  c.kv_heads = 2;
  c.ffn_dim = 80;
  c.vocab = 64;
  c.seq = 16;
  c.rope_theta = 10000;
  c.norm_eps = 1e-5;
  c.dtype = DType::kF64;
  return c;
}

TEST(LlamaTorchReferenceTest, LossAndGradientsMatchPyTorch) {
  absl::StatusOr<SafetensorsFile> f =
      SafetensorsFile::Open("models/llama/testdata/llama_torch_reference.safetensors");
  ASSERT_TRUE(f.ok()) << f.status();
  const LlamaConfig c = TorchRef();
  const LlamaLayout one = *LlamaLayout::Create(*ParseMesh("dp=1"), c, false);
  std::vector<Tensor> params;
  LossGrads torch;
  for (const ParamInfo& p : one.params()) {
    absl::StatusOr<Tensor> w = f->Read(p.name), g = f->Read("grad." + p.name);
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_TRUE(g.ok()) << g.status();
    ASSERT_EQ(w->shape(), p.global_shape) << p.name;  // HF names and [out, in] layouts
    params.push_back(*w);
    torch.grads.push_back(*g);
  }
  const Tensor tokens = *f->Read("tokens");
  torch.loss = f->Read("loss")->at(0);
  for (const auto& [mesh, sp] : std::vector<std::pair<std::string, bool>>{
           {"dp=1", false}, {"dp_shard=2,tp=2", true}, {"cp=2", false}}) {
    SCOPED_TRACE(mesh);
    absl::StatusOr<LossGrads> got = RunLlama(mesh, sp, c, params, tokens);
    ASSERT_TRUE(got.ok()) << got.status();
    ExpectSame(*got, torch, c, 1e-9);
    double worst = 0;
    for (size_t i = 0; i < torch.grads.size(); ++i) {
      worst = std::max(worst, RelDiff(got->grads[i], torch.grads[i]));
    }
    std::printf("llama3 on %s vs PyTorch: loss %.17g vs %.17g, worst gradient rel diff %.3g\n",
                mesh.c_str(), got->loss, torch.loss, worst);
  }
}

TEST(LlamaEmbedTest, PositionOffsetNeedsTheLayoutsOffset) {
  LlamaLayout l = *LlamaLayout::Create(*ParseMesh("dp=1"), SmallF64(), false);
  EXPECT_EQ(l.WithPositionOffset(5)->position_offset(), 5);
  EXPECT_FALSE(l.WithPositionOffset(-1).ok());
  LlamaLayout cp = *LlamaLayout::Create(*ParseMesh("cp=2"), SmallF64(), false);
  EXPECT_THAT(cp.WithPositionOffset(3).status().message(), HasSubstr("generate without cp"));
  ParamFn use = [](const std::string&) -> Value { return Value(); };
  const Value ids(Tensor::FromVector<int64_t>({2}, {1, 2}), SpmdType(1));
  try {
    l.Embed(use, ids, 3);
    ADD_FAILURE() << "Embed took an offset the layout does not have";
  } catch (const OpError& e) {
    EXPECT_THAT(e.what(), HasSubstr("WithPositionOffset(3)"));
  }
}

}  // namespace
}  // namespace shardmap
