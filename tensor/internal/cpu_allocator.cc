#include "tensor/internal/cpu_allocator.h"

#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tensor/error.h"

namespace shardmap::internal {
namespace {

constexpr size_t kCacheMin = size_t{1} << 20;
constexpr size_t kLargeGranule = size_t{64} << 10;

size_t Rounded(size_t nbytes) {
  if (nbytes >= kCacheMin) return (nbytes + kLargeGranule - 1) / kLargeGranule * kLargeGranule;
  return (nbytes + 63) / 64 * 64;
}

class BlockCache {
 public:
  BlockCache() {
    const char* env = std::getenv("SHARDMAP_CPU_CACHE_MB");
    limit_ = (env != nullptr ? std::strtoull(env, nullptr, 10) : 1024) << 20;
  }
  void* Take(size_t size) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = blocks_.find(size);
    if (it == blocks_.end()) return nullptr;
    void* p = it->second;
    blocks_.erase(it);
    held_ -= size;
    return p;
  }
  bool Give(void* p, size_t size) {
    std::lock_guard<std::mutex> lock(mu_);
    if (held_ + size > limit_) return false;
    blocks_.emplace(size, p);
    held_ += size;
    return true;
  }
  size_t held() {
    std::lock_guard<std::mutex> lock(mu_);
    return held_;
  }

 private:
  std::mutex mu_;
  std::multimap<size_t, void*> blocks_;
  size_t held_ = 0;
  size_t limit_ = 0;
};

// Never destroyed: tensors in static objects may be freed after other statics are gone.
BlockCache& Cache() {
  static BlockCache* cache = new BlockCache();
  return *cache;
}

}  // namespace

void* AllocateAligned(size_t nbytes) {
  const size_t size = Rounded(nbytes);
  if (size == 0) return nullptr;
  if (size >= kCacheMin) {
    if (void* p = Cache().Take(size)) return p;
  }
  // malloc plus manual alignment, with the raw pointer stored just below the aligned one:
  // glibc's aligned_alloc splits chunks and makes later frees consolidate, which cost more than
  // the op itself on small tensors.
  void* raw = std::malloc(size + 64);
  if (raw == nullptr) {
    throw OpError(absl::ResourceExhaustedError(
        absl::StrCat("could not allocate ", nbytes, " bytes of CPU memory")));
  }
  const uintptr_t aligned =
      (reinterpret_cast<uintptr_t>(raw) + sizeof(void*) + 63) & ~uintptr_t{63};
  reinterpret_cast<void**>(aligned)[-1] = raw;
  return reinterpret_cast<void*>(aligned);
}

void FreeAligned(void* p, size_t nbytes) {
  if (p == nullptr) return;
  const size_t size = Rounded(nbytes);
  if (size >= kCacheMin && Cache().Give(p, size)) return;
  std::free(static_cast<void**>(p)[-1]);
}

size_t CachedBytes() { return Cache().held(); }

}  // namespace shardmap::internal
