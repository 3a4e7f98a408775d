#include "bench/tp_layers.h"

#include <time.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "autograd/value_and_grad.h"
#include "collectives/in_process.h"
#include "models/gpt_layers.h"
#include "shardmap/context.h"
#include "shardmap/ops.h"
#include "shardmap/partition_spec.h"
#include "shardmap/sharding.h"
#include "tensor/error.h"
#include "tensor/random.h"

namespace shardmap::bench {
namespace {

double ThreadCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct Inputs {
  std::vector<Tensor> whole;
  std::vector<PartitionSpec> specs;
};

Tensor Init(std::vector<int64_t> shape, uint64_t seed, double mean = 0.0) {
  return RandomNormal(shape, seed, mean, 0.02, DType::kF32);
}

// The layer's inputs (activations first) and how each is split over tp.
Inputs MakeInputs(const LayerCase& c) {
  const int64_t t = c.tokens, d = c.d, f = c.ffn();
  const PartitionSpec rows = c.sp ? P("tp") : P();
  switch (c.layer) {
    case Layer::kColumn:
      return {{Init({t, d}, 1), Init({d, f}, 2), Init({f}, 3)}, {rows, P(None, "tp"), P("tp")}};
    case Layer::kRow:
      return {{Init({t, f}, 1), Init({f, d}, 2), Init({d}, 3)}, {P(None, "tp"), P("tp", None), P()}};
    case Layer::kMlp:
      return {{Init({t, d}, 1), Init({d, f}, 2), Init({f}, 3), Init({f, d}, 4), Init({d}, 5)},
              {rows, P(None, "tp"), P("tp"), P("tp", None), P()}};
    case Layer::kAttention:
      return {{Init({t, d}, 1), Init({d, 3, d}, 2), Init({3, d}, 3), Init({d, d}, 4), Init({d}, 5)},
              {rows, P(None, None, "tp"), P(None, "tp"), P("tp", None), P()}};
    case Layer::kBlock:
      return {{Init({t, d}, 1), Init({d}, 2, 1.0), Init({d}, 3), Init({d, 3, d}, 4),
               Init({3, d}, 5), Init({d, d}, 6), Init({d}, 7), Init({d}, 8, 1.0), Init({d}, 9),
               Init({d, f}, 10), Init({f}, 11), Init({f, d}, 12), Init({d}, 13)},
              {rows, P(), P(), P(None, None, "tp"), P(None, "tp"), P("tp", None), P(), P(), P(),
               P(None, "tp"), P("tp"), P("tp", None), P()}};
  }
  OpFail("tp_layers: unknown layer");
}

// The layer's output for inputs p (per-device code; tp.axis empty = unsharded).
Value Forward(const LayerCase& c, const std::vector<Value>& p, const TensorParallel& tp) {
  switch (c.layer) {
    case Layer::kColumn:
      return ColumnParallelLinear{p[1], p[2], tp}(p[0]);
    case Layer::kRow:
      return RowParallelLinear{p[1], p[2], tp}(p[0]);
    case Layer::kMlp:
      return Mlp{ColumnParallelLinear{p[1], p[2], tp}, RowParallelLinear{p[3], p[4], tp}}(p[0]);
    case Layer::kAttention:
      return CausalSelfAttention{p[1], p[2], RowParallelLinear{p[3], p[4], tp}, c.head_dim,
                                 c.seq(), tp}(p[0]);
    case Layer::kBlock:
      return Block{LayerNorm{p[1], p[2]},
                   CausalSelfAttention{p[3], p[4], RowParallelLinear{p[5], p[6], tp}, c.head_dim,
                                       c.seq(), tp},
                   LayerNorm{p[7], p[8]},
                   Mlp{ColumnParallelLinear{p[9], p[10], tp},
                       RowParallelLinear{p[11], p[12], tp}}}(p[0]);
  }
  OpFail("tp_layers: unknown layer");
}

// One step: the forward, or value_and_grad of sum(y^2) (a share, P, where y is split over tp).
void Step(const LayerCase& c, const std::vector<Value>& p, const TensorParallel& tp) {
  if (!c.fwd_bwd) {
    (void)Forward(c, p, tp);
    return;
  }
  const bool split_out = tp.on() && (c.layer == Layer::kColumn || tp.sp);
  auto loss = [&](const std::vector<Value>& q) {
    Value y = Forward(c, q, tp);
    return split_out ? sum_partial(y * y, {}) : sum(y * y, {});
  };
  (void)value_and_grad(loss, p);
}

absl::Status CheckCase(const LayerCase& c) {
  if (c.tp < 1 || c.tokens < 1 || c.d < 1 || c.head_dim < 1) {
    return absl::InvalidArgumentError(absl::StrCat("tp_layers: ", c.Name(),
                                                   ": tp, tokens, d and head_dim must be >= 1"));
  }
  if (c.d % c.head_dim != 0 || c.tokens % c.seq() != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tp_layers: ", c.Name(), ": d must be a multiple of head_dim (", c.head_dim,
        ") and tokens a multiple of the sequence length (", c.seq(), ")"));
  }
  return absl::OkStatus();
}

}  // namespace

