// train (old name train_gpt): trains a registered model (--model=gpt2|llama3, models/model) on
// simulated CPU devices or GPUs (--device=cuda: one rank per GPU, or virtual ranks sharing one;
// --backend=nccl: a process per GPU) with any mix of data, fully sharded, hybrid sharded, tensor,
// sequence and context parallelism (ring attention over cp), and mixture-of-experts MLPs with
// expert parallelism (--experts, --mesh=ep=2,...), inside one SPMD program; with a pp axis,
// pipeline parallelism (the trainer's pipeline strategy, models/train/trainer.h):
// --mesh=pp=2,dp=2 --microbatches=4 --schedule=1f1b (or gpipe, or interleaved_1f1b
// --virtual_stages=2: each stage holds 2 model chunks).
//
//   bazel run -c opt //models/run:train -- --mesh=dp=2,tp=2 --sp
//       --text=/usr/share/common-licenses/GPL-3 --layers=2 --d_model=64 --heads=4 --seq=64
//       --batch=8 --steps=50 --lr=3e-3 --trace=/tmp/trace.json      (one command line)
//
// Batches: sample b of step s is tokens [(s*B+b)*T, (s*B+b)*T+T+1) of the data, wrapping around
// (B = --batch, T = --seq): independent of the mesh, so any layout (or a PyTorch script) sees the
// same batches. Each step prints "step N loss X" (10 significant digits), ms/step, tokens/s and
// the bytes rank 0 communicated per collective kind; a summary follows the last step.
//
// The command line in pieces: train_flags (the flags), train_settings (their one check),
// resume and model_setup (what the run continues and trains), connection (where the ranks run),
// reporting (what it prints), outputs (checkpoints, trace), train_sample (--sample).
#include <iostream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "models/data/text_data.h"
#include "models/gpt/gpt_flags.h"
#include "models/gpt/gpt_spec.h"
#include "models/model/registry.h"
#include "models/parallel/pipeline.h"
#include "models/run/cli_main.h"
#include "models/run/connection.h"
#include "models/run/model_setup.h"
#include "models/run/outputs.h"
#include "models/run/placement.h"
#include "models/run/reporting.h"
#include "models/run/resume.h"
#include "models/run/train_flags.h"
#include "models/run/train_sample.h"
#include "models/run/train_settings.h"
#include "models/train/trainer.h"
#include "tensor/cuda/device_memory.h"
#include "tensor/cuda/runtime.h"

