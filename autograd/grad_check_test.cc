// f64 central finite-difference checks of every typed op and every collective/cast, through
// shard_map: the gradient of the global loss w.r.t. the global inputs (value_and_grad of the
// shard_map, assembled per in_specs) against (L(x+eps) - L(x-eps)) / 2eps of the global function
// computed by running the same shard_map forward. Meshes (2), (4), (2,3) and (2,2,2).
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "autograd/value_and_grad.h"
#include "gtest/gtest.h"
#include "shardmap/collective_ops.h"
#include "shardmap/context.h"
#include "shardmap/nn_ops.h"
#include "shardmap/ops.h"
#include "shardmap/shard_map.h"
#include "shardmap/sharding.h"
#include "tests/test_util.h"

namespace shardmap {
namespace {

using testing::Rand;

struct Case {
  std::string name;
  std::vector<Tensor> inputs;
  std::vector<PartitionSpec> in_specs;
  // Per device: the output y, to be checked through loss = sum(y * c).
  std::function<Value(const std::vector<Value>&)> fn;
  PartitionSpec out_spec;
  std::vector<int64_t> out_shape;  // global shape of y
};

// Runs the gradient check of one case on `mesh`.
void CheckCase(const Mesh& mesh, const Case& cs) {
  SCOPED_TRACE(absl::StrCat(cs.name, " on ", mesh.ShortString()));
  // The cotangent weights c, with y's spec (minus unreduced axes).
  PartitionSpec c_spec(cs.out_spec.dims());
  Tensor c = Rand(cs.out_shape, 977);
  std::vector<Tensor> inputs = cs.inputs;
  inputs.push_back(c);
  std::vector<PartitionSpec> in_specs = cs.in_specs;
  in_specs.push_back(c_spec);
  // The loss is P on every axis that shards y or leaves it unreduced, R elsewhere.
  std::vector<std::string> p_axes;
  AxisMask pmask = c_spec.ShardedMask(mesh) | cs.out_spec.UnreducedMask(mesh);
  for (int i = 0; i < mesh.num_axes(); ++i) {
    if (pmask & (1u << i)) p_axes.push_back(mesh.axis_names()[i]);
  }
  auto fn = cs.fn;
  ShardFn loss_fn = [fn](const std::vector<Value>& in) -> std::vector<Value> {
    std::vector<Value> args(in.begin(), in.end() - 1);
    Value y = fn(args);
    RankContext& ctx = *RankContext::Current();
    for (int i = 0; i < ctx.mesh().num_axes(); ++i) {
      if (y.type[i].kind == AxisKind::kI) y = convert(y, ctx.mesh().axis_names()[i], Convert::kIToR);
    }
    return {sum_partial(y * in.back(), {})};
  };
  ShardMap f = shard_map(loss_fn, mesh, in_specs, {P().Unreduced(p_axes)});
  absl::StatusOr<ShardMapGrads> got = value_and_grad(f)(inputs);
  ASSERT_TRUE(got.ok()) << got.status();

  const double eps = 1e-6;
  for (size_t k = 0; k < cs.inputs.size(); ++k) {
    const Tensor& x = inputs[k];
    if (x.dtype() != DType::kF64) continue;
    // Up to 6 elements, spread over the tensor.
    int64_t n = x.numel();
    int64_t step = std::max<int64_t>(1, n / 6);
    for (int64_t i = 0; i < n; i += step) {
      double loss[2];
      for (int s = 0; s < 2; ++s) {
        std::vector<Tensor> pert = inputs;
        pert[k] = x.Clone();
        pert[k].data<double>()[i] += s == 0 ? eps : -eps;
        absl::StatusOr<std::vector<Tensor>> out = f(pert);
        ASSERT_TRUE(out.ok()) << out.status();
        loss[s] = (*out)[0].item();
      }
      double numeric = (loss[0] - loss[1]) / (2 * eps);
      double analytic = got->grads[k].at(i);
      EXPECT_NEAR(analytic, numeric, 1e-6 * (1 + std::fabs(numeric)))
          << "d loss / d input " << k << " element " << i;
    }
  }
}

struct MeshCase {
  std::vector<std::pair<std::string, int>> axes;
};

class GradCheckTest : public ::testing::TestWithParam<MeshCase> {
 protected:
  Mesh mesh() const { return *Mesh::Create(GetParam().axes); }
  int a() const { return GetParam().axes[0].second; }
  bool has_b() const { return GetParam().axes.size() > 1; }
  int b() const { return has_b() ? GetParam().axes[1].second : 1; }
};

// ---- Elementwise and nonlinear ops ----------------------------------------------------------

TEST_P(GradCheckTest, UnaryOps) {
  const int n = a();
  using F = std::function<Value(const Value&)>;
  std::vector<std::pair<std::string, F>> ops = {
      {"exp", [](const Value& x) { return exp(x); }},
      {"log", [](const Value& x) { return log(x * x + 1.0); }},
      {"tanh", [](const Value& x) { return tanh(x); }},
      {"relu", [](const Value& x) { return relu(x); }},
      {"sqrt", [](const Value& x) { return sqrt(x * x + 0.5); }},
      {"gelu", [](const Value& x) { return gelu(x); }},
      {"gelu_erf", [](const Value& x) { return gelu(x, GeluApprox::kNone); }},
      {"silu", [](const Value& x) { return silu(x); }},
      {"neg_scale", [](const Value& x) { return -(x * 3.0) / 2.0 - 1.0; }},
  };
  for (auto& [name, op] : ops) {
    F g = op;
    CheckCase(mesh(), Case{name, {Rand({2 * n, 3}, 1)}, {P("a", None)},
                           [g](const std::vector<Value>& in) { return g(in[0]); },
                           P("a", None), {2 * n, 3}});
  }
}

TEST_P(GradCheckTest, BinaryOpsWithBroadcastAndPromotion) {
  const int n = a();
  using F = std::function<Value(const Value&, const Value&)>;
  std::vector<std::pair<std::string, F>> ops = {
      {"add", [](const Value& x, const Value& y) { return x + y; }},
      {"sub", [](const Value& x, const Value& y) { return x - y; }},
      {"mul", [](const Value& x, const Value& y) { return x * y; }},
      {"div", [](const Value& x, const Value& y) { return x / (y * y + 1.0); }},
  };
  for (auto& [name, op] : ops) {
    F g = op;
    // S0 (x) with a replicated broadcast row (R promoted to V: its gradient is P, summed).
    CheckCase(mesh(), Case{name + "_bcast", {Rand({2 * n, 3}, 2), Rand({3}, 3)},
                           {P("a", None), P()},
                           [g](const std::vector<Value>& in) { return g(in[0], in[1]); },
                           P("a", None), {2 * n, 3}});
    // Both sharded the same way.
    CheckCase(mesh(), Case{name + "_same", {Rand({n, 2}, 4), Rand({n, 2}, 5)},
                           {P("a"), P("a")},
                           [g](const std::vector<Value>& in) { return g(in[0], in[1]); },
                           P("a"), {n, 2}});
  }
  // P * R = P (a partial sum scaled by a replicated factor), left unreduced.
  CheckCase(mesh(), Case{"partial_times_r", {Rand({n, 3}, 6), Rand({3}, 7)}, {P("a"), P()},
                         [](const std::vector<Value>& in) {
                           return sum_partial(in[0], {0}) * in[1];
                         },
                         P().Unreduced({"a"}), {3}});
}

// ---- Matmul ---------------------------------------------------------------------------------

TEST_P(GradCheckTest, Matmuls) {
  const int n = a();
  // Column-parallel, row-parallel (-> P), transposed flags, batched with sharded batch.
  CheckCase(mesh(), Case{"column_parallel", {Rand({3, 4}, 8), Rand({4, 2 * n}, 9)},
                         {P(), P(None, "a")},
                         [](const std::vector<Value>& in) { return in[0].matmul(in[1]); },
                         P(None, "a"), {3, 2 * n}});
  CheckCase(mesh(), Case{"row_parallel", {Rand({3, 2 * n}, 10), Rand({2 * n, 2}, 11)},
                         {P(None, "a"), P("a", None)},
                         [](const std::vector<Value>& in) { return in[0].matmul(in[1]); },
                         P().Unreduced({"a"}), {3, 2}});
  CheckCase(mesh(), Case{"trans_a_b", {Rand({n, 3}, 12), Rand({2, n}, 13)},
                         {P("a", None), P(None, "a")},
                         [](const std::vector<Value>& in) {
                           return matmul(in[0], in[1], true, true);
                         },
                         P().Unreduced({"a"}), {3, 2}});
  CheckCase(mesh(), Case{"batched_rank3_x_rank2", {Rand({n, 2, 3}, 14), Rand({3, 2}, 15)},
                         {P("a"), P()},
                         [](const std::vector<Value>& in) { return in[0].matmul(in[1]); },
                         P("a"), {n, 2, 2}});
  CheckCase(mesh(), Case{"batched_both_sharded_batch", {Rand({n, 2, 3}, 16), Rand({n, 2, 3}, 17)},
                         {P("a"), P("a")},
                         [](const std::vector<Value>& in) {
                           return matmul(in[0], in[1], false, true);
                         },
                         P("a"), {n, 2, 2}});
}

// ---- Reductions and layout ------------------------------------------------------------------

TEST_P(GradCheckTest, ReductionsAndLayout) {
  const int n = a();
  CheckCase(mesh(), Case{"sum_unsharded_dim", {Rand({n, 3}, 18)}, {P("a")},
                         [](const std::vector<Value>& in) { return in[0].sum({1}); },
                         P("a"), {n}});
  CheckCase(mesh(), Case{"mean_keepdim", {Rand({n, 3}, 19)}, {P("a")},
                         [](const std::vector<Value>& in) { return in[0].mean({1}, true); },
                         P("a", None), {n, 1}});
  CheckCase(mesh(), Case{"sum_partial_sharded", {Rand({2 * n, 3}, 20)}, {P("a")},
                         [](const std::vector<Value>& in) { return sum_partial(in[0], {0}); },
                         P().Unreduced({"a"}), {3}});
  CheckCase(mesh(), Case{"reshape_merge_major", {Rand({n, 2, 3}, 21)}, {P("a")},
                         [](const std::vector<Value>& in) { return in[0].reshape({-1, 3}); },
                         P("a"), {2 * n, 3}});
  CheckCase(mesh(), Case{"transpose", {Rand({n, 3}, 22)}, {P("a")},
                         [](const std::vector<Value>& in) { return in[0].T(); },
                         P(None, "a"), {3, n}});
  CheckCase(mesh(), Case{"permute", {Rand({2, n, 3}, 23)}, {P(None, "a")},
                         [](const std::vector<Value>& in) { return permute(in[0], {2, 0, 1}); },
                         P(None, None, "a"), {3, 2, n}});
  CheckCase(mesh(), Case{"slice_unsharded_dim", {Rand({n, 5}, 24)}, {P("a")},
                         [](const std::vector<Value>& in) { return slice(in[0], 1, 1, 3); },
                         P("a"), {n, 3}});
  CheckCase(mesh(), Case{"concat", {Rand({n, 2}, 25), Rand({n, 3}, 26), Rand({3}, 27)},
                         {P("a"), P("a"), P()},
                         [n](const std::vector<Value>& in) {
                           Value r = broadcast_to(in[2], {in[0].dim(0), 3});
                           return concat({in[0], in[1], r}, 1);
                         },
                         P("a"), {n, 8}});
  CheckCase(mesh(), Case{"value_used_twice", {Rand({n, 3}, 28)}, {P("a")},
                         [](const std::vector<Value>& in) { return in[0] * in[0] + exp(in[0]); },
                         P("a"), {n, 3}});
}

// ---- Collectives and casts ------------------------------------------------------------------

TEST_P(GradCheckTest, CollectivesOverOneAxis) {
  const int n = a();
  CheckCase(mesh(), Case{"all_reduce_sum_R", {Rand({n, 3}, 30)}, {P("a")},
                         [](const std::vector<Value>& in) {
                           return all_reduce(sum_partial(in[0], {0}), "a");
                         },
                         P(), {3}});
  CheckCase(mesh(), Case{"all_reduce_sum_I", {Rand({n, 3}, 31)}, {P("a")},
                         [](const std::vector<Value>& in) {
                           return all_reduce(sum_partial(in[0], {0}), "a", To::kI);
                         },
                         P(), {3}});
  for (ReduceKind k : {ReduceKind::kMean, ReduceKind::kMax, ReduceKind::kMin}) {
    for (To to : {To::kR, To::kI}) {
      CheckCase(mesh(), Case{absl::StrCat("all_reduce_kind", static_cast<int>(k), "_to",
                                          static_cast<int>(to)),
                             {Rand({n, 3}, 32)}, {P("a")},
                             [k, to](const std::vector<Value>& in) {
                               return all_reduce(in[0], "a", to, k);
                             },
                             P(), {1, 3}});
    }
  }
  CheckCase(mesh(), Case{"all_gather_dim0_R", {Rand({2 * n, 3}, 33)}, {P("a")},
                         [](const std::vector<Value>& in) { return all_gather(in[0], 0, "a"); },
                         P(), {2 * n, 3}});
  CheckCase(mesh(), Case{"all_gather_dim1_I", {Rand({2, n}, 34)}, {P(None, "a")},
                         [](const std::vector<Value>& in) {
                           return all_gather(in[0], 1, "a", To::kI);
                         },
                         P(), {2, n}});
  CheckCase(mesh(), Case{"reduce_scatter_dim1", {Rand({n, 3, 2 * n}, 35)}, {P("a")},
                         [](const std::vector<Value>& in) {
                           return reduce_scatter(sum_partial(in[0], {0}), 1, "a");
                         },
                         P(None, "a"), {3, 2 * n}});
  CheckCase(mesh(), Case{"all_to_all", {Rand({n, 2 * n}, 36)}, {P("a")},
                         [](const std::vector<Value>& in) {
                           return all_to_all(in[0], /*split_dim=*/1, /*concat_dim=*/0, "a");
                         },
                         P(None, "a"), {n, 2 * n}});
  std::vector<std::pair<int, int>> ring;
  for (int i = 0; i < n; ++i) ring.push_back({i, (i + 1) % n});
  CheckCase(mesh(), Case{"ppermute_ring", {Rand({n, 2}, 37)}, {P("a")},
                         [ring](const std::vector<Value>& in) {
                           return ppermute(in[0], "a", ring);
                         },
                         P("a"), {n, 2}});
  CheckCase(mesh(), Case{"ppermute_partial_from_R", {Rand({2}, 38)}, {P()},
                         [](const std::vector<Value>& in) {
                           return ppermute(in[0].reshape({1, 2}), "a", {{0, 1}});
                         },
                         P("a"), {n, 2}});
  CheckCase(mesh(), Case{"broadcast_from_V", {Rand({n, 2}, 39)}, {P("a")},
                         [](const std::vector<Value>& in) { return broadcast(in[0], "a", 1); },
                         P(), {1, 2}});
  CheckCase(mesh(), Case{"convert_R_to_P", {Rand({3}, 40)}, {P()},
                         [](const std::vector<Value>& in) {
                           return convert(in[0], "a", Convert::kRToP);
                         },
                         P().Unreduced({"a"}), {3}});
  CheckCase(mesh(), Case{"reinterpret_V_to_P_then_all_reduce", {Rand({n, 3}, 41)}, {P("a")},
                         [](const std::vector<Value>& in) {
                           return all_reduce(reinterpret(in[0], "a"), "a");
                         },
                         P(), {1, 3}});
  CheckCase(mesh(), Case{"convert_I_to_R", {Rand({n, 3}, 42)}, {P("a")},
                         [](const std::vector<Value>& in) {
                           Value i = all_reduce(sum_partial(in[0], {0}), "a", To::kI);
                           return convert(i, "a", Convert::kIToR) * 2.0;
                         },
                         P(), {3}});
  CheckCase(mesh(), Case{"axis_index_scaling", {Rand({n, 2}, 43)}, {P("a")},
                         [](const std::vector<Value>& in) {
                           Value s = axis_index_value("a", DType::kF64) + 1.0;
                           return in[0] * s;
                         },
                         P("a"), {n, 2}});
  if (n > 1) {
    // Uneven: group index i holds i+1 rows.
    std::vector<int64_t> sizes;
    int64_t total = 0;
    for (int i = 0; i < n; ++i) sizes.push_back(i + 1), total += i + 1;
    // Uneven all_to_all: an R input cut into uneven row blocks (device i keeps sizes[i] rows),
    // then rows are exchanged for uneven column blocks.
    CheckCase(mesh(), Case{"uneven_all_to_all", {Rand({total, total}, 45)}, {P()},
                           [sizes](const std::vector<Value>& in) {
                             int me = axis_index("a");
                             int64_t start = 0;
                             for (int k = 0; k < me; ++k) start += sizes[k];
                             Value rows = slice(vary(in[0], "a"), 0, start, sizes[me]);
                             Value cols = all_to_all(rows * rows, 1, 0, "a", sizes, sizes);
                             return all_gather(cols, 1, "a", sizes);
                           },
                           P(), {total, total}});
    CheckCase(mesh(), Case{"uneven_all_gather_reduce_scatter", {Rand({n, total, 2}, 44)},
                           {P("a")},
                           [sizes](const std::vector<Value>& in) {
                             // Every device contributes its own [total, 2] slab (P on a); the
                             // uneven reduce_scatter sums them; gather the squares back.
                             Value p = sum_partial(in[0], {0});
                             Value s = reduce_scatter(p, 0, "a", sizes);
                             return all_gather(s * s, 0, "a", sizes);
                           },
                           P(), {total, 2}});
  }
}

// Over meshes with two and three axes (the single-axis meshes of GradCheckTest cannot run it).
TEST(GradCheckSeveralAxesTest, CollectivesOverSeveralAxes) {
  for (const MeshCase& mc : {MeshCase{{{"a", 2}, {"b", 3}}}, MeshCase{{{"a", 3}, {"b", 2}}},
                             MeshCase{{{"a", 2}, {"b", 2}, {"c", 2}}}}) {
    const Mesh mesh = *Mesh::Create(mc.axes);
    const int a_size = mc.axes[0].second, b_size = mc.axes[1].second;
    auto a = [&] { return a_size; };
    auto b = [&] { return b_size; };
    const int n = a() * b();
    CheckCase(mesh, Case{"all_gather_ab",
                         {Rand({2 * n, 2}, 50)},
                         {P({"a", "b"})},
                         [](const std::vector<Value>& in) {
                           return all_gather(in[0], 0, {"a", "b"});
                         },
                         P(),
                         {2 * n, 2}});
    CheckCase(mesh, Case{"all_gather_minor_axis_only",
                         {Rand({2 * n, 2}, 51)},
                         {P({"a", "b"})},
                         [](const std::vector<Value>& in) { return all_gather(in[0], 0, "b"); },
                         P("a"),
                         {2 * n, 2}});
    CheckCase(
        mesh,
        Case{"reduce_scatter_ab",
             {Rand({n, 3}, 52)},
             {P({"a", "b"})},
             [n](const std::vector<Value>& in) {
               Value p = sum_partial(in[0], {0});  // [3], P on a,b
               Value rep = p.reshape({1, 3}) * Value::Replicated(Tensor::Ones({n, 1}, DType::kF64));
               return reduce_scatter(rep, 0, {"a", "b"});  // S0 on a,b
             },
             P({"a", "b"}),
             {n, 3}});
    CheckCase(mesh, Case{"all_reduce_ab",
                         {Rand({n, 3}, 53)},
                         {P({"a", "b"})},
                         [](const std::vector<Value>& in) {
                           return all_reduce(sum_partial(in[0], {0}), {"a", "b"});
                         },
                         P(),
                         {3}});
    CheckCase(mesh, Case{"2d_megatron_block",
                         {Rand({2 * a(), 3}, 54), Rand({3, 2 * b()}, 55), Rand({2 * b(), 3}, 56)},
                         {P("a"), P(None, "b"), P("b")},
                         [](const std::vector<Value>& in) {
                           return all_reduce(tanh(in[0].matmul(in[1])).matmul(in[2]), "b");
                         },
                         P("a"),
                         {2 * a(), 3}});
  }
}

// ---- NN ops ---------------------------------------------------------------------------------

Tensor Ids(std::vector<int64_t> shape, std::vector<int64_t> v) {
  return Tensor::FromVector<int64_t>(absl::Span<const int64_t>(shape), v);
}

TEST_P(GradCheckTest, NnOps) {
  const int n = a();
  CheckCase(mesh(), Case{"softmax", {Rand({n, 4}, 60)}, {P("a")},
                         [](const std::vector<Value>& in) { return softmax(in[0], 1); },
                         P("a"), {n, 4}});
  CheckCase(mesh(), Case{"log_softmax", {Rand({n, 4}, 61)}, {P("a")},
                         [](const std::vector<Value>& in) { return log_softmax(in[0], -1); },
                         P("a"), {n, 4}});
  CheckCase(mesh(), Case{"layer_norm_sequence_parallel",
                         {Rand({n, 4}, 62), Rand({4}, 63), Rand({4}, 64)}, {P("a"), P(), P()},
                         [](const std::vector<Value>& in) {
                           return layer_norm(in[0], in[1], in[2], 1e-5);
                         },
                         P("a"), {n, 4}});
  CheckCase(mesh(), Case{"rms_norm", {Rand({n, 4}, 65), Rand({4}, 66)}, {P("a"), P()},
                         [](const std::vector<Value>& in) { return rms_norm(in[0], in[1]); },
                         P("a"), {n, 4}});
  std::vector<int64_t> ids;
  for (int i = 0; i < 2 * n; ++i) ids.push_back((i * 7 + 1) % (2 * n));
  CheckCase(mesh(), Case{"embedding_replicated_table", {Rand({2 * n, 3}, 67), Ids({2 * n}, ids)},
                         {P(), P("a")},
                         [](const std::vector<Value>& in) { return embedding(in[0], in[1]); },
                         P("a"), {2 * n, 3}});
  CheckCase(mesh(), Case{"embedding_vocab_parallel", {Rand({2 * n, 3}, 68), Ids({2 * n}, ids)},
                         {P("a"), P()},
                         [](const std::vector<Value>& in) {
                           return all_reduce(embedding(in[0], in[1]), "a");
                         },
                         P(), {2 * n, 3}});
  std::vector<int64_t> tg;
  for (int i = 0; i < n; ++i) tg.push_back(i % 4);
  CheckCase(mesh(), Case{"cross_entropy", {Rand({n, 4}, 69), Ids({n}, tg)}, {P("a"), P("a")},
                         [](const std::vector<Value>& in) {
                           return cross_entropy(in[0], in[1]);
                         },
                         P("a"), {n}});
  CheckCase(mesh(), Case{"max_unsharded_dim", {Rand({n, 4}, 71)}, {P("a")},
                         [](const std::vector<Value>& in) { return max(in[0], {1}); },
                         P("a"), {n}});
  CheckCase(mesh(), Case{"local_max_then_all_reduce_max", {Rand({3, 2 * n}, 72)}, {P(None, "a")},
                         [](const std::vector<Value>& in) {
                           return all_reduce(local_max(in[0], {1}), "a", To::kR,
                                             ReduceKind::kMax);
                         },
                         P(), {3}});
  std::vector<int64_t> tv;
  for (int i = 0; i < 3; ++i) tv.push_back((i * 5 + 1) % (2 * n));
  CheckCase(mesh(), Case{"take_along_last_vocab_parallel", {Rand({3, 2 * n}, 73), Ids({3}, tv)},
                         {P(None, "a"), P()},
                         [](const std::vector<Value>& in) {
                           return all_reduce(take_along_last(in[0], in[1]), "a");
                         },
                         P(), {3}});
  CheckCase(mesh(), Case{"take_along_last_rows", {Rand({n, 4}, 74), Ids({n}, tg)},
                         {P("a"), P("a")},
                         [](const std::vector<Value>& in) {
                           return take_along_last(in[0], in[1]);
                         },
                         P("a"), {n}});
  CheckCase(mesh(), Case{"causal_mask", {Rand({n, 3, 3}, 70)}, {P("a")},
                         [](const std::vector<Value>& in) { return exp(causal_mask(in[0])); },
                         P("a"), {n, 3, 3}});
}

INSTANTIATE_TEST_SUITE_P(Meshes, GradCheckTest,
                         ::testing::Values(MeshCase{{{"a", 2}}}, MeshCase{{{"a", 4}}},
                                           MeshCase{{{"a", 2}, {"b", 3}}},
                                           MeshCase{{{"a", 2}, {"b", 2}, {"c", 2}}}),
                         [](const ::testing::TestParamInfo<MeshCase>& info) {
                           std::string s;
                           for (auto& [name, size] : info.param.axes) s += absl::StrCat(name, size);
                           return s;
                         });

}  // namespace
}  // namespace shardmap
