#include "shardmap/internal/collective_call.h"

#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "shardmap/ops/collective_ops.h"
#include "shardmap/internal/typing.h"
#include "tensor/cuda/graph.h"
#include "tensor/error.h"

namespace shardmap::internal {

int NormalizeDim(const char* op, const Value& x, int dim) {
  const int d = dim < 0 ? dim + x.rank() : dim;
  if (d < 0 || d >= x.rank()) OpFail(op, ": dim ", dim, " out of range for ", x.ToString());
  return d;
}

CollectiveCall::CollectiveCall(Collective c, const Value& x, const Axes& axes, Dims dims,
                               const char* op)
    : rule_(&CollectiveRuleFor(c)), op_(op != nullptr ? op : rule_->api), start_us_(SteadyClockUs()) {
  CheckMesh(op_, x, "x");
  mask_ = ResolveAxes(op_, axes);
  ctx_ = &RankContext::Get(op_);
  if (dims.check != kNoDim) check_dim_ = NormalizeDim(op_, x, dims.check);
  if (dims.result != kNoDim) result_dim_ = NormalizeDim(op_, x, dims.result);
  const int rule_check = check_dim_ == kNoDim ? -1 : check_dim_;
  const int rule_result = result_dim_ == kNoDim ? -1 : result_dim_;
  if (ctx_->checked()) {
    if (std::optional<Rejection> no = CheckCollective(*rule_, x.type, mask_, rule_check)) {
      TypeFail(op != nullptr ? op : rule_->name, no->axis, no->rule, no->fix, {{"x", &x}});
    }
  }
  type_ = CollectiveResult(*rule_, x.type, mask_, rule_result, dims.invariant);
  if (HasUnstampedV(type_)) {
    const bool moves_blocks = rule_->result == CollectiveResultKind::kV ||
                              rule_->result == CollectiveResultKind::kKeepV;
    StampOrigins(op_, type_, {{"x", &x}},
                 moves_blocks ? "the collective moves per-device blocks (their layout is the "
                                "program's)"
                              : "it gathers or scatters an axis more major than another axis "
                                "that shards the same dim, which then loses its layout",
                 moves_blocks ? "combine the blocks with the collective the program means"
                              : "gather or scatter the minor axis first (or both at once)",
                 moves_blocks ? VKind::kIntended : VKind::kLayoutLost);
  }
  if (rule_->communicates) {
    comm_ = &ctx_->CommFor(op_, mask_, x.tensor, dims.ragged ? check_dim_ : -1);
  }
}

void CollectiveCall::CheckMemory(const Tensor& t) const {
  const collectives::MemorySpace m = comm_->memory_space();
  const Device want = m.meta     ? Device::Meta()
                      : m.device ? Device::Cuda(m.device_index)
                                 : Device::Cpu();
  if (t.device() == want) {
    if (t.is_cuda() && !comm_->SupportsGraphCapture() && cuda::IsCapturing(t.device().index)) {
      OpFail(op_, ": cannot be captured in a CUDA graph: the communicator ", comm_->name(),
             " synchronises with the host in every call (in-process collectives of virtual "
             "ranks); capture steps of one-GPU-per-process programs over NCCL "
             "(RunOnCommunicator), or run this step eagerly");
    }
    return;
  }
  OpFail(op_, ": the operand ", t.ShapeString(), " lives on ", t.device().ToString(),
         " but the communicator of axes ", ctx_->mesh().MaskToString(mask_), " works on ",
         want.ToString(), " memory (", RankDescription(ctx_->mesh(), ctx_->rank()), " runs on ",
         ctx_->device().ToString(), "); create per-device tensors on ctx.device() "
         "(Tensor::Empty(shape, dtype, ctx.device())) or move them there with Tensor::To");
}

void CollectiveCall::Check(const absl::Status& s) const {
  if (s.ok()) return;
  throw OpError(absl::Status(s.code(), absl::StrCat("while running ", op_, " over axes ",
                                                    ctx_->mesh().MaskToString(mask_), ": ",
                                                    s.message())));
}

void CollectiveCall::Log(const Tensor& sent) const {
  ctx_->LogCollective(rule_->api, mask_, static_cast<int64_t>(sent.nbytes()), sent.dtype(),
                      start_us_);
}

}  // namespace shardmap::internal
