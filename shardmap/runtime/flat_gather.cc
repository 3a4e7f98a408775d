#include "shardmap/runtime/flat_gather.h"

#include <memory>
#include <utility>
#include <vector>

#include "shardmap/runtime/async_collectives.h"
#include "shardmap/runtime/context.h"
#include "shardmap/internal/collective_call.h"
#include "shardmap/internal/typing.h"
#include "shardmap/ops/ops.h"
#include "tensor/error.h"
#include "tensor/ops/shape_ops.h"

namespace shardmap {
namespace {

constexpr const char* kStart = "all_gather_flat_start";
constexpr const char* kWait = "all_gather_flat_wait";

// Where each shard sits in the packed buffer (one rank's row of the gathered rows).
struct Layout {
  int group = 1;                 // devices along the axes
  std::vector<int> dims;         // the gathered dim of each shard
  std::vector<Shape> shapes;     // each shard's shape
  std::vector<int64_t> numels;   // and its elements
  std::vector<int64_t> offsets;  // its first element in a row
  int64_t row = 0;               // elements per row (the sum of the shards')
  Device device;
  AxisMask mask = 0;
  Axes axes;
};

// A value of the packed buffer: kind `k` on the gathered axes, R elsewhere (the collective
// checks only its own axes; each shard's own type is checked per shard).
SpmdType PackedType(const Mesh& mesh, AxisMask mask, AxisType k) {
  SpmdType t(mesh.num_axes());
  t.set_mesh_id(mesh.id());
  for (int a = 0; a < mesh.num_axes(); ++a) {
    if (mask & (AxisMask{1} << a)) t[a] = k;
  }
  return t;
}

// Row r of the reduce-scatter's send buffer holds each full cotangent's block r along its dim.
Tensor PackBlocks(const Layout& l, const std::vector<Tensor>& full, DType dtype) {
  std::vector<Tensor> pieces;
  pieces.reserve(static_cast<size_t>(l.group) * full.size());
  for (int r = 0; r < l.group; ++r) {
    for (size_t k = 0; k < full.size(); ++k) {
      const int64_t numel = l.numels[k];
      if (!full[k].defined()) {
        pieces.push_back(Tensor::Zeros({numel}, dtype, l.device));
        continue;
      }
      const int64_t len = l.shapes[k][l.dims[k]];
      pieces.push_back(Slice(full[k], l.dims[k], r * len, len).Reshape({numel}));
    }
  }
  return Concat(pieces, 0);
}

// The reduce-scatter of the full cotangents (in `dtype`), packed by PackBlocks, started.
PendingValue StartScatter(const Layout& l, const std::vector<Tensor>& full, DType dtype) {
  Tensor packed = PackBlocks(l, full, dtype);
  const RankContext& ctx = RankContext::Get(kStart);
  return reduce_scatter_start(
      Value(std::move(packed), PackedType(ctx.mesh(), l.mask, AxisType::P())), 0, l.axes);
}

// Shard k's block of the reduced row, typed as reduce_scatter of the shard's own cotangent
// types it (S(dim) on the axes), stated as the shard's cotangent (all_gather's transpose).
Value ShardOfRow(const Layout& l, const Tensor& reduced, size_t k, const SpmdType& shard_type) {
  SpmdType t = Dual(shard_type);
  for (int a = 0; a < t.num_axes(); ++a) {
    if (l.mask & (AxisMask{1} << a)) t[a] = AxisType::Sharded(l.dims[k]);
  }
  return internal::AsCotangent(
      Value(reduced.SliceRows(l.offsets[k], l.numels[k]).Reshape(l.shapes[k]), t), shard_type);
}

// What the wait ops' VJPs hand to the start ops' VJPs.
struct FlatBackward {
  Layout layout;
  DType grad_dtype = DType::kF32;
  std::vector<SpmdType> shard_types;
  std::vector<Tensor> cotangents;  // full, per shard, in grad_dtype (undefined: none came)
  int arrived = 0, expected = 0;
  PendingValue scatter;
  bool started = false;
  Tensor reduced;  // this device's row, summed

