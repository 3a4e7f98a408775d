// FSDP with sizes dp_shard does not divide (ParamInfo::fsdp_pad, FSDP2's padding): every
// parameter with a free dim is sharded; GPT-2 and Llama 3 of odd sizes train in f64 on
// dp_shard = 3, 5 and 7, HSDP, fsdp x tp (with and without SP), pp x dp_shard and the
// non-overlapped schedule to the one-device run of the same batch (losses, clipped gradient
// norms, parameters and AdamW moments to 1e-9 relative); a checkpoint saved on dp_shard=3 holds
// unpadded tensors and resumes on dp_shard=1 and 2 to the one-device run; dp_shard=3 with
// d_model 32 holds about a third of the parameters per rank, and the shape-only step counts
// the same bytes.
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "models/components/checkpoint.h"
#include "models/gpt.h"
#include "models/llama/llama_model.h"
#include "models/train/gpt_shape_only.h"
#include "models/train/gpt_test_util.h"
#include "tensor/error.h"
#include "tests/test_util.h"

namespace shardmap {
namespace {

using gpt_testing::RelDiff;

// No dim of d_model 22, 4 d_model 88, vocab 26 or seq 8 divides by 3, 5 or 7 (but c_attn's
// [d, 3, d] has its 3).
GptConfig OddGpt() {
  GptConfig c;
  c.layers = 2;
  c.d_model = 22;
  c.heads = 2;
  c.vocab = 26;
  c.seq = 8;
  c.dtype = DType::kF64;
  return c;
}

// d_model 44 (head_dim 22: RoPE rotates pairs), ffn 52, vocab 26, seq 8: none divides by 3, 5
// or 7.
LlamaConfig OddLlama() {
  LlamaConfig c;
  c.layers = 2;
  c.d_model = 44;
  c.heads = 2;
  c.kv_heads = 2;
  c.ffn_dim = 52;
  c.vocab = 26;
  c.seq = 8;
  c.dtype = DType::kF64;
  return c;
}

std::unique_ptr<Model> MakeModel(bool llama, const std::string& mesh, bool sp) {
  absl::StatusOr<Mesh> m = ParseMesh(mesh);
  EXPECT_TRUE(m.ok()) << m.status();
  if (llama) {
    absl::StatusOr<LlamaLayout> l = LlamaLayout::Create(*m, OddLlama(), sp);
    EXPECT_TRUE(l.ok()) << l.status();
    return l.ok() ? std::make_unique<LlamaLayout>(*l) : nullptr;
  }
  absl::StatusOr<GptLayout> l = GptLayout::Create(*m, OddGpt(), sp);
  EXPECT_TRUE(l.ok()) << l.status();
  return l.ok() ? std::make_unique<GptLayout>(*l) : nullptr;
}

std::vector<NamedTensor> Init(bool llama) {
  return llama ? MakeModel(true, "dp=1", false)->Init(7) : InitGpt(OddGpt(), 7);
}

// Three AdamW steps with active clipping (gpt_test_util's options) on `batch` sequences.
TrainOptions Steps(int64_t batch) {
  TrainOptions o = gpt_testing::ThreeSteps();
  o.batch = batch;
  return o;
}

TrainResult TrainRun(const Model& m, const std::vector<NamedTensor>& init, const TrainOptions& o) {
  absl::StatusOr<TrainResult> r =
      TrainGpt(m, init, gpt_testing::Tokens(600, m.shape().vocab), o);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : TrainResult{};
}

// The one-device run of the same model and batch (the independent reference), cached.
const TrainResult& OneDevice(bool llama, int64_t batch, int64_t steps = 3) {
  static std::map<std::tuple<bool, int64_t, int64_t>, TrainResult> cache;
  auto key = std::make_tuple(llama, batch, steps);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  TrainOptions o = Steps(batch);
  o.steps = steps;
  return cache[key] = TrainRun(*MakeModel(llama, "dp=1", false), Init(llama), o);
}

void ExpectTensorsNear(const std::vector<NamedTensor>& got, const std::vector<NamedTensor>& want,
                       const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].name, want[i].name);
    ASSERT_EQ(got[i].tensor.shape(), want[i].tensor.shape()) << what << " " << want[i].name;
    EXPECT_LE(RelDiff(got[i].tensor, want[i].tensor), 1e-9) << what << " " << want[i].name;
  }
}

