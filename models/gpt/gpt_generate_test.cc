#include "models/gpt/gpt_generate.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "collectives/self_communicator.h"
#include "gtest/gtest.h"
#include "models/gpt.h"
#include "models/gpt/generate_steps_testing.h"
#include "tests/test_util.h"

namespace shardmap {
namespace {

using generate_testing::GreedySteps;
using generate_testing::MaxRelDiff;
using generate_testing::Steps;

// heads 6, vocab 48: tp 2 and 3 divide both; seq 8: cp 2 divides it into 4 chunks.
GptConfig Config(DType dtype = DType::kF64) {
  return GptConfig{.layers = 2, .d_model = 12, .heads = 6, .vocab = 48, .seq = 8,
                   .dtype = dtype};
}

// Every parameter uniform in [-scale, scale) (LayerNorm gains around 1), so logits are far from
// uniform and biases / gains are exercised, unlike GPT-2's init.
std::vector<NamedTensor> RandomParams(const GptConfig& c, double scale, uint64_t seed) {
  std::vector<NamedTensor> out = InitGpt(c, 1);
  for (size_t i = 0; i < out.size(); ++i) {
    const Shape& shape = out[i].tensor.shape();
    Tensor r = testing::Rand(std::vector<int64_t>(shape.begin(), shape.end()), seed * 1000 + i, DType::kF64);
    std::vector<double> v = r.ToVector<double>();
    const bool gain = out[i].name.find("ln_") != std::string::npos &&
                      out[i].name.find(".weight") != std::string::npos;
    for (double& x : v) x = (gain ? 1.0 : 0.0) + scale * x;
    Tensor t = Tensor::FromVector<double>(out[i].tensor.shape(), v);
    if (c.dtype == DType::kF32) {
      std::vector<float> f(v.begin(), v.end());
      t = Tensor::FromVector<float>(out[i].tensor.shape(), f);
    }
    out[i].tensor = t;
  }
  return out;
}

// An independent forward of GPT-2 in f64 loops over the global tensors (this library's layout:
// c_attn [d, 3, d] / [3, d]): the logits of the token after `ctx` (its last seq ids).
std::vector<double> NaiveNextLogits(const GptConfig& c, const std::vector<NamedTensor>& params,
                                    std::vector<int64_t> ctx) {
  std::map<std::string, std::vector<double>> p;
  for (const NamedTensor& t : params) p[t.name] = t.tensor.ToVector<double>();
  if (static_cast<int64_t>(ctx.size()) > c.seq) ctx.erase(ctx.begin(), ctx.end() - c.seq);
  const int64_t T = ctx.size(), d = c.d_model, H = c.heads, hd = d / H;
  using Mat = std::vector<std::vector<double>>;
  Mat x(T, std::vector<double>(d));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < d; ++j) x[t][j] = p["wte.weight"][ctx[t] * d + j] + p["wpe.weight"][t * d + j];
  }
  auto layer_norm = [&](const Mat& in, const std::string& name) {
    Mat out = in;
    for (int64_t t = 0; t < T; ++t) {
      double mean = 0, var = 0;
      for (double v : in[t]) mean += v / d;
      for (double v : in[t]) var += (v - mean) * (v - mean) / d;
      for (int64_t j = 0; j < d; ++j) {
        out[t][j] = (in[t][j] - mean) / std::sqrt(var + 1e-5) * p[name + ".weight"][j] +
                    p[name + ".bias"][j];
      }
    }
    return out;
  };
  // y = in @ W + b, W [n_in, n_out] row-major with a column stride and offset (for c_attn).
  auto linear = [&](const Mat& in, const std::vector<double>& w, const std::vector<double>& b,
                    int64_t n_in, int64_t n_out, int64_t row_stride, int64_t col_offset) {
    Mat out(T, std::vector<double>(n_out));
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t o = 0; o < n_out; ++o) {
        double s = b[col_offset + o];
        for (int64_t i = 0; i < n_in; ++i) s += in[t][i] * w[i * row_stride + col_offset + o];
        out[t][o] = s;
      }
    }
    return out;
  };
  for (int64_t l = 0; l < c.layers; ++l) {
    const std::string h = "h." + std::to_string(l) + ".";
    Mat a = layer_norm(x, h + "ln_1");
    const auto& wa = p[h + "attn.c_attn.weight"];
    const auto& ba = p[h + "attn.c_attn.bias"];
    Mat q = linear(a, wa, ba, d, d, 3 * d, 0), k = linear(a, wa, ba, d, d, 3 * d, d),
        v = linear(a, wa, ba, d, d, 3 * d, 2 * d);
    Mat y(T, std::vector<double>(d, 0.0));
    for (int64_t head = 0; head < H; ++head) {
      for (int64_t t = 0; t < T; ++t) {
        std::vector<double> s(t + 1);
        double mx = -1e300, z = 0;
        for (int64_t u = 0; u <= t; ++u) {
          double dot = 0;
          for (int64_t e = 0; e < hd; ++e) dot += q[t][head * hd + e] * k[u][head * hd + e];
          s[u] = dot / std::sqrt(static_cast<double>(hd));
          mx = std::max(mx, s[u]);
        }
        for (double& w : s) z += (w = std::exp(w - mx));
        for (int64_t u = 0; u <= t; ++u) {
          for (int64_t e = 0; e < hd; ++e) y[t][head * hd + e] += s[u] / z * v[u][head * hd + e];
        }
      }
    }
    Mat proj = linear(y, p[h + "attn.c_proj.weight"], p[h + "attn.c_proj.bias"], d, d, d, 0);
    for (int64_t t = 0; t < T; ++t) for (int64_t j = 0; j < d; ++j) x[t][j] += proj[t][j];
    Mat m = linear(layer_norm(x, h + "ln_2"), p[h + "mlp.c_fc.weight"], p[h + "mlp.c_fc.bias"], d,
                   4 * d, 4 * d, 0);
    for (auto& row : m) {
      for (double& u : row) {
        u = 0.5 * u * (1 + std::tanh(std::sqrt(2 / 3.14159265358979323846) *
                                     (u + 0.044715 * u * u * u)));
      }
    }
    Mat out = linear(m, p[h + "mlp.c_proj.weight"], p[h + "mlp.c_proj.bias"], 4 * d, d, d, 0);
    for (int64_t t = 0; t < T; ++t) for (int64_t j = 0; j < d; ++j) x[t][j] += out[t][j];
  }
  Mat f = layer_norm(x, "ln_f");
  std::vector<double> logits(c.vocab);
  for (int64_t v = 0; v < c.vocab; ++v) {
    for (int64_t j = 0; j < d; ++j) logits[v] += f[T - 1][j] * p["wte.weight"][v * d + j];
  }
  return logits;
}

