// The GPT attention layer on GPU ranks (fused causal_attention, the AttentionPath kAuto picks on
// CUDA tensors) against the same layer on CPU ranks in f64 (the materialised einsum +
// causal_softmax path): loss and every gradient, one rank and tp = 2 heads with and without
// sequence parallelism on one shared GPU, odd sequence length, head_dim 64 and 128. Each kernel
// path (f32 SIMT, bf16 tensor cores, bf16 SIMT) within a bound derived from its own roundings.
// Skips without a GPU.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "autograd/value_and_grad.h"
#include "gtest/gtest.h"
#include "models/parallel/layers.h"
#include "shardmap/collective_ops.h"
#include "shardmap/ops.h"
#include "shardmap/shard_map.h"
#include "tensor/cuda/runtime.h"
#include "tensor/ops/shape_ops.h"
#include "tensor/random.h"
#include "tensor/testing/test_util.h"

namespace shardmap {
namespace {

struct Sizes {
  int64_t batch, seq, heads, head_dim;
};

ShardMap AttentionLoss(const Mesh& mesh, const Sizes& s, bool sp, DType compute,
                       DevicePlacement placement) {
  ShardFn fn = [s, sp, compute](const std::vector<Value>& in) -> std::vector<Value> {
    std::vector<Value> p;
    for (const Value& v : in) p.push_back(compute == v.dtype() ? v : cast(v, compute));
    TensorParallel tp{"tp", sp};  // the mesh's one axis (size 1 for the reference)
    CausalSelfAttention attn{p[1], p[2], RowParallelLinear{p[3], p[4], tp}, s.head_dim, s.seq,
                             tp};
    Value y = cast(attn(p[0]), DType::kF32);
    return {sp ? all_reduce(sum_partial(y * y, {}), "tp") : sum(y * y, {})};
  };
  ShardMapOptions o;
  o.placement = std::move(placement);
  return shard_map(fn, mesh,
                   {sp ? P("tp") : P(), P(None, None, "tp"), P(None, "tp"),
                    P("tp", None), P()},
                   {P()}, o);
}

// One kernel path of the GPU layer: f32 (SIMT kernels), bf16 on the tensor-core kernels (kAuto
// at head_dim 64/128) or bf16 forced onto the SIMT kernels (SHARDMAP_ATTENTION_KERNEL=simt).
enum class Path { kF32, kBf16TensorCore, kBf16Simt };

const char* PathName(Path p) {
  switch (p) {
    case Path::kF32: return "f32";
    case Path::kBf16TensorCore: return "bf16_tensor_core";
    case Path::kBf16Simt: return "bf16_simt";
  }
  return "?";
}

// The bound of each path against the f64 reference (relative to max|want|), from its own
// precision: u = its unit roundoff (f32 2^-24, bf16 2^-8 counting a rounding as a full ulp).
// bf16 rounds the q/k/v projection, the attention output and the projection output (3 roundings
// on the forward path, each carried into the gradients by the backward's own 3: 6u); the
// tensor-core kernels round P (forward) and P and dS (backward) to bf16 too: 8u. The SIMT
// kernels keep them in f32. f32 sums of up to d_model = 256 terms through four chained products:
// 256u.
double Bound(Path p) {
  const double u_bf16 = std::ldexp(1.0, -8), u_f32 = std::ldexp(1.0, -24);
  switch (p) {
    case Path::kF32: return 256 * u_f32;           // 1.5e-5
    case Path::kBf16Simt: return 6 * u_bf16;        // 2.3e-2
    case Path::kBf16TensorCore: return 8 * u_bf16;  // 3.1e-2
  }
  return 0;
}

class GpuAttentionTest : public ::testing::TestWithParam<std::tuple<int64_t, Path>> {};

TEST_P(GpuAttentionTest, EachKernelPathWithinItsPrecisionOfAnF64Reference) {
  SKIP_WITHOUT_GPU();
  const auto [head_dim, path] = GetParam();
  const DType compute = path == Path::kF32 ? DType::kF32 : DType::kBF16;
  const Sizes s{2, 33, 2, head_dim};
  const int64_t d = s.heads * s.head_dim, rows = s.batch * s.seq;
  std::vector<Tensor> in = {
      RandomNormal({rows, d}, 1, 0.0, 1.0), RandomNormal({d, 3, d}, 2, 0.0, 0.05),
      RandomNormal({3, d}, 3, 0.0, 0.05), RandomNormal({d, d}, 4, 0.0, 0.05),
      RandomNormal({d}, 5, 0.0, 0.05)};
  // The inputs as the path sees them (bf16-rounded for bf16), exactly in f64 for the reference:
  // the bound measures the kernels' arithmetic, not the rounding of the inputs.
  for (Tensor& t : in) t = Cast(Cast(t, compute), DType::kF32);
  std::vector<Tensor> in64;
  for (const Tensor& t : in) in64.push_back(Cast(t, DType::kF64));
  absl::StatusOr<ShardMapGrads> want = value_and_grad(AttentionLoss(
      *Mesh::Create({{"tp", 1}}), s, false, DType::kF64, DevicePlacement::Cpu()))(in64);
  ASSERT_TRUE(want.ok()) << want.status();
  const char* old = std::getenv("SHARDMAP_ATTENTION_KERNEL");
  const std::string saved = old == nullptr ? "" : old;
  if (path == Path::kBf16Simt) {
    setenv("SHARDMAP_ATTENTION_KERNEL", "simt", 1);
  } else {
    unsetenv("SHARDMAP_ATTENTION_KERNEL");
  }
  const double tol = Bound(path);
  for (int tp : {1, 2}) {
    for (bool sp : {false, true}) {
      if (tp == 1 && sp) continue;
      SCOPED_TRACE(absl::StrCat(PathName(path), " tp=", tp, sp ? " sp" : ""));
      absl::StatusOr<ShardMapGrads> got = value_and_grad(AttentionLoss(
          *Mesh::Create({{"tp", tp}}), s, sp, compute, DevicePlacement::SharedGpu()))(in);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_TRUE(testing::TensorsNearScaled(got->outputs[0], want->outputs[0], tol));
      double worst = 0;  // the observed error over the bound, printed for calibration
      for (size_t k = 0; k < in.size(); ++k) {
        EXPECT_TRUE(testing::TensorsNearScaled(got->grads[k], want->grads[k], tol))
            << "gradient " << k;
        double scale = 0;
        const Tensor w = want->grads[k];
        for (int64_t i = 0; i < w.numel(); ++i) scale = std::max(scale, std::fabs(w.at(i)));
        if (scale > 0) worst = std::max(worst, testing::MaxAbsDiff(got->grads[k], w) / scale);
      }
      std::printf("%s head_dim %lld tp=%d%s: worst gradient error %.3g of max|want| (bound %.3g)\n",
                  PathName(path), static_cast<long long>(head_dim), tp, sp ? " sp" : "", worst,
                  tol);
    }
  }
  if (old == nullptr) {
    unsetenv("SHARDMAP_ATTENTION_KERNEL");
  } else {
    setenv("SHARDMAP_ATTENTION_KERNEL", saved.c_str(), 1);
  }
}

INSTANTIATE_TEST_SUITE_P(
    HeadDims, GpuAttentionTest,
    ::testing::Combine(::testing::Values(int64_t{64}, int64_t{128}),
                       ::testing::Values(Path::kF32, Path::kBf16TensorCore, Path::kBf16Simt)));

}  // namespace
}  // namespace shardmap
