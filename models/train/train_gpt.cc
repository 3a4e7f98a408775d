// train_gpt: trains GPT-2 (models/gpt.h) on simulated CPU devices or GPUs (--device=cuda: one
// rank per GPU, or virtual ranks sharing one; --backend=nccl: a process per GPU) with any mix
// of data, fully sharded, hybrid sharded, tensor, sequence and context parallelism (ring
// attention over cp), and mixture-of-experts MLPs with expert parallelism (--experts,
// --mesh=ep=2,...), inside one SPMD program; with a pp axis, pipeline parallelism (the
// trainer's pipeline strategy, models/train/trainer.h): --mesh=pp=2,dp=2 --microbatches=4
// --schedule=1f1b (or gpipe, or interleaved_1f1b --virtual_stages=2: each stage holds 2 model
// chunks).
//
//   bazel run -c opt //models/train:train_gpt -- --mesh=dp=2,tp=2 --sp
//       --text=/usr/share/common-licenses/GPL-3 --layers=2 --d_model=64 --heads=4 --seq=64
//       --batch=8 --steps=50 --lr=3e-3 --trace=/tmp/trace.json      (one command line)
//
// Batches: sample b of step s is tokens [(s*B+b)*T, (s*B+b)*T+T+1) of the data, wrapping around
// (B = --batch, T = --seq): independent of the mesh, so any layout (or a PyTorch script) sees the
// same batches. Each step prints "step N loss X" (10 significant digits), ms/step, tokens/s and
// the bytes rank 0 communicated per collective kind; a summary follows the last step.
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <algorithm>
#include <functional>
#include <map>
#include <utility>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "collectives/backend_registry.h"
#include "models/train/checkpoint_rotation.h"
#include "models/train/run_config.h"
#include "models/train/memory_bound.h"
#include "models/train/mfu.h"
#include "models/train/run_flags.h"
#include "models/train/sample_text.h"
#include "models/train/run_format.h"
#include "models/gpt.h"
#include "models/gpt/gpt_flags.h"
#include "models/gpt/gpt_generate.h"
#include "models/gpt/gpt_spec.h"
#include "models/model/registry.h"
#include "models/planner/hardware_profile.h"
#include "models/planner/plan.h"
#include "models/planner/plan_cli.h"
#include "models/components/lr_schedule.h"
#include "models/data/text_data.h"
#include "models/components/trace_writer.h"
#include "models/gpt/gpt_trace.h"
#include "models/parallel/pipeline.h"
#include "nlohmann/json.hpp"
#include "shardmap/context.h"
#include "shardmap/device_placement.h"
#include "tensor/cuda/device_memory.h"
#include "tensor/cuda/runtime.h"
#include "tensor/error.h"

ABSL_FLAG(std::string, mesh, "", "mesh axes, e.g. dp=2,tp=2 or pp=2,dp=2 or ep=2 (axes pp, dp, dp_replicate, dp_shard, ep, cp, tp)");
ABSL_FLAG(int64_t, microbatches, 1, "pipeline microbatches per step (batch must divide by microbatches x dp)");
ABSL_FLAG(std::string, schedule, "1f1b",
          "pipeline schedule: gpipe, 1f1b or interleaved_1f1b (with --virtual_stages >= 2; "
          "--microbatches a multiple of pp)");
ABSL_FLAG(std::string, stage_layers, "",
          "layers per pipeline stage, e.g. 2,1,1 (default: as even as possible); interleaved: "
          "one per virtual stage, chunk c of stage s being virtual stage c*pp+s");
ABSL_FLAG(int32_t, virtual_stages, 1,
          "model chunks per pipeline stage (--schedule=interleaved_1f1b, >= 2): the layers split "
          "over pp x virtual_stages virtual stages, chunk c of stage s holding virtual stage "
          "c*pp+s's; shrinks the bubble v-fold at v times the boundary transfers");
ABSL_FLAG(bool, sp, false, "sequence parallelism (needs a tp axis)");
ABSL_FLAG(std::string, devices, "", "cpu:N simulated ranks (default: the mesh size)");
ABSL_FLAG(std::string, backend, "inprocess",
          absl::StrCat("a registered backend (collectives/backend_registry.h): ",
                       shardmap::collectives::BackendFlagHelp(),
                       "; process-per-rank backends take --nproc_per_node=<mesh size>; rank 0 "
                       "prints"));
ABSL_FLAG(std::string, device, "cpu",
          "cpu or cuda. cuda in-process: one rank per GPU when this process sees at least as "
          "many GPUs as the mesh has ranks, else every rank a virtual rank on GPU 0 (a stream "
          "each); --gpu_ranks overrides. cuda with --backend=nccl: each process on GPU "
          "LOCAL_RANK");
ABSL_FLAG(std::string, gpu_ranks, "auto",
          "--device=cuda in-process: auto, shared (every rank on GPU 0) or per_gpu (rank r on "
          "GPU r)");
ABSL_FLAG(bool, cuda_graph, true,
          "GPU: capture the static step once (after one eager warm-up step) and replay it as a "
          "CUDA graph: one in-process GPU rank, no pipeline/MoE/--trace, f32 master weights "
          "(the summary says \"captured (N replays)\" or why not); false: every step eagerly");
ABSL_FLAG(double, collective_timeout, 300,
          "--backend=gloo/nccl: seconds a rank waits for a peer in one collective (and to "
          "connect) before the job fails naming the peer; a stopped or hung peer is detected "
          "after this long");
ABSL_FLAG(std::string, overlap, "on",
          "on: data-parallel gradients are reduced in buckets started during the backward "
          "(overlapped with it; DDP's schedule); off: one blocking all-reduce per gradient after "
          "the backward (the reference schedule). Both give the same numbers bitwise");
ABSL_FLAG(double, bucket_mb, 25,
          "--overlap=on: the gradient bucket size in MiB (> 0; DDP's default 25)");
ABSL_FLAG(int32_t, fsdp_prefetch, 1,
          "--overlap=on with dp_shard: units (embeddings, blocks, head) whose all-gathers run "
          "ahead of the one computing, in the forward and the backward (>= 1)");
ABSL_FLAG(bool, reshard_after_forward, true,
          "--overlap=on with dp_shard: free each block's gathered parameters after its forward and "
          "gather them again for its backward (FSDP2's default; at most fsdp_prefetch + 1 blocks "
          "gathered at once); false keeps them from the forward to the backward. Pipeline "
          "stages (pp, --microbatches) always keep theirs for the step: gathered once, "
          "reduce-scattered once");
ABSL_FLAG(std::string, tokenizer, "",
          "Llama 3's tokenizer.model, or a folder with GPT-2's tokenizer files (encoder.json + "
          "vocab.bpe, or Hugging Face's vocab.json + merges.txt): --text is encoded with its "
          "byte-level BPE, --prompt too, and samples are decoded to text (--vocab must hold its "
          "ids, e.g. 50304 for GPT-2, 128256 for Llama 3)");
ABSL_FLAG(std::string, data_order, "random",
          "random: each sample at a random offset of the data (nanoGPT's get_batch; a "
          "counter-based draw from --seed, so a resumed run reads the batches the "
          "uninterrupted one would); sequential: one pass after another in file order");
ABSL_FLAG(bool, deterministic, false,
          "GPU: deterministic algorithms (cuda::SetDeterministic): GEMMs keep cuBLASLt's "
          "heuristic's choice instead of timing candidates, so two runs print the same losses "
          "bitwise (also SHARDMAP_DETERMINISTIC=1)");
ABSL_FLAG(std::string, model, "gpt2",
          "the model, by its registered name (models/model/registry.h): gpt2 or llama3");
ABSL_FLAG(std::string, preset, "",
          "a named shape of --model (gpt2: gpt2, gpt2-medium, gpt2-large, gpt2-xl; llama3: "
          "llama3_debug, llama3_8b, llama3_70b, llama3_405b); a shape flag given on the command "
          "line overrides the preset's value");
SHARDMAP_GPT_CONFIG_FLAGS(/*layers=*/2, /*d_model=*/64, /*heads=*/4, /*vocab=*/256, /*seq=*/64,
                          /*dtype=*/"f32");
ABSL_FLAG(int64_t, kv_heads, 0,
          "llama3: key/value heads of grouped-query attention (dividing --heads; 0: the preset's, "
          "else --heads)");
ABSL_FLAG(int64_t, ffn_dim, 0,
          "llama3: the SwiGLU MLP's width (0: the preset's, else Llama 3's rule from --d_model)");
ABSL_FLAG(double, rope_theta, 0, "llama3: the rotary embedding's base (0: the preset's, 500000)");
ABSL_FLAG(double, norm_eps, 0, "llama3: RMSNorm's eps (0: the preset's, 1e-5)");
ABSL_FLAG(int64_t, batch, 8, "global batch (sequences per step)");
ABSL_FLAG(int64_t, steps, 20,
          "the run's total optimizer steps (nanoGPT's max_iters): --resume continues up to it");
