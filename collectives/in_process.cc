// In-process backend. Protocol of one collective on a group of n ranks (one thread each):
//   1. each rank writes its call (descriptor, buffer addresses, counts) into its own slot;
//   2. barrier: now every slot of this call is readable; every rank checks all ranks issued the
//      same call (a mismatch is an error on every rank, never a deadlock or corruption);
//   3. data phases read peers' buffers directly, separated by barriers where a phase reads what
//      the previous one wrote (all_reduce: reduce own slice, barrier, copy others' slices;
//      below 32 KiB out of place, every rank reduces everything in the same order instead;
//      above 16 MiB of buffers on the host, each rank reduces its slice in 16 KiB chunks and
//      streams every chunk into all ranks' outputs, with no middle barrier);
//   4. a final barrier, so no rank returns (and reuses its buffers) while a peer still reads them.
// Slots are double-buffered by call parity: a rank can only start call k+2 after every rank has
// finished call k (it passed call k+1's first barrier), so nobody overwrites a slot being read.
// The only lock is each group's mutex around barrier and mailbox bookkeeping; data moves outside
// it. Any failure poisons the world: waiters wake at once and fail naming the failed rank.
#include "collectives/in_process.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "absl/debugging/stacktrace.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "collectives/async_lane.h"
#include "collectives/in_process_async.h"
#include "collectives/internal/in_process_group.h"
#include "collectives/internal/rank_threads.h"
#include "collectives/internal/reduce.h"
#include "collectives/internal/status_macros.h"
#include "collectives/internal/stream_copy.h"

#if SHARDMAP_HAS_CUDA
#include <cuda_runtime.h>

#include "collectives/internal/cuda_check.h"
#include "collectives/internal/device_reduce.h"
#endif

namespace shardmap::collectives {
namespace {

using internal::CallDesc;
using internal::CallSite;
using internal::Describe;
using internal::FormatCallSite;
using internal::Group;
using internal::HasDtype;
using internal::HasReduce;
using internal::HashBytes;
using internal::kMaxFrames;
using internal::Op;
using internal::Slot;
using internal::World;


// [begin, end) of rank r's slice of `count` elements, cut at cache-line multiples.
std::pair<size_t, size_t> SliceOf(int r, int n, size_t count, size_t esz) {
  const size_t align = std::max<size_t>(1, 64 / esz);
  size_t per = (count + n - 1) / n;
  per = (per + align - 1) / align * align;
  const size_t b = std::min(count, per * r);
  return {b, std::min(count, b + per)};
}

std::vector<size_t> Offsets(absl::Span<const size_t> counts) {
  std::vector<size_t> off(counts.size() + 1, 0);
  for (size_t i = 0; i < counts.size(); ++i) off[i + 1] = off[i] + counts[i];
  return off;
}

// All-reduces up to this size skip the reduce-scatter/all-gather split (see DoAllReduce).
constexpr size_t kSmallAllReduceBytes = 32 << 10;
// Host all-reduces whose buffers (all ranks' inputs and outputs) exceed this, i.e. do not stay
// in a shared last-level cache anyway, stream their results to memory in chunks of
// kReduceChunkBytes (see DoAllReduce).
constexpr size_t kStreamAllReduceBytes = 16 << 20;
constexpr size_t kReduceChunkBytes = 16 << 10;

const char* AsBytes(const void* p) { return static_cast<const char*>(p); }
char* AsBytes(void* p) { return static_cast<char*>(p); }

class InProcessCommunicator final : public internal::ForwardingCommunicator {
 public:
  InProcessCommunicator(std::shared_ptr<Group> group, int rank, MemorySpace mem)
      : group_(std::move(group)), rank_(rank), mem_(mem) {}

  ~InProcessCommunicator() override {
#if SHARDMAP_HAS_CUDA
    if (scratch_ != nullptr) cudaFree(scratch_);
#endif
  }

  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }
  std::string name() const override { return group_->name(); }
  MemorySpace memory_space() const override { return mem_; }

