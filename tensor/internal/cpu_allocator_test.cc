// Runs twice (tensor/BUILD.bazel): as is, and with SHARDMAP_CPU_HUGE_PAGES=0, where blocks of 2 MiB
// and more must come from malloc's small pages instead.
#include "tensor/internal/cpu_allocator.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"

namespace shardmap::internal {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;

bool HugePagesExpected() {
  const char* env = std::getenv("SHARDMAP_CPU_HUGE_PAGES");
  return env == nullptr || std::strtol(env, nullptr, 10) != 0;
}

// The VmFlags line of the mapping that holds p in /proc/self/smaps ("" if none does).
std::string VmFlagsOf(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> lo >> dash >> hi && dash == '-') {
      inside = lo <= a && a < hi;  // a mapping's header line: "lo-hi perms offset ..."
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return line;
    }
  }
  return "";
}

bool KernelHasTransparentHugePages() {
  return std::ifstream("/sys/kernel/mm/transparent_hugepage/enabled").good();
}

// Allocates, writes the first and last byte, frees; returns the address.
uintptr_t RoundTrip(size_t n, std::string* flags = nullptr) {
  auto* p = static_cast<unsigned char*>(AllocateAligned(n));
  EXPECT_NE(p, nullptr) << n;
  p[n - 1] = 2;
  p[0] = 1;
  EXPECT_EQ(p[n - 1], n == 1 ? 1 : 2) << n;
  if (flags != nullptr) *flags = VmFlagsOf(p);
  FreeAligned(p, n);
  return reinterpret_cast<uintptr_t>(p);
}

TEST(CpuAllocatorTest, BlocksOfAHugePageOrMoreAreHugePageAlignedAndAdvised) {
  // Sizes no other test uses, so the block cache cannot hand back an older block.
  for (size_t n : {kHugePage, kHugePage + 1, 3 * kHugePage + 12345, 5 * kHugePage}) {
    std::string flags;
    const uintptr_t p = RoundTrip(n, &flags);
    EXPECT_EQ(p % 64, 0u) << n;
    ASSERT_FALSE(flags.empty()) << "no mapping holds the block of " << n << " bytes";
    if (HugePagesExpected()) {
      EXPECT_EQ(p % kHugePage, 0u) << n;
      // "hg": madvise(MADV_HUGEPAGE) took; the kernel backs the block with huge pages when it can.
      if (KernelHasTransparentHugePages()) {
        EXPECT_NE(flags.find(" hg"), std::string::npos) << flags;
      }
    } else {
      EXPECT_NE(p % kHugePage, 0u) << n << ": malloc's blocks sit after its chunk header";
      EXPECT_EQ(flags.find(" hg"), std::string::npos) << flags;
    }
  }
}

TEST(CpuAllocatorTest, SmallerBlocksComeFromMalloc) {
  for (size_t n : {size_t{1}, size_t{100}, size_t{1} << 20, kHugePage - 65536 - 1}) {
    const uintptr_t p = RoundTrip(n);
    EXPECT_EQ(p % 64, 0u) << n;
    EXPECT_NE(p % kHugePage, 0u) << n;
  }
}

TEST(CpuAllocatorTest, MappedBlocksAreCachedAndReused) {
  const size_t n = 7 * kHugePage + 4096;  // rounded to the 64 KiB granule
  const size_t before = CachedBytes();
  void* first = AllocateAligned(n);
  std::memset(first, 7, n);
  FreeAligned(first, n);
  EXPECT_GT(CachedBytes(), before);
  void* again = AllocateAligned(n);
  EXPECT_EQ(again, first);
  EXPECT_EQ(static_cast<unsigned char*>(again)[n - 1], 7);  // the cache keeps contents
  FreeAligned(again, n);
}

}  // namespace
}  // namespace shardmap::internal