int64_t Argmax(const std::vector<double>& v) {
  return std::max_element(v.begin(), v.end()) - v.begin();
}

GptLayout Layout(const std::string& mesh, bool sp, const GptConfig& c = Config()) {
  absl::StatusOr<Mesh> m = ParseMesh(mesh);
  EXPECT_TRUE(m.ok()) << m.status();
  absl::StatusOr<GptLayout> l = GptLayout::Create(*m, c, sp);
  EXPECT_TRUE(l.ok()) << mesh << ": " << l.status();
  return *l;
}

TEST(GptGenerateTest, LogitsMatchANaiveForward) {
  const GptConfig c = Config();
  const auto params = RandomParams(c, 0.3, 7);
  // Short (padded), exactly seq, and longer than seq (cropped) contexts.
  for (std::vector<int64_t> ctx : {std::vector<int64_t>{5}, {1, 2, 3}, {9, 8, 7, 6, 5, 4, 3, 2},
                                   {40, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 47}}) {
    const std::vector<double> want = NaiveNextLogits(c, params, ctx);
    for (auto [mesh, sp] : {std::pair<std::string, bool>{"dp=1", false}, {"tp=2", true},
                            {"dp=2,tp=3", true}, {"cp=2", false}}) {
      absl::StatusOr<std::vector<double>> got =
          GptNextTokenLogits(Layout(mesh, sp), params, ctx);
      ASSERT_TRUE(got.ok()) << mesh << ": " << got.status();
      ASSERT_EQ(got->size(), want.size());
      for (size_t v = 0; v < want.size(); ++v) {
        EXPECT_NEAR((*got)[v], want[v], 1e-10) << mesh << " context " << ctx.size() << " id " << v;
      }
    }
  }
}

