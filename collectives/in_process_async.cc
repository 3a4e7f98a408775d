// State: per rank of the group a ring of kMaxAsyncPpermutes slots; call k of rank r lives in
// slot k % kMaxAsyncPpermutes of r. The transfer source -> destination of call k is described by
// the destination's slot (`in`: pending, copying, done, failed); either rank may claim it once
// both slots hold call k and are active. A rank releases its slot (active = false) when its
// Wait() is over: then its incoming transfer is done and its outgoing one too (or the call
// failed, and no partner is copying its buffers any more). All bookkeeping is under one mutex
// per group; the copies run outside it.
#include "collectives/in_process_async.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace shardmap::collectives::internal {
namespace {

enum class Xfer : uint8_t { kPending, kCopying, kDone, kFailed };

struct AsyncSlot {
  uint64_t seq = 0;  // the call (1, 2, ...) this slot holds
  bool active = false;
  DataType dtype = DataType::kF32;
  size_t count = 0;
  uint64_t pairs_hash = 0;
  CallTag tag;
  const void* send = nullptr;
  void* recv = nullptr;
  int source = -1;  // group rank we receive from, -1: none (recv zeroed)
  int dest = -1;    // group rank we send to, -1: none
  Xfer in = Xfer::kDone;  // the transfer into recv
  std::string error;      // when in == kFailed
};

// How often a waiter re-checks for a poisoned world or a partner that left: the world's
// wake-ups go to the groups' condition variables, not to this one.
constexpr std::chrono::milliseconds kPollSlice(2);

std::string DescribeSlot(const AsyncSlot& s) {
  if (s.tag.describe != nullptr) return s.tag.describe(s.tag.words);
  return absl::StrCat("an untagged ppermute_start(", DataTypeName(s.dtype), ", count=", s.count,
                      ")");
}

bool SameCall(const AsyncSlot& a, const AsyncSlot& b) {
  return a.dtype == b.dtype && a.count == b.count && a.pairs_hash == b.pairs_hash &&
         std::equal(std::begin(a.tag.words), std::end(a.tag.words), std::begin(b.tag.words));
}

}  // namespace

class AsyncPpermutes {
 public:
  explicit AsyncPpermutes(std::shared_ptr<Group> group)
      : group_(std::move(group)), slots_(group_->size()), started_(group_->size(), 0) {}

  Group& group() { return *group_; }

  // Posts rank's call; returns its number. The buffers are checked by the caller.
  absl::StatusOr<uint64_t> Post(int rank, const CallTag& tag, const void* send, void* recv,
                                size_t count, DataType dtype, uint64_t pairs_hash, int source,
                                int dest, const std::string& what) {
    const uint64_t k = ++started_[rank];
    std::lock_guard<std::mutex> l(mu_);
    AsyncSlot& s = Slot(rank, k);
    if (s.active) {
      --started_[rank];
      return absl::FailedPreconditionError(absl::StrCat(
          what, ": ", kMaxAsyncPpermutes, " non-blocking ppermutes of this rank are already in "
          "flight on this group; Wait() for the earlier ones before starting more"));
    }
    s.seq = k;
    s.active = true;
    s.dtype = dtype;
    s.count = count;
    s.pairs_hash = pairs_hash;
    s.tag = tag;
    s.send = send;
    s.recv = recv;
    s.source = source;
    s.dest = dest;
    s.in = source >= 0 ? Xfer::kPending : Xfer::kDone;
    s.error.clear();
    cv_.notify_all();
    return k;
  }

