#include "tensor/cuda/caching_allocator.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tensor/error.h"

namespace shardmap::cuda {

CachingAllocator::CachingAllocator(RawOps raw, std::string device_name)
    : raw_(std::move(raw)), device_name_(std::move(device_name)) {}

CachingAllocator::~CachingAllocator() {
  std::lock_guard<std::mutex> lock(mu_);
  const bool any = !free_.empty() || !kept_.empty() || !deferred_.empty();
  if (any && raw_.synchronize) raw_.synchronize();
  for (auto& [key, blocks] : free_) {
    for (void* p : blocks) raw_.free(p);
  }
  for (auto& [pool, blocks] : kept_) {
    for (const auto& [p, size] : blocks) raw_.free(p);
  }
  for (const auto& [p, size] : deferred_) raw_.free(p);
}

size_t CachingAllocator::RoundSize(size_t nbytes) {
  constexpr size_t kMin = 512;
  constexpr size_t kLarge = size_t{1} << 20;
  if (nbytes <= kMin) return kMin;
  if (nbytes <= kLarge) return (nbytes + kMin - 1) / kMin * kMin;
  size_t pow2 = kLarge;
  while (pow2 * 2 <= nbytes) pow2 *= 2;  // the largest power of two <= nbytes
  const size_t step = pow2 / 8;
  return (nbytes + step - 1) / step * step;
}

void* CachingAllocator::RawMallocLocked(size_t size) {
  void* p = raw_.malloc(size);
  // Out of memory: hand back every cached block nobody uses and try once more. Not while a
  // stream of the device is being captured: the device-wide synchronize that must come first is
  // invalid then (CUDA fails it and invalidates the capture), and without it a cached block may
  // still be in use by queued kernels when it is freed.
  const bool capturing = !capturing_.empty();
  if (p == nullptr && !capturing) {
    ReleaseCachedLocked(0);
    p = raw_.malloc(size);
  }
  if (p == nullptr) {
    throw OpError(absl::ResourceExhaustedError(absl::StrCat(
        device_name_, ": out of memory allocating ", size, " bytes (", stats_.allocated_bytes,
        " bytes in use by tensors, ", stats_.cached_bytes, " cached",
        capturing ? " (not emptied while a CUDA graph is being captured)"
                  : " in graph pools",
        "); free tensors, shrink the batch, or shard over more devices")));
  }
  ++stats_.raw_allocs;
  return p;
}

void* CachingAllocator::Allocate(size_t nbytes, StreamHandle stream) {
  const size_t size = RoundSize(nbytes);
  std::lock_guard<std::mutex> lock(mu_);
  PoolId pool = 0;
  if (auto it = capturing_.find(stream); it != capturing_.end()) pool = it->second;
  void* p = nullptr;
  auto it = free_.find(FreeKey{pool, stream, size});
  if (it != free_.end() && !it->second.empty()) {
    p = it->second.back();
    it->second.pop_back();
    stats_.cached_bytes -= static_cast<int64_t>(size);
    ++stats_.cache_hits;
  } else {
    p = RawMallocLocked(size);
  }
  live_.emplace(p, Block{size, stream, pool});
  stats_.allocated_bytes += static_cast<int64_t>(size);
  if (stats_.allocated_bytes > stats_.peak_allocated_bytes) {
    stats_.peak_allocated_bytes = stats_.allocated_bytes;
  }
  return p;
}

void CachingAllocator::Free(void* p) { FreeImpl(p, nullptr); }

void CachingAllocator::Free(void* p, StreamHandle current) { FreeImpl(p, &current); }

void CachingAllocator::FreeImpl(void* p, const StreamHandle* current) {
  if (p == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(p);
  if (it == live_.end()) {
    OpFail(device_name_, ": Free of ", absl::StrCat(absl::Hex(reinterpret_cast<uintptr_t>(p))),
           ", which this allocator did not hand out (a double free,"
           " or memory from another device's allocator)");
  }
  const Block b = it->second;
  live_.erase(it);
  stats_.allocated_bytes -= static_cast<int64_t>(b.size);
  if (b.pool != 0 && released_pools_.count(b.pool)) {
    if (!capturing_.empty()) {
      // A capture is under way (on this thread or another): the device-wide synchronize and the
      // cudaFree would be refused by it and invalidate it. Hand the block back once no stream
      // is captured (FlushDeferredLocked, from EndPool).
      deferred_.emplace_back(p, b.size);
      stats_.cached_bytes += static_cast<int64_t>(b.size);
      return;
    }
    if (raw_.synchronize) raw_.synchronize();
    raw_.free(p);
    ++stats_.raw_frees;
    return;
  }
  if (b.pool == 0 && !capturing_.empty()) {
    // Freed during a capture: the captured work may use the block on every replay, so neither
    // eager allocations nor the capture itself may be handed it; the graph's pool keeps it.
    PoolId into = 0;
    if (current != nullptr) {
      if (auto c = capturing_.find(*current); c != capturing_.end()) into = c->second;
    }
    if (into == 0) {
      if (auto c = capturing_.find(b.stream); c != capturing_.end()) into = c->second;
    }
    if (into != 0) {
      kept_[into].emplace_back(p, b.size);
      stats_.cached_bytes += static_cast<int64_t>(b.size);
      return;
    }
  }
  free_[FreeKey{b.pool, b.stream, b.size}].push_back(p);
  stats_.cached_bytes += static_cast<int64_t>(b.size);
}

void CachingAllocator::ReleaseCachedLocked(PoolId pool) {
  // While a stream is captured the device-wide synchronize and the raw frees would be refused by
  // the capture and invalidate it: the default pool's blocks stay cached (still reusable); a
  // released pool's wait in deferred_ (still counted as cached) for the last EndPool.
  const bool capturing = !capturing_.empty();
  if (capturing && pool == 0) return;
  bool synced = false;
  for (auto it = free_.begin(); it != free_.end();) {
    if (std::get<0>(it->first) != pool) {
      ++it;
      continue;
    }
    if (capturing) {
      for (void* q : it->second) deferred_.emplace_back(q, std::get<2>(it->first));
      it = free_.erase(it);
      continue;
    }
    if (!synced && !it->second.empty() && raw_.synchronize) {
      raw_.synchronize();  // a cached block may still be read by queued kernels
      synced = true;
    }
    for (void* q : it->second) {
      raw_.free(q);
      ++stats_.raw_frees;
      stats_.cached_bytes -= static_cast<int64_t>(std::get<2>(it->first));
    }
    it = free_.erase(it);
  }
}

void CachingAllocator::FlushDeferredLocked() {
  if (deferred_.empty() || !capturing_.empty()) return;
  if (raw_.synchronize) raw_.synchronize();  // a replay of the released graph may still use them
  for (const auto& [q, size] : deferred_) {
    raw_.free(q);
    ++stats_.raw_frees;
    stats_.cached_bytes -= static_cast<int64_t>(size);
  }
  deferred_.clear();
}

void CachingAllocator::EmptyCache() {
  std::lock_guard<std::mutex> lock(mu_);
  FlushDeferredLocked();
  ReleaseCachedLocked(0);
}

CachingAllocator::Stats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void CachingAllocator::ResetPeakStats() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak_allocated_bytes = stats_.allocated_bytes;
}

CachingAllocator::PoolId CachingAllocator::CreatePool() {
  std::lock_guard<std::mutex> lock(mu_);
  return next_pool_++;
}

void CachingAllocator::BeginPool(PoolId pool, StreamHandle stream) {
  std::lock_guard<std::mutex> lock(mu_);
  if (pool == 0 || pool >= next_pool_ || released_pools_.count(pool)) {
    OpFail(device_name_, ": BeginPool of pool ", pool, ", which CreatePool did not return or which"
           " was released");
  }
  if (capturing_.count(stream)) {
    OpFail(device_name_, ": BeginPool: the stream already allocates from pool ",
           capturing_[stream], "; call EndPool first");
  }
  capturing_[stream] = pool;
}

void CachingAllocator::EndPool(PoolId pool) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = capturing_.begin(); it != capturing_.end(); ++it) {
    if (it->second == pool) {
      capturing_.erase(it);
      FlushDeferredLocked();
      return;
    }
  }
  OpFail(device_name_, ": EndPool of pool ", pool, ", which no stream allocates from");
}

void CachingAllocator::ReleasePool(PoolId pool) {
  std::lock_guard<std::mutex> lock(mu_);
  if (pool == 0) OpFail(device_name_, ": ReleasePool: the default pool cannot be released");
  for (const auto& [stream, p] : capturing_) {
    if (p == pool) OpFail(device_name_, ": ReleasePool of pool ", pool, " while it is in use");
  }
  released_pools_[pool] = true;
  ReleaseCachedLocked(pool);
  if (auto k = kept_.find(pool); k != kept_.end()) {
    if (!capturing_.empty()) {  // another graph is being captured: after it (see above)
      deferred_.insert(deferred_.end(), k->second.begin(), k->second.end());
      kept_.erase(k);
      return;
    }
    if (!k->second.empty() && raw_.synchronize) raw_.synchronize();  // a replay may still use them
    for (const auto& [q, size] : k->second) {
      raw_.free(q);
      ++stats_.raw_frees;
      stats_.cached_bytes -= static_cast<int64_t>(size);
    }
    kept_.erase(k);
  }
}

}  // namespace shardmap::cuda
