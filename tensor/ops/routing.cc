#include "tensor/ops/routing.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "tensor/cuda/routing/routing_ops.h"
#include "tensor/error.h"
#include "tensor/internal/accounting.h"
#include "tensor/ops/internal/op_util.h"
#include "tensor/ops/shape_ops.h"

namespace shardmap {
namespace {

using internal::ShapeBytes;
using internal::TensorBytes;


// Rows of x: the leading dims flattened.
// Rows of x: the product of all but its last dim (so [5, 0] has 5 empty rows).
int64_t RowsOf(const Tensor& x) {
  return x.rank() == 0 ? 0 : internal::Prod(x.shape(), 0, x.rank() - 1);
}

void CheckIndexVector(const char* op, const Tensor& idx) {
  internal::RequireInteger(op, idx, "idx");
  if (idx.rank() != 1) OpFail(op, ": idx ", idx.ShapeString(), " must have rank 1 [m]");
}

// idx[i] as a row of [0, n) or -1; anything else is an OpError naming position and bound.
int64_t RowAt(const char* op, const Tensor& idx, int64_t i, int64_t n) {
  const int64_t r = internal::IndexAt(idx, i);
  if (r < -1 || r >= n) {
    OpFail(op, ": idx[", i, "] = ", r, " is out of range; expected -1 (no row) or 0 <= idx < ", n);
  }
  return r;
}

}  // namespace

TopKResult TopK(const Tensor& x, int64_t k) {
  const char* op = "top_k";
  internal::OpScope scope;
  internal::RequireFloating(op, x, "x");
  if (x.rank() < 1) OpFail(op, ": x ", x.ShapeString(), " must have rank >= 1");
  const int64_t n = x.dim(-1);
  if (k < 1 || k > n) {
    OpFail(op, ": k = ", k, " is out of range for x ", x.ShapeString(), "; expected 1 <= k <= ", n,
           " (the last dim)");
  }
  if (scope.counting() || x.is_meta()) {  // ~1 comparison per element (a partial sort)
    Shape out_shape = x.shape();
    out_shape.back() = k;
    if (scope.counting()) {
      scope.Record(op, x.dtype(), static_cast<double>(x.numel()),
                   TensorBytes(x) + ShapeBytes(out_shape, x.dtype()) +
                       ShapeBytes(out_shape, DType::kI64));
    }
    // (values are not read on meta: which k are chosen, and a NaN, are known only on a device)
    if (x.is_meta()) {
      return {Tensor::Empty(out_shape, x.dtype(), x.device()),
              Tensor::Empty(out_shape, DType::kI64, x.device())};
    }
  }
  if (x.is_cuda()) {
    cuda::TopKOutputs r = cuda::TopK(x, k);
    return {std::move(r.values), std::move(r.indices)};
  }
  const int64_t rows = x.numel() / n;
  Shape out_shape = x.shape();
  out_shape.back() = k;
  const Tensor xd = Cast(x, DType::kF64);
  const double* px = xd.data<double>();
  std::vector<double> vals(rows * k);
  std::vector<int64_t> ids(rows * k);
  std::vector<int64_t> order(n);
  for (int64_t r = 0; r < rows; ++r) {
    const double* row = px + r * n;
    for (int64_t j = 0; j < n; ++j) {
      if (std::isnan(row[j])) {
        OpFail(op, ": x ", x.ShapeString(), " holds NaN at row ", r, ", column ", j,
               "; top-k of NaN is undefined");
      }
    }
    std::iota(order.begin(), order.end(), 0);
    // Larger first; equal values: lower index first.
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int64_t a, int64_t b) {
      return row[a] > row[b] || (row[a] == row[b] && a < b);
    });
    for (int64_t j = 0; j < k; ++j) {
      ids[r * k + j] = order[j];
      vals[r * k + j] = row[order[j]];
    }
  }
  TopKResult out;
  out.values = Cast(Tensor::FromVector<double>(out_shape, vals), x.dtype());
  out.indices = Tensor::FromVector<int64_t>(out_shape, ids);
  return out;
}

Tensor TopKBackward(const Tensor& dvalues, const Tensor& indices, int64_t n) {
  const char* op = "top_k_backward";
  internal::OpScope scope;
  internal::RequireFloating(op, dvalues, "dvalues");
  internal::RequireInteger(op, indices, "indices");
  internal::RequireSameShape(op, dvalues, indices);
  internal::RequireSameDevice(op, dvalues, indices);
  if (dvalues.rank() < 1 || dvalues.dim(-1) > n) {
    OpFail(op, ": dvalues ", dvalues.ShapeString(), " must have rank >= 1 and k <= n = ", n);
  }
  if (scope.counting() || dvalues.is_meta()) {
    Shape out_shape = dvalues.shape();
    out_shape.back() = n;
    if (scope.counting()) {
      scope.Record(op, dvalues.dtype(), static_cast<double>(dvalues.numel()),
                   TensorBytes(dvalues) + TensorBytes(indices) +
                       ShapeBytes(out_shape, dvalues.dtype()));
    }
    if (dvalues.is_meta()) return Tensor::Empty(out_shape, dvalues.dtype(), dvalues.device());
  }
  if (dvalues.is_cuda()) return cuda::TopKBackward(dvalues, indices, n);
  const int64_t k = dvalues.dim(-1), rows = k == 0 ? 0 : dvalues.numel() / k;
  Shape out_shape = dvalues.shape();
  out_shape.back() = n;
  const DType ct = dvalues.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
  const Tensor g = Cast(dvalues, ct);
  Tensor out = Tensor::Zeros(out_shape, ct);
  internal::DispatchF32F64(ct, [&](auto zero) {
    using T = decltype(zero);
    const T* pg = g.data<T>();
    T* po = out.data<T>();
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < k; ++j) {
        const int64_t c = internal::IndexAt(indices, r * k + j);
        if (c < 0 || c >= n) {
          OpFail(op, ": index ", c, " at row ", r, " is out of range; expected 0 <= index < ", n);
        }
        po[r * n + c] += pg[r * k + j];
      }
    }
  });
  return Cast(out, dvalues.dtype());
}