  // Rank's part of call k: does what it can of its two transfers and waits for the rest.
  absl::Status Wait(int rank, uint64_t k, const std::string& what) {
    const absl::Time deadline = absl::Now() + group_->world().timeout();
    std::unique_lock<std::mutex> l(mu_);
    AsyncSlot& me = Slot(rank, k);
    absl::Status failure;
    while (true) {
      if (me.source >= 0 && me.in == Xfer::kPending) {
        AsyncSlot& src = Slot(me.source, k);
        if (src.seq == k && src.active) Transfer(src, me, me.source, rank, l);
      }
      if (me.dest >= 0) {
        AsyncSlot& dst = Slot(me.dest, k);
        if (dst.seq == k && dst.active && dst.in == Xfer::kPending) {
          Transfer(me, dst, rank, me.dest, l);
        }
      }
      const Xfer in = me.source >= 0 ? me.in : Xfer::kDone;
      const Xfer out = me.dest >= 0 ? Outgoing(me.dest, k) : Xfer::kDone;
      if (in == Xfer::kFailed || out == Xfer::kFailed) {
        failure = absl::InvalidArgumentError(
            in == Xfer::kFailed ? me.error : Slot(me.dest, k).error);
        break;
      }
      if (in == Xfer::kDone && out == Xfer::kDone) {
        me.active = false;
        cv_.notify_all();
        return absl::OkStatus();
      }
      World& world = group_->world();
      if (world.poisoned()) {
        failure = absl::Status(world.first_failure().code(),  // the failing rank's own code
                               absl::StrCat(what, " aborted: the world was poisoned by ",
                                            world.first_failure().message()));
        break;
      }
      // The partners whose side of a transfer is not posted yet.
      std::vector<int> missing;
      if (in == Xfer::kPending && !Posted(me.source, k)) missing.push_back(me.source);
      if (out == Xfer::kPending && !Posted(me.dest, k)) missing.push_back(me.dest);
      for (int p : missing) {
        if (world.exited(group_->world_rank(p))) {
          failure = absl::FailedPreconditionError(absl::StrCat(
              what, ": ", group_->RankName(p), " returned from its function without starting "
              "the matching ppermute (every rank of the group must issue the same collectives "
              "in the same order)"));
          break;
        }
      }
      if (!failure.ok()) break;
      if (absl::Now() >= deadline) {
        std::string who;
        for (int p : missing) absl::StrAppend(&who, who.empty() ? "" : " and ", group_->RankName(p));
        failure = absl::DeadlineExceededError(absl::StrCat(
            what, ": timed out after ", absl::FormatDuration(world.timeout()), " waiting for ",
            who.empty() ? std::string("a partner's copy") : who + " to start the matching ppermute"));
        break;
      }
      cv_.wait_for(l, kPollSlice);
    }
    Release(rank, k, l);
    l.unlock();
    group_->world().Poison(group_->world_rank(rank), failure);
    return failure;
  }

  // Call k of rank was dropped without (a successful) Wait(): no partner touches its buffers
  // after this returns. never_waited: report it (poisons the world).
  void Abandon(int rank, uint64_t k, bool never_waited, const std::string& what) {
    {
      std::unique_lock<std::mutex> l(mu_);
      Release(rank, k, l);
    }
    if (never_waited) {
      group_->world().Poison(
          group_->world_rank(rank),
          absl::FailedPreconditionError(absl::StrCat(
              what, ": started but never waited; call Wait() (ppermute_wait) on every "
              "non-blocking ppermute before it goes out of scope")));
    }
  }

 private:
  AsyncSlot& Slot(int rank, uint64_t k) { return slots_[rank][k % kMaxAsyncPpermutes]; }

  bool Posted(int rank, uint64_t k) {
    const AsyncSlot& s = Slot(rank, k);
    return s.seq > k || (s.seq == k && s.active);
  }

  // The state of our transfer into dest's call k. Dest releases its slot only once that transfer
  // is over, so a later call in it means done.
  Xfer Outgoing(int dest, uint64_t k) {
    const AsyncSlot& d = Slot(dest, k);
    if (d.seq > k) return Xfer::kDone;
    if (d.seq < k) return Xfer::kPending;
    return d.in;
  }

  // Claims the pending transfer src -> dst (both hold call k, active) and copies, unlocked.
  void Transfer(const AsyncSlot& src, AsyncSlot& dst, int src_rank, int dst_rank,
                std::unique_lock<std::mutex>& l) {
    if (!SameCall(src, dst)) {
      dst.in = Xfer::kFailed;
      dst.error = absl::StrCat(
          "mismatched ppermutes on group '", group_->name(), "': ", group_->RankName(src_rank),
          " started ", DescribeSlot(src), " but its partner ", group_->RankName(dst_rank),
          " started ", DescribeSlot(dst), " at the same point",
          src.pairs_hash != dst.pairs_hash ? " (with a different pairs list)" : "",
          "; every rank must issue the same collectives, with the same shapes and pairs, in the "
          "same order");
      cv_.notify_all();
      return;
    }
    dst.in = Xfer::kCopying;
    const void* from = src.send;
    void* to = dst.recv;
    const size_t bytes = dst.count * DataTypeSize(dst.dtype);
    l.unlock();
    if (bytes > 0) std::memcpy(to, from, bytes);
    l.lock();
    dst.in = Xfer::kDone;
    cv_.notify_all();
  }

  // Stops new claims on rank's call k and waits until no partner is copying its buffers (a
  // bounded memcpy).
  void Release(int rank, uint64_t k, std::unique_lock<std::mutex>& l) {
    AsyncSlot& me = Slot(rank, k);
    me.active = false;
    auto copying = [&] {
      if (me.in == Xfer::kCopying) return true;
      if (me.dest < 0) return false;
      const AsyncSlot& d = Slot(me.dest, k);
      return d.seq == k && d.in == Xfer::kCopying;
    };
    while (copying()) cv_.wait_for(l, kPollSlice);
    cv_.notify_all();
  }

  const std::shared_ptr<Group> group_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::array<AsyncSlot, kMaxAsyncPpermutes>> slots_;  // guarded by mu_
  std::vector<uint64_t> started_;  // [r]: calls rank r started; touched only by rank r
};

