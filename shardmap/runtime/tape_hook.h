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
#ifndef SHARDMAP_SHARDMAP_RUNTIME_TAPE_HOOK_H_
#define SHARDMAP_SHARDMAP_RUNTIME_TAPE_HOOK_H_

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <new>
#include <type_traits>
#include <utility>

namespace shardmap {

struct Value;

// Given the output's cotangent, fills in_cots[i] for every input i whose bit is set in `need`
// (bit i = input i is on the tape). Unset entries mean "no gradient" (zero).
//
// A move-only callable holding such a closure. Closures of up to kInlineBytes (two captured
// Values, as matmul's VJP keeps) live inside the object, so recording an op costs no heap
// allocation for its VJP (std::function keeps only 16 bytes inline); larger ones go to the heap.
//
//   VjpFn f = [x](const Value& g, uint32_t need, Value* d) { if (need & 1) d[0] = g * x; };
//   if (f) f(g, 1, d);
//   f = nullptr;  // frees the closure (and what it captured)
class VjpFn {
 public:
  static constexpr size_t kInlineBytes = 272;

  VjpFn() = default;
  VjpFn(std::nullptr_t) {}  // NOLINT: like std::function
  template <typename F, typename D = std::decay_t<F>,
            typename = std::enable_if_t<!std::is_same_v<D, VjpFn> &&
                                        !std::is_same_v<D, std::nullptr_t>>>
  VjpFn(F&& f) {  // NOLINT: like std::function
    static_assert(std::is_invocable_v<D&, const Value&, uint32_t, Value*>,
                  "a VJP is called as vjp(const Value& cot, uint32_t need, Value* in_cots)");
    if constexpr (kFitsInline<D>) {
      ::new (static_cast<void*>(buf_)) D(std::forward<F>(f));
      ops_ = &kInlineOps<D>;
    } else {
      *reinterpret_cast<D**>(buf_) = new D(std::forward<F>(f));
      ops_ = &kHeapOps<D>;
    }
  }
  VjpFn(VjpFn&& o) noexcept { TakeFrom(o); }
  VjpFn& operator=(VjpFn&& o) noexcept {
    if (this != &o) {
      Reset();
      TakeFrom(o);
    }
    return *this;
  }
  VjpFn& operator=(std::nullptr_t) noexcept {
    Reset();
    return *this;
  }
  VjpFn(const VjpFn&) = delete;
  VjpFn& operator=(const VjpFn&) = delete;
  ~VjpFn() { Reset(); }

  explicit operator bool() const { return ops_ != nullptr; }
  void operator()(const Value& cot, uint32_t need, Value* in_cots) const {
    ops_->call(buf_, cot, need, in_cots);
  }

 private:
  struct Ops {
    void (*call)(void* self, const Value& cot, uint32_t need, Value* in_cots);
    void (*relocate)(void* from, void* to) noexcept;  // move-constructs `to`, destroys `from`
    void (*destroy)(void* self) noexcept;
  };
  template <typename D>
  static constexpr bool kFitsInline = sizeof(D) <= kInlineBytes &&
                                      alignof(D) <= alignof(std::max_align_t) &&
                                      std::is_nothrow_move_constructible_v<D>;
  template <typename D>
  static constexpr Ops kInlineOps = {
      [](void* self, const Value& cot, uint32_t need, Value* in_cots) {
        (*static_cast<D*>(self))(cot, need, in_cots);
      },
      [](void* from, void* to) noexcept {
        ::new (to) D(std::move(*static_cast<D*>(from)));
        static_cast<D*>(from)->~D();
      },
      [](void* self) noexcept { static_cast<D*>(self)->~D(); }};
  template <typename D>
  static constexpr Ops kHeapOps = {
      [](void* self, const Value& cot, uint32_t need, Value* in_cots) {
        (**static_cast<D**>(self))(cot, need, in_cots);
      },
      [](void* from, void* to) noexcept { *static_cast<D**>(to) = *static_cast<D**>(from); },
      [](void* self) noexcept { delete *static_cast<D**>(self); }};

  void TakeFrom(VjpFn& o) noexcept {
    if (o.ops_ == nullptr) return;
    o.ops_->relocate(o.buf_, buf_);
    ops_ = o.ops_;
    o.ops_ = nullptr;
  }
  void Reset() noexcept {
    if (ops_ == nullptr) return;
    const Ops* ops = ops_;
    ops_ = nullptr;  // first, so a closure whose destructor records nothing re-enters cleanly
    ops->destroy(buf_);
  }

  const Ops* ops_ = nullptr;
  alignas(std::max_align_t) mutable unsigned char buf_[kInlineBytes];
};

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

#endif  // SHARDMAP_SHARDMAP_RUNTIME_TAPE_HOOK_H_