  absl::StatusOr<std::unique_ptr<PendingCollective>> PpermuteStart(
      const void* send, void* recv, size_t count, DataType dtype,
      absl::Span<const std::pair<int, int>> pairs) override {
    // GPU buffers: the blocking call (its copies are on the stream); host: in_process_async.h.
    if (mem_.device) return Communicator::PpermuteStart(send, recv, count, dtype, pairs);
    if (async_ == nullptr) async_ = internal::AsyncPpermutesOf(group_);
    const CallTag tag = next_tag_;
    next_tag_ = CallTag{};
    return internal::StartAsyncPpermute(async_, rank_, tag, send, recv, count, dtype, pairs);
  }
  // Host memory: on the lane (async_lane.h; see in_process.h for why). GPU memory: the blocking
  // defaults (the calls synchronise the rank's stream with the host anyway).
  absl::StatusOr<std::unique_ptr<PendingCollective>> AllReduceStart(
      const void* send, void* recv, size_t count, DataType dtype, ReduceOp op) override {
    if (mem_.device) return Communicator::AllReduceStart(send, recv, count, dtype, op);
    return OnLane(StartedCallName("AllReduceStart", dtype, &op, count, name()),
                  [=](Communicator& dup) { return dup.AllReduce(send, recv, count, dtype, op); });
  }
  absl::StatusOr<std::unique_ptr<PendingCollective>> AllGatherStart(
      const void* send, void* recv, size_t send_count, DataType dtype) override {
    if (mem_.device) return Communicator::AllGatherStart(send, recv, send_count, dtype);
    return OnLane(StartedCallName("AllGatherStart", dtype, nullptr, send_count, name()),
                  [=](Communicator& dup) { return dup.AllGather(send, recv, send_count, dtype); });
  }
  absl::StatusOr<std::unique_ptr<PendingCollective>> ReduceScatterStart(
      const void* send, void* recv, size_t recv_count, DataType dtype, ReduceOp op) override {
    if (mem_.device) return Communicator::ReduceScatterStart(send, recv, recv_count, dtype, op);
    return OnLane(StartedCallName("ReduceScatterStart", dtype, &op, recv_count, name()),
                  [=](Communicator& dup) {
                    return dup.ReduceScatter(send, recv, recv_count, dtype, op);
                  });
  }
  bool OverlapsStartedCalls() const override { return !mem_.device; }
  absl::Status Barrier() override {
    CallDesc d;
    d.op = Op::kBarrier;
    return Finish([&]() -> absl::Status {
      SM_COLL_RETURN_IF_ERROR(Start(d));
      return Publish();
    }());
  }
  void TagNextCall(const CallTag& tag) override { next_tag_ = tag; }
  bool ComparesCallTags() const override { return true; }
  absl::StatusOr<std::unique_ptr<Communicator>> Split(int color, int key) override {
    absl::StatusOr<std::unique_ptr<Communicator>> r = DoSplit(color, key);
    if (!r.ok()) return Finish(r.status());
    (void)Finish(absl::OkStatus());  // clears the debug activity
    return r;
  }

 private:
  World& world() { return group_->world(); }

  // The pending tag goes to the lane's call, not to the Split that opens the lane.
  absl::StatusOr<std::unique_ptr<PendingCollective>> OnLane(std::string what,
                                                            AsyncLane::Call call) {
    const CallTag tag = next_tag_;
    next_tag_ = CallTag{};
    return lane_.Start(*this, std::move(what), tag, std::move(call));
  }

  int world_rank() const { return group_->world_rank(rank_); }
  const Slot& peer(int p) const { return group_->slot(p, seq_); }
  Slot& mine() { return group_->slot(rank_, seq_); }

  std::string What() const {
    const Slot& s = group_->slot(rank_, seq_);
    std::string what = absl::StrCat(Describe(s.desc), " on group '", name(), "' (",
                                    group_->RankName(rank_), ")");
    if (s.tag.describe == nullptr) return what;
    return absl::StrCat(s.tag.describe(s.tag.words), " [", what, "]");
  }
  std::function<std::string()> WhatFn() const {
    return [this] { return What(); };
  }

  absl::Status Finish(absl::Status s) override {
    if (world().debug()) world().SetActivity(world_rank(), "");
    if (!s.ok()) world().Poison(world_rank(), s);
    group_->Leave(rank_, !s.ok());
    return s;
  }

  absl::Status Invalid(absl::string_view why) const {
    return absl::InvalidArgumentError(absl::StrCat(What(), ": ", std::string(why)));
  }

