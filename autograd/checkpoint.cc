#include "autograd/checkpoint.h"

#include <array>
#include <memory>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "autograd/tape.h"
#include "shardmap/context.h"
#include "shardmap/tape_hook.h"
#include "tensor/error.h"

namespace shardmap {
namespace {

thread_local int recompute_depth = 0;
thread_local int id_space_depth = 0;

// A range of tape ids of its own for a probe or a recomputation's tape (nested ones take the
// next range; ranges are released in reverse order).
class IdSpace {
 public:
  IdSpace() {
    if (id_space_depth >= kMaxCheckpointDepth) {
      OpFail("checkpoint: more than ", kMaxCheckpointDepth, " nested checkpoints");
    }
    ++id_space_depth;
    first_ = id_space_depth * Tape::kSlotsPerTape;
  }
  ~IdSpace() { --id_space_depth; }
  IdSpace(const IdSpace&) = delete;
  IdSpace& operator=(const IdSpace&) = delete;
  int32_t first() const { return first_; }

 private:
  int32_t first_;
};

// Records nothing: numbers fn's values in its own id range (so ops go on recording them) and
// collects the differentiable values fn reads from outside, in first-use order. Each op's VJP
// closure is dropped at once, with what the op saved.
class Probe : public TapeRecorder {
 public:
  explicit Probe(int32_t first) : first_(first) {}
  void Record(const char* op, std::initializer_list<const Value*> inputs, Value& out,
              VjpFn vjp) override {
    for (const Value* v : inputs) {
      if (v->node < 0 || Internal(v->node)) continue;
      if (index_.try_emplace(v->node, captured_.size()).second) captured_.push_back(*v);
    }
    if (next_ >= Tape::kSlotsPerTape) OpFail("checkpoint: more than ", next_, " ops in one function");
    out.node = first_ + next_++;
    vjp = nullptr;
    (void)op;
  }
  bool Internal(int32_t id) const { return id >= first_ && id < first_ + next_; }
  std::vector<Value>& captured() { return captured_; }

