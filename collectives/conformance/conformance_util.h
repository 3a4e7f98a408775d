// Helpers shared by the conformance suite's case files (backend_conformance.h): a rank's buffer
// in host or GPU memory, the comparison against a reference (bitwise, or within a per-dtype
// tolerance), and the skips.
//
//   Buf send(target, comm, reference::Make(dt, 7, comm.rank(), false));
//   ExpectSame(target, dt, send.Get(), want, /*reduced=*/true, "AllReduce n=3");
#ifndef SHARDMAP_COLLECTIVES_CONFORMANCE_CONFORMANCE_UTIL_H_
#define SHARDMAP_COLLECTIVES_CONFORMANCE_CONFORMANCE_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "collectives/backend_registry.h"
#include "collectives/communicator.h"
#include "collectives/conformance/backend_conformance.h"
#include "collectives/reference_reduce.h"
#include "gtest/gtest.h"

namespace shardmap::collectives::conformance::conformance_util {


// A buffer of this rank: host memory, or GPU memory through the target's DeviceMemory.
class Buf {
 public:
  Buf(const ConformanceTarget& t, const Communicator& c, size_t bytes)
      : t_(t), bytes_(bytes), device_(c.memory_space().device),
        index_(c.memory_space().device_index) {
    if (device_ && t.device.alloc) {
      p_ = t.device.alloc(index_, std::max<size_t>(bytes, 1));
      EXPECT_NE(p_, nullptr) << "device alloc of " << bytes << " bytes failed";
    } else {
      EXPECT_FALSE(device_) << t.backend << " uses GPU memory but its target has no DeviceMemory";
      device_ = false;
      host_.assign(std::max<size_t>(bytes, 1), 0);
      p_ = host_.data();
    }
  }
  Buf(const ConformanceTarget& t, const Communicator& c, const std::vector<char>& v)
      : Buf(t, c, v.size()) {
    Set(v);
  }
  ~Buf() {
    if (device_ && p_ != nullptr) t_.device.free(index_, p_);
  }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;

  void* p() const { return p_; }
  char* at(size_t byte) const { return static_cast<char*>(p_) + byte; }
  void Set(const std::vector<char>& v) {
    if (v.empty()) return;  // an empty vector's data() may be null: memcpy must not see it
    if (device_) t_.device.to_device(index_, p_, v.data(), v.size());
    else std::memcpy(p_, v.data(), v.size());
  }
  std::vector<char> Get() const {
    std::vector<char> v(bytes_);
    if (bytes_ == 0) return v;
    if (device_) t_.device.to_host(index_, v.data(), p_, bytes_);
    else std::memcpy(v.data(), p_, bytes_);
    return v;
  }

 private:
  const ConformanceTarget& t_;
  size_t bytes_;
  bool device_;
  int index_;
  void* p_ = nullptr;
  std::vector<char> host_;
};

inline double AsDouble(DataType dt, const char* p) {
  switch (dt) {
    case DataType::kF32: { float x; std::memcpy(&x, p, 4); return x; }
    case DataType::kF64: { double x; std::memcpy(&x, p, 8); return x; }
    case DataType::kBF16: { uint16_t x; std::memcpy(&x, p, 2); return reference::BF16ToF32(x); }
    case DataType::kF16: { uint16_t x; std::memcpy(&x, p, 2); return reference::F16ToF32(x); }
    case DataType::kI32: { int32_t x; std::memcpy(&x, p, 4); return x; }
    case DataType::kI64: { int64_t x; std::memcpy(&x, p, 8); return static_cast<double>(x); }
  }
  return NAN;
}

// Relative tolerance of a reduction in another order than the reference's (0: exact).
inline double Tolerance(DataType dt) {
  switch (dt) {
    case DataType::kF32: return 1e-5;
    case DataType::kF64: return 1e-12;
    case DataType::kBF16: return 3e-2;
    case DataType::kF16: return 5e-3;
    default: return 0;
  }
}

// got == want bitwise, or (reductions of a non-bitwise backend) within Tolerance(dt).
inline void ExpectSame(const ConformanceTarget& t, DataType dt, const std::vector<char>& got,
                const std::vector<char>& want, bool reduced, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  if (!reduced || t.bitwise_reductions || Tolerance(dt) == 0) {
    if (got == want) return;
    const size_t es = DataTypeSize(dt);
    for (size_t i = 0; i < got.size() / es; ++i) {
      if (std::memcmp(got.data() + i * es, want.data() + i * es, es) != 0) {
        ADD_FAILURE() << what << ": element " << i << " is " << AsDouble(dt, got.data() + i * es)
                      << ", want " << AsDouble(dt, want.data() + i * es);
        return;
      }
    }
  }
  const size_t es = DataTypeSize(dt);
  for (size_t i = 0; i < got.size() / es; ++i) {
    const double g = AsDouble(dt, got.data() + i * es), w = AsDouble(dt, want.data() + i * es);
    if (!(std::abs(g - w) <= Tolerance(dt) * std::max(1.0, std::abs(w)))) {
      ADD_FAILURE() << what << ": element " << i << " is " << g << ", want " << w;
      return;
    }
  }
}

inline const Backend* Find(const std::string& name) {
  absl::StatusOr<const Backend*> b = FindBackend(name);
  EXPECT_TRUE(b.ok()) << b.status();
  return b.ok() ? *b : nullptr;
}

inline std::vector<int> SizesFrom(const ConformanceTarget& t, int min_n) {
  std::vector<int> out;
  for (int n : t.world_sizes) {
    if (n >= min_n) out.push_back(n);
  }
  return out;
}

inline void ExpectAllOk(const std::vector<absl::Status>& all, const std::string& what) {
  for (size_t r = 0; r < all.size(); ++r) {
    EXPECT_TRUE(all[r].ok()) << what << " rank " << r << ": " << all[r];
  }
}

inline std::string Case(int n, const char* op, DataType dt, size_t count) {
  return absl::StrCat(op, " n=", n, " ", DataTypeName(dt), " count=", count);
}

// Skips (with the reason) when the backend cannot run here, e.g. NCCL without a GPU.
#define SKIP_IF_UNAVAILABLE(b)                                                  \
  do {                                                                          \
    ASSERT_NE(b, nullptr);                                                      \
    const std::string why = (b)->unavailable_reason();                          \
    if (!why.empty()) GTEST_SKIP() << (b)->name << " cannot run here: " << why; \
  } while (0)

// Data cases run on backends that move no data too (every call must return OK), without
// comparing values: their outputs are not data.
inline void NoteValuesNotCompared(const Backend& b) {
  if (!b.moves_data) {
    ::testing::Test::RecordProperty("values_compared", "no: " + b.name + " moves no data");
  }
}

}  // namespace shardmap::collectives::conformance::conformance_util

#endif  // SHARDMAP_COLLECTIVES_CONFORMANCE_CONFORMANCE_UTIL_H_
