#include "tensor/ops/shape_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_join.h"
#include "tensor/cpu/vec_math.h"
#include "tensor/cuda/elementwise/shape_ops.h"
#include "tensor/error.h"
#include "tensor/internal/accounting.h"
#include "tensor/ops/internal/op_util.h"

namespace shardmap {
namespace {

using internal::DimVec;
using internal::Prod;

// Tile edge in elements for the 2- and 8-byte transposes (32-bit ones go to cpu::Vec()'s
// register transposes): a tile's transposed copy (8 KiB) stays in L1.
template <typename E>
constexpr int64_t TileFor() {
  return sizeof(E) == 2 ? 64 : 32;
}

// Outputs at least this big bypass the cache with streaming stores (no read-for-ownership of
// lines the transpose overwrites whole; measured 0.32x -> 0.48x memcpy when f32 still came here).
constexpr size_t kStreamBytes = size_t{4} << 20;

// dst[0, n) = src[0, n) bytes; with `stream`, 16-byte aligned chunks use non-temporal stores.
inline void CopyRow(char* dst, const char* src, size_t n, bool stream) {
#if defined(__SSE2__)
  if (stream && (reinterpret_cast<uintptr_t>(dst) & 15) == 0) {
    size_t k = 0;
    for (; k + 16 <= n; k += 16) {
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + k),
                       _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + k)));
    }
    if (k < n) std::memcpy(dst + k, src + k, n - k);
    return;
  }
#endif
  std::memcpy(dst, src, n);
}

// out[i * oq + j] = in[i + j * sj] for i in [i0, i1), j in [j0, j1), through an L1 buffer:
// input rows are read as contiguous runs and output rows written as contiguous runs, so every
// cache line is touched once even when the strides are powers of two (which alias in the
// cache and defeat a direct strided walk).
template <typename E>
inline void TransposeTile(const E* in, E* out, int64_t i0, int64_t i1, int64_t j0, int64_t j1,
                          int64_t sj, int64_t oq, bool stream) {
  constexpr int64_t kT = TileFor<E>();
  alignas(64) E buf[kT * kT];  // buf[(i - i0) * kT + (j - j0)]
  const int64_t ni = i1 - i0, nj = j1 - j0;
  for (int64_t j = 0; j < nj; ++j) {  // row by row: contiguous reads, strided writes into buf
    const E* src = in + i0 + (j0 + j) * sj;
    for (int64_t i = 0; i < ni; ++i) buf[i * kT + j] = src[i];
  }
  for (int64_t i = 0; i < ni; ++i) {
    CopyRow(reinterpret_cast<char*>(out + (i0 + i) * oq + j0),
            reinterpret_cast<const char*>(buf + i * kT), static_cast<size_t>(nj) * sizeof(E),
            stream);
  }
}

