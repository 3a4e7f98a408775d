// The order a training run reads its batches in.
//   sequential: sample b of step s is tokens [(s*B+b)*T, (s*B+b)*T + T + 1), wrapping around
//               (BatchAt in models/gpt/gpt_model.h): one pass after another, in file order.
//   random:     as nanoGPT's get_batch, sample b starts at a uniform offset in [0, N-T-1]. The
//               offsets of step s are row s of a counter-based random [steps, B] int tensor
//               (tensor/random.h's RandomIntsSlice, keyed by the seed), so any step's batch is
//               known without the steps before it: a resumed run reads exactly the batches the
//               uninterrupted run would have read, and every rank and every mesh the same ones.
//
//   BatchOrder order{.random = true, .seed = 1};
//   Tensor ids, targets;
//   BatchOf(tokens, /*step=*/7, /*batch=*/8, /*seq=*/64, order, &ids, &targets);  // [8, 64] each
#ifndef SHARDMAP_MODELS_DATA_BATCH_ORDER_H_
#define SHARDMAP_MODELS_DATA_BATCH_ORDER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tensor/tensor.h"

namespace shardmap {

struct BatchOrder {
  bool random = false;
  uint64_t seed = 0;
};

// Sample b of step s is tokens [(s*B+b)*T, (s*B+b)*T + T + 1) of `tokens`, wrapping around
// (inputs the first T, targets the last T). Returns [B, T] ids and targets (int64).
void BatchAt(const std::vector<int64_t>& tokens, int64_t step, int64_t batch, int64_t seq,
             Tensor* ids, Tensor* targets);

// "random" or "sequential" (--data_order), with the run's seed.
absl::StatusOr<BatchOrder> ParseBatchOrder(const std::string& name, uint64_t seed);

// The first token of each sample of step `step` under a random order: `batch` offsets in
// [0, n_tokens - seq - 1]. n_tokens >= seq + 1.
std::vector<int64_t> RandomBatchStarts(int64_t n_tokens, int64_t step, int64_t batch,
                                       int64_t seq, uint64_t seed);

// Step `step`'s [batch, seq] inputs and targets (the inputs shifted by one token) in `order`.
// tokens.size() >= seq + 1 (CheckTokens).
void BatchOf(const std::vector<int64_t>& tokens, int64_t step, int64_t batch, int64_t seq,
             const BatchOrder& order, Tensor* ids, Tensor* targets);

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_DATA_BATCH_ORDER_H_
