#include "shardmap/async_collectives.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "collectives/communicator.h"
#include "shardmap/collective_ops.h"
#include "shardmap/context.h"
#include "shardmap/internal/collective_call.h"
#include "shardmap/internal/typing.h"
#include "shardmap/type_rules.h"
#include "tensor/error.h"

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

}  // namespace shardmap
