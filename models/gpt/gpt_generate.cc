#include "models/gpt/gpt_generate.h"

#include "models/model/kv_cache.h"
#include "models/model/recompute_block.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <mutex>
#include <numeric>
#include <string>

#include "absl/strings/str_cat.h"
#include "models/parallel/ring_attention.h"
#include "shardmap/collective_ops.h"
#include "shardmap/einsum.h"
#include "shardmap/ops.h"
#include "shardmap/sharding.h"
#include "shardmap/spmd_runner.h"

namespace shardmap {
namespace {

absl::Status Invalid(const std::string& msg) { return absl::InvalidArgumentError(msg); }

int AxisSize(const Mesh& mesh, const std::string& name) {
  const int i = mesh.AxisIndex(name);
  return i < 0 ? 1 : mesh.axis_size(i);
}

absl::Status CheckIds(const ModelShape& c, const std::vector<int64_t>& ids, const char* what) {
  if (ids.empty()) {
    return Invalid(absl::StrCat("the ", what, " is empty; give at least one token id (e.g. the "
                                "bytes of a text for a byte-level model)"));
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= c.vocab) {
      return Invalid(absl::StrCat(what, " token ", i, " is id ", ids[i],
                                  ", outside the model's vocabulary [0, ", c.vocab, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckLayout(const Model& layout) {
  if (layout.shape().moe.on()) {
    return absl::UnimplementedError(
        "sampling from a mixture-of-experts model is not supported yet (expert capacity would "
        "let the padding of the context window compete with real tokens)");
  }
  if (layout.pp_ways() > 1) {
    return absl::UnimplementedError(absl::StrCat(
        "sampling on mesh ", layout.mesh().ShortString(),
        " with pipeline stages (pp > 1) is not supported; the parameters are global tensors, so "
        "sample on the same mesh without pp"));
  }
  return absl::OkStatus();
}

uint64_t SplitMix64(uint64_t* state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Runs `steps` forward passes; next(logits) returns the id to append (or -1 to stop early).
// Every rank computes the same logits; `on_logits` runs on every rank (keep it deterministic),
// and results are taken from rank 0 (or the process's rank with comm).
absl::Status RunGeneration(const Model& layout, const std::vector<NamedTensor>& params,
                           std::vector<int64_t> context, int64_t steps,
                           collectives::Communicator* comm, const DevicePlacement& placement,
                           const std::function<int64_t(const std::vector<double>&, int rank)>&
                               on_logits) {
  if (absl::Status s = CheckLayout(layout); !s.ok()) return s;
  absl::StatusOr<std::vector<Tensor>> globals = MatchInitialParams(layout, params);
  if (!globals.ok()) return globals.status();
  if (steps == 0) return absl::OkStatus();
  const ModelShape& c = layout.shape();
  const Mesh& mesh = layout.mesh();
  const int ways = layout.batch_ways();
  const int cp = layout.cp_ways();
  // Rows: `ways * copies` identical windows; under SP each rank's copies * seq/cp tokens must
  // split over tp.
  int64_t copies = 1;
  if (layout.tp().sp) {
    const int64_t tp = AxisSize(mesh, layout.tp().axis);
    copies = tp / std::gcd(tp, c.seq / cp);
  }
  const int64_t batch = ways * copies;
  // Where (sequence 0, position p) lands among the rows: the row order of training (cp load
  // balancing), found by permuting the row indices themselves.
  std::vector<int64_t> row_of_position(c.seq);
  {
    std::vector<int64_t> index(batch * c.seq);
    std::iota(index.begin(), index.end(), 0);
    Tensor t = Tensor::FromVector<int64_t>({batch, c.seq}, index);
    std::vector<int64_t> order =
        (cp > 1 ? LoadBalancedRows(t, ways, cp) : t.Reshape({batch * c.seq}))
            .ToVector<int64_t>();
    for (size_t r = 0; r < order.size(); ++r) {
      if (order[r] < c.seq) row_of_position[order[r]] = static_cast<int64_t>(r);
    }
  }
  const PartitionSpec rows_spec = layout.RowSpec(false);
  std::vector<std::string> row_axes = layout.batch_axes();
  if (!layout.cp_axis().empty()) row_axes.push_back(layout.cp_axis());
  auto body = [&](RankContext& ctx) {
    const int rank = ctx.rank();
    std::vector<Value> local;
    for (size_t i = 0; i < layout.params().size(); ++i) {
      const ParamInfo& p = layout.params()[i];
      local.emplace_back(ParamShard((*globals)[i], p, mesh, rank).To(ctx.device()),
                         p.spec.InputType(mesh));
    }
    const ParamFn gathered = ParamUse(layout, local);
    std::vector<int64_t> ctx_ids = context;  // every rank grows its own copy identically
    for (int64_t step = 0; step < steps; ++step) {
      const int64_t n = std::min<int64_t>(static_cast<int64_t>(ctx_ids.size()), c.seq);
      std::vector<int64_t> window(batch * c.seq, 0);
      for (int64_t b = 0; b < batch; ++b) {
        std::copy(ctx_ids.end() - n, ctx_ids.end(), window.begin() + b * c.seq);
      }
      Tensor t = Tensor::FromVector<int64_t>({batch, c.seq}, window);
      Tensor rows = cp > 1 ? LoadBalancedRows(t, ways, cp) : t.Reshape({batch * c.seq});
      Value ids(ShardOf(rows, mesh, rows_spec, rank).To(ctx.device()), rows_spec.InputType(mesh));
      const ParamFn use = GatherTiedOnce(layout, gathered);  // a tied wte: gathered once
      Value x = layout.Embed(use, ids);
      for (int64_t i = 0; i < c.layers; ++i) x = ModelBlock(layout, use, i, x);
      Value logits = GptLogits(layout, use, x);
      if (!row_axes.empty()) logits = all_gather(logits, 0, Axes(row_axes));
      const Tensor row = logits.tensor.SliceRows(row_of_position[n - 1], 1).To(Device::Cpu());
      const int64_t next = on_logits(row.ToVector<double>(), rank);
      if (next < 0) break;
      ctx_ids.push_back(next);
    }
  };
  SpmdOptions spmd;
  spmd.placement = placement;
  return comm != nullptr ? RunOnCommunicator(*comm, mesh, body) : RunSpmd(mesh, body, spmd);
}

// The KV-cache generation (see the header): one prefill of the prompt, then one token per step.
absl::Status RunCachedGeneration(const Model& layout, const std::vector<NamedTensor>& params,
                                 std::vector<int64_t> prompt, int64_t steps,
                                 collectives::Communicator* comm,
                                 const DevicePlacement& placement,
                                 const std::function<int64_t(const std::vector<double>&, int rank)>&
                                     on_logits) {
  if (absl::Status s = CheckLayout(layout); !s.ok()) return s;
  absl::StatusOr<std::vector<Tensor>> globals = MatchInitialParams(layout, params);
  if (!globals.ok()) return globals.status();
  if (steps == 0) return absl::OkStatus();
  const Mesh& mesh = layout.mesh();
  const TensorParallel tp = layout.tp();
  // The last new token is never fed back: prompt + steps - 1 positions.
  const int64_t capacity = static_cast<int64_t>(prompt.size()) + steps - 1;
  auto body = [&](RankContext& ctx) {
    const int rank = ctx.rank();
    std::vector<Value> local;
    for (size_t i = 0; i < layout.params().size(); ++i) {
      const ParamInfo& p = layout.params()[i];
      local.emplace_back(ParamShard((*globals)[i], p, mesh, rank).To(ctx.device()),
                         p.spec.InputType(mesh));
    }
    const ParamFn gathered = ParamUse(layout, local);
    KvCache cache(layout.shape().layers, capacity);
    std::vector<int64_t> feed = prompt;  // the prefill, then one token at a time
    for (int64_t step = 0; step < steps; ++step) {
      const Value ids = Value::Replicated(
          Tensor::FromVector<int64_t>({static_cast<int64_t>(feed.size())}, feed)
              .To(ctx.device()));
      Value logits = DecodeStep(layout, GatherTiedOnce(layout, gathered), ids, cache);
      if (tp.on()) logits = all_gather(logits, 1, tp.axis);
      const int64_t next = on_logits(logits.tensor.To(Device::Cpu()).ToVector<double>(), rank);
      if (next < 0) break;
      feed.assign(1, next);
    }
  };
  SpmdOptions spmd;
  spmd.placement = placement;
  return comm != nullptr ? RunOnCommunicator(*comm, mesh, body) : RunSpmd(mesh, body, spmd);
}

}  // namespace

absl::Status KvCacheUse(const Model& model, int64_t prompt_tokens, const SampleOptions& o) {
  if (o.kv_cache == KvCacheMode::kOff) {
    return absl::FailedPreconditionError("the KV cache is off (kv_cache off)");
  }
  if (absl::Status s = model.KvCacheSupport(); !s.ok()) return s;
  const int64_t seq = model.shape().seq;
  if (prompt_tokens + o.tokens - 1 > seq) {
    return Invalid(absl::StrCat(
        "the KV cache holds at most the model's seq = ", seq, " positions, but a prompt of ",
        prompt_tokens, " tokens and ", o.tokens, " new ones feed ", prompt_tokens + o.tokens - 1,
        "; generate at most ", std::max<int64_t>(seq + 1 - prompt_tokens, 0),
        " tokens, shorten the prompt, or turn the cache off (--kv_cache=off) to recompute a "
        "sliding window of the last ", seq, " tokens for each new token"));
  }
  return absl::OkStatus();
}

Value GptLogits(const Model& layout, const ParamFn& use, const Value& x) {
  const TensorParallel tp = layout.tp();
  Value logits = layout.Logits(use, x);  // vocab-parallel: S1 on tp
  return tp.on() ? all_gather(logits, 1, tp.axis) : logits;
}

int64_t SampleToken(const std::vector<double>& logits, double temperature, int64_t top_k,
                    uint64_t* rng_state) {
  const int64_t v = static_cast<int64_t>(logits.size());
  if (temperature == 0 || top_k == 1) {
    return std::max_element(logits.begin(), logits.end()) - logits.begin();
  }
  double threshold = -std::numeric_limits<double>::infinity();
  if (top_k > 0 && top_k < v) {
    std::vector<double> sorted = logits;
    std::nth_element(sorted.begin(), sorted.begin() + (top_k - 1), sorted.end(),
                     std::greater<double>());
    threshold = sorted[top_k - 1];
  }
  const double max = *std::max_element(logits.begin(), logits.end());
  std::vector<double> cumulative(v);
  double total = 0;
  for (int64_t i = 0; i < v; ++i) {
    if (logits[i] >= threshold) total += std::exp((logits[i] - max) / temperature);
    cumulative[i] = total;
  }
  const double u =
      static_cast<double>(SplitMix64(rng_state) >> 11) * (1.0 / 9007199254740992.0) * total;
  for (int64_t i = 0; i < v; ++i) {
    if (logits[i] >= threshold && u < cumulative[i]) return i;
  }
  // u == total can only come from rounding: the last kept id.
  for (int64_t i = v - 1; i >= 0; --i) {
    if (logits[i] >= threshold) return i;
  }
  return 0;
}

absl::StatusOr<std::vector<int64_t>> GenerateGpt(const Model& layout,
                                                 const std::vector<NamedTensor>& params,
                                                 const std::vector<int64_t>& prompt,
                                                 const SampleOptions& o) {
  const ModelShape& c = layout.shape();
  if (absl::Status s = CheckIds(c, prompt, "prompt"); !s.ok()) return s;
  if (o.tokens < 0) {
    return Invalid(absl::StrCat("tokens ", o.tokens, " to generate is negative; use >= 0"));
  }
  if (!std::isfinite(o.temperature) || o.temperature < 0) {
    return Invalid(absl::StrCat("temperature ", o.temperature,
                                " must be finite and >= 0 (0: greedy; 0.8 is a common choice)"));
  }
  if (o.top_k < 0 || o.top_k > c.vocab) {
    return Invalid(absl::StrCat("top_k ", o.top_k, " must be in [0, vocab = ", c.vocab,
                                "] (0: every id)"));
  }
  if (o.comm != nullptr && o.comm->size() != layout.mesh().size()) {
    return Invalid(absl::StrCat("the communicator has ", o.comm->size(), " ranks but mesh ",
                                layout.mesh().ShortString(), " has ", layout.mesh().size()));
  }
  const absl::Status cache = KvCacheUse(layout, static_cast<int64_t>(prompt.size()), o);
  if (o.kv_cache == KvCacheMode::kOn && !cache.ok()) return cache;
  const int reporter = o.comm != nullptr ? o.comm->rank() : 0;
  std::vector<int64_t> out;
  // Each rank draws from its own copy of the stream (all draw alike: same logits, same seed).
  std::mutex mu;
  std::vector<uint64_t> rank_rng(layout.mesh().size(), o.seed);
  auto run = cache.ok() ? RunCachedGeneration : RunGeneration;
  absl::Status s = run(
      layout, params, prompt, o.tokens, o.comm, o.placement,
      [&](const std::vector<double>& logits, int rank) -> int64_t {
        uint64_t state;
        {
          std::lock_guard<std::mutex> lock(mu);
          state = rank_rng[rank];
        }
        const int64_t id = SampleToken(logits, o.temperature, o.top_k, &state);
        std::lock_guard<std::mutex> lock(mu);
        rank_rng[rank] = state;
        if (rank == reporter) {
          out.push_back(id);
          if (o.step_logits != nullptr) o.step_logits->push_back(logits);
        }
        return id;
      });
  if (!s.ok()) return s;
  return out;
}

absl::StatusOr<std::vector<double>> GptNextTokenLogits(const Model& layout,
                                                       const std::vector<NamedTensor>& params,
                                                       const std::vector<int64_t>& context,
                                                       collectives::Communicator* comm) {
  if (absl::Status s = CheckIds(layout.shape(), context, "context"); !s.ok()) return s;
  const int reporter = comm != nullptr ? comm->rank() : 0;
  std::vector<double> out;
  std::mutex mu;
  absl::Status s = RunGeneration(layout, params, context, 1, comm, DevicePlacement(),
                                 [&](const std::vector<double>& logits, int rank) -> int64_t {
                                   if (rank == reporter) {
                                     std::lock_guard<std::mutex> lock(mu);
                                     out = logits;
                                   }
                                   return -1;
                                 });
  if (!s.ok()) return s;
  return out;
}

}  // namespace shardmap