// Permutes elements of type E (a same-size stand-in for the dtype: layout ops move bits).
template <typename E>
void PermuteCopy(const E* in, E* out, const Shape& in_shape, absl::Span<const int> perm) {
  const int r = static_cast<int>(perm.size());
  DimVec in_str(r, 1);
  for (int i = r - 2; i >= 0; --i) in_str[i] = in_str[i + 1] * in_shape[i + 1];
  DimVec sizes(r), str(r), out_str(r, 1);
  for (int i = 0; i < r; ++i) {
    sizes[i] = in_shape[perm[i]];
    str[i] = in_str[perm[i]];
  }
  for (int i = r - 2; i >= 0; --i) out_str[i] = out_str[i + 1] * sizes[i + 1];
  const int64_t numel = NumElements(in_shape);
  int q = r - 1;  // the output dim that walks the input's contiguous dim
  for (int i = 0; i < r; ++i) {
    if (perm[i] == r - 1) q = i;
  }
  if (q != r - 1 && sizes[q] > 1 && sizes[r - 1] > 1) {
    // A transpose of dims (q, last) for each index of the other dims, in square tiles so both
    // the strided reads and the contiguous writes stay in L1.
    constexpr int64_t kTile = TileFor<E>();
    const int64_t nq = sizes[q], nj = sizes[r - 1], sj = str[r - 1], oq = out_str[q];
    const bool stream = static_cast<size_t>(numel) * sizeof(E) >= kStreamBytes;
    DimVec idx(r, 0);
    int64_t in_off = 0, out_off = 0;
    for (int64_t o = 0; o < numel / (nq * nj); ++o) {
      if constexpr (sizeof(E) == 4) {  // register transposes of the widest ISA this CPU has
        cpu::Vec().transpose32(in + in_off, sj, out + out_off, oq, nq, nj, stream);
      } else {
        for (int64_t i0 = 0; i0 < nq; i0 += kTile) {
          const int64_t i1 = std::min(nq, i0 + kTile);
          for (int64_t j0 = 0; j0 < nj; j0 += kTile) {
            const int64_t j1 = std::min(nj, j0 + kTile);
            TransposeTile(in + in_off, out + out_off, i0, i1, j0, j1, sj, oq, stream);
          }
        }
      }
      for (int k = r - 2; k >= 0; --k) {  // odometer over the other dims
        if (k == q) continue;
        in_off += str[k];
        out_off += out_str[k];
        if (++idx[k] < sizes[k]) break;
        in_off -= str[k] * sizes[k];
        out_off -= out_str[k] * sizes[k];
        idx[k] = 0;
      }
    }
#if defined(__SSE2__)
    if (stream) _mm_sfence();  // order the streaming stores before the tensor is handed out
#endif
    return;
  }
  // The innermost dim stays innermost (or is trivial): copy output rows.
  const int64_t inner = sizes[r - 1], s_inner = str[r - 1];
  const int64_t rows = numel / inner;
  DimVec idx(r, 0);
  int64_t off = 0;
  for (int64_t row = 0; row < rows; ++row) {
    E* o = out + row * inner;
    if (s_inner == 1) {  // e.g. splitting heads: [b,s,h,d] -> [b,h,s,d] moves rows of d
      std::memcpy(o, in + off, inner * sizeof(E));
    } else {
      for (int64_t j = 0; j < inner; ++j) o[j] = in[off + j * s_inner];
    }
    for (int k = r - 2; k >= 0; --k) {
      off += str[k];
      if (++idx[k] < sizes[k]) break;
      off -= str[k] * sizes[k];
      idx[k] = 0;
    }
  }
}

// Dispatches on the element size so layout ops work for every dtype.
template <typename Fn>
void DispatchBySize(DType t, Fn&& fn) {
  switch (DTypeSize(t)) {
    case 2: fn(uint16_t{}); break;
    case 4: fn(uint32_t{}); break;
    default: fn(uint64_t{}); break;
  }
}

// Rounds d to float with round-to-odd, so a later float -> bf16/f16 RNE rounding equals a
// single correct rounding of d (float has >= 2 more mantissa bits than either).
float DoubleToFloatRoundToOdd(double d) {
  float f = static_cast<float>(d);
  if (std::isnan(d) || static_cast<double>(f) == d) return f;
  if (std::fabs(static_cast<double>(f)) > std::fabs(d)) f = std::nextafter(f, 0.0f);
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  bits |= 1u;
  std::memcpy(&f, &bits, 4);
  return f;
}

double LoadAsDouble(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::kF32: return static_cast<const float*>(p)[i];
    case DType::kF64: return static_cast<const double*>(p)[i];
    case DType::kI32: return static_cast<const int32_t*>(p)[i];
    case DType::kI64: return static_cast<double>(static_cast<const int64_t*>(p)[i]);
    case DType::kBF16: return BF16ToFloat(static_cast<const uint16_t*>(p)[i]);
    case DType::kF16: return F16ToFloat(static_cast<const uint16_t*>(p)[i]);
  }
  return 0;
}

