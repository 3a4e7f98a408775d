#include "tensor/tensor.h"

#include <cmath>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensor/error.h"
#include "tensor/internal/cpu_allocator.h"

namespace shardmap {
namespace {

using ::testing::HasSubstr;

// Runs fn, expects an OpError whose message contains every fragment.
template <typename Fn>
void ExpectOpError(Fn fn, std::initializer_list<const char*> fragments) {
  const absl::Status s = CatchOpError(fn);
  ASSERT_FALSE(s.ok()) << "expected an OpError";
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  for (const char* f : fragments) EXPECT_THAT(std::string(s.message()), HasSubstr(f));
}

TEST(TensorTest, CreationAllDTypes) {
  for (DType t : {DType::kF32, DType::kF64, DType::kBF16, DType::kF16, DType::kI32, DType::kI64}) {
    const Tensor z = Tensor::Zeros({2, 3}, t);
    EXPECT_EQ(z.dtype(), t);
    EXPECT_EQ(z.numel(), 6);
    EXPECT_EQ(z.nbytes(), 6 * DTypeSize(t));
    for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(z.at(i), 0.0);
    const Tensor f = Tensor::Full({4}, 3.0, t);
    for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(f.at(i), 3.0);
    const Tensor o = Tensor::Ones({1, 1, 2}, t);
    EXPECT_EQ(o.at(1), 1.0);
    const Tensor a = Tensor::Arange(5, t);
    for (int64_t i = 0; i < 5; ++i) EXPECT_EQ(a.at(i), static_cast<double>(i));
  }
  EXPECT_EQ(Tensor::Scalar(2.5).rank(), 0);
  EXPECT_EQ(Tensor::Scalar(2.5).item(), 2.5);
  EXPECT_EQ(Tensor::Scalar(2.5, DType::kF64).dtype(), DType::kF64);
  // Rounded once on the way in: 1/3 in bf16 is 0x3eab.
  const Tensor b = Tensor::FromVector<float>({1}, {1.0f / 3}, DType::kBF16);
  EXPECT_EQ(b.at(0), BF16ToFloat(0x3eab));
}

TEST(TensorTest, FromVectorAndToVector) {
  const Tensor t = Tensor::FromVector<double>({2, 2}, {1, 2, 3, 4});
  EXPECT_EQ(t.dtype(), DType::kF64);
  EXPECT_EQ(t.ToVector<double>(), (std::vector<double>{1, 2, 3, 4}));
  const Tensor i = Tensor::FromVector<int64_t>({3}, {7, -1, 9});
  EXPECT_EQ(i.ToVector<int64_t>(), (std::vector<int64_t>{7, -1, 9}));
  const Tensor c = Tensor::FromVector<int32_t>({2}, {1, 2}, DType::kF32);
  EXPECT_EQ(c.dtype(), DType::kF32);
  EXPECT_EQ(c.data<float>()[1], 2.0f);
}

TEST(TensorTest, EmptyAndZeroSized) {
  const Tensor e = Tensor::Zeros({0, 5});
  EXPECT_TRUE(e.defined());
  EXPECT_EQ(e.numel(), 0);
  EXPECT_EQ(e.nbytes(), 0u);
  EXPECT_EQ(e.ShapeString(), "f32[0,5]");
  EXPECT_EQ(e.Clone().numel(), 0);
  EXPECT_EQ(e.Reshape({5, 0}).dim(1), 0);
  EXPECT_FALSE(Tensor().defined());
}

TEST(TensorTest, ReshapeIsAView) {
  Tensor a = Tensor::Arange(6).Reshape({2, 3});
  Tensor b = a.Reshape({3, -1});
  EXPECT_EQ(b.shape(), (Shape{3, 2}));
  EXPECT_TRUE(b.SharesStorageWith(a));
  b.data<float>()[0] = 7;
  EXPECT_EQ(a.at(0), 7.0);
  Tensor c = a.Clone();
  EXPECT_FALSE(c.SharesStorageWith(a));
  c.data<float>()[0] = 1;
  EXPECT_EQ(a.at(0), 7.0);
}

TEST(TensorTest, SliceRowsIsAView) {
  Tensor a = Tensor::Arange(12).Reshape({4, 3});
  Tensor s = a.SliceRows(1, 2);
  EXPECT_EQ(s.shape(), (Shape{2, 3}));
  EXPECT_EQ(s.ToVector<float>(), (std::vector<float>{3, 4, 5, 6, 7, 8}));
  s.data<float>()[0] = -1;
  EXPECT_EQ(a.at(3), -1.0);
  // A slice of a slice keeps the offset; Reshape of a slice too.
  Tensor ss = s.SliceRows(1, 1).Reshape({3});
  EXPECT_EQ(ss.ToVector<float>(), (std::vector<float>{6, 7, 8}));
  EXPECT_EQ(a.SliceRows(4, 0).numel(), 0);
}

TEST(TensorTest, DimsAndShapeString) {
  const Tensor t = Tensor::Zeros({2, 3, 4}, DType::kBF16);
  EXPECT_EQ(t.dim(0), 2);
  EXPECT_EQ(t.dim(-1), 4);
  EXPECT_EQ(t.dim(-3), 2);
  EXPECT_EQ(t.ShapeString(), "bf16[2,3,4]");
  EXPECT_EQ(Tensor::Scalar(1).ShapeString(), "f32[]");
  EXPECT_EQ(ShapeToString({}), "[]");
  EXPECT_EQ(NumElements({2, 0, 3}), 0);
}

TEST(TensorTest, Errors) {
  ExpectOpError([] { Tensor::Zeros({2, -1}); }, {"dim 1", "[2,-1]", "negative"});
  ExpectOpError([] { Tensor::Zeros({int64_t{1} << 40, int64_t{1} << 40}); }, {"too many elements"});
  EXPECT_EQ(Tensor::Zeros({int64_t{1} << 40, int64_t{1} << 40, 0}).numel(), 0);
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)  // they abort on huge mallocs
  // Huge but addressable: the allocator fails cleanly with ResourceExhausted, no crash.
  const absl::Status huge = CatchOpError([] { Tensor::Empty({int64_t{1} << 58}, DType::kF32); });
  EXPECT_EQ(huge.code(), absl::StatusCode::kResourceExhausted) << huge;
#endif
  ExpectOpError(
      [] {
        Tensor::FromVector<float>({2, 2}, {1, 2, 3});
      },
      {"FromVector", "3 values", "[2,2]"});
  const Tensor t = Tensor::Zeros({2, 3});
  ExpectOpError([&] { t.dim(2); }, {"dim 2", "f32[2,3]"});
  ExpectOpError([&] { t.dim(-3); }, {"dim -3", "f32[2,3]"});
  ExpectOpError([&] { t.data<double>(); }, {"data<f64>", "f32[2,3]"});
  ExpectOpError([&] { t.item(); }, {"item", "f32[2,3]"});
  ExpectOpError([&] { t.at(6); }, {"index 6", "f32[2,3]"});
  ExpectOpError([&] { t.Reshape({4, 2}); }, {"reshape", "f32[2,3]", "[4,2]"});
  ExpectOpError([&] { t.Reshape({-1, -1}); }, {"more than one -1"});
  ExpectOpError([&] { t.Reshape({4, -1}); }, {"cannot infer"});
  ExpectOpError([&] { t.Reshape({-2, 3}); }, {"negative"});
  ExpectOpError([&] { t.SliceRows(1, 2); }, {"slice_rows", "[1, 3)", "f32[2,3]"});
  ExpectOpError([&] { t.SliceRows(-1, 1); }, {"slice_rows"});
  ExpectOpError([] { Tensor::Scalar(1).SliceRows(0, 1); }, {"no dim 0"});
}

TEST(TensorTest, CatchOpErrorPassesOkAndWrapsOtherExceptions) {
  EXPECT_TRUE(CatchOpError([] {}).ok());
  const absl::Status s = CatchOpError([] { throw std::runtime_error("boom"); });
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(s.message()), HasSubstr("boom"));
}

