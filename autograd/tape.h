// The per-rank tape: a Wengert list of the typed ops run while it is installed (tape order is a
// topological order), and the backward pass over it.
//
//   Tape tape;
//   Value w = tape.Watch(w0);                  // a leaf to differentiate with respect to
//   Value loss;
//   {
//     ScopedRecorder rec(&tape);
//     loss = sum_partial(gelu(x.matmul(w)), {});   // every typed op records itself
//   }
//   std::vector<Value> g = tape.Backward(loss, seed, {w});   // g[0] has w's dual type
//
// Backward runs each recorded VJP (typed ops, checked like forward ones, not recorded), sums the
// cotangents of values used several times (typed add: P+P, V+V, ...), and, when the context's
// TypeCheck is kOn, checks that each cotangent has the dual type of its primal (R<->P, I<->I,
// V<->V; a V cotangent of an S(d) primal is accepted, a different S(d') is not), the same shape
// and dtype. Violations throw OpError naming the op, the input and both types. Collectives run by
// VJPs are logged as backward in the RankContext.
//
// Several backward passes over one tape (pipeline microbatches, models/parallel/pipeline.h): each
// microbatch's forward records its own subgraph, and BackwardAndRelease(out_m, ...) runs the VJPs
// of the ops out_m depends on and then drops them (their closures hold the saved tensors), so a
// later pass never sees them again; a cotangent that reaches a released op is an error.
// Accounting: saved_bytes() is the bytes of the outputs of recorded ops whose VJP is still held
// (the activations the tape keeps alive, the measure TrainResult reports), peak_saved_bytes() its
// maximum since construction, Clear() or ResetPeak(). An output that shares its storage with an
// input (a view, an alias) counts nothing: one buffer is counted once.
// A BackwardObserver (e.g. a tracer) is told before and after each node's VJP and the
// accumulation of its cotangents.
//
// Gradient hooks (overlapped data-parallel reduction, models/train/grad_buckets.h): Backward's
// `on_ready(k, g)` is called for wrt[k] as soon as its cotangent is final, i.e. once the pass
// has gone below the first op that consumed it (the tape's order is topological, so no later
// VJP can add to it; ops an earlier BackwardAndRelease released do not count: a pipeline
// stage's last microbatch reports its parameters during its own pass), in the order the
// gradients become final; g is the same value Backward
// returns for k. A gradient that nothing reached is reported (as zeros) at the end.
//
//   tape.Backward(loss, seed, watched, [&](int k, const Value& g) { buckets.Add(k, g); });
//
// Id spaces (for autograd/checkpoint.h): a tape made with Tape(first_id) numbers its slots
// first_id, first_id + 1, ... (a default tape: 0, 1, ...; at most kSlotsPerTape slots), so values
// of different live tapes never share an id. Adopt(v) makes a leaf for a value `v` of another tape
// (a recomputed function's inputs): ops recorded here that read v (by its own id) read that leaf.
// Any other foreign id reaching Record is an error naming the op (a value leaked from another
// tape). Backward may seed several outputs at once (a function with several results).
#ifndef SHARDMAP_AUTOGRAD_TAPE_H_
#define SHARDMAP_AUTOGRAD_TAPE_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <utility>
#include <initializer_list>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/types/span.h"
#include "shardmap/tape_hook.h"
#include "shardmap/value.h"

namespace shardmap {

// Told about each VJP that Backward runs, in backward order (on the calling rank's thread).
class BackwardObserver {
 public:
  virtual ~BackwardObserver() = default;
  virtual void BeforeVjp(const char* op) = 0;  // op: the name the forward op recorded
  virtual void AfterVjp(const char* op) = 0;   // its cotangents are computed and accumulated
};

class Tape : public TapeRecorder {
 public:
  // Slots of one tape (ids first_id .. first_id + kSlotsPerTape - 1).
  static constexpr int32_t kSlotsPerTape = int32_t{1} << 24;

  Tape() { nodes_.reserve(256); }
  // A tape whose ids start at first_id (a multiple of kSlotsPerTape).
  explicit Tape(int32_t first_id) : first_(first_id) { nodes_.reserve(64); }
  Tape(const Tape&) = delete;
  Tape& operator=(const Tape&) = delete;

  // Returns v with a fresh leaf slot on this tape.
  Value Watch(const Value& v);
  // A leaf standing for v (v.node >= 0, an id of another tape): ops recorded here that read v
  // read it. Returns the leaf's id on this tape (for `wrt`). Throws OpError if v is not foreign.
  int32_t Adopt(const Value& v);
  // The id of this tape's first slot; its own ids are [first_id(), first_id() + size()).
  int32_t first_id() const { return first_; }

  void Record(const char* op, std::initializer_list<const Value*> inputs, Value& out,
              VjpFn vjp) override;

