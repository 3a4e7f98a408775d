#include "tensor/random.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "tensor/cuda/reduce/reduce_ops.h"
#include "tensor/internal/accounting.h"
#include "tensor/error.h"
#include "tensor/internal/philox.h"
#include "tensor/ops/shape_ops.h"

namespace shardmap {
namespace {

using internal::Block;
using internal::Philox;

// The device kernels (tensor/cuda/reduce/random_kernels.cu) use the same stream numbers.
enum Stream : uint32_t { kUniform = 0, kNormal = 1, kInts = 2 };
static_assert(kUniform == static_cast<uint32_t>(cuda::kernels::RandomKind::kUniform) &&
              kNormal == static_cast<uint32_t>(cuda::kernels::RandomKind::kNormal) &&
              kInts == static_cast<uint32_t>(cuda::kernels::RandomKind::kInts));

// 53 random bits as a double in [0, 1).
inline double Unit(uint32_t hi, uint32_t lo) {
  const uint64_t x = (static_cast<uint64_t>(hi) << 32) | lo;
  return static_cast<double>(x >> 11) * 0x1p-53;
}

double NormalAt(uint64_t index, uint64_t seed) {
  const Block b = Philox(index, kNormal, seed);
  const double u1 = 1.0 - Unit(b.v[0], b.v[1]);  // (0, 1]: log is finite
  const double u2 = Unit(b.v[2], b.v[3]);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

double UniformAt(uint64_t index, uint64_t seed) {
  const Block b = Philox(index, kUniform, seed);
  return Unit(b.v[0], b.v[1]);
}

void CheckBlock(const char* op, absl::Span<const int64_t> global, absl::Span<const int64_t> offsets,
                absl::Span<const int64_t> local) {
  if (offsets.size() != global.size() || local.size() != global.size()) {
    OpFail(op, ": global shape ", ShapeToString(global), ", offsets ", ShapeToString(offsets),
           " and local shape ", ShapeToString(local), " must have the same rank");
  }
  for (size_t i = 0; i < global.size(); ++i) {
    if (global[i] < 0 || local[i] < 0 || offsets[i] < 0 || offsets[i] > global[i] - local[i]) {
      OpFail(op, ": block at offsets ", ShapeToString(offsets), " of shape ", ShapeToString(local),
             " does not fit in global shape ", ShapeToString(global), " (dim ", i,
             "); expected 0 <= offset and offset + size <= global size");
    }
  }
}

// Calls fn(local flat index, global flat index) for every element of the block, in the block's
// row-major order: an odometer over the block, stepping the global index by global strides.
template <typename Fn>
void ForEachInBlock(absl::Span<const int64_t> global, absl::Span<const int64_t> offsets,
                    absl::Span<const int64_t> local, Fn fn) {
  const int r = static_cast<int>(global.size());
  const int64_t n = NumElements(local);
  if (n == 0) return;
  std::vector<int64_t> gstr(r, 1), idx(r, 0);
  for (int i = r - 2; i >= 0; --i) gstr[i] = gstr[i + 1] * global[i + 1];
  int64_t g = 0;
  for (int i = 0; i < r; ++i) g += offsets[i] * gstr[i];
  const int64_t inner = r == 0 ? 1 : local[r - 1];
  for (int64_t row = 0; row < n / inner; ++row) {
    for (int64_t j = 0; j < inner; ++j) fn(row * inner + j, static_cast<uint64_t>(g + j));
    for (int k = r - 2; k >= 0; --k) {
      g += gstr[k];
      if (++idx[k] < local[k]) break;
      g -= gstr[k] * local[k];
      idx[k] = 0;
    }
  }
}

// Fills the block with value(global flat index), computed in f64 and rounded once to dtype.
// Values are `a + b * u` as one fma on both devices: an explicit fma rounds the same everywhere,
// while a plain a + b * u may or may not be contracted depending on compiler flags
// (-march=native) and would then differ from the GPU's in the last bit.
// On a GPU: the kernel of `kind` with parameters (a, b) computes the same values.
template <typename Fn>
Tensor FillBlock(const char* op, absl::Span<const int64_t> global,
                 absl::Span<const int64_t> offsets, absl::Span<const int64_t> local, DType dtype,
                 Device device, cuda::kernels::RandomKind kind, uint64_t seed, double a, double b,
                 Fn value) {
  internal::OpScope scope;  // the f64 block of a bf16 fill is scratch (memory_tracker.h)
  if (!IsFloating(dtype)) {
    OpFail(op, ": dtype ", DTypeName(dtype), " is not floating; expected f32, f64, bf16 or f16");
  }
  CheckBlock(op, global, offsets, local);
  if (scope.counting()) {
    scope.Record(op, dtype, 0, static_cast<double>(NumElements(local) * DTypeSize(dtype)));
  }
  if (device.is_meta()) return Tensor::Empty(local, dtype, device);  // no values to draw
  if (device.is_cuda()) {
    return cuda::RandomBlock(kind, global, offsets, local, seed, a, b, 0, dtype, device);
  }
  if (dtype == DType::kF32) {
    Tensor out = Tensor::Empty(local, DType::kF32);
    float* p = out.data<float>();
    ForEachInBlock(global, offsets, local,
                   [&](int64_t i, uint64_t g) { p[i] = static_cast<float>(value(g)); });
    return out;
  }
  Tensor out = Tensor::Empty(local, DType::kF64);
  double* p = out.data<double>();
  ForEachInBlock(global, offsets, local, [&](int64_t i, uint64_t g) { p[i] = value(g); });
  return Cast(out, dtype);  // bf16/f16: one rounding from f64
}

std::vector<int64_t> Zeros(size_t n) { return std::vector<int64_t>(n, 0); }

}  // namespace

Tensor RandomNormalSlice(absl::Span<const int64_t> global_shape, absl::Span<const int64_t> offsets,
                         absl::Span<const int64_t> local_shape, uint64_t seed, double mean,
                         double stddev, DType dtype, Device device) {
  return FillBlock("random_normal", global_shape, offsets, local_shape, dtype, device,
                   cuda::kernels::RandomKind::kNormal, seed, mean, stddev,
                   [&](uint64_t i) { return std::fma(stddev, NormalAt(i, seed), mean); });
}

Tensor RandomUniformSlice(absl::Span<const int64_t> global_shape, absl::Span<const int64_t> offsets,
                          absl::Span<const int64_t> local_shape, uint64_t seed, double low,
                          double high, DType dtype, Device device) {
  if (!(low <= high)) OpFail("random_uniform: low ", low, " > high ", high);
  return FillBlock("random_uniform", global_shape, offsets, local_shape, dtype, device,
                   cuda::kernels::RandomKind::kUniform, seed, low, high - low,
                   [&](uint64_t i) { return std::fma(high - low, UniformAt(i, seed), low); });
}

Tensor RandomNormal(absl::Span<const int64_t> shape, uint64_t seed, double mean, double stddev,
                    DType dtype, Device device) {
  return RandomNormalSlice(shape, Zeros(shape.size()), shape, seed, mean, stddev, dtype, device);
}

Tensor RandomUniform(absl::Span<const int64_t> shape, uint64_t seed, double low, double high,
                     DType dtype, Device device) {
  return RandomUniformSlice(shape, Zeros(shape.size()), shape, seed, low, high, dtype, device);
}

Tensor RandomIntsSlice(absl::Span<const int64_t> global_shape, absl::Span<const int64_t> offsets,
                       absl::Span<const int64_t> local_shape, int64_t n, uint64_t seed,
                       Device device) {
  internal::OpScope scope;
  if (n <= 0) OpFail("random_ints: n is ", n, "; expected n >= 1 (values in [0, n))");
  CheckBlock("random_ints", global_shape, offsets, local_shape);
  if (scope.counting()) {
    scope.Record("random_ints", DType::kI64, 0,
                 static_cast<double>(NumElements(local_shape) * DTypeSize(DType::kI64)));
  }
  if (device.is_meta()) return Tensor::Empty(local_shape, DType::kI64, device);
  if (device.is_cuda()) {
    return cuda::RandomBlock(cuda::kernels::RandomKind::kInts, global_shape, offsets, local_shape,
                             seed, 0.0, 0.0, n, DType::kI64, device);
  }
  Tensor out = Tensor::Empty(local_shape, DType::kI64);
  int64_t* p = out.data<int64_t>();
  ForEachInBlock(global_shape, offsets, local_shape, [&](int64_t i, uint64_t g) {
    const Block b = Philox(g, kInts, seed);
    const uint64_t x = (static_cast<uint64_t>(b.v[0]) << 32) | b.v[1];
    // Multiply-high maps 64 random bits onto [0, n) with negligible bias and no division.
    p[i] = static_cast<int64_t>((static_cast<unsigned __int128>(x) * static_cast<uint64_t>(n)) >>
                                64);
  });
  return out;
}

Tensor RandomInts(absl::Span<const int64_t> shape, int64_t n, uint64_t seed, Device device) {
  return RandomIntsSlice(shape, Zeros(shape.size()), shape, n, seed, device);
}

}  // namespace shardmap