TEST(TensorTest, StorageIsAlignedForEverySize) {
  // Inline (<= 64 bytes), heap and cached-large sizes.
  for (int64_t n : {1, 3, 16, 17, 100, 1000, 300000, 1 << 20}) {
    const Tensor t = Tensor::Full({n}, 2.0);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw_data()) % 64, 0u) << n;
    EXPECT_EQ(t.at(n - 1), 2.0);
  }
}

TEST(TensorTest, LargeBlocksAreCachedAndReused) {
  const size_t before = internal::CachedBytes();
  const void* first;
  {
    const Tensor big = Tensor::Zeros({3 << 20}, DType::kI32);  // 12 MiB: cached when freed
    first = big.raw_data();
  }
  EXPECT_GE(internal::CachedBytes(), before + (size_t{12} << 20));
  const Tensor again = Tensor::Zeros({3 << 20}, DType::kI32);
  EXPECT_EQ(again.raw_data(), first);
  EXPECT_EQ(internal::CachedBytes(), before);
  EXPECT_EQ(again.at((3 << 20) - 1), 0.0);  // a reused block is still initialised by Zeros
}

TEST(TensorTest, MetaTensorsHaveShapeAndNoData) {
  const Device meta = Device::Meta();
  EXPECT_TRUE(meta.is_meta());
  EXPECT_FALSE(meta.is_cuda());
  EXPECT_EQ(meta.ToString(), "meta");
  EXPECT_NE(meta, Device::Cpu());
  const size_t cached = internal::CachedBytes();
  // 64 GiB: allocates nothing.
  Tensor big = Tensor::Empty({1 << 16, 1 << 18}, DType::kF32, meta);
  EXPECT_TRUE(big.is_meta());
  EXPECT_EQ(big.ShapeString(), "f32[65536,262144]");
  EXPECT_EQ(big.nbytes(), size_t{1} << 36);
  EXPECT_EQ(big.raw_data(), nullptr);
  for (const Tensor& t : {Tensor::Zeros({3, 4}, DType::kBF16, meta),
                          Tensor::Ones({3, 4}, DType::kBF16, meta),
                          Tensor::Full({3, 4}, 7, DType::kBF16, meta)}) {
    EXPECT_TRUE(t.is_meta());
    EXPECT_EQ(t.ShapeString(), "bf16[3,4]");
    EXPECT_EQ(t.raw_data(), nullptr);
  }
  EXPECT_EQ(internal::CachedBytes(), cached);
  // Views and copies stay on meta.
  EXPECT_TRUE(big.Reshape({-1}).SharesStorageWith(big));
  EXPECT_EQ(big.SliceRows(5, 2).ShapeString(), "f32[2,262144]");
  EXPECT_TRUE(big.SliceRows(5, 2).Clone().is_meta());
  EXPECT_FALSE(big.SliceRows(5, 2).Clone().SharesStorageWith(big));
  // The same argument checks as on the CPU.
  EXPECT_THROW(Tensor::Empty({-1}, DType::kF32, meta), OpError);
  EXPECT_THROW(big.Reshape({3, -1}), OpError);
  EXPECT_THROW(big.SliceRows(1 << 16, 1), OpError);
}