const char* LayerName(Layer l) {
  switch (l) {
    case Layer::kColumn: return "column_parallel_linear";
    case Layer::kRow: return "row_parallel_linear";
    case Layer::kMlp: return "mlp";
    case Layer::kAttention: return "attention";
    case Layer::kBlock: return "block";
  }
  return "?";
}

std::string LayerCase::Name() const {
  return absl::StrCat(LayerName(layer), "/tp:", tp, "/tokens:", tokens, "/d:", d,
                      sp ? "/sp" : "", fwd_bwd ? "/fwd_bwd" : "/fwd");
}

double LayerFlops(const LayerCase& c) {
  const double t = c.tokens, d = c.d, f = c.ffn(), s = c.seq();
  const double col = 2 * t * d * f, row = 2 * t * f * d;
  const double attn = 2 * t * d * 3 * d + 2 * t * s * d * 2 + 2 * t * d * d;
  double fwd = 0;
  switch (c.layer) {
    case Layer::kColumn: fwd = col; break;
    case Layer::kRow: fwd = row; break;
    case Layer::kMlp: fwd = col + row; break;
    case Layer::kAttention: fwd = attn; break;
    case Layer::kBlock: fwd = attn + col + row; break;
  }
  return c.fwd_bwd ? 3 * fwd : fwd;
}

double LayerTiming::Mean() const {
  double s = 0;
  for (double x : seconds) s += x;
  return seconds.empty() ? 0 : s / seconds.size();
}

double LayerTiming::Min() const {
  return seconds.empty() ? 0 : *std::min_element(seconds.begin(), seconds.end());
}

absl::StatusOr<LayerTiming> RunLayer(const LayerCase& c, int warmup, int measured) {
  if (absl::Status s = CheckCase(c); !s.ok()) return s;
  if (measured < 1) return absl::InvalidArgumentError("tp_layers: measured steps must be >= 1");
  absl::StatusOr<Mesh> mesh = Mesh::Create({{"tp", c.tp}});
  if (!mesh.ok()) return mesh.status();
  const Inputs in = MakeInputs(c);
  std::vector<CommStats> stats(c.tp);
  std::vector<double> cpu(c.tp, 0), comm_cpu(c.tp, 0);
  LayerTiming out;
  double comm_wall = 0;
  absl::Status s = collectives::RunInProcess(c.tp, [&](collectives::Communicator& comm) {
    const int r = comm.rank();
    TimedCommunicator timed(&comm, &stats[r]);
    return RunOnCommunicator(timed, *mesh, [&](RankContext& ctx) {
      std::vector<Value> params;
      for (size_t k = 0; k < in.whole.size(); ++k) {
        Value v(ShardOf(in.whole[k], *mesh, in.specs[k], r), in.specs[k].InputType(*mesh));
        v.type.set_mesh_id(mesh->id());
        params.push_back(v);
      }
      const TensorParallel par{"tp", c.sp};
      for (int step = 0; step < warmup + measured; ++step) {
        if (!comm.Barrier().ok()) OpFail("tp_layers: barrier failed");
        stats[r].Clear();
        const double t0 = Now(), cpu0 = ThreadCpuSeconds();
        Step(c, params, par);
        const double cpu1 = ThreadCpuSeconds();
        if (!comm.Barrier().ok()) OpFail("tp_layers: barrier failed");
        const double t1 = Now();
        if (step < warmup) continue;
        cpu[r] += cpu1 - cpu0;
        comm_cpu[r] += stats[r].Total().cpu_seconds;
        if (r == 0) {
          out.seconds.push_back(t1 - t0);
          comm_wall += stats[0].Total().seconds;
        }
      }
      (void)ctx;
    });
  });
  if (!s.ok()) return s;
  for (int r = 0; r < c.tp; ++r) {
    out.cpu_seconds += cpu[r] / (c.tp * measured);
    out.comm_cpu_seconds += comm_cpu[r] / (c.tp * measured);
  }
  out.comm_seconds = comm_wall / measured;
  out.comm = stats[0];
  return out;
}

absl::StatusOr<LayerTiming> RunUnsharded(const LayerCase& c, int warmup, int measured) {
  if (absl::Status s = CheckCase(c); !s.ok()) return s;
  if (measured < 1) return absl::InvalidArgumentError("tp_layers: measured steps must be >= 1");
  LayerCase one = c;
  one.sp = false;
  const Inputs in = MakeInputs(one);
  LayerTiming out;
  try {
    SingleRankContext ctx{Mesh()};
    std::vector<Value> params;
    for (const Tensor& t : in.whole) params.push_back(Value::Replicated(t));
    for (int step = 0; step < warmup + measured; ++step) {
      const double t0 = Now(), cpu0 = ThreadCpuSeconds();
      Step(one, params, TensorParallel{});
      const double cpu1 = ThreadCpuSeconds(), t1 = Now();
      if (step < warmup) continue;
      out.seconds.push_back(t1 - t0);
      out.cpu_seconds += (cpu1 - cpu0) / measured;
    }
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("tp_layers: unsharded ", c.Name(), ": ", e.what()));
  }
  return out;
}

}  // namespace shardmap::bench
