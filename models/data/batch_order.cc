#include "models/data/batch_order.h"

#include <algorithm>

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
  Tensor in = Tensor::Empty({batch, seq}, DType::kI64), out = Tensor::Empty({batch, seq}, DType::kI64);
  int64_t* pi = in.data<int64_t>();
  int64_t* po = out.data<int64_t>();
  // Row b is tokens[(start + t) % n] for t < seq: whole runs of `tokens` copied at once, wrapping
  // to its start at n (the same values as one element at a time, in bulk).
  auto copy_wrapped = [&](int64_t from, int64_t* dst) {
    for (int64_t t = 0; t < seq;) {
      const int64_t at = (from + t) % n, run = std::min(seq - t, n - at);
      std::copy(tokens.begin() + at, tokens.begin() + at + run, dst + t);
      t += run;
    }
  };
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t start = ((step * batch + b) * seq) % n;
    copy_wrapped(start, pi + b * seq);
    copy_wrapped(start + 1, po + b * seq);
  }
  *ids = in;
  *targets = out;
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
  Tensor in = Tensor::Empty({batch, seq}, DType::kI64), out = Tensor::Empty({batch, seq}, DType::kI64);
  int64_t* pi = in.data<int64_t>();
  int64_t* po = out.data<int64_t>();
  for (int64_t b = 0; b < batch; ++b) {
    const auto first = tokens.begin() + starts[b];
    std::copy(first, first + seq, pi + b * seq);
    std::copy(first + 1, first + 1 + seq, po + b * seq);
  }
  *ids = in;
  *targets = out;
}

}  // namespace shardmap