void StoreFromDouble(void* p, DType t, int64_t i, double v) {
  switch (t) {
    case DType::kF32: static_cast<float*>(p)[i] = static_cast<float>(v); break;
    case DType::kF64: static_cast<double*>(p)[i] = v; break;
    case DType::kI32: static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v); break;
    case DType::kI64: static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v); break;
    case DType::kBF16:
      static_cast<uint16_t*>(p)[i] = FloatToBF16(DoubleToFloatRoundToOdd(v));
      break;
    case DType::kF16:
      static_cast<uint16_t*>(p)[i] = FloatToF16(DoubleToFloatRoundToOdd(v));
      break;
  }
}

}  // namespace

namespace {

// Layout ops move bytes only: 0 flops, the output's bytes read and written.
void RecordCopy(const internal::OpScope& scope, const char* op, DType dtype, double out_bytes) {
  if (scope.counting()) scope.Record(op, dtype, 0, 2 * out_bytes);
}

Tensor PermuteImpl(const Tensor& x, absl::Span<const int> perm) {
  internal::OpScope scope;
  internal::RequireDefined("permute", x, "input");
  const int r = x.rank();
  if (static_cast<int>(perm.size()) != r) {
    OpFail("permute: perm {", absl::StrJoin(perm, ","), "} has ", perm.size(),
           " entries but ", x.ShapeString(), " has rank ", r);
  }
  absl::InlinedVector<int, 8> p(r);
  absl::InlinedVector<bool, 8> seen(r, false);
  bool identity = true;
  for (int i = 0; i < r; ++i) {
    const int d = internal::NormalizeDim("permute", perm[i], x);
    if (seen[d]) {
      OpFail("permute: perm {", absl::StrJoin(perm, ","), "} lists dim ", d,
             " twice; expected a permutation of 0..", r - 1);
    }
    seen[d] = true;
    p[i] = d;
    identity = identity && d == i;
  }
  RecordCopy(scope, "permute", x.dtype(), internal::TensorBytes(x));
  if (identity) return x.Clone();
  if (x.is_cuda()) return cuda::Permute(x, p);
  Shape out_shape(r);
  for (int i = 0; i < r; ++i) out_shape[i] = x.shape()[p[i]];
  if (x.is_meta()) return Tensor::Empty(out_shape, x.dtype(), x.device());
  Tensor out = Tensor::Empty(out_shape, x.dtype());
  if (out.numel() == 0) return out;
  DispatchBySize(x.dtype(), [&](auto zero) {
    using E = decltype(zero);
    PermuteCopy(static_cast<const E*>(x.raw_data()), static_cast<E*>(out.raw_data()), x.shape(),
                p);
  });
  return out;
}

}  // namespace

Tensor Permute(const Tensor& x, const std::vector<int>& perm) { return PermuteImpl(x, perm); }

Tensor Transpose(const Tensor& x, int dim0, int dim1) {
  internal::RequireDefined("transpose", x, "input");
  const int d0 = internal::NormalizeDim("transpose", dim0, x);
  const int d1 = internal::NormalizeDim("transpose", dim1, x);
  absl::InlinedVector<int, 8> perm(x.rank());
  std::iota(perm.begin(), perm.end(), 0);
  std::swap(perm[d0], perm[d1]);
  return PermuteImpl(x, perm);
}

Tensor Slice(const Tensor& x, int dim, int64_t start, int64_t length) {
  internal::OpScope scope;
  internal::RequireDefined("slice", x, "input");
  const int d = internal::NormalizeDim("slice", dim, x);
  const int64_t size = x.shape()[d];
  if (start < 0 || length < 0 || start > size || length > size - start) {
    OpFail("slice: [", start, ", ", start + length, ") along dim ", dim, " is out of range for ",
           x.ShapeString(), " (dim size ", size, "); expected 0 <= start <= start+length <= ",
           size);
  }
  Shape out_shape = x.shape();
  out_shape[d] = length;
  RecordCopy(scope, "slice", x.dtype(), internal::ShapeBytes(out_shape, x.dtype()));
  if (d == 0) return x.SliceRows(start, length).Clone();
  if (x.is_meta()) return Tensor::Empty(out_shape, x.dtype(), x.device());
  if (x.is_cuda()) return cuda::Slice(x, d, start, length);
  Tensor out = Tensor::Empty(out_shape, x.dtype());
  const int64_t outer = Prod(x.shape(), 0, d);
  const size_t inner = static_cast<size_t>(Prod(x.shape(), d + 1, x.rank())) * DTypeSize(x.dtype());
  const char* in = static_cast<const char*>(x.raw_data());
  char* o = static_cast<char*>(out.raw_data());
  const size_t chunk = length * inner;
  if (chunk == 0) return out;
  for (int64_t i = 0; i < outer; ++i) {
    std::memcpy(o + i * chunk, in + (i * size + start) * inner, chunk);
  }
  return out;
}