// Losses, clipped norms (the padding must not count), parameters and moments to 1e-9.
void ExpectSameRun(const TrainResult& got, const TrainResult& ref) {
  ASSERT_EQ(got.losses.size(), ref.losses.size());
  for (size_t s = 0; s < ref.losses.size(); ++s) {
    EXPECT_NEAR(got.losses[s], ref.losses[s], 1e-9 * std::fabs(ref.losses[s])) << "step " << s;
    EXPECT_NEAR(got.grad_norms[s], ref.grad_norms[s], 1e-9 * ref.grad_norms[s]) << "step " << s;
  }
  ExpectTensorsNear(got.params, ref.params, "parameter");
  ExpectTensorsNear(got.adam_state.exp_avg, ref.adam_state.exp_avg, "exp_avg");
  ExpectTensorsNear(got.adam_state.exp_avg_sq, ref.adam_state.exp_avg_sq, "exp_avg_sq");
}

// Every parameter with a dim that tp and the experts leave free is FSDP-sharded; returns how
// many are padded.
int CheckEverySharded(const Model& m) {
  int padded = 0;
  for (const ParamInfo& p : m.params()) {
    bool free = false;  // a dim tp and the experts leave whole
    for (int d = 0; d < static_cast<int>(p.global_shape.size()); ++d) {
      free |= d >= p.spec.size() || p.spec.dim_axes(d).empty() ||
              (p.spec.dim_axes(d).size() == 1 && p.spec.dim_axes(d)[0] == "dp_shard");
    }
    if (!free) continue;
    EXPECT_GE(p.fsdp_dim, 0) << p.name << " is not FSDP-sharded";
    if (p.fsdp_dim < 0) continue;
    const int shard = m.dims().size("dp_shard");
    const int64_t n = p.global_shape[p.fsdp_dim];
    EXPECT_EQ((n + p.fsdp_pad) % shard, 0) << p.name;
    EXPECT_LT(p.fsdp_pad, shard) << p.name;
    EXPECT_EQ(p.fsdp_pad == 0, n % shard == 0) << p.name;
    padded += p.fsdp_pad > 0;
  }
  return padded;
}

struct Case {
  bool llama;
  std::string mesh;
  bool sp = false;
  int64_t batch = 12;
  bool overlap = true;
  int64_t microbatches = 1;
};

class FsdpPaddingTest : public ::testing::TestWithParam<Case> {};

TEST_P(FsdpPaddingTest, EqualsOneDeviceInF64) {
  const Case& k = GetParam();
  std::unique_ptr<Model> m = MakeModel(k.llama, k.mesh, k.sp);
  ASSERT_NE(m, nullptr);
  EXPECT_GT(CheckEverySharded(*m), 0) << "the case pads nothing";
  TrainOptions o = Steps(k.batch);
  o.overlap.on = k.overlap;
  o.pipeline.microbatches = k.microbatches;
  const TrainResult got = TrainRun(*m, Init(k.llama), o);
  ExpectSameRun(got, OneDevice(k.llama, k.batch));
  EXPECT_GT(got.grad_norms[0], o.optimizer.clip);  // clipping engaged
}

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  const Case& k = info.param;
  std::string n = std::string(k.llama ? "llama_" : "gpt_") + k.mesh + (k.sp ? "_sp" : "") +
                  (k.overlap ? "" : "_reference");
  for (char& c : n) {
    if (c == '=' || c == ',') c = '_';
  }
  return n;
}

INSTANTIATE_TEST_SUITE_P(
    Meshes, FsdpPaddingTest,
    ::testing::Values(Case{false, "dp_shard=3"}, Case{false, "dp_shard=5", false, 10},
                      Case{false, "dp_shard=7", false, 14},
                      Case{false, "dp_shard=3", false, 12, /*overlap=*/false},
                      Case{false, "dp_replicate=2,dp_shard=3"},
                      Case{false, "dp_shard=3,tp=2", false}, Case{false, "dp_shard=3,tp=2", true},
                      Case{false, "pp=2,dp_shard=3", false, 12, true, 2},
                      Case{false, "pp=2,dp_shard=3", false, 12, false, 2},
                      Case{true, "dp_shard=3"}, Case{true, "dp_shard=5", false, 10},
                      Case{true, "dp_shard=7", false, 14},
                      Case{true, "dp_replicate=2,dp_shard=3"},
                      Case{true, "dp_shard=3,tp=2", true}),
    CaseName);