TEST(GptGenerateTest, GreedyIsTheSameOnEveryMesh) {
  const GptConfig c = Config();
  const auto params = RandomParams(c, 0.3, 11);
  const std::vector<int64_t> prompt = {3, 14, 15};
  const SampleOptions greedy{.tokens = 12};  // the context passes seq = 8: cropping is exercised
  absl::StatusOr<std::vector<int64_t>> ref = GenerateGpt(Layout("dp=1", false), params, prompt,
                                                         greedy);
  ASSERT_TRUE(ref.ok()) << ref.status();
  ASSERT_EQ(ref->size(), 12u);
  // The first token is the naive forward's argmax, and each next one continues it.
  std::vector<int64_t> ctx = prompt;
  for (int64_t id : *ref) {
    EXPECT_EQ(id, Argmax(NaiveNextLogits(c, params, ctx))) << "after " << ctx.size() << " ids";
    ctx.push_back(id);
  }
  for (auto [mesh, sp] : {std::pair<std::string, bool>{"dp=2", false}, {"tp=2", false},
                          {"tp=2", true}, {"dp_shard=2", false}, {"tp=3", false}, {"tp=3", true},
                          {"dp=2,tp=2", false}, {"dp=2,tp=2", true}, {"dp=3", false},
                          {"dp_shard=2,tp=2", true}, {"dp_replicate=2,dp_shard=2", false},
                          {"cp=2", false}, {"dp=2,cp=2,tp=2", true},
                          {"tp=6", false}}) {  // tp=6: one head per device, one row per step
    absl::StatusOr<std::vector<int64_t>> got = GenerateGpt(Layout(mesh, sp), params, prompt,
                                                           greedy);
    ASSERT_TRUE(got.ok()) << mesh << (sp ? " sp" : "") << ": " << got.status();
    EXPECT_EQ(*got, *ref) << mesh << (sp ? " sp" : "");
  }
}

TEST(GptGenerateTest, F32AndCommunicatorPath) {
  const GptConfig c = Config(DType::kF32);
  const auto params = RandomParams(c, 0.3, 5);
  const SampleOptions greedy{.tokens = 6};
  auto ref = GenerateGpt(Layout("dp=1", false, c), params, {1, 2}, greedy);
  ASSERT_TRUE(ref.ok()) << ref.status();
  auto tp = GenerateGpt(Layout("dp=2,tp=2", true, c), params, {1, 2}, greedy);
  ASSERT_TRUE(tp.ok()) << tp.status();
  EXPECT_EQ(*tp, *ref);
  collectives::SelfCommunicator self;
  SampleOptions with_comm = greedy;
  with_comm.comm = &self;
  auto one = GenerateGpt(Layout("dp=1", false, c), params, {1, 2}, with_comm);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(*one, *ref);
  auto wrong = GenerateGpt(Layout("dp=2", false, c), params, {1, 2}, with_comm);
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument);
}

