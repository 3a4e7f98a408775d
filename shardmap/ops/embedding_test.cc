// Parallel embeddings against the unsharded lookup written as loops (out[i, :] = table[ids[i], :]):
// vocab-parallel (table S0 over tp: each device looks up the ids in its rows, the rest give 0, the
// P result is all_reduced or reduce_scattered), hidden-parallel (table S1: the output is sharded
// on its last dim), and vocab-parallel over tp with ids sharded over dp. Odd and
// non-power-of-two rank counts; ids on the first and last row of every shard.
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "shardmap/ops/collective_ops.h"
#include "shardmap/ops/nn_ops.h"
#include "shardmap/shard_map.h"
#include "tests/test_util.h"

namespace shardmap {
namespace {

using testing::Rand;

constexpr int64_t kVocab = 30, kHidden = 6;

// out[i, :] = table[ids[i], :], for ids of any shape (output shape ids.shape + [hidden]).
Tensor LookupByHand(const Tensor& table, const Tensor& ids) {
  const int64_t hidden = table.dim(1);
  std::vector<double> out;
  for (int64_t i = 0; i < ids.numel(); ++i) {
    const int64_t row = static_cast<int64_t>(ids.at(i));
    for (int64_t h = 0; h < hidden; ++h) out.push_back(table.at(row * hidden + h));
  }
  Shape shape = ids.shape();
  shape.push_back(hidden);
  return Tensor::FromVector<double>(shape, out);
}

// [2, 8] ids touching the first and last rows of every shard for tp in {1, 2, 3, 5}, repeated ids.
Tensor Ids() {
  return Tensor::FromVector<int64_t>({2, 8}, {0, 29, 5, 6, 9, 10, 14, 15, 17, 18, 19, 20, 23, 24, 29,
                                              0});
}

TEST(EmbeddingTest, VocabParallelForwardEqualsTheUnshardedLookup) {
  const Tensor table = Rand({kVocab, kHidden}, 1), ids = Ids();
  const Tensor want = LookupByHand(table, ids);
  for (int tp : {1, 2, 3, 5}) {
    SCOPED_TRACE(absl::StrCat("tp=", tp));
    Mesh mesh = *Mesh::Create({{"tp", tp}});
    absl::StatusOr<std::vector<Tensor>> r = shard_map(
        [](const std::vector<Value>& in) -> std::vector<Value> {
          Value e = embedding(in[0], in[1]);  // P on tp
          EXPECT_EQ(e.type.ToString({"tp"}), "{tp:P}");
          return {all_reduce(e, "tp")};
        },
        mesh, {P("tp"), P()}, {P()})({table, ids});
    ASSERT_TRUE(r.ok()) << r.status();
    // Exactly one shard holds each row and the others add zeros: the sum is exact.
    EXPECT_TENSOR_EQ((*r)[0], want);
    // The unreduced P result summed at the boundary is the same lookup.
    r = shard_map([](const std::vector<Value>& in) -> std::vector<Value> {
          return {embedding(in[0], in[1])};
        }, mesh, {P("tp"), P()}, {P().Unreduced({"tp"})})({table, ids});
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TENSOR_EQ((*r)[0], want);
  }
}

TEST(EmbeddingTest, VocabParallelWithReduceScatterForSequenceParallel) {
  const Tensor table = Rand({kVocab, kHidden}, 2);
  const Tensor ids = Tensor::FromVector<int64_t>({6}, {29, 0, 14, 15, 3, 22});
  for (int tp : {2, 3}) {
    SCOPED_TRACE(absl::StrCat("tp=", tp));
    Mesh mesh = *Mesh::Create({{"tp", tp}});
    absl::StatusOr<std::vector<Tensor>> r = shard_map(
        [](const std::vector<Value>& in) -> std::vector<Value> {
          return {reduce_scatter(embedding(in[0], in[1]), 0, "tp")};  // rows S0 on tp
        },
        mesh, {P("tp"), P()}, {P("tp")})({table, ids});
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TENSOR_EQ((*r)[0], LookupByHand(table, ids));
  }
}

TEST(EmbeddingTest, HiddenParallelTableShardsTheOutputsLastDim) {
  const Tensor table = Rand({kVocab, kHidden}, 3), ids = Ids();
  for (int tp : {1, 2, 3}) {
    SCOPED_TRACE(absl::StrCat("tp=", tp));
    Mesh mesh = *Mesh::Create({{"tp", tp}});
    absl::StatusOr<std::vector<Tensor>> r = shard_map(
        [](const std::vector<Value>& in) -> std::vector<Value> {
          Value e = embedding(in[0], in[1]);
          EXPECT_EQ(e.type.ToString({"tp"}), "{tp:S2}");
          return {e};
        },
        mesh, {P(None, "tp"), P()}, {P(None, None, "tp")})({table, ids});
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TENSOR_EQ((*r)[0], LookupByHand(table, ids));
  }
}

TEST(EmbeddingTest, VocabParallelOverTpWithIdsShardedOverDp) {
  const Tensor table = Rand({kVocab, kHidden}, 4), ids = Ids();
  for (auto [dp, tp] : std::vector<std::pair<int, int>>{{2, 3}, {2, 5}, {1, 2}}) {
    SCOPED_TRACE(absl::StrCat("dp=", dp, " tp=", tp));
    Mesh mesh = *Mesh::Create({{"dp", dp}, {"tp", tp}});
    absl::StatusOr<std::vector<Tensor>> r = shard_map(
        [](const std::vector<Value>& in) -> std::vector<Value> {
          return {all_reduce(embedding(in[0], in[1]), "tp")};
        },
        mesh, {P("tp"), P("dp")}, {P("dp")})({table, ids});
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TENSOR_EQ((*r)[0], LookupByHand(table, ids));
  }
}

}  // namespace
}  // namespace shardmap