  void Start() {
    started = true;
    scatter = StartScatter(layout, cotangents, grad_dtype);
    cotangents.clear();  // their bytes now live in the packed buffer
  }
  Value ShardGrad(size_t k) {
    if (!started) Start();  // some gathered value got no cotangent
    if (!reduced.defined()) reduced = scatter.Wait().tensor;
    return ShardOfRow(layout, reduced, k, shard_types[k]);
  }
};

}  // namespace

struct PendingFlatGather::State {
  Layout layout;
  std::vector<SpmdType> out_types;
  PendingValue call;
  // On a tape: one token per shard joining its start and wait ops (undefined: not taped).
  std::vector<Value> tokens;
  std::shared_ptr<FlatBackward> backward;
};

PendingFlatGather::PendingFlatGather() = default;
PendingFlatGather::PendingFlatGather(PendingFlatGather&&) noexcept = default;
PendingFlatGather& PendingFlatGather::operator=(PendingFlatGather&&) noexcept = default;
PendingFlatGather::~PendingFlatGather() = default;

namespace {

// Checks the shards and returns where each one sits; out_types: each one's gathered type.
Layout CheckAndLay(const std::vector<Value>& shards, const std::vector<int>& dims,
                   const Axes& axes, std::vector<SpmdType>& out_types) {
  if (shards.empty()) OpFail(kStart, ": no shards to gather");
  if (dims.size() != shards.size()) {
    OpFail(kStart, ": ", shards.size(), " shards but ", dims.size(),
           " dims; pass the gathered dim of each shard");
  }
  Layout l;
  l.axes = axes;
  l.device = shards[0].tensor.device();
  for (size_t k = 0; k < shards.size(); ++k) {
    const Value& x = shards[k];
    const internal::CollectiveCall c(Collective::kAllGather, x, axes,
                                     {.check = dims[k], .result = dims[k]}, kStart);
    if (x.dtype() != shards[0].dtype() || x.tensor.device() != l.device) {
      OpFail(kStart, ": shard ", k, " is ", x.ToString(), " on ", x.tensor.device().ToString(),
             " but shard 0 is ", shards[0].ToString(), " on ", l.device.ToString(),
             "; one flat gather takes shards of one dtype and device (group them)");
    }
    l.group = c.group_size();
    l.mask = c.mask();
    l.dims.push_back(c.check_dim());
    l.shapes.push_back(x.shape());
    l.numels.push_back(x.numel());
    l.offsets.push_back(l.row);
    l.row += x.numel();
    out_types.push_back(c.type());
  }
  return l;
}

}  // namespace

PendingFlatGather all_gather_flat_start(const std::vector<Value>& shards,
                                        const std::vector<int>& dims, const Axes& axes,
                                        std::optional<DType> gather_dtype) {
  auto st = std::make_unique<PendingFlatGather::State>();
  st->layout = CheckAndLay(shards, dims, axes, st->out_types);
  const DType sent_dtype = gather_dtype.value_or(shards[0].dtype());
  std::vector<Tensor> flat;
  flat.reserve(shards.size());
  for (const Value& x : shards) {
    const Tensor t = x.dtype() == sent_dtype ? x.tensor : Cast(x.tensor, sent_dtype);
    flat.push_back(t.Reshape({x.numel()}));
  }
  const RankContext& ctx = RankContext::Get(kStart);
  {
    NoGradScope untaped;
    st->call = all_gather_start(
        Value(Concat(flat, 0), PackedType(ctx.mesh(), st->layout.mask, AxisType::V())), 0, axes);
  }
  bool taped = false;
  for (const Value& x : shards) taped |= internal::NeedsTape(x);
  PendingFlatGather p;
  if (!taped) {
    p.state_ = std::move(st);
    return p;
  }
  auto bw = std::make_shared<FlatBackward>();
  bw->layout = st->layout;
  bw->grad_dtype = shards[0].dtype();
  bw->cotangents.resize(shards.size());
  st->tokens.resize(shards.size());
  for (size_t k = 0; k < shards.size(); ++k) {
    bw->shard_types.push_back(shards[k].type);
    if (!internal::NeedsTape(shards[k])) continue;
    ++bw->expected;
    st->tokens[k] = Value(Tensor::Empty({0}, sent_dtype, st->layout.device), st->out_types[k]);
    internal::RecordOp(kStart, {&shards[k]}, st->tokens[k],
                       [bw, k](const Value&, uint32_t, Value* d) { d[0] = bw->ShardGrad(k); });
  }
  st->backward = std::move(bw);
  p.state_ = std::move(st);
  return p;
}

std::vector<Value> PendingFlatGather::Wait() {
  if (state_ == nullptr) {
    OpFail(kWait, ": this handle was already waited (or moved from); wait each "
           "all_gather_flat_start exactly once");
  }
  std::unique_ptr<State> st = std::move(state_);
  const Tensor rows = st->call.Wait().tensor;  // [group * row]
  const Layout& l = st->layout;
  std::vector<Value> out;
  out.reserve(l.shapes.size());
  for (size_t k = 0; k < l.shapes.size(); ++k) {
    const int64_t numel = l.numels[k];
    std::vector<Tensor> blocks;
    for (int r = 0; r < l.group; ++r) {
      blocks.push_back(rows.SliceRows(r * l.row + l.offsets[k], numel).Reshape(l.shapes[k]));
    }
    out.emplace_back(Concat(blocks, l.dims[k]), st->out_types[k]);
    if (st->backward == nullptr || !internal::NeedsTape(st->tokens[k])) continue;
    internal::RecordOp(kWait, {&st->tokens[k]}, out.back(),
                       [bw = st->backward, k, token_type = st->tokens[k].type](
                           const Value& g, uint32_t, Value* d) {
      if (bw->started) {
        OpFail("backward of ", kWait, ": the reduce-scatter already started (the tape runs "
               "VJPs in reverse order; this is a bug in the tape)");
      }
      bw->cotangents[k] = g.dtype() == bw->grad_dtype ? g.tensor : Cast(g.tensor, bw->grad_dtype);
      if (++bw->arrived == bw->expected) bw->Start();  // the last of the unit's cotangents
      d[0] = Value(Tensor::Empty({0}, g.dtype(), g.tensor.device()), Dual(token_type));
    });
  }
  return out;
}

constexpr const char* kScatter = "reduce_scatter_flat_start";

struct PendingFlatScatter::State {
  Layout layout;
  std::vector<SpmdType> shard_types;
  PendingValue call;
};

PendingFlatScatter::PendingFlatScatter() = default;
PendingFlatScatter::PendingFlatScatter(PendingFlatScatter&&) noexcept = default;
PendingFlatScatter& PendingFlatScatter::operator=(PendingFlatScatter&&) noexcept = default;
PendingFlatScatter::~PendingFlatScatter() = default;

PendingFlatScatter reduce_scatter_flat_start(const std::vector<Value>& grads,
                                             const std::vector<int>& dims, const Axes& axes,
                                             const std::vector<SpmdType>& shard_types) {
  if (grads.empty()) OpFail(kScatter, ": no gradients to reduce");
  if (dims.size() != grads.size() || shard_types.size() != grads.size()) {
    OpFail(kScatter, ": ", grads.size(), " gradients but ", dims.size(), " dims and ",
           shard_types.size(), " shard types; pass one of each per gradient");
  }
  auto st = std::make_unique<PendingFlatScatter::State>();
  Layout& l = st->layout;
  l.axes = axes;
  l.device = grads[0].tensor.device();
  std::vector<Tensor> full;
  for (size_t k = 0; k < grads.size(); ++k) {
    const Value& g = grads[k];
    const internal::CollectiveCall c(Collective::kReduceScatter, g, axes,
                                     {.check = dims[k], .result = dims[k]}, kScatter);
    if (g.dtype() != grads[0].dtype() || g.tensor.device() != l.device) {
      OpFail(kScatter, ": gradient ", k, " is ", g.ToString(), " on ",
             g.tensor.device().ToString(), " but gradient 0 is ", grads[0].ToString(), " on ",
             l.device.ToString(), "; one flat reduce-scatter takes one dtype and device");
    }
    const int dim = c.check_dim();
    if (g.dim(dim) % c.group_size() != 0) {
      OpFail(kScatter, ": dim ", dim, " of gradient ", k, " ", g.ToString(),
             " is not divisible by the ", c.group_size(), " devices of the axes");
    }
    Shape shard = g.shape();
    shard[dim] /= c.group_size();
    l.group = c.group_size();
    l.mask = c.mask();
    l.dims.push_back(dim);
    l.shapes.push_back(shard);
    l.numels.push_back(g.numel() / c.group_size());
    l.offsets.push_back(l.row);
    l.row += l.numels.back();
    full.push_back(g.tensor);
  }
  st->shard_types = shard_types;
  st->call = StartScatter(l, full, grads[0].dtype());
  PendingFlatScatter p;
  p.state_ = std::move(st);
  return p;
}

std::vector<Value> PendingFlatScatter::Wait() {
  if (state_ == nullptr) {
    OpFail("reduce_scatter_flat_wait: this handle was already waited (or moved from); wait "
           "each reduce_scatter_flat_start exactly once");
  }
  std::unique_ptr<State> st = std::move(state_);
  const Tensor reduced = st->call.Wait().tensor;
  std::vector<Value> out;
  for (size_t k = 0; k < st->layout.shapes.size(); ++k) {
    out.push_back(ShardOfRow(st->layout, reduced, k, st->shard_types[k]));
  }
  return out;
}

}  // namespace shardmap