ABSL_FLAG(double, lr, 1e-3, "AdamW learning rate");
ABSL_FLAG(double, beta1, 0.9, "AdamW beta1");
ABSL_FLAG(double, beta2, 0.95, "AdamW beta2");
ABSL_FLAG(double, eps, 1e-8, "AdamW eps");
ABSL_FLAG(double, weight_decay, 0.1, "AdamW decoupled weight decay (parameters with >= 2 dims)");
ABSL_FLAG(double, clip, 1.0, "global gradient-norm clipping (0: off)");
ABSL_FLAG(uint64_t, seed, 1, "initialisation seed");
ABSL_FLAG(std::string, data, "", "uint16 token ids (nanoGPT's train.bin layout)");
ABSL_FLAG(std::string, text, "", "a text file; its bytes are the tokens (vocab 256)");
ABSL_FLAG(std::string, init, "", "GPT-2 safetensors file to start from");
ABSL_FLAG(std::string, save, "",
          "write parameters, AdamW state, step and model shape here (safetensors) at the end; "
          "the prefix of --save_every's checkpoints");
ABSL_FLAG(std::string, resume, "",
          "continue from a file written with --save or --save_every (parameters, AdamW state, "
          "step, model shape: no shape flags needed) up to --steps; 'auto': the newest periodic "
          "checkpoint of --save; not with --init");
ABSL_FLAG(std::string, trace, "", "write a Chrome trace-event JSON (open it in Perfetto)");
ABSL_FLAG(bool, plan, false,
          "print the parallelism plan for this run's model, batch and rank count (every mesh "
          "ranked, this run's placed; models/planner) before training");
ABSL_FLAG(std::string, plan_profile, "",
          "--plan's hardware profile: h100_node, h200_node, a file, or measure (default: measure "
          "on CPU ranks, h100_node with --device=cuda)");
ABSL_FLAG(bool, print_types, false, "print the per-device SPMD types inside block 0");
ABSL_FLAG(int64_t, log_every, 1,
          "print the step line every N steps (and the first, last and evaluated ones)");
ABSL_FLAG(std::string, lr_schedule, "constant",
          "constant, cosine or linear (nanoGPT's get_lr: linear warmup over --warmup_steps from "
          "--lr*(t+1)/(W+1), then decay to --min_lr at --decay_steps)");
ABSL_FLAG(double, min_lr, 0.0, "the schedule's floor (cosine, linear)");
ABSL_FLAG(int64_t, warmup_steps, 0, "linear warmup steps of the schedule");
ABSL_FLAG(int64_t, decay_steps, -1,
          "the step where the decay reaches --min_lr (nanoGPT's lr_decay_iters; -1: --steps)");
ABSL_FLAG(std::string, recompute, "none",
          "activation recomputation: none, full (keep each transformer block's input and run "
          "the block again in the backward: about one more forward of the blocks, the least "
          "activation memory) or selective (recompute only the attention scores and softmax); "
          "the same numbers bitwise");
ABSL_FLAG(int64_t, grad_accum, 1,
          "gradient accumulation: each step's --batch runs as N microsteps of batch/N sequences "
          "(the same numbers as the whole batch)");
ABSL_FLAG(double, val_fraction, 0.0,
          "hold out the last fraction of the data for evaluation (nanoGPT's split)");
ABSL_FLAG(std::string, val_data, "", "a separate validation file (same format as --data/--text)");
ABSL_FLAG(int64_t, eval_every, 0, "evaluate the validation loss every N steps and at the end (0: never)");
ABSL_FLAG(int64_t, eval_steps, 1, "validation batches per evaluation");
ABSL_FLAG(int64_t, save_every, 0,
          "also save a checkpoint every N steps as <--save prefix>.step<N>.safetensors (atomic)");
ABSL_FLAG(int64_t, keep_last, 3,
          "with --save_every: keep the newest N periodic checkpoints of this run (0: all)");
ABSL_FLAG(std::string, run_id, "",
          "the id a fresh run writes into its checkpoints (default: 16 random hex digits); a "
          "resume keeps the checkpoint's id (a different --run_id is refused)");
ABSL_FLAG(bool, overwrite, false,
          "with --save_every: remove the checkpoints of other runs under the --save prefix "
          "(without it such a prefix is refused, so that --resume=auto cannot continue the "
          "wrong run)");
ABSL_FLAG(std::string, trace_steps, "all",
          "with --trace: the steps to record, e.g. 2,5-7 (the file is written as the run goes)");
ABSL_FLAG(int64_t, sample, 0, "after training, generate N tokens from --prompt and print them");
ABSL_FLAG(std::string, prompt, "\n", "--sample: the prompt (bytes for --text data; for --data, "
          "comma-separated token ids)");
ABSL_FLAG(double, peak_flops, 0,
          "the MFU denominator in FLOP/s for all the run's devices together (0: a GPU's spec "
          "peak for its dtype from the planner's h100_node/h200_node profiles, picked by the "
          "card's name, times the GPUs used; on CPU ranks the machine's hardware peak: cores x "
          "clock x FMA width, models/train/mfu.h)");
ABSL_FLAG(std::string, max_memory, "",
          "refuse a --batch whose step needs more than this per process (e.g. 8GiB; empty: the "
          "machine's memory), before allocating");
ABSL_FLAG(double, temperature, 0.0, "--sample: 0 greedy, else softmax(logits / temperature)");
ABSL_FLAG(int64_t, top_k, 0, "--sample: only the k most likely tokens (0: all)");

namespace shardmap {
namespace {

// Every process of a multi-process run must be started with the same settings. Each rank
// hashes each of its train_gpt flags (output paths aside; the data by its tokens) and all_gathers
// the hashes; a flag whose hash differs from rank 0's is named, with this rank's value, on every
// rank before the first step (instead of a hang or a "lost rank" later).
absl::Status AgreeOnSettings(collectives::Communicator& world,
                             const std::vector<int64_t>& tokens) {
  std::vector<std::pair<std::string, std::string>> settings;  // name, value
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (!absl::StrContains(flag->Filename(), "train_gpt")) continue;
    const std::string n(name);
    if (n == "save" || n == "trace" || n == "data" || n == "text" || n == "tokenizer") continue;
    settings.emplace_back(n, flag->CurrentValue());
  }
  std::sort(settings.begin(), settings.end());
  uint64_t data_hash = 1469598103934665603ull;  // FNV-1a over the token ids
  for (int64_t t : tokens) data_hash = (data_hash ^ static_cast<uint64_t>(t)) * 1099511628211ull;
  settings.emplace_back("data", absl::StrCat("tokens with hash ", data_hash, " (",
                                             tokens.size(), " tokens)"));
  const size_t n = settings.size();
  std::vector<int64_t> mine(n), all(n * world.size());
  for (size_t i = 0; i < n; ++i) {
    uint64_t h = 1469598103934665603ull;
    for (unsigned char ch : settings[i].first + "=" + settings[i].second) {
      h = (h ^ ch) * 1099511628211ull;
    }
    mine[i] = static_cast<int64_t>(h);
  }
  absl::Status gathered;
  if (world.memory_space().device) {
    // NCCL works on device memory: the hashes go through buffers on this rank's GPU.
    const Device gpu = Device::Cuda(world.memory_space().device_index);
    Tensor send = Tensor::FromVector<int64_t>({static_cast<int64_t>(n)}, mine).To(gpu);
    Tensor recv = Tensor::Empty({static_cast<int64_t>(n) * world.size()}, DType::kI64, gpu);
    cuda::Synchronize(gpu.index);  // the copy is done before the communicator's stream reads it
    gathered = world.AllGather(send.raw_data(), recv.raw_data(), n, collectives::DataType::kI64);
    if (gathered.ok()) {
      // NCCL's call returns once enqueued on its stream: read there (ordered after it), then
      // ask whether it failed meanwhile.
      cuda::StreamScope on_comm(gpu.index,
                                static_cast<cuda::StreamHandle>(world.memory_space().stream));
      all = recv.To(Device::Cpu()).ToVector<int64_t>();
      gathered = world.AsyncError();
    }
  } else {
    gathered = world.AllGather(mine.data(), all.data(), n, collectives::DataType::kI64);
  }
  if (!gathered.ok()) {
    return absl::Status(gathered.code(),
                        absl::StrCat("agreeing on the run's settings: ", gathered.message()));
  }
  std::vector<std::string> differ;
  for (size_t i = 0; i < n; ++i) {
    std::vector<int> ranks;
    for (int r = 1; r < world.size(); ++r) {
      if (all[r * n + i] != all[i]) ranks.push_back(r);
    }
    if (!ranks.empty()) {
      differ.push_back(absl::StrCat("--", settings[i].first, " (rank ", absl::StrJoin(ranks, ", "),
                                    " differ", ranks.size() == 1 ? "s" : "",
                                    " from rank 0; this rank, ", world.rank(), ", has ",
                                    settings[i].second, ")"));
    }
  }
  if (differ.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "the processes were started with different settings: ", absl::StrJoin(differ, "; "),
      "; start every rank with the same flags"));
}

// The name this binary was run as ("train", or its old name "train_gpt"), for messages.
std::string& ProgramName() {
  static auto* name = new std::string("train");
  return *name;
}

int Fail(const absl::Status& s) {
  std::cerr << ProgramName() << ": " << s.message() << "\n";
  return 2;
}

