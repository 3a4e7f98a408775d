#include "shardmap/runtime/async_collectives.h"

#include <functional>
#include <string>

#include "absl/strings/str_cat.h"
#include "collectives/communicator.h"
#include "shardmap/ops/collective_ops.h"
#include "shardmap/runtime/context.h"
#include "shardmap/internal/collective_call.h"
#include "shardmap/internal/typing.h"
#include "shardmap/ops/ops.h"
#include "shardmap/rules/type_rules.h"
#include "tensor/error.h"
#include "tensor/ops/shape_ops.h"

namespace shardmap {
namespace {

using Pairs = std::vector<std::pair<int, int>>;

constexpr const char* kStart = "ppermute_start";
constexpr const char* kWait = "ppermute_wait";

void ThrowIfError(const absl::Status& s, const char* op, AxisMask mask) {
  if (s.ok()) return;
  RankContext* ctx = RankContext::Current();
  throw OpError(absl::Status(
      s.code(), absl::StrCat("while running ", op, " over axes ",
                             ctx ? ctx->mesh().MaskToString(mask) : "?", ": ", s.message())));
}

// What the backward pass hands from Wait()'s VJP (which starts the inverse transfer of the
// cotangent) to the start's VJP (which waits for it).
struct Backward {
  PendingPpermute transfer;
};

}  // namespace

struct PendingPpermute::State {
  Value x;     // the send buffer: kept alive until the transfer is over
  Tensor out;  // the receive buffer
  SpmdType type;
  AxisMask mask = 0;
  // Autograd, when x is on a tape: the token joining start and Wait() on the tape.
  Value token;
  std::shared_ptr<Backward> backward;
  Axes axes;
  Pairs inverse;
  // Last: destroyed first, so an abandoned transfer is over before its buffers are freed.
  std::unique_ptr<collectives::PendingCollective> call;
};

PendingPpermute::PendingPpermute() = default;
PendingPpermute::PendingPpermute(PendingPpermute&&) noexcept = default;
PendingPpermute& PendingPpermute::operator=(PendingPpermute&&) noexcept = default;
PendingPpermute::~PendingPpermute() = default;

PendingPpermute ppermute_start(const Value& x, const Axes& axes, Pairs pairs) {
  const internal::CollectiveCall c(Collective::kPpermute, x, axes, {}, kStart);
  const AxisMask mask = c.mask();
  const int n = c.group_size();
  std::vector<bool> src(n), dst(n);
  for (auto [s, d] : pairs) {
    if (s < 0 || s >= n || d < 0 || d >= n || src[s] || dst[d]) {
      OpFail(kStart, ": invalid pair (", s, ",", d, ") for ", n,
             " devices: each index at most once as source and once as destination");
    }
    src[s] = dst[d] = true;
  }
  c.CheckMemory(x.tensor);
  auto st = std::make_unique<PendingPpermute::State>();
  st->x = x;
  st->out = Tensor::Empty(x.shape(), x.dtype(), x.tensor.device());
  st->type = c.type();
  st->mask = mask;
  absl::StatusOr<std::unique_ptr<collectives::PendingCollective>> call =
      c.comm().PpermuteStart(x.tensor.raw_data(), st->out.raw_data(), x.numel(),
                             static_cast<collectives::DataType>(x.dtype()), pairs);
  c.Check(call.status());
  st->call = std::move(*call);
  c.Log(x.tensor);
  if (internal::NeedsTape(x)) {
    auto backward = std::make_shared<Backward>();
    st->token = Value(Tensor::Empty({0}, x.dtype(), x.tensor.device()), st->type);
    const SpmdType xt = x.type;
    internal::RecordOp(kStart, {&x}, st->token,
                       [backward, xt](const Value&, uint32_t, Value* d) {
      if (!backward->transfer.pending()) {
        OpFail("backward of ppermute_start: the backward of its ppermute_wait did not run first "
               "(the tape runs VJPs in reverse order; this is a bug in the tape)");
      }
      // The table's transpose: ppermute with the inverse pairs (started by Wait()'s VJP).
      d[0] = internal::AsCotangent(backward->transfer.Wait(), xt);
    });
    st->backward = std::move(backward);
    st->axes = axes;
    for (auto [s, d] : pairs) st->inverse.push_back({d, s});
  }
  PendingPpermute p;
  p.state_ = std::move(st);
  return p;
}

Value PendingPpermute::Wait() {
  if (state_ == nullptr) {
    OpFail(kWait, ": this handle was already waited (or moved from); wait each ppermute_start "
           "exactly once");
  }
  std::unique_ptr<State> st = std::move(state_);
  ThrowIfError(st->call->Wait(), kWait, st->mask);
  Value y(st->out, st->type);
  if (st->backward != nullptr && internal::NeedsTape(st->token)) {
    internal::RecordOp(kWait, {&st->token}, y,
                       [backward = st->backward, axes = st->axes, inverse = st->inverse,
                        token_type = st->token.type](const Value& g, uint32_t, Value* d) {
      // Starts the transpose's transfer; the start's VJP, run later, waits for it.
      backward->transfer = ppermute_start(g, axes, inverse);
      d[0] = Value(Tensor::Empty({0}, g.dtype(), g.tensor.device()), Dual(token_type));
    });
  }
  return y;
}

// ---------------------------------------------------------------------------------------------
// all_reduce_start, reduce_scatter_start, all_gather_start.

namespace {

// What Wait()'s VJP of an all_gather_start hands to the start's VJP: the started reduce-scatter
// of the cotangent.
struct GatherBackward {
  PendingValue scatter;
  DType grad_dtype;  // the gathered input's: the cotangent is reduced in it
};

}  // namespace

struct PendingValue::State {
  const char* op = "";
  Value x;      // what the caller passed: kept alive until the call is over
  Tensor send;  // the buffer sent (x's, or a contiguous transposed copy)
  Tensor out;   // the receive buffer
  SpmdType type;
  AxisMask mask = 0;
  int back_dim = 0;  // the result is transposed (0, back_dim) after the call when > 0
  RankContext* ctx = nullptr;  // whose log holds the call, at log_index (its span ends at Wait)
  size_t log_index = 0;
  // all_gather_start on a tape: the token joining start and Wait(), and the backward's handoff.
  Value token;
  std::shared_ptr<GatherBackward> backward;
  Axes axes;
  // Last: destroyed first, so an abandoned call is over before its buffers are freed.
  std::unique_ptr<collectives::PendingCollective> call;
};

struct PendingValueAccess {
  static PendingValue Make(std::unique_ptr<PendingValue::State> st) {
    PendingValue p;
    p.state_ = std::move(st);
    return p;
  }
};

PendingValue::PendingValue() = default;
PendingValue::PendingValue(PendingValue&&) noexcept = default;
PendingValue& PendingValue::operator=(PendingValue&&) noexcept = default;
PendingValue::~PendingValue() = default;

namespace {

collectives::DataType DT(DType t) { return static_cast<collectives::DataType>(t); }

// The state of a call on x along dim (moved to the front for the communicator's row layout).
std::unique_ptr<PendingValue::State> NewCall(const internal::CollectiveCall& c, const char* op,
                                             const Value& x, int dim, Shape out_shape) {
  c.CheckMemory(x.tensor);
  auto st = std::make_unique<PendingValue::State>();
  st->op = op;
  st->x = x;
  st->send = dim == 0 ? x.tensor : Transpose(x.tensor, 0, dim);
  if (dim > 0) std::swap(out_shape[0], out_shape[dim]);
  st->out = Tensor::Empty(out_shape, x.dtype(), x.tensor.device());
  st->type = c.type();
  st->mask = c.mask();
  st->back_dim = dim;
  return st;
}

using StartFn =
    std::function<absl::StatusOr<std::unique_ptr<collectives::PendingCollective>>()>;

// Starts the call (a device copy on a one-device GPU group: TrivialOnDevice), logs it as
// `sent` and remembers where, so Wait() can end its span.
void Launch(const internal::CollectiveCall& c, PendingValue::State& st, const Tensor& sent,
            const StartFn& start) {
  if (c.TrivialOnDevice(sent)) {
    st.out = st.send.Clone();
  } else {
    absl::StatusOr<std::unique_ptr<collectives::PendingCollective>> call = start();
    c.Check(call.status());
    st.call = std::move(*call);
  }
  c.Log(sent);
  st.ctx = &c.ctx();
  st.log_index = c.ctx().collective_log().size() - 1;
}

void RefuseTape(const char* op, const Value& x) {
  if (!internal::NeedsTape(x)) return;
  OpFail(op, ": ", x.ToString(), " is being recorded on a tape; ", op,
         " is for values off the tape (gradients). Use the blocking op, which is "
         "differentiable, or call it under NoGradScope");
}

}  // namespace

PendingValue all_reduce_start(const Value& x, const Axes& axes) {
  constexpr const char* kOp = "all_reduce_start";
  RefuseTape(kOp, x);
  const internal::CollectiveCall c(Collective::kAllReduceSum, x, axes, {}, kOp);
  auto st = NewCall(c, kOp, x, 0, x.shape());
  Launch(c, *st, x.tensor, [&] {
    return c.comm().AllReduceStart(st->send.raw_data(), st->out.raw_data(), x.numel(),
                                   DT(x.dtype()), collectives::ReduceOp::kSum);
  });
  return PendingValueAccess::Make(std::move(st));
}

PendingValue reduce_scatter_start(const Value& x, int dim, const Axes& axes) {
  constexpr const char* kOp = "reduce_scatter_start";
  RefuseTape(kOp, x);
  const internal::CollectiveCall c(Collective::kReduceScatter, x, axes,
                                   {.check = dim, .result = dim}, kOp);
  dim = c.check_dim();
  const int n = c.group_size();
  if (x.dim(dim) % n != 0) {
    OpFail(kOp, ": dim ", dim, " of ", x.ToString(), " (size ", x.dim(dim),
           ") is not divisible by the ", n, " devices of axes ",
           c.ctx().mesh().MaskToString(c.mask()));
  }
  Shape out_shape = x.shape();
  out_shape[dim] /= n;
  auto st = NewCall(c, kOp, x, dim, out_shape);
  Launch(c, *st, x.tensor, [&] {
    return c.comm().ReduceScatterStart(st->send.raw_data(), st->out.raw_data(), st->out.numel(),
                                       DT(x.dtype()), collectives::ReduceOp::kSum);
  });
  return PendingValueAccess::Make(std::move(st));
}

PendingValue all_gather_start(const Value& x, int dim, const Axes& axes,
                              std::optional<DType> gather_dtype) {
  constexpr const char* kOp = "all_gather_start";
  const internal::CollectiveCall c(Collective::kAllGather, x, axes,
                                   {.check = dim, .result = dim}, kOp);
  dim = c.check_dim();
  Shape out_shape = x.shape();
  out_shape[dim] *= c.group_size();
  // The cast before the transfer (not recorded: the start's VJP casts the cotangent back).
  Value sent = x;
  if (gather_dtype.has_value() && *gather_dtype != x.dtype()) {
    NoGradScope no_tape;
    sent = cast(Value(x.tensor, x.type), *gather_dtype);
  }
  auto st = NewCall(c, kOp, sent, dim, out_shape);
  Launch(c, *st, sent.tensor, [&] {
    return c.comm().AllGatherStart(st->send.raw_data(), st->out.raw_data(), st->send.numel(),
                                   DT(sent.dtype()));
  });
  if (internal::NeedsTape(x)) {
    auto backward = std::make_shared<GatherBackward>();
    backward->grad_dtype = x.dtype();
    st->token = Value(Tensor::Empty({0}, sent.dtype(), x.tensor.device()), st->type);
    internal::RecordOp(kOp, {&x}, st->token,
                       [backward, xt = x.type](const Value&, uint32_t, Value* d) {
      if (!backward->scatter.pending()) {
        OpFail("backward of all_gather_start: the backward of its Wait() did not run first "
               "(the tape runs VJPs in reverse order; this is a bug in the tape)");
      }
      d[0] = internal::AsCotangent(backward->scatter.Wait(), xt);  // all_gather's transpose
    });
    st->backward = std::move(backward);
    st->axes = axes;
  }
  return PendingValueAccess::Make(std::move(st));
}

Value PendingValue::Wait() {
  if (state_ == nullptr) {
    OpFail("PendingValue::Wait: this handle was already waited (or moved from); wait each "
           "started collective exactly once");
  }
  std::unique_ptr<State> st = std::move(state_);
  if (st->call != nullptr) ThrowIfError(st->call->Wait(), st->op, st->mask);
  if (st->ctx != nullptr && st->ctx == RankContext::Current()) st->ctx->EndCollective(st->log_index);
  Value y(st->back_dim > 0 ? Transpose(st->out, 0, st->back_dim) : st->out, st->type);
  if (st->backward != nullptr && internal::NeedsTape(st->token)) {
    internal::RecordOp("all_gather_wait", {&st->token}, y,
                       [backward = st->backward, axes = st->axes, dim = st->back_dim,
                        token_type = st->token.type](const Value& g, uint32_t, Value* d) {
      // Starts the transpose (reduce-scatter, in the input's dtype); the start's VJP, run
      // later, waits for it.
      backward->scatter = reduce_scatter_start(
          g.dtype() == backward->grad_dtype ? g : cast(g, backward->grad_dtype), dim, axes);
      d[0] = Value(Tensor::Empty({0}, g.dtype(), g.tensor.device()), Dual(token_type));
    });
  }
  return y;
}

}  // namespace shardmap
