// The fused in-place AdamW (adamw_update.h, AdamW::Step on the CPU) against the unfused
// tensor-op form it replaced, written here as it was: bitwise equal in f64 and f32 over several
// steps (decay and no decay, a grad_scale tensor, a host multiplier); in place (the storages
// stay, nothing is allocated after the first step, whose allocations are the two moments); the
// same on meta tensors; errors name the operand.
#include "models/components/adamw_update.h"

#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "models/components/optimizer.h"
#include "tensor/memory_tracker.h"
#include "tensor/op_counter.h"
#include "tensor/ops/elementwise.h"
#include "tensor/ops/shape_ops.h"
#include "tensor/random.h"

namespace shardmap {
namespace {

// The host path of AdamW::Step before the fusion (tensor ops, a new tensor per result).
struct UnfusedAdamW {
  AdamWOptions opt;
  int64_t t = 0;
  std::map<std::string, std::pair<Tensor, Tensor>> state;
  void Step(std::vector<NamedTensor>& params, const std::vector<NamedTensor>& grads,
            const Tensor& grad_scale, double multiplier) {
    ++t;
    const double bc1 = 1.0 - std::pow(opt.beta1, static_cast<double>(t));
    const double bc2 = 1.0 - std::pow(opt.beta2, static_cast<double>(t));
    const double step_size = opt.lr / bc1, inv_sqrt_bc2 = 1.0 / std::sqrt(bc2);
    for (size_t i = 0; i < params.size(); ++i) {
      NamedTensor& p = params[i];
      Tensor g = multiplier != 1.0 ? MulScalar(grads[i].tensor, multiplier) : grads[i].tensor;
      if (grad_scale.defined()) g = Mul(g, Cast(grad_scale, p.tensor.dtype()).Reshape({}));
      auto& [m, v] = state[p.name];
      if (!m.defined()) {
        m = Tensor::Zeros(p.tensor.shape(), p.tensor.dtype());
        v = Tensor::Zeros(p.tensor.shape(), p.tensor.dtype());
      }
      m = Add(MulScalar(m, opt.beta1), MulScalar(g, 1.0 - opt.beta1));
      v = Add(MulScalar(v, opt.beta2), MulScalar(Mul(g, g), 1.0 - opt.beta2));
      Tensor denom = AddScalar(MulScalar(Sqrt(v), inv_sqrt_bc2), opt.eps);
      const bool decay = opt.weight_decay != 0 && opt.no_decay.count(p.name) == 0;
      Tensor w = decay ? MulScalar(p.tensor, 1.0 - opt.lr * opt.weight_decay) : p.tensor;
      p.tensor = Sub(w, MulScalar(Div(m, denom), step_size));
    }
  }
};

bool BitwiseEqual(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

std::vector<NamedTensor> Params(DType dt, uint64_t seed) {
  return {{"h.0.w", RandomNormal({7, 5}, seed, 0.0, 1.0, dt)},
          {"h.0.b", RandomNormal({5}, seed + 1, 0.0, 0.5, dt)},
          {"big", RandomNormal({1031}, seed + 2, 0.0, 2.0, dt)}};
}

std::vector<NamedTensor> Grads(const std::vector<NamedTensor>& params, uint64_t seed) {
  std::vector<NamedTensor> g;
  for (size_t i = 0; i < params.size(); ++i) {
    g.push_back({params[i].name, RandomNormal(params[i].tensor.shape(), seed + 10 * i, 0.0, 3.0,
                                              params[i].tensor.dtype())});
  }
  return g;
}

TEST(AdamWUpdateTest, BitwiseTheUnfusedFormInF64AndF32) {
  for (DType dt : {DType::kF64, DType::kF32}) {
    for (int variant = 0; variant < 3; ++variant) {
      SCOPED_TRACE(absl::StrCat(DTypeName(dt), " variant ", variant));
      AdamWOptions o{.lr = 3e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8,
                     .weight_decay = variant == 2 ? 0.0 : 0.1, .no_decay = {"h.0.b"}};
      AdamW fused(o);
      UnfusedAdamW ref{o};
      std::vector<NamedTensor> pf = Params(dt, 5), pr = Params(dt, 5);
      for (int s = 0; s < 4; ++s) {
        const std::vector<NamedTensor> g = Grads(pf, 100 + s);
        const Tensor scale = variant == 1 ? Tensor::Scalar(0.37, DType::kF64) : Tensor();
        const double mult = variant == 0 ? 0.61 : 1.0;
        ASSERT_TRUE(fused.Step(pf, g, scale, AdamWStepControl{.grad_multiplier = mult}).ok());
        ref.Step(pr, g, scale, mult);
        for (size_t i = 0; i < pf.size(); ++i) {
          EXPECT_TRUE(BitwiseEqual(pf[i].tensor, pr[i].tensor)) << pf[i].name << " step " << s;
          EXPECT_TRUE(BitwiseEqual(fused.exp_avg(pf[i].name), ref.state[pr[i].name].first));
          EXPECT_TRUE(BitwiseEqual(fused.exp_avg_sq(pf[i].name), ref.state[pr[i].name].second));
        }
      }
    }
  }
}

TEST(AdamWUpdateTest, InPlaceWithNothingAllocatedAfterTheMoments) {
  for (bool meta : {false, true}) {
    SCOPED_TRACE(meta ? "meta" : "cpu");
    std::vector<NamedTensor> p = Params(DType::kF32, 9);
    if (meta) {
      for (NamedTensor& t : p) t.tensor = t.tensor.To(Device::Meta());
    }
    std::vector<NamedTensor> g = Grads(p, 50);
    if (meta) {
      for (NamedTensor& t : g) t.tensor = t.tensor.To(Device::Meta());
    }
    int64_t param_bytes = 0;
    for (const NamedTensor& t : p) param_bytes += static_cast<int64_t>(t.tensor.nbytes());
    const std::vector<NamedTensor> before = p;  // shallow: the same storages
    AdamW opt({.lr = 1e-2, .weight_decay = 0.1});
    {
      MemoryTracker mem;
      ASSERT_TRUE(opt.Step(p, g, Tensor(), AdamWStepControl{.grad_multiplier = 0.5}).ok());
      EXPECT_EQ(mem.allocated_bytes(), 2 * param_bytes);  // exp_avg and exp_avg_sq, once
    }
    MemoryTracker mem;
    for (int s = 0; s < 3; ++s) ASSERT_TRUE(opt.Step(p, g).ok());
    EXPECT_EQ(mem.allocated_bytes(), 0);
    EXPECT_EQ(mem.peak_bytes(), 0);
    for (size_t i = 0; i < p.size(); ++i) EXPECT_TRUE(p[i].tensor.SharesStorageWith(before[i].tensor));
  }
}

// One "adamw" op per parameter for the OpCounter, FLOPs and bytes counted by hand.
TEST(AdamWUpdateTest, CountedAsOneOpPerParameter) {
  Tensor p = Tensor::Zeros({6}, DType::kF64), g = Tensor::Zeros({6}, DType::kF64);
  Tensor m = Tensor::Zeros({6}, DType::kF64), v = Tensor::Zeros({6}, DType::kF64);
  OpCounter ops;
  ASSERT_TRUE(FusedAdamWUpdate(p, g, m, v, {.decay = 0.99}).ok());
  ASSERT_EQ(ops.ops().size(), 1u);
  EXPECT_EQ(ops.ops()[0].op, "adamw");
  EXPECT_EQ(ops.ops()[0].flops, 13.0 * 6);      // 12 + the decay
  EXPECT_EQ(ops.ops()[0].bytes, 7.0 * 6 * 8);  // 4 read, 3 written
}

TEST(AdamWUpdateTest, ErrorsNameTheOperand) {
  Tensor p = Tensor::Zeros({3}, DType::kF32), g = Tensor::Zeros({3}, DType::kF32);
  Tensor m = Tensor::Zeros({3}, DType::kF32), v = Tensor::Zeros({4}, DType::kF32);
  absl::Status s = FusedAdamWUpdate(p, g, m, v, {});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("exp_avg_sq is f32[4]"), std::string::npos) << s;
  Tensor g64 = Tensor::Zeros({3}, DType::kF64);
  EXPECT_NE(FusedAdamWUpdate(p, g64, m, m, {}).message().find("the gradient is f64[3]"),
            std::string::npos);
  Tensor h = Tensor::Zeros({3}, DType::kBF16);
  EXPECT_NE(FusedAdamWUpdate(h, h, h, h, {}).message().find("it must be f32 or f64"),
            std::string::npos);
  // Nothing was written by a refused call.
  EXPECT_EQ(p.ToVector<double>(), std::vector<double>(3, 0.0));
}

}  // namespace
}  // namespace shardmap