  // Cotangents of `wrt` (leaves or any recorded values) given `seed`, the cotangent of `out`.
  // Unreached entries come back as zeros of the dual type. Throws OpError.
  // on_ready: see "Gradient hooks" above (may be empty).
  using GradReadyFn = std::function<void(int k, const Value& grad)>;
  std::vector<Value> Backward(const Value& out, const Value& seed, absl::Span<const Value> wrt,
                              const GradReadyFn& on_ready = nullptr);
  // Backward, then releases every op it ran (or reached): their VJPs and saved tensors are freed.
  std::vector<Value> BackwardAndRelease(const Value& out, const Value& seed,
                                        absl::Span<const Value> wrt,
                                        const GradReadyFn& on_ready = nullptr);
  // Several outputs seeded at once (seeds[k] for outs[k]; an undefined seed: no cotangent).
  // Unlike the one-output form, a `wrt` entry no cotangent reached comes back undefined (not
  // zeros), so a caller adding it elsewhere adds nothing.
  std::vector<Value> Backward(absl::Span<const Value> outs, absl::Span<const Value> seeds,
                              absl::Span<const Value> wrt);

  // The tape whose backward pass runs on this thread (innermost), or nullptr.
  static Tape* Running() { return running_; }
  // Bytes held for a while on top of saved_bytes() (a recomputed function's own tape, while its
  // backward runs): counted in the peak.
  void NoteTransient(int64_t bytes) {
    peak_saved_bytes_ = std::max(peak_saved_bytes_, saved_bytes_ + bytes);
  }

  // A held output's bytes given back (negative) or taken again while its node is kept (FSDP
  // frees a gathered parameter after its forward and refills it for its backward):
  // saved_bytes() and its peak follow what is really held.
  void NoteHeldBytes(int64_t delta) {
    saved_bytes_ += delta;
    peak_saved_bytes_ = std::max(peak_saved_bytes_, saved_bytes_);
  }

  size_t size() const { return nodes_.size(); }
  void Clear() {
    nodes_.clear();
    foreign_.clear();
    triggers_.clear();
    saved_bytes_ = peak_saved_bytes_ = recorded_bytes_ = largest_recorded_bytes_ = 0;
  }
  int64_t saved_bytes() const { return saved_bytes_; }
  int64_t peak_saved_bytes() const { return peak_saved_bytes_; }
  void ResetPeak() { peak_saved_bytes_ = saved_bytes_; }
  // Bytes of all recorded outputs since Clear (released or not), and the largest one.
  int64_t recorded_bytes() const { return recorded_bytes_; }
  int64_t largest_recorded_bytes() const { return largest_recorded_bytes_; }
  // Not owned; nullptr (the default) turns it off.
  void set_backward_observer(BackwardObserver* observer) { observer_ = observer; }

  // Calls fn during the next Backward (or BackwardAndRelease) once the pass is about to run the
  // VJPs of the ops recorded before `slot` (a size() taken during the forward), i.e. once every
  // op from `slot` on has had its VJP; at the end if the pass never gets there. FSDP uses it to
  // regather a layer's parameters just before its backward (models/train/fsdp_params.h). Triggers
  // at one slot run in the order added. Each fires once; Clear() drops those not fired.
  void AtBackwardBelow(int32_t slot, std::function<void()> fn) {
    triggers_.push_back({slot, std::move(fn)});
  }

 private:
  struct Node {
    const char* op;
    absl::InlinedVector<int32_t, 3> inputs;
    VjpFn vjp;  // empty for leaves
    SpmdType type;
    Shape shape;
    DType dtype;
    int64_t bytes = 0;      // the output's bytes, counted in saved_bytes_ while held
    bool released = false;  // its VJP was run and dropped by BackwardAndRelease
  };
  struct Pass;  // one backward pass's state and steps (tape.cc)
  std::vector<Value> Run(absl::Span<const Value> outs, absl::Span<const Value> seeds,
                         absl::Span<const Value> wrt, bool release, bool zeros = true,
                         const GradReadyFn& on_ready = nullptr);
  // For on_ready: the order in which wrt's gradients become final, and for each the tape slot
  // below which it is (its first consumer; -1: none, final at the end).
  std::vector<std::pair<int32_t, int>> ReadyOrder(absl::Span<const Value> wrt) const;
  // The slot of id on this tape (its own or an adopted foreign one), or -1.
  int32_t SlotOf(int32_t id) const;
  int32_t first_ = 0;
  absl::flat_hash_map<int32_t, int32_t> foreign_;  // foreign id -> adopted leaf slot
  static inline thread_local Tape* running_ = nullptr;
  void CheckCotangent(const Node& consumer, int input_pos, const Node& primal,
                      const Value& cot) const;
  std::vector<Node> nodes_;
  int64_t saved_bytes_ = 0, peak_saved_bytes_ = 0;
  int64_t recorded_bytes_ = 0, largest_recorded_bytes_ = 0;
  BackwardObserver* observer_ = nullptr;
  std::vector<std::pair<int32_t, std::function<void()>>> triggers_;  // AtBackwardBelow
};

}  // namespace shardmap

#endif  // SHARDMAP_AUTOGRAD_TAPE_H_