  // Begins call d on this rank: numbers it, fills the slot's descriptor, validates basics.
  absl::Status Start(CallDesc d) {
    d.seq = ++seq_;
    d.device = mem_.device;
    Slot& s = mine();
    s.desc = d;
    s.device_index = mem_.device_index;
    s.send = nullptr;
    s.recv = nullptr;
    s.counts.clear();
    s.counts2.clear();
    s.new_group.reset();
    s.site.depth = 0;
    s.tag = next_tag_;
    next_tag_ = CallTag{};
    if (world().debug()) {
      s.site.depth = absl::GetStackTrace(s.site.frames, kMaxFrames, /*skip_count=*/1);
      world().SetActivity(world_rank(), absl::StrCat(What(), " at ", FormatCallSite(s.site)));
    }
    if (world().poisoned()) return world().Refusal(world_rank(), What());
    if (HasDtype(d.op) && !IsValidDataType(d.dtype)) {
      return Invalid(absl::StrCat("invalid DataType value ", static_cast<int>(d.dtype)));
    }
    if (HasReduce(d.op) && !IsValidReduceOp(d.reduce)) {
      return Invalid(absl::StrCat("invalid ReduceOp value ", static_cast<int>(d.reduce)));
    }
    return absl::OkStatus();
  }

  // Barrier after the slots are written; then every rank checks every rank made the same call.
  absl::Status Publish() {
    SM_COLL_RETURN_IF_ERROR(SyncStream());  // our inputs are complete before peers read them
    SM_COLL_RETURN_IF_ERROR(group_->Barrier(rank_, WhatFn()));
    const Slot& ref = peer(0);
    for (int p = 1; p < size(); ++p) {
      const Slot& other = peer(p);
      if (!std::equal(std::begin(ref.tag.words), std::end(ref.tag.words),
                      std::begin(other.tag.words))) {
        // The caller's view (op, axes, shape, program order) says more than ours: report it.
        auto describe = [](const Slot& s) {
          return s.tag.describe != nullptr ? s.tag.describe(s.tag.words)
                                           : std::string("an untagged ") + Describe(s.desc);
        };
        return absl::InvalidArgumentError(absl::StrCat(
            "mismatched collectives: ", group_->RankName(0), " issued ", describe(ref), " but ",
            group_->RankName(p), " issued ", describe(other), " at the same point (group '",
            name(), "'); every rank must issue the same collectives, with the same shapes, in the "
            "same order: look for rank-dependent control flow or per-rank shapes before this call",
            world().debug() ? absl::StrCat(". Call sites: [", FormatCallSite(ref.site), "] and [",
                                           FormatCallSite(other.site), "]")
                            : std::string(
                                  " (InProcessOptions::debug_check_calls adds both call sites)")));
      }
      if (other.desc == ref.desc) continue;
      // Every rank reports the same pair (rank 0 and the first rank that differs from it).
      return absl::InvalidArgumentError(absl::StrCat(
          "mismatched collectives on group '", name(), "': ", group_->RankName(0), " called ",
          Describe(ref.desc), " at [", FormatCallSite(ref.site), "] but ", group_->RankName(p),
          " called ", Describe(other.desc), " at [", FormatCallSite(other.site),
          "]; every rank of a group must issue the same collectives in the same order"));
    }
    return absl::OkStatus();
  }

  absl::Status End() { return SyncedBarrier(); }

  // Device memory: our copies and reductions have finished before peers go on.
  absl::Status SyncedBarrier() {
    SM_COLL_RETURN_IF_ERROR(SyncStream());
    return group_->Barrier(rank_, WhatFn());
  }

  // Data movement, on the host or on this rank's stream.
  absl::Status SyncStream() {
#if SHARDMAP_HAS_CUDA
    if (mem_.device) {
      SM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(static_cast<cudaStream_t>(mem_.stream)));
    }
#endif
    return absl::OkStatus();
  }

  absl::Status CopyBytes(void* dst, const void* src, size_t bytes) {
    if (bytes == 0) return absl::OkStatus();
#if SHARDMAP_HAS_CUDA
    if (mem_.device) {
      SM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault,
                                              static_cast<cudaStream_t>(mem_.stream)));
      return absl::OkStatus();
    }