// --resume=auto: the newest complete periodic checkpoint of --save, or a fresh run when there is
// none yet (so one command serves the first launch and every restart). Sets *resume to the file
// to resume from ("" for a fresh run) and adds to *note what the run says about it.
absl::Status ResolveResume(std::string* resume, std::string* note) {
  *resume = absl::GetFlag(FLAGS_resume);
  if (*resume != "auto") return absl::OkStatus();
  CheckpointRotation rot{absl::GetFlag(FLAGS_save), absl::GetFlag(FLAGS_keep_last)};
  if (absl::GetFlag(FLAGS_save).empty()) {
    return absl::InvalidArgumentError("--resume=auto needs --save (the checkpoint prefix)");
  }
  // Only the checkpoints of the run under the prefix count; several runs there are refused.
  absl::StatusOr<std::optional<std::string>> run = SingleRunUnder(rot);
  if (!run.ok()) return run.status();
  rot.run_id = *run;
  std::vector<std::string> skipped;  // newer files that are no complete checkpoint
  absl::StatusOr<std::string> latest = rot.LatestComplete(&skipped);
  for (const std::string& why : skipped) {
    absl::StrAppend(note, "--resume=auto: passed over ", why, "\n");
  }
  if (absl::IsNotFound(latest.status()) && skipped.empty()) {
    *resume = "";
    *note = absl::StrCat("--resume=auto: ", latest.status().message(), "; starting a fresh run");
    return absl::OkStatus();
  }
  if (!latest.ok()) return latest.status();
  *resume = *latest;
  return absl::OkStatus();
}

// The model the flags describe: --preset's shape, with every shape flag given on the command line
// in its place (without --preset, every shape flag's value, its default included).
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

// A model other than GPT-2 takes its shape from the flags; a --resume or --init file must hold
// that model (its metadata "model", when it has one) and its tensors are checked against the
// shape when the trainer opens it.
absl::Status CheckFileModel(const std::string& path, const std::string& flag,
                            const std::string& model) {
  if (path.empty()) return absl::OkStatus();
  absl::StatusOr<SafetensorsFile> f = OpenGptCheckpoint(path);
  if (!f.ok()) return absl::OkStatus();  // the trainer reports the file's problem
  auto it = f->metadata().find("model");
  const std::string saved = it != f->metadata().end()                   ? it->second
                            : f->metadata().count("gpt.layers") > 0 ? "gpt2"
                                                                        : model;
  if (saved != model) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " '", path, "' holds a ", saved,
                                                   " model but --model=", model, "; pass --model=",
                                                   saved));
  }
  return absl::OkStatus();
}

// --resume and --init: the model's shape comes from the file's gpt.* metadata (a file written by
// --save or --save_every; a GPT-2 file without it keeps the flags' shape); shape flags on the
// command line (at any value, their defaults included) must agree. `flag` names the flag; a resume adds "resumed from FILE
// at step N" to *note.
absl::Status AdoptShapeFrom(const std::string& path, const std::string& flag, GptConfig* cfg,
                            std::string* note) {
  if (path.empty()) return absl::OkStatus();
  absl::StatusOr<SafetensorsFile> f = OpenGptCheckpoint(path);
  if (!f.ok()) return absl::OkStatus();  // TrainGpt reports the file's problem
  if (flag == "--resume") {
    if (absl::StatusOr<int64_t> step = CheckpointStep(*f); step.ok()) {
      absl::StrAppend(note, "resumed from ", path, " at step ", *step);
    }
  }
  bool has_config = false;
  for (const auto& [k, v] : f->metadata()) has_config |= absl::StartsWith(k, "gpt.");
  if (!has_config) return absl::OkStatus();
  absl::StatusOr<GptConfig> saved = GptConfigFromMetadata(f->metadata());
  if (!saved.ok()) {
    return absl::Status(saved.status().code(),
                        absl::StrCat(flag, " '", path, "': ", saved.status().message()));
  }
  const std::vector<std::pair<const char*, std::pair<int64_t, int64_t>>> shape = {
      {"layers", {cfg->layers, saved->layers}}, {"d_model", {cfg->d_model, saved->d_model}},
      {"heads", {cfg->heads, saved->heads}},    {"vocab", {cfg->vocab, saved->vocab}},
      {"seq", {cfg->seq, saved->seq}},          {"experts", {cfg->moe.experts, saved->moe.experts}}};
  for (const auto& [name, values] : shape) {
    const absl::CommandLineFlag* cl = absl::FindCommandLineFlag(name);
    if (cl != nullptr && GivenOnCommandLine(name) && values.first != values.second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--", name, "=", values.first, " but the checkpoint '", path, "' has ", name, " ",
          values.second, "; ", flag, " takes the model's shape from the file: drop --", name));
    }
  }
  if (GivenOnCommandLine("dtype") &&
      (saved->dtype != cfg->dtype || saved->compute != cfg->compute)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--dtype=", absl::GetFlag(FLAGS_dtype), " but the checkpoint '", path,
        "' was trained in ", DTypeName(saved->compute_dtype()), "; drop --dtype"));
  }
  // The expert axes are a layout choice of this run's mesh, not the model's shape.
  saved->moe.expert_axes = cfg->moe.expert_axes;
  *cfg = *saved;
  return absl::OkStatus();
}

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

// The step's least memory (models/train/memory_bound.h) against --max_memory or the machine's:
// an impossible --batch (given, or adopted from a checkpoint) is refused before allocating.
absl::Status CheckBatchFits(const Model& model, int processes) {
  double params = 0;
  for (const ParamInfo& p : model.params()) params += NumElements(p.global_shape);
  const std::string flag = absl::GetFlag(FLAGS_max_memory);
  absl::StatusOr<double> limit = ParseMemoryLimit(flag);
  if (!limit.ok()) return limit.status();
  return CheckStepFitsMemory(
      params, model.shape(), {absl::GetFlag(FLAGS_batch), absl::GetFlag(FLAGS_grad_accum),
            absl::GetFlag(FLAGS_microbatches)},
      processes, *limit, flag.empty() ? "this machine's memory" : "--max_memory");
}

// --tokenizer=PATH: Llama 3's tokenizer.model, or GPT-2's byte-level BPE from a folder's
// encoder.json + vocab.bpe (or vocab.json + merges.txt); null without the flag. Its ids must fit
// --vocab.
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

// The run this command continues (--resume: the checkpoint's run id, and its settings for the
// flags not given, AdoptRunFlags) or starts (a new run id). Adds what it adopted and every
// changed setting to *note.
absl::StatusOr<ResumedRun> ContinueOrStartRun(const std::string& resume, std::string* note) {
  const std::string id = absl::GetFlag(FLAGS_run_id);
  if (id.find_first_of(",\n") != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("--run_id '", id, "' holds a comma or a newline; use letters and digits"));
  }
  if (resume.empty()) return ResumedRun{id.empty() ? NewRunId() : id, std::nullopt};
  std::vector<std::string> notes;
  absl::StatusOr<ResumedRun> run = AdoptRunFlags(resume, &notes);
  if (!run.ok()) return run.status();
  if (!id.empty() && run->saved.has_value() && id != run->run_id) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--run_id=", id, " but '", resume, "' is a checkpoint of run '", run->run_id,
        "': a resume continues that run; drop --run_id"));
  }
  for (const std::string& line : notes) {
    if (!note->empty() && note->back() != '\n') note->push_back('\n');
    absl::StrAppend(note, line);
  }
  return run;
}

// The run's configuration for its checkpoints: the settings, the training data file's identity
// and the tokenizer's hash. On a resume, data or a tokenizer that are not the run's are refused
// (CheckSameData); the same data under another path adds a note.
absl::StatusOr<RunConfig> DescribeRun(const ResumedRun& run, const std::string& resume,
                                      std::string* note) {
  RunConfig now{run.run_id, CurrentRunFlags()};
  const std::string data = !absl::GetFlag(FLAGS_data).empty() ? absl::GetFlag(FLAGS_data)
                                                              : absl::GetFlag(FLAGS_text);
  if (!data.empty()) {
    absl::StatusOr<FileIdentity> id = IdentifyFile(data);
    if (!id.ok()) return id.status();
    now.data = *id;
  }
  if (!absl::GetFlag(FLAGS_tokenizer).empty()) {
    absl::StatusOr<std::vector<std::string>> files =
        TokenizerFiles(absl::GetFlag(FLAGS_tokenizer));  // models/train/sample_text.h
    if (!files.ok()) return files.status();
    absl::StatusOr<uint64_t> h = HashFiles(*files);
    if (!h.ok()) return h.status();
    now.tokenizer_hash = *h;
  }
  if (run.saved.has_value()) {
    std::vector<std::string> notes;
    if (absl::Status s = CheckSameData(*run.saved, now.data, now.tokenizer_hash, resume, &notes);
        !s.ok()) {
      return s;
    }
    for (const std::string& line : notes) {
      if (!note->empty() && note->back() != '\n') note->push_back('\n');
      absl::StrAppend(note, line);
    }
  }
  return now;
}

// Where the ranks run: --devices, --backend (this process's rank of the launcher's world, or
// null: the ranks are threads of this process), --device and --gpu_ranks.
struct RankWorld {
  std::unique_ptr<collectives::Communicator> world;
  DevicePlacement placement;
  bool print = true;  // rank 0 prints (every process of a gloo run sees the same losses)
};

