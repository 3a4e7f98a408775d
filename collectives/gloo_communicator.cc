// Gloo backend. Gloo provides the TCP transport (full mesh of pairs, tagged non-blocking
// send/recv into unbound buffers); the algorithms are ours, so reductions run in rank order with
// the shared CPU kernel (internal::ReduceBuffers) and give the in-process backend's bits:
//   - every collective exchanges a call descriptor with every peer (the agreement phase, always
//     on the same slot, so a rank that skipped a call is caught too); the descriptor carries the
//     caller's CallTag (shardmap's op, axes, shape, program order), so calls reordered across
//     groups meet a peer whose tag differs and fail naming both. Most collectives move data only
//     after it, on slots numbered by the call's sequence number. The all-reduce posts its data
//     together with the descriptors, on slots hashed from the whole descriptor (CallSlotBase):
//     ranks whose calls differ exchange no byte (barring a 53-bit hash collision), and the
//     check costs no extra round trip;
//   - all-reduce above kSmallAllReduceBytes: direct reduce-scatter (each rank receives its slice
//     from every peer and reduces it in rank order, all n sources at once) then all-gather of the
//     reduced slices; every receive of the call is posted before any send, so sends find their
//     receive announced and leave at once; peers in staggered order (to me+k, from me-k). Below,
//     every rank receives every input and reduces everything (one round, same bits everywhere).
//     Cutting the slices into pipelined chunks (reduce chunk k while chunk k+1 arrives) was
//     measured slower on a 2-core machine: more messages, more wake-ups of Gloo's event loop.
// Failures close every connection of the world (GlooWorld::Poison): peers waiting on this rank
// fail at once naming it, and no late transfer can land in a buffer the caller got back. Before
// closing, the failing rank sends its status (code and message) to every peer, and a peer that
// then loses the connection re-raises that status with the failing rank's code.
// Started calls (AllReduceStart, ...) run on a lane (async_lane.h): a background thread per
// communicator over a duplicate group (a Split at the first start), whose connections are
// registered with the world like any split. Two threads of a process may then wait at once, and
// closing connections wakes only the peers, so Poison also aborts the wait in progress on every
// group of this process (GroupLink::AbortWaits), which then fails with the world's first failure.
#include "collectives/gloo_communicator.h"

#include <arpa/inet.h>
#include <net/if.h>
#include <netdb.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "collectives/async_lane.h"
#include "collectives/distributed_env.h"
#include "collectives/gloo_store.h"
#include "collectives/internal/collective_op.h"
#include "collectives/internal/reduce.h"
#include "collectives/internal/status_macros.h"
#include "gloo/rendezvous/context.h"
#include "gloo/transport/tcp/device.h"
#include "gloo/transport/unbound_buffer.h"

namespace shardmap::collectives {
namespace {

using internal::HasDtype;
using internal::HasReduce;
using internal::Op;
using internal::OpName;

constexpr uint32_t kMagic = 0x474c4f4f;  // "GLOO"

// What one rank called, exchanged with every peer before data moves.
struct Desc {
  uint32_t magic = kMagic;
  Op op = Op::kBarrier;
  DataType dtype = DataType::kF32;
  ReduceOp reduce = ReduceOp::kSum;
  uint8_t unused = 0;
  int64_t root = 0;
  uint64_t seq = 0;
  uint64_t count = 0;
  uint64_t layout = 0;  // hash of the counts vector or the ppermute pairs
  // AllToAllV, per peer: elements the sender sends to the receiver, and expects from it.
  uint64_t to_you = 0;
  uint64_t from_you = 0;
  // The caller's CallTag words (op, axis mask, dtype, shape, program-order number; bytes only:
  // each rank formats them with its own describe function), all zero when untagged.
  uint64_t tag[CallTag::kWords] = {};

  bool SameCall(const Desc& o) const {
    return op == o.op && dtype == o.dtype && reduce == o.reduce && root == o.root &&
           seq == o.seq && count == o.count && layout == o.layout;
  }
};

std::string Describe(const Desc& d) {
  std::string s = absl::StrCat(OpName(d.op), "(");
  if (HasDtype(d.op)) {
    absl::StrAppend(&s, IsValidDataType(d.dtype) ? DataTypeName(d.dtype) : "invalid dtype");
    if (HasReduce(d.op)) {
      absl::StrAppend(&s, ", ", IsValidReduceOp(d.reduce) ? ReduceOpName(d.reduce) : "invalid op");
    }
    absl::StrAppend(&s, ", count=", d.count);
    if (d.op == Op::kBroadcast) absl::StrAppend(&s, ", root=", d.root);
  }
  absl::StrAppend(&s, ") #", d.seq);
  return s;
}

// Send/Recv announce their call to the peer before the data.
struct P2PHeader {
  uint32_t magic = kMagic;
  DataType dtype = DataType::kF32;
  uint64_t count = 0;
};

uint64_t HashBytes(const void* p, size_t n) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  const unsigned char* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

std::vector<size_t> Offsets(absl::Span<const size_t> counts) {
  std::vector<size_t> off(counts.size() + 1, 0);
  for (size_t i = 0; i < counts.size(); ++i) off[i + 1] = off[i] + counts[i];
  return off;
}

// [begin, end) of rank r's slice of `count` elements, cut at cache-line multiples.
std::pair<size_t, size_t> SliceOf(int r, int n, size_t count, size_t esz) {
  const size_t align = std::max<size_t>(1, 64 / esz);
  size_t per = (count + n - 1) / n;
  per = (per + align - 1) / align * align;
  const size_t b = std::min(count, per * r);
  return {b, std::min(count, b + per)};
}

constexpr size_t kSmallAllReduceBytes = 32 << 10;

// Slots: the agreement phase always uses kAgreeSlot; data phase p of call s uses (s << 8) | p,
// or (all-reduce) kHashedBit | hash(call) << 8 | p; Send/Recv use kP2PBit | (k << 8) | p for
// the k-th message between the pair.
constexpr uint64_t kAgreeSlot = 1;  // GroupLink::kAbortSlot is 2
constexpr uint64_t kP2PBit = 1ull << 62;
constexpr uint64_t kHashedBit = 1ull << 61;  // see CallSlotBase

char* Bytes(void* p) { return static_cast<char*>(p); }
const char* Bytes(const void* p) { return static_cast<const char*>(p); }

std::chrono::milliseconds ToMillis(absl::Duration d) {
  return std::chrono::milliseconds(std::max<int64_t>(1, absl::ToInt64Milliseconds(d)));
}

// One group's Gloo context plus its abort inbox: every rank keeps a receive posted from every
// peer on kAbortSlot, so a rank that fails can tell its peers why before it closes its
// connections, and a peer that then loses the connection reports the first failure's reason
// (naming the rank that died) instead of only "lost the rank that gave up".
class GroupLink {
 public:
  static constexpr size_t kNoticeBytes = 1024;

  explicit GroupLink(std::shared_ptr<gloo::Context> ctx)
      : ctx_(std::move(ctx)),
        inbox_(ctx_->size * kNoticeBytes, 0),
        inbox_bufs_(ctx_->size),
        received_(ctx_->size, false) {}

