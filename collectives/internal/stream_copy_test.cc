#include "collectives/internal/stream_copy.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace shardmap::collectives::internal {
namespace {

// Every alignment of source and destination and lengths around the 16/64-byte steps: the bytes
// copied equal the source, the bytes around the destination stay untouched.
TEST(StreamCopyTest, EqualsMemcpyAtEveryAlignmentAndLength) {
  std::vector<uint8_t> src(1024);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 7 + 3);
  for (size_t soff : {0, 1, 5, 16, 33}) {
    for (size_t doff : {0, 1, 8, 15, 16, 63}) {
      for (size_t len : {0, 1, 15, 16, 17, 63, 64, 65, 127, 128, 200, 511, 700}) {
        std::vector<uint8_t> dst(1024, 0xEE);
        StreamCopy(dst.data() + doff, src.data() + soff, len);
        for (size_t i = 0; i < dst.size(); ++i) {
          const bool inside = i >= doff && i < doff + len;
          const uint8_t want = inside ? src[soff + i - doff] : 0xEE;
          ASSERT_EQ(dst[i], want) << "soff=" << soff << " doff=" << doff << " len=" << len
                                  << " at " << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace shardmap::collectives::internal
