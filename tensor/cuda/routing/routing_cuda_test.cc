// The CUDA routing ops against the CPU ops (tensor/ops/routing.h) in every float dtype: top-k
// values, indices and backward bitwise, gather bitwise, scatter-add within rounding; the CPU's
// errors (NaN in top-k, indices out of range) with the same messages. Skips without a GPU.
#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "tensor/cuda/runtime.h"
#include "tensor/ops/routing.h"
#include "tensor/ops/shape_ops.h"
#include "tensor/tensor.h"
#include "tensor/testing/compare.h"
#include "tensor/testing/test_util.h"

namespace shardmap {
namespace {

using testing::ExpectOpError;
using testing::RandomTensor;

const Device kGpu = Device::Cuda(0);
Tensor Host(const Tensor& t) { return t.To(Device::Cpu()); }

class RoutingCudaTest : public ::testing::TestWithParam<DType> {};

TEST_P(RoutingCudaTest, TopKAndBackwardMatchCpu) {
  SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  Tensor x = Cast(RandomTensor({3, 37, 9}, DType::kF32, 1), dt);
  // Ties (equal values) go to the lower index on both sides.
  x = Cast(Cast(x, DType::kF32), dt);
  std::vector<double> tie_row(9, 0.5);
  Tensor ties = Tensor::FromVector<double>({1, 9}, tie_row, dt);
  for (const Tensor& in : {x, ties}) {
    for (int64_t k : {int64_t{1}, int64_t{2}, int64_t{9}}) {
      const TopKResult want = TopK(in, k);
      const TopKResult got = TopK(in.To(kGpu), k);
      EXPECT_TENSOR_EQ(Host(got.values), want.values);
      EXPECT_TENSOR_EQ(Host(got.indices), want.indices);
      const Tensor dv = Cast(RandomTensor(want.values.shape(), DType::kF32, 2), dt);
      EXPECT_TENSOR_EQ(Host(TopKBackward(dv.To(kGpu), got.indices, in.dim(-1))),
                       TopKBackward(dv, want.indices, in.dim(-1)));
    }
  }
  // Repeated indices in the backward sum (in f32, rounded once, like the CPU).
  const Tensor idx = Tensor::FromVector<int64_t>({2, 3}, {1, 1, 0, 2, 0, 2});
  const Tensor dv = Cast(RandomTensor({2, 3}, DType::kF32, 3), dt);
  EXPECT_TENSOR_EQ(Host(TopKBackward(dv.To(kGpu), idx.To(kGpu), 4)), TopKBackward(dv, idx, 4));
}

TEST_P(RoutingCudaTest, GatherAndScatterAddMatchCpu) {
  SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  const Tensor x = Cast(RandomTensor({5, 3, 7}, DType::kF32, 4), dt);  // 15 rows of 7
  for (DType it : {DType::kI64, DType::kI32}) {
    const Tensor idx = Cast(Tensor::FromVector<int64_t>({9}, {3, -1, 14, 0, 3, 3, -1, 7, 1}), it);
    const Tensor g = GatherRows(x, idx);
    EXPECT_TENSOR_EQ(Host(GatherRows(x.To(kGpu), idx.To(kGpu))), g);
    const Tensor want = ScatterAddRows(g, idx, 15);
    const Tensor got = Host(ScatterAddRows(g.To(kGpu), idx.To(kGpu), 15));
    // Row 3 sums three rows: the order of the atomics may differ from the CPU's.
    EXPECT_TRUE(testing::TensorsNearScaled(got, want, dt == DType::kF64   ? 1e-15
                                                      : dt == DType::kF32 ? 1e-6
                                                                          : 1e-2));
  }
  // Odd byte widths copy correctly (3 bf16 = 6 bytes per row: the byte path).
  const Tensor narrow = Cast(RandomTensor({4, 3}, DType::kF32, 5), dt);
  const Tensor idx = Tensor::FromVector<int64_t>({3}, {2, -1, 0});
  EXPECT_TENSOR_EQ(Host(GatherRows(narrow.To(kGpu), idx.To(kGpu))), GatherRows(narrow, idx));
}

INSTANTIATE_TEST_SUITE_P(DTypes, RoutingCudaTest,
                         ::testing::Values(DType::kF32, DType::kBF16, DType::kF16, DType::kF64));

TEST(RoutingCuda, ErrorsMatchCpu) {
  SKIP_WITHOUT_GPU();
  Tensor x = RandomTensor({2, 4}, DType::kF32, 6);
  x.data<float>()[6] = std::nanf("");
  ExpectOpError([&] { TopK(x.To(kGpu), 2); }, {"top_k", "NaN at row 1, column 2"});
  const Tensor rows = RandomTensor({4, 3}, DType::kF32, 7).To(kGpu);
  const Tensor bad = Tensor::FromVector<int64_t>({3}, {0, 4, -2}).To(kGpu);
  ExpectOpError([&] { GatherRows(rows, bad); }, {"gather_rows", "idx[1] = 4", "< 4"});
  ExpectOpError([&] { ScatterAddRows(rows.Reshape({3, 4}), bad, 4); },
                {"scatter_add_rows", "idx[1] = 4"});
  ExpectOpError([&] { TopKBackward(rows, Tensor::FromVector<int64_t>({4, 3}, std::vector<int64_t>(
                                                 12, 5)).To(kGpu), 4); },
                {"top_k_backward", "index 5 at row 0"});
  ExpectOpError([&] { GatherRows(rows, Tensor::FromVector<int64_t>({1}, {0})); },
                {"gather_rows", "different devices"});
}

TEST(RoutingCuda, LocalIndicesMatchCpu) {
  SKIP_WITHOUT_GPU();
  const Tensor ids = Tensor::FromVector<int64_t>({2, 3}, {4, 7, 5, 9, 3, 6});
  for (DType it : {DType::kI64, DType::kI32}) {
    const Tensor in = Cast(ids, it);
    for (int64_t stride : {int64_t{0}, int64_t{4}}) {
      const Tensor got = LocalIndices(in.To(kGpu), 4, 4, stride);
      EXPECT_TRUE(got.is_cuda());
      EXPECT_TENSOR_EQ(Host(got), LocalIndices(in, 4, 4, stride));
    }
  }
  ExpectOpError([&] { LocalIndices(ids.To(kGpu), 4, 4, 0, true, "pick", " for x"); },
                {"pick: index 9 at position 3 is out of range [4, 8) for x"});
}

}  // namespace
}  // namespace shardmap