  // Closes the connections before the inbox goes: a notice still arriving then lands nowhere
  // (the pair's lock orders the close after any read into the inbox, which ThreadSanitizer
  // sees; the unbound buffers' own wait for the I/O thread is invisible to it).
  ~GroupLink() { Close(); }

  gloo::Context& ctx() { return *ctx_; }

  absl::Status Arm() {
    try {
      for (int p = 0; p < ctx_->size; ++p) {
        if (p == ctx_->rank) continue;
        inbox_bufs_[p] = ctx_->createUnboundBuffer(inbox_.data() + p * kNoticeBytes, kNoticeBytes);
        inbox_bufs_[p]->recv(p, kAbortSlot);
      }
    } catch (const std::exception& e) {
      return absl::UnavailableError(absl::StrCat("arming the abort inbox failed: ", e.what()));
    }
    return absl::OkStatus();
  }

  // Best effort: queues `why` (its code in the first byte, then its message) to every peer and
  // waits briefly for it to reach the sockets.
  void SendNotices(const absl::Status& why) {
    if (outbox_buf_ != nullptr) return;  // already sent
    std::memset(outbox_, 0, kNoticeBytes);
    outbox_[0] = static_cast<char>(static_cast<int>(why.code()));
    std::memcpy(outbox_ + 1, why.message().data(), std::min(why.message().size(), kNoticeBytes - 2));
    int posted = 0;
    try {
      outbox_buf_ = ctx_->createUnboundBuffer(outbox_, kNoticeBytes);
    } catch (const std::exception&) {
      return;
    }
    for (int p = 0; p < ctx_->size; ++p) {
      if (p == ctx_->rank) continue;
      try {
        outbox_buf_->send(p, kAbortSlot);
        ++posted;
      } catch (const std::exception&) {
        // The connection to p is already broken (p may be the rank that died).
      }
    }
    try {
      for (int i = 0; i < posted; ++i) outbox_buf_->waitSend(std::chrono::milliseconds(500));
    } catch (const std::exception&) {
    }
  }

  // Resets every connection: peers blocked on this rank wake up, and no transfer still posted
  // can land in a caller's buffer after the failed call returned.
  void Close() {
    try {
      ctx_->closeConnections();
    } catch (const std::exception&) {
    }
  }

  // The failure `peer` announced before it closed its connections (OK if it did not). Sent on
  // the connection before it closes, so it arrives before the close is seen.
  absl::Status NoticeFrom(int peer) {
    if (peer < 0 || peer >= ctx_->size) return absl::OkStatus();
    std::lock_guard<std::mutex> lock(notice_mu_);
    if (!inbox_bufs_[peer]) return absl::OkStatus();
    if (!received_[peer]) {
      try {
        if (!inbox_bufs_[peer]->waitRecv(std::chrono::milliseconds(1))) return absl::OkStatus();
      } catch (const std::exception&) {
        return absl::OkStatus();
      }
      received_[peer] = true;
    }
    const char* m = inbox_.data() + peer * kNoticeBytes;
    int code = static_cast<unsigned char>(m[0]);
    if (code == 0 || code > static_cast<int>(absl::StatusCode::kUnauthenticated)) {
      code = static_cast<int>(absl::StatusCode::kUnknown);
    }
    return absl::Status(static_cast<absl::StatusCode>(code),
                        std::string(m + 1, strnlen(m + 1, kNoticeBytes - 1)));
  }

  static constexpr uint64_t kAbortSlot = 2;

  // The transfer this group's calling thread is waiting for (one thread per group), so that a
  // failure raised by another thread of this process (a communicator and its lane of started
  // calls) ends the wait at once: closing the connections wakes the peers, not local waiters.
  // False once aborted: the caller must not wait.
  bool BeginWait(gloo::transport::UnboundBuffer* b, bool is_send) {
    std::lock_guard<std::mutex> lock(wait_mu_);
    if (aborted_) return false;
    waiting_ = b;
    waiting_send_ = is_send;
    return true;
  }
  void EndWait() {
    std::lock_guard<std::mutex> lock(wait_mu_);
    waiting_ = nullptr;
  }
  void AbortWaits() {
    std::lock_guard<std::mutex> lock(wait_mu_);
    aborted_ = true;
    if (waiting_ == nullptr) return;
    if (waiting_send_) {
      waiting_->abortWaitSend();
    } else {
      waiting_->abortWaitRecv();
    }
  }

 private:
  std::mutex wait_mu_;
  bool aborted_ = false;                                // guarded by wait_mu_
  gloo::transport::UnboundBuffer* waiting_ = nullptr;  // guarded by wait_mu_
  bool waiting_send_ = false;                           // guarded by wait_mu_

  const std::shared_ptr<gloo::Context> ctx_;
  std::vector<char> inbox_;
  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> inbox_bufs_;
  std::mutex notice_mu_;
  std::vector<bool> received_;  // guarded by notice_mu_: a notice is waited for once
  char outbox_[kNoticeBytes];
  std::unique_ptr<gloo::transport::UnboundBuffer> outbox_buf_;
};

// Shared by a world communicator and every communicator split from it.
struct GlooWorld {
  std::shared_ptr<TcpStore> store;
  std::shared_ptr<gloo::transport::Device> device;
  absl::Duration timeout;
  std::string store_prefix;

  std::mutex mu;
  absl::Status failure;  // the first failure; OK while healthy
  std::vector<std::weak_ptr<GroupLink>> links;

  void Register(const std::shared_ptr<GroupLink>& l) {
    std::lock_guard<std::mutex> lock(mu);
    links.push_back(l);
  }
  absl::Status Failure() {
    std::lock_guard<std::mutex> lock(mu);
    return failure;
  }
  // Serialises Poison: a communicator's thread and its lane's may fail at once, and a group's
  // notices are sent once (GroupLink::SendNotices is not thread-safe); a second caller returns
  // only once the first has closed everything, so no late transfer lands in its buffers either.
  std::mutex poison_mu;

  // Records the first failure, tells every peer of every group why, and closes the connections.
  void Poison(const absl::Status& s) {
    std::lock_guard<std::mutex> serial(poison_mu);
    std::vector<std::shared_ptr<GroupLink>> live;
    absl::Status first;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (failure.ok()) failure = s;
      first = failure;
      for (auto& w : links) {
        if (auto l = w.lock()) live.push_back(std::move(l));
      }
    }
    for (auto& l : live) l->SendNotices(first);
    for (auto& l : live) l->Close();
    for (auto& l : live) l->AbortWaits();
  }
};

// One point-to-point transfer of a phase.
struct Xfer {
  int peer;
  bool is_send;
  const void* ptr;
  size_t bytes;
  uint64_t slot;
};

class GlooCommunicator final : public internal::ForwardingCommunicator {
 public:
  GlooCommunicator(std::shared_ptr<GlooWorld> world, std::shared_ptr<GroupLink> link,
                   std::vector<int> world_ranks, std::string name)
      : world_(std::move(world)),
        link_(std::move(link)),
        ctx_(&link_->ctx()),
        world_ranks_(std::move(world_ranks)),
        name_(std::move(name)),
        p2p_sent_(ctx_->size, 0),
        p2p_received_(ctx_->size, 0) {}