#endif
    std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }

  absl::Status ZeroBytes(void* dst, size_t bytes) {
    if (bytes == 0) return absl::OkStatus();
#if SHARDMAP_HAS_CUDA
    if (mem_.device) {
      SM_CUDA_RETURN_IF_ERROR(
          cudaMemsetAsync(dst, 0, bytes, static_cast<cudaStream_t>(mem_.stream)));
      return absl::OkStatus();
    }
#endif
    std::memset(dst, 0, bytes);
    return absl::OkStatus();
  }

  // srcs[p] belongs to group rank p.
  absl::Status Reduce(void* dst, const std::vector<const void*>& srcs, size_t count,
                      DataType dtype, ReduceOp op) {
    if (count == 0) return absl::OkStatus();
#if SHARDMAP_HAS_CUDA
    if (mem_.device) {
      bool same_device = static_cast<int>(srcs.size()) <= internal::kMaxDeviceReduceSources;
      for (int p = 0; p < size(); ++p) {
        same_device = same_device && peer(p).device_index == mem_.device_index;
      }
      if (same_device) {
        SM_CUDA_RETURN_IF_ERROR(static_cast<cudaError_t>(internal::DeviceReduceLaunch(
            dst, srcs.data(), static_cast<int>(srcs.size()), count, static_cast<int>(dtype),
            static_cast<int>(op), mem_.stream)));
        return absl::OkStatus();
      }
      // Ranks on different GPUs: stage through host memory (correct, not fast). The copies go
      // on this rank's stream, not the legacy one (plain cudaMemcpy): our non-blocking stream
      // may still be writing a source (Stage) or dst, and a pageable host->device cudaMemcpy
      // may return before its DMA lands, which SyncStream would then not wait for.
      const size_t bytes = count * DataTypeSize(dtype);
      const cudaStream_t stream = static_cast<cudaStream_t>(mem_.stream);
      std::vector<std::vector<char>> host(srcs.size(), std::vector<char>(bytes));
      std::vector<const void*> host_srcs;
      for (size_t p = 0; p < srcs.size(); ++p) {
        SM_CUDA_RETURN_IF_ERROR(
            cudaMemcpyAsync(host[p].data(), srcs[p], bytes, cudaMemcpyDefault, stream));
        host_srcs.push_back(host[p].data());
      }
      SM_COLL_RETURN_IF_ERROR(SyncStream());  // device->pageable copies are done
      std::vector<char> out(bytes);
      internal::ReduceBuffers(out.data(), host_srcs.data(), static_cast<int>(srcs.size()), count,
                              dtype, op);
      SM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, out.data(), bytes, cudaMemcpyDefault, stream));
      return SyncStream();  // `out` is freed on return
    }
