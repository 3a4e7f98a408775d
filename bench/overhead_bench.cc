// Framework overhead on tiny tensors, where the kernel costs almost nothing and what is left is
// the typed-op machinery: type rules, the kind-only summary of erased mode, tape recording.
//
// Benchmarks are named <op>/mode:<mode>/shape:<dims>, op one of add (1 element), matmul (4x4)
// and tiny_mlp_step, mode one of
//   raw            the tensor kernel (tensor/ops) alone
//   checked        the typed op, TypeCheck::kOn, no tape
//   erased         the typed op, TypeCheck::kErased, no tape
//   taped_checked  the typed op, TypeCheck::kOn, recording on a Tape (cleared every kClearEvery
//   taped_erased   ops and the leaf re-watched, so the tape stays small; the clear, which
//                  destroys the recorded VJP closures, is part of the measured cost)
// tiny_mlp_step is x[4,8] -> matmul w1[8,16] -> gelu -> matmul w2[16,8] -> sum, forward +
// backward via per-device value_and_grad (checked and erased), and the same arithmetic with raw
// kernels (forward + hand-written backward) for reference.
//
// All on one rank (SingleRankContext over a mesh {dp:1, tp:1}: two axes whose rules are
// evaluated), no threads. Each typed benchmark also times the raw kernel for the same number of
// iterations and reports user counters (nanoseconds per op): typed_ns, raw_ns and
// overhead_ns = typed_ns - raw_ns.
//
//   bazel run -c opt --config=opt //bench:overhead_bench -- --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
//   bazel run -c opt --config=opt //bench:overhead_bench -- --benchmark_filter='^add/'
//   bazel run -c opt --config=opt //bench:overhead_bench -- --benchmark_filter='mode:taped'
//   bazel run -c opt --config=opt //bench:overhead_bench -- --benchmark_list_tests
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "autograd/tape.h"
#include "autograd/value_and_grad.h"
#include "benchmark/benchmark.h"
#include "shardmap/context.h"
#include "shardmap/mesh.h"
#include "shardmap/ops.h"
#include "shardmap/tape_hook.h"
#include "shardmap/value.h"
#include "tensor/ops/elementwise.h"
#include "tensor/ops/matmul.h"
#include "tensor/ops/reduce.h"
#include "tensor/random.h"
#include "tensor/tensor.h"

