#include "autograd/tape.h"

#include <algorithm>
#include <climits>

#include "absl/strings/str_cat.h"
#include "shardmap/context.h"
#include "shardmap/ops.h"
#include "shardmap/type_rules.h"
#include "tensor/error.h"

namespace shardmap {

Value Tape::Watch(const Value& v) {
  if (nodes_.size() >= static_cast<size_t>(kSlotsPerTape)) {
    OpFail("tape: more than ", kSlotsPerTape, " recorded values on one tape");
  }
  Value w = v;
  w.node = first_ + static_cast<int32_t>(nodes_.size());
  nodes_.push_back(Node{"input", {}, nullptr, v.type, v.shape(), v.dtype()});
  return w;
}

int32_t Tape::Adopt(const Value& v) {
  if (v.node < 0 || SlotOf(v.node) >= 0) {
    OpFail("tape: Adopt needs a value of another tape (id ", v.node, "), not a constant or one "
           "of this tape's");
  }
  const int32_t id = Watch(v).node;
  foreign_[v.node] = id - first_;
  return id;
}

int32_t Tape::SlotOf(int32_t id) const {
  if (id >= first_ && id - first_ < static_cast<int32_t>(nodes_.size())) return id - first_;
  if (foreign_.empty()) return -1;
  auto it = foreign_.find(id);
  return it == foreign_.end() ? -1 : it->second;
}

void Tape::Record(const char* op, std::initializer_list<const Value*> inputs, Value& out,
                  VjpFn vjp) {
  if (inputs.size() > 32) {
    OpFail("op '", op, "' has ", inputs.size(), " inputs; a tape node takes at most 32");
  }
  absl::InlinedVector<int32_t, 3> slots;
  for (const Value* v : inputs) {
    int32_t in = v->node;
    if (in >= 0 && (in = SlotOf(v->node)) < 0) {
      OpFail("op '", op, "': its input ", slots.size(), " (", v->ToString(), ") was recorded on "
             "another tape (id ", v->node, "): a value computed inside a checkpointed function "
             "must leave it through its outputs, and a tape's values are dead after Clear()");
    }
    slots.push_back(in);
  }
  if (nodes_.size() >= static_cast<size_t>(kSlotsPerTape)) {
    OpFail("tape: more than ", kSlotsPerTape, " recorded values on one tape");
  }
  // Built in place: a Node carries its VJP's closure inline, so moving one is not free.
  const int32_t slot = static_cast<int32_t>(nodes_.size());
  // 4x regrowth, not 2x: each one moves every node so far (a shape-only step records tens of
  // thousands of them).
  if (nodes_.size() == nodes_.capacity()) {
    nodes_.reserve(std::min<size_t>(kSlotsPerTape, std::max<size_t>(64, 4 * nodes_.capacity())));
  }
  Node& n = nodes_.emplace_back(Node{op, std::move(slots), nullptr, out.type, out.shape(),
                                     out.dtype()});
  n.vjp = std::move(vjp);
  // A view or alias of an input (reshape, SliceRows) holds no buffer of its own: its bytes are
  // its input's, counted there (or not an activation at all: a leaf's, a constant's).
  bool alias = false;
  for (const Value* v : inputs) alias = alias || out.tensor.SharesStorageWith(v->tensor);
  n.bytes = alias || !out.tensor.defined() ? 0 : static_cast<int64_t>(out.tensor.nbytes());
  saved_bytes_ += n.bytes;
  peak_saved_bytes_ = std::max(peak_saved_bytes_, saved_bytes_);
  recorded_bytes_ += n.bytes;
  largest_recorded_bytes_ = std::max(largest_recorded_bytes_, n.bytes);
  out.node = first_ + slot;
}

namespace {

std::string Describe(const Shape& shape, DType dtype, const SpmdType& type) {
  RankContext* ctx = RankContext::Current();
  std::string s = absl::StrCat(DTypeName(dtype), ShapeToString(shape));
  return ctx ? s + type.ToString(ctx->mesh().axis_names()) : s + type.ToString({});
}

bool DualMatches(AxisType primal, AxisType cot) {
  AxisType d = Dual(primal);
  if (d.kind != cot.kind) return false;
  if (d.kind == AxisKind::kV && d.dim >= 0 && cot.dim >= 0 && d.dim != cot.dim) return false;
  return true;
}

// A VJP that reshapes through size-1 dims (sum's keepdim, reshape) may type a cotangent S(e)
// where the primal is S(d) with only size-1 dims between: the same blocks, so it takes d.
void AlignShardDims(const SpmdType& type, const Shape& shape, Value& cot) {
  for (int i = 0; i < type.num_axes() && i < cot.type.num_axes(); ++i) {
    const AxisType p = type[i], c = cot.type[i];
    if (p.is_sharded() && c.is_sharded() && p.dim != c.dim && cot.shape() == shape &&
        SameShardBlocks(shape, p.dim, c.dim)) {
      cot.type[i] = p;
    }
  }
}

}  // namespace

void Tape::CheckCotangent(const Node& consumer, int input_pos, const Node& primal,
                          const Value& cot) const {
  bool ok = cot.shape() == primal.shape && cot.dtype() == primal.dtype;
  for (int i = 0; ok && i < primal.type.num_axes(); ++i) ok = DualMatches(primal.type[i], cot.type[i]);
  if (ok) return;
  OpFail("backward of '", consumer.op, "': the cotangent of its input ", input_pos, " is ",
         Describe(cot.shape(), cot.dtype(), cot.type), " but the primal ",
         Describe(primal.shape, primal.dtype, primal.type), " needs ",
         Describe(primal.shape, primal.dtype, Dual(primal.type)),
         " (the dual type: R<->P, I<->I, V<->V). This is a bug in the VJP of '", consumer.op,
         "' or in a user cast");
}

std::vector<Value> Tape::Backward(const Value& out, const Value& seed,
                                  absl::Span<const Value> wrt, const GradReadyFn& on_ready) {
  return Run({&out, 1}, {&seed, 1}, wrt, /*release=*/false, /*zeros=*/true, on_ready);
}

std::vector<Value> Tape::BackwardAndRelease(const Value& out, const Value& seed,
                                            absl::Span<const Value> wrt,
                                            const GradReadyFn& on_ready) {
  return Run({&out, 1}, {&seed, 1}, wrt, /*release=*/true, /*zeros=*/true, on_ready);
}

std::vector<std::pair<int32_t, int>> Tape::ReadyOrder(absl::Span<const Value> wrt) const {
  std::vector<int32_t> first_use(nodes_.size(), -1);
  for (int32_t i = static_cast<int32_t>(nodes_.size()) - 1; i >= 0; --i) {
    // An op an earlier BackwardAndRelease ran adds nothing more (a cotangent reaching it is an
    // error): a leaf every earlier microbatch used is final below this pass's first use.
    if (nodes_[i].released) continue;
    for (int32_t in : nodes_[i].inputs) {
      if (in >= 0) first_use[in] = i;  // descending i: the smallest consumer wins
    }
  }
  std::vector<std::pair<int32_t, int>> order;  // (the slot below which it is final, k)
  for (size_t k = 0; k < wrt.size(); ++k) {
    const int32_t s = wrt[k].node >= 0 ? SlotOf(wrt[k].node) : -1;
    order.push_back({s >= 0 ? first_use[s] : -1, static_cast<int>(k)});
  }
  // Latest first consumer first (backward order); ties in wrt order.
  std::stable_sort(order.begin(), order.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  return order;
}

std::vector<Value> Tape::Backward(absl::Span<const Value> outs, absl::Span<const Value> seeds,
                                  absl::Span<const Value> wrt) {
  if (outs.size() != seeds.size()) {
    OpFail("Backward: ", outs.size(), " outputs but ", seeds.size(), " seeds");
  }
  return Run(outs, seeds, wrt, /*release=*/false, /*zeros=*/false);
}

// One backward pass (Run): the cotangents by slot (only the slots the pass reaches hold one: a
// vector of every slot, built and torn down per pass, made each microbatch's backward cost the
// whole tape's size), the slots still to visit, and the AtBackwardBelow triggers and on_ready
// reports, fired in the order a slot-by-slot walk gives them.
struct Tape::Pass {
  Pass(Tape& t, absl::Span<const Value> w, bool z, const GradReadyFn& ready_fn)
      : tape(t), wrt(w), zeros(z), on_ready(ready_fn), keep(t.nodes_.size()) {}

  bool Defined(int32_t s) const {
    auto it = grads.find(s);
    return it != grads.end() && it->second.defined();
  }

  // The seeds' cotangents; returns the highest seeded slot (-1: none).
  int32_t Seed(absl::Span<const Value> outs, absl::Span<const Value> seeds) {
    int32_t top = -1;
    for (size_t k = 0; k < outs.size(); ++k) {
      if (outs[k].node < 0) continue;
      const int32_t s = tape.SlotOf(outs[k].node);
      if (s < 0) OpFail("Backward: value not on this tape");
      keep[s] = true;  // its cotangent is kept (it may be asked for in wrt)
      if (!seeds[k].defined()) continue;
      Value& g = grads[s];
      g = g.defined() ? add(g, seeds[k]) : seeds[k];
      top = std::max(top, s);
    }
    return top;
  }

  // wrt's cotangents kept, the reports' and triggers' order, the seeded slots to visit.
  void Schedule(absl::Span<const Value> outs) {
    for (const Value& w : wrt) {
      const int32_t s = w.node >= 0 ? tape.SlotOf(w.node) : -1;
      if (s >= 0) keep[s] = true;
    }
    result.resize(wrt.size());
    if (on_ready) ready = tape.ReadyOrder(wrt);
    // AtBackwardBelow: (slot, fn) by slot, latest first; stable, so one slot's run in order.
    triggers = std::move(tape.triggers_);
    tape.triggers_.clear();
    std::stable_sort(triggers.begin(), triggers.end(),
                     [](const auto& a, const auto& b) { return a.first > b.first; });
    for (const Value& o : outs) {
      const int32_t s = o.node >= 0 ? tape.SlotOf(o.node) : -1;
      if (s >= 0 && Defined(s) && std::find(pending.begin(), pending.end(), s) == pending.end()) {
        pending.push_back(s);
      }
    }
    std::make_heap(pending.begin(), pending.end());
  }

  // wrt[k]'s gradient as returned (and as on_ready sees it).
  void FinalGrad(int k) {
    const Value& w = wrt[k];
    const int32_t s = w.node >= 0 ? tape.SlotOf(w.node) : -1;
    if (s >= 0 && Defined(s)) {
      result[k] = grads.at(s);
    } else if (zeros) {
      result[k] = Value(Tensor::Zeros(w.shape(), w.dtype(), w.tensor.device()), Dual(w.type));
    }
    if (on_ready) on_ready(k, result[k]);
  }
  void Report(int32_t at) {  // every gradient final once the pass is at slot `at`
    for (; reported < ready.size() && ready[reported].first > at; ++reported) {
      FinalGrad(ready[reported].second);
    }
  }
  void Fire(int32_t at) {  // every trigger whose slot is above `at`
    for (; fired < triggers.size() && triggers[fired].first > at; ++fired) triggers[fired].second();
  }
  // Fire(j); Report(j) for every j from above down to `at`, skipping the j where nothing fires
  // or is reported: j = s - 1 for each next trigger or report slot s > at.
  void Advance(int32_t at) {
    for (;;) {
      int32_t s = INT32_MIN;
      if (fired < triggers.size()) s = std::max(s, triggers[fired].first);
      if (reported < ready.size()) s = std::max(s, ready[reported].first);
      if (s == INT32_MIN || s <= at) return;
      Fire(s - 1);
      Report(s - 1);
    }
  }

  // Slot i's VJP: its inputs' cotangents added (the first one of an input puts it on `pending`).
  void Visit(int32_t i, bool release, bool checked) {
    Node& n = tape.nodes_[i];
    if (n.released) {
      OpFail("backward of '", n.op, "' (tape slot ", i, "): a cotangent reached an op whose VJP an "
             "earlier BackwardAndRelease already ran and freed; each op may belong to one "
             "released backward pass only (do not share activations between microbatches)");
    }
    if (!n.vjp) return;
    // Dropped after this node's VJP has run (or at once when it needs nothing).
    struct Release {
      Tape* tape;
      Node* n;
      bool on;
      ~Release() {
        if (!on) return;
        n->vjp = nullptr;
        n->released = true;
        tape->saved_bytes_ -= n->bytes;
      }
    } drop{&tape, &n, release};
    uint32_t need = 0;
    for (size_t k = 0; k < n.inputs.size(); ++k) {
      if (n.inputs[k] >= 0) need |= 1u << k;
    }
    if (need == 0) return;
    if (tape.observer_ != nullptr) tape.observer_->BeforeVjp(n.op);
    cots.assign(n.inputs.size(), Value());
    n.vjp(grads[i], need, cots.data());
    for (size_t k = 0; k < n.inputs.size(); ++k) {
      int32_t in = n.inputs[k];
      if (in < 0 || !cots[k].defined()) continue;
      // Same blocks, the primal's dim: the gradient's type must not depend on checked mode.
      AlignShardDims(tape.nodes_[in].type, tape.nodes_[in].shape, cots[k]);
      if (checked) tape.CheckCotangent(n, static_cast<int>(k), tape.nodes_[in], cots[k]);
      cots[k].node = -1;
      Value& g = grads[in];  // used before any other insertion
      if (!g.defined()) {
        g = std::move(cots[k]);
        if (in < i) {  // inputs precede their op on the tape (a walk down never revisits)
          pending.push_back(in);
          std::push_heap(pending.begin(), pending.end());
        }
      } else {
        g = add(g, cots[k]);
      }
    }
    if (tape.observer_ != nullptr) tape.observer_->AfterVjp(n.op);
    // Free what is no longer needed: this node's cotangent.
    if (!keep[i]) grads.erase(i);
  }

  Tape& tape;
  absl::Span<const Value> wrt;
  bool zeros;
  const GradReadyFn& on_ready;
  // Open addressing: no allocation per cotangent (each reference into it is used before the
  // next insertion, so a rehash moving the values is harmless).
  absl::flat_hash_map<int32_t, Value> grads;
  std::vector<bool> keep;
  std::vector<Value> result;
  std::vector<std::pair<int32_t, int>> ready;
  size_t reported = 0;
  std::vector<std::pair<int32_t, std::function<void()>>> triggers;
  size_t fired = 0;
  std::vector<int32_t> pending;  // the slots holding a cotangent not yet visited (a max-heap)
  absl::InlinedVector<Value, 4> cots;
};

std::vector<Value> Tape::Run(absl::Span<const Value> outs, absl::Span<const Value> seeds,
                             absl::Span<const Value> wrt, bool release, bool zeros,
                             const GradReadyFn& on_ready) {
  RankContext* ctx = RankContext::Current();
  bool checked = ctx == nullptr || ctx->checked();
  Pass pass(*this, wrt, zeros, on_ready);
  NoGradScope no_grad;
  const int32_t top = pass.Seed(outs, seeds);
  bool prev_bwd = ctx ? ctx->in_backward() : false;
  if (ctx) ctx->set_in_backward(true);
  struct Restore {
    RankContext* ctx;
    bool prev;
    Tape* prev_running;
    ~Restore() {
      if (ctx) ctx->set_in_backward(prev);
      running_ = prev_running;
    }
  } restore{ctx, prev_bwd, running_};
  running_ = this;
  pass.Schedule(outs);
  // The pass visits the slots holding a cotangent only, latest first, not every slot below
  // `top` (a microbatch's backward on a tape of many microbatches' ops).
  if (top >= 0) {  // the walk's first slot: everything above it at once, triggers first
    pass.Fire(top);
    pass.Report(top);
  }
  while (!pass.pending.empty()) {
    std::pop_heap(pass.pending.begin(), pass.pending.end());
    const int32_t i = pass.pending.back();
    pass.pending.pop_back();
    pass.Advance(i);  // every op from the trigger's slot on has had its VJP; every consumer above i
    pass.Visit(i, release, checked);
  }
  if (top >= 0) pass.Advance(0);  // the walk's slots below the last cotangent, down to 0
  pass.Fire(INT32_MIN);
  pass.Report(-2);  // the rest, unused ones (-1) included
  if (!on_ready) {
    for (size_t k = 0; k < wrt.size(); ++k) pass.FinalGrad(static_cast<int>(k));
  }
  return std::move(pass.result);
}

}  // namespace shardmap
