// sample (old name sample_gpt): samples text from a train checkpoint, and evaluates its validation loss,
// without training: on any mesh without pp for sampling (--mesh, --sp), any mesh train_gpt
// allows for evaluation, on CPU ranks or GPUs (--device=cuda). A separate binary rather than
// train_gpt --steps=0: it needs no training data, takes every setting from the checkpoint's run
// (models/train/run_config.h: its model shape, tokenizer, data, batch and held-out split), and
// its --help lists only what sampling and evaluation use.
//
//   bazel run -c opt //models/run:sample -- --checkpoint=runs/gpt.step1000.safetensors
//       --prompt="ROMEO:" --num_samples=3 --tokens=200 --temperature=0.8 --top_k=200
//   bazel run -c opt //models/run:sample -- --checkpoint=runs/gpt.step1000.safetensors
//       --num_samples=0 --eval_steps=20        (the run's held-out split; or --val_data=FILE)
//
// Each sample prints "--- sample i of N (seed S, ...)" and then the prompt followed by the
// continuation, decoded with the tokenizer the checkpoint's run used (--tokenizer overrides;
// byte-level models print bytes, models of uint16 token files print ids). Sample i draws from
// seed --seed + i - 1 (GenerateGpt's stream), so a seed gives the same text on every mesh.
// --eval_steps=N prints "val loss X": EvaluateGpt, the trainer's evaluation, so it equals the
// val loss train_gpt printed after the checkpoint's step.
#include <cmath>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "models/components/checkpoint.h"
#include "models/data/text_data.h"
#include "models/gpt/gpt_checkpoint.h"
#include "models/gpt/gpt_generate.h"
#include "models/model/registry.h"
#include "models/run/cli_main.h"
#include "models/run/placement.h"
#include "models/train/checkpoint_rotation.h"
#include "models/train/evaluate.h"
#include "models/train/run_config.h"
#include "models/train/sample_text.h"
#include "shardmap/device_placement.h"

ABSL_FLAG(std::string, checkpoint, "", "a file written by train_gpt --save or --save_every");
ABSL_FLAG(std::string, prompt, "\n",
          "the text the samples continue (echoed before each continuation; comma-separated ids "
          "for a model of uint16 token files)");
ABSL_FLAG(int64_t, tokens, 100, "new tokens per sample");
ABSL_FLAG(int64_t, num_samples, 1, "how many samples (0: none, e.g. to only evaluate)");
ABSL_FLAG(double, temperature, 0.8, "0: greedy; > 0: softmax(logits / temperature)");
ABSL_FLAG(int64_t, top_k, 0, "only the k most likely tokens (0: all; 1: greedy)");
ABSL_FLAG(uint64_t, seed, 1, "the sampling seed of the first sample (sample i: seed + i - 1)");
ABSL_FLAG(std::string, tokenizer, "",
          "Llama 3's tokenizer.model or a folder with GPT-2's tokenizer files (default: the "
          "checkpoint's run's --tokenizer)");
ABSL_FLAG(std::string, kv_cache, "auto",
          "auto: keep a KV cache when the model has one and prompt + tokens - 1 <= seq (else "
          "recompute a sliding window, saying why on stderr); on: the cache or an error; off: "
          "recompute the window for every token");
ABSL_FLAG(int64_t, eval_steps, 0,
          "evaluate the validation loss over N batches (0: no evaluation)");
ABSL_FLAG(std::string, val_data, "",
          "evaluate on this file, in the run's format (default: the run's held-out split: its "
          "--val_data, or the last --val_fraction of its data)");
ABSL_FLAG(int64_t, batch, 0, "evaluation batch (0: the run's --batch)");
ABSL_FLAG(int64_t, microbatches, 0, "evaluation on a pp mesh: microbatches (0: the run's)");

namespace shardmap {
namespace {

// What the checkpoint says about its model and its run.
struct Checkpoint {
  std::string path;
  std::string model;  // the registered name (models/model/registry.h)
  ModelArgs args;     // the model's shape as the metadata says
  ModelShape config;  // the shape those args give
  int64_t step = -1;  // -1: no step in the file
  RunConfig run;      // empty flags: the file has no run configuration
  std::shared_ptr<SafetensorsFile> file;  // the header, parsed once

