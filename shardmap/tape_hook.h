// The recording interface between typed ops (shardmap/) and the autograd tape (autograd/).
//
// Every differentiable typed op, after computing its output, calls RecordOp with its name, its
// inputs, its output and a VJP closure written in terms of typed ops (so backward ops are typed
// and checked like forward ones). autograd/ installs a TapeRecorder for the current thread (one
// per rank-thread); without one, nothing is recorded and ops cost no more than the kernel call.
//
//   // inside an op (shardmap/ops.cc):
//   Value out = ...;
//   if (NeedsTape(a, b)) {
//     RecordOp("mul", {&a, &b}, out, [a, b](const Value& g, uint32_t need, Value* da) {
//       if (need & 1) da[0] = g * b;
//       if (need & 2) da[1] = g * a;
//     });
//   }
//
// A value takes part in differentiation when its `node` is >= 0 (a tape slot); constants have -1.
#ifndef SHARDMAP_SHARDMAP_TAPE_HOOK_H_
#define SHARDMAP_SHARDMAP_TAPE_HOOK_H_

#include <cstdint>
#include <functional>
#include <initializer_list>

namespace shardmap {

struct Value;

// Given the output's cotangent, fills in_cots[i] for every input i whose bit is set in `need`
// (bit i = input i is on the tape). Unset entries mean "no gradient" (zero).
using VjpFn = std::function<void(const Value& cot, uint32_t need, Value* in_cots)>;

class TapeRecorder {
 public:
  virtual ~TapeRecorder() = default;
  // Records one op; sets out.node to the new tape slot.
  virtual void Record(const char* op, std::initializer_list<const Value*> inputs, Value& out,
                      VjpFn vjp) = 0;
};

namespace internal {
inline thread_local TapeRecorder* current_recorder = nullptr;
}  // namespace internal

inline TapeRecorder* CurrentRecorder() { return internal::current_recorder; }

// Installs `recorder` on this thread for the scope (nullptr: a no-grad scope).
class ScopedRecorder {
 public:
  explicit ScopedRecorder(TapeRecorder* recorder) : prev_(internal::current_recorder) {
    internal::current_recorder = recorder;
  }
  ~ScopedRecorder() { internal::current_recorder = prev_; }
  ScopedRecorder(const ScopedRecorder&) = delete;
  ScopedRecorder& operator=(const ScopedRecorder&) = delete;

 private:
  TapeRecorder* prev_;
};

// Nothing inside is recorded (evaluation, optimizer updates, the backward pass itself).
class NoGradScope : public ScopedRecorder {
 public:
  NoGradScope() : ScopedRecorder(nullptr) {}
};

}  // namespace shardmap

#endif  // SHARDMAP_SHARDMAP_TAPE_HOOK_H_
