#include "models/planner/recompute.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace shardmap::planner {

const char* RecomputeName(Recompute r) {
  switch (r) {
    case Recompute::kSelective:
      return "selective";
    case Recompute::kFull:
      return "full";
    default:
      return "none";
  }
}

absl::StatusOr<Recompute> ParseRecompute(const std::string& name) {
  if (name == "none") return Recompute::kNone;
  if (name == "selective") return Recompute::kSelective;
  if (name == "full") return Recompute::kFull;
  return absl::InvalidArgumentError(
      absl::StrCat("recompute '", name, "': use none, selective or full"));
}

std::vector<BlockMatmul> BlockMatmuls(const Model& model, int tp) {
  const MoeConfig& moe = model.shape().moe;
  std::vector<BlockMatmul> out;
  for (const ParamInfo& p : model.params()) {
    if (p.unit.kind != ModelUnit::kBlock || p.unit.block != 0 || !p.decay) continue;
    // The matrix as checkpoints hold it (GPT-2's fused c_attn [d, 3, d] is [d, 3d]); a stack of
    // experts' matrices [E, k, n] is priced as one expert per token, its biases [E, n] skipped.
    const Shape cs = model.CheckpointShape(p);
    const int rank = static_cast<int>(cs.size());
    if (rank == 2 && moe.on() && cs[0] == moe.experts) continue;
    if (rank != 2 && rank != 3) continue;
    int64_t dims[2] = {cs[rank - 2], cs[rank - 1]};
    // Each dim split over tp shrinks the checkpoint dim its elements fall in: the last one
    // whose stride (the product of the dims before it) is at most the split dim's.
    int64_t before = 1;
    for (int j = 0; j < static_cast<int>(p.global_shape.size()); ++j) {
      const bool split = j < p.spec.size() && std::find(p.spec.dim_axes(j).begin(),
                                                        p.spec.dim_axes(j).end(),
                                                        axis::kTp) != p.spec.dim_axes(j).end();
      if (split) {
        int c = 0;
        int64_t stride = 1;
        for (int k = 0; k < rank; ++k) {
          if (stride <= before) c = k;
          stride *= cs[k];
        }
        if (c >= rank - 2) dims[c - (rank - 2)] /= std::max(1, tp);
      }
      before *= p.global_shape[j];
    }
    out.push_back({.n = dims[1], .k = dims[0]});
  }
  return out;
}

double BlockActivationBytes(const RecomputeShape& sh, Recompute mode) {
  const ModelShape& c = sh.config;
  const double s = static_cast<double>(c.seq), b = static_cast<double>(sh.microbatch_rows);
  const double h = static_cast<double>(c.d_model), a = static_cast<double>(c.heads);
  const double t = std::max(1, sh.tp);
  // Korthikanti et al. count 2-byte activations.
  const double scale = DTypeSize(c.compute_dtype()) / 2.0;
  const double sbh = s * b * h;
  if (mode == Recompute::kFull) return scale * 2 * sbh / (sh.sp ? t : 1.0);
  const bool scores = mode == Recompute::kNone && !sh.fused_attention;
  const double attention = scores ? 5 * a * s / h : 0.0;
  const double per = sh.sp ? (34 + attention) / t : 10 + 24 / t + attention / t;
  return scale * sbh * per;
}

namespace {

// The forward GEMMs of one block on one rank (count: every layer, every pass).
void BlockForwardGemms(const RecomputeShape& sh, int layers, bool attention_only,
                       RoleWork* w) {
  const ModelShape& c = sh.config;
  const int64_t t = std::max(1, sh.tp), rows = sh.microbatch_rows * c.seq;
  const int64_t heads = std::max<int64_t>(1, c.heads / t), hd = c.head_dim();
  const int64_t count = static_cast<int64_t>(layers) * sh.passes;
  const DType dt = c.compute_dtype();
  auto add = [&](int64_t batch, int64_t m, int64_t n, int64_t k) {
    w->recompute_gemms.push_back(
        {.batch = batch, .m = m, .n = n, .k = k, .dtype = dt, .count = count, .backward = true});
  };
  if (!attention_only) {
    for (const BlockMatmul& m : sh.block_matmuls) add(1, rows, m.n, m.k);
  }
  const int64_t bh = sh.microbatch_rows * heads;
  if (sh.fused_attention) {
    if (!attention_only) {
      // One fused kernel: the two products, 2 s * s * hd flops each per head.
      w->recompute_others.push_back({"recompute_attention", dt,
                                     4.0 * bh * c.seq * c.seq * hd * count, 0.0, true});
    }
    return;
  }
  add(bh, c.seq, c.seq, hd);  // q k^T
  add(bh, c.seq, hd, c.seq);  // softmax(.) v
  // The softmax reads and writes the scores.
  w->recompute_others.push_back(
      {"recompute_softmax", dt, 0.0,
       2.0 * bh * c.seq * c.seq * DTypeSize(dt) * static_cast<double>(count), false});
}

absl::StatusOr<RoleWork> Estimate(const RoleWork& base, Recompute mode,
                                  const RecomputeShape& sh) {
  if (mode == Recompute::kNone) return base;
  if (base.layers < 1 || sh.microbatch_rows < 1 || sh.passes < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "recompute estimate for role '", base.role, "': ", base.layers, " layers, ",
        sh.microbatch_rows, " rows per microbatch, ", sh.passes, " passes (each must be >= 1)"));
  }
  if (mode == Recompute::kSelective && sh.fused_attention) return base;  // nothing stored
  RoleWork w = base;
  // Memory: the profile's activations, as the framework stores them, shrink by the share of a
  // block's bytes the mode keeps (Korthikanti's accounting); full recomputation rebuilds one
  // block at a time, so one block's working set (the profile's bytes per block and
  // microbatch in flight) is live again.
  const double none = BlockActivationBytes(sh, Recompute::kNone);
  const double kept = BlockActivationBytes(sh, mode);
  const double blocks = static_cast<double>(std::max(1, base.in_flight)) * base.layers;
  const double per_block = base.activation_peak_bytes / blocks;
  const double act = base.activation_peak_bytes * (kept / none) +
                     (mode == Recompute::kFull ? per_block : 0.0);
  w.peak_bytes = base.peak_bytes - base.activation_peak_bytes + act;
  w.activation_peak_bytes = act;
  // Work: the forward again, in the backward.
  BlockForwardGemms(sh, base.layers, mode == Recompute::kSelective, &w);
  if (mode == Recompute::kFull) {
    for (const OtherWork& o : base.others) {
      OtherWork again = o;
      again.op = "recompute " + o.op;
      again.flops *= base.forward_fraction;
      again.bytes *= base.forward_fraction;
      if (!again.attention) w.recompute_others.push_back(again);
    }
    for (const CollectiveWork& c : base.collectives) {
      if (c.phase == "tp" && !c.backward) {
        CollectiveWork again = c;
        again.backward = true;
        w.collectives.push_back(again);
      }
    }
    w.op_count += static_cast<int64_t>(base.op_count * base.forward_fraction);
  }
  return w;
}

}  // namespace

RecomputeEstimator KorthikantiRecompute() { return Estimate; }

}  // namespace shardmap::planner