  int rank() const override { return ctx_->rank; }
  int size() const override { return ctx_->size; }
  std::string name() const override { return name_; }

  absl::Status Barrier() override {
    return Finish([&]() -> absl::Status {
      Desc d;
      d.op = Op::kBarrier;
      SM_COLL_RETURN_IF_ERROR(Begin(d));
      return Agree(d);
    }());
  }
  absl::StatusOr<std::unique_ptr<Communicator>> Split(int color, int key) override {
    absl::StatusOr<std::unique_ptr<Communicator>> r = DoSplit(color, key);
    if (!r.ok()) return Finish(r.status());
    return r;
  }
  // Tags travel in the call descriptor every collective exchanges anyway: compared for free.
  void TagNextCall(const CallTag& tag) override { next_tag_ = tag; }
  bool ComparesCallTags() const override { return true; }

  // Started calls run on the lane (async_lane.h): a thread of this communicator over a
  // duplicate group with its own connections, registered with the world like any split, so a
  // failure anywhere closes them too and the failing rank's notice reaches the lane's calls.
  absl::StatusOr<std::unique_ptr<PendingCollective>> AllReduceStart(
      const void* send, void* recv, size_t count, DataType dtype, ReduceOp op) override {
    return OnLane(StartedCallName("AllReduceStart", dtype, &op, count, name_),
                  [=](Communicator& dup) { return dup.AllReduce(send, recv, count, dtype, op); });
  }
  absl::StatusOr<std::unique_ptr<PendingCollective>> AllGatherStart(
      const void* send, void* recv, size_t send_count, DataType dtype) override {
    return OnLane(StartedCallName("AllGatherStart", dtype, nullptr, send_count, name_),
                  [=](Communicator& dup) { return dup.AllGather(send, recv, send_count, dtype); });
  }
  absl::StatusOr<std::unique_ptr<PendingCollective>> ReduceScatterStart(
      const void* send, void* recv, size_t recv_count, DataType dtype, ReduceOp op) override {
    return OnLane(StartedCallName("ReduceScatterStart", dtype, &op, recv_count, name_),
                  [=](Communicator& dup) {
                    return dup.ReduceScatter(send, recv, recv_count, dtype, op);
                  });
  }
  bool OverlapsStartedCalls() const override { return true; }

 private:
  std::string RankName(int r) const {
    if (world_ranks_[r] == r && name_.find('/') == std::string::npos) return absl::StrCat("rank ", r);
    return absl::StrCat("rank ", r, " (world rank ", world_ranks_[r], ")");
  }

  absl::Status Finish(absl::Status s) override {
    if (!s.ok()) world_->Poison(s);
    return s;
  }

  // The pending tag goes to the lane's call, not to the Split that opens the lane.
  absl::StatusOr<std::unique_ptr<PendingCollective>> OnLane(std::string what,
                                                            AsyncLane::Call call) {
    const CallTag tag = next_tag_;
    next_tag_ = CallTag{};
    if (absl::Status f = world_->Failure(); !f.ok()) {  // no Split on a failed world
      return absl::AbortedError(
          absl::StrCat(what, " refused: the Gloo world failed earlier: ", f.message()));
    }
    return lane_.Start(*this, std::move(what), tag, std::move(call));
  }

  absl::Status Invalid(absl::string_view why) const {
    return absl::InvalidArgumentError(absl::StrCat(what_, ": ", why));
  }

  // Starts a call on this rank: names it for errors, refuses it on a failed world, checks enums.
  absl::Status Begin(const Desc& d) {
    tag_ = next_tag_;  // a tag applies to this call only (point-to-point calls drop it)
    next_tag_ = CallTag{};
    Desc numbered = d;
    numbered.seq = seq_ + 1;
    what_ = absl::StrCat(Describe(numbered), " on group '", name_, "' (", RankName(rank()), ")");
    return Refuse(d.op == Op::kBarrier || d.op == Op::kSplit ? nullptr : &d);
  }

  absl::Status Refuse(const Desc* d) {
    if (absl::Status f = world_->Failure(); !f.ok()) {
      return absl::AbortedError(
          absl::StrCat(what_, " refused: the Gloo world failed earlier: ", f.message()));
    }
    if (d != nullptr && !IsValidDataType(d->dtype)) {
      return Invalid(absl::StrCat("invalid DataType value ", static_cast<int>(d->dtype)));
    }
    if (d != nullptr && HasReduce(d->op) && !IsValidReduceOp(d->reduce)) {
      return Invalid(absl::StrCat("invalid ReduceOp value ", static_cast<int>(d->reduce)));
    }
    return absl::OkStatus();
  }

  absl::Status CheckBuffer(const void* p, size_t count, const char* which) const {
    if (p == nullptr && count > 0) {
      return Invalid(absl::StrCat(which, " is null but ", count, " elements were requested"));
    }
    return absl::OkStatus();
  }

  absl::Status CheckCounts(absl::Span<const size_t> counts, const char* which) const {
    if (counts.size() != static_cast<size_t>(size())) {
      return Invalid(absl::StrCat(which, " has ", counts.size(), " entries but the group has ",
                                  size(), " ranks"));
    }
    return absl::OkStatus();
  }

  uint64_t DataSlot(int phase) const { return (seq_ << 8) | static_cast<uint64_t>(phase); }

  using Deadline = std::chrono::steady_clock::time_point;
  Deadline NewDeadline() const {
    return std::chrono::steady_clock::now() + ToMillis(world_->timeout);
  }

  // Transfers posted now and waited for one by one later, so that a phase can start before the
  // previous one ended. Kept alive until every transfer is waited for or the call failed (a
  // failure poisons the world first, so nothing lands in a buffer after the call returned).
  struct Posted {
    std::vector<Xfer> xs;
    std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> bufs;
  };

  absl::Status Fail(absl::Status s) {
    world_->Poison(s);
    return s;
  }

  // Posts x; its index in `posted` is the number of transfers posted before it.
  absl::Status Post(Posted& posted, const Xfer& x) {
    posted.xs.push_back(x);
    posted.bufs.emplace_back();
    if (x.bytes == 0) return absl::OkStatus();
    try {
      std::unique_ptr<gloo::transport::UnboundBuffer>& buf = posted.bufs.back();
      buf = ctx_->createUnboundBuffer(const_cast<void*>(x.ptr), x.bytes);
      if (x.is_send) {
        buf->send(x.peer, x.slot);
      } else {
        buf->recv(x.peer, x.slot);
      }
    } catch (const std::exception& e) {
      return Fail(PeerFailure(x.peer, e.what(), false));
    }
    return absl::OkStatus();
  }