// Host reads of meta tensors give zeros, so host-side code (a loss printed, a grad norm
// compared) runs unchanged in shape-only mode.
TEST(TensorTest, HostReadsOfMetaTensorsAreZeros) {
  const Device meta = Device::Meta();
  const Tensor m = Tensor::Full({2, 3}, 5.0, DType::kF32, meta);
  EXPECT_EQ(m.at(4), 0.0);
  EXPECT_EQ(m.ToVector<float>(), std::vector<float>(6, 0.0f));
  EXPECT_EQ(m.ToVector<int64_t>(), std::vector<int64_t>(6, 0));
  EXPECT_EQ(Tensor::Full({}, 3.0, DType::kF64, meta).item(), 0.0);
  EXPECT_THROW(m.item(), OpError);  // numel != 1: the CPU's error
  EXPECT_THROW(m.at(6), OpError);
  const Tensor host = m.To(Device::Cpu());
  EXPECT_EQ(host.device(), Device::Cpu());
  EXPECT_EQ(host.ShapeString(), "f32[2,3]");
  EXPECT_EQ(host.ToVector<double>(), std::vector<double>(6, 0.0));
}

TEST(TensorTest, ToMetaKeepsShapeAndDropsData) {
  const Tensor c = Tensor::FromVector<float>({2, 2}, {1, 2, 3, 4});
  const Tensor m = c.To(Device::Meta());
  EXPECT_TRUE(m.is_meta());
  EXPECT_EQ(m.ShapeString(), "f32[2,2]");
  EXPECT_TRUE(m.To(Device::Meta()).SharesStorageWith(m));
  EXPECT_EQ(c.at(3), 4.0);  // the source is untouched
  EXPECT_THROW(Tensor().To(Device::Meta()), OpError);
}

}  // namespace
}  // namespace shardmap
