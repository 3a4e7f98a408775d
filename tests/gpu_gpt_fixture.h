// The small GPT the GPU tests train (gpt_gpu_test, gpu_train_graph_test): its configuration
// and a learnable token stream, so that both compare runs of the same model and data.
//
//   GptConfig c = gpu_gpt_fixture::Config(DType::kF32, DType::kBF16);   // bf16 compute
//   std::vector<int64_t> tokens = gpu_gpt_fixture::Tokens(600, c.vocab);
#ifndef SHARDMAP_TESTS_GPU_GPT_FIXTURE_H_
#define SHARDMAP_TESTS_GPU_GPT_FIXTURE_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "models/gpt.h"
#include "tensor/dtype.h"

namespace shardmap::gpu_gpt_fixture {

// 2 layers, d_model 24, 6 heads, vocab 48, seq 8; weights in `dtype`, optional compute dtype.
inline GptConfig Config(DType dtype, std::optional<DType> compute = std::nullopt) {
  GptConfig c;
  c.layers = 2;
  c.d_model = 24;
  c.heads = 6;
  c.vocab = 48;
  c.seq = 8;
  c.dtype = dtype;
  c.compute = compute;
  return c;
}

// A repeating phrase with slowly changing parts: the losses fall within a few steps.
inline std::vector<int64_t> Tokens(int64_t n, int64_t vocab) {
  std::vector<int64_t> t(n);
  for (int64_t i = 0; i < n; ++i) t[i] = ((i % 9) * 5 + (i / 45) % 3 + i * i % 7) % vocab;
  return t;
}

}  // namespace shardmap::gpu_gpt_fixture

#endif  // SHARDMAP_TESTS_GPU_GPT_FIXTURE_H_