  absl::Status Await(Posted& posted, size_t i, Deadline deadline) {
    std::unique_ptr<gloo::transport::UnboundBuffer>& buf = posted.bufs[i];
    if (!buf) return absl::OkStatus();
    const Xfer& x = posted.xs[i];
    if (!link_->BeginWait(buf.get(), x.is_send)) return Fail(Aborted());
    bool done = false;
    try {
      const auto left = std::max(std::chrono::milliseconds(1),
                                 std::chrono::duration_cast<std::chrono::milliseconds>(
                                     deadline - std::chrono::steady_clock::now()));
      done = x.is_send ? buf->waitSend(left) : buf->waitRecv(left);
    } catch (const std::exception& e) {
      link_->EndWait();
      return Fail(PeerFailure(x.peer, e.what(), std::chrono::steady_clock::now() >= deadline));
    }
    link_->EndWait();
    if (!done) return Fail(Aborted());
    buf.reset();
    return absl::OkStatus();
  }

  // A wait ended by GroupLink::AbortWaits: this process's world failed in another thread (the
  // owner of a lane, or the lane); reported with that failure's code.
  absl::Status Aborted() const {
    const absl::Status f = world_->Failure();
    if (f.ok()) return absl::AbortedError(absl::StrCat(what_, ": the wait was aborted"));
    return absl::Status(f.code(), absl::StrCat(what_, ": aborted: this rank's Gloo world failed "
                                               "meanwhile: ", f.message()));
  }

  absl::Status AwaitAll(Posted& posted, Deadline deadline) {
    for (size_t i = 0; i < posted.xs.size(); ++i) {
      SM_COLL_RETURN_IF_ERROR(Await(posted, i, deadline));
    }
    return absl::OkStatus();
  }

  // Posts every transfer (receives first), then waits for all of them.
  absl::Status Exchange(absl::Span<const Xfer> xs) {
    const Deadline deadline = NewDeadline();
    Posted posted;
    for (bool sends : {false, true}) {
      for (const Xfer& x : xs) {
        if (x.is_send == sends) SM_COLL_RETURN_IF_ERROR(Post(posted, x));
      }
    }
    return AwaitAll(posted, deadline);
  }

  // Data slots of a call whose transfers are posted before its agreement is checked: a hash of
  // everything the agreement compares (sequence number included), so ranks whose calls differ
  // use different slots and no byte moves between them (Gloo would abort the process on a
  // message longer than the receive posted for it), barring a collision of the 53 bits kept.
  // kHashedBit keeps them apart from the sequence-numbered slots; the low byte is the phase.
  static uint64_t CallSlotBase(const Desc& d) {
    const uint64_t fields[] = {static_cast<uint64_t>(d.op), static_cast<uint64_t>(d.dtype),
                               static_cast<uint64_t>(d.reduce), static_cast<uint64_t>(d.root),
                               d.seq, d.count, d.layout};
    uint64_t h = HashBytes(fields, sizeof(fields));
    h ^= HashBytes(d.tag, sizeof(d.tag)) * 31;
    return kHashedBit | ((h << 8) & (kHashedBit - 1));
  }

  absl::Status PeerFailure(int peer, absl::string_view why, bool timed_out) {
    if (timed_out || absl::StrContains(why, "Timed out")) {
      return absl::DeadlineExceededError(absl::StrCat(
          what_, ": timed out after ", absl::FormatDuration(world_->timeout), " waiting for ",
          RankName(peer), " (is it hung, or waiting in a different collective?)"));
    }
    // The peer's own failure, with its own code: every rank reports the same kind of error
    // (a mismatch is INVALID_ARGUMENT everywhere) whichever rank saw it first.
    if (absl::Status notice = link_->NoticeFrom(peer); !notice.ok()) {
      return absl::Status(notice.code(), absl::StrCat(what_, ": ", RankName(peer),
                                                      " failed and closed its connections: ",
                                                      notice.message()));
    }
    return absl::UnavailableError(absl::StrCat(
        what_, ": lost ", RankName(peer), " (its process exited or crashed, or it failed and "
        "closed its connections): ", why));
  }

  // The agreement phase: every rank sends its call to every peer and checks all of them. Every
  // rank sees every rank's call, so all report the same mismatch (rank 0 against the first rank
  // that differs from it). send_counts/recv_counts: AllToAllV's pairwise check.
  absl::Status Agree(Desc mine, absl::Span<const size_t> send_counts = {},
                     absl::Span<const size_t> recv_counts = {}) {
    const Deadline deadline = NewDeadline();
    Posted posted;
    Agreement a;
    SM_COLL_RETURN_IF_ERROR(StartAgree(mine, posted, a, send_counts, recv_counts));
    return FinishAgree(posted, a, deadline, send_counts, recv_counts);
  }

  // What the agreement phase of one call sends and receives; `posted` indices of its receives.
  struct Agreement {
    std::vector<Desc> out, in;
    std::vector<size_t> recvs;
  };

  // Numbers the call, posts its descriptor to every peer and the receives of theirs. Transfers
  // posted after this and before FinishAgree overlap the agreement round trip.
  absl::Status StartAgree(Desc mine, Posted& posted, Agreement& a,
                          absl::Span<const size_t> send_counts = {},
                          absl::Span<const size_t> recv_counts = {}) {
    mine.seq = ++seq_;
    std::copy(std::begin(tag_.words), std::end(tag_.words), std::begin(mine.tag));
    const int n = size();
    const int me = rank();
    a.out.assign(n, mine);
    a.in.assign(n, mine);
    for (int p = 0; p < n; ++p) {
      if (p == me) continue;
      a.recvs.push_back(posted.xs.size());
      SM_COLL_RETURN_IF_ERROR(Post(posted, {p, false, &a.in[p], sizeof(Desc), kAgreeSlot}));
    }
    for (int p = 0; p < n; ++p) {
      if (p == me) continue;
      if (!send_counts.empty()) {
        a.out[p].to_you = send_counts[p];
        a.out[p].from_you = recv_counts[p];
      }
      SM_COLL_RETURN_IF_ERROR(Post(posted, {p, true, &a.out[p], sizeof(Desc), kAgreeSlot}));
    }
    return absl::OkStatus();
  }

  // Waits for every peer's descriptor and checks them. A mismatch poisons the world at once, so
  // transfers posted since StartAgree can land nowhere after the call returned.
  absl::Status FinishAgree(Posted& posted, Agreement& a, Deadline deadline,
                           absl::Span<const size_t> send_counts = {},
                           absl::Span<const size_t> recv_counts = {}) {
    for (size_t i : a.recvs) {
      if (absl::Status s = Await(posted, i, deadline); !s.ok()) {
        return MismatchOr(s, posted, a, send_counts, recv_counts);
      }
    }
    absl::Status s = CheckAgreement(a.in, send_counts, recv_counts);
    if (!s.ok()) return Fail(s);
    return absl::OkStatus();
  }

  // `failed` (the world already poisoned by it), or the mismatch that caused it. A rank that
  // finds the calls mismatched closes its connections at once, so a slower peer can fail on a
  // transfer it posts after its descriptors (or on a later descriptor) before it has checked
  // them; the descriptors that did arrive tell every rank the same mismatch, as the agreement
  // would have.
  absl::Status MismatchOr(absl::Status failed, Posted& posted, Agreement& a,
                          absl::Span<const size_t> send_counts = {},
                          absl::Span<const size_t> recv_counts = {}) {
    for (size_t i : a.recvs) {
      std::unique_ptr<gloo::transport::UnboundBuffer>& buf = posted.bufs[i];
      if (!buf) continue;  // awaited already
      try {
        // Returns at once when the descriptor has arrived; throws when its connection is gone.
        if (!buf->waitRecv(std::chrono::milliseconds(100))) return failed;
      } catch (const std::exception&) {
        return failed;
      }
      buf.reset();
    }
    absl::Status mismatch = CheckAgreement(a.in, send_counts, recv_counts);
    return mismatch.ok() ? failed : mismatch;
  }

