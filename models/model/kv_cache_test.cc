// KvCache (in-place, bounded buffers) and CachedAttention: feeding a sequence in chunks through
// the cache gives the rows of one causal attention over the whole sequence (f64, grouped-query
// heads, odd lengths), and misuse is refused with the layer and sizes named.
#include "models/model/kv_cache.h"

#include <cmath>
#include <functional>
#include <vector>

#include "gtest/gtest.h"
#include "models/model/model.h"
#include "shardmap/attention_ops.h"
#include "shardmap/ops.h"
#include "shardmap/spmd_runner.h"
#include "tensor/testing/compare.h"
#include "tensor/testing/test_util.h"

namespace shardmap {
namespace {

using testing::ExpectOpError;
using testing::RandomTensor;

void OnOneDevice(const std::function<void()>& fn) {
  absl::StatusOr<Mesh> mesh = Mesh::Create({{"dp", 1}});
  ASSERT_TRUE(mesh.ok());
  ASSERT_TRUE(RunSpmd(*mesh, [&](RankContext&) { fn(); }).ok());
}

// Chunks of 3, 1, 4, 1 tokens (a prefill, then steps) through the cache against one causal
// attention over all 9, with 6 query heads over 2 kv heads.
TEST(KvCacheTest, ChunkedAttentionEqualsTheWholeSequence) {
  OnOneDevice([] {
    const int64_t t = 9, heads = 6, kv = 2, hd = 4;
    const Tensor q = RandomTensor({t, heads, hd}, DType::kF64, 1);
    const Tensor k = RandomTensor({t, kv, hd}, DType::kF64, 2);
    const Tensor v = RandomTensor({t, kv, hd}, DType::kF64, 3);
    const Value whole = causal_attention(
        Value::Replicated(q.Reshape({1, t, heads, hd})),
        Value::Replicated(k.Reshape({1, t, kv, hd})), Value::Replicated(v.Reshape({1, t, kv, hd})),
        1 / std::sqrt(4.0));
    const Tensor want = whole.tensor.Reshape({t, heads * hd});
    KvCache cache(/*layers=*/2, /*capacity=*/t);
    int64_t at = 0;
    for (int64_t n : {3, 1, 4, 1}) {
      for (int64_t layer = 0; layer < 2; ++layer) {
        const auto [kc, vc] = cache.Append(layer, Value::Replicated(k.SliceRows(at, n)),
                                           Value::Replicated(v.SliceRows(at, n)));
        ASSERT_EQ(kc.dim(0), at + n);
        EXPECT_TENSOR_EQ(kc.tensor, k.SliceRows(0, at + n));  // written exactly
        const Value o = CachedAttention(Value::Replicated(q.SliceRows(at, n)), kc, vc);
        EXPECT_TENSOR_NEAR(o.tensor, want.SliceRows(at, n), 1e-14);
      }
      cache.Advance(n);
      at += n;
      EXPECT_EQ(cache.length(), at);
    }
    // Bounded: two layers of k and v at the capacity, allocated once.
    EXPECT_EQ(cache.bytes(), 2 * 2 * t * kv * hd * 8);
  });
}

TEST(KvCacheTest, Errors) {
  OnOneDevice([] {
    const Value k = Value::Replicated(Tensor::Zeros({3, 2, 4}, DType::kF64));
    KvCache cache(1, 4);
    cache.Append(0, k, k);
    cache.Advance(3);
    ExpectOpError([&] { cache.Append(1, k, k); }, {"layer 1", "outside [0, 1)"});
    ExpectOpError([&] { cache.Append(0, k, k); }, {"3 cached + 3 new", "capacity 4"});
    const Value other = Value::Replicated(Tensor::Zeros({1, 3, 4}, DType::kF64));
    KvCache c2(1, 8);
    c2.Append(0, k, k);
    ExpectOpError([&] { c2.Append(0, other, other); }, {"layer 0", "does not match"});
    ExpectOpError([&] { c2.Append(0, k, other); }, {"[n, kv_heads, head_dim]"});
    ExpectOpError([&] { c2.Advance(9); }, {"capacity 8"});
    ExpectOpError([] { KvCache bad(1, 0); }, {"capacity 0"});
  });
}

}  // namespace
}  // namespace shardmap
