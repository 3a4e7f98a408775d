// On-device random fills (tensor/random.h with a CUDA device) against the CPU generator: uniform
// values and ints bitwise equal, normals within an ulp of the output dtype (the device's log and
// cos differ from glibc's in the last bits of the f64 value); a block generated alone on the GPU
// equals the same slice of the whole. GPU tests skip without a GPU; the error paths run
// everywhere.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tensor/cuda/runtime.h"
#include "tensor/error.h"
#include "tensor/ops/shape_ops.h"
#include "tensor/random.h"
#include "tensor/tensor.h"
#include "tensor/testing/test_util.h"

namespace shardmap {
namespace {

using testing::ExpectOpError;

const Device kGpu = Device::Cuda(0);
constexpr DType kFloatTypes[] = {DType::kF32, DType::kF64, DType::kBF16, DType::kF16};
const std::vector<Shape> kShapes = {{0}, {1}, {}, {7, 13, 5}, {3, 0, 2}, {1000003}};

double Ulp(DType t, double w) {
  const int p = t == DType::kBF16 ? 7 : t == DType::kF16 ? 10 : t == DType::kF32 ? 23 : 52;
  const int min_exp = t == DType::kF16 ? -14 : t == DType::kF64 ? -1022 : -126;
  int e = 0;
  std::frexp(w, &e);
  return std::ldexp(1.0, std::max(e - 1, min_exp) - p);
}

void ExpectBitwiseEqual(const Tensor& dev, const Tensor& cpu, const std::string& what) {
  ASSERT_TRUE(dev.is_cuda()) << what;
  const Tensor got = dev.To(Device::Cpu());
  ASSERT_EQ(got.shape(), cpu.shape()) << what;
  ASSERT_EQ(got.dtype(), cpu.dtype()) << what;
  ASSERT_EQ(got.nbytes(), cpu.nbytes());
  if (cpu.nbytes() == 0) return;
  const auto* g = static_cast<const unsigned char*>(got.raw_data());
  const auto* c = static_cast<const unsigned char*>(cpu.raw_data());
  const size_t es = DTypeSize(cpu.dtype());
  for (size_t i = 0; i < cpu.nbytes(); i += es) {
    ASSERT_EQ(std::memcmp(g + i, c + i, es), 0)
        << what << " element " << i / es << ": got " << got.at(i / es) << " want "
        << cpu.at(i / es);
  }
}

void ExpectWithinUlp(const Tensor& dev, const Tensor& cpu, const std::string& what) {
  ASSERT_TRUE(dev.is_cuda()) << what;
  const Tensor got = dev.To(Device::Cpu());
  ASSERT_EQ(got.shape(), cpu.shape()) << what;
  ASSERT_EQ(got.dtype(), cpu.dtype()) << what;
  const DType t = cpu.dtype();
  int64_t differ = 0;
  for (int64_t i = 0; i < cpu.numel(); ++i) {
    const double g = got.at(i), w = cpu.at(i);
    // f64: the device's log/cos are within 2 ulp of the true value, glibc's within 1.
    const double tol = t == DType::kF64 ? 8 * Ulp(t, w) : Ulp(t, w);
    ASSERT_NEAR(g, w, tol) << what << " element " << i;
    differ += g != w;
  }
  if (t != DType::kF64) {  // a rounded f32/half value rarely sees the last-bit difference
    EXPECT_LE(differ, cpu.numel() / 1000 + 1) << what;
  }
}

TEST(RandomCudaTest, UniformIsBitwiseTheCpuValues) {
  SKIP_WITHOUT_GPU();
  for (DType t : kFloatTypes) {
    for (const Shape& s : kShapes) {
      const std::string what = std::string(DTypeName(t)) + ShapeToString(s);
      ExpectBitwiseEqual(RandomUniform(s, 7, 0.0, 1.0, t, kGpu), RandomUniform(s, 7, 0.0, 1.0, t),
                         "uniform " + what);
      const uint64_t seed = 1ull << 40 | 3;  // both key words used
      ExpectBitwiseEqual(RandomUniform(s, seed, -0.3, 2.5, t, kGpu),
                         RandomUniform(s, seed, -0.3, 2.5, t), "uniform[-0.3,2.5) " + what);
    }
  }
}

TEST(RandomCudaTest, NormalMatchesTheCpuWithinAnUlp) {
  SKIP_WITHOUT_GPU();
  for (DType t : kFloatTypes) {
    for (const Shape& s : kShapes) {
      const std::string what = std::string(DTypeName(t)) + ShapeToString(s);
      ExpectWithinUlp(RandomNormal(s, 11, 0.0, 1.0, t, kGpu), RandomNormal(s, 11, 0.0, 1.0, t),
                      "normal " + what);
      ExpectWithinUlp(RandomNormal(s, 12, 0.5, 0.02, t, kGpu), RandomNormal(s, 12, 0.5, 0.02, t),
                      "normal(0.5, 0.02) " + what);
    }
  }
}

TEST(RandomCudaTest, IntsAreBitwiseTheCpuValues) {
  SKIP_WITHOUT_GPU();
  for (const Shape& s : kShapes) {
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{50257}, int64_t{1} << 40,
                      INT64_MAX}) {
      ExpectBitwiseEqual(RandomInts(s, n, 5, kGpu), RandomInts(s, n, 5),
                         "ints " + ShapeToString(s) + " n=" + std::to_string(n));
    }
  }
}