absl::StatusOr<RankWorld> ConnectRanks(const Mesh& mesh) {
  const std::string devices = absl::GetFlag(FLAGS_devices);
  if (!devices.empty()) {
    int n = 0;
    if (!absl::StartsWith(devices, "cpu:") || !absl::SimpleAtoi(devices.substr(4), &n)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--devices ", devices, ": write cpu:N (simulated CPU ranks)"));
    }
    if (n != mesh.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--devices cpu:", n, " but the mesh ", mesh.ShortString(), " has ", mesh.size(),
          " ranks; make them equal (or leave --devices out)"));
    }
  }
  RankWorld out;
  const std::string device = absl::GetFlag(FLAGS_device);
  const double timeout_s = absl::GetFlag(FLAGS_collective_timeout);
  if (!std::isfinite(timeout_s) || timeout_s <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--collective_timeout ", timeout_s, " must be a finite number of seconds > 0 (e.g. 60)"));
  }
  collectives::ProcessWorldOptions world_options;
  world_options.timeout = absl::Seconds(timeout_s);
  absl::StatusOr<std::unique_ptr<collectives::Communicator>> connected =
      collectives::ConnectTrainingWorld(absl::GetFlag(FLAGS_backend), mesh.size(),
                                        device == "cuda", world_options);
  if (!connected.ok()) return connected.status();
  out.world = *std::move(connected);
  const std::string gpu_ranks = absl::GetFlag(FLAGS_gpu_ranks);
  if (device != "cpu" && device != "cuda") {
    return absl::InvalidArgumentError(absl::StrCat("--device ", device, ": use cpu or cuda"));
  }
  if (gpu_ranks != "auto" && gpu_ranks != "shared" && gpu_ranks != "per_gpu") {
    return absl::InvalidArgumentError(
        absl::StrCat("--gpu_ranks ", gpu_ranks, ": use auto, shared or per_gpu"));
  }
  if (device == "cuda" && out.world == nullptr) {
    if (!cuda::Available()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--device=cuda: no usable GPU (", cuda::UnavailableReason(), "); use --device=cpu"));
    }
    const bool per_gpu = gpu_ranks == "per_gpu" ||
                         (gpu_ranks == "auto" && cuda::DeviceCount() >= mesh.size());
    out.placement = per_gpu ? DevicePlacement::GpuPerRank() : DevicePlacement::SharedGpu(0);
  } else if (device == "cpu" && gpu_ranks != "auto") {
    return absl::InvalidArgumentError("--gpu_ranks needs --device=cuda");
  }
  out.print = out.world == nullptr || out.world->rank() == 0;
  return out;
}

// The optimizer, schedule and pipeline settings of TrainOptions, and the learning-rate
// schedule (models/components/lr_schedule.h), checked before the first step.
absl::Status SetOptimization(TrainOptions& o) {
  o.steps = absl::GetFlag(FLAGS_steps);
  o.batch = absl::GetFlag(FLAGS_batch);
  o.optimizer.adamw.lr = absl::GetFlag(FLAGS_lr);
  o.optimizer.adamw.beta1 = absl::GetFlag(FLAGS_beta1);
  o.optimizer.adamw.beta2 = absl::GetFlag(FLAGS_beta2);
  o.optimizer.adamw.eps = absl::GetFlag(FLAGS_eps);
  o.optimizer.adamw.weight_decay = absl::GetFlag(FLAGS_weight_decay);
  o.optimizer.clip = absl::GetFlag(FLAGS_clip);
  o.grad_accum = absl::GetFlag(FLAGS_grad_accum);
  absl::StatusOr<BatchOrder> order =
      ParseBatchOrder(absl::GetFlag(FLAGS_data_order), absl::GetFlag(FLAGS_seed));
  if (!order.ok()) return order.status();
  o.batch_order = *order;
  LrSchedule schedule_lr;
  schedule_lr.kind = absl::GetFlag(FLAGS_lr_schedule);
  schedule_lr.max_lr = absl::GetFlag(FLAGS_lr);
  schedule_lr.min_lr = absl::GetFlag(FLAGS_min_lr);
  schedule_lr.warmup_steps = absl::GetFlag(FLAGS_warmup_steps);
  schedule_lr.decay_steps = absl::GetFlag(FLAGS_decay_steps) >= 0
                                ? absl::GetFlag(FLAGS_decay_steps)
                                : absl::GetFlag(FLAGS_steps);
  if (schedule_lr.kind != "constant" || schedule_lr.warmup_steps != 0) {
    if (absl::Status s = schedule_lr.Validate(); !s.ok()) return s;
    o.optimizer.lr_at = [schedule_lr](int64_t step) { return schedule_lr.At(step); };
  }
  return absl::OkStatus();
}

// --microbatches, --schedule, --virtual_stages and --stage_layers.
absl::Status SetPipeline(TrainOptions& o) {
  o.pipeline.microbatches = absl::GetFlag(FLAGS_microbatches);
  o.pipeline.schedule = absl::GetFlag(FLAGS_schedule);
  o.pipeline.virtual_stages = absl::GetFlag(FLAGS_virtual_stages);
  absl::StatusOr<Schedule> schedule = ParseSchedule(o.pipeline.schedule);
  if (!schedule.ok()) return schedule.status();
  for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_stage_layers), ',',
                                               absl::SkipEmpty())) {
    int64_t n = 0;
    if (!absl::SimpleAtoi(part, &n)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--stage_layers: '", part, "' is not a number (e.g. --stage_layers=2,1,1)"));
    }
    o.pipeline.stage_layers.push_back(n);
  }
  return absl::OkStatus();
}

// --overlap, --bucket_mb, --fsdp_prefetch and --reshard_after_forward.
absl::Status SetOverlap(TrainOptions& o) {
  const std::string overlap = absl::GetFlag(FLAGS_overlap);
  if (overlap != "on" && overlap != "off") {
    return absl::InvalidArgumentError(
        absl::StrCat("--overlap='", overlap, "': give on (the default) or off"));
  }
  o.overlap.on = overlap == "on";
  const double mb = absl::GetFlag(FLAGS_bucket_mb);
  if (!(mb > 0) || !std::isfinite(mb) || mb > 1e6) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--bucket_mb=", mb, ": the gradient bucket size must be a positive number of MiB "
        "(at most 1e6; e.g. 25, DDP's default)"));
  }
  o.overlap.bucket_bytes = std::max<int64_t>(1, static_cast<int64_t>(mb * (1 << 20)));
  o.overlap.fsdp_prefetch = absl::GetFlag(FLAGS_fsdp_prefetch);
  o.overlap.reshard_after_forward = absl::GetFlag(FLAGS_reshard_after_forward);
  if (o.overlap.fsdp_prefetch < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--fsdp_prefetch=", o.overlap.fsdp_prefetch,
        ": the prefetch depth must be at least 1 (the next unit's all-gather runs beside this "
        "one's compute); --overlap=off gathers each parameter at its use"));
  }
  return absl::OkStatus();
}

// --recompute.
absl::Status SetRecompute(TrainOptions& o) {
  absl::StatusOr<RecomputeMode> mode = ParseRecomputeMode(absl::GetFlag(FLAGS_recompute));
  if (!mode.ok()) return mode.status();
  o.recompute = *mode;
  return absl::OkStatus();
}

// --sample: the prompt and the sampling settings, checked before training.
struct SampleRequest {
  int64_t tokens = 0;  // 0: no sample
  std::vector<int64_t> prompt;
};

absl::StatusOr<SampleRequest> ParseSampleRequest(const ModelShape& cfg,
                                                 const TextTokenizer* tokenizer) {
  SampleRequest req;
  req.tokens = absl::GetFlag(FLAGS_sample);
  if (req.tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--sample ", req.tokens, " must be >= 0"));
  }
  if (req.tokens == 0) return req;
  const double temperature = absl::GetFlag(FLAGS_temperature);
  const int64_t top_k = absl::GetFlag(FLAGS_top_k);
  if (!std::isfinite(temperature) || temperature < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--temperature ", temperature, " must be finite and >= 0 (0: greedy)"));
  }
  if (top_k < 0 || top_k > cfg.vocab) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--top_k ", top_k, " must be in [0, vocab = ", cfg.vocab, "] (0: every id)"));
  }
  absl::StatusOr<std::vector<int64_t>> prompt = EncodePrompt(
      absl::GetFlag(FLAGS_prompt), tokenizer, !absl::GetFlag(FLAGS_data).empty(), cfg.vocab);
  if (!prompt.ok()) return prompt.status();
  req.prompt = *std::move(prompt);
  return req;
}

// The step lines: "step N loss X | ...", every --log_every steps (and the first, the last and
// every evaluated one), with the communication of the step; totals for the summary.
// The MFU of the step line: the model FLOPs per token against the peak of the run's devices.
struct MfuBasis {
  double flops_per_token = 0;  // nanoGPT's estimate_mfu: 6N + 12 L H Q T
  double peak_flops = 0;       // 0: unknown (no MFU printed)
  std::string peak_source;     // where the peak comes from
  bool cpu = true;             // CPU ranks: the step line shows the process's RSS too
};

class StepPrinter {
 public:
  StepPrinter(bool print, int64_t tokens_per_step, TypeTrace* types, MfuBasis mfu = {})
      : print_(print), tokens_per_step_(tokens_per_step), types_(types), mfu_(std::move(mfu)) {}