namespace shardmap {
namespace {

// What the run trains and where, every flag checked: the state before the data is read.
struct Prepared {
  std::string resume;  // the file resumed from ("" : a fresh run)
  std::string note;    // what the run says about its resume
  ShapeSource source;  // --resume or --init, opened once
  ResumedRun run;
  TrainSettings settings;
  RankWorld ranks;
  RunModel model;
};

// The model's shape (flags, preset or checkpoint), the run it continues, the flags' one check,
// the ranks and the model, each refused before anything large is allocated.
absl::StatusOr<Prepared> Prepare() {
  Prepared p;
  const std::string model_name = absl::GetFlag(FLAGS_model);
  if (absl::StatusOr<const ModelSpec*> spec = FindModel(model_name); !spec.ok()) {
    return spec.status();
  }
  // GPT-2's shape: the flags (checked with their names), the preset's, or a checkpoint's.
  const bool gpt2 = model_name == "gpt2";
  ModelArgs args = ModelArgsFromFlags();
  absl::StatusOr<GptConfig> cfg = GptConfigFromFlags(SHARDMAP_GPT_CONFIG_FLAG_VALUES());
  if (!cfg.ok()) return cfg.status();
  args.moe = cfg->moe;
  if (gpt2) cfg = Gpt2ConfigFromArgs(args);  // the preset's shape; Llama-only flags refused
  if (!cfg.ok()) return cfg.status();
  if (absl::Status s = ResolveResume(&p.resume, &p.note); !s.ok()) return s;
  absl::StatusOr<ShapeSource> source = OpenShapeSource(p.resume, absl::GetFlag(FLAGS_init));
  if (!source.ok()) return source.status();
  p.source = *std::move(source);
  if (absl::Status s = CheckFileModel(p.source, model_name); !s.ok()) return s;
  if (gpt2) {
    if (absl::Status s = AdoptShapeFrom(p.source, &*cfg, &p.note); !s.ok()) return s;
  }
  absl::StatusOr<ResumedRun> run = ContinueOrStartRun(p.source, &p.note);
  if (!run.ok()) return run.status();
  p.run = *std::move(run);
  // Every flag, the resumed run's adopted ones included, checked once.
  absl::StatusOr<TrainSettings> settings = ValidateTrainFlags();
  if (!settings.ok()) return settings.status();
  p.settings = *std::move(settings);
  absl::StatusOr<Mesh> mesh = ParseMesh(absl::GetFlag(FLAGS_mesh));
  if (!mesh.ok()) return mesh.status();
  absl::StatusOr<RankWorld> ranks =
      ConnectRanks(*mesh, p.settings.devices, p.settings.collective_timeout);
  if (!ranks.ok()) return ranks.status();
  p.ranks = *std::move(ranks);
  const std::string shape_source = p.source.path.empty()
                                       ? "the model flags"
                                       : absl::StrCat("the checkpoint '", p.source.path, "'");
  absl::StatusOr<RunModel> model =
      MakeRunModel(model_name, args, *cfg, *mesh, p.ranks.processes(), shape_source);
  if (!model.ok()) return model.status();
  p.model = *std::move(model);
  if (absl::Status s = CheckBatchFits(*p.model.model, p.ranks.processes(),
                                      p.settings.memory_limit);
      !s.ok()) {
    return s;
  }
  return p;
}

// The training data (and the held-out split) as token ids.
absl::StatusOr<TokenData> LoadData(const ModelShape& shape, const TextTokenizer* tok) {
  TokenDataOptions data_options;
  if (tok != nullptr) {
    data_options.encode_text = [tok](const std::string& text) {
      std::vector<int64_t> ids;
      for (int32_t id : tok->Encode(text)) ids.push_back(id);
      return ids;
    };
  }
  data_options.text = absl::GetFlag(FLAGS_text);
  data_options.data = absl::GetFlag(FLAGS_data);
  data_options.val_data = absl::GetFlag(FLAGS_val_data);
  data_options.val_fraction = absl::GetFlag(FLAGS_val_fraction);
  data_options.vocab = shape.vocab;
  data_options.seq = shape.seq;
  return LoadTokenData(data_options);
}

// Rank 0 merges the processes' trace parts once every process has closed its own.
absl::Status FinishTrace(RunOutputs& outputs, const RankWorld& ranks) {
  if (outputs.trace_path().empty() || ranks.world == nullptr || ranks.world->size() <= 1) {
    return absl::OkStatus();
  }
  if (absl::Status s = ranks.world->Barrier(); !s.ok()) return s;
  if (!ranks.print) return absl::OkStatus();
  return MergeTraceParts(outputs.trace_path(), ranks.world->size());
}

absl::Status Train(Prepared& p) {
  const Model& layout = *p.model.model;
  const RankWorld& ranks = p.ranks;
  if (absl::GetFlag(FLAGS_plan) && ranks.print) {
    if (absl::Status s = PrintPlan(layout); !s.ok()) return s;
  }
  absl::StatusOr<std::unique_ptr<TextTokenizer>> tokenizer = LoadTokenizer(layout.shape());
  if (!tokenizer.ok()) return tokenizer.status();
  const TextTokenizer* tok = tokenizer->get();
  absl::StatusOr<TokenData> data = LoadData(layout.shape(), tok);
  if (!data.ok()) return data.status();
  absl::StatusOr<RunConfig> run_config = DescribeRun(p.run, p.resume, &p.note);
  if (!run_config.ok()) return run_config.status();
  if (ranks.world != nullptr) {
    if (absl::Status s = AgreeOnSettings(*ranks.world, data->train); !s.ok()) return s;
  }
  TrainOptions o = p.settings.options;
  o.checkpoint.resume_path = p.resume;
  o.checkpoint.opened = p.source.file;  // its header parsed once, by OpenShapeSource
  RunOutputs outputs(layout, ranks, *run_config);
  if (absl::Status s = outputs.Set(*data, p.settings, o); !s.ok()) return s;
  absl::StatusOr<SampleRequest> sample =
      ParseSampleRequest(p.settings.sample, layout.shape(), tok);
  if (!sample.ok()) return sample.status();
  o.runtime.comm = ranks.world.get();
  o.runtime.placement = ranks.placement;
  TypeTrace types;
  if (absl::GetFlag(FLAGS_print_types)) o.tracing.types = &types;
  if (ranks.print) {
    PrintHeader(layout, ranks, o, data->train.size());
    if (!p.note.empty()) std::cout << p.note << (p.note.back() == '\n' ? "" : "\n");
  }
  StepPrinter printer(ranks.print, o.batch * layout.shape().seq, &types,
                      ranks.print ? MfuFor(layout, ranks) : MfuBasis{});
  o.hooks.on_step = [&printer](const StepInfo& s) { printer(s); };
  const std::vector<NamedTensor> init = o.checkpoint.init_path.empty() && p.resume.empty()
                                            ? layout.Init(absl::GetFlag(FLAGS_seed))
                                            : std::vector<NamedTensor>{};
  if (layout.pp_ways() > 1 || o.pipeline.microbatches != 1) {  // every process says it
    std::cout << absl::StrFormat("pipeline: pp=%d, %d microbatches of %d sequences, %s%s\n",
                                 layout.pp_ways(), o.pipeline.microbatches,
                                 o.pipeline.microbatches > 0 ? o.batch / o.pipeline.microbatches : 0,
                                 ScheduleName(*ParseSchedule(o.pipeline.schedule)),
                                 o.pipeline.virtual_stages > 1
                                     ? absl::StrCat(", ", o.pipeline.virtual_stages,
                                                    " model chunks per stage")
                                     : std::string());
  }
  absl::StatusOr<TrainResult> r = TrainGpt(layout, init, data->train, o);
  if (absl::Status s = outputs.CloseTrace(); !s.ok() && r.ok()) return s;
  if (!r.ok()) return r.status();
  if (absl::Status s = FinishTrace(outputs, ranks); !s.ok()) return s;
  if (absl::Status s = outputs.SaveFinal(*r); !s.ok()) return s;
  std::vector<int64_t> sampled;
  if (sample->settings.tokens > 0) {
    absl::StatusOr<std::vector<int64_t>> out = Sample(layout, p.model.remake, ranks, *r, *sample);
    if (!out.ok()) return out.status();
    sampled = *std::move(out);
  }
  if (!ranks.print) return absl::OkStatus();
  PrintSummary(layout, o, *r, printer, outputs.trace_path(), outputs.save_path());
  if (sample->settings.tokens > 0) PrintSample(sampled, *sample, tok);
  return absl::OkStatus();
}

absl::Status Run() {
  if (absl::GetFlag(FLAGS_deterministic)) cuda::SetDeterministic(true);
  // GPU ops' index checks are read with the step's loss, not one host sync per op (a bad token
  // id still stops the run, naming the op).
  cuda::SetDeferredIndexChecks(true);
  absl::StatusOr<Prepared> p = Prepare();
  if (!p.ok()) return p.status();
  return Train(*p);
}

}  // namespace
}  // namespace shardmap

int main(int argc, char** argv) {
  std::vector<std::string> help(std::begin(shardmap::kTrainFlagFiles),
                                std::end(shardmap::kTrainFlagFiles));
  return shardmap::RunMain(
      argc, argv,
      {.usage = "trains a registered model (--model=gpt2|llama3) with data / fully sharded / "
                "hybrid / tensor / sequence / context / expert parallelism on simulated CPU "
                "devices or GPUs (--device=cuda). Example: train --mesh=dp=2,tp=2 --sp --text=FILE",
       .help_files = help},
      [](const std::string&) { return shardmap::Run(); });
}