#endif
    internal::ReduceBuffers(dst, srcs.data(), static_cast<int>(srcs.size()), count, dtype, op);
    return absl::OkStatus();
  }

  // A private copy of `src` (in-place ops whose peers read our input while we overwrite it).
  absl::StatusOr<const void*> Stage(const void* src, size_t bytes) {
#if SHARDMAP_HAS_CUDA
    if (mem_.device) {
      if (bytes > scratch_bytes_) {
        if (scratch_ != nullptr) SM_CUDA_RETURN_IF_ERROR(cudaFree(scratch_));
        scratch_ = nullptr;
        SM_CUDA_RETURN_IF_ERROR(cudaMalloc(&scratch_, bytes));
        scratch_bytes_ = bytes;
      }
      SM_COLL_RETURN_IF_ERROR(CopyBytes(scratch_, src, bytes));
      return static_cast<const void*>(scratch_);
    }
#endif
    staging_.assign(AsBytes(src), AsBytes(src) + bytes);
    return static_cast<const void*>(staging_.data());
  }

  static absl::Status CheckBuffer(const void* p, size_t count, const char* which,
                                  const std::string& what) {
    if (count > 0 && p == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": ", which, " is null but the call moves ", count, " elements"));
    }
    return absl::OkStatus();
  }

  absl::Status DoAllReduce(const void* send, void* recv, size_t count, DataType dtype,
                           ReduceOp op) override {
    CallDesc d{Op::kAllReduce, dtype, op, count};
    SM_COLL_RETURN_IF_ERROR(Start(d));
    SM_COLL_RETURN_IF_ERROR(CheckBuffer(send, count, "send", What()));
    SM_COLL_RETURN_IF_ERROR(CheckBuffer(recv, count, "recv", What()));
    mine().send = send;
    mine().recv = recv;
    SM_COLL_RETURN_IF_ERROR(Publish());
    const int n = size();
    const size_t esz = DataTypeSize(dtype);
    // Small and out of place everywhere: every rank reduces the whole buffer itself (same code,
    // same order, so the same bits on every rank), saving the middle barrier. Latency, not
    // bandwidth, is what counts at this size.
    bool out_of_place = true;
    for (int p = 0; p < n; ++p) out_of_place = out_of_place && peer(p).send != peer(p).recv;
    if (n > 1 && out_of_place && count * esz <= kSmallAllReduceBytes) {
      std::vector<const void*> srcs(n);
      for (int p = 0; p < n; ++p) srcs[p] = peer(p).send;
      SM_COLL_RETURN_IF_ERROR(Reduce(recv, srcs, count, dtype, op));
      return End();
    }
    auto [b, e] = SliceOf(rank_, n, count, esz);
    if (!mem_.device && n > 1 && 2 * n * count * esz > kStreamAllReduceBytes) {
      // Large, on the host: this rank reduces its slice in L1-sized chunks and streams each
      // reduced chunk straight into every rank's recv buffer (non-temporal stores: no
      // read-before-write, no separate copy phase, no middle barrier). Only this rank reads
      // slice [b, e) of any input, and it has read a chunk from every input before writing that
      // chunk anywhere, so in-place calls are safe.
      std::vector<const void*> srcs(n);
      chunk_.resize(kReduceChunkBytes);
      const size_t step = std::max<size_t>(1, kReduceChunkBytes / esz);
      for (size_t cb = b; cb < e; cb += step) {
        const size_t ce = std::min(e, cb + step);
        for (int p = 0; p < n; ++p) srcs[p] = AsBytes(peer(p).send) + cb * esz;
        internal::ReduceBuffers(chunk_.data(), srcs.data(), n, ce - cb, dtype, op);
        for (int k = 0; k < n; ++k) {
          const int p = (rank_ + k) % n;  // staggered so ranks do not all write rank 0 first
          internal::StreamCopy(AsBytes(peer(p).recv) + cb * esz, chunk_.data(), (ce - cb) * esz);
        }
      }
      return End();
    }
    // Reduce-scatter phase: this rank reduces its slice, reading every peer's input.
    if (e > b) {
      std::vector<const void*> srcs(n);
      for (int p = 0; p < n; ++p) srcs[p] = AsBytes(peer(p).send) + b * esz;
      SM_COLL_RETURN_IF_ERROR(Reduce(AsBytes(recv) + b * esz, srcs, e - b, dtype, op));
    }
    if (n > 1) {
      SM_COLL_RETURN_IF_ERROR(SyncedBarrier());
      // All-gather phase: copy the other ranks' reduced slices.
      for (int k = 1; k < n; ++k) {
        const int p = (rank_ + k) % n;  // staggered so ranks do not all read rank 0 first
        auto [pb, pe] = SliceOf(p, n, count, esz);
        SM_COLL_RETURN_IF_ERROR(
            CopyBytes(AsBytes(recv) + pb * esz, AsBytes(peer(p).recv) + pb * esz, (pe - pb) * esz));
      }
    }
    return End();
  }

  absl::Status CheckCounts(absl::Span<const size_t> counts, const char* which) {
    if (counts.size() != static_cast<size_t>(size())) {
      return Invalid(absl::StrCat(which, " has ", counts.size(),
                                  " entries but the group has ", size(), " ranks"));
    }
    return absl::OkStatus();
  }

  absl::Status DoAllGatherV(Op kind, const void* send, void* recv,
                            absl::Span<const size_t> counts, DataType dtype) override {
    CallDesc d{kind, dtype, ReduceOp::kSum, 0};
    d.shape_hash = HashBytes(counts.data(), counts.size() * sizeof(size_t));
    d.count = kind == Op::kAllGather && !counts.empty() ? counts[0]
                                                        : std::accumulate(counts.begin(), counts.end(), size_t{0});
    SM_COLL_RETURN_IF_ERROR(Start(d));
    SM_COLL_RETURN_IF_ERROR(CheckCounts(counts, "counts"));
    const std::vector<size_t> off = Offsets(counts);
    SM_COLL_RETURN_IF_ERROR(CheckBuffer(send, counts[rank_], "send", What()));
    SM_COLL_RETURN_IF_ERROR(CheckBuffer(recv, off.back(), "recv", What()));
    mine().send = send;
    mine().recv = recv;
    SM_COLL_RETURN_IF_ERROR(Publish());
    const size_t esz = DataTypeSize(dtype);
    for (int k = 0; k < size(); ++k) {
      const int p = (rank_ + k) % size();
      char* dst = AsBytes(recv) + off[p] * esz;
      if (counts[p] > 0 && dst != peer(p).send) {
        SM_COLL_RETURN_IF_ERROR(CopyBytes(dst, peer(p).send, counts[p] * esz));
      }
    }
    return End();
  }

  absl::Status DoReduceScatterV(Op kind, const void* send, void* recv,
                                absl::Span<const size_t> counts, DataType dtype,
                                ReduceOp op) override {
    CallDesc d{kind, dtype, op, 0};
    d.shape_hash = HashBytes(counts.data(), counts.size() * sizeof(size_t));
    d.count = kind == Op::kReduceScatter && !counts.empty()
                  ? counts[0]
                  : std::accumulate(counts.begin(), counts.end(), size_t{0});
    SM_COLL_RETURN_IF_ERROR(Start(d));
    SM_COLL_RETURN_IF_ERROR(CheckCounts(counts, "counts"));
    const std::vector<size_t> off = Offsets(counts);
    SM_COLL_RETURN_IF_ERROR(CheckBuffer(send, off.back(), "send", What()));
    SM_COLL_RETURN_IF_ERROR(CheckBuffer(recv, counts[rank_], "recv", What()));
    mine().send = send;
    mine().recv = recv;
    SM_COLL_RETURN_IF_ERROR(Publish());
    const int n = size();
    const size_t esz = DataTypeSize(dtype);
    if (counts[rank_] > 0) {
      std::vector<const void*> srcs(n);
      for (int p = 0; p < n; ++p) srcs[p] = AsBytes(peer(p).send) + off[rank_] * esz;
      SM_COLL_RETURN_IF_ERROR(Reduce(recv, srcs, counts[rank_], dtype, op));
    }
    return End();
  }

  absl::Status DoAllToAllV(Op kind, const void* send, absl::Span<const size_t> send_counts,
                           void* recv, absl::Span<const size_t> recv_counts,
                           DataType dtype) override {
    CallDesc d{kind, dtype, ReduceOp::kSum, 0};
    if (kind == Op::kAllToAll && !send_counts.empty()) d.count = send_counts[0];
    SM_COLL_RETURN_IF_ERROR(Start(d));
    SM_COLL_RETURN_IF_ERROR(CheckCounts(send_counts, "send_counts"));
    SM_COLL_RETURN_IF_ERROR(CheckCounts(recv_counts, "recv_counts"));
    const size_t esz = DataTypeSize(dtype);
    const std::vector<size_t> soff = Offsets(send_counts);
    const std::vector<size_t> roff = Offsets(recv_counts);
    SM_COLL_RETURN_IF_ERROR(CheckBuffer(send, soff.back(), "send", What()));
    SM_COLL_RETURN_IF_ERROR(CheckBuffer(recv, roff.back(), "recv", What()));
    // In place: peers read our input while we overwrite it, so stage a private copy.
    if (send == recv && soff.back() > 0) {
      SM_COLL_ASSIGN_OR_RETURN(send, Stage(send, soff.back() * esz));
    }
    mine().send = send;
    mine().recv = recv;
    mine().counts.assign(send_counts.begin(), send_counts.end());
    mine().counts2.assign(recv_counts.begin(), recv_counts.end());
    SM_COLL_RETURN_IF_ERROR(Publish());
    const int n = size();
    // Every rank checks every pair, so all ranks agree on the verdict.
    for (int p = 0; p < n; ++p) {
      for (int q = 0; q < n; ++q) {
        if (peer(p).counts2[q] != peer(q).counts[p]) {
          return Invalid(absl::StrCat(group_->RankName(q), " sends ", peer(q).counts[p],
                                      " elements to ", group_->RankName(p), " which expects ",
                                      peer(p).counts2[q],
                                      " (recv_counts[q] on rank p must equal send_counts[p] on "
                                      "rank q)"));
        }
      }
    }
    for (int k = 0; k < n; ++k) {
      const int p = (rank_ + k) % n;
      if (recv_counts[p] == 0) continue;
      size_t src_off = 0;
      for (int j = 0; j < rank_; ++j) src_off += peer(p).counts[j];
      SM_COLL_RETURN_IF_ERROR(CopyBytes(AsBytes(recv) + roff[p] * esz,
                                        AsBytes(peer(p).send) + src_off * esz,
                                        recv_counts[p] * esz));
    }
    return End();
  }

  absl::Status DoBroadcast(void* buffer, size_t count, DataType dtype, int root) override {
    CallDesc d{Op::kBroadcast, dtype, ReduceOp::kSum, count, root};
    SM_COLL_RETURN_IF_ERROR(Start(d));
    if (root < 0 || root >= size()) {
      return Invalid(absl::StrCat("root ", root, " is not a rank of this group of ", size()));
    }
    SM_COLL_RETURN_IF_ERROR(CheckBuffer(buffer, count, "buffer", What()));
    mine().recv = buffer;
    SM_COLL_RETURN_IF_ERROR(Publish());
    if (rank_ != root) {
      SM_COLL_RETURN_IF_ERROR(CopyBytes(buffer, peer(root).recv, count * DataTypeSize(dtype)));
    }
    return End();
  }

  absl::Status DoPpermute(const void* send, void* recv, size_t count, DataType dtype,
                          absl::Span<const std::pair<int, int>> pairs) override {
    CallDesc d{Op::kPpermute, dtype, ReduceOp::kSum, count};
    d.shape_hash = HashBytes(pairs.data(), pairs.size() * sizeof(pairs[0]));
    SM_COLL_RETURN_IF_ERROR(Start(d));
    absl::StatusOr<PpermutePeers> peers = ValidatePpermutePairs(pairs, size(), rank_);
    if (!peers.ok()) return Invalid(peers.status().message());
    const int my_source = peers->source;
    SM_COLL_RETURN_IF_ERROR(CheckBuffer(send, count, "send", What()));
    SM_COLL_RETURN_IF_ERROR(CheckBuffer(recv, count, "recv", What()));
    const size_t bytes = count * DataTypeSize(dtype);
    if (send == recv && bytes > 0) {  // in place: our destination reads it while we overwrite
      SM_COLL_ASSIGN_OR_RETURN(send, Stage(send, bytes));
    }
    mine().send = send;
    mine().recv = recv;
    SM_COLL_RETURN_IF_ERROR(Publish());
    if (my_source >= 0) {
      SM_COLL_RETURN_IF_ERROR(CopyBytes(recv, peer(my_source).send, bytes));
    } else {
      SM_COLL_RETURN_IF_ERROR(ZeroBytes(recv, bytes));
    }
    return End();
  }

  absl::Status DoSend(const void* buffer, size_t count, DataType dtype, int peer) override {
    return DoPointToPoint(/*is_send=*/true, const_cast<void*>(buffer), count, dtype, peer);
  }
  absl::Status DoRecv(void* buffer, size_t count, DataType dtype, int peer) override {
    return DoPointToPoint(/*is_send=*/false, buffer, count, dtype, peer);
  }
  absl::Status DoPointToPoint(bool is_send, void* buffer, size_t count, DataType dtype,
                              int peer_rank) {
    // Point-to-point calls are not group-wide: they get no sequence number, slot or tag.
    next_tag_ = CallTag{};
    auto what = [&, is_send] {
      return absl::StrCat(is_send ? "Send(" : "Recv(", DataTypeName(dtype), ", count=", count,
                          is_send ? ") to rank " : ") from rank ", peer_rank, " on group '",
                          name(), "' (", group_->RankName(rank_), ")");
    };
    if (world().debug()) world().SetActivity(world_rank(), what());
    if (world().poisoned()) return world().Refusal(world_rank(), what());
    if (!IsValidDataType(dtype)) {
      return absl::InvalidArgumentError(absl::StrCat(what(), ": invalid DataType value ",
                                                     static_cast<int>(dtype)));
    }
    if (peer_rank < 0 || peer_rank >= size() || peer_rank == rank_) {
      return absl::InvalidArgumentError(absl::StrCat(
          what(), ": peer must be another rank of this group of ", size()));
    }
    SM_COLL_RETURN_IF_ERROR(CheckBuffer(buffer, count, "buffer", what()));
    if (is_send) {
      SM_COLL_RETURN_IF_ERROR(SyncStream());  // the data is complete before the peer copies it
      return group_->Send(rank_, buffer, count, dtype, peer_rank, what);
    }
    // The copy runs on the receiver's thread while the sender waits.
    return group_->Recv(rank_, buffer, count, dtype, peer_rank, what,
                        [this](void* dst, const void* src, size_t bytes) -> absl::Status {
                          SM_COLL_RETURN_IF_ERROR(CopyBytes(dst, src, bytes));
                          return SyncStream();
                        });
  }

  absl::StatusOr<std::unique_ptr<Communicator>> DoSplit(int color, int key) {
    CallDesc d;
    d.op = Op::kSplit;
    SM_COLL_RETURN_IF_ERROR(Start(d));
    mine().color = color;
    mine().key = key;
    SM_COLL_RETURN_IF_ERROR(Publish());
    std::vector<std::pair<int, int>> members;  // (key, rank) of my color
    if (color >= 0) {
      for (int p = 0; p < size(); ++p) {
        if (peer(p).color == color) members.push_back({peer(p).key, p});
      }
      std::sort(members.begin(), members.end());
    }
    const bool leader = !members.empty() && members[0].second == rank_;
    if (leader) {
      std::vector<int> world_ranks;
      for (const auto& m : members) world_ranks.push_back(group_->world_rank(m.second));
      auto g = std::make_shared<Group>(
          group_->world_ptr(), std::move(world_ranks),
          absl::StrCat(name(), "/split(color=", color, ")[", members.size(), " ranks]"));
      world().Register(g);
      mine().new_group = std::move(g);
    }
    SM_COLL_RETURN_IF_ERROR(group_->Barrier(rank_, WhatFn()));
    if (color < 0) return std::unique_ptr<Communicator>();
    std::shared_ptr<Group> g = peer(members[0].second).new_group;
    int new_rank = 0;
    while (members[new_rank].second != rank_) ++new_rank;
    return std::unique_ptr<Communicator>(
        std::make_unique<InProcessCommunicator>(g, new_rank, mem_));
  }

  std::shared_ptr<Group> group_;
  std::shared_ptr<internal::AsyncPpermutes> async_;  // created by the first PpermuteStart
  const int rank_;
  uint64_t seq_ = 0;
  CallTag next_tag_;  // TagNextCall's tag, moved into the slot of the next call
  const MemorySpace mem_;
  std::vector<char> staging_;
  std::vector<char> chunk_;  // one reduced chunk of a large host all-reduce
  void* scratch_ = nullptr;  // device staging
  size_t scratch_bytes_ = 0;
  // Started all-reduces, all-gathers and reduce-scatters. Last: destroyed (its thread joined)
  // first. A handle dropped unwaited poisons the world, as an unwaited ppermute does.
  LazyAsyncLane lane_{LaneOptions{
      .name = group_->name(),
      .report_misuse = [g = group_, wr = group_->world_rank(rank_)](const absl::Status& s) {
        g->world().Poison(wr, s);
      }}};
};

}  // namespace