// bf16 compute (f32 master weights): the same per-device code casts at use; the logits follow
// the naive f64 forward to bf16's precision, on one device and on tp2+sp.
TEST(GptGenerateTest, MixedPrecisionLogits) {
  GptConfig c = Config(DType::kF32);
  c.compute = DType::kBF16;
  const auto params = RandomParams(c, 0.3, 13);
  const std::vector<int64_t> ctx = {4, 8, 15, 16, 23};
  const std::vector<double> want = NaiveNextLogits(c, params, ctx);
  double scale = 0;
  for (double v : want) scale = std::max(scale, std::abs(v));
  for (auto [mesh, sp] : {std::pair<std::string, bool>{"dp=1", false}, {"tp=2", true}}) {
    auto got = GptNextTokenLogits(Layout(mesh, sp, c), params, ctx);
    ASSERT_TRUE(got.ok()) << got.status();
    double err = 0;
    for (size_t v = 0; v < want.size(); ++v) err = std::max(err, std::abs((*got)[v] - want[v]));
    EXPECT_LT(err, 0.03 * scale) << mesh << ": max error " << err << " of logits up to " << scale;
    EXPECT_GT(err, 0.0) << "bf16 compute should round somewhere";
  }
}

TEST(GptGenerateTest, SamplingIsDeterministicPerSeedAndTopK1IsGreedy) {
  const GptConfig c = Config();
  const auto params = RandomParams(c, 0.3, 3);
  const GptLayout one = Layout("dp=1", false), dp_tp = Layout("dp=2,tp=2", true);
  SampleOptions s{.tokens = 10, .temperature = 1.0, .top_k = 0, .seed = 42};
  auto a = GenerateGpt(one, params, {7}, s);
  auto b = GenerateGpt(one, params, {7}, s);
  auto d = GenerateGpt(dp_tp, params, {7}, s);
  ASSERT_TRUE(a.ok() && b.ok() && d.ok());
  EXPECT_EQ(*a, *b);
  EXPECT_EQ(*a, *d);  // f64: the same logits on both meshes, so the same draws
  bool differs = false;
  for (uint64_t seed = 1; seed < 6 && !differs; ++seed) {
    s.seed = seed;
    differs = *GenerateGpt(one, params, {7}, s) != *a;
  }
  EXPECT_TRUE(differs) << "the seed does not change the sample";
  const auto greedy = GenerateGpt(one, params, {7}, {.tokens = 10});
  for (double temp : {0.5, 1.0, 3.0}) {
    auto k1 = GenerateGpt(one, params, {7}, {.tokens = 10, .temperature = temp, .top_k = 1,
                                             .seed = 9});
    EXPECT_EQ(*k1, *greedy) << temp;
  }
}

TEST(GptGenerateTest, SampleTokenDistribution) {
  // logits log(1), log(2), log(3), log(4) at temperature 1: frequencies 0.1, 0.2, 0.3, 0.4.
  const std::vector<double> logits = {0.0, std::log(2.0), std::log(3.0), std::log(4.0)};
  uint64_t state = 123;
  std::vector<int> counts(4);
  const int n = 40000;
  for (int i = 0; i < n; ++i) ++counts[SampleToken(logits, 1.0, 0, &state)];
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(counts[i] / double(n), 0.1 * (i + 1), 0.01) << i;
  // top_k = 2 keeps ids 2 and 3 only: 3/7 and 4/7.
  std::vector<int> top(4);
  for (int i = 0; i < n; ++i) ++top[SampleToken(logits, 1.0, 2, &state)];
  EXPECT_EQ(top[0] + top[1], 0);
  EXPECT_NEAR(top[2] / double(n), 3.0 / 7, 0.01);
  // temperature 0.5 squares the odds: 1, 4, 9, 16 over 30.
  std::vector<int> cold(4);
  for (int i = 0; i < n; ++i) ++cold[SampleToken(logits, 0.5, 0, &state)];
  EXPECT_NEAR(cold[3] / double(n), 16.0 / 30, 0.01);
  EXPECT_NEAR(cold[0] / double(n), 1.0 / 30, 0.005);
  // greedy: the lowest id on ties
  EXPECT_EQ(SampleToken({1.0, 3.0, 3.0, 2.0}, 0.0, 0, &state), 1);
}