TEST(RandomCudaTest, ABlockAloneEqualsTheSameSliceOfTheWhole) {
  SKIP_WITHOUT_GPU();
  const Shape global = {6, 40, 9};
  const Tensor whole_u = RandomUniform(global, 3, -1.0, 1.0, DType::kF32, kGpu);
  const Tensor whole_n = RandomNormal(global, 3, 0.0, 1.0, DType::kBF16, kGpu);
  const Tensor whole_i = RandomInts(global, 1000, 3, kGpu);
  for (int r = 0; r < 4; ++r) {  // column shards of dim 1, then a block cut in every dim
    const Shape off = {0, 10 * r, 0}, local = {6, 10, 9};
    const Tensor u = RandomUniformSlice(global, off, local, 3, -1.0, 1.0, DType::kF32, kGpu);
    ExpectBitwiseEqual(u, Slice(whole_u.To(Device::Cpu()), 1, 10 * r, 10), "uniform shard");
    ExpectBitwiseEqual(u, RandomUniformSlice(global, off, local, 3, -1.0, 1.0), "cpu shard");
    const Tensor n = RandomNormalSlice(global, off, local, 3, 0.0, 1.0, DType::kBF16, kGpu);
    ExpectBitwiseEqual(n, Slice(whole_n.To(Device::Cpu()), 1, 10 * r, 10), "normal shard");
    const Tensor i = RandomIntsSlice(global, off, local, 1000, 3, kGpu);
    ExpectBitwiseEqual(i, Slice(whole_i.To(Device::Cpu()), 1, 10 * r, 10), "ints shard");
  }
  const Shape off = {2, 7, 3}, local = {3, 11, 5};
  const Tensor block = RandomUniformSlice(global, off, local, 3, -1.0, 1.0, DType::kF32, kGpu);
  const Tensor want = Slice(Slice(Slice(whole_u.To(Device::Cpu()), 0, 2, 3), 1, 7, 11), 2, 3, 5);
  ExpectBitwiseEqual(block, want, "uniform block");
}

TEST(RandomCudaTest, ArgumentErrorsReadTheSameOnBothDevices) {
  SKIP_WITHOUT_GPU();
  for (Device d : {Device::Cpu(), kGpu}) {
    ExpectOpError([&] { RandomNormal({2}, 1, 0, 1, DType::kI32, d); },
                  {"random_normal", "i32", "not floating"});
    ExpectOpError([&] { RandomUniform({2}, 1, 2.0, 1.0, DType::kF32, d); },
                  {"random_uniform", "low"});
    ExpectOpError([&] { RandomUniformSlice({4, 4}, {0, 2}, {4, 3}, 1, 0, 1, DType::kF32, d); },
                  {"random_uniform", "does not fit"});
    ExpectOpError([&] { RandomIntsSlice({4}, {0}, {4, 1}, 5, 1, d); },
                  {"random_ints", "same rank"});
    ExpectOpError([&] { RandomInts({4}, 0, 1, d); }, {"random_ints", "n is 0"});
  }
}

// Runs everywhere: arguments are checked before the device is touched, and a device that does
// not exist (none without a GPU) is an OpError, never a crash.
TEST(RandomCudaTest, ErrorPathsRunEverywhere) {
  const Device missing = Device::Cuda(cuda::DeviceCount() + 3);
  ExpectOpError([&] { RandomUniform({2}, 1, 2.0, 1.0, DType::kF32, missing); },
                {"random_uniform", "low"});
  ExpectOpError([&] { RandomInts({4}, -1, 1, missing); }, {"random_ints", "n is -1"});
  EXPECT_THROW(RandomNormal({3, 4}, 1, 0.0, 1.0, DType::kF32, missing), OpError);
  EXPECT_THROW(RandomUniform({5}, 1, 0.0, 1.0, DType::kBF16, missing), OpError);
  EXPECT_THROW(RandomInts({5}, 10, 1, missing), OpError);
  // The CPU default is unchanged.
  EXPECT_FALSE(RandomNormal({3}, 1).is_cuda());
}

}  // namespace
}  // namespace shardmap
