#include "models/model/kv_cache.h"

#include "tensor/error.h"
#include "tensor/ops/elementwise.h"

namespace shardmap {
namespace {

// Writes src [n, ...] into rows [start, start + n) of a zeroed buffer: 0 + x is x exactly (a
// -0.0 becomes +0.0, which no product or sum can tell apart).
void WriteRows(const Tensor& buffer, int64_t start, const Tensor& src) {
  Tensor dst = buffer.SliceRows(start, src.dim(0));
  AddInPlace(dst, src);
}

}  // namespace

KvCache::KvCache(int64_t layers, int64_t capacity) : capacity_(capacity), k_(layers), v_(layers) {
  if (layers < 0 || capacity < 1) {
    OpFail("KvCache: layers ", layers, " and capacity ", capacity,
           " must be >= 0 and >= 1 (the positions one generation keeps)");
  }
}

std::pair<Value, Value> KvCache::Append(int64_t layer, const Value& k, const Value& v) {
  if (layer < 0 || layer >= layers()) {
    OpFail("KvCache::Append: layer ", layer, " outside [0, ", layers(), ")");
  }
  if (k.rank() != 3 || k.shape() != v.shape() || k.dtype() != v.dtype()) {
    OpFail("KvCache::Append layer ", layer, ": k ", k.tensor.ShapeString(), " and v ",
           v.tensor.ShapeString(), " must both be [n, kv_heads, head_dim]");
  }
  const int64_t n = k.dim(0);
  if (length_ + n > capacity_) {
    OpFail("KvCache::Append layer ", layer, ": ", length_, " cached + ", n, " new positions "
           "exceed the capacity ", capacity_, " (prompt + new tokens, at most the model's seq)");
  }
  Tensor& kb = k_[layer];
  Tensor& vb = v_[layer];
  const Shape buffer_shape = {capacity_, k.dim(1), k.dim(2)};
  if (!kb.defined()) {
    kb = Tensor::Zeros(buffer_shape, k.dtype(), k.tensor.device());
    vb = Tensor::Zeros(buffer_shape, k.dtype(), k.tensor.device());
  } else if (kb.shape() != buffer_shape || kb.dtype() != k.dtype() ||
             kb.device() != k.tensor.device()) {
    OpFail("KvCache::Append layer ", layer, ": k ", k.tensor.ShapeString(), " on ",
           k.tensor.device().ToString(), " does not match the cached ", kb.ShapeString(), " on ",
           kb.device().ToString());
  }
  WriteRows(kb, length_, k.tensor);
  WriteRows(vb, length_, v.tensor);
  return {Value(kb.SliceRows(0, length_ + n), k.type), Value(vb.SliceRows(0, length_ + n), v.type)};
}

void KvCache::Advance(int64_t n) {
  if (n < 0 || length_ + n > capacity_) {
    OpFail("KvCache::Advance: ", length_, " + ", n, " positions outside the capacity ", capacity_);
  }
  length_ += n;
}

int64_t KvCache::bytes() const {
  int64_t total = 0;
  for (size_t i = 0; i < k_.size(); ++i) {
    if (k_[i].defined()) total += static_cast<int64_t>(k_[i].nbytes() + v_[i].nbytes());
  }
  return total;
}

}  // namespace shardmap