void SliceAssign(Tensor& whole, int dim, int64_t start, const Tensor& part) {
  internal::OpScope scope;
  internal::RequireDefined("slice_assign", whole, "destination");
  internal::RequireDefined("slice_assign", part, "source");
  internal::RequireSameDType("slice_assign", whole, part);
  const int d = internal::NormalizeDim("slice_assign", dim, whole);
  bool ok = whole.rank() == part.rank();
  for (int i = 0; ok && i < whole.rank(); ++i) {
    if (i != d && whole.shape()[i] != part.shape()[i]) ok = false;
  }
  if (!ok) {
    OpFail("slice_assign: part ", part.ShapeString(), " does not fit ", whole.ShapeString(),
           " along dim ", dim, "; all other dims must be equal");
  }
  const int64_t size = whole.shape()[d], length = part.shape()[d];
  if (start < 0 || start > size - length) {
    OpFail("slice_assign: [", start, ", ", start + length, ") along dim ", dim,
           " is out of range for ", whole.ShapeString());
  }
  internal::RequireSameDevice("slice_assign", whole, part);
  RecordCopy(scope, "slice_assign", part.dtype(), internal::TensorBytes(part));
  if (whole.is_meta()) return;
  if (whole.is_cuda()) {
    cuda::SliceAssign(whole, d, start, part);
    return;
  }
  const int64_t outer = Prod(whole.shape(), 0, d);
  const size_t inner =
      static_cast<size_t>(Prod(whole.shape(), d + 1, whole.rank())) * DTypeSize(whole.dtype());
  const size_t chunk = length * inner;
  if (chunk == 0 || outer == 0) return;
  char* o = static_cast<char*>(whole.raw_data());
  const char* in = static_cast<const char*>(part.raw_data());
  for (int64_t i = 0; i < outer; ++i) {
    std::memmove(o + (i * size + start) * inner, in + i * chunk, chunk);
  }
}

Tensor Concat(const std::vector<Tensor>& parts, int dim) {
  internal::OpScope scope;
  if (parts.empty()) OpFail("concat: got no tensors; expected at least one");
  const Tensor& first = parts[0];
  internal::RequireDefined("concat", first, "part 0");
  const int d = internal::NormalizeDim("concat", dim, first);
  Shape out_shape = first.shape();
  int64_t total = 0;
  for (size_t p = 0; p < parts.size(); ++p) {
    const Tensor& t = parts[p];
    internal::RequireDefined("concat", t, "a part");
    bool ok = t.rank() == first.rank() && t.dtype() == first.dtype();
    for (int i = 0; ok && i < t.rank(); ++i) {
      if (i != d && t.shape()[i] != first.shape()[i]) ok = false;
    }
    if (!ok) {
      OpFail("concat: part ", p, " is ", t.ShapeString(), " but part 0 is ", first.ShapeString(),
             "; parts need one dtype and equal sizes on every dim except dim ", dim);
    }
    internal::RequireSameDevice("concat", first, t);
    total += t.shape()[d];
  }
  out_shape[d] = total;
  RecordCopy(scope, "concat", first.dtype(), internal::ShapeBytes(out_shape, first.dtype()));
  Tensor out = Tensor::Empty(out_shape, first.dtype(), first.device());  // meta: no copies below
  int64_t at = 0;
  for (const Tensor& t : parts) {
    SliceAssign(out, d, at, t);
    at += t.shape()[d];
  }
  return out;
}

