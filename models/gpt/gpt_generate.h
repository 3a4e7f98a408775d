// Sampling text from any registered model (GPT-2, Llama 3: the contract of models/model/model.h)
// on any mesh its layout allows: each new token is the prediction at the last position of the
// context, by greedy argmax or temperature / top-k sampling as nanoGPT's sample.py.
//
// Two ways to run the model (SampleOptions::kv_cache):
//   KV cache (kAuto's choice when the model implements the Decode* hooks and prompt + tokens - 1
//   positions fit in the model's seq): the prompt runs once (prefill), then each step feeds only
//   the new token, attending over every layer's cached keys and values (models/model/
//   kv_cache.h; grouped-query models cache kv_heads; rotary/learned positions continue from the
//   cached length). Memory: 2 * layers * (prompt + tokens - 1) * kv_heads/tp * head_dim per
//   device, allocated once. The rows are whole on every device (tp splits the heads; no SP, no
//   ring attention under cp). Equal to the recomputation below (f64 to ~1e-15).
//   Recomputation (kOff, or kAuto when the cache does not apply; KvCacheUse says why): the
//   context cropped to its last cfg.seq tokens, run whole every step (below).
//
//   GptLayout layout = *GptLayout::Create(*ParseMesh("dp=2,tp=2"), cfg, /*sp=*/true);
//   absl::StatusOr<std::vector<int64_t>> out =
//       GenerateGpt(layout, result.params, /*prompt=*/{'T', 'h', 'e'},
//                   SampleOptions{.tokens = 100, .temperature = 0.8, .top_k = 40, .seed = 1});
//   // *out: the 100 new ids (the prompt not included); temperature 0: greedy.
//   absl::StatusOr<std::vector<double>> logits = GptNextTokenLogits(layout, params, context);
//
// How the recomputation runs: one SPMD program (RunSpmd over layout.mesh(), or
// RunOnCommunicator over options.comm in a multi-process run; the cached path too) in which each
// rank holds its shards of the parameters for the whole generation. Each step runs the model's
// own per-device pieces (Embed, Block; FSDP parameters all_gathered at use) on a full seq
// window: the context, right-padded with id 0
// (causal attention: the padding cannot change the logits of the positions before it). The
// window is repeated over the batch axes (every data-parallel rank computes the same row) and,
// under sequence parallelism, as often as makes each rank's tokens divisible by tp; under cp the
// rows are load balanced as in training. The logits head is ln_f, then the vocab-parallel
// lm_head tied to wte (S1 on tp), all_gathered over tp and over the rows, so every rank sees the
// same logits and draws the same token: every mesh gives the 1-device result (bit-for-bit up to
// the floating-point order of the sharded sums; greedy tokens agree unless two logits tie).
//
// Sampling (SampleToken): temperature 0 takes the argmax (lowest id on ties); temperature > 0
// draws from softmax(logits / temperature) restricted to the top_k largest logits (0: all; ties
// with the k-th are kept, as nanoGPT's `logits[logits < v[-1]] = -inf`), with a splitmix64
// stream seeded by `seed`: the same seed, model and mesh give the same tokens. top_k = 1 is
// greedy.
//
// Errors (InvalidArgument naming the value and the fix): an empty prompt, ids outside
// [0, vocab), tokens < 0, temperature < 0 or not finite, top_k < 0 or > vocab, parameters that
// do not match the layout (MatchInitialParams). Unimplemented: MoE models and pipeline (pp > 1)
// meshes (sample on a mesh without pp: the parameters are global tensors). kv_cache kOn:
// Unimplemented for a model without the Decode* hooks (MoE GPT), InvalidArgument when
// prompt + tokens - 1 exceeds the model's seq (the message gives the most tokens that fit).
#ifndef SHARDMAP_MODELS_GPT_GPT_GENERATE_H_
#define SHARDMAP_MODELS_GPT_GPT_GENERATE_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "collectives/communicator.h"
#include "shardmap/device_placement.h"
#include "models/model/model.h"
#include "shardmap/value.h"

namespace shardmap {

// Whether generation keeps a KV cache (see the header comment).
enum class KvCacheMode {
  kAuto,  // the cache when the model has one and prompt + tokens - 1 <= seq, else recompute
  kOn,    // the cache, or an error: Unimplemented (the model has none), InvalidArgument (too long)
  kOff,   // recompute the window every token
};

struct SampleOptions {
  int64_t tokens = 16;       // new tokens to generate (0: none)
  double temperature = 0;    // 0: greedy; > 0: softmax(logits / temperature)
  int64_t top_k = 0;         // 0: every id; k: only the k most likely (1: greedy)
  uint64_t seed = 0;         // the sampling stream (unused when greedy)
  // Multi-process: this process's rank over `comm` (comm->size() == the mesh size); every
  // process returns the same tokens. nullptr: in-process ranks (RunSpmd).
  collectives::Communicator* comm = nullptr;
  // In-process ranks: where they run (the default: CPU; DevicePlacement::SharedGpu(0) or
  // GpuPerRank() put each rank's shards and its forward passes on a GPU).
  DevicePlacement placement;
  KvCacheMode kv_cache = KvCacheMode::kAuto;
  // Tests and tools: when non-null, each step's logits (this process's reporting rank) are
  // appended.
  std::vector<std::vector<double>>* step_logits = nullptr;
};

// OK when generating options.tokens after a prompt of prompt_tokens runs on the KV cache;
// otherwise why not (Unimplemented: the model or mesh has no cached decoding; InvalidArgument:
// prompt + tokens - 1 positions exceed the model's seq). kOff: FailedPrecondition ("off").
absl::Status KvCacheUse(const Model& model, int64_t prompt_tokens, const SampleOptions& options);

// `options.tokens` new ids continuing `prompt`. params: global tensors named and shaped as the
// layout lists them (e.g. TrainResult::params, or InitGpt).
absl::StatusOr<std::vector<int64_t>> GenerateGpt(const Model& layout,
                                                 const std::vector<NamedTensor>& params,
                                                 const std::vector<int64_t>& prompt,
                                                 const SampleOptions& options);

// The logits [vocab] (as double) of the token after `context` (its last cfg.seq ids are used).
absl::StatusOr<std::vector<double>> GptNextTokenLogits(
    const Model& layout, const std::vector<NamedTensor>& params,
    const std::vector<int64_t>& context, collectives::Communicator* comm = nullptr);

// Per-device logits head: ln_f, then x @ wte^T (the lm_head tied to wte) all_gathered over tp.
// x: the last block's output [rows, d] (S0 on tp under SP). Returns [rows, vocab], R on tp.
Value GptLogits(const Model& layout, const ParamFn& use, const Value& x);

// One draw from `logits` (see the header comment); advances *rng_state when temperature > 0.
// Assumes 0 <= top_k <= logits.size(), temperature >= 0 and finite, logits non-empty.
int64_t SampleToken(const std::vector<double>& logits, double temperature, int64_t top_k,
                    uint64_t* rng_state);

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_GPT_GPT_GENERATE_H_
