// Typed collectives and casts (docs/design.md section 4.3), each with its transpose for autograd.
//
//   Value y  = all_reduce(yp, "tp");                 // P -> R          bwd: all_reduce
//   Value l  = all_reduce(lp, "tp", To::kI);         // P -> I          bwd: convert I->R (free)
//   Value m  = all_reduce(v, {"dp", "tp"}, To::kR, ReduceKind::kMax);  // V -> R, grad to arg-max
//   Value xf = all_gather(xs, 0, "tp");              // S0 -> R         bwd: reduce_scatter
//   Value xs = reduce_scatter(yp, 0, "tp");          // P -> S0         bwd: all_gather
//   Value z  = all_to_all(x, /*split_dim=*/1, /*concat_dim=*/0, "cp");  // S0 -> S1
//   Value n  = ppermute(x, "pp", {{0, 1}, {1, 2}, {2, 0}});           // V -> V
//   Value r  = convert(x, "tp", Convert::kIToR);     // I -> R          bwd: all_reduce P -> I
//   Value p  = convert(x, "tp", Convert::kRToP);     // R -> P (value kept on tp index 0)
//   Value q  = reinterpret(x, "dp");                 // V -> P (same bits, new meaning)
//   int i    = axis_index("tp");
//
// Several axes at once act as one group ordered row-major in mesh order (first axis major),
// matching how a spec dim split over several axes orders its blocks. Each op checks that its
// input has the type the table requires on those axes (errors name the op, the operand, the axis
// and the fix) and leaves the other axes' types alone.
//
// Settled here (docs/design.md is silent):
//   * all_reduce with kMean/kMax/kMin takes V (per-device values) to R/I; kSum takes P.
//     kMean's transpose gives each device g/n (an all_reduce of the cotangent for To::kR);
//     kMax/kMin send the cotangent to the device that holds the extreme value (lowest index on
//     ties), found in the backward pass with one extra all_reduce(min).
//   * all_to_all(x, split_dim, concat_dim) follows JAX: the local split_dim is cut into n chunks,
//     chunk j goes to device j, received chunks are concatenated along concat_dim; so the input
//     is S(concat_dim) (or V) and the output S(split_dim).
//   * gathering/scattering some of the axes that shard a dim keeps S on the others only when the
//     gathered axes are the minor ones (in mesh order); otherwise the others become V.
//   * broadcast(x, axes, root): R or V -> R; transpose: the summed cotangent lands on the root.
//   * split_sizes: uneven chunks (split_sizes[i] = the dim's length on group index i).
//   * devices (GPU ranks, context.h DevicePlacement): outputs live on the input's device; an
//     operand on another device than the communicator's memory (e.g. a host tensor in a GPU
//     rank) is an error naming both. A group of one device holding a GPU tensor is a device
//     copy (no communicator call). Under CUDA graph capture (tensor/cuda/graph.h) only
//     communicators that support it (NCCL) are called; in-process ones are refused with an
//     error that says to use NCCL or run eagerly.
#ifndef SHARDMAP_SHARDMAP_OPS_COLLECTIVE_OPS_H_
#define SHARDMAP_SHARDMAP_OPS_COLLECTIVE_OPS_H_

#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "shardmap/mesh.h"
#include "shardmap/axis_names.h"
#include "shardmap/value.h"

namespace shardmap {

// One or several mesh axes: "tp", {"dp", "tp"}.
enum class To : uint8_t { kR, kI };
enum class ReduceKind : uint8_t { kSum, kMean, kMax, kMin };
enum class Convert : uint8_t { kIToR, kRToP };

Value all_reduce(const Value& x, const Axes& axes, To to = To::kR,
                 ReduceKind op = ReduceKind::kSum);
Value all_gather(const Value& x, int dim, const Axes& axes, To to = To::kR);
Value all_gather(const Value& x, int dim, const Axes& axes,
                 const std::vector<int64_t>& split_sizes, To to = To::kR);
Value reduce_scatter(const Value& x, int dim, const Axes& axes);
Value reduce_scatter(const Value& x, int dim, const Axes& axes,
                     const std::vector<int64_t>& split_sizes);
Value all_to_all(const Value& x, int split_dim, int concat_dim, const Axes& axes);
// Uneven: split_sizes[j] rows of split_dim go to group index j; concat_sizes[j] is the
// concat_dim length that group index j holds (and sends). Same vectors on every device;
// split_dim != concat_dim. Its transpose swaps the dims and the size vectors.
Value all_to_all(const Value& x, int split_dim, int concat_dim, const Axes& axes,
                 const std::vector<int64_t>& split_sizes,
                 const std::vector<int64_t>& concat_sizes);
// pairs (source, destination) of group indices along `axes`; a device that is no destination
// gets zeros.
Value ppermute(const Value& x, const Axes& axes, std::vector<std::pair<int, int>> pairs);
Value broadcast(const Value& x, const Axes& axes, int root = 0);
Value convert(const Value& x, const Axes& axes, Convert c);
Value reinterpret(const Value& x, const Axes& axes);
// R -> V: the implicit promotion of binary ops, made explicit (bwd: the V cotangent is
// reinterpreted as P, no communication). Needed before device-dependent indexing of a
// replicated value (e.g. slicing at an offset computed from axis_index), which the types cannot
// see: slice(vary(w, "tp"), 0, axis_index("tp") * n, n).
Value vary(const Value& x, const Axes& axes);
// R or V (S(d) included) -> V of unknown layout, declared: the program means per-device values
// here. The opt-in for the contractions the types reject by default (docs/design.md 4.2, type
// algebra: operands sharded over one axis on different dims), e.g. ring attention's blocks:
//   Value s = einsum("bhsd,bhtd->bhst", as_varying(q, "cp"), k_block);   // V on cp
// Errors a V causes later name this op as its origin, without blaming it. No communication;
// bwd: identity (an R operand's cotangent is reinterpreted as P, as for vary).
Value as_varying(const Value& x, const Axes& axes);

// This device's index along `axes` (row-major over them in mesh order).
int axis_index(const Axes& axes);
// The same, as a rank-0 tensor typed V on those axes (R elsewhere).
Value axis_index_value(const Axes& axes, DType dtype = DType::kF32);

// The mask of `axes` in the current context's mesh; OpError on unknown/repeated axes.
AxisMask ResolveAxes(const char* op, const Axes& axes);

// The axes (names, in mesh order) where x's type is of kind k on the running mesh; empty when
// none. E.g. the axes a gradient is still a pending sum over:
//   Axes p = AxesWhere(g, AxisKind::kP);
Axes AxesWhere(const Value& x, AxisKind k);
// all_reduce(x, AxesWhere(x, AxisKind::kP)) as one collective over those axes, or x itself when
// it is a pending sum over none: resolves a gradient's (or a loss's) partial sums.
Value all_reduce_partial(const Value& x);

}  // namespace shardmap

#endif  // SHARDMAP_SHARDMAP_OPS_COLLECTIVE_OPS_H_