namespace shardmap {
namespace {

constexpr int kClearEvery = 1024;

Mesh OneRankMesh() { return *Mesh::Create({{"dp", 1}, {"tp", 1}}); }

double NowNs() {
  return std::chrono::duration<double, std::nano>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Runs `typed` in the benchmark loop (timed by hand as well), then `raw` for the same number of
// iterations, and reports per-op times and their difference as counters.
void RunAgainstRaw(benchmark::State& state, const std::function<void()>& raw,
                   const std::function<void()>& typed) {
  const double t0 = NowNs();
  for (auto _ : state) typed();
  const double typed_ns = (NowNs() - t0) / static_cast<double>(state.iterations());
  const int64_t n = state.iterations();
  const double r0 = NowNs();
  for (int64_t i = 0; i < n; ++i) raw();
  const double raw_ns = (NowNs() - r0) / static_cast<double>(n);
  state.counters["typed_ns"] = typed_ns;
  state.counters["raw_ns"] = raw_ns;
  state.counters["overhead_ns"] = typed_ns - raw_ns;
}

// ---- 1-element add and 4x4 matmul ----------------------------------------------------------

struct AddOperands {
  Tensor a = Tensor::Full({1}, 1.0);
  Tensor b = Tensor::Full({1}, 2.0);
  static Tensor RawOp(const Tensor& a, const Tensor& b) { return Add(a, b); }
  static Value TypedOp(const Value& a, const Value& b) { return a + b; }
};

struct MatmulOperands {
  Tensor a = RandomNormal({4, 4}, 1);
  Tensor b = RandomNormal({4, 4}, 2);
  static Tensor RawOp(const Tensor& a, const Tensor& b) { return Matmul(a, b); }
  static Value TypedOp(const Value& a, const Value& b) { return a.matmul(b); }
};

template <typename Operands>
void RawBinary(benchmark::State& state) {
  Operands o;
  for (auto _ : state) benchmark::DoNotOptimize(Operands::RawOp(o.a, o.b).raw_data());
}

// The typed op without a tape (check = kOn: type rules; kErased: kind-only summary).
template <typename Operands>
void TypedBinary(benchmark::State& state, TypeCheck check) {
  Operands o;
  SingleRankContext one(OneRankMesh(), check);
  const Value a = Value::Replicated(o.a), b = Value::Replicated(o.b);
  RunAgainstRaw(
      state, [&] { benchmark::DoNotOptimize(Operands::RawOp(o.a, o.b).raw_data()); },
      [&] { benchmark::DoNotOptimize(Operands::TypedOp(a, b).tensor.raw_data()); });
}

// The typed op recording on a tape, with b a watched leaf.
template <typename Operands>
void TapedBinary(benchmark::State& state, TypeCheck check) {
  Operands o;
  SingleRankContext one(OneRankMesh(), check);
  Tape tape;
  const Value a = Value::Replicated(o.a), b0 = Value::Replicated(o.b);
  Value b = tape.Watch(b0);
  ScopedRecorder rec(&tape);
  int n = 0;
  RunAgainstRaw(
      state, [&] { benchmark::DoNotOptimize(Operands::RawOp(o.a, o.b).raw_data()); },
      [&] {
        benchmark::DoNotOptimize(Operands::TypedOp(a, b).tensor.raw_data());
        if (++n == kClearEvery) {
          n = 0;
          tape.Clear();
          b = tape.Watch(b0);
        }
      });
}

// Names: <op>/mode:<raw|checked|erased|taped_checked|taped_erased>/shape:<dims>.
template <typename Operands>
void RegisterBinary(const std::string& op, const std::string& shape) {
  const std::string prefix = op + "/mode:";
  const std::string suffix = "/shape:" + shape;
  benchmark::RegisterBenchmark((prefix + "raw" + suffix).c_str(), RawBinary<Operands>);
  benchmark::RegisterBenchmark((prefix + "checked" + suffix).c_str(), TypedBinary<Operands>,
                               TypeCheck::kOn);
  benchmark::RegisterBenchmark((prefix + "erased" + suffix).c_str(), TypedBinary<Operands>,
                               TypeCheck::kErased);
  benchmark::RegisterBenchmark((prefix + "taped_checked" + suffix).c_str(),
                               TapedBinary<Operands>, TypeCheck::kOn);
  benchmark::RegisterBenchmark((prefix + "taped_erased" + suffix).c_str(),
                               TapedBinary<Operands>, TypeCheck::kErased);
}

// ---- tiny 2-layer MLP, forward + backward ---------------------------------------------------

struct Mlp {
  Tensor x = RandomNormal({4, 8}, 3);
  Tensor w1 = RandomNormal({8, 16}, 4);
  Tensor w2 = RandomNormal({16, 8}, 5);

  // Forward and hand-written backward with raw kernels (gradients of x, w1, w2).
  void Raw() const {
    Tensor h = Matmul(x, w1);
    Tensor a = Gelu(h);
    Tensor y = Matmul(a, w2);
    Tensor loss = Sum(y, {});
    Tensor dy = Tensor::Full(y.shape(), 1.0);
    Tensor dw2 = Matmul(a, dy, /*trans_a=*/true, false);
    Tensor da = Matmul(dy, w2, false, /*trans_b=*/true);
    Tensor dh = GeluGrad(h, da);
    Tensor dw1 = Matmul(x, dh, true, false);
    Tensor dx = Matmul(dh, w1, false, true);
    benchmark::DoNotOptimize(loss.raw_data());
    benchmark::DoNotOptimize(dw1.raw_data());
    benchmark::DoNotOptimize(dw2.raw_data());
    benchmark::DoNotOptimize(dx.raw_data());
  }
};

void TinyMlpRaw(benchmark::State& state) {
  Mlp m;
  for (auto _ : state) m.Raw();
}

void TinyMlp(benchmark::State& state, TypeCheck check) {
  Mlp m;
  SingleRankContext one(OneRankMesh(), check);
  const std::vector<Value> params = {Value::Replicated(m.x), Value::Replicated(m.w1),
                                     Value::Replicated(m.w2)};
  auto fn = [](const std::vector<Value>& p) {
    return sum(gelu(p[0].matmul(p[1])).matmul(p[2]), {});
  };
  RunAgainstRaw(state, [&] { m.Raw(); },
                [&] {
                  ValueAndGrad r = value_and_grad(fn, params);
                  benchmark::DoNotOptimize(r.grads[1].tensor.raw_data());
                });
}

const bool kRegistered = [] {
  RegisterBinary<AddOperands>("add", "1");
  RegisterBinary<MatmulOperands>("matmul", "4x4");
  benchmark::RegisterBenchmark("tiny_mlp_step/mode:raw", TinyMlpRaw);
  benchmark::RegisterBenchmark("tiny_mlp_step/mode:checked", TinyMlp, TypeCheck::kOn);
  benchmark::RegisterBenchmark("tiny_mlp_step/mode:erased", TinyMlp, TypeCheck::kErased);
  return true;
}();

}  // namespace
}  // namespace shardmap
