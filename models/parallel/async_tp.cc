#include "models/parallel/async_tp.h"

#include <optional>
#include <utility>

#include "shardmap/async_collectives.h"
#include "shardmap/collective_ops.h"
#include "shardmap/context.h"
#include "shardmap/ops.h"
#include "tensor/error.h"

namespace shardmap {
namespace {

struct Ring {
  int n = 1;     // devices on the tp axis
  int self = 0;  // this device's index on it
  std::vector<std::pair<int, int>> next;  // i -> i + 1
  int Block(int k) const { return ((self - k) % n + n) % n; }
};

Ring RingOf(const TensorParallel& tp, const char* layer) {
  Ring r;
  if (!tp.on()) return r;
  if (!tp.sp) {
    OpFail(layer, ": the ring decomposes the sequence-parallel all_gather / reduce_scatter; set "
           "tp.sp (or use ColumnParallelLinear / RowParallelLinear without sequence parallelism)");
  }
  RankContext& ctx = RankContext::Get(layer);
  const int axis = ctx.mesh().AxisIndex(tp.axis);
  if (axis < 0) {
    OpFail(layer, ": unknown mesh axis '", tp.axis, "' (mesh ", ctx.mesh().ShortString(), ")");
  }
  r.n = ctx.mesh().axis_size(axis);
  r.self = axis_index(tp.axis);
  for (int i = 0; i < r.n; ++i) r.next.push_back({i, (i + 1) % r.n});
  return r;
}

// The ring hands each device a different row block, chosen by its index on tp, which the type
// rules cannot follow: the ring's operands are typed V on the axes that shard `dim` (a full-length
// slice of a sharded dim is the typed op that drops the S(dim) label; a copy of the local block).
// Kept as S, the plain layers' types would claim e.g. that device r's rows of block j are "the
// tp-th shard" of a whole, and the matmul rules would (rightly) pair them as such.
Value AsRingOperand(const Value& x, int dim) { return slice(x, dim, 0, x.dim(dim)); }

}  // namespace

std::vector<Value> RingColumnParallelLinear::Blocks(const Value& x) const {
  const Ring ring = RingOf(tp, "RingColumnParallelLinear");
  std::vector<Value> out(ring.n);
  Value chunk = tp.on() ? AsRingOperand(x, 0) : x;
  for (int k = 0; k < ring.n; ++k) {
    std::optional<PendingPpermute> next;
    if (k + 1 < ring.n) next.emplace(ppermute_start(chunk, tp.axis, ring.next));
    out[ring.Block(k)] = chunk.matmul(weight) + bias;  // overlaps the transfer
    if (next) chunk = next->Wait();
  }
  return out;
}

Value RingColumnParallelLinear::operator()(const Value& x) const { return concat(Blocks(x), 0); }

Value RingRowParallelLinear::operator()(const std::vector<Value>& blocks) const {
  const Ring ring = RingOf(tp, "RingRowParallelLinear");
  if (static_cast<int>(blocks.size()) != ring.n) {
    OpFail("RingRowParallelLinear: got ", blocks.size(), " row blocks for ", ring.n,
           " devices on '", tp.axis, "'; pass one block per device (RingColumnParallelLinear::"
           "Blocks gives them)");
  }
  // The running sum of block (self - 1 - k) mod n: this device's term, plus those of the k
  // devices before it, which arrive from device self - 1 while this one computes.
  Value acc = blocks[ring.Block(1)].matmul(weight);
  for (int k = 1; k < ring.n; ++k) {
    PendingPpermute sum_so_far = ppermute_start(acc, tp.axis, ring.next);
    Value mine = blocks[ring.Block(k + 1)].matmul(weight);  // overlaps the transfer
    acc = sum_so_far.Wait() + mine;
  }
  return acc + bias;
}

Value RingRowParallelLinear::operator()(const Value& x) const {
  const Ring ring = RingOf(tp, "RingRowParallelLinear");
  if (x.rank() < 1 || x.dim(0) % ring.n != 0) {
    OpFail("RingRowParallelLinear: ", x.ToString(), " cannot be cut into ", ring.n,
           " equal row blocks (one per device on '", tp.axis, "'); make the rows (tokens) a "
           "multiple of the tp size");
  }
  const int64_t rows = x.dim(0) / ring.n;
  const Value v = tp.on() ? AsRingOperand(x, 1) : x;
  std::vector<Value> blocks;
  for (int j = 0; j < ring.n; ++j) blocks.push_back(slice(v, 0, j * rows, rows));
  return (*this)(blocks);
}

Value RingMlp::operator()(const Value& x) const {
  std::vector<Value> h = c_fc.Blocks(x);
  for (Value& b : h) b = gelu(b, GeluApprox::kTanh);
  return c_proj(h);
}

}  // namespace shardmap
