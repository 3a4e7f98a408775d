// vocab_parallel_cross_entropy and cross_entropy_mean against a naive f64 reference (loss and
// gradient, written out below), central finite differences across ranks, and their errors; tp
// of 1, 3 and 5 over odd vocabularies and odd row counts.
#include "shardmap/ops/loss_ops.h"

#include <cmath>
#include <string>
#include <vector>

#include "autograd/value_and_grad.h"
#include "gtest/gtest.h"
#include "shardmap/ops/collective_ops.h"
#include "shardmap/ops/ops.h"
#include "shardmap/shard_map.h"
#include "spmd_testing/testing.h"
#include "tensor/random.h"

namespace shardmap {
namespace {

constexpr int64_t kIgnore = -100;

struct Reference {
  std::vector<double> per_row;  // loss of each row (0 for ignored rows)
  std::vector<double> grad;     // d sum_r(w_r * loss_r) / d logits, [n, v]
};

// loss_r = log(sum_j exp(x_rj)) - x_r,t_r with naive loops; d/dx_rj = w_r (softmax_rj - [j==t_r]).
Reference NaiveCrossEntropy(const Tensor& logits, const std::vector<int64_t>& t,
                            const std::vector<double>& w) {
  const int64_t n = logits.dim(0), v = logits.dim(1);
  std::vector<double> x = logits.ToVector<double>();
  Reference ref{std::vector<double>(n, 0.0), std::vector<double>(n * v, 0.0)};
  for (int64_t r = 0; r < n; ++r) {
    if (t[r] == kIgnore) continue;
    double s = 0;
    for (int64_t j = 0; j < v; ++j) s += std::exp(x[r * v + j]);
    ref.per_row[r] = std::log(s) - x[r * v + t[r]];
    for (int64_t j = 0; j < v; ++j) {
      ref.grad[r * v + j] = w[r] * (std::exp(x[r * v + j]) / s - (j == t[r] ? 1.0 : 0.0));
    }
  }
  return ref;
}

// loss = sum_r w_r * vocab_parallel_cross_entropy(logits, t)_r; outputs {loss, per_row}.
// logits [n, v] sharded S1 over tp (and rows over dp when the mesh has it).
ShardMap VocabParallel(const Mesh& mesh) {
  const bool dp = mesh.AxisIndex("dp") >= 0;
  ShardFn fn = [dp](const std::vector<Value>& in) -> std::vector<Value> {
    Value per_row = vocab_parallel_cross_entropy(in[0], in[1], "tp");
    Value loss = dp ? all_reduce(sum_partial(per_row * in[2], {}), "dp") : sum(per_row * in[2], {});
    return {loss, per_row};
  };
  const PartitionSpec rows = dp ? P("dp") : P();
  return shard_map(fn, mesh, {dp ? P("dp", "tp") : P(None, "tp"), rows, rows}, {P(), rows});
}

std::vector<Tensor> Inputs(int64_t n, int64_t v, const std::vector<int64_t>& t, int seed) {
  return {RandomNormal({n, v}, seed, 0.0, 2.0, DType::kF64), Tensor::FromVector<int64_t>({n}, t),
          RandomNormal({n}, seed + 1, 0.0, 1.0, DType::kF64)};
}

TEST(VocabParallelCrossEntropy, MatchesNaiveReferenceOnOddVocabAndTp) {
  // (tp, vocab): vocabularies odd, shards of 7, 5, 3 classes; 7 rows; one row ignored.
  for (auto [tp, v] : std::vector<std::pair<int, int64_t>>{{1, 7}, {3, 15}, {5, 15}, {3, 21}}) {
    const std::vector<int64_t> t = {0, v - 1, 3, kIgnore, v / 2, 1, v - 2};
    std::vector<Tensor> in = Inputs(7, v, t, tp * 10);
    Reference ref = NaiveCrossEntropy(in[0], t, in[2].ToVector<double>());
    absl::StatusOr<ShardMapGrads> r =
        value_and_grad(VocabParallel(*Mesh::Create({{"tp", tp}})))(in);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TENSOR_NEAR(r->outputs[1], Tensor::FromVector<double>({7}, ref.per_row), 1e-12)
        << "tp " << tp << " vocab " << v;
    EXPECT_TENSOR_NEAR(r->grads[0], Tensor::FromVector<double>({7, v}, ref.grad), 1e-12)
        << "tp " << tp << " vocab " << v;
    EXPECT_EQ(r->outputs[1].at(3), 0.0);  // the ignored row
  }
}

TEST(VocabParallelCrossEntropy, MatchesNaiveReferenceOnDpByTp) {
  const std::vector<int64_t> t = {0, 14, 3, 7, 9, 1, 13, 2, 11};
  std::vector<Tensor> in = Inputs(9, 15, t, 3);
  Reference ref = NaiveCrossEntropy(in[0], t, in[2].ToVector<double>());
  absl::StatusOr<ShardMapGrads> r =
      value_and_grad(VocabParallel(*Mesh::Create({{"dp", 3}, {"tp", 5}})))(in);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TENSOR_NEAR(r->outputs[1], Tensor::FromVector<double>({9}, ref.per_row), 1e-12);
  EXPECT_TENSOR_NEAR(r->grads[0], Tensor::FromVector<double>({9, 15}, ref.grad), 1e-12);
}

TEST(VocabParallelCrossEntropy, GradientsMatchFiniteDifferences) {
  const std::vector<int64_t> t = {4, kIgnore, 0, 14, 8};
  EXPECT_TRUE(spmd_testing::GradientsMatchFiniteDifferences(
      VocabParallel(*Mesh::Create({{"tp", 5}})), Inputs(5, 15, t, 7)));
  EXPECT_TRUE(spmd_testing::GradientsMatchFiniteDifferences(
      VocabParallel(*Mesh::Create({{"tp", 3}})), Inputs(5, 15, t, 8)));
}

TEST(VocabParallelCrossEntropy, ThreeAllReducesForwardTwoBackward) {
  std::vector<CollectiveRecord> log;
  ShardMapOptions options;
  options.collective_log = &log;
  ShardFn fn = [](const std::vector<Value>& in) -> std::vector<Value> {
    return {sum(vocab_parallel_cross_entropy(in[0], in[1], "tp"), {})};
  };
  ShardMap f = shard_map(fn, *Mesh::Create({{"tp", 3}}), {P(None, "tp"), P()}, {P()}, options);
  std::vector<Tensor> in = Inputs(5, 9, {0, 8, 4, 2, 6}, 9);
  in.pop_back();
  ASSERT_TRUE(value_and_grad(f)(in).ok());
  int forward = 0, backward = 0;
  for (const CollectiveRecord& c : log) {
    EXPECT_EQ(std::string(c.op), "all_reduce");
    (c.backward ? backward : forward)++;
  }
  EXPECT_EQ(forward, 3);   // max (no gradient), sum of exponentials, picked logit
  // The transposes of the two all_reduces that carry the gradient (P->R: an R result's
  // cotangent is a pending sum, reduced back over tp); the max's is not recorded.
  EXPECT_EQ(backward, 2);
}

// Runs vocab_parallel_cross_entropy on tp=3 with the given logits spec and targets (6 rows).
absl::Status RunVocab(PartitionSpec logits_spec, Tensor targets, const std::string& axis = "tp",
                      int64_t v = 9) {
  ShardFn fn = [axis](const std::vector<Value>& in) -> std::vector<Value> {
    return {sum(vocab_parallel_cross_entropy(in[0], in[1], axis), {})};
  };
  ShardMap f = shard_map(fn, *Mesh::Create({{"tp", 3}}), {logits_spec, P()}, {P()});
  return f({RandomNormal({6, v}, 1, 0.0, 1.0, DType::kF64), targets}).status();
}

TEST(VocabParallelCrossEntropy, RejectsBadIdsShapesAndTypes) {
  const PartitionSpec s1 = P(None, "tp");
  auto ids = [](std::vector<int64_t> t) {
    return Tensor::FromVector<int64_t>({static_cast<int64_t>(t.size())}, t);
  };
  EXPECT_TRUE(spmd_testing::RejectedWith(
      [&] { return RunVocab(s1, ids({0, 9, 1, 2, 3, 4})); },
      {"vocab_parallel_cross_entropy", "target 9 at row 1", "outside the vocabulary [0, 9)",
       "3 devices of 'tp'", "ignore_index"}));
  EXPECT_TRUE(spmd_testing::RejectedWith([&] { return RunVocab(s1, ids({0, 1, -1, 2, 3, 4})); },
                                         {"target -1 at row 2"}));
  EXPECT_TRUE(spmd_testing::RejectedWith([&] { return RunVocab(s1, ids({0, 1, 2})); },
                                         {"must have the leading dims of logits"}));
  EXPECT_TRUE(spmd_testing::RejectedWith(
      [&] { return RunVocab(s1, RandomNormal({6}, 2, 0.0, 1.0, DType::kF64)); },
      {"floating point", "cast(targets"}));
  EXPECT_TRUE(spmd_testing::RejectedWith([&] { return RunVocab(s1, ids({0, 1, 2, 3, 4, 5}), "mp"); },
                                         {"has no axis 'mp'", "Mesh{tp:3}"}));
  EXPECT_TRUE(spmd_testing::RejectedWith([&] { return RunVocab(P(), ids({0, 1, 2, 3, 4, 5})); },
                                         {"not sharded over this axis", "use cross_entropy"}));
}

TEST(VocabParallelCrossEntropy, RejectsPendingLogitsAndShardedIds) {
  Mesh mesh = *Mesh::Create({{"tp", 3}});
  ShardFn pending = [](const std::vector<Value>& in) -> std::vector<Value> {
    // Row-parallel head without its all_reduce: the logits are a pending sum.
    return {sum(vocab_parallel_cross_entropy(in[0].matmul(in[2]), in[1], "tp"), {})};
  };
  ShardMap f = shard_map(pending, mesh, {P(None, "tp"), P(), P("tp", None)}, {P()});
  std::vector<Tensor> in = {RandomNormal({4, 6}, 1, 0.0, 1.0, DType::kF64),
                            Tensor::FromVector<int64_t>({4}, {0, 1, 2, 3}),
                            RandomNormal({6, 9}, 2, 0.0, 1.0, DType::kF64)};
  EXPECT_TRUE(spmd_testing::RejectedWith([&] { return f(in); }, {"pending sum", "all_reduce"}));
  ShardFn plain = [](const std::vector<Value>& in) -> std::vector<Value> {
    // Ids that vary over tp: each device would pick a different row's class.
    return {sum(vocab_parallel_cross_entropy(in[0], vary(in[1], "tp"), "tp"), {})};
  };
  ShardMap g = shard_map(plain, mesh, {P(None, "tp"), P()}, {P()});
  EXPECT_TRUE(spmd_testing::RejectedWith(
      [&] {
        return g({RandomNormal({3, 9}, 1, 0.0, 1.0, DType::kF64),
                  Tensor::FromVector<int64_t>({3}, {0, 1, 2})});
      },
      {"take_along_last"}));
}

// loss = cross_entropy_mean(logits, t) on a tp mesh (classes whole, R).
ShardMap Mean(const Mesh& mesh, PartitionSpec rows = P()) {
  ShardFn fn = [](const std::vector<Value>& in) -> std::vector<Value> {
    return {cross_entropy_mean(in[0], in[1], kIgnore)};
  };
  return shard_map(fn, mesh, {rows, rows}, {P()});
}

TEST(CrossEntropyMean, MatchesNaiveMeanOverTheRowsNotIgnored) {
  const std::vector<int64_t> t = {2, kIgnore, 0, 10, kIgnore, 5, 7};
  std::vector<Tensor> in = Inputs(7, 11, t, 21);
  in.pop_back();
  Reference ref = NaiveCrossEntropy(in[0], t, std::vector<double>(7, 1.0 / 5.0));
  double mean = 0;
  for (double l : ref.per_row) mean += l / 5.0;
  for (int tp : {1, 3}) {
    absl::StatusOr<ShardMapGrads> r = value_and_grad(Mean(*Mesh::Create({{"tp", tp}})))(in);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_NEAR(r->outputs[0].item(), mean, 1e-13);
    EXPECT_TENSOR_NEAR(r->grads[0], Tensor::FromVector<double>({7, 11}, ref.grad), 1e-13);
  }
  EXPECT_TRUE(spmd_testing::GradientsMatchFiniteDifferences(Mean(*Mesh::Create({{"tp", 3}})), in));
}

TEST(CrossEntropyMean, AllRowsIgnoredIsZeroNotNaN) {
  std::vector<Tensor> in = Inputs(3, 5, {kIgnore, kIgnore, kIgnore}, 4);
  in.pop_back();
  absl::StatusOr<ShardMapGrads> r = value_and_grad(Mean(*Mesh::Create({{"tp", 1}})))(in);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->outputs[0].item(), 0.0);
  EXPECT_TENSOR_EQ(r->grads[0], Tensor::Zeros({3, 5}, DType::kF64));
}

TEST(CrossEntropyMean, RejectsShardedRowsBadIdsAndShapes) {
  std::vector<Tensor> in = Inputs(6, 5, {0, 1, 2, 3, 4, 0}, 5);
  in.pop_back();
  EXPECT_TRUE(spmd_testing::RejectedWith(
      [&] { return Mean(*Mesh::Create({{"dp", 3}}), P("dp"))(in); },
      {"cross_entropy_mean", "global count of rows", "sum_partial", "axis 'dp'"}));
  in[1] = Tensor::FromVector<int64_t>({6}, {0, 1, 5, 3, 4, 0});
  EXPECT_TRUE(spmd_testing::RejectedWith([&] { return Mean(*Mesh::Create({{"tp", 2}}))(in); },
                                         {"cross_entropy", "5"}));
  in[1] = Tensor::FromVector<int64_t>({2, 3}, {0, 1, 2, 3, 4, 0});
  EXPECT_TRUE(spmd_testing::RejectedWith([&] { return Mean(*Mesh::Create({{"tp", 2}}))(in); },
                                         {"cross_entropy_mean", "leading dims"}));
}

}  // namespace
}  // namespace shardmap