 private:
  int32_t first_, next_ = 0;
  absl::flat_hash_map<int32_t, size_t> index_;
  std::vector<Value> captured_;
};

// Records on `rec` a node with a run-time number of inputs (TapeRecorder takes an
// initializer_list): a table of the fixed-size calls, 0 .. kMaxCheckpointInputs.
template <size_t... I>
void RecordWith(TapeRecorder* rec, const char* op, const Value* const* in, Value& out, VjpFn vjp,
                std::index_sequence<I...>) {
  rec->Record(op, {in[I]...}, out, std::move(vjp));
}
template <size_t N>
void RecordFixed(TapeRecorder* rec, const char* op, const Value* const* in, Value& out,
                 VjpFn vjp) {
  RecordWith(rec, op, in, out, std::move(vjp), std::make_index_sequence<N>());
}
using RecordFn = void (*)(TapeRecorder*, const char*, const Value* const*, Value&, VjpFn);
template <size_t... N>
constexpr std::array<RecordFn, sizeof...(N)> RecordTable(std::index_sequence<N...>) {
  return {&RecordFixed<N>...};
}
constexpr auto kRecord = RecordTable(std::make_index_sequence<kMaxCheckpointInputs + 1>());

void RecordN(TapeRecorder* rec, const char* op, const std::vector<Value>& inputs, Value& out,
             VjpFn vjp) {
  std::array<const Value*, kMaxCheckpointInputs> ptrs{};
  for (size_t k = 0; k < inputs.size(); ++k) ptrs[k] = &inputs[k];
  kRecord[inputs.size()](rec, op, ptrs.data(), out, std::move(vjp));
}

enum class OutKind { kConstant, kPassThrough, kDifferentiable };

struct OutMeta {
  OutKind kind = OutKind::kConstant;
  int32_t id = -1;  // kPassThrough: the value's id
  Shape shape;
  DType dtype = DType::kF32;
  SpmdType type;
};

// What the recompute node keeps: fn, its explicit inputs, the captured values (the node's
// inputs) and the forward's outputs' description; the cotangents of the outputs (multi-output).
struct State {
  CheckpointFn fn;
  std::vector<Value> inputs;
  std::vector<Value> captured;
  std::vector<OutMeta> outs;
  const char* name = "checkpoint";
  std::vector<Value> stash;  // per output, this pass's cotangent (multi-output form)
};

std::string Describe(const Shape& shape, DType dtype, const SpmdType& type) {
  RankContext* ctx = RankContext::Current();
  return absl::StrCat(DTypeName(dtype), ShapeToString(shape),
                      type.ToString(ctx != nullptr ? ctx->mesh().axis_names()
                                                   : std::vector<std::string>()));
}

// The recomputed outputs against the forward's; throws OpError naming the first difference.
void CheckRecomputed(const State& st, const Tape& sub, const std::vector<Value>& outs) {
  if (outs.size() != st.outs.size()) {
    OpFail("checkpoint '", st.name, "': on recompute the function returned ", outs.size(),
           " outputs but ", st.outs.size(), " in the forward; it must compute the same thing "
           "every time it runs (no dependence on state that changes before the backward)");
  }
  for (size_t k = 0; k < outs.size(); ++k) {
    const OutMeta& m = st.outs[k];
    const Value& o = outs[k];
    const bool own = o.node >= sub.first_id() &&
                     o.node < sub.first_id() + static_cast<int32_t>(sub.size());
    const bool same_kind = m.kind == OutKind::kConstant        ? o.node < 0 || own
                           : m.kind == OutKind::kPassThrough ? o.node == m.id
                                                             : own;
    if (m.kind == OutKind::kConstant) continue;
    if (!same_kind || !o.defined() || o.shape() != m.shape || o.dtype() != m.dtype ||
        o.type != m.type) {
      OpFail("checkpoint '", st.name, "': on recompute output ", k, " is ",
             o.defined() ? Describe(o.shape(), o.dtype(), o.type) : std::string("undefined"),
             !same_kind ? (o.node < 0 ? " (a constant)" : " (another value)") : "",
             " but the forward's was ", Describe(m.shape, m.dtype, m.type),
             "; the function must compute the same thing every time it runs (no dependence on "
             "state that changes between the forward and the backward)");
    }
  }
}

// Marks the recomputation (IsRecomputing, the collective log) for its scope.
class RecomputeScope {
 public:
  RecomputeScope() : ctx_(RankContext::Current()) {
    ++recompute_depth;
    if (ctx_ != nullptr) {
      prev_ = ctx_->recomputing();
      ctx_->set_recomputing(true);
    }
  }
  ~RecomputeScope() {
    --recompute_depth;
    if (ctx_ != nullptr) ctx_->set_recomputing(prev_);
  }
  RecomputeScope(const RecomputeScope&) = delete;
  RecomputeScope& operator=(const RecomputeScope&) = delete;

