#include "shardmap/ops/collective_ops.h"

#include <cstring>
#include <iterator>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "shardmap/runtime/context.h"
#include "shardmap/internal/collective_call.h"
#include "shardmap/internal/typing.h"
#include "shardmap/ops/ops.h"
#include "shardmap/rules/type_rules.h"
#include "tensor/cuda/graph.h"
#include "tensor/error.h"
#include "tensor/ops/elementwise.h"
#include "tensor/ops/shape_ops.h"

namespace shardmap {

using internal::NeedsTape;
using internal::RecordOp;
using internal::TypeFail;
using collectives::Communicator;
using collectives::ReduceOp;

AxisMask ResolveAxes(const char* op, const Axes& axes) {
  RankContext& ctx = RankContext::Get(op);
  const Mesh& mesh = ctx.mesh();
  AxisMask mask = 0;
  for (const std::string& a : axes.names) {
    int i = mesh.AxisIndex(a);
    if (i < 0) {
      OpFail(op, ": unknown mesh axis '", a, "' (mesh ", mesh.ShortString(),
             "); use one of the mesh's axis names");
    }
    if (mask & (1u << i)) OpFail(op, ": mesh axis '", a, "' named twice");
    mask |= 1u << i;
  }
  if (mask == 0) OpFail(op, ": no mesh axes given");
  return mask;
}

namespace {

using internal::CollectiveCall;

collectives::DataType DT(DType t) { return static_cast<collectives::DataType>(t); }

Value Detached(const Value& v) { return Value(v.tensor, v.type); }

// Gathers along dim 0 of a contiguous tensor (even or uneven).
Tensor GatherRows(const CollectiveCall& c, const Tensor& x, const std::vector<int64_t>* sizes) {
  if (c.TrivialOnDevice(x)) return x.Clone();
  c.CheckMemory(x);
  Communicator& comm = c.comm();
  int n = comm.size();
  int64_t row = x.rank() > 0 && x.dim(0) > 0 ? x.numel() / x.dim(0) : 0;
  Shape s = x.shape();
  if (sizes == nullptr) {
    s[0] *= n;
    Tensor out = Tensor::Empty(s, x.dtype(), x.device());
    c.Check(comm.AllGather(x.raw_data(), out.raw_data(), x.numel(), DT(x.dtype())));
    return out;
  }
  int64_t total = 0;
  std::vector<size_t> counts;
  for (int64_t k : *sizes) {
    total += k;
    counts.push_back(static_cast<size_t>(k * row));
  }
  s[0] = total;
  Tensor out = Tensor::Empty(s, x.dtype(), x.device());
  c.Check(comm.AllGatherV(x.raw_data(), out.raw_data(), counts, DT(x.dtype())));
  return out;
}

Tensor ScatterRows(const CollectiveCall& c, const Tensor& x, const std::vector<int64_t>* sizes) {
  if (c.TrivialOnDevice(x)) return x.Clone();
  c.CheckMemory(x);
  Communicator& comm = c.comm();
  int n = comm.size();
  int64_t row = x.dim(0) > 0 ? x.numel() / x.dim(0) : 0;
  Shape s = x.shape();
  if (sizes == nullptr) {
    s[0] /= n;
    Tensor out = Tensor::Empty(s, x.dtype(), x.device());
    c.Check(comm.ReduceScatter(x.raw_data(), out.raw_data(), out.numel(), DT(x.dtype()),
                               ReduceOp::kSum));
    return out;
  }
  std::vector<size_t> counts;
  for (int64_t k : *sizes) counts.push_back(static_cast<size_t>(k * row));
  s[0] = (*sizes)[comm.rank()];
  Tensor out = Tensor::Empty(s, x.dtype(), x.device());
  c.Check(comm.ReduceScatterV(x.raw_data(), out.raw_data(), counts, DT(x.dtype()),
                              ReduceOp::kSum));
  return out;
}

void CheckSplitSizes(const char* op, const std::vector<int64_t>& sizes, int n, int64_t total,
                     const Value& x) {
  if (static_cast<int>(sizes.size()) != n) {
    OpFail(op, ": split_sizes has ", sizes.size(), " entries but the axis group has ", n,
           " devices (", x.ToString(), ")");
  }
  int64_t sum = 0;
  for (int64_t k : sizes) {
    if (k < 0) OpFail(op, ": negative entry in split_sizes");
    sum += k;
  }
  if (total >= 0 && sum != total) {
    OpFail(op, ": split_sizes sum to ", sum, " but the dim has ", total, " elements (",
           x.ToString(), ")");
  }
}

Value GatherImpl(const Value& x, int dim, const Axes& axes, To to,
                 const std::vector<int64_t>* sizes);
Value ScatterImpl(const Value& x, int dim, const Axes& axes, const std::vector<int64_t>* sizes);

// Elementwise "is x the extreme at this device": the device index holding the max/min (lowest
// index on ties), via one all_reduce(min) over candidates.
Tensor WinnerMask(Communicator& comm, const Tensor& x_any, const Tensor& y_any, AxisMask mask) {
  if (x_any.dtype() != DType::kF32 && x_any.dtype() != DType::kF64) {
    OpFail("all_reduce(max/min) backward: only f32/f64 are supported, got ", x_any.ShapeString());
  }
  const Tensor x = x_any.To(Device::Cpu()), y = y_any.To(Device::Cpu());
  int64_t n = x.numel();
  std::vector<double> cand(n);
  for (int64_t i = 0; i < n; ++i) cand[i] = x.at(i) == y.at(i) ? comm.rank() : comm.size();
  const absl::Status s =
      AllReduceHost(comm, cand.data(), cand.data(), n, collectives::DataType::kF64, ReduceOp::kMin);
  RankContext& ctx = RankContext::Get("all_reduce(max/min) backward");
  if (!s.ok()) {
    throw OpError(absl::Status(s.code(), absl::StrCat("while running all_reduce(max/min) "
                                                      "backward over axes ",
                                                      ctx.mesh().MaskToString(mask), ": ",
                                                      s.message())));
  }
  ctx.LogCollective("all_reduce", mask, n * 8, DType::kF64);
  std::vector<double> m(n);
  for (int64_t i = 0; i < n; ++i) m[i] = cand[i] == comm.rank() ? 1.0 : 0.0;
  Tensor t = Tensor::FromVector<double>(x.shape(), m);
  return (x.dtype() == DType::kF64 ? t : Cast(t, x.dtype())).To(x_any.device());
}

// Keeps x on group index `root` of mask, zeros elsewhere.
Tensor KeepOnRoot(RankContext& ctx, const Tensor& x, AxisMask mask, int root) {
  if (ctx.mesh().GroupIndex(ctx.rank(), mask) == root) return x;
  return Tensor::Zeros(x.shape(), x.dtype(), x.device());
}

// ---------------------------------------------------------------------------------------------
// The VJPs, derived from the table. A collective records its parameters (CollectiveArgs); its
// VJP runs the transpose its row names (CollectiveRule::transpose or transpose_invariant):
// RunCollective calls that collective with the parameters transposed, then RunLocal does the
// row's local step. Editing a row's transpose changes the type rule and the backward alike.

// A collective's parameters, normalised (the dims in [0, rank)).
struct CollectiveArgs {
  Axes axes;
  AxisMask mask = 0;
  SpmdType x_type;                    // the primal's type (the cotangent's dual)
  int check_dim = -1, result_dim = -1;
  bool invariant = false;             // To::kI
  ReduceKind reduce = ReduceKind::kSum;
  // Uneven variants: the sizes along the check dim and along the result dim (empty: even).
  std::vector<int64_t> check_sizes, result_sizes;
  std::vector<std::pair<int, int>> pairs;  // ppermute's (source, destination) pairs
  int root = 0;                       // broadcast's root
  int group_size = 1, group_index = 0;
  int64_t check_len = 0;              // x's size along the check dim (all_gather's local chunk)
  Value x, y;                         // detached primal and result (all_reduce max/min)