  // Post, for the transfers an all-reduce posts between StartAgree and FinishAgree.
  absl::Status PostBeforeAgreed(Posted& posted, Agreement& a, const Xfer& x) {
    absl::Status s = Post(posted, x);
    return s.ok() ? s : MismatchOr(s, posted, a);
  }

  absl::Status CheckAgreement(const std::vector<Desc>& in, absl::Span<const size_t> send_counts,
                              absl::Span<const size_t> recv_counts) {
    const int n = size();
    const int me = rank();
    for (int p = 0; p < n; ++p) {
      if (in[p].magic != kMagic) {
        return absl::InternalError(absl::StrCat(what_, ": ", RankName(p),
                                                " sent a corrupt call descriptor"));
      }
    }
    for (int p = 1; p < n; ++p) {
      if (std::equal(std::begin(in[0].tag), std::end(in[0].tag), std::begin(in[p].tag))) continue;
      // The caller's view (op, axes, shape, program order) says more than ours: report it.
      auto describe = [&](const Desc& d) {
        const bool tagged = std::any_of(std::begin(d.tag), std::end(d.tag),
                                        [](uint64_t w) { return w != 0; });
        if (!tagged) return absl::StrCat("an untagged ", Describe(d));
        if (tag_.describe == nullptr) return absl::StrCat("a tagged ", Describe(d));
        return absl::StrCat(tag_.describe(d.tag), " [", Describe(d), "]");
      };
      return absl::InvalidArgumentError(absl::StrCat(
          "mismatched collectives: ", RankName(0), " issued ", describe(in[0]), " but ",
          RankName(p), " issued ", describe(in[p]), " at the same point (group '", name_,
          "'); every rank must issue the same collectives, with the same shapes, in the same "
          "order: look for rank-dependent control flow or per-rank shapes before this call"));
    }
    for (int p = 1; p < n; ++p) {
      if (in[p].SameCall(in[0])) continue;
      return absl::InvalidArgumentError(absl::StrCat(
          "mismatched collectives on group '", name_, "': ", RankName(0), " called ",
          Describe(in[0]), " but ", RankName(p), " called ", Describe(in[p]),
          "; every rank of a group must issue the same collectives in the same order"));
    }
    if (!send_counts.empty()) {
      for (int p = 0; p < n; ++p) {
        if (p == me) continue;
        if (in[p].to_you != recv_counts[p] || in[p].from_you != send_counts[p]) {
          return Invalid(absl::StrCat(
              RankName(p), " sends ", in[p].to_you, " elements to this rank, which expects ",
              recv_counts[p], ", and expects ", in[p].from_you, " from this rank, which sends ",
              send_counts[p], " (recv_counts[q] on rank p must equal send_counts[p] on rank q)"));
        }
      }
    }
    return absl::OkStatus();
  }

  absl::Status DoAllReduce(const void* send, void* recv, size_t count, DataType dtype,
                           ReduceOp op) override {
    const Desc d{kMagic, Op::kAllReduce, dtype, op, 0, 0, 0, count};
    SM_COLL_RETURN_IF_ERROR(Begin(d));
    SM_COLL_RETURN_IF_ERROR(CheckBuffer(send, count, "send"));
    SM_COLL_RETURN_IF_ERROR(CheckBuffer(recv, count, "recv"));
    const int n = size();
    const int me = rank();
    const size_t esz = DataTypeSize(dtype);
    const size_t bytes = count * esz;
    const Deadline deadline = NewDeadline();
    Posted posted;
    Agreement agreement;
    SM_COLL_RETURN_IF_ERROR(StartAgree(d, posted, agreement));
    // The data moves on slots derived from this rank's whole descriptor, so it meets only a
    // peer that made the same call and can be posted before the descriptors are checked: the
    // check then costs no extra round trip.
    const uint64_t base = CallSlotBase(agreement.out[me]);
    if (count == 0 || n == 1) {
      SM_COLL_RETURN_IF_ERROR(FinishAgree(posted, agreement, deadline));
      if (count > 0) internal::ReduceBuffers(recv, &send, 1, count, dtype, op);  // avg too
      return absl::OkStatus();
    }
    std::vector<const void*> srcs(n);
    if (bytes <= kSmallAllReduceBytes) {
      // One round: every rank gets every input and reduces all of it in rank order.
      if (scratch_.size() < n * bytes) scratch_.resize(n * bytes);
      for (int p = 0; p < n; ++p) srcs[p] = p == me ? send : scratch_.data() + p * bytes;
      for (int k = 1; k < n; ++k) {
        const int p = (me - k + n) % n;
        SM_COLL_RETURN_IF_ERROR(
            PostBeforeAgreed(posted, agreement, {p, false, srcs[p], bytes, base | 1}));
      }
      for (int k = 1; k < n; ++k) {
        SM_COLL_RETURN_IF_ERROR(
            PostBeforeAgreed(posted, agreement, {(me + k) % n, true, send, bytes, base | 1}));
      }
      SM_COLL_RETURN_IF_ERROR(FinishAgree(posted, agreement, deadline));
      SM_COLL_RETURN_IF_ERROR(AwaitAll(posted, deadline));
      internal::ReduceBuffers(recv, srcs.data(), n, count, dtype, op);
      return absl::OkStatus();
    }
    // Reduce-scatter (receive this rank's slice of every peer's input, reduce it in rank order),
    // then all-gather of the reduced slices. Every receive is posted first, so that a peer's
    // send finds it announced and goes out from the sending thread at once; peers are visited
    // in staggered order (send to me+k, receive from me-k), so ranks do not all start with
    // rank 0. In place (send == recv) is safe: a peer's reduced slice lands where our input for
    // it was, and it is sent only after the peer received all of that input.
    const auto [b, e] = SliceOf(me, n, count, esz);
    const size_t mine = (e - b) * esz;
    if (scratch_.size() < n * mine) scratch_.resize(n * mine);
    std::vector<size_t> rs_recvs;
    for (int k = 1; k < n; ++k) {
      const int p = (me - k + n) % n;
      srcs[p] = scratch_.data() + p * mine;
      rs_recvs.push_back(posted.xs.size());
      SM_COLL_RETURN_IF_ERROR(
          PostBeforeAgreed(posted, agreement, {p, false, srcs[p], mine, base | 1}));
    }
    srcs[me] = Bytes(send) + b * esz;
    for (int k = 1; k < n; ++k) {
      const int p = (me - k + n) % n;
      const auto [pb, pe] = SliceOf(p, n, count, esz);
      SM_COLL_RETURN_IF_ERROR(PostBeforeAgreed(
          posted, agreement, {p, false, Bytes(recv) + pb * esz, (pe - pb) * esz, base | 2}));
    }
    for (int k = 1; k < n; ++k) {
      const int p = (me + k) % n;
      const auto [pb, pe] = SliceOf(p, n, count, esz);
      SM_COLL_RETURN_IF_ERROR(PostBeforeAgreed(
          posted, agreement, {p, true, Bytes(send) + pb * esz, (pe - pb) * esz, base | 1}));
    }
    SM_COLL_RETURN_IF_ERROR(FinishAgree(posted, agreement, deadline));
    for (size_t i : rs_recvs) SM_COLL_RETURN_IF_ERROR(Await(posted, i, deadline));
    if (e > b) internal::ReduceBuffers(Bytes(recv) + b * esz, srcs.data(), n, e - b, dtype, op);
    for (int k = 1; k < n; ++k) {
      SM_COLL_RETURN_IF_ERROR(
          Post(posted, {(me + k) % n, true, Bytes(recv) + b * esz, mine, base | 2}));
    }
    return AwaitAll(posted, deadline);
  }

