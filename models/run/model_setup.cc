#include "models/run/model_setup.h"

#include <unistd.h>

#include <cmath>
#include <optional>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "models/planner/plan.h"
#include "models/run/placement.h"
#include "models/run/train_flags.h"
#include "models/train/memory_bound.h"
#include "models/train/run_flags.h"
#include "models/train/sample_text.h"

namespace shardmap {
namespace {

// A model whose parameters, gradients and AdamW moments cannot fit this machine's memory is
// refused before anything is allocated: a typo in --layers or --vocab (or a checkpoint whose
// metadata claims such a shape) would otherwise grow for minutes without output, or abort.
// `processes`: how many processes share the model (each holds at least its share).
absl::Status CheckFitsHost(double params, const ModelShape& cfg, int processes,
                           const std::string& source) {
  const double bytes = params * DTypeSize(cfg.dtype) * 4 / processes;  // params, grads, 2 moments
  const double host = static_cast<double>(sysconf(_SC_PHYS_PAGES)) *
                      static_cast<double>(sysconf(_SC_PAGESIZE));
  if (std::isfinite(bytes) && bytes <= host) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrFormat(
      "%s: %d layers, d_model %d, vocab %d, seq %d is %.3g parameters; with their gradients and "
      "AdamW moments (%d bytes each) that is %.3g GiB%s, more than this machine's %.1f GiB of "
      "memory; lower --layers, --d_model or --vocab",
      source, cfg.layers, cfg.d_model, cfg.vocab, cfg.seq, params, DTypeSize(cfg.dtype),
      bytes / 1073741824.0, processes > 1 ? absl::StrCat(" per process (", processes, ")") : "",
      host / 1073741824.0));
}

double ParamCount(const Model& model) {
  double params = 0;
  for (const ParamInfo& p : model.params()) params += NumElements(p.global_shape);
  return params;
}

}  // namespace

ModelArgs ModelArgsFromFlags() {
  ModelArgs args;
  args.preset = absl::GetFlag(FLAGS_preset);
  const bool preset = !args.preset.empty();
  auto shape = [&](const char* name, int64_t value, std::optional<int64_t>* out) {
    if (!preset || GivenOnCommandLine(name)) *out = value;
  };
  shape("layers", absl::GetFlag(FLAGS_layers), &args.layers);
  shape("d_model", absl::GetFlag(FLAGS_d_model), &args.d_model);
  shape("heads", absl::GetFlag(FLAGS_heads), &args.heads);
  shape("vocab", absl::GetFlag(FLAGS_vocab), &args.vocab);
  shape("seq", absl::GetFlag(FLAGS_seq), &args.seq);
  if (GivenOnCommandLine("kv_heads")) args.kv_heads = absl::GetFlag(FLAGS_kv_heads);
  if (GivenOnCommandLine("ffn_dim")) args.ffn_dim = absl::GetFlag(FLAGS_ffn_dim);
  if (GivenOnCommandLine("rope_theta")) args.rope_theta = absl::GetFlag(FLAGS_rope_theta);
  if (GivenOnCommandLine("norm_eps")) args.norm_eps = absl::GetFlag(FLAGS_norm_eps);
  if (!preset || GivenOnCommandLine("dtype")) args.dtype = absl::GetFlag(FLAGS_dtype);
  return args;
}

absl::StatusOr<RunModel> MakeRunModel(const std::string& model_name, const ModelArgs& args,
                                      const GptConfig& cfg, const Mesh& mesh, int processes,
                                      const std::string& shape_source) {
  const bool gpt2 = model_name == "gpt2";
  RunModel out;
  out.remake = [model_name, args, cfg, gpt2](const Mesh& m)
      -> absl::StatusOr<std::unique_ptr<Model>> {
    const bool sp = absl::GetFlag(FLAGS_sp) && m.size() > 1;
    if (!gpt2) return CreateModel(model_name, args, m, sp);
    absl::StatusOr<GptLayout> l = GptLayout::Create(m, cfg, sp);
    if (!l.ok()) return l.status();
    return std::unique_ptr<Model>(std::make_unique<GptLayout>(*std::move(l)));
  };
  // Every model but GPT-2 is built by its registration (which bounds its shape); GPT-2's size
  // is checked before its layout is built.
  if (gpt2) {
    const ModelShape s{.layers = cfg.layers, .d_model = cfg.d_model, .vocab = cfg.vocab,
                       .seq = cfg.seq, .dtype = cfg.dtype};
    if (absl::Status st =
            CheckFitsHost(GptParameterCount(cfg), s, processes, shape_source);
        !st.ok()) {
      return st;
    }
  }
  absl::StatusOr<std::unique_ptr<Model>> made =
      gpt2 ? out.remake(mesh) : CreateModel(model_name, args, mesh, absl::GetFlag(FLAGS_sp));
  if (!made.ok()) return made.status();
  out.model = *std::move(made);
  if (!gpt2) {
    if (absl::Status st = CheckFitsHost(ParamCount(*out.model), out.model->shape(), processes,
                                        shape_source);
        !st.ok()) {
      return st;
    }
  }
  return out;
}

absl::Status CheckBatchFits(const Model& model, int processes, double limit_bytes) {
  return CheckStepFitsMemory(
      ParamCount(model), model.shape(),
      {absl::GetFlag(FLAGS_batch), absl::GetFlag(FLAGS_grad_accum),
       absl::GetFlag(FLAGS_microbatches)},
      processes, limit_bytes,
      absl::GetFlag(FLAGS_max_memory).empty() ? "this machine's memory" : "--max_memory");
}

absl::StatusOr<std::unique_ptr<TextTokenizer>> LoadTokenizer(const ModelShape& cfg) {
  absl::StatusOr<std::unique_ptr<TextTokenizer>> tok =
      LoadTokenizerPath(absl::GetFlag(FLAGS_tokenizer));
  if (!tok.ok() || *tok == nullptr) return tok;
  if ((*tok)->vocab_size() > cfg.vocab) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--vocab ", cfg.vocab, " is smaller than the tokenizer's ", (*tok)->vocab_size(),
        " ids; use --vocab=", ((*tok)->vocab_size() + 63) / 64 * 64,
        " (a multiple of 64, as nanoGPT's 50304)"));
  }
  return tok;
}

}  // namespace shardmap
