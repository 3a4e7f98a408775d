#include "models/run/train_sample.h"

#include <iostream>
#include <memory>
#include <string>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "models/gpt/gpt_generate.h"
#include "models/run/train_flags.h"
#include "models/train/sample_text.h"

namespace shardmap {

absl::StatusOr<SampleRequest> ParseSampleRequest(const SampleSettings& settings,
                                                 const ModelShape& cfg,
                                                 const TextTokenizer* tokenizer) {
  SampleRequest req{settings, {}};
  if (settings.tokens == 0) return req;
  if (settings.top_k < 0 || settings.top_k > cfg.vocab) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--top_k ", settings.top_k, " must be in [0, vocab = ", cfg.vocab, "] (0: every id)"));
  }
  absl::StatusOr<std::vector<int64_t>> prompt = EncodePrompt(
      absl::GetFlag(FLAGS_prompt), tokenizer, !absl::GetFlag(FLAGS_data).empty(), cfg.vocab);
  if (!prompt.ok()) return prompt.status();
  req.prompt = *std::move(prompt);
  return req;
}

absl::StatusOr<std::vector<int64_t>> Sample(const Model& layout, const ModelOnMesh& remake,
                                            const RankWorld& ranks, const TrainResult& r,
                                            const SampleRequest& req) {
  std::unique_ptr<Model> single;
  if (layout.pp_ways() > 1 || layout.shape().moe.on()) {
    absl::StatusOr<std::unique_ptr<Model>> m = remake(Mesh());
    if (!m.ok()) return m.status();
    single = *std::move(m);
  }
  const Model* sample_layout = single != nullptr ? single.get() : &layout;
  SampleOptions so;
  so.tokens = req.settings.tokens;
  so.temperature = req.settings.temperature;
  so.top_k = req.settings.top_k;
  so.seed = absl::GetFlag(FLAGS_seed);
  const bool same_mesh = sample_layout->mesh().size() == layout.mesh().size();
  so.comm = same_mesh ? ranks.world.get() : nullptr;
  if (ranks.world != nullptr && so.comm == nullptr && ranks.world->rank() != 0) {
    return std::vector<int64_t>{};
  }
  return GenerateGpt(*sample_layout, r.params, req.prompt, so);
}

void PrintSample(const std::vector<int64_t>& sampled, const SampleRequest& req,
                 const TextTokenizer* tokenizer) {
  const std::string text = DecodeTokens(sampled, tokenizer, !absl::GetFlag(FLAGS_data).empty());
  const SampleSettings& s = req.settings;
  std::cout << absl::StrFormat(
      "sample (%d tokens, %s): %s\n", s.tokens,
      s.temperature > 0 ? absl::StrFormat("temperature %g, top-k %d", s.temperature, s.top_k)
                        : std::string("greedy"),
      text);
}

}  // namespace shardmap