  absl::Status DoAllGatherV(Op kind, const void* send, void* recv,
                            absl::Span<const size_t> counts, DataType dtype) override {
    Desc d{kMagic, kind, dtype};
    d.count = kind == Op::kAllGather && !counts.empty() ? counts[0] : 0;
    d.layout = HashBytes(counts.data(), counts.size() * sizeof(size_t));
    SM_COLL_RETURN_IF_ERROR(Begin(d));
    SM_COLL_RETURN_IF_ERROR(CheckCounts(counts, "counts"));
    const std::vector<size_t> off = Offsets(counts);
    const int me = rank();
    SM_COLL_RETURN_IF_ERROR(CheckBuffer(send, counts[me], "send"));
    SM_COLL_RETURN_IF_ERROR(CheckBuffer(recv, off.back(), "recv"));
    SM_COLL_RETURN_IF_ERROR(Agree(d));
    const size_t esz = DataTypeSize(dtype);
    char* own = Bytes(recv) + off[me] * esz;
    if (counts[me] > 0 && own != send) std::memcpy(own, send, counts[me] * esz);
    std::vector<Xfer> xs;
    for (int p = 0; p < size(); ++p) {
      if (p == me) continue;
      xs.push_back({p, true, send, counts[me] * esz, DataSlot(1)});
      xs.push_back({p, false, Bytes(recv) + off[p] * esz, counts[p] * esz, DataSlot(1)});
    }
    return Exchange(xs);
  }

  absl::Status DoReduceScatterV(Op kind, const void* send, void* recv,
                                absl::Span<const size_t> counts, DataType dtype,
                                ReduceOp op) override {
    Desc d{kMagic, kind, dtype, op};
    d.count = kind == Op::kReduceScatter && !counts.empty() ? counts[0] : 0;
    d.layout = HashBytes(counts.data(), counts.size() * sizeof(size_t));
    SM_COLL_RETURN_IF_ERROR(Begin(d));
    SM_COLL_RETURN_IF_ERROR(CheckCounts(counts, "counts"));
    const std::vector<size_t> off = Offsets(counts);
    const int n = size();
    const int me = rank();
    SM_COLL_RETURN_IF_ERROR(CheckBuffer(send, off.back(), "send"));
    SM_COLL_RETURN_IF_ERROR(CheckBuffer(recv, counts[me], "recv"));
    SM_COLL_RETURN_IF_ERROR(Agree(d));
    const size_t esz = DataTypeSize(dtype);
    const size_t mine = counts[me] * esz;
    scratch_.resize(n * mine);
    std::vector<const void*> srcs(n);
    std::vector<Xfer> xs;
    for (int p = 0; p < n; ++p) {
      srcs[p] = p == me ? Bytes(send) + off[me] * esz : scratch_.data() + p * mine;
      if (p == me) continue;
      xs.push_back({p, true, Bytes(send) + off[p] * esz, counts[p] * esz, DataSlot(1)});
      xs.push_back({p, false, srcs[p], mine, DataSlot(1)});
    }
    SM_COLL_RETURN_IF_ERROR(Exchange(xs));
    internal::ReduceBuffers(recv, srcs.data(), n, counts[me], dtype, op);
    return absl::OkStatus();
  }

  absl::Status DoAllToAllV(Op kind, const void* send, absl::Span<const size_t> send_counts,
                           void* recv, absl::Span<const size_t> recv_counts,
                           DataType dtype) override {
    Desc d{kMagic, kind, dtype};
    if (kind == Op::kAllToAll && !send_counts.empty()) d.count = send_counts[0];
    SM_COLL_RETURN_IF_ERROR(Begin(d));
    SM_COLL_RETURN_IF_ERROR(CheckCounts(send_counts, "send_counts"));
    SM_COLL_RETURN_IF_ERROR(CheckCounts(recv_counts, "recv_counts"));
    const std::vector<size_t> soff = Offsets(send_counts);
    const std::vector<size_t> roff = Offsets(recv_counts);
    SM_COLL_RETURN_IF_ERROR(CheckBuffer(send, soff.back(), "send"));
    SM_COLL_RETURN_IF_ERROR(CheckBuffer(recv, roff.back(), "recv"));
    const int me = rank();
    if (send_counts[me] != recv_counts[me]) {
      return Invalid(absl::StrCat("send_counts[", me, "] = ", send_counts[me],
                                  " but recv_counts[", me, "] = ", recv_counts[me],
                                  " (what a rank sends itself is what it receives from itself)"));
    }
    SM_COLL_RETURN_IF_ERROR(Agree(d, send_counts, recv_counts));
    const size_t esz = DataTypeSize(dtype);
    if (send == recv && soff.back() > 0) {  // in place: stage the input we overwrite
      staging_.assign(Bytes(send), Bytes(send) + soff.back() * esz);
      send = staging_.data();
    }
    if (recv_counts[me] > 0) {
      std::memmove(Bytes(recv) + roff[me] * esz, Bytes(send) + soff[me] * esz,
                   recv_counts[me] * esz);
    }
    std::vector<Xfer> xs;
    for (int p = 0; p < size(); ++p) {
      if (p == me) continue;
      xs.push_back({p, true, Bytes(send) + soff[p] * esz, send_counts[p] * esz, DataSlot(1)});
      xs.push_back({p, false, Bytes(recv) + roff[p] * esz, recv_counts[p] * esz, DataSlot(1)});
    }
    return Exchange(xs);
  }

  absl::Status DoBroadcast(void* buffer, size_t count, DataType dtype, int root) override {
    const Desc d{kMagic, Op::kBroadcast, dtype, ReduceOp::kSum, 0, root, 0, count};
    SM_COLL_RETURN_IF_ERROR(Begin(d));
    if (root < 0 || root >= size()) {
      return Invalid(absl::StrCat("root ", root, " is not a rank of this group of ", size()));
    }
    SM_COLL_RETURN_IF_ERROR(CheckBuffer(buffer, count, "buffer"));
    SM_COLL_RETURN_IF_ERROR(Agree(d));
    const size_t bytes = count * DataTypeSize(dtype);
    std::vector<Xfer> xs;
    if (rank() == root) {
      for (int p = 0; p < size(); ++p) {
        if (p != root) xs.push_back({p, true, buffer, bytes, DataSlot(1)});
      }
    } else {
      xs.push_back({root, false, buffer, bytes, DataSlot(1)});
    }
    return Exchange(xs);
  }

