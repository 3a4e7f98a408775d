// Llama 3 trained by the model-generic trainer (models/train/trainer.h): 5 f64 AdamW steps with
// global-norm clipping on one device, dp2 x tp2, fsdp2 x tp2 + SP and pp2 give the losses of the
// independent PyTorch model (bench/peers/llama_torch_check.py; its output in testdata/) from
// the same weights and token stream, to 1e-9 relative.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "models/components/checkpoint.h"
#include "models/llama/llama_model.h"
#include "models/train/trainer.h"

namespace shardmap {
namespace {

// bench/peers/llama_torch_check.py's shape and optimizer (kept in step with its constants).
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

TEST(LlamaTrainTest, FiveAdamWStepsMatchPyTorch) {
  absl::StatusOr<SafetensorsFile> f =
      SafetensorsFile::Open("models/llama/testdata/llama_torch_reference.safetensors");
  ASSERT_TRUE(f.ok()) << f.status();
  const LlamaConfig c = TorchRef();
  std::vector<NamedTensor> init;
  const LlamaLayout one = *LlamaLayout::Create(*ParseMesh("dp=1"), c, false);
  for (const ParamInfo& p : one.params()) {
    absl::StatusOr<Tensor> w = f->Read(p.name);
    ASSERT_TRUE(w.ok()) << w.status();
    init.push_back({p.name, *w});
  }
  const Tensor stream = *f->Read("train_tokens");
  std::vector<int64_t> tokens(stream.numel());
  for (int64_t i = 0; i < stream.numel(); ++i) tokens[i] = static_cast<int64_t>(stream.at(i));
  const Tensor want = *f->Read("train_losses");
  ASSERT_EQ(want.numel(), 5);
  EXPECT_LT(want.at(4), want.at(0) - 0.2);  // the reference trains

  TrainOptions o;
  o.steps = 5;
  o.batch = 4;
  o.optimizer.adamw = {.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  o.optimizer.clip = 1.0;
  struct Case {
    std::string mesh;
    bool sp;
  };
  for (const Case& k : std::vector<Case>{
           {"dp=1", false}, {"dp=2,tp=2", false}, {"dp_shard=2,tp=2", true}, {"pp=2", false}}) {
    SCOPED_TRACE(k.mesh);
    absl::StatusOr<LlamaLayout> layout = LlamaLayout::Create(*ParseMesh(k.mesh), c, k.sp);
    ASSERT_TRUE(layout.ok()) << layout.status();
    TrainOptions ok = o;
    if (k.mesh == "pp=2") ok.pipeline.microbatches = 2;
    absl::StatusOr<TrainResult> r = TrainGpt(*layout, init, tokens, ok);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->losses.size(), 5u);
    double worst = 0;
    for (int s = 0; s < 5; ++s) {
      const double rel = std::abs(r->losses[s] - want.at(s)) / std::abs(want.at(s));
      worst = std::max(worst, rel);
      EXPECT_LE(rel, 1e-9) << "step " << s << ": " << r->losses[s] << " vs " << want.at(s);
    }
    EXPECT_GT(r->grad_norms[0], o.optimizer.clip);  // clipping engaged
    std::printf("llama3 trained on %s: losses %.12f .. %.12f, worst rel diff to PyTorch %.3g\n",
                k.mesh.c_str(), r->losses[0], r->losses[4], worst);
  }
}

}  // namespace
}  // namespace shardmap
