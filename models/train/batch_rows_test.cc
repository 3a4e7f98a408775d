#include "models/train/batch_rows.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "tensor/tensor.h"

namespace shardmap {
namespace {

// MicrobatchRows copies microbatch k's rows in bulk: the same values, shape and dtype as reading
// them element by element (the reference below), for i64 batches, other dtypes and meta ones.
TEST(BatchRowsTest, MicrobatchRowsEqualsTheElementwiseReference) {
  const int64_t b = 6, seq = 5;
  std::vector<int64_t> v(b * seq);
  for (int64_t i = 0; i < b * seq; ++i) v[i] = 1000 + 7 * i;
  const Tensor i64 = Tensor::FromVector<int64_t>({b, seq}, v);
  const Tensor f32 = Tensor::FromVector<float>({b, seq}, std::vector<float>(v.begin(), v.end()));
  for (const Tensor& batch : {i64, f32}) {
    for (int64_t m : {1, 2, 3, 6}) {
      const int64_t per = b / m;
      for (int64_t k = 0; k < m; ++k) {
        std::vector<int64_t> ref(per * seq);
        for (int64_t i = 0; i < per * seq; ++i) {
          ref[i] = static_cast<int64_t>(batch.at(k * per * seq + i));
        }
        const Tensor got = MicrobatchRows(batch, k, m);
        EXPECT_EQ(got.ShapeString(), Tensor::FromVector<int64_t>({per * seq}, ref).ShapeString());
        EXPECT_EQ(got.ToVector<int64_t>(), ref) << m << " " << k;
        EXPECT_FALSE(got.SharesStorageWith(batch));  // a copy, as before
      }
    }
  }
  const Tensor meta = Tensor::Empty({b, seq}, DType::kI64, Device::Meta());
  const Tensor got = MicrobatchRows(meta, 1, 2);
  EXPECT_EQ(got.ShapeString(), "i64[15]");
  EXPECT_TRUE(got.is_meta());  // a meta rank's rows stay meta (no values to copy)
}

}  // namespace
}  // namespace shardmap