absl::Status RunInProcess(int world_size, const std::function<absl::Status(Communicator&)>& fn,
                          const InProcessOptions& options) {
  if (world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("RunInProcess: world_size must be >= 1, got ", world_size));
  }
  if (!fn) return absl::InvalidArgumentError("RunInProcess: fn is empty");
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RunInProcess: options.timeout must be positive, got ",
        absl::FormatDuration(options.timeout)));
  }
  std::vector<MemorySpace> spaces(world_size);
  for (int r = 0; r < world_size; ++r) {
    if (options.memory_space) spaces[r] = options.memory_space(r);
#if !SHARDMAP_HAS_CUDA
    if (spaces[r].device) {
      return absl::InvalidArgumentError(absl::StrCat(
          "RunInProcess: options.memory_space puts rank ", r,
          "'s buffers in GPU memory but this build has no CUDA (CUDA_PATH pointed nowhere)"));
    }
#endif
  }
  auto world = std::make_shared<World>(world_size, options.timeout, options.debug_check_calls);
  std::vector<int> ranks(world_size);
  std::iota(ranks.begin(), ranks.end(), 0);
  auto group = std::make_shared<Group>(world, std::move(ranks),
                                       absl::StrCat("in-process world(", world_size, ")"));
  world->Register(group);

  absl::Status started = internal::RankThreads::Shared().Run(world_size, [&](int r) {
      absl::Status s;
      MemorySpace mem = spaces[r];
      [[maybe_unused]] bool owns_stream = false;  // only read with CUDA
#if SHARDMAP_HAS_CUDA
      if (mem.device) {
        s = internal::CudaStatus(cudaSetDevice(mem.device_index), "cudaSetDevice", __FILE__,
                                 __LINE__);
        if (s.ok() && mem.stream == nullptr) {
          cudaStream_t st = nullptr;
          s = internal::CudaStatus(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking),
                                   "cudaStreamCreateWithFlags", __FILE__, __LINE__);
          mem.stream = st;
          owns_stream = s.ok();
        }
      }
#endif
      if (s.ok()) {
        InProcessCommunicator comm(group, r, mem);
        try {
          s = fn(comm);
        } catch (const std::exception& e) {
          s = absl::InternalError(absl::StrCat("threw an exception: ", e.what()));
        } catch (...) {
          s = absl::InternalError("threw a non-std exception");
        }
      }
#if SHARDMAP_HAS_CUDA
      if (owns_stream) cudaStreamDestroy(static_cast<cudaStream_t>(mem.stream));
#endif
      if (!s.ok()) world->Poison(r, s);
      world->MarkExited(r);
  });
  if (!started.ok()) return absl::Status(started.code(), absl::StrCat("RunInProcess: ", started.message()));
  if (world->poisoned()) return world->first_failure();
  return absl::OkStatus();
}

}  // namespace shardmap::collectives