std::vector<Tensor> Split(const Tensor& x, int dim, const std::vector<int64_t>& sizes) {
  internal::RequireDefined("split", x, "input");
  const int d = internal::NormalizeDim("split", dim, x);
  int64_t total = 0;
  for (int64_t s : sizes) {
    if (s < 0) OpFail("split: negative size ", s, " in {", absl::StrJoin(sizes, ","), "}");
    total += s;
  }
  if (total != x.shape()[d]) {
    OpFail("split: sizes {", absl::StrJoin(sizes, ","), "} sum to ", total, " but dim ", dim,
           " of ", x.ShapeString(), " is ", x.shape()[d]);
  }
  std::vector<Tensor> out;
  out.reserve(sizes.size());
  int64_t at = 0;
  for (int64_t s : sizes) {
    out.push_back(Slice(x, d, at, s));
    at += s;
  }
  return out;
}

std::vector<Tensor> Chunk(const Tensor& x, int dim, int n) {
  internal::RequireDefined("chunk", x, "input");
  const int d = internal::NormalizeDim("chunk", dim, x);
  if (n <= 0) OpFail("chunk: number of chunks must be positive, got ", n);
  if (x.shape()[d] % n != 0) {
    OpFail("chunk: dim ", dim, " of ", x.ShapeString(), " (size ", x.shape()[d],
           ") is not divisible into ", n, " equal chunks");
  }
  return Split(x, d, std::vector<int64_t>(n, x.shape()[d] / n));
}

Tensor Cast(const Tensor& x, DType dtype) {
  internal::OpScope scope;
  internal::RequireDefined("cast", x, "input");
  if (x.dtype() == dtype) return x;
  if (scope.counting()) {  // each element read in one dtype, written in the other
    scope.Record("cast", dtype, 0,
                 internal::TensorBytes(x) + internal::ShapeBytes(x.shape(), dtype));
  }
  if (x.is_meta()) return Tensor::Empty(x.shape(), dtype, x.device());
  if (x.is_cuda()) return cuda::Cast(x, dtype);
  Tensor out = Tensor::Empty(x.shape(), dtype);
  const int64_t n = x.numel();
  const DType from = x.dtype();
  if (from == DType::kF32 && (dtype == DType::kBF16 || dtype == DType::kF16)) {
    const float* in = x.data<float>();
    uint16_t* o = static_cast<uint16_t*>(out.raw_data());
    if (dtype == DType::kBF16) {
      for (int64_t i = 0; i < n; ++i) o[i] = FloatToBF16(in[i]);
    } else {
      for (int64_t i = 0; i < n; ++i) o[i] = FloatToF16(in[i]);
    }
  } else if (dtype == DType::kF32 && (from == DType::kBF16 || from == DType::kF16)) {
    const uint16_t* in = static_cast<const uint16_t*>(x.raw_data());
    float* o = out.data<float>();
    if (from == DType::kBF16) {
      for (int64_t i = 0; i < n; ++i) o[i] = BF16ToFloat(in[i]);
    } else {
      for (int64_t i = 0; i < n; ++i) o[i] = F16ToFloat(in[i]);
    }
  } else if (from == DType::kF32 && dtype == DType::kF64) {
    const float* in = x.data<float>();
    double* o = out.data<double>();
    for (int64_t i = 0; i < n; ++i) o[i] = in[i];
  } else if (from == DType::kF64 && dtype == DType::kF32) {
    const double* in = x.data<double>();
    float* o = out.data<float>();
    for (int64_t i = 0; i < n; ++i) o[i] = static_cast<float>(in[i]);
  } else {  // rare pairs (ints, f64 <-> half, bf16 <-> f16): through double, exact or rounded once
    const void* in = x.raw_data();
    void* o = out.raw_data();
    for (int64_t i = 0; i < n; ++i) StoreFromDouble(o, dtype, i, LoadAsDouble(in, from, i));
  }
  return out;
}

}  // namespace shardmap