// A checkpoint saved on dp_shard=3 after 2 steps holds the unpadded tensors (the one-device
// run's parameters and moments), and resumed on dp_shard=1 and 2 its third step is the
// one-device run's.
TEST(FsdpPaddingCheckpointTest, SavedUnpaddedResumesOnOtherShardCounts) {
  const std::string path = ::testing::TempDir() + "/fsdp_padding_dp_shard3.safetensors";
  TrainOptions two = Steps(12);
  two.steps = 2;
  two.checkpoint.save_path = path;
  TrainRun(*MakeModel(false, "dp_shard=3", false), Init(false), two);
  const TrainResult& ref2 = OneDevice(false, 12, 2);
  absl::StatusOr<SafetensorsFile> f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  const std::unique_ptr<Model> one = MakeModel(false, "dp=1", false);
  for (size_t i = 0; i < one->params().size(); ++i) {
    const ParamInfo& p = one->params()[i];
    const std::string saved = one->CheckpointName(p);
    for (const auto& [prefix, want] :
         {std::pair{"", &ref2.params[i]}, std::pair{"optimizer.exp_avg.", &ref2.adam_state.exp_avg[i]},
          std::pair{"optimizer.exp_avg_sq.", &ref2.adam_state.exp_avg_sq[i]}}) {
      absl::StatusOr<Tensor> t = f->Read(std::string(prefix) + saved);
      ASSERT_TRUE(t.ok()) << t.status();
      ASSERT_EQ(t->numel(), want->tensor.numel()) << prefix << saved << ": padded?";
      EXPECT_LE(RelDiff(t->Reshape(want->tensor.shape()), want->tensor), 1e-9) << prefix << saved;
    }
  }
  for (const std::string mesh : {"dp_shard=1", "dp_shard=2", "dp_shard=3"}) {
    SCOPED_TRACE(mesh);
    TrainOptions resume = Steps(12);
    resume.checkpoint.resume_path = path;
    const TrainResult got = TrainRun(*MakeModel(false, mesh, false), {}, resume);
    const TrainResult& ref3 = OneDevice(false, 12, 3);
    ASSERT_EQ(got.losses.size(), 1u);
    EXPECT_NEAR(got.losses[0], ref3.losses[2], 1e-9 * ref3.losses[2]);
    EXPECT_NEAR(got.grad_norms[0], ref3.grad_norms[2], 1e-9 * ref3.grad_norms[2]);
    ExpectTensorsNear(got.params, ref3.params, "parameter");
    ExpectTensorsNear(got.adam_state.exp_avg, ref3.adam_state.exp_avg, "exp_avg");
  }
}

// The run: --mesh=dp_shard=3 with d_model 32 (2 layers, vocab 256, seq 16: 133.5 KiB
// of f32 parameters) kept 117.0 KiB per rank when only dividing dims were sharded. Padded, a
// rank holds a third plus at most 2 padding rows per parameter; gradients as much; the shape-only
// step counts the same bytes.
TEST(FsdpPaddingMemoryTest, DpShard3HoldsAThirdPerRank) {
  GptConfig c;
  c.layers = 2;
  c.d_model = 32;
  c.heads = 4;
  c.vocab = 256;
  c.seq = 16;
  c.dtype = DType::kF32;
  GptLayout layout = *GptLayout::Create(*ParseMesh("dp_shard=3"), c, false);
  int64_t total = 0, bound = 0;
  for (const ParamInfo& p : layout.params()) {
    const int64_t n = NumElements(p.global_shape);
    total += n;
    ASSERT_GE(p.fsdp_dim, 0) << p.name;
    // ceil(rows / 3) rows of the other dims' elements.
    const int64_t rows = p.global_shape[p.fsdp_dim];
    bound += (rows + 2) / 3 * (n / rows);
  }
  ASSERT_EQ(total * 4, 136704);  // 133.5 KiB
  TrainOptions o;
  o.steps = 1;
  o.batch = 3;
  absl::StatusOr<TrainResult> r =
      TrainGpt(layout, InitGpt(c, 1), gpt_testing::Tokens(200, c.vocab), o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->param_bytes_per_rank, bound * 4);
  EXPECT_LE(r->param_bytes_per_rank, total * 4 / 3 * 1.02);
  EXPECT_EQ(r->gradient_bytes_per_rank, r->param_bytes_per_rank);
  EXPECT_EQ(r->optimizer_bytes_per_rank, 3 * r->param_bytes_per_rank);  // grads + 2 moments
  std::printf("dp_shard=3 d_model 32: %lld of %lld parameter bytes per rank (%.1f%%)\n",
              static_cast<long long>(r->param_bytes_per_rank), static_cast<long long>(total * 4),
              100.0 * r->param_bytes_per_rank / (total * 4));
  absl::StatusOr<StepProfile> shape_only = ProfileGptRank(layout, o, /*rank=*/0);
  ASSERT_TRUE(shape_only.ok()) << shape_only.status();
  EXPECT_EQ(shape_only->parameter_bytes, r->param_bytes_per_rank);
  EXPECT_EQ(shape_only->gradient_bytes, r->gradient_bytes_per_rank);
  EXPECT_EQ(shape_only->optimizer_bytes, 2 * r->param_bytes_per_rank);  // the moments
  EXPECT_EQ(shape_only->gathered_peak_bytes, r->peak_gathered_bytes_per_rank);
  EXPECT_EQ(shape_only->saved_activation_peak_bytes, r->peak_activation_bytes_per_rank);
}

