#include "shardmap/sharding.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "shardmap/runtime/context.h"
#include "shardmap/rules/type_rules.h"
#include "tensor/error.h"
#include "tensor/ops/shape_ops.h"

namespace shardmap {

Tensor ShardOf(const Tensor& global, const Mesh& mesh, const PartitionSpec& spec, int rank) {
  Tensor t = global;
  bool copied = false;
  for (int d = 0; d < spec.size(); ++d) {
    if (spec.dim_axes(d).empty()) continue;
    int64_t len = global.dim(d) / spec.NumBlocks(mesh, d);
    t = Slice(t, d, spec.BlockIndex(mesh, rank, d) * len, len);
    copied = true;
  }
  return copied ? t : global.Clone();
}

namespace {

template <typename T>
void AddBlock(Tensor& whole, const Tensor& part, const std::vector<int64_t>& off, bool assign) {
  const int r = part.rank();
  if (part.numel() == 0) return;
  T* w = whole.data<T>();
  const T* p = part.data<T>();
  if (r == 0) {
    w[0] = assign ? p[0] : w[0] + p[0];
    return;
  }
  std::vector<int64_t> wstride(r, 1);
  for (int d = r - 2; d >= 0; --d) wstride[d] = wstride[d + 1] * whole.dim(d + 1);
  const int64_t inner = part.dim(r - 1);
  const int64_t rows = part.numel() / inner;
  std::vector<int64_t> idx(r, 0);
  for (int64_t row = 0; row < rows; ++row) {
    int64_t base = off[r - 1];
    for (int d = 0; d < r - 1; ++d) base += (idx[d] + off[d]) * wstride[d];
    const T* src = p + row * inner;
    T* dst = w + base;
    if (assign) {
      std::memcpy(dst, src, inner * sizeof(T));
    } else {
      for (int64_t k = 0; k < inner; ++k) dst[k] += src[k];
    }
    for (int d = r - 2; d >= 0; --d) {
      if (++idx[d] < part.dim(d)) break;
      idx[d] = 0;
    }
  }
}

void AddBlockAny(Tensor& whole, const Tensor& part, const std::vector<int64_t>& off,
                 bool assign) {
  switch (whole.dtype()) {
    case DType::kF32: return AddBlock<float>(whole, part, off, assign);
    case DType::kF64: return AddBlock<double>(whole, part, off, assign);
    case DType::kI32: return AddBlock<int32_t>(whole, part, off, assign);
    case DType::kI64: return AddBlock<int64_t>(whole, part, off, assign);
    default:
      if (!assign) {
        OpFail("Assemble: summing partial outputs of dtype ", DTypeName(whole.dtype()),
               " is not supported; all_reduce inside the shard_map or cast to f32");
      }
      // 16-bit: copy through a same-size integer type.
      {
        Tensor w16 = whole, p16 = part;
        const int r = part.rank();
        std::vector<int64_t> idx(r, 0);
        for (int64_t i = 0; i < part.numel(); ++i) {
          int64_t wi = 0;
          for (int d = 0; d < r; ++d) wi = wi * whole.dim(d) + idx[d] + off[d];
          std::memcpy(static_cast<char*>(w16.raw_data()) + 2 * wi,
                      static_cast<const char*>(p16.raw_data()) + 2 * i, 2);
          for (int d = r - 1; d >= 0; --d) {
            if (++idx[d] < part.dim(d)) break;
            idx[d] = 0;
          }
        }
      }
  }
}

}  // namespace

absl::StatusOr<Tensor> Assemble(const Mesh& mesh, const PartitionSpec& spec,
                                absl::Span<const Tensor> device_locals, const SpmdType& type) {
  if (static_cast<int>(device_locals.size()) != mesh.size()) {
    return absl::InternalError("Assemble: one local tensor per rank expected");
  }
  // Device locals come to the host first (their streams finished: RunSpmd waits for them; meta
  // locals come as zeros).
  std::vector<Tensor> host_locals;
  bool any_device = false;
  for (const Tensor& t : device_locals) any_device = any_device || t.is_cuda() || t.is_meta();
  if (any_device) {
    absl::Status moved = CatchOpError([&] {
      for (const Tensor& t : device_locals) host_locals.push_back(t.To(Device::Cpu()));
    });
    if (!moved.ok()) return moved;
  }
  absl::Span<const Tensor> locals =
      any_device ? absl::Span<const Tensor>(host_locals) : device_locals;
  // 16-bit partial sums (gradients of replicated bf16/f16 inputs): summed in f32, then rounded.
  const DType dtype = locals.empty() ? DType::kF32 : locals[0].dtype();
  if (dtype == DType::kBF16 || dtype == DType::kF16) {
    const bool any_sum = (type.AxesOfKind(AxisKind::kP) & ~spec.ShardedMask(mesh)) != 0;
    if (any_sum) {
      std::vector<Tensor> wide;
      absl::Status cast = CatchOpError([&] {
        for (const Tensor& t : locals) {
          if (t.dtype() != dtype) {
            OpFail("Assemble: ranks returned different dtypes: ", t.ShapeString(), " and ",
                   locals[0].ShapeString());
          }
          wide.push_back(Cast(t, DType::kF32));
        }
      });
      if (!cast.ok()) return cast;
      absl::StatusOr<Tensor> sum = Assemble(mesh, spec, wide, type);
      if (!sum.ok()) return sum;
      Tensor narrow;
      absl::Status back = CatchOpError([&] { narrow = Cast(*sum, dtype); });
      if (!back.ok()) return back;
      return narrow;
    }
  }
  AxisMask sharded = spec.ShardedMask(mesh);
  Shape gshape = spec.GlobalShape(mesh, locals[0].shape());
  Tensor whole;
  absl::Status status = CatchOpError([&] {
    whole = Tensor::Zeros(gshape, locals[0].dtype());
    // Unsharded axes: a P axis sums every rank's block, any other takes index 0's.
    const AxisMask partial = type.AxesOfKind(AxisKind::kP) & ~sharded;
    const bool any_sum = partial != 0;
    for (int r = 0; r < mesh.size(); ++r) {
      bool take = true;
      for (int i = 0; i < mesh.num_axes(); ++i) {
        if (!((sharded | partial) & (1u << i)) && mesh.Coord(r, i) != 0) take = false;
      }
      if (!take) continue;
      if (locals[r].shape() != locals[0].shape() || locals[r].dtype() != locals[0].dtype()) {
        OpFail("rank ", r, " returned ", locals[r].ShapeString(), " but rank 0 returned ",
               locals[0].ShapeString(), "; every rank must return the same local shape");
      }
      std::vector<int64_t> off(gshape.size(), 0);
      for (int d = 0; d < spec.size(); ++d) {
        if (spec.dim_axes(d).empty()) continue;
        off[d] = spec.BlockIndex(mesh, r, d) * locals[r].dim(d);
      }
      AddBlockAny(whole, locals[r], off, /*assign=*/!any_sum);
    }
  });
  if (!status.ok()) return status;
  return whole;
}


void CheckOutputType(const Value& out, const Mesh& mesh, const PartitionSpec& spec,
                     const std::string& what) {
  if ((out.type.mesh_id() != 0 && out.type.mesh_id() != mesh.id()) ||
      out.type.num_axes() != mesh.num_axes()) {
    OpFail(what, " ", out.tensor.ShapeString(), out.type.ToString({}),
           " was typed under another mesh than this shard_map's ", mesh.ShortString(),
           "; return values computed inside this shard_map (a Value does not outlive the "
           "program that made it)");
  }
  SpmdType named(mesh.num_axes(), AxisType::R());
  std::vector<int> dim_of(mesh.num_axes(), -1);
  for (int d = 0; d < spec.size(); ++d) {
    for (const std::string& a : spec.dim_axes(d)) dim_of[mesh.AxisIndex(a)] = d;
  }
  AxisMask unreduced = spec.UnreducedMask(mesh);
  if (spec.size() > out.rank()) {
    OpFail(what, " is ", out.ToString(), " but its out_spec ", spec.ToString(), " has ",
           spec.size(), " dims; drop the trailing entries");
  }
  // The name the fix texts use for the output: its option name ("'loss'" -> loss), else output0.
  std::string y = what;
  if (y.size() >= 2 && y.front() == '\'' && y.back() == '\'') {
    y = y.substr(1, y.size() - 2);
  } else {
    y.erase(std::remove(y.begin(), y.end(), ' '), y.end());
  }
  for (int i = 0; i < mesh.num_axes(); ++i) {
    const std::string& ax = mesh.axis_names()[i];
    AxisType t = out.type[i];
    auto fail = [&](const std::string& why, const std::string& fix) {
      OpFail(what, " is ", out.ToString(), " but its out_spec is ", spec.ToString(),
             ": on axis '", ax, "' ", why, ". Fix: ", fix);
    };
    if (unreduced & (1u << i)) {
      if (t.kind != AxisKind::kP) {
        fail(absl::StrCat("the spec says unreduced (a pending sum) but the value is ", KindName(t.kind)),
             absl::StrCat("drop '", ax, "' from the unreduced axes"));
      }
    } else if (dim_of[i] >= 0) {
      if (t.kind == AxisKind::kP) {
        fail("the value is a pending sum (P) but the spec shards it",
             absl::StrCat("reduce_scatter(", y, ", ", dim_of[i], ", \"", ax,
                          "\") before returning, or declare the spec Unreduced({\"", ax, "\"})"));
      }
      if (t.is_sharded() && t.dim != dim_of[i]) {
        fail(absl::StrCat("the value is sharded along dim ", static_cast<int>(t.dim),
                          " but the spec names the axis at dim ", dim_of[i]),
             absl::StrCat("put '", ax, "' at dim ", static_cast<int>(t.dim),
                          " of the out_spec, or all_to_all the value"));
      }
    } else {
      if (t.kind == AxisKind::kP) {
        fail("the value is a pending sum (P) but the spec claims it is replicated",
             absl::StrCat("all_reduce(", y, ", \"", ax, "\") before returning, or declare the spec "
                          "Unreduced({\"", ax, "\"})"));
      }
      if (t.kind == AxisKind::kV) {
        fail(absl::StrCat("the value varies (", t.ToString(),
                          ") but the spec claims it is replicated"),
             t.is_sharded()
                 ? absl::StrCat("name '", ax, "' at dim ", static_cast<int>(t.dim),
                                " of the out_spec, or all_gather(", y, ", ", static_cast<int>(t.dim),
                                ", \"", ax, "\") before returning")
                 : absl::StrCat("name '", ax, "' in the out_spec, or reduce the value over '", ax,
                                "' before returning"));
      }
    }
  }
}

namespace {

uint64_t HashBytes(const Tensor& device_tensor) {
  const Tensor t = device_tensor.To(Device::Cpu());
  uint64_t h = 1469598103934665603ull;
  const unsigned char* p = static_cast<const unsigned char*>(t.raw_data());
  for (size_t i = 0; i < t.nbytes(); ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace

void CheckReplicationAtRuntime(absl::Span<const Value> values, const std::string& what) {
  RankContext& ctx = RankContext::Get("CheckReplicationAtRuntime");
  const Mesh& mesh = ctx.mesh();
  int n = mesh.size();
  std::vector<int64_t> mine(values.size());
  for (size_t k = 0; k < values.size(); ++k) {
    mine[k] = static_cast<int64_t>(HashBytes(values[k].tensor));
  }
  std::vector<int64_t> all(values.size() * n);
  if (!values.empty()) {
    absl::Status s = AllGatherHost(ctx.world(), mine.data(), all.data(), values.size(),
                                   collectives::DataType::kI64);
    if (!s.ok()) throw OpError(s);
  }
  for (size_t k = 0; k < values.size(); ++k) {
    for (int i = 0; i < mesh.num_axes(); ++i) {
      AxisKind kind = values[k].type[i].kind;
      if (kind != AxisKind::kR && kind != AxisKind::kI) continue;
      AxisMask m = 1u << i;
      for (int r = 0; r < n; ++r) {
        int r0 = mesh.GroupMember(r, m, 0);
        if (all[r * values.size() + k] != all[r0 * values.size() + k]) {
          OpFail(what, " value ", k, " is typed ", values[k].ToString(), " (", KindName(kind),
                 " on axis '", mesh.axis_names()[i], "') but differs between rank ", r0,
                 " and rank ", r,
                 "; a convert/reinterpret in the program claims a replication that does not "
                 "hold");
        }
      }
    }
  }
}

}  // namespace shardmap
