// The Megatron MLP training step used by the GPU-rank tests (gpu_mlp_test, the NCCL multi-process
// check): a shard_map over a mesh with axes "dp" and "tp" whose per-device code is
//   h = x @ w1 + b1 (S1 on tp), y = all_reduce(gelu(h) @ w2, "tp") + b2, loss = share of the MSE
// (P on dp). Written here rather than taken from models/ so the tests pin exactly this program.
#ifndef SHARDMAP_TESTS_GPU_MLP_PROGRAM_H_
#define SHARDMAP_TESTS_GPU_MLP_PROGRAM_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "autograd/value_and_grad.h"
#include "shardmap/collective_ops.h"
#include "shardmap/context.h"
#include "shardmap/ops.h"
#include "shardmap/partition_spec.h"
#include "shardmap/shard_map.h"
#include "tensor/ops/shape_ops.h"
#include "tensor/tensor.h"
#include "tensor/testing/compare.h"

namespace shardmap::gpu_testing {

// Sizes divisible by every dp (<= 2) and tp (<= 4) the tests use.
struct MlpSizes {
  int64_t batch = 12;
  int64_t d_model = 16;
  int64_t d_hidden = 48;
};

inline Tensor UniformHost(std::vector<int64_t> shape, uint64_t seed, double scale) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  std::vector<float> v(n);
  uint64_t x = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (int64_t i = 0; i < n; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    double u = static_cast<double>(x >> 11) / 9007199254740992.0;
    v[i] = static_cast<float>(scale * (2 * u - 1));
  }
  return Tensor::FromVector<float>(absl::Span<const int64_t>(shape), v);
}

// x, target, w1, b1, w2, b2 as host tensors of `dtype` (f32 or bf16).
inline std::vector<Tensor> MlpInputs(const MlpSizes& s, DType dtype = DType::kF32) {
  std::vector<Tensor> in = {
      UniformHost({s.batch, s.d_model}, 1, 1.0),
      UniformHost({s.batch, s.d_model}, 2, 1.0),
      UniformHost({s.d_model, s.d_hidden}, 3, 1.0 / std::sqrt(static_cast<double>(s.d_model))),
      UniformHost({s.d_hidden}, 4, 0.1),
      UniformHost({s.d_hidden, s.d_model}, 5, 1.0 / std::sqrt(static_cast<double>(s.d_hidden))),
      UniformHost({s.d_model}, 6, 0.1),
  };
  if (dtype != DType::kF32) {
    for (Tensor& t : in) t = Cast(t, dtype);
  }
  return in;
}

inline std::vector<PartitionSpec> MlpSpecs() {
  return {P("dp", None), P("dp", None), P(None, "tp"), P("tp"), P("tp", None), P()};
}

inline ShardMap MlpShardMap(const Mesh& mesh, int64_t count, DevicePlacement placement) {
  ShardFn fn = [count](const std::vector<Value>& in) -> std::vector<Value> {
    Value h = in[0].matmul(in[2]) + in[3];
    Value y = all_reduce(gelu(h).matmul(in[4]), "tp") + in[5];
    Value d = y - in[1];
    return {sum_partial(d * d, {}) / static_cast<double>(count)};
  };
  ShardMapOptions o;
  o.placement = std::move(placement);
  o.input_names = {"x", "target", "w1", "b1", "w2", "b2"};
  o.output_names = {"loss"};
  return shard_map(fn, mesh, MlpSpecs(), {P().Unreduced({"dp"})}, o);
}

// Loss and the gradients of all six inputs, as host tensors.
inline absl::StatusOr<ShardMapGrads> RunMlpStep(const Mesh& mesh, const std::vector<Tensor>& in,
                                                DevicePlacement placement) {
  ShardMap f = MlpShardMap(mesh, in[1].numel(), std::move(placement));
  return value_and_grad(f)(in);
}

// max |a - b| / max |b| (b the reference), values compared across dtypes; +inf when the NaN/inf
// patterns or shapes differ (tensor/testing/compare.h's MaxAbsDiff). For checks outside gtest.
inline double RelDiff(const Tensor& a, const Tensor& b) {
  const Tensor y = b.To(Device::Cpu());
  double scale = 1e-12;
  for (int64_t i = 0; i < y.numel(); ++i) {
    if (std::isfinite(y.at(i))) scale = std::max(scale, std::fabs(y.at(i)));
  }
  return testing::MaxAbsDiff(a, y) / scale;
}

// got within rel * max|want| of the reference want (tensor/testing/compare.h's
// TensorsNearScaled); a bf16 result is widened exactly to want's dtype first.
inline ::testing::AssertionResult NearReference(const Tensor& got, const Tensor& want,
                                                double rel) {
  const Tensor host = got.To(Device::Cpu());
  return testing::TensorsNearScaled(
      host.dtype() == want.dtype() ? host : Cast(host, want.dtype()), want, rel);
}

}  // namespace shardmap::gpu_testing

#endif  // SHARDMAP_TESTS_GPU_MLP_PROGRAM_H_