 private:
  RankContext* ctx_;
  bool prev_ = false;
};

// The recompute node's VJP: fn again on a fresh tape whose leaves stand for the captured values,
// then the backward of seeds[k] (per output; undefined: none) into them.
void Recompute(State& st, const std::vector<Value>& seeds, uint32_t need, Value* in_cots) {
  std::vector<Value> outs_seeded, seeds_given;
  IdSpace space;
  Tape sub(space.first());
  std::vector<Value> wrt;
  wrt.reserve(st.captured.size());
  for (const Value& c : st.captured) {
    Value leaf = c;
    leaf.node = sub.Adopt(c);
    wrt.push_back(std::move(leaf));
  }
  std::vector<Value> outs;
  try {
    RecomputeScope recomputing;
    ScopedRecorder rec(&sub);
    outs = st.fn(st.inputs);
  } catch (const OpError& e) {
    throw OpError(absl::Status(
        e.status().code(),
        absl::StrCat("checkpoint '", st.name, "', recomputing its function in the backward: ",
                     e.status().message(), " (a function must read and compute the same values "
                     "every time it runs)")));
  }
  CheckRecomputed(st, sub, outs);
  for (size_t k = 0; k < outs.size(); ++k) {
    if (st.outs[k].kind != OutKind::kDifferentiable || !seeds[k].defined()) continue;
    outs_seeded.push_back(outs[k]);
    seeds_given.push_back(seeds[k]);
  }
  outs.clear();
  std::vector<Value> grads = sub.Backward(outs_seeded, seeds_given, wrt);
  // The recomputed activations were alive on top of what the running tape holds.
  if (Tape* running = Tape::Running()) running->NoteTransient(sub.peak_saved_bytes());
  for (size_t k = 0; k < grads.size(); ++k) {
    if (need & (1u << k)) in_cots[k] = std::move(grads[k]);
  }
}

// A rank-0 token of invariant type (the multi-output form's link between outputs and the node).
Value Token(DType dtype, const Device& device) {
  RankContext* ctx = RankContext::Current();
  const int axes = ctx != nullptr ? ctx->mesh().num_axes() : 0;
  SpmdType t(axes, AxisType::I());
  if (ctx != nullptr) t.set_mesh_id(ctx->mesh().id());
  return Value(Tensor::Zeros({}, dtype, device), t);
}

// Records the node(s) of a checkpoint whose forward gave `outs` (see the header).
void RecordCheckpoint(TapeRecorder* outer, std::shared_ptr<State> st, std::vector<Value>& outs,
                      const std::vector<size_t>& diff) {
  if (diff.size() == 1) {
    const size_t k = diff[0];
    RecordN(outer, st->name, st->captured, outs[k],
            [st, k](const Value& g, uint32_t need, Value* d) {
              std::vector<Value> seeds(st->outs.size());
              seeds[k] = g;
              Recompute(*st, seeds, need, d);
            });
    return;
  }
  const Value& first = outs[diff[0]];
  Value token = Token(first.dtype(), first.tensor.device());
  st->stash.assign(st->outs.size(), Value());
  RecordN(outer, st->name, st->captured, token, [st](const Value&, uint32_t need, Value* d) {
    std::vector<Value> seeds = std::move(st->stash);
    st->stash.assign(st->outs.size(), Value());
    Recompute(*st, seeds, need, d);
  });
  for (size_t k : diff) {
    Value link = token;
    outer->Record("checkpoint_output", {&link}, outs[k],
                  [st, k, token](const Value& g, uint32_t need, Value* d) {
                    st->stash[k] = g;
                    if (need & 1u) {
                      d[0] = Value(Tensor::Zeros({}, token.dtype(), token.tensor.device()),
                                   Dual(token.type));
                    }
                  });
  }
}

}  // namespace

bool IsRecomputing() { return recompute_depth > 0; }

std::vector<Value> checkpoint(CheckpointFn fn, std::vector<Value> inputs, const char* name) {
  TapeRecorder* outer = CurrentRecorder();
  if (outer == nullptr) return fn(inputs);
  auto st = std::make_shared<State>();
  st->name = name;
  std::vector<Value> outs;
  std::vector<size_t> diff;
  {
    IdSpace space;
    Probe probe(space.first());
    {
      ScopedRecorder rec(&probe);
      outs = fn(inputs);
    }
    st->captured = std::move(probe.captured());
    for (size_t k = 0; k < outs.size(); ++k) {
      Value& o = outs[k];
      OutMeta m;
      if (o.defined()) {
        m.shape = o.shape();
        m.dtype = o.dtype();
        m.type = o.type;
      }
      if (o.node >= 0 && probe.Internal(o.node)) {
        m.kind = OutKind::kDifferentiable;
        diff.push_back(k);
        o.node = -1;  // the probe's id; the node recorded below gives the real one
      } else if (o.node >= 0) {
        m.kind = OutKind::kPassThrough;
        m.id = o.node;
      }
      st->outs.push_back(std::move(m));
    }
  }
  if (st->captured.empty() || diff.empty()) return outs;  // nothing to differentiate through
  if (st->captured.size() > static_cast<size_t>(kMaxCheckpointInputs)) {
    OpFail("checkpoint '", name, "': the function reads ", st->captured.size(),
           " differentiable values from outside (inputs and captured values); a checkpoint "
           "takes at most ", kMaxCheckpointInputs, ": split it into several checkpoints");
  }
  st->fn = std::move(fn);
  st->inputs = std::move(inputs);
  RecordCheckpoint(outer, st, outs, diff);
  return outs;
}

Value checkpoint(CheckpointFn1 fn, std::vector<Value> inputs, const char* name) {
  if (CurrentRecorder() == nullptr) return fn(inputs);
  std::vector<Value> outs = checkpoint(
      [f = std::move(fn)](const std::vector<Value>& in) { return std::vector<Value>{f(in)}; },
      std::move(inputs), name);
  return outs[0];
}

}  // namespace shardmap