  absl::Status DoPpermute(const void* send, void* recv, size_t count, DataType dtype,
                          absl::Span<const std::pair<int, int>> pairs) override {
    Desc d{kMagic, Op::kPpermute, dtype, ReduceOp::kSum, 0, 0, 0, count};
    d.layout = HashBytes(pairs.data(), pairs.size() * sizeof(pairs[0]));
    SM_COLL_RETURN_IF_ERROR(Begin(d));
    const int me = rank();
    absl::StatusOr<PpermutePeers> peers = ValidatePpermutePairs(pairs, size(), me);
    if (!peers.ok()) return Invalid(peers.status().message());
    const int source = peers->source, dest = peers->dest;
    SM_COLL_RETURN_IF_ERROR(CheckBuffer(send, count, "send"));
    SM_COLL_RETURN_IF_ERROR(CheckBuffer(recv, count, "recv"));
    SM_COLL_RETURN_IF_ERROR(Agree(d));
    const size_t bytes = count * DataTypeSize(dtype);
    if (send == recv && bytes > 0 && dest >= 0) {  // in place: stage what we send
      staging_.assign(Bytes(send), Bytes(send) + bytes);
      send = staging_.data();
    }
    std::vector<Xfer> xs;
    if (dest >= 0 && dest != me) xs.push_back({dest, true, send, bytes, DataSlot(1)});
    if (source >= 0 && source != me) xs.push_back({source, false, recv, bytes, DataSlot(1)});
    if (source == me && bytes > 0 && send != recv) std::memcpy(recv, send, bytes);
    if (source < 0 && bytes > 0) std::memset(recv, 0, bytes);
    return Exchange(xs);
  }

  // Send/Recv are not group-wide: the k-th message from p to q uses p2p slot k of the pair.
  absl::Status BeginPointToPoint(bool is_send, const void* buffer, size_t count, DataType dtype,
                                 int peer) {
    next_tag_ = CallTag{};  // point-to-point calls are not group-wide: no tag
    what_ = absl::StrCat(is_send ? "Send(" : "Recv(",
                         IsValidDataType(dtype) ? DataTypeName(dtype) : "invalid dtype",
                         ", count=", count, is_send ? ") to rank " : ") from rank ", peer,
                         " on group '", name_, "' (", RankName(rank()), ")");
    SM_COLL_RETURN_IF_ERROR(Refuse(nullptr));
    if (!IsValidDataType(dtype)) {
      return Invalid(absl::StrCat("invalid DataType value ", static_cast<int>(dtype)));
    }
    if (peer < 0 || peer >= size() || peer == rank()) {
      return Invalid(absl::StrCat("peer must be another rank of this group of ", size()));
    }
    return CheckBuffer(buffer, count, "buffer");
  }

  static uint64_t P2PSlot(uint64_t k, int phase) { return kP2PBit | (k << 8) | phase; }

  absl::Status DoSend(const void* buffer, size_t count, DataType dtype, int peer) override {
    SM_COLL_RETURN_IF_ERROR(BeginPointToPoint(true, buffer, count, dtype, peer));
    const uint64_t k = p2p_sent_[peer]++;
    const P2PHeader h{kMagic, dtype, count};
    const Xfer xs[] = {{peer, true, &h, sizeof(h), P2PSlot(k, 0)},
                       {peer, true, buffer, count * DataTypeSize(dtype), P2PSlot(k, 1)}};
    return Exchange(xs);
  }

  absl::Status DoRecv(void* buffer, size_t count, DataType dtype, int peer) override {
    SM_COLL_RETURN_IF_ERROR(BeginPointToPoint(false, buffer, count, dtype, peer));
    const uint64_t k = p2p_received_[peer]++;
    P2PHeader h;
    h.magic = 0;
    const Xfer header[] = {{peer, false, &h, sizeof(h), P2PSlot(k, 0)}};
    SM_COLL_RETURN_IF_ERROR(Exchange(header));
    if (h.magic != kMagic || h.dtype != dtype || h.count != count) {
      return Invalid(absl::StrCat(
          RankName(peer), " sent ",
          h.magic == kMagic && IsValidDataType(h.dtype) ? DataTypeName(h.dtype) : "garbage",
          " count=", h.count, " but this rank expects ", DataTypeName(dtype), " count=", count));
    }
    const Xfer data[] = {{peer, false, buffer, count * DataTypeSize(dtype), P2PSlot(k, 1)}};
    return Exchange(data);
  }

  absl::StatusOr<std::unique_ptr<Communicator>> DoSplit(int color, int key) {
    Desc d;
    d.op = Op::kSplit;
    SM_COLL_RETURN_IF_ERROR(Begin(d));
    SM_COLL_RETURN_IF_ERROR(Agree(d));
    const int n = size();
    const int me = rank();
    std::vector<int64_t> ck(2 * n);
    ck[2 * me] = color;
    ck[2 * me + 1] = key;
    std::vector<Xfer> xs;
    for (int p = 0; p < n; ++p) {
      if (p == me) continue;
      xs.push_back({p, true, &ck[2 * me], 2 * sizeof(int64_t), DataSlot(1)});
      xs.push_back({p, false, &ck[2 * p], 2 * sizeof(int64_t), DataSlot(1)});
    }
    SM_COLL_RETURN_IF_ERROR(Exchange(xs));
    std::vector<std::pair<int64_t, int>> members;  // (key, rank) of my color
    if (color >= 0) {
      for (int p = 0; p < n; ++p) {
        if (ck[2 * p] == color) members.push_back({ck[2 * p + 1], p});
      }
      std::sort(members.begin(), members.end());
    }
    std::unique_ptr<Communicator> sub;
    if (color >= 0) {
      int new_rank = 0;
      while (members[new_rank].second != me) ++new_rank;
      const int m = static_cast<int>(members.size());
      auto ctx = std::make_shared<gloo::rendezvous::Context>(new_rank, m);
      ctx->setTimeout(ToMillis(world_->timeout));
      std::vector<int> world_ranks;
      for (const auto& mk : members) world_ranks.push_back(world_ranks_[mk.second]);
      GlooStore store(
          *world_->store,
          absl::StrCat(world_->store_prefix, "/", name_, "/split#", seq_, "/color", color),
          GlooStoreGroup{world_ranks, absl::StrCat("the rendezvous of Split() #", seq_)});
      try {
        ctx->connectFullMesh(store, world_->device);
      } catch (const std::exception& e) {
        // The store's errors name the missing ranks; Gloo's own pair errors ("Connect timeout
        // [addr]:port") name none: say whom the group waited for, and how long.
        const bool names_ranks = absl::StrContains(e.what(), "rendezvous through the TCP store");
        return absl::UnavailableError(absl::StrCat(
            what_, ": connecting the group of color ", color, " failed: ", e.what(),
            names_ranks
                ? ""
                : absl::StrCat(" (the group's world ranks ", absl::StrJoin(world_ranks, ", "),
                               ", within ", absl::FormatDuration(world_->timeout),
                               ": a member stopped, hung or unreachable fails this way; raise "
                               "the timeout (train: --collective_timeout) if it is only slow)")));
      }
      auto link = std::make_shared<GroupLink>(ctx);
      SM_COLL_RETURN_IF_ERROR(link->Arm());
      world_->Register(link);
      sub = std::make_unique<GlooCommunicator>(
          world_, link, std::move(world_ranks),
          absl::StrCat(name_, "/split(color=", color, ")[", m, " ranks]"));
    }
    // Nobody returns (and maybe ends the process serving the store) while a peer still reads
    // its new group's addresses from the store.
    std::vector<char> tokens(n, 0);
    xs.clear();
    for (int p = 0; p < n; ++p) {
      if (p == me) continue;
      xs.push_back({p, true, &tokens[me], 1, DataSlot(2)});
      xs.push_back({p, false, &tokens[p], 1, DataSlot(2)});
    }
    SM_COLL_RETURN_IF_ERROR(Exchange(xs));
    return sub;
  }

