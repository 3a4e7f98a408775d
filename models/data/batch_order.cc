#include "models/data/batch_order.h"

#include "absl/strings/str_cat.h"
#include "tensor/random.h"

namespace shardmap {
namespace {

// The data's own key: the run's seed also initialises the weights.
constexpr uint64_t kDataKey = 0x6461746100000000ull;  // "data"

}  // namespace

void BatchAt(const std::vector<int64_t>& tokens, int64_t step, int64_t batch, int64_t seq,
             Tensor* ids, Tensor* targets) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  std::vector<int64_t> in(batch * seq), out(batch * seq);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t start = ((step * batch + b) * seq) % n;
    for (int64_t t = 0; t < seq; ++t) {
      in[b * seq + t] = tokens[(start + t) % n];
      out[b * seq + t] = tokens[(start + t + 1) % n];
    }
  }
  *ids = Tensor::FromVector<int64_t>({batch, seq}, in);
  *targets = Tensor::FromVector<int64_t>({batch, seq}, out);
}

absl::StatusOr<BatchOrder> ParseBatchOrder(const std::string& name, uint64_t seed) {
  if (name == "random") return BatchOrder{.random = true, .seed = seed};
  if (name == "sequential") return BatchOrder{.random = false, .seed = seed};
  return absl::InvalidArgumentError(absl::StrCat(
      "--data_order ", name, ": use random (nanoGPT's sampled offsets) or sequential"));
}

std::vector<int64_t> RandomBatchStarts(int64_t n_tokens, int64_t step, int64_t batch,
                                       int64_t seq, uint64_t seed) {
  const Tensor starts = RandomIntsSlice({step + 1, batch}, {step, 0}, {1, batch},
                                        n_tokens - seq, seed ^ kDataKey);
  return starts.ToVector<int64_t>();
}

void BatchOf(const std::vector<int64_t>& tokens, int64_t step, int64_t batch, int64_t seq,
             const BatchOrder& order, Tensor* ids, Tensor* targets) {
  if (!order.random) {
    BatchAt(tokens, step, batch, seq, ids, targets);
    return;
  }
  const int64_t n = static_cast<int64_t>(tokens.size());
  const std::vector<int64_t> starts = RandomBatchStarts(n, step, batch, seq, order.seed);
  std::vector<int64_t> in(batch * seq), out(batch * seq);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 0; t < seq; ++t) {
      in[b * seq + t] = tokens[starts[b] + t];
      out[b * seq + t] = tokens[starts[b] + t + 1];
    }
  }
  *ids = Tensor::FromVector<int64_t>({batch, seq}, in);
  *targets = Tensor::FromVector<int64_t>({batch, seq}, out);
}

}  // namespace shardmap