TEST(FsdpPaddingHelpersTest, ChooseDimPadAndTrim) {
  ParamInfo p;
  p.name = "w";
  p.global_shape = {5, 6};
  ChooseFsdpDim({true, true}, 3, &p);  // dim 1 divides: no padding
  EXPECT_EQ(p.fsdp_dim, 1);
  EXPECT_EQ(p.fsdp_pad, 0);
  ChooseFsdpDim({true, true}, 4, &p);  // none divides: dim 1 pads 2 x 5 elements, dim 0 3 x 6
  EXPECT_EQ(p.fsdp_dim, 1);
  EXPECT_EQ(p.fsdp_pad, 2);
  EXPECT_EQ(StoredShape(p), (Shape{5, 8}));
  ChooseFsdpDim({true, false}, 4, &p);  // dim 1 taken (tp): dim 0, padded to 8
  EXPECT_EQ(p.fsdp_dim, 0);
  EXPECT_EQ(p.fsdp_pad, 3);
  EXPECT_EQ(StoredShape(p), (Shape{8, 6}));
  p.global_shape = {3, 1024};  // FSDP2 would pad dim 0 to 128 rows
  ChooseFsdpDim({true, true}, 128, &p);
  EXPECT_EQ(p.fsdp_dim, 1);
  EXPECT_EQ(p.fsdp_pad, 0);
  p.global_shape = {5, 6};
  ChooseFsdpDim({false, false}, 4, &p);
  EXPECT_EQ(p.fsdp_dim, -1);
  EXPECT_EQ(p.fsdp_pad, 0);

  ChooseFsdpDim({true, false}, 4, &p);  // dim 0, padded to 8
  const Tensor g = testing::Rand({5, 6}, 3, DType::kF64);
  const Tensor padded = PadForFsdp(g, p);
  ASSERT_EQ(padded.shape(), (Shape{8, 6}));
  for (int64_t i = 0; i < 8 * 6; ++i) EXPECT_EQ(padded.at(i), i < 30 ? g.at(i) : 0.0) << i;
  const Tensor back = TrimFsdpPad(padded, p);
  ASSERT_EQ(back.shape(), g.shape());
  for (int64_t i = 0; i < 30; ++i) EXPECT_EQ(back.at(i), g.at(i));
  // Each of 4 ranks holds 2 rows; the last holds padding only.
  const Mesh mesh = *Mesh::Create({{"dp_shard", 4}});
  p.spec = PartitionSpec({{"dp_shard"}, {}});
  EXPECT_EQ(ParamShard(g, p, mesh, 3).shape(), (Shape{2, 6}));
  EXPECT_EQ(ParamShard(g, p, mesh, 3).at(0), 0.0);
  EXPECT_EQ(ParamShard(g, p, mesh, 2).at(0), g.at(4 * 6));
}

TEST(FsdpPaddingHelpersTest, WrongShapesAreErrorsNamingTheParameter) {
  ParamInfo p;
  p.name = "h.0.mlp.c_fc.bias";
  p.global_shape = {5};
  ChooseFsdpDim({true}, 3, &p);
  absl::Status pad = CatchOpError([&] { PadForFsdp(Tensor::Zeros({6}, DType::kF32), p); });
  EXPECT_FALSE(pad.ok());
  EXPECT_NE(pad.message().find("'h.0.mlp.c_fc.bias' is f32[6] but its dim 0 must be 5"),
            std::string::npos) << pad;
  absl::Status trim = CatchOpError([&] { TrimFsdpPad(Tensor::Zeros({5}, DType::kF32), p); });
  EXPECT_FALSE(trim.ok());
  EXPECT_NE(trim.message().find("must be 6 (global [5], padded [6])"), std::string::npos) << trim;
  absl::Status rank = CatchOpError([&] { TrimFsdpPad(Tensor::Zeros({6, 1}, DType::kF32), p); });
  EXPECT_FALSE(rank.ok());
}

}  // namespace
}  // namespace shardmap
