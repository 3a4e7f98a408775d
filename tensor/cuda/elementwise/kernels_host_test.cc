// The host-side planning of the CUDA kernels (broadcast and permute collapsing, path choice,
// row widening, transpose detection), checked by replaying each kernel's index math on the host
// against the CPU ops. Runs everywhere: no GPU needed.
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "tensor/cuda/elementwise/elementwise_kernels.h"
#include "tensor/cuda/elementwise/layout_kernels.h"
#include "tensor/ops/elementwise.h"
#include "tensor/ops/shape_ops.h"
#include "tensor/tensor.h"
#include "tensor/testing/test_util.h"

namespace shardmap::cuda::kernels {
namespace {

using ::shardmap::testing::RandomTensor;

// What LaunchBinary computes for Add, element by element, following the path it picks.
std::vector<double> ReplayAdd(const Tensor& a, const Tensor& b, BinaryPath* path) {
  const Shape out = BroadcastShapes("add", a.shape(), b.shape());
  BroadcastDims d;
  const BroadcastDims* pd = nullptr;
  if (a.shape() != b.shape()) {
    EXPECT_TRUE(CollapseBroadcast(out.data(), static_cast<int>(out.size()), a.shape().data(),
                                  a.rank(), b.shape().data(), b.rank(), &d));
    pd = &d;
  }
  *path = ClassifyBroadcast(pd);
  const int64_t n = NumElements(out);
  std::vector<double> r(n);
  for (int64_t i = 0; i < n; ++i) {
    int64_t ai = i, bi = i;
    switch (*path) {
      case BinaryPath::kSame: break;
      case BinaryPath::kScalarA: ai = 0; break;
      case BinaryPath::kScalarB: bi = 0; break;
      case BinaryPath::kRowA: ai = i % d.sizes[1]; break;
      case BinaryPath::kRowB: bi = i % d.sizes[1]; break;
      case BinaryPath::kGeneral: {  // BinaryBroadcastKernel: innermost dim first
        int64_t rem = i;
        ai = bi = 0;
        for (int k = d.rank - 1; k >= 0; --k) {
          const int64_t idx = rem % d.sizes[k];
          rem /= d.sizes[k];
          ai += idx * d.a_strides[k];
          bi += idx * d.b_strides[k];
        }
        break;
      }
    }
    r[i] = a.at(ai) + b.at(bi);
  }
  return r;
}

TEST(KernelsHostTest, BroadcastPathsIndexLikeTheCpu) {
  struct Case {
    Shape a, b;
    BinaryPath path;
  };
  const std::vector<Case> cases = {
      {{4, 8}, {4, 8}, BinaryPath::kSame},
      {{1, 5}, {5}, BinaryPath::kSame},
      {{1, 1}, {1}, BinaryPath::kSame},
      {{7, 13}, {1}, BinaryPath::kScalarB},
      {{7, 13}, {}, BinaryPath::kScalarB},
      {{1}, {7, 13}, BinaryPath::kScalarA},
      {{4, 8}, {8}, BinaryPath::kRowB},
      {{3, 4, 8}, {1, 8}, BinaryPath::kRowB},
      {{8}, {4, 8}, BinaryPath::kRowA},
      {{6, 5, 7}, {5, 7}, BinaryPath::kRowB},  // [5,7] merges into one row of 35
      {{7, 1}, {1, 13}, BinaryPath::kGeneral},
      {{7, 13}, {7, 1}, BinaryPath::kGeneral},
      {{2, 1, 3, 1, 5}, {4, 3, 6, 5}, BinaryPath::kGeneral},
      {{2, 3, 1, 5, 1, 7}, {3, 4, 5, 6, 1}, BinaryPath::kGeneral},
      {{2, 1, 3, 1, 2, 1, 3, 1}, {1, 2, 1, 3, 1, 2, 1, 3}, BinaryPath::kGeneral},  // 8 dims
      {{1, 2, 1, 3, 1, 2, 1, 3, 4}, {1, 1, 3, 1, 2, 1, 3, 1, 4}, BinaryPath::kGeneral},
      {{1, 13}, {7, 1}, BinaryPath::kGeneral},            // [1,N] + [M,1]
      {{5, 1, 7}, {1, 4, 1}, BinaryPath::kGeneral},       // [A,1,C] + [1,B,1]
      {{}, {31}, BinaryPath::kScalarA},                   // scalar + tensor
      {{33}, {1}, BinaryPath::kScalarB},
      {{1}, {}, BinaryPath::kSame},                       // one element each
      {{70000, 3}, {3}, BinaryPath::kRowB},               // many short rows
      {{3}, {70000, 3}, BinaryPath::kRowA},
      {{70000, 3}, {70000, 1}, BinaryPath::kGeneral},
  };
  uint32_t seed = 1;
  for (const Case& c : cases) {
    const Tensor a = RandomTensor(c.a, DType::kF64, seed++);
    const Tensor b = RandomTensor(c.b, DType::kF64, seed++);
    BinaryPath path;
    const std::vector<double> got = ReplayAdd(a, b, &path);
    const std::string what = ShapeToString(c.a) + " + " + ShapeToString(c.b);
    EXPECT_EQ(static_cast<int>(path), static_cast<int>(c.path)) << what;
    EXPECT_EQ(got, Add(a, b).ToVector<double>()) << what;
  }
}

TEST(KernelsHostTest, CollapseBroadcastRefusesMoreThanEightDims) {
  // Alternating broadcast dims never merge: 9 of them need 9 collapsed dims.
  const Shape a = {2, 1, 2, 1, 2, 1, 2, 1, 2}, b = {1, 2, 1, 2, 1, 2, 1, 2, 1};
  const Shape out = BroadcastShapes("add", a, b);
  BroadcastDims d;
  EXPECT_FALSE(CollapseBroadcast(out.data(), 9, a.data(), 9, b.data(), 9, &d));
}

// What LaunchPermute computes, replaying its kernels (the transpose tile by tile, with the
// block's thread indices) on bytes.
std::vector<char> ReplayPermute(const Tensor& x, const std::vector<int>& perm, uint64_t addr_bits,
                                std::string* path) {
  PermuteDims d;
  EXPECT_TRUE(CollapsePermute(x.shape().data(), perm.data(), x.rank(), &d));
  int eb = static_cast<int>(DTypeSize(x.dtype()));
  int64_t n = x.numel();
  const bool widened = WidenPermute(&d, &eb, &n, addr_bits);
  const char* in = static_cast<const char*>(x.raw_data());
  std::vector<char> out(x.nbytes());
  auto move = [&](int64_t to, int64_t from) { std::memcpy(&out[to * eb], in + from * eb, eb); };
  int64_t B, R, C;
  if (d.rank <= 1) {
    *path = "copy";
    std::memcpy(out.data(), in, x.nbytes());
  } else if (eb <= 8 && AsBatchedTranspose(d, &B, &R, &C)) {
    *path = "transpose";
    const int64_t tr = (R + 31) / 32, tc = (C + 31) / 32;
    std::vector<int64_t> tile(32 * 33);  // source element index per tile slot
    for (int64_t t = 0; t < B * tr * tc; ++t) {
      const int64_t b = t / (tr * tc), rem = t - b * tr * tc;
      const int64_t r0 = (rem / tc) * 32, c0 = (rem % tc) * 32;
      for (int ty = 0; ty < 8; ++ty) {
        for (int tx = 0; tx < 32; ++tx) {
          for (int k = ty; k < 32; k += 8) {
            const int64_t r = r0 + k, c = c0 + tx;
            if (r < R && c < C) tile[k * 33 + tx] = b * R * C + r * C + c;
          }
        }
      }
      for (int ty = 0; ty < 8; ++ty) {
        for (int tx = 0; tx < 32; ++tx) {
          for (int k = ty; k < 32; k += 8) {
            const int64_t c = c0 + k, r = r0 + tx;
            if (c < C && r < R) move(b * R * C + c * R + r, tile[tx * 33 + k]);
          }
        }
      }
    }
  } else {
    *path = widened ? "rows of " + std::to_string(eb) + " bytes" : "gather";
    for (int64_t i = 0; i < n; ++i) {
      int64_t rem = i, off = 0;
      for (int k = d.rank - 1; k >= 0; --k) {
        off += (rem % d.out_sizes[k]) * d.in_strides[k];
        rem /= d.out_sizes[k];
      }
      move(i, off);
    }
  }
  return out;
}

std::vector<char> Bytes(const Tensor& t) {
  const char* p = static_cast<const char*>(t.raw_data());
  return std::vector<char>(p, p + t.nbytes());
}

TEST(KernelsHostTest, PermutePlansMoveBytesLikeTheCpu) {
  struct Case {
    Shape shape;
    DType dtype;
    std::vector<int> perm;
    uint64_t addr_bits;
    std::string path;
  };
  const std::vector<Case> cases = {
      {{7, 13}, DType::kF32, {1, 0}, 0, "transpose"},
      {{33, 65}, DType::kBF16, {1, 0}, 0, "transpose"},
      {{3, 33, 40}, DType::kF64, {0, 2, 1}, 0, "transpose"},
      {{2, 3, 4, 5}, DType::kF32, {0, 1, 3, 2}, 0, "transpose"},  // [6,4,5] batched
      {{2, 3, 4, 5}, DType::kF32, {2, 3, 0, 1}, 0, "transpose"},  // [6,20] -> [20,6]
      {{5, 1, 7}, DType::kI64, {2, 1, 0}, 0, "transpose"},
      {{2, 3, 4}, DType::kF32, {0, 1, 2}, 0, "copy"},
      {{1, 9, 1}, DType::kF16, {2, 0, 1}, 0, "copy"},
      {{2, 3, 4}, DType::kF32, {2, 0, 1}, 0, "transpose"},  // [6,4] -> [4,6]
      {{2, 3, 4}, DType::kF32, {1, 2, 0}, 0, "transpose"},
      {{2, 3, 4}, DType::kF32, {2, 1, 0}, 0, "gather"},
      {{4, 16, 6, 64}, DType::kBF16, {0, 2, 1, 3}, 0, "rows of 16 bytes"},
      {{4, 16, 6, 64}, DType::kBF16, {0, 2, 1, 3}, 8, "rows of 8 bytes"},
      {{4, 16, 6, 64}, DType::kBF16, {0, 2, 1, 3}, 2, "gather"},
      {{2, 3, 4, 2}, DType::kF16, {2, 0, 1, 3}, 0, "rows of 4 bytes"},
      {{2, 3, 4, 3}, DType::kF32, {2, 0, 1, 3}, 0, "gather"},
      {{2, 3, 2, 8}, DType::kF64, {1, 0, 2, 3}, 0, "rows of 16 bytes"},
      {{2, 3, 2, 3, 2, 3}, DType::kF32, {5, 3, 1, 4, 2, 0}, 0, "gather"},
      {{2, 2, 3, 2, 2, 3, 2, 2}, DType::kF16, {7, 0, 6, 1, 5, 2, 4, 3}, 0, "gather"},
      {{5, 7, 9}, DType::kF32, {2, 0, 1}, 0, "transpose"},     // [35,9] -> [9,35]
      {{65537, 33}, DType::kF32, {1, 0}, 0, "transpose"},      // 2049 x 2 tiles
      {{70000, 3, 5}, DType::kBF16, {0, 2, 1}, 0, "transpose"},  // batch 70000
      {{70000, 3, 5}, DType::kI64, {0, 2, 1}, 0, "transpose"},
  };
  uint32_t seed = 1;
  for (const Case& c : cases) {
    const Tensor x = RandomTensor(c.shape, c.dtype, seed++, -1000, 1000);
    std::string path;
    const std::vector<char> got = ReplayPermute(x, c.perm, c.addr_bits, &path);
    const std::string what = ShapeToString(c.shape) + " perm {" + absl::StrJoin(c.perm, ",") +
                             "} " + DTypeName(c.dtype);
    EXPECT_EQ(path, c.path) << what;
    EXPECT_TRUE(got == Bytes(Permute(x, c.perm))) << what;
  }
  // Every permutation of a rank-4 shape with size-1 dims, every alignment.
  for (DType t : {DType::kF32, DType::kBF16, DType::kF64}) {
    const Tensor x = RandomTensor({3, 1, 4, 8}, t, seed++, -1000, 1000);
    std::vector<int> p = {0, 1, 2, 3};
    do {
      for (uint64_t bits : {0, 2, 4, 8}) {
        std::string path;
        EXPECT_TRUE(ReplayPermute(x, p, bits, &path) == Bytes(Permute(x, p)))
            << "perm {" << absl::StrJoin(p, ",") << "} " << DTypeName(t) << " " << path;
      }
    } while (std::next_permutation(p.begin(), p.end()));
  }
}

TEST(KernelsHostTest, CollapsePermuteMergesAndDrops) {
  const Shape s = {2, 3, 4};
  PermuteDims d;
  const int p1[] = {0, 2, 1};
  ASSERT_TRUE(CollapsePermute(s.data(), p1, 3, &d));
  EXPECT_EQ(d.rank, 3);
  const int p2[] = {2, 0, 1};
  ASSERT_TRUE(CollapsePermute(s.data(), p2, 3, &d));
  ASSERT_EQ(d.rank, 2);
  EXPECT_EQ(d.out_sizes[0], 4);
  EXPECT_EQ(d.out_sizes[1], 6);
  EXPECT_EQ(d.in_strides[0], 1);
  EXPECT_EQ(d.in_strides[1], 4);
  const Shape nine = {2, 2, 2, 2, 2, 2, 2, 2, 2};
  const int reverse[] = {8, 7, 6, 5, 4, 3, 2, 1, 0};
  EXPECT_FALSE(CollapsePermute(nine.data(), reverse, 9, &d));
}

}  // namespace
}  // namespace shardmap::cuda::kernels