  // The transpose's parameters: the dims and sizes swapped, the pairs inverted.
  CollectiveArgs Transposed() const {
    CollectiveArgs t = *this;
    std::swap(t.check_dim, t.result_dim);
    std::swap(t.check_sizes, t.result_sizes);
    for (auto& [s, d] : t.pairs) std::swap(s, d);
    return t;
  }
  const std::vector<int64_t>* sizes() const {
    return check_sizes.empty() ? nullptr : &check_sizes;
  }
};

// How each collective runs on a cotangent, with a forward's parameters transposed: one row per
// Collective beside its rule row (type_rules_collective.cc's kRules), in the enum's order and
// each naming its key, checked at compile time as kRules is. Adding a collective is its rule
// row and this row; a missing or misplaced row fails to compile.
using RunFn = Value (*)(const CollectiveArgs& a, const Value& g, To to);
struct CollectiveImpl {
  Collective op;  // the row's key
  RunFn run;
};
constexpr CollectiveImpl kImpls[] = {
    {Collective::kAllReduceSum,
     [](const CollectiveArgs& a, const Value& g, To to) { return all_reduce(g, a.axes, to); }},
    {Collective::kAllReduceMeanMaxMin,
     [](const CollectiveArgs& a, const Value& g, To to) {
       return all_reduce(g, a.axes, to, a.reduce);
     }},
    {Collective::kAllGather,
     [](const CollectiveArgs& a, const Value& g, To to) {
       return GatherImpl(g, a.check_dim, a.axes, to, a.sizes());
     }},
    {Collective::kReduceScatter,
     [](const CollectiveArgs& a, const Value& g, To) {
       return ScatterImpl(g, a.check_dim, a.axes, a.sizes());
     }},
    {Collective::kAllToAll,
     [](const CollectiveArgs& a, const Value& g, To) {
       return all_to_all(g, a.result_dim, a.check_dim, a.axes);
     }},
    {Collective::kAllToAllSizes,
     [](const CollectiveArgs& a, const Value& g, To) {
       return all_to_all(g, a.result_dim, a.check_dim, a.axes, a.result_sizes, a.check_sizes);
     }},
    {Collective::kPpermute,
     [](const CollectiveArgs& a, const Value& g, To) { return ppermute(g, a.axes, a.pairs); }},
    {Collective::kBroadcast,
     [](const CollectiveArgs& a, const Value& g, To) { return broadcast(g, a.axes, a.root); }},
    {Collective::kConvertIToR,
     [](const CollectiveArgs& a, const Value& g, To) {
       return convert(g, a.axes, Convert::kIToR);
     }},
    {Collective::kConvertRToP,
     [](const CollectiveArgs& a, const Value& g, To) {
       return convert(g, a.axes, Convert::kRToP);
     }},
    {Collective::kReinterpret,
     [](const CollectiveArgs& a, const Value& g, To) { return reinterpret(g, a.axes); }},
    {Collective::kVary,
     [](const CollectiveArgs& a, const Value& g, To) { return vary(g, a.axes); }},
};

constexpr bool EveryCollectiveHasItsImpl() {
  if (std::size(kImpls) != static_cast<size_t>(Collective::kCount)) return false;
  for (size_t i = 0; i < std::size(kImpls); ++i) {
    if (kImpls[i].op != static_cast<Collective>(i) || kImpls[i].run == nullptr) return false;
  }
  return true;
}
static_assert(EveryCollectiveHasItsImpl(),
              "kImpls: one row per Collective, in the enum's order, each naming its key");

// Runs collective c on g with a's parameters (invariant: its To::kI form); kCount (a local
// transpose): g itself.
Value RunCollective(Collective c, const CollectiveArgs& a, const Value& g, bool invariant) {
  if (c == Collective::kCount) return g;
  return kImpls[static_cast<int>(c)].run(a, g, invariant ? To::kI : To::kR);
}

// The row's local step on t, the transpose collective's result (a: the forward's parameters).
Value RunLocal(TransposeLocal step, const CollectiveArgs& a, Value t) {
  switch (step) {
    case TransposeLocal::kNone: return t;
    case TransposeLocal::kKeepOnRoot: {
      // On the axes where x was R the result is convert(R->P)'s (at the root), where it was V
      // a V.
      RankContext& c = RankContext::Get("broadcast backward");
      const SpmdType type =
          CollectiveResult(CollectiveRuleFor(Collective::kConvertRToP), t.type,
                           a.mask & a.x_type.AxesOfKind(AxisKind::kR), -1, false);
      return Value(KeepOnRoot(c, t.tensor, a.mask, a.root), type);
    }
    case TransposeLocal::kLocalChunk: {
      int64_t start = 0;
      if (a.check_sizes.empty()) {
        start = a.group_index * a.check_len;
      } else {
        for (int k = 0; k < a.group_index; ++k) start += a.check_sizes[k];
      }
      return Value(Slice(t.tensor, a.check_dim, start, a.check_len), t.type);
    }
    case TransposeLocal::kSpread: {  // spread (mean) or routed to the extreme
      Tensor gt = t.tensor;
      if (a.reduce == ReduceKind::kMean) {
        gt = MulScalar(gt, 1.0 / a.group_size);
      } else if (a.reduce != ReduceKind::kSum) {
        RankContext& c = RankContext::Get("all_reduce backward");
        gt = Mul(gt, WinnerMask(c.CommFor("all_reduce(max/min) backward", a.mask, a.x.tensor),
                                a.x.tensor, a.y.tensor, a.mask));
      }
      return Value(std::move(gt), t.type);
    }
  }
  OpFail("collective transpose: unknown local step ", static_cast<int>(step));
}

// Records y = c(x) on the tape with the VJP c's row names: the transpose collective on the
// cotangent, the local step, stated as x's cotangent (AsCotangent).
void RecordCollective(const char* name, Collective c, const Value& x, Value& y,
                      CollectiveArgs a) {
  a.x_type = x.type;
  RecordOp(name, {&x}, y, [c, a = std::move(a)](const Value& g, uint32_t, Value* d) {
    const CollectiveTranspose& tr = TransposeOf(c, a.invariant);
    Value t = RunCollective(tr.op, a.Transposed(), g, tr.invariant);
    d[0] = internal::AsCotangent(RunLocal(tr.then, a, std::move(t)), a.x_type);
  });
}

// The parameters every collective has.
CollectiveArgs ArgsOf(const CollectiveCall& c, const Axes& axes) {
  CollectiveArgs a;
  a.axes = axes;
  a.mask = c.mask();
  a.check_dim = c.check_dim() == internal::kNoDim ? -1 : c.check_dim();
  a.result_dim = c.result_dim() == internal::kNoDim ? -1 : c.result_dim();
  if (c.rule().communicates) {
    a.group_size = c.group_size();
    a.group_index = c.group_index();
  }
  return a;
}

}  // namespace

// ---------------------------------------------------------------------------------------------

Value all_reduce(const Value& x, const Axes& axes, To to, ReduceKind op) {
  const CollectiveCall c(
      op == ReduceKind::kSum ? Collective::kAllReduceSum : Collective::kAllReduceMeanMaxMin, x,
      axes, {.invariant = to == To::kI});
  Tensor out;
  if (c.TrivialOnDevice(x.tensor)) {
    out = x.tensor.Clone();
  } else {
    c.CheckMemory(x.tensor);
    out = Tensor::Empty(x.shape(), x.dtype(), x.tensor.device());
    ReduceOp rop = op == ReduceKind::kSum    ? ReduceOp::kSum
                   : op == ReduceKind::kMean ? ReduceOp::kAvg
                   : op == ReduceKind::kMax  ? ReduceOp::kMax
                                             : ReduceOp::kMin;
    c.Check(
        c.comm().AllReduce(x.tensor.raw_data(), out.raw_data(), x.numel(), DT(x.dtype()), rop));
  }
  c.Log(x.tensor);
  Value y(std::move(out), c.type());
  if (NeedsTape(x)) {
    CollectiveArgs a = ArgsOf(c, axes);
    a.invariant = to == To::kI;
    a.reduce = op;
    a.x = Detached(x);
    a.y = Detached(y);
    RecordCollective("all_reduce", c.rule().op, x, y, std::move(a));
  }
  return y;
}

namespace {

Value GatherImpl(const Value& x, int dim, const Axes& axes, To to,
                 const std::vector<int64_t>* sizes) {
  const CollectiveCall c(Collective::kAllGather, x, axes,
                         {.check = dim, .result = dim, .invariant = to == To::kI,
                          .ragged = sizes != nullptr});
  dim = c.check_dim();
  const int me = c.group_index();
  if (sizes != nullptr) CheckSplitSizes("all_gather", *sizes, c.group_size(), -1, x);
  if (sizes != nullptr && (*sizes)[me] != x.dim(dim)) {
    OpFail("all_gather: split_sizes[", me, "] is ", (*sizes)[me], " but this device's dim ", dim,
           " has ", x.dim(dim), " (", x.ToString(), ")");
  }
  Tensor out;
  if (dim == 0) {
    out = GatherRows(c, x.tensor, sizes);
  } else {
    out = Transpose(GatherRows(c, Transpose(x.tensor, 0, dim), sizes), 0, dim);
  }
  c.Log(x.tensor);
  Value y(std::move(out), c.type());
  if (NeedsTape(x)) {
    CollectiveArgs a = ArgsOf(c, axes);
    a.invariant = to == To::kI;
    if (sizes != nullptr) a.check_sizes = a.result_sizes = *sizes;
    a.check_len = x.dim(dim);
    RecordCollective("all_gather", Collective::kAllGather, x, y, std::move(a));
  }
  return y;
}

Value ScatterImpl(const Value& x, int dim, const Axes& axes, const std::vector<int64_t>* sizes) {
  const CollectiveCall c(Collective::kReduceScatter, x, axes, {.check = dim, .result = dim});
  dim = c.check_dim();
  const int n = c.group_size();
  if (sizes != nullptr) {
    CheckSplitSizes("reduce_scatter", *sizes, n, x.dim(dim), x);
  } else if (x.dim(dim) % n != 0) {
    OpFail("reduce_scatter: dim ", dim, " of ", x.ToString(), " (size ", x.dim(dim),
           ") is not divisible by the ", n, " devices of axes ",
           c.ctx().mesh().MaskToString(c.mask()), "; pass split_sizes for uneven chunks");
  }
  Tensor out;
  if (dim == 0) {
    out = ScatterRows(c, x.tensor, sizes);
  } else {
    out = Transpose(ScatterRows(c, Transpose(x.tensor, 0, dim), sizes), 0, dim);
  }
  c.Log(x.tensor);
  Value y(std::move(out), c.type());
  if (NeedsTape(x)) {
    CollectiveArgs a = ArgsOf(c, axes);
    if (sizes != nullptr) a.check_sizes = a.result_sizes = *sizes;
    RecordCollective("reduce_scatter", Collective::kReduceScatter, x, y, std::move(a));
  }
  return y;
}

}  // namespace

Value all_gather(const Value& x, int dim, const Axes& axes, To to) {
  return GatherImpl(x, dim, axes, to, nullptr);
}
Value all_gather(const Value& x, int dim, const Axes& axes,
                 const std::vector<int64_t>& split_sizes, To to) {
  return GatherImpl(x, dim, axes, to, &split_sizes);
}
Value reduce_scatter(const Value& x, int dim, const Axes& axes) {
  return ScatterImpl(x, dim, axes, nullptr);
}
Value reduce_scatter(const Value& x, int dim, const Axes& axes,
                     const std::vector<int64_t>& split_sizes) {
  return ScatterImpl(x, dim, axes, &split_sizes);
}

Value all_to_all(const Value& x, int split_dim, int concat_dim, const Axes& axes) {
  const CollectiveCall c(Collective::kAllToAll, x, axes,
                         {.check = concat_dim, .result = split_dim});
  split_dim = c.result_dim();
  concat_dim = c.check_dim();
  const int n = c.group_size();
  if (x.dim(split_dim) % n != 0) {
    OpFail("all_to_all: split dim ", split_dim, " of ", x.ToString(), " (size ",
           x.dim(split_dim), ") is not divisible by the ", n, " devices of axes ",
           c.ctx().mesh().MaskToString(c.mask()));
  }
  std::vector<Tensor> chunks = Chunk(x.tensor, split_dim, n);
  Shape cs = chunks[0].shape();
  Shape packed_shape = cs;
  packed_shape.insert(packed_shape.begin(), 1);
  std::vector<Tensor> packed;
  for (Tensor& c : chunks) packed.push_back(c.Reshape(packed_shape));
  Tensor send = Concat(packed, 0);
  c.CheckMemory(send);
  Tensor recv = Tensor::Empty(send.shape(), x.dtype(), send.device());
  c.Check(c.comm().AllToAll(send.raw_data(), recv.raw_data(), chunks[0].numel(), DT(x.dtype())));
  c.Log(x.tensor);
  std::vector<Tensor> got;
  for (int j = 0; j < n; ++j) got.push_back(recv.SliceRows(j, 1).Reshape(cs));
  Value y(Concat(got, concat_dim), c.type());
  if (NeedsTape(x)) {
    RecordCollective("all_to_all", Collective::kAllToAll, x, y, ArgsOf(c, axes));
  }
  return y;
}

Value all_to_all(const Value& x, int split_dim, int concat_dim, const Axes& axes,
                 const std::vector<int64_t>& split_sizes,
                 const std::vector<int64_t>& concat_sizes) {
  const CollectiveCall c(Collective::kAllToAllSizes, x, axes,
                         {.check = concat_dim, .result = split_dim, .ragged = true});
  split_dim = c.result_dim();
  concat_dim = c.check_dim();
  if (split_dim == concat_dim) {
    OpFail("all_to_all with split_sizes: split_dim and concat_dim must differ (", x.ToString(),
           ")");
  }
  const int n = c.group_size(), me = c.group_index();
  CheckSplitSizes("all_to_all", split_sizes, n, x.dim(split_dim), x);
  CheckSplitSizes("all_to_all", concat_sizes, n, -1, x);
  if (concat_sizes[me] != x.dim(concat_dim)) {
    OpFail("all_to_all: concat_sizes[", me, "] is ", concat_sizes[me], " but this device's dim ",
           concat_dim, " has ", x.dim(concat_dim), " (", x.ToString(), ")");
  }
  std::vector<Tensor> chunks = Split(x.tensor, split_dim, split_sizes);
  std::vector<Tensor> flat;
  std::vector<size_t> send_counts, recv_counts;
  int64_t other = 1;  // product of the dims other than split_dim and concat_dim
  for (int d = 0; d < x.rank(); ++d) {
    if (d != split_dim && d != concat_dim) other *= x.dim(d);
  }
  for (int j = 0; j < n; ++j) {
    flat.push_back(chunks[j].Reshape({chunks[j].numel()}));
    send_counts.push_back(static_cast<size_t>(chunks[j].numel()));
    recv_counts.push_back(static_cast<size_t>(split_sizes[me] * concat_sizes[j] * other));
  }
  Tensor send = Concat(flat, 0);
  int64_t total_recv = 0;
  for (size_t c : recv_counts) total_recv += static_cast<int64_t>(c);
  c.CheckMemory(send);
  Tensor recv = Tensor::Empty({total_recv}, x.dtype(), send.device());
  c.Check(c.comm().AllToAllV(send.raw_data(), send_counts, recv.raw_data(), recv_counts,
                             DT(x.dtype())));
  c.Log(x.tensor);
  std::vector<Tensor> got;
  int64_t off = 0;
  for (int j = 0; j < n; ++j) {
    Shape ps = x.shape();
    ps[split_dim] = split_sizes[me];
    ps[concat_dim] = concat_sizes[j];
    got.push_back(recv.SliceRows(off, static_cast<int64_t>(recv_counts[j])).Reshape(ps));
    off += static_cast<int64_t>(recv_counts[j]);
  }
  Value y(Concat(got, concat_dim), c.type());
  if (NeedsTape(x)) {
    CollectiveArgs a = ArgsOf(c, axes);
    a.check_sizes = concat_sizes;
    a.result_sizes = split_sizes;
    RecordCollective("all_to_all", Collective::kAllToAllSizes, x, y, std::move(a));
  }
  return y;
}

Value ppermute(const Value& x, const Axes& axes, std::vector<std::pair<int, int>> pairs) {
  const CollectiveCall c(Collective::kPpermute, x, axes);
  const int n = c.group_size();
  std::vector<bool> src(n), dst(n);
  for (auto [s, d] : pairs) {
    if (s < 0 || s >= n || d < 0 || d >= n || src[s] || dst[d]) {
      OpFail("ppermute: invalid pair (", s, ",", d, ") for ", n,
             " devices: each index at most once as source and once as destination");
    }
    src[s] = dst[d] = true;
  }
  c.CheckMemory(x.tensor);
  Tensor out = Tensor::Empty(x.shape(), x.dtype(), x.tensor.device());
  c.Check(c.comm().Ppermute(x.tensor.raw_data(), out.raw_data(), x.numel(), DT(x.dtype()), pairs));
  c.Log(x.tensor);
  Value y(std::move(out), c.type());
  if (NeedsTape(x)) {
    CollectiveArgs a = ArgsOf(c, axes);
    a.pairs = std::move(pairs);
    RecordCollective("ppermute", Collective::kPpermute, x, y, std::move(a));
  }
  return y;
}

Value broadcast(const Value& x, const Axes& axes, int root) {
  const CollectiveCall c(Collective::kBroadcast, x, axes);
  if (root < 0 || root >= c.group_size()) {
    OpFail("broadcast: root ", root, " out of range for ", c.group_size(), " devices");
  }
  c.CheckMemory(x.tensor);
  Tensor out = x.tensor.Clone();
  c.Check(c.comm().Broadcast(out.raw_data(), out.numel(), DT(x.dtype()), root));
  c.Log(x.tensor);
  Value y(std::move(out), c.type());
  if (NeedsTape(x)) {
    CollectiveArgs a = ArgsOf(c, axes);
    a.root = root;
    RecordCollective("broadcast", Collective::kBroadcast, x, y, std::move(a));
  }
  return y;
}

Value convert(const Value& x, const Axes& axes, Convert c) {
  const CollectiveCall call(
      c == Convert::kIToR ? Collective::kConvertIToR : Collective::kConvertRToP, x, axes);
  const char* name = call.rule().name;
  Tensor out =
      c == Convert::kIToR ? x.tensor : KeepOnRoot(call.ctx(), x.tensor, call.mask(), 0);
  Value y(std::move(out), call.type());
  if (NeedsTape(x)) RecordCollective(name, call.rule().op, x, y, ArgsOf(call, axes));
  return y;
}

Value reinterpret(const Value& x, const Axes& axes) {
  const CollectiveCall c(Collective::kReinterpret, x, axes);
  Value y(x.tensor, c.type());
  if (NeedsTape(x)) {
    RecordCollective("reinterpret", Collective::kReinterpret, x, y, ArgsOf(c, axes));
  }
  return y;
}

Value vary(const Value& x, const Axes& axes) {
  const CollectiveCall c(Collective::kVary, x, axes);
  Value y(x.tensor, c.type());
  if (NeedsTape(x)) RecordCollective("vary", Collective::kVary, x, y, ArgsOf(c, axes));
  return y;
}

Value as_varying(const Value& x, const Axes& axes) {
  internal::CheckMesh("as_varying", x, "x");
  const AxisMask mask = ResolveAxes("as_varying", axes);
  SpmdType t = x.type;
  const bool checked = RankContext::Get("as_varying").checked();
  for (int i = 0; i < t.num_axes(); ++i) {
    if (!(mask & (1u << i))) continue;
    const AxisKind k = t[i].kind;
    if (checked && (k == AxisKind::kI || k == AxisKind::kP)) {
      TypeFail("as_varying", i, absl::StrCat("takes R or V, but x is ", KindName(k)),
               k == AxisKind::kI ? "convert(x, axis, Convert::kIToR) first"
                                 : "resolve the partial sum first (all_reduce)",
               {{"x", &x}});
    }
    // A V that already has an origin keeps it (a declaration does not excuse a mistake).
    if (t[i].is_unknown_v() && t[i].origin != 0) continue;
    static const uint16_t declared = RecordVOrigin(
        VOrigin{"as_varying", "the program declared per-device values", "",
                "combine them as the program means (the sum of blocks as an all_reduce, a "
                "ppermute ring, an all_to_all)",
                VKind::kIntended});
    t[i] = AxisType::V(declared);
  }
  Value y(x.tensor, t);
  if (NeedsTape(x)) {
    internal::RecordOp("as_varying", {&x}, y, [xt = x.type](const Value& g, uint32_t, Value* d) {
      d[0] = internal::AsCotangent(Value(g.tensor, g.type), xt);
    });
  }
  return y;
}

Axes AxesWhere(const Value& x, AxisKind k) {
  internal::CheckMesh("AxesWhere", x, "x");
  return Axes(RankContext::Get("AxesWhere").mesh().AxisNamesOf(x.type.AxesOfKind(k)));
}

Value all_reduce_partial(const Value& x) {
  const Axes partial = AxesWhere(x, AxisKind::kP);
  return partial.empty() ? x : all_reduce(x, partial, To::kR);
}

int axis_index(const Axes& axes) {
  AxisMask mask = ResolveAxes("axis_index", axes);
  RankContext& ctx = RankContext::Get("axis_index");
  return ctx.mesh().GroupIndex(ctx.rank(), mask);
}

Value axis_index_value(const Axes& axes, DType dtype) {
  AxisMask mask = ResolveAxes("axis_index", axes);
  RankContext& ctx = RankContext::Get("axis_index");
  SpmdType t(ctx.mesh().num_axes());
  t.set_mesh_id(ctx.mesh().id());
  for (int i = 0; i < t.num_axes(); ++i) {
    if (mask & (1u << i)) t[i] = AxisType::V();
  }
  return Value(Tensor::Full({}, ctx.mesh().GroupIndex(ctx.rank(), mask), dtype, ctx.device()),
               t);
}

}  // namespace shardmap