  void operator()(const StepInfo& s);

  double total_s() const { return total_s_; }
  const MfuBasis& mfu() const { return mfu_; }
  int64_t peak_rss() const { return peak_rss_; }
  // Percent of the peak at `tokens_per_s`, and the step line's " | MFU x%" ("" without a peak).
  double MfuPercent(double tokens_per_s) const {
    return 100.0 * mfu_.flops_per_token * tokens_per_s / mfu_.peak_flops;
  }
  std::string MfuText(double tokens_per_s) const {
    if (mfu_.peak_flops <= 0) return "";
    return absl::StrFormat(" | MFU %.2f%%", MfuPercent(tokens_per_s));
  }
  double last_val() const { return last_val_; }
  const std::map<std::string, int64_t>& total_bytes() const { return total_bytes_; }

 private:
  bool print_;
  int64_t tokens_per_step_;
  TypeTrace* types_;
  MfuBasis mfu_;
  int64_t peak_rss_ = -1;
  double total_s_ = 0;
  int64_t steps_run_ = 0;
  double last_val_ = std::nan("");
  std::map<std::string, int64_t> total_bytes_;
};

void StepPrinter::operator()(const StepInfo& s) {
  if (!print_) return;
  if (!types_->empty()) {  // recorded during the first step
    std::cout << "per-device SPMD types inside block 0 (rank 0):\n";
    for (const auto& [name, type] : *types_) {
      std::cout << absl::StrFormat("  %-52s %s\n", name, type);
    }
    types_->clear();
  }
  std::map<std::string, int64_t> bytes;
  for (const CollectiveRecord& r : *s.log) bytes[r.op] += r.bytes;
  std::string comm;
  for (const auto& [op, b] : bytes) {
    absl::StrAppend(&comm, comm.empty() ? "" : ", ", op, " ", Bytes(b));
    total_bytes_[op] += b;
  }
  total_s_ += s.seconds;
  std::string moe;
  if (s.moe_dropped >= 0) {
    moe = absl::StrFormat(" | MoE dropped %d of %d assignments (%.1f%%), %d tokens lost all",
                          s.moe_dropped, s.moe_assignments,
                          100.0 * s.moe_dropped / s.moe_assignments, s.moe_dropped_tokens);
  }
  std::string mem =
      s.peak_device_bytes >= 0 ? absl::StrCat(" | peak GPU memory ", Bytes(s.peak_device_bytes))
                               : "";
  if (mfu_.cpu) {
    const int64_t rss = ProcessRssBytes();
    peak_rss_ = std::max(peak_rss_, rss);
    if (rss >= 0) absl::StrAppend(&mem, " | RSS ", Bytes(rss));
  }
  ++steps_run_;
  const bool evaluated = !std::isnan(s.val_loss);
  if (evaluated) last_val_ = s.val_loss;
  const int64_t log_every = std::max<int64_t>(1, absl::GetFlag(FLAGS_log_every));
  if (!(s.step % log_every == 0 || s.step + 1 == s.total_steps || steps_run_ == 1 || evaluated)) {
    return;
  }
  // ETA from the mean step time so far.
  const double eta_s = total_s_ / steps_run_ * static_cast<double>(s.total_steps - s.step - 1);
  std::cout << absl::StrFormat(
      "step %d loss %.10g | %d/%d, ETA %s, %d tokens seen, lr %.4g, grad norm %.4g%s | "
      "%.1f ms/step | %.0f tokens/s%s | %s%s%s\n",
      s.step, s.loss, s.step + 1, s.total_steps, Duration(eta_s), s.tokens_seen, s.lr,
      s.grad_norm, evaluated ? absl::StrFormat(" | val loss %.10g", s.val_loss) : "",
      s.seconds * 1e3, tokens_per_step_ / s.seconds, MfuText(tokens_per_step_ / s.seconds),
      comm.empty() ? "no communication" : comm,
      moe, mem);
  std::cout.flush();
}

// The MFU's basis (rank 0 only: it may measure the CPU): --peak_flops, else on GPUs the spec
// peak of the compute dtype from the planner's profile named by the card (h100_node, h200_node)
// times the GPUs the ranks use, else on CPU ranks the machine's hardware peak (all ranks share
// its cores, threads or processes alike; models/train/mfu.h).
MfuBasis MfuFor(const Model& layout, const RankWorld& ranks) {
  const ModelShape& cfg = layout.shape();
  MfuBasis m;
  m.flops_per_token = layout.FlopsPerToken();
  const DType dtype = cfg.compute_dtype();
  const bool gpu = absl::GetFlag(FLAGS_device) == "cuda";
  m.cpu = !gpu;
  if (absl::GetFlag(FLAGS_peak_flops) > 0) {
    m.peak_flops = absl::GetFlag(FLAGS_peak_flops);
    m.peak_source = "--peak_flops";
    return m;
  }
  if (!gpu) {
    absl::StatusOr<CpuPeak> peak = CpuPeakFlops(dtype, DefaultPeakCachePath());
    m.peak_flops = peak.ok() ? peak->flops : 0;
    m.peak_source = peak.ok() ? absl::StrCat("this CPU's ", DTypeName(dtype), " peak, ",
                                             peak->source)
                              : std::string(peak.status().message());
    return m;
  }
  const std::string name = cuda::DeviceName(0);
  const std::string lower = absl::AsciiStrToLower(name);
  // The profiles are SXM nodes' (an H100 PCIe or NVL card has lower peaks: not guessed).
  const bool sxm_h100 = absl::StrContains(lower, "h100") && !absl::StrContains(lower, "pcie") &&
                        !absl::StrContains(lower, "nvl");
  const char* profile = absl::StrContains(lower, "h200") ? "h200_node"
                        : sxm_h100                       ? "h100_node"
                                                         : nullptr;
  absl::StatusOr<planner::HardwareProfile> p =
      profile != nullptr ? planner::LoadHardwareProfile(profile)
                         : absl::NotFoundError("no profile");
  if (!p.ok() || p->peak_flops.count(dtype) == 0) {
    m.peak_source = absl::StrCat("no spec peak for ", name.empty() ? "this GPU" : name, " in ",
                                 DTypeName(dtype), "; give --peak_flops");
    return m;
  }
  const int gpus = ranks.world != nullptr ? ranks.world->size()
                   : ranks.placement.kind == DevicePlacement::Kind::kGpuPerRank
                       ? layout.mesh().size()
                       : 1;
  m.peak_flops = p->peak_flops.at(dtype) * gpus;
  m.peak_source = absl::StrCat(name, " ", DTypeName(dtype), " spec peak (", profile, ") x ", gpus,
                               " GPU", gpus == 1 ? "" : "s");
  return m;
}

// The run's first lines: the model, the mesh and where it runs, the batch and the data.
void PrintHeader(const Model& layout, const RankWorld& ranks, const TrainOptions& o,
                 size_t data_tokens) {
  const ModelShape& cfg = layout.shape();
  const Mesh& mesh = layout.mesh();
  int64_t params = 0;
  for (const ParamInfo& p : layout.params()) params += NumElements(p.global_shape);
  const DevicePlacement& placement = ranks.placement;
  std::cout << absl::StrFormat(
      "%s: %d layers, d_model %d, %d heads, vocab %d, seq %d, %.2fM parameters, %s\n"
      "mesh %s%s%s on %d %s; global batch %d x %d tokens; %d tokens of data, %s\n",
      layout.name() == "gpt2" ? std::string("GPT-2") : layout.Describe(), cfg.layers,
      cfg.d_model, cfg.heads, cfg.vocab, cfg.seq, params / 1e6,
      cfg.compute.has_value()
          ? absl::StrCat(DTypeName(*cfg.compute), " compute, ", DTypeName(cfg.dtype),
                         " master weights")
          : std::string(DTypeName(cfg.dtype)),
      mesh.ShortString(), layout.tp().sp ? " + sequence parallel" : "",
      layout.cp_axis().empty() ? "" : " (cp: ring attention, load-balanced chunks)", mesh.size(),
      ranks.world != nullptr ? absl::StrCat("processes (", absl::GetFlag(FLAGS_backend), ")")
      : placement.kind == DevicePlacement::Kind::kSharedGpu
          ? "virtual ranks sharing cuda:0 (a stream each)"
      : placement.kind == DevicePlacement::Kind::kGpuPerRank ? "GPUs (one rank each)"
                                                             : "simulated CPU devices",
      o.batch, cfg.seq, data_tokens,
      o.batch_order.random ? absl::StrCat("random order (seed ", o.batch_order.seed, ")")
                           : std::string("in order"));
  if (cfg.moe.on()) {
    const MoeConfig& m = cfg.moe;
    std::cout << absl::StrFormat(
        "MoE MLPs: %d experts, top-%d, capacity %d per expert and sequence (factor %g), aux loss "
        "coef %g, experts split over %s\n",
        m.experts, m.topk, MoeCapacity(m.capacity_factor, cfg.seq, m.topk, m.experts),
        m.capacity_factor, m.aux_loss_coef,
        m.expert_axes.empty() ? std::string("no axis (all experts on every device)")
                              : absl::StrJoin(m.expert_axes, " x "));
  }
}