  // The run's value of a train_gpt flag ("" when the file does not say).
  std::string Flag(const std::string& name) const {
    auto it = run.flags.find(name);
    return it == run.flags.end() ? "" : it->second;
  }
  bool IdsText() const { return !Flag("data").empty(); }  // the run read uint16 token files
};

absl::StatusOr<Checkpoint> OpenCheckpoint() {
  Checkpoint c;
  c.path = absl::GetFlag(FLAGS_checkpoint);
  if (c.path.empty()) {
    return absl::InvalidArgumentError(
        "--checkpoint is missing: name a file written by train_gpt --save or --save_every");
  }
  absl::StatusOr<SafetensorsFile> f = OpenGptCheckpoint(c.path);
  if (!f.ok()) return f.status();
  auto prefixed = [&](const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat("checkpoint '", c.path, "': ", s.message()));
  };
  absl::StatusOr<std::string> name = ModelNameInMetadata(f->metadata());
  if (!name.ok()) return prefixed(name.status());
  absl::StatusOr<const ModelSpec*> spec = FindModel(*name);
  if (!spec.ok()) return prefixed(spec.status());
  absl::StatusOr<ModelArgs> args = (*spec)->args_from_metadata(f->metadata());
  if (!args.ok()) return prefixed(args.status());
  args->moe.expert_axes.clear();  // a layout choice of the run's mesh, not the model's shape
  absl::StatusOr<std::unique_ptr<Model>> shape = (*spec)->create(*args, Mesh(), false);
  if (!shape.ok()) return prefixed(shape.status());
  c.model = *name;
  c.args = *args;
  c.config = (*shape)->shape();
  if (absl::StatusOr<int64_t> step = StepFromMetadata(f->metadata()); step.ok()) c.step = *step;
  if (absl::StatusOr<RunConfig> run = RunConfigFromMetadata(f->metadata()); run.ok()) {
    c.run = *run;
  } else if (!absl::IsNotFound(run.status())) {
    return absl::Status(run.status().code(),
                        absl::StrCat("checkpoint '", c.path, "': ", run.status().message()));
  }
  c.file = std::make_shared<SafetensorsFile>(*std::move(f));
  return c;
}

// The parameters as global tensors in the layout's order.
absl::StatusOr<std::vector<NamedTensor>> ReadParams(const Checkpoint& c, const Model& layout) {
  if (absl::Status s = CheckGptCheckpoint(*c.file, layout, false); !s.ok()) return s;
  std::vector<NamedTensor> params;
  for (const ParamInfo& p : layout.params()) {
    const Shape& g = p.global_shape;
    absl::StatusOr<Tensor> t = c.file->ReadBlock(layout.CheckpointName(p), g, std::vector<int64_t>(g.size(), 0),
                                                 std::vector<int64_t>(g.begin(), g.end()),
                                                 c.config.dtype);
    if (!t.ok()) return t.status();
    params.push_back({p.name, *std::move(t)});
  }
  return params;
}

// The tokenizer: --tokenizer, else the run's (when its folder is still there).
absl::StatusOr<std::unique_ptr<TextTokenizer>> Tokenizer(const Checkpoint& c) {
  std::string dir = absl::GetFlag(FLAGS_tokenizer);
  if (dir.empty()) dir = c.Flag("tokenizer");
  absl::StatusOr<std::unique_ptr<TextTokenizer>> tok = LoadTokenizerPath(dir);
  if (!tok.ok() && absl::GetFlag(FLAGS_tokenizer).empty()) {
    return absl::Status(tok.status().code(),
                        absl::StrCat("the checkpoint's run used ", tok.status().message(),
                                     "; give it with --tokenizer=PATH"));
  }
  if (tok.ok() && *tok != nullptr && (*tok)->vocab_size() > c.config.vocab) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the tokenizer has ", (*tok)->vocab_size(), " ids but the model's vocab is ",
        c.config.vocab, "; give the run's --tokenizer"));
  }
  return tok;
}

// The sampling flags, checked before anything is read.
absl::Status CheckSampleFlags(const ModelShape& cfg) {
  const int64_t n = absl::GetFlag(FLAGS_num_samples), tokens = absl::GetFlag(FLAGS_tokens);
  const double temperature = absl::GetFlag(FLAGS_temperature);
  const int64_t top_k = absl::GetFlag(FLAGS_top_k);
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat("--num_samples ", n, " must be >= 0"));
  if (tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--tokens ", tokens, " must be >= 0"));
  }
  if (!std::isfinite(temperature) || temperature < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--temperature ", temperature, " must be finite and >= 0 (0: greedy; e.g. 0.8)"));
  }
  if (top_k < 0 || top_k > cfg.vocab) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--top_k ", top_k, " must be in [0, vocab = ", cfg.vocab, "] (0: every id; 1: greedy)"));
  }
  return absl::OkStatus();
}