void ExpectInvalid(const absl::StatusOr<std::vector<int64_t>>& r, const std::string& needle) {
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << needle;
  EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status();
}

TEST(GptGenerateTest, Errors) {
  const GptConfig c = Config();
  const auto params = RandomParams(c, 0.3, 3);
  const GptLayout l = Layout("tp=2", true);
  ExpectInvalid(GenerateGpt(l, params, {}, {}), "prompt is empty");
  ExpectInvalid(GenerateGpt(l, params, {1, 48}, {}), "prompt token 1 is id 48");
  ExpectInvalid(GenerateGpt(l, params, {-1}, {}), "id -1");
  ExpectInvalid(GenerateGpt(l, params, {1}, {.tokens = -1}), "tokens -1");
  ExpectInvalid(GenerateGpt(l, params, {1}, {.temperature = -0.5}), "temperature -0.5");
  ExpectInvalid(GenerateGpt(l, params, {1}, {.temperature = std::nan("")}), "temperature nan");
  ExpectInvalid(GenerateGpt(l, params, {1}, {.top_k = -1}), "top_k -1");
  ExpectInvalid(GenerateGpt(l, params, {1}, {.top_k = 49}), "top_k 49");
  std::vector<NamedTensor> missing(params.begin() + 1, params.end());
  ExpectInvalid(GenerateGpt(l, missing, {1}, {}), "lack 'wte.weight'");
  auto zero = GenerateGpt(l, params, {1}, {.tokens = 0});
  ASSERT_TRUE(zero.ok());
  EXPECT_TRUE(zero->empty());
  EXPECT_EQ(GptNextTokenLogits(l, params, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GenerateGpt(Layout("pp=2,dp=2", false), params, {1}, {}).status().code(),
            absl::StatusCode::kUnimplemented);
  GptConfig moe = c;
  moe.moe.experts = 2;
  EXPECT_EQ(GenerateGpt(Layout("dp=1", false, moe), InitGpt(moe, 1), {1}, {}).status().code(),
            absl::StatusCode::kUnimplemented);
}

// The KV cache (prefill once, then one token per step) against the recomputation of the whole
// prefix on one device, in f64: every step's logits to 1e-12 and the same tokens, on meshes
// that split the heads over tp (2 and 3 of 6), shard the parameters (FSDP), use SP or cp (the
// cached rows are whole on every device) and odd data-parallel sizes. The prompt + tokens fill
// the window exactly (3 + 6 - 1 = 8 = seq).
TEST(GptGenerateTest, KvCacheEqualsRecomputation) {
  const GptConfig c = Config();
  const auto params = RandomParams(c, 0.3, 17);
  const std::vector<int64_t> prompt = {3, 14, 15};
  const Steps want = GreedySteps(Layout("dp=1", false), params, prompt, 6, KvCacheMode::kOff);
  ASSERT_EQ(want.tokens.size(), 6u);
  for (auto [mesh, sp] : {std::pair<std::string, bool>{"dp=1", false}, {"tp=2", false},
                          {"tp=3", true}, {"dp=2,tp=2", true}, {"dp_shard=2", false},
                          {"dp=3", false}, {"cp=2", false}, {"dp_shard=2,tp=3", true}}) {
    const GptLayout l = Layout(mesh, sp);
    ASSERT_TRUE(KvCacheUse(l, 3, {.tokens = 6}).ok()) << mesh;
    const Steps got = GreedySteps(l, params, prompt, 6, KvCacheMode::kOn);
    EXPECT_EQ(got.tokens, want.tokens) << mesh;
    EXPECT_LT(MaxRelDiff(got, want), 1e-12) << mesh << (sp ? " sp" : "");
  }
  // The one-token prompt (no prefill beyond one position) too.
  const Steps one = GreedySteps(Layout("dp=1", false), params, {7}, 8, KvCacheMode::kOff);
  const Steps cached = GreedySteps(Layout("tp=2", true), params, {7}, 8, KvCacheMode::kOn);
  EXPECT_EQ(cached.tokens, one.tokens);
  EXPECT_LT(MaxRelDiff(cached, one), 1e-12);
}

// f32: the cache gives the recomputation's greedy tokens, and kAuto (the default) takes it when
// it fits; a seed gives the same sampled text either way.
TEST(GptGenerateTest, KvCacheF32GreedyAndSampling) {
  const GptConfig c = Config(DType::kF32);
  const auto params = RandomParams(c, 0.3, 19);
  for (auto [mesh, sp] : {std::pair<std::string, bool>{"dp=1", false}, {"tp=2", true}}) {
    const GptLayout l = Layout(mesh, sp, c);
    const Steps off = GreedySteps(l, params, {5, 6}, 7, KvCacheMode::kOff);
    const Steps on = GreedySteps(l, params, {5, 6}, 7, KvCacheMode::kOn);
    const Steps autom = GreedySteps(l, params, {5, 6}, 7, KvCacheMode::kAuto);
    EXPECT_EQ(on.tokens, off.tokens) << mesh;
    EXPECT_EQ(autom.tokens, on.tokens) << mesh;
    EXPECT_LT(MaxRelDiff(on, off), 1e-4) << mesh;
    SampleOptions s{.tokens = 7, .temperature = 0.9, .seed = 3};
    s.kv_cache = KvCacheMode::kOff;
    auto a = GenerateGpt(l, params, {5, 6}, s);
    s.kv_cache = KvCacheMode::kOn;
    auto b = GenerateGpt(l, params, {5, 6}, s);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(*a, *b) << mesh;
  }
}

TEST(GptGenerateTest, KvCacheErrors) {
  const GptConfig c = Config();
  const auto params = RandomParams(c, 0.3, 3);
  const GptLayout l = Layout("tp=2", true);
  // Past seq: kOn refuses and says how to fix it; kAuto slides the window as before.
  SampleOptions on{.tokens = 7};
  on.kv_cache = KvCacheMode::kOn;
  ExpectInvalid(GenerateGpt(l, params, {1, 2, 3}, on), "feed 9");
  ExpectInvalid(GenerateGpt(l, params, {1, 2, 3}, on), "generate at most 6 tokens");
  ExpectInvalid(GenerateGpt(l, params, {1, 2, 3}, on), "--kv_cache=off");
  const Steps slide = GreedySteps(l, params, {1, 2, 3}, 7, KvCacheMode::kAuto);
  const Steps off = GreedySteps(l, params, {1, 2, 3}, 7, KvCacheMode::kOff);
  EXPECT_EQ(slide.tokens, off.tokens);
  EXPECT_EQ(MaxRelDiff(slide, off), 0.0);  // the same (recomputing) path
  EXPECT_EQ(KvCacheUse(l, 1, {.tokens = 8}).code(), absl::StatusCode::kOk);
  EXPECT_EQ(KvCacheUse(l, 1, {.tokens = 9}).code(), absl::StatusCode::kInvalidArgument);
  SampleOptions off_opt;
  off_opt.kv_cache = KvCacheMode::kOff;
  EXPECT_EQ(KvCacheUse(l, 1, off_opt).code(), absl::StatusCode::kFailedPrecondition);
  // MoE: no cached decoding, said as such.
  GptConfig moe = c;
  moe.moe.experts = 2;
  const GptLayout ml = Layout("dp=1", false, moe);
  EXPECT_EQ(KvCacheUse(ml, 1, {.tokens = 2}).code(), absl::StatusCode::kUnimplemented);
  auto r = GenerateGpt(ml, InitGpt(moe, 1), {1}, on);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(r.status().message().find("mixture-of-experts"), std::string::npos) << r.status();
}

}  // namespace
}  // namespace shardmap