// The run's last lines: the summary, GPU memory and the CUDA graph, the pipeline's bubble, the
// final validation loss, the trace and the saved file.
void PrintSummary(const Model& layout, const TrainOptions& o, const TrainResult& r,
                  const StepPrinter& steps, const std::string& trace_path,
                  const std::string& save_path) {
  const int64_t tokens_per_step = o.batch * layout.shape().seq;
  std::string comm;
  for (const auto& [op, b] : steps.total_bytes()) {
    absl::StrAppend(&comm, comm.empty() ? "" : ", ", op, " ", Bytes(b));
  }
  const double total_s = steps.total_s();
  // Memory per rank, what a user sizes a run by: what persists (parameters, gradients, AdamW's
  // moments), the activations the tape held at most (FSDP parameters count while gathered and
  // held, not once resharding freed them), the gathered parameters at most, the step's peak.
  const int64_t moments = r.optimizer_bytes_per_rank - r.gradient_bytes_per_rank;
  std::string step_peak;
  if (r.peak_step_bytes_per_rank >= 0) {
    step_peak = absl::StrFormat(
        ", step peak %s above them (%s)", Bytes(r.peak_step_bytes_per_rank),
        r.peak_step_bytes_per_rank > r.peak_backprop_bytes_per_rank
            ? absl::StrCat("after the backward: gradient reductions and AdamW; forward + backward ",
                           Bytes(r.peak_backprop_bytes_per_rank))
            : std::string("in the forward + backward"));
  }
  std::cout << absl::StrFormat(
      "summary: %d steps, loss %.10g -> %.10g, %.1f ms/step, %.0f tokens/s; per rank: "
      "parameters %s, gradients %s, optimizer state %s, activations %s saved at most (largest "
      "%s)%s%s; rank 0 sent %s\n",
      r.losses.size(), r.losses.front(), r.losses.back(), total_s * 1e3 / r.losses.size(),
      tokens_per_step * r.losses.size() / total_s, Bytes(r.param_bytes_per_rank),
      Bytes(r.gradient_bytes_per_rank), Bytes(moments), Bytes(r.peak_activation_bytes_per_rank),
      Bytes(r.largest_activation_bytes),
      r.peak_gathered_bytes_per_rank >= 0
          ? absl::StrCat(", FSDP gathered parameters at most ", Bytes(r.peak_gathered_bytes_per_rank))
          : std::string(),
      step_peak, comm.empty() ? "nothing" : comm);
  if (r.peak_step_bytes_per_rank >= 0) {
    std::string gathered;
    if (r.peak_gathered_bytes_per_rank >= 0) {
      const bool stages = layout.pp_ways() > 1 || o.pipeline.microbatches > 1;
      gathered = absl::StrFormat(
          "; FSDP gathered parameters: %s",
          stages ? std::string("the stage's, gathered once per step and kept over its "
                               "microbatches")
          : absl::StrCat("prefetch ", o.overlap.fsdp_prefetch, ", ",
                         o.overlap.reshard_after_forward
                             ? "resharded after forward: at most prefetch + 1 blocks, the last "
                               "block, embeddings and final LayerNorm"
                             : "kept from forward to backward: the whole model"));
    }
    std::cout << absl::StrFormat(
        "memory (rank 0, first step): the step's tensors (activations, gathered parameters, "
        "gradients, then the gradient reductions and AdamW's in-place update) %s at most, %s up "
        "to the end of the backward; tape outputs %s in all%s; overlap %s\n",
        Bytes(r.peak_step_bytes_per_rank), Bytes(r.peak_backprop_bytes_per_rank),
        Bytes(r.activation_bytes_per_rank), gathered,
        o.overlap.on ? absl::StrCat("on (", Bytes(o.overlap.bucket_bytes), " gradient buckets)")
                     : std::string("off"));
  }
  std::cout << absl::StrFormat("activations: recompute=%s, peak saved per rank %s (rank 0, first "
                               "step)\n",
                               r.recompute, Bytes(r.peak_activation_bytes_per_rank));
  if (r.peak_device_bytes_per_rank >= 0) {
    std::cout << absl::StrFormat(
        "GPU: peak memory %s on %s%s; CUDA graph: %s\n", Bytes(r.peak_device_bytes_per_rank),
        r.device,
        r.ranks_per_device > 1 ? absl::StrCat(" (shared by ", r.ranks_per_device, " virtual ranks)")
                               : std::string(" (per rank)"),
        r.cuda_graph_used ? absl::StrCat("captured (", r.cuda_graph_replays, " replays)")
                          : r.cuda_graph_note);
  }
  if (layout.pp_ways() > 1 || o.pipeline.microbatches != 1) {
    const int p = layout.pp_ways(), v = o.pipeline.virtual_stages;
    std::cout << absl::StrFormat(
        "pipeline: peak saved activations (rank 0) %s; bubble measured %.3f (ideal: "
        "(p-1)/(%sm+p-1) = %.3f)\n",
        Bytes(r.peak_activation_bytes_per_rank), r.pipeline_bubble, v > 1 ? "v " : "",
        static_cast<double>(p - 1) /
            static_cast<double>(static_cast<int64_t>(v) * o.pipeline.microbatches + p - 1));
  }
  const MfuBasis& mfu = steps.mfu();
  std::cout << absl::StrFormat(
      "MFU: %s; %.0f model FLOPs per token (6N + 12 L H Q T, nanoGPT's estimate)%s\n",
      mfu.peak_flops > 0
          ? absl::StrFormat("%.2f%% of %.4g FLOP/s (%s)%s",
                            steps.MfuPercent(tokens_per_step * r.losses.size() / total_s),
                            mfu.peak_flops, mfu.peak_source,
                            steps.MfuPercent(tokens_per_step * r.losses.size() / total_s) > 100
                                ? "; above 100%: the peak is too low: give --peak_flops"
                                : "")
          : absl::StrCat("unknown (", mfu.peak_source, ")"),
      mfu.flops_per_token,
      steps.peak_rss() >= 0 ? absl::StrCat("; peak RSS ", Bytes(steps.peak_rss())) : "");
  if (!std::isnan(steps.last_val())) {
    std::cout << absl::StrFormat("val loss %.10g\n", steps.last_val());
  }
  if (!trace_path.empty()) {
    std::cout << "trace: " << trace_path << " (steps " << absl::GetFlag(FLAGS_trace_steps)
              << "; open in https://ui.perfetto.dev)\n";
  }
  if (!save_path.empty()) std::cout << "saved: " << save_path << "\n";
}

// --sample: generation with the trained parameters (on the mesh without pp: generation does not
// pipeline; every process of a multi-process run takes part). Empty on ranks that do not print.
// `remake` builds the same model on another mesh.
using ModelOnMesh = std::function<absl::StatusOr<std::unique_ptr<Model>>(const Mesh&)>;
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
  so.tokens = req.tokens;
  so.temperature = absl::GetFlag(FLAGS_temperature);
  so.top_k = absl::GetFlag(FLAGS_top_k);
  so.seed = absl::GetFlag(FLAGS_seed);
  const bool same_mesh = sample_layout->mesh().size() == layout.mesh().size();
  so.comm = same_mesh ? ranks.world.get() : nullptr;
  if (ranks.world != nullptr && so.comm == nullptr && ranks.world->rank() != 0) {
    return std::vector<int64_t>{};
  }
  return GenerateGpt(*sample_layout, r.params, req.prompt, so);
}

void PrintSample(const std::vector<int64_t>& sampled, int64_t tokens,
                 const TextTokenizer* tokenizer) {
  const std::string text = DecodeTokens(sampled, tokenizer, !absl::GetFlag(FLAGS_data).empty());
  std::cout << absl::StrFormat("sample (%d tokens, %s): %s\n", tokens,
                               absl::GetFlag(FLAGS_temperature) > 0
                                   ? absl::StrFormat("temperature %g, top-k %d",
                                                     absl::GetFlag(FLAGS_temperature),
                                                     absl::GetFlag(FLAGS_top_k))
                                   : std::string("greedy"),
                               text);
}

// Rank r's part of a multi-process trace.
std::string TracePartPath(const std::string& trace, int rank) {
  return absl::StrCat(trace, ".rank", rank);
}

// Rank 0, after every process closed its trace: the parts' events appended to the trace (one JSON
// array: each process's track under its rank's tid), the parts removed.
absl::Status MergeTraceParts(const std::string& trace, int processes) {
  auto read = [](const std::string& path) -> absl::StatusOr<nlohmann::json> {
    std::ifstream f(path);
    nlohmann::json j = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
    if (!f.is_open() || j.is_discarded() || !j.is_array()) {
      return absl::DataLossError(absl::StrCat("--trace: '", path, "' is not a trace to merge"));
    }
    return j;
  };
  absl::StatusOr<nlohmann::json> all = read(trace);
  if (!all.ok()) return all.status();
  for (int r = 1; r < processes; ++r) {
    absl::StatusOr<nlohmann::json> part = read(TracePartPath(trace, r));
    if (!part.ok()) return part.status();
    for (nlohmann::json& e : *part) all->push_back(std::move(e));
  }
  const std::string tmp = absl::StrCat(trace, ".tmp.", ::getpid());
  {
    std::ofstream out(tmp);
    out << all->dump() << "\n";
    if (!out) return absl::DataLossError(absl::StrCat("--trace: cannot write '", tmp, "'"));
  }
  if (std::rename(tmp.c_str(), trace.c_str()) != 0) {
    return absl::DataLossError(absl::StrCat("--trace: cannot replace '", trace, "'"));
  }
  for (int r = 1; r < processes; ++r) std::remove(TracePartPath(trace, r).c_str());
  return absl::OkStatus();
}