absl::Status PrintSamples(const Checkpoint& c, const Model& layout,
                          const std::vector<NamedTensor>& params, const TextTokenizer* tok,
                          const DevicePlacement& placement) {
  const int64_t n = absl::GetFlag(FLAGS_num_samples);
  absl::StatusOr<std::vector<int64_t>> prompt =
      EncodePrompt(absl::GetFlag(FLAGS_prompt), tok, c.IdsText(), c.config.vocab);
  if (!prompt.ok()) return prompt.status();
  SampleOptions so;
  so.tokens = absl::GetFlag(FLAGS_tokens);
  so.temperature = absl::GetFlag(FLAGS_temperature);
  so.top_k = absl::GetFlag(FLAGS_top_k);
  const std::string kv = absl::GetFlag(FLAGS_kv_cache);
  if (kv == "auto" || kv == "on" || kv == "off") {
    so.kv_cache = kv == "on"    ? KvCacheMode::kOn
                  : kv == "off" ? KvCacheMode::kOff
                                : KvCacheMode::kAuto;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv_cache '", kv, "' is not one of auto, on, off"));
  }
  if (n > 0 && so.kv_cache == KvCacheMode::kAuto) {
    if (absl::Status why = KvCacheUse(layout, static_cast<int64_t>(prompt->size()), so);
        !why.ok()) {
      std::cerr << "note: sampling without a KV cache: " << why.message() << "\n";
    }
  }
  so.placement = placement;
  for (int64_t i = 0; i < n; ++i) {
    so.seed = absl::GetFlag(FLAGS_seed) + static_cast<uint64_t>(i);
    absl::StatusOr<std::vector<int64_t>> out = GenerateGpt(layout, params, *prompt, so);
    if (!out.ok()) return out.status();
    std::vector<int64_t> all = *prompt;
    all.insert(all.end(), out->begin(), out->end());
    std::cout << absl::StrFormat(
        "--- sample %d of %d (seed %d, %s, %d tokens)\n%s\n", i + 1, n, so.seed,
        so.temperature > 0 && so.top_k != 1
            ? absl::StrFormat("temperature %g, top-k %d", so.temperature, so.top_k)
            : std::string("greedy"),
        so.tokens, DecodeTokens(all, tok, c.IdsText()));
  }
  return absl::OkStatus();
}

// The evaluation tokens: --val_data, else the run's held-out split, encoded as the run's.
absl::StatusOr<std::vector<int64_t>> ValTokens(const Checkpoint& c, const TextTokenizer* tok,
                                               std::string* source) {
  TextEncoder encode;
  if (tok != nullptr) {
    encode = [tok](const std::string& text) {
      std::vector<int64_t> ids;
      for (int32_t id : tok->Encode(text)) ids.push_back(id);
      return ids;
    };
  }
  const TokenFormat format = c.IdsText() ? TokenFormat::kUint16 : TokenFormat::kBytes;
  if (!absl::GetFlag(FLAGS_val_data).empty()) {
    *source = absl::GetFlag(FLAGS_val_data);
    return LoadTokenFile(*source, format, c.config.vocab, "--val_data", encode);
  }
  TokenDataOptions o;
  o.text = c.Flag("text");
  o.data = c.Flag("data");
  o.val_data = c.Flag("val_data");
  o.encode_text = encode;
  if (!c.Flag("val_fraction").empty() && !absl::SimpleAtod(c.Flag("val_fraction"), &o.val_fraction)) {
    return absl::InvalidArgumentError("the checkpoint's run.flag.val_fraction is not a number");
  }
  o.vocab = c.config.vocab;
  o.seq = c.config.seq;
  if (o.text.empty() && o.data.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint '", c.path, "' names no training data (written before run configurations "
        "were stored): give --val_data=FILE"));
  }
  absl::StatusOr<TokenData> d = LoadTokenData(o);
  if (!d.ok()) return d.status();
  if (d->val.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the checkpoint's run held out no validation data (no --val_data or --val_fraction): "
        "give --val_data=FILE"));
  }
  *source = o.val_data.empty() ? absl::StrCat("the last ", o.val_fraction, " of ",
                                              o.text.empty() ? o.data : o.text)
                               : o.val_data;
  return d->val;
}

// An integer flag, or the run's value when it is 0.
int64_t FlagOrRun(int64_t flag, const Checkpoint& c, const std::string& name, int64_t fallback) {
  int64_t v = fallback;
  if (flag != 0) return flag;
  if (!c.Flag(name).empty()) absl::SimpleAtoi(c.Flag(name), &v);
  return v;
}

