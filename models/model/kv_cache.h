// The per-device key/value cache of one generation (the contract's decode hooks, model.h).
//
//   KvCache cache(model.shape().layers, /*capacity=*/prompt.size() + new_tokens);
//   // per step: x = model.DecodeEmbed(use, ids, cache.length());
//   //           for i: x = model.DecodeBlock(use, i, x, cache);   // Append(i, k, v) inside
//   //           cache.Advance(ids.dim(0));
//
// Each layer keeps two buffers [capacity, kv_heads_local, head_dim], allocated on the first
// Append and written in place (no regrowth: memory is bounded by the capacity, at most the
// model's seq). Grouped-query models store their kv heads, not the query heads; under tp each
// device stores its own kv heads. Generation has no tape: the cache holds plain tensors.
#ifndef SHARDMAP_MODELS_MODEL_KV_CACHE_H_
#define SHARDMAP_MODELS_MODEL_KV_CACHE_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "shardmap/value.h"
#include "tensor/tensor.h"

namespace shardmap {

class KvCache {
 public:
  KvCache(int64_t layers, int64_t capacity);

  int64_t capacity() const { return capacity_; }
  int64_t length() const { return length_; }  // positions cached in every layer
  int64_t layers() const { return static_cast<int64_t>(k_.size()); }

  // Layer `layer`'s keys and values of the positions [length(), length() + n): k, v [n, kvh, hd]
  // (kvh: this device's kv heads). Returns every cached position of that layer, [length() + n,
  // kvh, hd], typed as k and v. Throws OpError (naming the layer and sizes) past the capacity or
  // when the shape, dtype or device differs from the layer's earlier appends.
  std::pair<Value, Value> Append(int64_t layer, const Value& k, const Value& v);
  // After every layer appended n positions.
  void Advance(int64_t n);
  // Bytes of the buffers allocated so far (for tests of the bound).
  int64_t bytes() const;

 private:
  int64_t capacity_;
  int64_t length_ = 0;
  std::vector<Tensor> k_, v_;  // [capacity, kvh, hd] each, undefined until the first Append
};

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_MODEL_KV_CACHE_H_
