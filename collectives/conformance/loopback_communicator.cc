#include "collectives/conformance/loopback_communicator.h"

#include <functional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "collectives/gloo_communicator.h"
#include "collectives/gloo_threads.h"

namespace shardmap::collectives::conformance {
namespace {

// A started call of the loopback: the inner handle, with the backend's faults applied to what
// Wait() returns (and, kWaitTwiceIsOk, a second Wait() that passes).
class LoopbackCall final : public PendingCollective {
 public:
  LoopbackCall(std::unique_ptr<PendingCollective> inner,
               std::function<absl::Status(absl::Status)> after, bool twice_ok)
      : inner_(std::move(inner)), after_(std::move(after)), twice_ok_(twice_ok) {}
  absl::Status Wait() override {
    if (waited_ && twice_ok_) return absl::OkStatus();  // the fault: a second Wait() passes
    if (waited_) return inner_->Wait();                 // the inner handle refuses it
    waited_ = true;
    return after_(inner_->Wait());
  }

 private:
  std::unique_ptr<PendingCollective> inner_;
  std::function<absl::Status(absl::Status)> after_;
  const bool twice_ok_;
  bool waited_ = false;
};

class LoopbackCommunicator final : public Communicator {
 public:
  // Owns `inner` / borrows it (it outlives this).
  LoopbackCommunicator(std::unique_ptr<Communicator> inner, LoopbackFault fault)
      : owned_(std::move(inner)), in_(owned_.get()), fault_(fault) {}
  LoopbackCommunicator(Communicator& inner, LoopbackFault fault) : in_(&inner), fault_(fault) {}

  int rank() const override { return in_->rank(); }
  int size() const override { return in_->size(); }
  std::string name() const override { return absl::StrCat("loopback over ", in_->name()); }

  absl::Status AllReduce(const void* s, void* r, size_t n, DataType t, ReduceOp op) override {
    absl::Status st = F(in_->AllReduce(s, r, n, t, op));
    if (st.ok() && n > 0 && fault_ == LoopbackFault::kAllReduceOffByOne) {
      *static_cast<unsigned char*>(r) ^= 1;
    }
    return st;
  }
  absl::Status AllGather(const void* s, void* r, size_t n, DataType t) override {
    return Out(F(in_->AllGather(s, r, n, t)), r, size() * n);
  }
  absl::Status ReduceScatter(const void* s, void* r, size_t n, DataType t, ReduceOp op) override {
    return Out(F(in_->ReduceScatter(s, r, n, t, op)), r, n);
  }
  absl::Status AllToAll(const void* s, void* r, size_t n, DataType t) override {
    return Out(F(in_->AllToAll(s, r, n, t)), r, size() * n);
  }
  absl::Status AllGatherV(const void* s, void* r, absl::Span<const size_t> c,
                          DataType t) override {
    return Out(F(in_->AllGatherV(s, r, c, t)), r, Sum(c));
  }
  absl::Status ReduceScatterV(const void* s, void* r, absl::Span<const size_t> c, DataType t,
                              ReduceOp op) override {
    const size_t mine = rank() < static_cast<int>(c.size()) ? c[rank()] : 0;
    return Out(F(in_->ReduceScatterV(s, r, c, t, op)), r, mine);
  }
  absl::Status AllToAllV(const void* s, absl::Span<const size_t> sc, void* r,
                         absl::Span<const size_t> rc, DataType t) override {
    return Out(F(in_->AllToAllV(s, sc, r, rc, t)), r, Sum(rc));
  }
  absl::Status Broadcast(void* b, size_t n, DataType t, int root) override {
    return Out(F(in_->Broadcast(b, n, t, root)), b, n);
  }
  absl::Status Send(const void* b, size_t n, DataType t, int peer) override {
    return F(in_->Send(b, n, t, peer));
  }
  absl::Status Recv(void* b, size_t n, DataType t, int peer) override {
    return Out(F(in_->Recv(b, n, t, peer)), b, n);
  }
  absl::Status Ppermute(const void* s, void* r, size_t n, DataType t,
                        absl::Span<const std::pair<int, int>> pairs) override {
    return Out(F(in_->Ppermute(s, r, n, t, pairs)), r, n);
  }
  absl::StatusOr<std::unique_ptr<PendingCollective>> PpermuteStart(
      const void* s, void* r, size_t n, DataType t,
      absl::Span<const std::pair<int, int>> pairs) override {
    return Started(in_->PpermuteStart(s, r, n, t, pairs), [](absl::Status st) { return st; });
  }
  absl::StatusOr<std::unique_ptr<PendingCollective>> AllReduceStart(const void* s, void* r,
                                                                    size_t n, DataType t,
                                                                    ReduceOp op) override {
    return Started(in_->AllReduceStart(s, r, n, t, op), [this, r, n](absl::Status st) {
      if (st.ok() && n > 0 && fault_ == LoopbackFault::kAllReduceOffByOne) {
        *static_cast<unsigned char*>(r) ^= 1;
      }
      return st;
    });
  }
  absl::StatusOr<std::unique_ptr<PendingCollective>> AllGatherStart(const void* s, void* r,
                                                                    size_t n,
                                                                    DataType t) override {
    return Started(in_->AllGatherStart(s, r, n, t),
                   [this, r, m = size() * n](absl::Status st) { return Out(st, r, m); });
  }
  absl::StatusOr<std::unique_ptr<PendingCollective>> ReduceScatterStart(const void* s, void* r,
                                                                        size_t n, DataType t,
                                                                        ReduceOp op) override {
    return Started(in_->ReduceScatterStart(s, r, n, t, op),
                   [this, r, n](absl::Status st) { return Out(st, r, n); });
  }
  bool OverlapsStartedCalls() const override { return in_->OverlapsStartedCalls(); }
  absl::Status Barrier() override {
    if (fault_ == LoopbackFault::kBarrierDoesNotWait) return absl::OkStatus();
    return F(in_->Barrier());
  }
  absl::StatusOr<std::unique_ptr<Communicator>> Split(int color, int key) override {
    if (fault_ == LoopbackFault::kSplitIgnoresKey) key = 0;
    absl::StatusOr<std::unique_ptr<Communicator>> sub = in_->Split(color, key);
    if (!sub.ok()) return F(sub.status());
    if (*sub == nullptr) return sub;
    return WrapLoopback(*std::move(sub), fault_);
  }
  void TagNextCall(const CallTag& tag) override { in_->TagNextCall(tag); }
  bool ComparesCallTags() const override { return in_->ComparesCallTags(); }
  MemorySpace memory_space() const override { return in_->memory_space(); }
  bool SupportsGraphCapture() const override { return in_->SupportsGraphCapture(); }