  const std::shared_ptr<GlooWorld> world_;
  const std::shared_ptr<GroupLink> link_;
  gloo::Context* const ctx_;
  const std::vector<int> world_ranks_;  // group rank -> world rank
  const std::string name_;
  uint64_t seq_ = 0;  // collectives issued on this group
  std::vector<uint64_t> p2p_sent_, p2p_received_;
  std::string what_;  // the current call, for errors
  std::vector<char> scratch_;
  std::vector<char> staging_;
  CallTag next_tag_;  // TagNextCall's tag, taken by the next call's Begin
  CallTag tag_;       // the running call's tag
  // Started calls. Last: destroyed (its thread joined) first. A handle dropped unwaited poisons
  // the world: every rank's pending calls fail naming it.
  LazyAsyncLane lane_{LaneOptions{
      .name = name_,
      .report_misuse = [w = world_](const absl::Status& s) { w->Poison(s); }}};
};

// Writing to a socket whose peer died raises SIGPIPE, which would end this process silently
// instead of letting the collective fail with an error naming the peer.
void IgnoreSigpipe() {
  struct sigaction old {};
  if (::sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) {
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    ::sigaction(SIGPIPE, &ignore, nullptr);
  }
}

// Gloo's device setup crashes on a name that does not resolve or an unknown interface, so both
// are checked here first; a name becomes its first IPv4 (else IPv6) address.
absl::StatusOr<std::string> CheckTransportAddress(const GlooOptions& o) {
  if (!o.iface.empty()) {
    if (::if_nametoindex(o.iface.c_str()) == 0) {
      return absl::InvalidArgumentError(absl::StrCat("no network interface named '", o.iface,
                                                     "' (see `ip link`)"));
    }
    return o.iface;
  }
  const std::string host = o.hostname.empty() ? "127.0.0.1" : o.hostname;
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || res == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("cannot resolve host '", host, "': ",
                                                   ::gai_strerror(rc)));
  }
  const addrinfo* pick = res;
  for (const addrinfo* a = res; a != nullptr; a = a->ai_next) {
    if (a->ai_family == AF_INET) {
      pick = a;
      break;
    }
  }
  char ip[INET6_ADDRSTRLEN] = {};
  ::getnameinfo(pick->ai_addr, pick->ai_addrlen, ip, sizeof(ip), nullptr, 0, NI_NUMERICHOST);
  ::freeaddrinfo(res);
  return std::string(ip);
}

bool IsLoopback(const std::string& host) {
  return host == "localhost" || host == "::1" || absl::StartsWith(host, "127.");
}

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> CreateGlooCommunicator(
    std::shared_ptr<TcpStore> store, const GlooOptions& options) {
  if (store == nullptr) return absl::InvalidArgumentError("CreateGlooCommunicator: store is null");
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("CreateGlooCommunicator: options.timeout must be positive, got ",
                     absl::FormatDuration(options.timeout)));
  }
  IgnoreSigpipe();
  const int rank = store->rank();
  const int n = store->world_size();
  const std::string where = absl::StrCat("CreateGlooCommunicator (rank ", rank, " of ", n, ")");
  auto world = std::make_shared<GlooWorld>();
  world->store = std::move(store);
  world->timeout = options.timeout;
  world->store_prefix = options.store_prefix;
  const std::string transport_name =
      options.iface.empty() ? "host '" + (options.hostname.empty() ? std::string("127.0.0.1")
                                                                   : options.hostname) + "'"
                            : "interface '" + options.iface + "'";
  absl::StatusOr<std::string> address = CheckTransportAddress(options);
  if (!address.ok()) {
    return absl::Status(address.status().code(),
                        absl::StrCat(where, ": cannot open Gloo's TCP transport on ",
                                     transport_name, ": ", address.status().message()));
  }
  gloo::transport::tcp::attr attr;
  if (!options.iface.empty()) {
    attr.iface = *address;
  } else {
    attr.hostname = *address;
  }
  try {
    world->device = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(
        where, ": cannot open Gloo's TCP transport on ", transport_name,
        " (set GlooOptions::hostname/iface or GLOO_SOCKET_IFNAME): ", e.what()));
  }
  auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, n);
  ctx->setTimeout(ToMillis(options.timeout));
  try {
    GlooStore gs(*world->store, options.store_prefix + "/world");
    ctx->connectFullMesh(gs, world->device);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat(where, ": connecting to the other ranks failed: ", e.what()));
  }
  auto link = std::make_shared<GroupLink>(ctx);
  SM_COLL_RETURN_IF_ERROR(link->Arm());
  world->Register(link);
  std::vector<int> ranks(n);
  std::iota(ranks.begin(), ranks.end(), 0);
  auto comm = std::make_unique<GlooCommunicator>(world, link, std::move(ranks),
                                                 absl::StrCat("gloo world(", n, ")"));
  // Every rank has read every address before rank 0 may end the process that serves the store.
  SM_COLL_RETURN_IF_ERROR(comm->Barrier());
  return std::unique_ptr<Communicator>(std::move(comm));
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateGlooCommunicatorFromEnv(
    const GlooOptions& options) {
  absl::StatusOr<DistributedEnv> env = DistributedEnvFromEnvironment();
  if (!env.ok()) return env.status();
  absl::StatusOr<std::unique_ptr<TcpStore>> store =
      TcpStore::Create(env->store_options(options.timeout));
  if (!store.ok()) return store.status();
  GlooOptions o = options;
  if (o.iface.empty() && o.hostname.empty()) {
    const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
    if (ifname != nullptr && *ifname != '\0') {
      o.iface = ifname;
    } else if (IsLoopback(env->master_addr)) {
      o.hostname = "127.0.0.1";
    } else {
      char host[256] = {};
      if (::gethostname(host, sizeof(host) - 1) != 0) {
        return absl::InternalError("CreateGlooCommunicatorFromEnv: gethostname failed");
      }
      o.hostname = host;
    }
  }
  return CreateGlooCommunicator(std::shared_ptr<TcpStore>(std::move(*store)), o);
}

}  // namespace shardmap::collectives
