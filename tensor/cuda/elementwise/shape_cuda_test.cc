// The CUDA layout kernels and casts against the CPU ops on the same inputs: results must be
// bit-identical (NaN payloads aside). Skips without a GPU; the no-GPU error path runs
// everywhere.
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "tensor/cuda/elementwise/compare_test_util.h"
#include "tensor/cuda/runtime.h"
#include "tensor/error.h"
#include "tensor/ops/shape_ops.h"
#include "tensor/tensor.h"
#include "tensor/testing/test_util.h"

namespace shardmap {
namespace {

using testing::Dev;
using testing::ExpectMatchesCpu;
using testing::ExpectOpError;
using testing::Host;
using testing::kExact;
using testing::RandomTensor;

const DType kAllTypes[] = {DType::kF32, DType::kF64, DType::kBF16,
                           DType::kF16, DType::kI32, DType::kI64};

// Values that differ from their neighbours (in every dtype), so a misplaced element shows.
Tensor Iota(const Shape& s, DType t) {
  std::vector<double> v(NumElements(s));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(i % 2039) - 1000;
  return Tensor::FromVector<double>(s, v, t);
}

std::string Name(const char* op, DType t, const Shape& s, const std::string& more = "") {
  return std::string(op) + " " + DTypeName(t) + ShapeToString(s) + " " + more;
}

TEST(ShapeCudaTest, WithoutAGpuCudaTensorsAreAnOpError) {
  if (cuda::Available()) GTEST_SKIP() << "a GPU is present";
  EXPECT_THROW(Tensor::Zeros({2}, DType::kF32, Device::Cuda(0)), OpError);
}

TEST(ShapeCudaTest, TransposeEveryPairOfDims) {
  SKIP_WITHOUT_GPU();
  const std::vector<Shape> shapes = {{0, 3},  {1, 1},     {7, 13},     {33, 65},   {1, 1000003},
                                     {64, 64}, {3, 1, 5}, {2, 7, 13},   {4, 33, 40}, {2, 3, 4, 5},
                                     {2, 1, 3, 1, 5}};
  for (DType t : kAllTypes) {
    for (const Shape& s : shapes) {
      const Tensor x = Iota(s, t);
      const Tensor dx = Dev(x);
      const int r = static_cast<int>(s.size());
      for (int i = 0; i < r; ++i) {
        for (int j = i + 1; j < r; ++j) {
          ExpectMatchesCpu(Host(Transpose(dx, i, j)), Transpose(x, i, j), kExact,
                           Name("transpose", t, s, std::to_string(i) + "," + std::to_string(j)));
        }
      }
    }
  }
}

TEST(ShapeCudaTest, PermuteEveryPermutation) {
  SKIP_WITHOUT_GPU();
  for (DType t : {DType::kF32, DType::kF64, DType::kBF16}) {
    // {2,3,2,8}: permutations that keep the last dim move whole rows in 16-byte units.
    for (const Shape& s :
         std::vector<Shape>{{2, 3, 4, 5}, {3, 1, 7, 2}, {5, 6, 1, 9}, {2, 3, 2, 8}}) {
      const Tensor x = Iota(s, t);
      const Tensor dx = Dev(x);
      std::vector<int> p(s.size());
      std::iota(p.begin(), p.end(), 0);
      do {
        ExpectMatchesCpu(Host(Permute(dx, p)), Permute(x, p), kExact,
                         Name("permute", t, s, absl::StrJoin(p, ",")));
      } while (std::next_permutation(p.begin(), p.end()));
    }
  }
  // Rank 6 and 8, a batched head split, a large gather.
  const Tensor a = Iota({2, 3, 2, 3, 2, 3}, DType::kF32);
  const std::vector<int> pa = {5, 3, 1, 4, 2, 0};
  ExpectMatchesCpu(Host(Permute(Dev(a), pa)), Permute(a, pa), kExact, "permute rank 6");
  const Tensor b = Iota({2, 2, 3, 2, 2, 3, 2, 2}, DType::kF16);
  const std::vector<int> pb = {7, 0, 6, 1, 5, 2, 4, 3};
  ExpectMatchesCpu(Host(Permute(Dev(b), pb)), Permute(b, pb), kExact, "permute rank 8");
  const Tensor h = Iota({4, 128, 12, 64}, DType::kBF16);  // [b,s,h,d] -> [b,h,s,d]
  ExpectMatchesCpu(Host(Permute(Dev(h), {0, 2, 1, 3})), Permute(h, {0, 2, 1, 3}), kExact,
                   "permute heads");
  const Tensor h2 = Iota({2, 3, 4, 2}, DType::kF16);  // rows of 4 bytes: moved as u32
  ExpectMatchesCpu(Host(Permute(Dev(h2), {2, 0, 1, 3})), Permute(h2, {2, 0, 1, 3}), kExact,
                   "permute f16 pairs");
  // A source view that starts one row (4 floats = 16 bytes) or one element in.
  const Tensor m = Iota({7, 2, 2, 4}, DType::kF32);
  for (int64_t first : {4, 1}) {
    const Tensor hv = m.Reshape({112}).SliceRows(first, 48).Reshape({3, 2, 2, 4});
    const Tensor dv = Dev(m).Reshape({112}).SliceRows(first, 48).Reshape({3, 2, 2, 4});
    ExpectMatchesCpu(Host(Permute(dv, {2, 0, 1, 3})), Permute(hv, {2, 0, 1, 3}), kExact,
                     "permute of a view starting at element " + std::to_string(first));
  }
  const Tensor g = Iota({37, 41, 53}, DType::kF32);
  ExpectMatchesCpu(Host(Permute(Dev(g), {2, 0, 1})), Permute(g, {2, 0, 1}), kExact,
                   "permute 3d gather");
  // The identity is a copy (new storage) on both devices.
  const Tensor dg = Dev(g);
  const Tensor same = Permute(dg, {0, 1, 2});
  EXPECT_FALSE(same.SharesStorageWith(dg));
  EXPECT_TRUE(same.is_cuda());
}

TEST(ShapeCudaTest, SliceSplitChunk) {
  SKIP_WITHOUT_GPU();
  for (DType t : kAllTypes) {
    const Tensor x = Iota({4, 10, 7}, t);
    const Tensor dx = Dev(x);
    for (int dim = 0; dim < 3; ++dim) {
      const int64_t n = x.shape()[dim];
      for (int64_t start : {int64_t{0}, int64_t{1}, n / 2, n}) {
        for (int64_t len : {int64_t{0}, int64_t{1}, n - start}) {
          if (start + len > n) continue;
          ExpectMatchesCpu(Host(Slice(dx, dim, start, len)), Slice(x, dim, start, len), kExact,
                           Name("slice", t, x.shape(),
                                absl::StrJoin({dim, int(start), int(len)}, ",")));
        }
      }
    }
    const std::vector<Tensor> parts = Split(dx, 1, {3, 0, 7});
    const std::vector<Tensor> want = Split(x, 1, {3, 0, 7});
    ASSERT_EQ(parts.size(), 3u);
    for (int i = 0; i < 3; ++i) {
      EXPECT_TRUE(parts[i].is_cuda());
      ExpectMatchesCpu(Host(parts[i]), want[i], kExact, Name("split", t, x.shape()));
    }
    const std::vector<Tensor> chunks = Chunk(dx, -1, 7);
    const std::vector<Tensor> wchunks = Chunk(x, -1, 7);
    for (int i = 0; i < 7; ++i) {
      ExpectMatchesCpu(Host(chunks[i]), wchunks[i], kExact, Name("chunk", t, x.shape()));
    }
  }
  // A long row, odd byte widths (bf16 slices of odd length), a misaligned source view.
  const Tensor r = Iota({3, 1000003}, DType::kF32);
  ExpectMatchesCpu(Host(Slice(Dev(r), 1, 12345, 777777)), Slice(r, 1, 12345, 777777), kExact,
                   "slice long row");
  const Tensor o = Iota({5, 9}, DType::kBF16);
  ExpectMatchesCpu(Host(Slice(Dev(o), 1, 3, 5)), Slice(o, 1, 3, 5), kExact, "slice bf16 odd");
  const Tensor v = Iota({9, 7}, DType::kF32);
  ExpectMatchesCpu(Host(Slice(Dev(v).SliceRows(1, 5), 1, 2, 3)), Slice(v.SliceRows(1, 5), 1, 2, 3),
                   kExact, "slice of a misaligned view");
}

TEST(ShapeCudaTest, ConcatAndSliceAssign) {
  SKIP_WITHOUT_GPU();
  for (DType t : kAllTypes) {
    const Tensor a = Iota({2, 3, 5}, t), b = Iota({2, 4, 5}, t), c = Iota({2, 0, 5}, t);
    ExpectMatchesCpu(Host(Concat({Dev(a), Dev(c), Dev(b)}, 1)), Concat({a, c, b}, 1), kExact,
                     Name("concat dim 1", t, a.shape()));
    const Tensor a0 = Iota({3, 7}, t), b0 = Iota({1, 7}, t);
    ExpectMatchesCpu(Host(Concat({Dev(a0), Dev(b0)}, 0)), Concat({a0, b0}, 0), kExact,
                     Name("concat dim 0", t, a0.shape()));
    const Tensor a2 = Iota({4, 3}, t), b2 = Iota({4, 1}, t);
    ExpectMatchesCpu(Host(Concat({Dev(a2), Dev(b2), Dev(a2)}, -1)), Concat({a2, b2, a2}, -1),
                     kExact, Name("concat last dim", t, a2.shape()));

    Tensor whole = Iota({4, 10, 3}, t);
    Tensor dwhole = Dev(whole);
    const Tensor part = Iota({4, 3, 3}, t);
    SliceAssign(dwhole, 1, 6, Dev(part));
    SliceAssign(whole, 1, 6, part);
    ExpectMatchesCpu(Host(dwhole), whole, kExact, Name("slice_assign", t, whole.shape()));
    // A part that is a view of the destination itself.
    SliceAssign(dwhole, 0, 1, dwhole.SliceRows(2, 2));
    SliceAssign(whole, 0, 1, whole.SliceRows(2, 2));
    ExpectMatchesCpu(Host(dwhole), whole, kExact, Name("slice_assign self", t, whole.shape()));
  }
}

TEST(ShapeCudaTest, CastBetweenEveryPairOfDtypes) {
  SKIP_WITHOUT_GPU();
  std::vector<double> v = {0, 1, -1, 0.5, -0.5, 1.5, -2.5, 2.5, 3.7, -3.7, 255.99, 65504, 65520,
                           1e-8, -1e-8, 6e-5, 1.0 / 3, 3.0e9, -3.0e9, 16777217, 1e30, -1e30};
  const Tensor r = RandomTensor({1000}, DType::kF64, 7, -300, 300);
  for (int64_t i = 0; i < r.numel(); ++i) v.push_back(r.at(i));
  for (DType from : kAllTypes) {
    const bool is_int = from == DType::kI32 || from == DType::kI64;
    std::vector<double> src;
    for (double d : v) {
      // Integer sources: values they hold (truncated, in i32 range).
      if (is_int && std::fabs(d) >= 2e9) continue;
      src.push_back(is_int ? std::trunc(d) : d);
    }
    const Tensor x = Tensor::FromVector<double>({static_cast<int64_t>(src.size())}, src, from);
    const Tensor dx = Dev(x);
    for (DType to : kAllTypes) {
      if (!is_int && (to == DType::kI32 || to == DType::kI64)) {
        // Float -> int of values that do not fit is undefined on the CPU; cast the in-range
        // ones.
        std::vector<double> ok;
        for (int64_t i = 0; i < x.numel(); ++i) {
          if (std::fabs(x.at(i)) < 2e9) ok.push_back(x.at(i));
        }
        const Tensor xi = Tensor::FromVector<double>({static_cast<int64_t>(ok.size())}, ok, from);
        ExpectMatchesCpu(Host(Cast(Dev(xi), to)), Cast(xi, to), kExact,
                         std::string("cast ") + DTypeName(from) + " -> " + DTypeName(to));
        continue;
      }
      const Tensor got = Cast(dx, to);
      EXPECT_EQ(got.dtype(), to);
      EXPECT_TRUE(got.is_cuda());
      ExpectMatchesCpu(Host(got), Cast(x, to), kExact,
                       std::string("cast ") + DTypeName(from) + " -> " + DTypeName(to));
      // A view one element in: unaligned, so the one-element-per-thread kernel.
      const int64_t n1 = x.numel() - 1;
      ExpectMatchesCpu(Host(Cast(dx.SliceRows(1, n1), to)), Cast(x.SliceRows(1, n1), to), kExact,
                       std::string("cast unaligned ") + DTypeName(from) + " -> " + DTypeName(to));
    }
    EXPECT_TRUE(Cast(dx, from).SharesStorageWith(dx));  // same dtype: x itself
  }
  // NaN and infinities between the float types; large i64 through double.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> special = {nan, inf, -inf, 3.4e38f, -0.0f, 1e-45f};
  for (DType from : {DType::kF32, DType::kF64, DType::kBF16, DType::kF16}) {
    const Tensor x = Tensor::FromVector<float>({6}, special, from);
    for (DType to : {DType::kF32, DType::kF64, DType::kBF16, DType::kF16}) {
      ExpectMatchesCpu(Host(Cast(Dev(x), to)), Cast(x, to), kExact,
                       std::string("cast specials ") + DTypeName(from) + " -> " + DTypeName(to));
    }
  }
  const Tensor big = Tensor::FromVector<int64_t>(
      {4}, {int64_t{1} << 60, -(int64_t{1} << 55) - 1, (int64_t{1} << 53) + 1, 12345678901});
  for (DType to : {DType::kF32, DType::kF64, DType::kBF16, DType::kF16}) {
    ExpectMatchesCpu(Host(Cast(Dev(big), to)), Cast(big, to), kExact,
                     std::string("cast big i64 -> ") + DTypeName(to));
  }
  const Tensor empty = Tensor::Zeros({0, 3}, DType::kF32);
  ExpectMatchesCpu(Host(Cast(Dev(empty), DType::kBF16)), Cast(empty, DType::kBF16), kExact,
                   "cast empty");
}

TEST(ShapeCudaTest, ErrorsReadLikeTheCpuOnes) {
  SKIP_WITHOUT_GPU();
  const Tensor c = Iota({2, 3}, DType::kF32);
  const Tensor g = Dev(c);
  ExpectOpError([&] { Concat({g, c}, 0); }, {"concat", "cuda:0", "cpu"});
  Tensor dw = Dev(Iota({4, 3}, DType::kF32));
  ExpectOpError([&] { SliceAssign(dw, 0, 0, c); }, {"slice_assign", "cuda:0", "cpu"});
  const absl::Status cpu = CatchOpError([&] { Slice(c, 1, 2, 5); });
  const absl::Status gpu = CatchOpError([&] { Slice(g, 1, 2, 5); });
  EXPECT_FALSE(gpu.ok());
  EXPECT_EQ(cpu.message(), gpu.message());
  const absl::Status cpu_p = CatchOpError([&] { Permute(c, {0, 0}); });
  const absl::Status gpu_p = CatchOpError([&] { Permute(g, {0, 0}); });
  EXPECT_EQ(cpu_p.message(), gpu_p.message());
}

}  // namespace
}  // namespace shardmap