 private:
  absl::Status F(absl::Status s) const {
    if (s.ok()) return s;
    if (fault_ == LoopbackFault::kErrorsLoseTheirCode) return absl::UnknownError(s.message());
    if (fault_ == LoopbackFault::kErrorsLoseTheirText) return absl::Status(s.code(), "failed");
    return s;
  }
  absl::StatusOr<std::unique_ptr<PendingCollective>> Started(
      absl::StatusOr<std::unique_ptr<PendingCollective>> h,
      std::function<absl::Status(absl::Status)> after) const {
    if (!h.ok()) return F(h.status());
    return std::unique_ptr<PendingCollective>(std::make_unique<LoopbackCall>(
        *std::move(h), [this, after = std::move(after)](absl::Status st) { return F(after(st)); },
        fault_ == LoopbackFault::kWaitTwiceIsOk));
  }
  // kOutputsOffByOne: flips the low bit of the first byte of an output of `count` elements.
  absl::Status Out(absl::Status s, void* out, size_t count) const {
    if (s.ok() && count > 0 && fault_ == LoopbackFault::kOutputsOffByOne) {
      *static_cast<unsigned char*>(out) ^= 1;
    }
    return s;
  }
  static size_t Sum(absl::Span<const size_t> c) {
    size_t n = 0;
    for (size_t x : c) n += x;
    return n;
  }

  std::unique_ptr<Communicator> owned_;
  Communicator* in_;
  LoopbackFault fault_;
};

}  // namespace

absl::StatusOr<LoopbackFault> ParseLoopbackFault(absl::string_view name) {
  const std::pair<const char*, LoopbackFault> all[] = {
      {"none", LoopbackFault::kNone},
      {"allreduce_off_by_one", LoopbackFault::kAllReduceOffByOne},
      {"outputs_off_by_one", LoopbackFault::kOutputsOffByOne},
      {"split_ignores_key", LoopbackFault::kSplitIgnoresKey},
      {"errors_lose_their_code", LoopbackFault::kErrorsLoseTheirCode},
      {"errors_lose_their_text", LoopbackFault::kErrorsLoseTheirText},
      {"barrier_does_not_wait", LoopbackFault::kBarrierDoesNotWait},
      {"wait_twice_is_ok", LoopbackFault::kWaitTwiceIsOk},
  };
  std::vector<std::string> names;
  for (const auto& [n, f] : all) {
    if (name == n) return f;
    names.push_back(n);
  }
  return absl::InvalidArgumentError(absl::StrCat("loopback fault '", name, "': use one of ",
                                                 absl::StrJoin(names, ", ")));
}

std::unique_ptr<Communicator> WrapLoopback(std::unique_ptr<Communicator> inner,
                                           LoopbackFault fault) {
  return std::make_unique<LoopbackCommunicator>(std::move(inner), fault);
}

Backend LoopbackBackend(LoopbackFault fault) {
  Backend b;
  b.name = "loopback";
  b.description = "a toy: every call forwarded to Gloo (tests of the backend recipe)";
  b.process_per_rank = true;
  b.memory = BackendMemory::kHost;
  b.run_world = [fault](int n, const RankFn& fn, const WorldOptions& o) {
    GlooOptions go;
    go.timeout = o.timeout;
    return RunGlooThreadsEach(n, [&](Communicator& gloo) -> absl::Status {
      LoopbackCommunicator wrapped(gloo, fault);  // RunGlooThreadsEach owns the Gloo one
      return fn(wrapped);
    }, go);
  };
  b.create_from_env =
      [fault](const ProcessWorldOptions& o) -> absl::StatusOr<std::unique_ptr<Communicator>> {
    GlooOptions go;
    go.timeout = o.timeout;
    absl::StatusOr<std::unique_ptr<Communicator>> c = CreateGlooCommunicatorFromEnv(go);
    if (!c.ok()) return c.status();
    return WrapLoopback(*std::move(c), fault);
  };
  return b;
}

}  // namespace shardmap::collectives::conformance