// The run's outputs as the flags ask: evaluation, periodic checkpoints, the trace.
class RunOutputs {
 public:
  // run: the run configuration every checkpoint carries (its id limits the rotation to it).
  RunOutputs(const Model& layout, const RankWorld& ranks, const RunConfig& run)
      : layout_(layout),
        ranks_(ranks),
        save_path_(absl::GetFlag(FLAGS_save)),
        rotation_{save_path_, absl::GetFlag(FLAGS_keep_last), run.id},
        run_metadata_(RunConfigMetadata(run)) {}

  // Checks the paths and settings before the first step and sets them in `o`.
  absl::Status Set(const TokenData& data, TrainOptions& o);
  absl::Status CloseTrace() { return writer_ != nullptr ? writer_->Close() : absl::OkStatus(); }
  // --save is written here after training (with the model's shape in its metadata); TrainGpt's
  // own save_path stays empty.
  absl::Status SaveFinal(const TrainResult& r) const;
  const std::string& save_path() const { return save_path_; }
  std::string trace_path() const { return writer_ != nullptr ? trace_path_ : ""; }

 private:
  absl::Status SetTrace(TrainOptions& o);
  absl::Status CheckNoOtherRuns() const;

  const Model& layout_;
  const RankWorld& ranks_;
  std::string save_path_;
  CheckpointRotation rotation_;  // periodic: atomic <prefix>.step<N>.safetensors, the last kept
  std::map<std::string, std::string> run_metadata_;
  std::string trace_path_;
  std::unique_ptr<TraceWriter> writer_;
  StepFilter trace_steps_;
  mutable bool overwrite_others_ = false;  // --overwrite with other runs' checkpoints present
};

absl::Status RunOutputs::Set(const TokenData& data, TrainOptions& o) {
  if (!save_path_.empty()) {
    if (absl::Status s = CheckSavePath(save_path_); !s.ok()) return s;
  }
  o.eval.tokens = data.val;  // evaluation on the held-out split
  o.eval.every = absl::GetFlag(FLAGS_eval_every);
  o.eval.steps = absl::GetFlag(FLAGS_eval_steps);
  if (o.eval.every > 0 && data.val.empty()) {
    return absl::InvalidArgumentError(
        "--eval_every needs validation data: add --val_fraction=0.1 or --val_data=FILE");
  }
  // Batch e of an evaluation reads tokens [e*B*T, (e+1)*B*T + 1) of the held-out split, wrapping
  // around its end: say so when the batches repeat tokens (the loss then weights them twice).
  const int64_t seq = layout_.shape().seq;
  const int64_t eval_tokens = o.eval.steps * o.batch * seq + 1;
  if (o.eval.every > 0 && ranks_.print && eval_tokens > static_cast<int64_t>(data.val.size())) {
    std::cout << absl::StrFormat(
        "note: --eval_steps %d x batch %d x seq %d reads %d validation tokens but the held-out "
        "split has %d: the evaluation batches wrap around and repeat tokens; lower "
        "--eval_steps or give more --val_fraction / --val_data\n",
        o.eval.steps, o.batch, seq, eval_tokens, data.val.size());
  }
  if (!save_path_.empty() && ranks_.print) {
    // Saves that were killed left <prefix>.step<N>.safetensors.tmp.<pid>: gone with this run.
    absl::StatusOr<std::vector<std::string>> removed = rotation_.RemoveStaleTemporaries();
    if (removed.ok() && !removed->empty()) {
      std::cout << "removed " << removed->size() << " temporary file"
                << (removed->size() == 1 ? "" : "s") << " of killed saves: "
                << absl::StrJoin(*removed, ", ") << "\n";
    }
  }
  o.checkpoint.save_every = absl::GetFlag(FLAGS_save_every);
  if (o.checkpoint.save_every > 0) {
    if (save_path_.empty()) {
      return absl::InvalidArgumentError(
          "--save_every needs --save (the prefix of the periodic checkpoints)");
    }
    if (absl::Status s = rotation_.Validate(); !s.ok()) return s;
    if (absl::Status s = rotation_.CheckWritable(); !s.ok()) return s;
    if (absl::Status s = CheckNoOtherRuns(); !s.ok()) return s;
    o.checkpoint.on_save = [this](const TrainResult& snapshot) -> absl::Status {
      if (ranks_.world != nullptr && ranks_.world->rank() != 0) return absl::OkStatus();
      absl::StatusOr<std::string> path =
          rotation_.Save(snapshot.steps_done, [&](const std::string& tmp) {
            return SaveGptWithConfig(tmp, layout_, snapshot.params, &snapshot.adam_state,
                                     snapshot.steps_done, run_metadata_);
          });
      if (!path.ok()) return path.status();
      if (ranks_.print) std::cout << "checkpoint: " << *path << "\n";
      if (!std::exchange(overwrite_others_, false)) return absl::OkStatus();
      absl::StatusOr<std::vector<std::string>> gone = rotation_.RemoveOtherRuns();
      if (!gone.ok()) return gone.status();
      if (ranks_.print && !gone->empty()) {
        std::cout << "--overwrite: removed " << gone->size() << " checkpoint"
                  << (gone->size() == 1 ? "" : "s") << " of other runs: "
                  << absl::StrJoin(*gone, ", ") << "\n";
      }
      return absl::OkStatus();
    };
  }
  return SetTrace(o);
}

// Periodic checkpoints of one run only under a prefix: another run's there are refused, or
// with --overwrite removed once this run has saved its first checkpoint (rank 0 removes them and
// names them; a run refused or failing before that removes nothing), so that --keep_last and
// --resume=auto never mix runs.
absl::Status RunOutputs::CheckNoOtherRuns() const {
  absl::StatusOr<std::vector<std::string>> others =
      OtherRunsCheckpoints(rotation_, *rotation_.run_id);
  if (!others.ok()) return others.status();
  if (others->empty()) return absl::OkStatus();
  if (!absl::GetFlag(FLAGS_overwrite)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--save '", save_path_, "' holds checkpoints of another run (", absl::StrJoin(*others, ", "),
        ") and this run (id ", *rotation_.run_id,
        ") would save beside them: continue that run with --resume=auto, choose another --save, "
        "or remove them with --overwrite"));
  }
  overwrite_others_ = true;  // removed after this run's first checkpoint, not before
  return absl::OkStatus();
}

// The trace: opened now (a bad path fails before training), written as the run goes.
// With a process per rank, each process writes its own track to a part file beside the trace
// (<trace>.rank<R>), on the machine's monotonic clock so the tracks line up; after training
// rank 0 merges them into the trace (MergeTraceParts), so one Perfetto file shows every rank.
absl::Status RunOutputs::SetTrace(TrainOptions& o) {
  trace_path_ = absl::GetFlag(FLAGS_trace);
  if (trace_path_.empty()) return absl::OkStatus();
  const bool processes = ranks_.world != nullptr && ranks_.world->size() > 1;
  if (!ranks_.print && !processes) return absl::OkStatus();
  absl::StatusOr<StepFilter> f = StepFilter::Parse(absl::GetFlag(FLAGS_trace_steps));
  if (!f.ok()) return f.status();
  trace_steps_ = *f;
  const std::string path =
      ranks_.print ? trace_path_ : TracePartPath(trace_path_, ranks_.world->rank());
  absl::StatusOr<std::unique_ptr<TraceWriter>> w =
      TraceWriter::Open(path, processes ? 0.0 : TraceNowUs());
  if (!w.ok()) return w.status();
  writer_ = *std::move(w);
  o.tracing.writer = writer_.get();
  o.tracing.step_filter = [this](int64_t step) { return trace_steps_.Contains(step); };
  return absl::OkStatus();
}

absl::Status RunOutputs::SaveFinal(const TrainResult& r) const {
  if (save_path_.empty() || (ranks_.world != nullptr && ranks_.world->rank() != 0)) {
    return absl::OkStatus();
  }
  const bool moments = r.adam_state.exp_avg.size() == layout_.params().size();
  return SaveGptWithConfig(save_path_, layout_, r.params, moments ? &r.adam_state : nullptr,
                           r.steps_done, run_metadata_);
}

// --plan: the planner's view of this run, printed before it.
absl::Status PrintPlan(const Model& layout) {
  planner::PlanCliOptions plan_cli;
  plan_cli.profile = absl::GetFlag(FLAGS_plan_profile);
  if (plan_cli.profile.empty() && absl::GetFlag(FLAGS_device) != "cpu") {
    plan_cli.profile = "h100_node";
  }
  absl::StatusOr<std::string> plan = planner::PlanForTrainRun(
      layout, absl::GetFlag(FLAGS_batch), absl::GetFlag(FLAGS_microbatches),
      absl::GetFlag(FLAGS_schedule), absl::GetFlag(FLAGS_virtual_stages), plan_cli);
  if (!plan.ok()) return plan.status();
  std::cout << *plan << std::endl;
  return absl::OkStatus();
}

