// The preamble every typed collective runs, written once (collective_ops.cc and
// async_collectives.cc use it): x defined and of the running mesh, the axes resolved, the op's
// dims normalised, the type rule of the collectives table applied (checked mode throws its
// rejection with x) and, for the collectives that move data, the communicator of the axes
// tagged for the agreement check. The steps around the transfer (the memory check, the
// status check and the log) are methods, so every collective names its op and axes alike.
//
//   CollectiveCall c(Collective::kAllGather, x, axes, {.check = dim, .result = dim});
//   c.CheckMemory(x.tensor);
//   Tensor out = ...;
//   c.Check(c.comm().AllGather(x.tensor.raw_data(), out.raw_data(), ...));
//   c.Log(x.tensor);                       // bytes and dtype this rank contributed
//   return Value(std::move(out), c.type());  // the table's result type
#ifndef SHARDMAP_SHARDMAP_INTERNAL_COLLECTIVE_CALL_H_
#define SHARDMAP_SHARDMAP_INTERNAL_COLLECTIVE_CALL_H_

#include <climits>

#include "absl/status/status.h"
#include "collectives/communicator.h"
#include "shardmap/axis_names.h"
#include "shardmap/runtime/context.h"
#include "shardmap/rules/type_rules.h"
#include "shardmap/value.h"

namespace shardmap::internal {

// "The op has no such dim" (a dim of -1 means the last one).
inline constexpr int kNoDim = INT_MIN;

struct CollectiveDims {
  int check = kNoDim;      // the dim the rule checks S against (negative: from the end)
  int result = kNoDim;     // the dim the result is sharded or gathered along
  bool invariant = false;  // To::kI: the rule's R results are I
  bool ragged = false;     // the check dim's size may differ across ranks (uneven variants)
};

class CollectiveCall {
 public:
  using Dims = CollectiveDims;

  // op: the name messages and the agreement tag use; nullptr: the table's API name.
  CollectiveCall(Collective c, const Value& x, const Axes& axes, Dims dims = {},
                 const char* op = nullptr);

  const char* op() const { return op_; }
  RankContext& ctx() const { return *ctx_; }
  AxisMask mask() const { return mask_; }
  const CollectiveRule& rule() const { return *rule_; }
  // The result type the table gives x over mask.
  const SpmdType& type() const { return type_; }
  // The normalised dims (kNoDim when not given).
  int check_dim() const { return check_dim_; }
  int result_dim() const { return result_dim_; }
  // The communicator of the axes (collectives that move data; the casts have none).
  collectives::Communicator& comm() const { return *comm_; }
  int group_size() const { return comm_->size(); }
  int group_index() const { return comm_->rank(); }

  // A group of one device holding a GPU tensor: the collective is a device copy (no call into
  // the communicator, so a single-rank context works on a GPU and can be graph-captured).
  bool TrivialOnDevice(const Tensor& t) const { return comm_->size() == 1 && t.is_cuda(); }
  // Throws OpError unless t lives in the communicator's memory (and, under CUDA graph capture,
  // the communicator can be captured).
  void CheckMemory(const Tensor& t) const;
  // Throws OpError "while running <op> over axes <axes>: ..." on a failed transfer.
  void Check(const absl::Status& s) const;
  // Logs the collective (the table's API name, the axes, sent's bytes and dtype) in this
  // rank's log and its CollectiveRecorders.
  void Log(const Tensor& sent) const;

 private:
  const CollectiveRule* rule_;
  const char* op_;
  RankContext* ctx_;
  AxisMask mask_ = 0;
  int check_dim_ = kNoDim;
  int result_dim_ = kNoDim;
  SpmdType type_;
  collectives::Communicator* comm_ = nullptr;
  double start_us_ = 0;  // when the call began (the log's span)
};

// Throws OpError "<op>: dim <dim> out of range for <x>", else the dim in [0, rank).
int NormalizeDim(const char* op, const Value& x, int dim);

}  // namespace shardmap::internal

#endif  // SHARDMAP_SHARDMAP_INTERNAL_COLLECTIVE_CALL_H_