Tensor GatherRows(const Tensor& x, const Tensor& idx) {
  const char* op = "gather_rows";
  internal::OpScope scope;
  internal::RequireDefined(op, x, "x");
  CheckIndexVector(op, idx);
  internal::RequireSameDevice(op, x, idx);
  if (x.rank() < 2) OpFail(op, ": x ", x.ShapeString(), " must have rank >= 2 [rows..., d]");
  if (scope.counting()) {
    scope.Record(op, x.dtype(), 0,
                 TensorBytes(idx) + 2 * ShapeBytes({idx.numel(), x.dim(-1)}, x.dtype()));
  }
  if (x.is_meta()) return Tensor::Empty({idx.numel(), x.dim(-1)}, x.dtype(), x.device());
  if (x.is_cuda()) return cuda::GatherRows(x, idx);
  const int64_t d = x.dim(-1), rows = RowsOf(x), m = idx.numel();
  Tensor out = Tensor::Zeros({m, d}, x.dtype());
  const size_t row_bytes = static_cast<size_t>(d) * DTypeSize(x.dtype());
  const char* src = static_cast<const char*>(x.raw_data());
  char* dst = static_cast<char*>(out.raw_data());
  for (int64_t i = 0; i < m; ++i) {
    const int64_t r = RowAt(op, idx, i, rows);
    if (r >= 0 && row_bytes > 0) std::memcpy(dst + i * row_bytes, src + r * row_bytes, row_bytes);
  }
  return out;
}

Tensor ScatterAddRows(const Tensor& x, const Tensor& idx, int64_t n) {
  const char* op = "scatter_add_rows";
  internal::OpScope scope;
  internal::RequireFloating(op, x, "x");
  CheckIndexVector(op, idx);
  internal::RequireSameDevice(op, x, idx);
  if (x.rank() < 2) OpFail(op, ": x ", x.ShapeString(), " must have rank >= 2 [rows..., d]");
  if (n < 0) OpFail(op, ": n = ", n, "; expected >= 0");
  const int64_t d = x.dim(-1), m = idx.numel();
  if (RowsOf(x) != m) {
    OpFail(op, ": x ", x.ShapeString(), " has ", RowsOf(x), " rows but idx ", idx.ShapeString(),
           " has ", m, " entries; expected one index per row");
  }
  if (scope.counting()) {  // one add per element of x into the zeroed output
    scope.Record(op, x.dtype(), static_cast<double>(x.numel()),
                 TensorBytes(x) + TensorBytes(idx) + ShapeBytes({n, d}, x.dtype()));
  }
  if (x.is_meta()) return Tensor::Empty({n, d}, x.dtype(), x.device());
  if (x.is_cuda()) return cuda::ScatterAddRows(x, idx, n);
  const DType ct = x.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
  const Tensor xc = Cast(x, ct);
  Tensor out = Tensor::Zeros({n, d}, ct);
  internal::DispatchF32F64(ct, [&](auto zero) {
    using T = decltype(zero);
    const T* px = xc.data<T>();
    T* po = out.data<T>();
    for (int64_t i = 0; i < m; ++i) {
      const int64_t r = RowAt(op, idx, i, n);
      if (r < 0) continue;
      for (int64_t j = 0; j < d; ++j) po[r * d + j] += px[i * d + j];
    }
  });
  return Cast(out, x.dtype());
}

Tensor LocalIndices(const Tensor& ids, int64_t start, int64_t size, int64_t stride, bool strict,
                    const char* op, const std::string& context) {
  internal::OpScope scope;
  internal::RequireInteger(op, ids, "ids");
  if (size < 0) OpFail(op, ": size = ", size, "; expected >= 0");
  if (scope.counting()) {
    scope.Record("local_indices", ids.dtype(), static_cast<double>(ids.numel()),
                 TensorBytes(ids) + ShapeBytes(ids.shape(), DType::kI64));
  }
  // (ids are not read on meta: strict's out-of-range error is raised only on a device)
  if (ids.is_meta()) return Tensor::Empty(ids.shape(), DType::kI64, ids.device());
  if (ids.is_cuda()) return cuda::LocalIndices(ids, start, size, stride, strict, op, context);
  const int64_t n = ids.numel();
  std::vector<int64_t> out(n);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t id = internal::IndexAt(ids, i), l = id - start;
    if (l >= 0 && l < size) {
      out[i] = i * stride + l;
    } else if (strict) {
      OpFail(op, ": index ", id, " at position ", i, " is out of range [", start, ", ",
             start + size, ")", context);
    } else {
      out[i] = -1;
    }
  }
  return Tensor::FromVector<int64_t>(ids.shape(), out);
}

}  // namespace shardmap