namespace {

class AsyncCall final : public PendingCollective {
 public:
  AsyncCall(std::shared_ptr<AsyncPpermutes> state, int rank, uint64_t k, std::string what,
            std::vector<char> staged)
      : state_(std::move(state)),
        rank_(rank),
        k_(k),
        what_(std::move(what)),
        staged_(std::move(staged)),
        exceptions_(std::uncaught_exceptions()) {}

  ~AsyncCall() override {
    if (finished_) return;
    // Unwinding from an error: that error is the one to report, not the missing Wait().
    state_->Abandon(rank_, k_, /*never_waited=*/std::uncaught_exceptions() <= exceptions_, what_);
  }

  absl::Status Wait() override {
    if (finished_) {
      return absl::FailedPreconditionError(
          absl::StrCat(what_, ": Wait() called twice; wait each started call exactly once"));
    }
    finished_ = true;
    return state_->Wait(rank_, k_, what_);
  }

 private:
  std::shared_ptr<AsyncPpermutes> state_;
  const int rank_;
  const uint64_t k_;
  const std::string what_;
  std::vector<char> staged_;  // a private copy of send for an in-place call
  const int exceptions_;
  bool finished_ = false;
};

}  // namespace

std::shared_ptr<AsyncPpermutes> AsyncPpermutesOf(const std::shared_ptr<Group>& group) {
  // Keyed by address: a live state keeps its group alive, so an address is not reused while
  // its entry can still be locked.
  static std::mutex* mu = new std::mutex;
  static auto* states = new absl::flat_hash_map<const Group*, std::weak_ptr<AsyncPpermutes>>;
  std::lock_guard<std::mutex> l(*mu);
  std::shared_ptr<AsyncPpermutes> s = (*states)[group.get()].lock();
  if (s == nullptr) {
    absl::erase_if(*states, [](const auto& e) { return e.second.expired(); });
    s = std::make_shared<AsyncPpermutes>(group);
    (*states)[group.get()] = s;
  }
  return s;
}

absl::StatusOr<std::unique_ptr<PendingCollective>> StartAsyncPpermute(
    const std::shared_ptr<AsyncPpermutes>& state, int rank, const CallTag& tag, const void* send,
    void* recv, size_t count, DataType dtype, absl::Span<const std::pair<int, int>> pairs) {
  Group& g = state->group();
  std::string what =
      absl::StrCat("ppermute_start(", DataTypeName(dtype), ", count=", count, ") on group '",
                   g.name(), "' (", g.RankName(rank), ")");
  if (tag.describe != nullptr) what = absl::StrCat(tag.describe(tag.words), " [", what, "]");
  World& world = g.world();
  if (world.poisoned()) return world.Refusal(g.world_rank(rank), what);
  auto fail = [&](absl::Status s) {
    world.Poison(g.world_rank(rank), s);
    return s;
  };
  if (!IsValidDataType(dtype)) {
    return fail(absl::InvalidArgumentError(
        absl::StrCat(what, ": invalid DataType value ", static_cast<int>(dtype))));
  }
  const int n = g.size();
  std::vector<char> is_src(n, 0), is_dst(n, 0);
  int source = -1, dest = -1;
  for (const auto& [s, t] : pairs) {
    if (s < 0 || s >= n || t < 0 || t >= n) {
      return fail(absl::InvalidArgumentError(absl::StrCat(
          what, ": pair (", s, ", ", t, ") names a rank outside [0, ", n, ")")));
    }
    if (is_src[s]++ || is_dst[t]++) {
      return fail(absl::InvalidArgumentError(absl::StrCat(
          what, ": pair (", s, ", ", t, ") repeats a ", is_src[s] > 1 ? "source" : "destination",
          "; each rank may appear at most once as each")));
    }
    if (t == rank) source = s;
    if (s == rank) dest = t;
  }
  if (count > 0 && (send == nullptr || recv == nullptr)) {
    return fail(absl::InvalidArgumentError(
        absl::StrCat(what, ": ", send == nullptr ? "send" : "recv",
                     " is null but the call moves ", count, " elements")));
  }
  const size_t bytes = count * DataTypeSize(dtype);
  std::vector<char> staged;
  if (send == recv && bytes > 0 && dest >= 0) {  // in place: our recv is overwritten early
    staged.assign(static_cast<const char*>(send), static_cast<const char*>(send) + bytes);
    send = staged.data();
  }
  if (source < 0 && bytes > 0) std::memset(recv, 0, bytes);
  absl::StatusOr<uint64_t> k =
      state->Post(rank, tag, send, recv, count, dtype,
                  HashBytes(pairs.data(), pairs.size() * sizeof(pairs[0])), source, dest, what);
  if (!k.ok()) return fail(k.status());
  return std::unique_ptr<PendingCollective>(
      std::make_unique<AsyncCall>(state, rank, *k, std::move(what), std::move(staged)));
}

}  // namespace shardmap::collectives::internal
