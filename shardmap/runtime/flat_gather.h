// A started all-gather of several shards in one collective (FSDP2's flat all-gather, Megatron's
// parameter buffer): the shards are copied into one contiguous buffer, the buffer is gathered
// by one call, and each parameter is copied out of the gathered rows. In the backward, the
// cotangents are packed the same way and reduced by one reduce-scatter. One call per unit
// instead of one per parameter: the latency term of a block's 12 parameters is paid once.
//
//   PendingFlatGather g = all_gather_flat_start({w_qkv, b_qkv, w_o}, {1, 0, 0}, {"dp_shard"},
//                                               DType::kBF16);
//   ... the previous block computes ...
//   std::vector<Value> full = g.Wait();   // full[k] = cast(all_gather(shard k, dims[k]), bf16)
//
// Numbers and types are those of all_gather_start on each shard alone (bitwise: a gather moves
// bits, and the reduce-scatter sums each element in rank order wherever it sits in the buffer,
// as grad_buckets.h relies on). Shard k's type is checked as all_gather's (S(dims[k]) or V on
// the axes); they must share one dtype and device. The collective log holds one
// "all_gather_start" (and in the backward one "reduce_scatter_start") of the packed bytes.
//
// Autograd (when a shard is on a tape): each shard records a start op (shard -> an empty token)
// and Wait() a wait op per shard (token -> the gathered value). The wait ops' VJPs, which run
// one after another when the backward pass reaches the point where Wait() was called, hand
// their cotangents to a shared pack; the last one starts the flat reduce-scatter (in each
// shard's own dtype: FSDP2's reduce_dtype). The start ops' VJPs, which run where the start
// was called, wait for it and return each shard's slice; so the reduce-scatter overlaps the
// VJPs recorded between start and Wait(), as all_gather_start's does. A cotangent that never
// arrives (a gathered value nothing used) is a zero in the pack.
//
// The backward alone, off the tape (FSDP in pipeline stages, models/train/stage_fsdp.h, which
// accumulates the gathered parameters' gradients over microbatches and reduces them once):
//
//   PendingFlatScatter s = reduce_scatter_flat_start({g_qkv, g_o}, {1, 0}, {"dp_shard"},
//                                                    {w_qkv.type, w_o.type});
//   ... the backward of earlier layers runs ...
//   std::vector<Value> shard_grads = s.Wait();  // bitwise reduce_scatter(g_k, dims[k], axes)
#ifndef SHARDMAP_SHARDMAP_RUNTIME_FLAT_GATHER_H_
#define SHARDMAP_SHARDMAP_RUNTIME_FLAT_GATHER_H_

#include <memory>
#include <optional>
#include <vector>

#include "shardmap/axis_names.h"
#include "shardmap/value.h"

namespace shardmap {

class PendingFlatGather {
 public:
  PendingFlatGather();
  PendingFlatGather(PendingFlatGather&&) noexcept;
  PendingFlatGather& operator=(PendingFlatGather&&) noexcept;
  ~PendingFlatGather();

  // The gathered values, one per shard, in order. Wait exactly once. Throws OpError.
  [[nodiscard]] std::vector<Value> Wait();
  bool pending() const { return state_ != nullptr; }

  struct State;

 private:
  friend PendingFlatGather all_gather_flat_start(const std::vector<Value>&,
                                                 const std::vector<int>&, const Axes&,
                                                 std::optional<DType>);
  std::unique_ptr<State> state_;
};

// Gathers shards[k] along dims[k] over `axes` (each S(dims[k]) or V there -> R), in one call.
// gather_dtype: cast each shard to it before the transfer (FSDP2's param_dtype). Throws OpError
// (no shards, dims of another length, mixed dtypes or devices, a type all_gather rejects).
[[nodiscard]] PendingFlatGather all_gather_flat_start(
    const std::vector<Value>& shards, const std::vector<int>& dims, const Axes& axes,
    std::optional<DType> gather_dtype = std::nullopt);

// A started reduce-scatter of several full gradients in one collective; Wait() exactly once
// (as PendingValue: a handle dropped unwaited poisons the in-process world).
class PendingFlatScatter {
 public:
  PendingFlatScatter();
  PendingFlatScatter(PendingFlatScatter&&) noexcept;
  PendingFlatScatter& operator=(PendingFlatScatter&&) noexcept;
  ~PendingFlatScatter();

  // This device's block of each summed gradient, in order, typed as the cotangent of its shard
  // (shard_types[k]). Throws OpError.
  [[nodiscard]] std::vector<Value> Wait();
  bool pending() const { return state_ != nullptr; }

  struct State;

 private:
  friend PendingFlatScatter reduce_scatter_flat_start(const std::vector<Value>&,
                                                      const std::vector<int>&, const Axes&,
                                                      const std::vector<SpmdType>&);
  std::unique_ptr<State> state_;
};

// Sums grads[k] (P on `axes`, off the tape) over `axes` and keeps this device's block of
// dims[k], in one call: all_gather_flat_start's backward (the same packing and numbers as
// reduce_scatter of each gradient alone). shard_types[k]: the type of the shard whose gathered
// value grads[k] is the gradient of (its cotangent's type is stated from it). Throws OpError
// (no gradients, lists of other lengths, mixed dtypes or devices, a type or size
// reduce_scatter rejects).
[[nodiscard]] PendingFlatScatter reduce_scatter_flat_start(
    const std::vector<Value>& grads, const std::vector<int>& dims, const Axes& axes,
    const std::vector<SpmdType>& shard_types);

}  // namespace shardmap

#endif  // SHARDMAP_SHARDMAP_RUNTIME_FLAT_GATHER_H_