absl::Status Evaluate(const Checkpoint& c, const Model& layout, const TextTokenizer* tok,
                      const DevicePlacement& placement) {
  const int64_t steps = absl::GetFlag(FLAGS_eval_steps);
  if (steps < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--eval_steps ", steps, " must be >= 0"));
  }
  if (steps == 0) return absl::OkStatus();
  std::string source;
  absl::StatusOr<std::vector<int64_t>> tokens = ValTokens(c, tok, &source);
  if (!tokens.ok()) return tokens.status();
  TrainOptions o;
  o.batch = FlagOrRun(absl::GetFlag(FLAGS_batch), c, "batch", 8);
  o.grad_accum = FlagOrRun(0, c, "grad_accum", 1);
  o.pipeline.microbatches = FlagOrRun(absl::GetFlag(FLAGS_microbatches), c, "microbatches", 1);
  o.pipeline.schedule = c.Flag("schedule").empty() ? "1f1b" : c.Flag("schedule");
  // The schedule does not change a forward-only loss; interleaving needs the run's pp.
  if (o.pipeline.schedule == "interleaved_1f1b") o.pipeline.schedule = "1f1b";
  o.checkpoint.init_path = c.path;
  o.checkpoint.opened = c.file;  // not parsed again
  o.runtime.placement = placement;
  const int64_t needed = steps * o.batch * c.config.seq + 1;
  if (needed > static_cast<int64_t>(tokens->size())) {
    std::cout << absl::StrFormat(
        "note: --eval_steps %d x batch %d x seq %d reads %d tokens but %s has %d: the batches "
        "wrap around and repeat tokens; lower --eval_steps\n",
        steps, o.batch, c.config.seq, needed, source, tokens->size());
  }
  absl::StatusOr<double> loss = EvaluateGpt(layout, *tokens, steps, o);
  if (!loss.ok()) return loss.status();
  std::cout << absl::StrFormat("val loss %.10g (%d batches of %d x %d tokens from %s)\n", *loss,
                               steps, o.batch, c.config.seq, source);
  return absl::OkStatus();
}

absl::Status Run() {
  absl::StatusOr<Checkpoint> c = OpenCheckpoint();
  if (!c.ok()) return c.status();
  if (absl::Status s = CheckSampleFlags(c->config); !s.ok()) return s;
  absl::StatusOr<Mesh> mesh = ParseMesh(absl::GetFlag(FLAGS_mesh));
  if (!mesh.ok()) return mesh.status();
  const ModelShape& cfg = c->config;
  absl::StatusOr<std::unique_ptr<Model>> layout =
      CreateModel(c->model, c->args, *mesh, absl::GetFlag(FLAGS_sp));
  if (!layout.ok()) return layout.status();
  absl::StatusOr<DevicePlacement> placement = ResolvePlacement(*mesh);
  if (!placement.ok()) return placement.status();
  absl::StatusOr<std::unique_ptr<TextTokenizer>> tok = Tokenizer(*c);
  if (!tok.ok()) return tok.status();
  std::cout << absl::StrFormat(
      "checkpoint %s: %s, %s %d layers, d_model %d, %d heads, vocab %d, seq %d, %s; run %s; "
      "mesh %s on %s\n",
      c->path, c->step >= 0 ? absl::StrCat("step ", c->step) : std::string("no step"),
      c->model == "gpt2" ? std::string("GPT-2") : (*layout)->Describe(), cfg.layers,
      cfg.d_model, cfg.heads, cfg.vocab, cfg.seq, DTypeName(cfg.dtype),
      c->run.id.empty() ? std::string("(no id)") : c->run.id, mesh->ShortString(),
      placement->is_cpu() ? "simulated CPU devices" : "cuda");
  if (absl::GetFlag(FLAGS_num_samples) != 0) {
    absl::StatusOr<std::vector<NamedTensor>> params = ReadParams(*c, **layout);
    if (!params.ok()) return params.status();
    if (absl::Status s = PrintSamples(*c, **layout, *params, tok->get(), *placement); !s.ok()) {
      return s;
    }
  }
  return Evaluate(*c, **layout, tok->get(), *placement);
}

}  // namespace
}  // namespace shardmap

int main(int argc, char** argv) {
  return shardmap::RunMain(
      argc, argv,
      {.usage = "samples text from a train checkpoint and evaluates its validation loss, on any "
                "mesh. Example: sample --checkpoint=runs/gpt.step100.safetensors "
                "--prompt=ROMEO: --num_samples=3 --eval_steps=10",
       .help_files = {"models/run/sample_main", "models/run/placement"}},
      [](const std::string&) { return shardmap::Run(); });
}