absl::Status Run() {
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
  std::string resume, resume_note;
  if (absl::Status s = ResolveResume(&resume, &resume_note); !s.ok()) return s;
  const std::string shape_file = !resume.empty() ? resume : absl::GetFlag(FLAGS_init);
  const char* shape_flag = !resume.empty() ? "--resume" : "--init";
  if (absl::Status s = CheckFileModel(shape_file, shape_flag, model_name); !s.ok()) return s;
  if (gpt2) {
    if (absl::Status s = AdoptShapeFrom(shape_file, shape_flag, &*cfg, &resume_note); !s.ok()) {
      return s;
    }
  }
  absl::StatusOr<ResumedRun> run = ContinueOrStartRun(resume, &resume_note);
  if (!run.ok()) return run.status();
  absl::StatusOr<Mesh> mesh = ParseMesh(absl::GetFlag(FLAGS_mesh));
  if (!mesh.ok()) return mesh.status();
  absl::StatusOr<RankWorld> ranks = ConnectRanks(*mesh);
  if (!ranks.ok()) return ranks.status();
  const int processes = ranks->world != nullptr ? ranks->world->size() : 1;
  const std::string shape_source =
      shape_file.empty() ? "the model flags" : absl::StrCat("the checkpoint '", shape_file, "'");
  // Every model but GPT-2 is built by its registration (which bounds its shape); GPT-2's size is
  // checked before its layout is built.
  const ModelOnMesh remake = [&](const Mesh& m) -> absl::StatusOr<std::unique_ptr<Model>> {
    if (!gpt2) return CreateModel(model_name, args, m, absl::GetFlag(FLAGS_sp) && m.size() > 1);
    absl::StatusOr<GptLayout> l = GptLayout::Create(m, *cfg, absl::GetFlag(FLAGS_sp) && m.size() > 1);
    if (!l.ok()) return l.status();
    return std::unique_ptr<Model>(std::make_unique<GptLayout>(*std::move(l)));
  };
  if (gpt2) {
    const ModelShape s{.layers = cfg->layers, .d_model = cfg->d_model, .vocab = cfg->vocab,
                       .seq = cfg->seq, .dtype = cfg->dtype};
    if (absl::Status st = CheckFitsHost(GptParameterCount(*cfg), s, processes,
                                        shape_source);
        !st.ok()) {
      return st;
    }
  }
  absl::StatusOr<std::unique_ptr<Model>> made =
      gpt2 ? remake(*mesh) : CreateModel(model_name, args, *mesh, absl::GetFlag(FLAGS_sp));
  if (!made.ok()) return made.status();
  const std::unique_ptr<Model> layout = *std::move(made);
  if (!gpt2) {
    double params = 0;
    for (const ParamInfo& p : layout->params()) params += NumElements(p.global_shape);
    if (absl::Status st = CheckFitsHost(params, layout->shape(), processes, shape_source);
        !st.ok()) {
      return st;
    }
  }
  if (absl::Status s = CheckBatchFits(*layout, processes); !s.ok()) return s;
  if (absl::GetFlag(FLAGS_plan) && ranks->print) {
    if (absl::Status s = PrintPlan(*layout); !s.ok()) return s;
  }
  absl::StatusOr<std::unique_ptr<TextTokenizer>> tokenizer = LoadTokenizer(layout->shape());
  if (!tokenizer.ok()) return tokenizer.status();
  const TextTokenizer* tok = tokenizer->get();
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
  data_options.vocab = layout->shape().vocab;
  data_options.seq = layout->shape().seq;
  absl::StatusOr<TokenData> data = LoadTokenData(data_options);
  if (!data.ok()) return data.status();
  absl::StatusOr<RunConfig> run_config = DescribeRun(*run, resume, &resume_note);
  if (!run_config.ok()) return run_config.status();
  if (ranks->world != nullptr) {
    if (absl::Status s = AgreeOnSettings(*ranks->world, data->train); !s.ok()) return s;
  }
  TrainOptions o;
  o.checkpoint.init_path = absl::GetFlag(FLAGS_init);
  o.checkpoint.resume_path = resume;
  if (absl::Status s = SetOptimization(o); !s.ok()) return s;
  RunOutputs outputs(*layout, *ranks, *run_config);
  if (absl::Status s = outputs.Set(*data, o); !s.ok()) return s;
  absl::StatusOr<SampleRequest> sample = ParseSampleRequest(layout->shape(), tok);
  if (!sample.ok()) return sample.status();
  o.runtime.comm = ranks->world.get();
  o.runtime.placement = ranks->placement;
  o.runtime.cuda_graph = absl::GetFlag(FLAGS_cuda_graph);
  TypeTrace types;
  if (absl::GetFlag(FLAGS_print_types)) o.tracing.types = &types;
  if (absl::Status s = SetPipeline(o); !s.ok()) return s;
  if (absl::Status s = SetOverlap(o); !s.ok()) return s;
  if (absl::Status s = SetRecompute(o); !s.ok()) return s;
  if (ranks->print) {
    PrintHeader(*layout, *ranks, o, data->train.size());
    if (!resume_note.empty()) std::cout << resume_note << (resume_note.back() == '\n' ? "" : "\n");
  }
  StepPrinter printer(ranks->print, o.batch * layout->shape().seq, &types,
                      ranks->print ? MfuFor(*layout, *ranks) : MfuBasis{});
  o.hooks.on_step = [&printer](const StepInfo& s) { printer(s); };
  const std::vector<NamedTensor> init = o.checkpoint.init_path.empty() && o.checkpoint.resume_path.empty()
                                            ? layout->Init(absl::GetFlag(FLAGS_seed))
                                            : std::vector<NamedTensor>{};
  if (layout->pp_ways() > 1 || o.pipeline.microbatches != 1) {
    std::cout << absl::StrFormat("pipeline: pp=%d, %d microbatches of %d sequences, %s%s\n",
                                 layout->pp_ways(), o.pipeline.microbatches,
                                 o.pipeline.microbatches > 0 ? o.batch / o.pipeline.microbatches : 0,
                                 ScheduleName(*ParseSchedule(o.pipeline.schedule)),
                                 o.pipeline.virtual_stages > 1
                                     ? absl::StrCat(", ", o.pipeline.virtual_stages,
                                                    " model chunks per stage")
                                     : std::string());
  }
  absl::StatusOr<TrainResult> r = TrainGpt(*layout, init, data->train, o);
  if (absl::Status s = outputs.CloseTrace(); !s.ok() && r.ok()) return s;
  if (!r.ok()) return r.status();
  if (!outputs.trace_path().empty() && ranks->world != nullptr && ranks->world->size() > 1) {
    // Every process's part is closed once all pass the barrier; rank 0 merges them.
    if (absl::Status s = ranks->world->Barrier(); !s.ok()) return s;
    if (ranks->print) {
      if (absl::Status s = MergeTraceParts(outputs.trace_path(), ranks->world->size()); !s.ok()) {
        return s;
      }
    }
  }
  if (absl::Status s = outputs.SaveFinal(*r); !s.ok()) return s;
  std::vector<int64_t> sampled;
  if (sample->tokens > 0) {
    absl::StatusOr<std::vector<int64_t>> out = Sample(*layout, remake, *ranks, *r, *sample);
    if (!out.ok()) return out.status();
    sampled = *std::move(out);
  }
  if (!ranks->print) return absl::OkStatus();
  PrintSummary(*layout, o, *r, printer, outputs.trace_path(), outputs.save_path());
  if (sample->tokens > 0) PrintSample(sampled, sample->tokens, tok);
  return absl::OkStatus();
}

int Main() {
  if (absl::Status s = Run(); !s.ok()) return Fail(s);
  return 0;
}

}  // namespace
}  // namespace shardmap

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "trains GPT-2 with data / fully sharded / hybrid / tensor / sequence / context / expert "
      "parallelism on simulated CPU devices or GPUs (--device=cuda). Example: train_gpt --mesh=dp=2,tp=2 --sp --text=FILE");
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  const std::string invoked = argc > 0 ? argv[0] : "train";
  shardmap::ProgramName() = invoked.substr(invoked.rfind('/') + 1);
  const std::string& name = shardmap::ProgramName();
  if (rest.size() > 1) {
    std::cerr << name << ": unexpected argument '" << rest[1] << "' (flags are --name=value)\n";
    return 2;
  }
  if (absl::GetFlag(FLAGS_deterministic)) shardmap::cuda::SetDeterministic(true);
  // GPU ops' index checks are read with the step's loss, not one host sync per op (a bad token
  // id still stops the run, naming the op).
  shardmap::cuda::SetDeferredIndexChecks(true);
  // Whatever escapes the run is said, not an abort ("terminate called after throwing ...").
  try {
    return shardmap::Main();
  } catch (const shardmap::OpError& e) {
    std::cerr << name << ": " << e.status().message() << "\n";
  } catch (const std::bad_alloc&) {
    std::cerr << name << ": out of memory (std::bad_alloc); use a smaller model, batch or seq\n";
  } catch (const std::exception& e) {
    std::cerr << name << ": internal error: " << e.what() << "\n";
  }
  return 2;
}
