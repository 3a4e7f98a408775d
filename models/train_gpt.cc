// train_gpt: trains GPT-2 (models/gpt.h) on simulated CPU devices or GPUs (--device=cuda: one
// rank per GPU, or virtual ranks sharing one; --backend=nccl: a process per GPU) with any mix
// of data, fully sharded, hybrid sharded, tensor, sequence and context parallelism (ring
// attention over cp), and mixture-of-experts MLPs with expert parallelism (--experts,
// --mesh=ep=2,...), inside one SPMD program; with a pp axis, pipeline parallelism (the
// trainer's pipeline strategy, models/trainer.h): --mesh=pp=2,dp=2 --microbatches=4
// --schedule=1f1b (or gpipe).
//
//   bazel run -c opt //models:train_gpt -- --mesh=dp=2,tp=2 --sp
//       --text=/usr/share/common-licenses/GPL-3 --layers=2 --d_model=64 --heads=4 --seq=64
//       --batch=8 --steps=50 --lr=3e-3 --trace=/tmp/trace.json      (one command line)
//
// Batches: sample b of step s is tokens [(s*B+b)*T, (s*B+b)*T+T+1) of the data, wrapping around
// (B = --batch, T = --seq): independent of the mesh, so any layout (or a PyTorch script) sees the
// same batches. Each step prints "step N loss X" (10 significant digits), ms/step, tokens/s and
// the bytes rank 0 communicated per collective kind; a summary follows the last step.
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <algorithm>
#include <functional>
#include <map>
#include <utility>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "collectives/gloo_communicator.h"
#include "collectives/nccl_communicator.h"
#include "models/gpt.h"
#include "models/gpt_trace.h"
#include "models/pipeline.h"
#include "nlohmann/json.hpp"
#include "shardmap/context.h"
#include "shardmap/device_placement.h"
#include "tensor/cuda/runtime.h"

ABSL_FLAG(std::string, mesh, "", "mesh axes, e.g. dp=2,tp=2 or pp=2,dp=2 or ep=2 (axes pp, dp, dp_replicate, dp_shard, ep, cp, tp)");
ABSL_FLAG(int64_t, microbatches, 1, "pipeline microbatches per step (batch must divide by microbatches x dp)");
ABSL_FLAG(std::string, schedule, "1f1b", "pipeline schedule: gpipe or 1f1b");
ABSL_FLAG(std::string, stage_layers, "", "layers per pipeline stage, e.g. 2,1,1 (default: as even as possible)");
ABSL_FLAG(bool, sp, false, "sequence parallelism (needs a tp axis)");
ABSL_FLAG(std::string, devices, "", "cpu:N simulated ranks (default: the mesh size)");
ABSL_FLAG(std::string, backend, "inprocess",
          "inprocess (every rank a thread of this process), gloo (one process per rank over "
          "Gloo/TCP) or nccl (one process per GPU, with --device=cuda); gloo and nccl are "
          "started by collectives/launch --nproc_per_node=<mesh size>, torchrun or srun; rank 0 "
          "prints");
ABSL_FLAG(std::string, device, "cpu",
          "cpu or cuda. cuda in-process: one rank per GPU when this process sees at least as "
          "many GPUs as the mesh has ranks, else every rank a virtual rank on GPU 0 (a stream "
          "each); --gpu_ranks overrides. cuda with --backend=nccl: each process on GPU "
          "LOCAL_RANK");
ABSL_FLAG(std::string, gpu_ranks, "auto",
          "--device=cuda in-process: auto, shared (every rank on GPU 0) or per_gpu (rank r on "
          "GPU r)");
ABSL_FLAG(bool, cuda_graph, true,
          "GPU: capture the static step once and replay it as a CUDA graph where safe (the "
          "summary says whether it was, and why not)");
ABSL_FLAG(int64_t, layers, 2, "transformer blocks");
ABSL_FLAG(int64_t, d_model, 64, "model width");
ABSL_FLAG(int64_t, heads, 4, "attention heads");
ABSL_FLAG(int64_t, vocab, 256, "vocabulary size (256 for --text)");
ABSL_FLAG(int64_t, seq, 64, "tokens per sequence");
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
ABSL_FLAG(std::string, dtype, "f32",
          "f32, f64, or bf16 (mixed precision: f32 master weights, gradients and AdamW state; "
          "bf16 activations, matmuls and tensor-parallel collectives; f32 loss)");
ABSL_FLAG(std::string, data, "", "uint16 token ids (nanoGPT's train.bin layout)");
ABSL_FLAG(std::string, text, "", "a text file; its bytes are the tokens (vocab 256)");
ABSL_FLAG(std::string, init, "", "GPT-2 safetensors file to start from");
ABSL_FLAG(std::string, save, "", "write parameters and AdamW state here (safetensors) at the end");
ABSL_FLAG(std::string, resume, "",
          "continue from a file written with --save (parameters, AdamW state, step) up to "
          "--steps; not with --init");
ABSL_FLAG(std::string, trace, "", "write a Chrome trace-event JSON (open it in Perfetto)");
ABSL_FLAG(int64_t, experts, 0, "mixture of experts: experts per MoE MLP (0: dense MLP)");
ABSL_FLAG(int64_t, topk, 1, "MoE: experts each token is routed to");
ABSL_FLAG(double, capacity, 1.25,
          "MoE capacity factor: slots per expert and sequence = ceil(factor * seq * topk / experts)");
ABSL_FLAG(double, aux_loss_coef, 0.01, "MoE: weight of the Switch load-balancing loss");
ABSL_FLAG(std::string, expert_axes, "",
          "MoE: comma-separated batch axes the experts are split over (default: ep when the mesh "
          "has it), e.g. dp or dp_shard,ep");
ABSL_FLAG(bool, print_types, false, "print the per-device SPMD types inside block 0");

namespace shardmap {
namespace {

absl::StatusOr<std::vector<int64_t>> LoadTokens(const std::string& data, const std::string& text) {
  if (data.empty() == text.empty()) {
    return absl::InvalidArgumentError("give exactly one of --data FILE or --text FILE");
  }
  const std::string& path = data.empty() ? text : data;
  const char* flag = data.empty() ? "--text" : "--data";
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat("cannot read ", flag, " '", path, "': ",
                                            std::strerror(errno)));
  }
  if (S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " '", path, "' is a directory; name a file"));
  }
  std::ifstream f(path, std::ios::binary);
  if (!f) return absl::NotFoundError(absl::StrCat("cannot read ", flag, " '", path, "'"));
  std::string bytes;
  char buf[1 << 16];
  while (f.read(buf, sizeof(buf)) || f.gcount() > 0) bytes.append(buf, f.gcount());
  if (f.bad()) {
    return absl::DataLossError(absl::StrCat("reading ", flag, " '", path, "' failed"));
  }
  std::vector<int64_t> tokens;
  if (!text.empty()) {
    for (unsigned char c : bytes) tokens.push_back(c);
  } else {
    if (bytes.size() % 2 != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--data '", path, "' has ", bytes.size(), " bytes: not a whole number of uint16 ids"));
    }
    for (size_t i = 0; i < bytes.size(); i += 2) {
      tokens.push_back(static_cast<unsigned char>(bytes[i]) |
                       (static_cast<int64_t>(static_cast<unsigned char>(bytes[i + 1])) << 8));
    }
  }
  return tokens;
}

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
    if (n == "save" || n == "trace" || n == "data" || n == "text") continue;  // paths
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
  if (absl::Status s = world.AllGather(mine.data(), all.data(), n, collectives::DataType::kI64);
      !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("agreeing on the run's settings: ", s.message()));
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

std::string Bytes(int64_t b) {
  if (b >= (1 << 20)) return absl::StrFormat("%.1f MiB", b / 1048576.0);
  if (b >= (1 << 10)) return absl::StrFormat("%.1f KiB", b / 1024.0);
  return absl::StrCat(b, " B");
}

int Fail(const absl::Status& s) {
  std::cerr << "train_gpt: " << s.message() << "\n";
  return 2;
}

int Main() {
  GptConfig cfg;
  cfg.layers = absl::GetFlag(FLAGS_layers);
  cfg.d_model = absl::GetFlag(FLAGS_d_model);
  cfg.heads = absl::GetFlag(FLAGS_heads);
  cfg.vocab = absl::GetFlag(FLAGS_vocab);
  cfg.seq = absl::GetFlag(FLAGS_seq);
  const std::string dtype = absl::GetFlag(FLAGS_dtype);
  if (dtype == "f32") {
    cfg.dtype = DType::kF32;
  } else if (dtype == "f64") {
    cfg.dtype = DType::kF64;
  } else if (dtype == "bf16") {
    cfg.dtype = DType::kF32;  // master weights
    cfg.compute = DType::kBF16;
  } else {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("--dtype ", dtype, ": use f32, f64 or bf16 (mixed precision)")));
  }
  cfg.moe.experts = absl::GetFlag(FLAGS_experts);
  cfg.moe.topk = absl::GetFlag(FLAGS_topk);
  cfg.moe.capacity_factor = absl::GetFlag(FLAGS_capacity);
  cfg.moe.aux_loss_coef = absl::GetFlag(FLAGS_aux_loss_coef);
  for (absl::string_view a :
       absl::StrSplit(absl::GetFlag(FLAGS_expert_axes), ',', absl::SkipWhitespace())) {
    cfg.moe.expert_axes.emplace_back(a);
  }
  absl::StatusOr<Mesh> mesh = ParseMesh(absl::GetFlag(FLAGS_mesh));
  if (!mesh.ok()) return Fail(mesh.status());
  const std::string devices = absl::GetFlag(FLAGS_devices);
  if (!devices.empty()) {
    int n = 0;
    if (!absl::StartsWith(devices, "cpu:") || !absl::SimpleAtoi(devices.substr(4), &n)) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat("--devices ", devices, ": write cpu:N (simulated CPU ranks)")));
    }
    if (n != mesh->size()) {
      return Fail(absl::InvalidArgumentError(absl::StrCat(
          "--devices cpu:", n, " but the mesh ", mesh->ShortString(), " has ", mesh->size(),
          " ranks; make them equal (or leave --devices out)")));
    }
  }
  // --backend=gloo: this process is one rank of the launcher's world.
  std::unique_ptr<collectives::Communicator> world;
  const std::string backend = absl::GetFlag(FLAGS_backend);
  if (backend == "gloo") {
    absl::StatusOr<std::unique_ptr<collectives::Communicator>> c =
        collectives::CreateGlooCommunicatorFromEnv({});
    if (!c.ok()) {
      return Fail(absl::Status(c.status().code(),
                               absl::StrCat("--backend=gloo: ", c.status().message(),
                                            " (start it with collectives/launch "
                                            "--nproc_per_node=", mesh->size(), " -- train_gpt ...)")));
    }
    world = *std::move(c);
    if (world->size() != mesh->size()) {
      return Fail(absl::InvalidArgumentError(absl::StrCat(
          "--backend=gloo: the world has ", world->size(), " processes but the mesh ",
          mesh->ShortString(), " has ", mesh->size(), " ranks; launch ", mesh->size(),
          " processes")));
    }
  } else if (backend == "nccl") {
    if (absl::GetFlag(FLAGS_device) != "cuda") {
      return Fail(absl::InvalidArgumentError(
          "--backend=nccl runs each process on a GPU: add --device=cuda"));
    }
    absl::StatusOr<std::unique_ptr<collectives::Communicator>> c =
        collectives::CreateNcclCommunicatorFromEnv({});
    if (!c.ok()) {
      return Fail(absl::Status(c.status().code(),
                               absl::StrCat("--backend=nccl: ", c.status().message(),
                                            " (start it with collectives/launch "
                                            "--nproc_per_node=", mesh->size(), " -- train_gpt ...)")));
    }
    world = *std::move(c);
    if (world->size() != mesh->size()) {
      return Fail(absl::InvalidArgumentError(absl::StrCat(
          "--backend=nccl: the world has ", world->size(), " processes but the mesh ",
          mesh->ShortString(), " has ", mesh->size(), " ranks; launch ", mesh->size(),
          " processes")));
    }
  } else if (backend != "inprocess") {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("--backend ", backend, ": use inprocess, gloo or nccl")));
  }
  // --device: where the in-process ranks run.
  DevicePlacement placement;
  const std::string device = absl::GetFlag(FLAGS_device);
  const std::string gpu_ranks = absl::GetFlag(FLAGS_gpu_ranks);
  if (device != "cpu" && device != "cuda") {
    return Fail(absl::InvalidArgumentError(absl::StrCat("--device ", device, ": use cpu or cuda")));
  }
  if (gpu_ranks != "auto" && gpu_ranks != "shared" && gpu_ranks != "per_gpu") {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("--gpu_ranks ", gpu_ranks, ": use auto, shared or per_gpu")));
  }
  if (device == "cuda" && backend == "gloo") {
    return Fail(absl::InvalidArgumentError(
        "--backend=gloo runs on CPU memory: use --backend=nccl with --device=cuda"));
  }
  if (device == "cuda" && world == nullptr) {
    if (!cuda::Available()) {
      return Fail(absl::FailedPreconditionError(absl::StrCat(
          "--device=cuda: no usable GPU (", cuda::UnavailableReason(),
          "); use --device=cpu")));
    }
    const bool per_gpu = gpu_ranks == "per_gpu" ||
                         (gpu_ranks == "auto" && cuda::DeviceCount() >= mesh->size());
    placement = per_gpu ? DevicePlacement::GpuPerRank() : DevicePlacement::SharedGpu(0);
  } else if (device == "cpu" && gpu_ranks != "auto") {
    return Fail(absl::InvalidArgumentError("--gpu_ranks needs --device=cuda"));
  }
  // Rank 0 prints (every process of a gloo run sees the same losses).
  const bool print = world == nullptr || world->rank() == 0;
  absl::StatusOr<GptLayout> layout = GptLayout::Create(*mesh, cfg, absl::GetFlag(FLAGS_sp));
  if (!layout.ok()) return Fail(layout.status());
  absl::StatusOr<std::vector<int64_t>> tokens =
      LoadTokens(absl::GetFlag(FLAGS_data), absl::GetFlag(FLAGS_text));
  if (!tokens.ok()) return Fail(tokens.status());
  if (world != nullptr) {
    if (absl::Status s = AgreeOnSettings(*world, *tokens); !s.ok()) return Fail(s);
  }

  TrainOptions o;
  o.steps = absl::GetFlag(FLAGS_steps);
  o.batch = absl::GetFlag(FLAGS_batch);
  o.adamw.lr = absl::GetFlag(FLAGS_lr);
  o.adamw.beta1 = absl::GetFlag(FLAGS_beta1);
  o.adamw.beta2 = absl::GetFlag(FLAGS_beta2);
  o.adamw.eps = absl::GetFlag(FLAGS_eps);
  o.adamw.weight_decay = absl::GetFlag(FLAGS_weight_decay);
  o.clip = absl::GetFlag(FLAGS_clip);
  o.init_path = absl::GetFlag(FLAGS_init);
  o.resume_path = absl::GetFlag(FLAGS_resume);
  o.save_path = absl::GetFlag(FLAGS_save);
  o.trace = !absl::GetFlag(FLAGS_trace).empty();
  o.comm = world.get();
  o.placement = placement;
  o.cuda_graph = absl::GetFlag(FLAGS_cuda_graph);
  TypeTrace types;
  if (absl::GetFlag(FLAGS_print_types)) o.types = &types;
  o.microbatches = absl::GetFlag(FLAGS_microbatches);
  o.schedule = absl::GetFlag(FLAGS_schedule);
  absl::StatusOr<Schedule> schedule = ParseSchedule(o.schedule);
  if (!schedule.ok()) return Fail(schedule.status());
  for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_stage_layers), ',',
                                               absl::SkipEmpty())) {
    int64_t n = 0;
    if (!absl::SimpleAtoi(part, &n)) {
      return Fail(absl::InvalidArgumentError(absl::StrCat(
          "--stage_layers: '", part, "' is not a number (e.g. --stage_layers=2,1,1)")));
    }
    o.stage_layers.push_back(n);
  }
  const bool pipelined = layout->pp_ways() > 1 || o.microbatches != 1;

  int64_t params = 0;
  for (const ParamInfo& p : layout->params()) params += NumElements(p.global_shape);
  if (print) std::cout << absl::StrFormat(
      "GPT-2: %d layers, d_model %d, %d heads, vocab %d, seq %d, %.2fM parameters, %s\n"
      "mesh %s%s%s on %d %s; global batch %d x %d tokens; %d tokens of data\n",
      cfg.layers, cfg.d_model, cfg.heads, cfg.vocab, cfg.seq, params / 1e6,
      cfg.compute.has_value() ? absl::StrCat(dtype, " compute, f32 master weights") : dtype,
      mesh->ShortString(), layout->tp().sp ? " + sequence parallel" : "",
      layout->cp_axis().empty() ? "" : " (cp: ring attention, load-balanced chunks)", mesh->size(),
      world != nullptr ? absl::StrCat("processes (", backend, ")")
      : placement.kind == DevicePlacement::Kind::kSharedGpu
          ? "virtual ranks sharing cuda:0 (a stream each)"
      : placement.kind == DevicePlacement::Kind::kGpuPerRank ? "GPUs (one rank each)"
                                                             : "simulated CPU devices",
      o.batch,
      cfg.seq, tokens->size());
  if (cfg.moe.on()) {
    const MoeConfig& m = layout->config().moe;
    std::cout << absl::StrFormat(
        "MoE MLPs: %d experts, top-%d, capacity %d per expert and sequence (factor %g), aux loss "
        "coef %g, experts split over %s\n",
        m.experts, m.topk, MoeCapacity(m.capacity_factor, cfg.seq, m.topk, m.experts),
        m.capacity_factor, m.aux_loss_coef,
        m.expert_axes.empty() ? std::string("no axis (all experts on every device)")
                              : absl::StrJoin(m.expert_axes, " x "));
  }
  const int64_t tokens_per_step = o.batch * cfg.seq;
  double total_s = 0;
  std::map<std::string, int64_t> total_bytes;
  o.on_step = [&](const StepInfo& s) {
    if (!print) return;
    if (!types.empty()) {  // recorded during the first step
      std::cout << "per-device SPMD types inside block 0 (rank 0):\n";
      for (const auto& [name, type] : types) {
        std::cout << absl::StrFormat("  %-52s %s\n", name, type);
      }
      types.clear();
    }
    std::map<std::string, int64_t> bytes;
    for (const CollectiveRecord& r : *s.log) bytes[r.op] += r.bytes;
    std::string comm;
    for (const auto& [op, b] : bytes) {
      absl::StrAppend(&comm, comm.empty() ? "" : ", ", op, " ", Bytes(b));
      total_bytes[op] += b;
    }
    total_s += s.seconds;
    std::string moe;
    if (s.moe_dropped >= 0) {
      moe = absl::StrFormat(" | MoE dropped %d of %d assignments (%.1f%%), %d tokens lost all",
                            s.moe_dropped, s.moe_assignments,
                            100.0 * s.moe_dropped / s.moe_assignments, s.moe_dropped_tokens);
    }
    const std::string mem =
        s.peak_device_bytes >= 0 ? absl::StrCat(" | peak GPU memory ", Bytes(s.peak_device_bytes))
                                 : "";
    std::cout << absl::StrFormat("step %d loss %.10g | %.1f ms/step | %.0f tokens/s | %s%s%s\n",
                                 s.step, s.loss, s.seconds * 1e3, tokens_per_step / s.seconds,
                                 comm.empty() ? "no communication" : comm, moe, mem);
    std::cout.flush();
  };
  const std::vector<NamedTensor> init = o.init_path.empty() && o.resume_path.empty()
                                            ? InitGpt(cfg, absl::GetFlag(FLAGS_seed))
                                            : std::vector<NamedTensor>{};
  if (pipelined) {
    std::cout << absl::StrFormat("pipeline: pp=%d, %d microbatches of %d sequences, %s\n",
                                 layout->pp_ways(), o.microbatches,
                                 o.microbatches > 0 ? o.batch / o.microbatches : 0,
                                 ScheduleName(*schedule));
  }
  absl::StatusOr<TrainResult> r = TrainGpt(*layout, init, *tokens, o);
  if (!r.ok()) return Fail(r.status());
  if (!print) return 0;
  std::string comm;
  for (const auto& [op, b] : total_bytes) absl::StrAppend(&comm, comm.empty() ? "" : ", ", op, " ", Bytes(b));
  std::cout << absl::StrFormat(
      "summary: %d steps, loss %.10g -> %.10g, %.1f ms/step, %.0f tokens/s; per rank: "
      "parameters %s, gradients + AdamW moments %s, activations %s (largest %s); rank 0 sent "
      "%s\n",
      r->losses.size(), r->losses.front(), r->losses.back(), total_s * 1e3 / r->losses.size(),
      tokens_per_step * r->losses.size() / total_s, Bytes(r->param_bytes_per_rank),
      Bytes(r->optimizer_bytes_per_rank), Bytes(r->activation_bytes_per_rank),
      Bytes(r->largest_activation_bytes), comm.empty() ? "nothing" : comm);
  if (r->peak_device_bytes_per_rank >= 0) {
    std::cout << absl::StrFormat("GPU: peak memory %s on %s%s; CUDA graph: %s\n",
                                 Bytes(r->peak_device_bytes_per_rank), r->device,
                                 r->ranks_per_device > 1
                                     ? absl::StrCat(" (shared by ", r->ranks_per_device,
                                                    " virtual ranks)")
                                     : std::string(" (per rank)"),
                                 r->cuda_graph_used ? "used" : r->cuda_graph_note);
  }
  if (pipelined) {
    const int p = layout->pp_ways();
    std::cout << absl::StrFormat(
        "pipeline: peak saved activations (rank 0) %s; bubble measured %.3f (lockstep ticks: "
        "(p-1)/(m+p-1) = %.3f)\n",
        Bytes(r->peak_activation_bytes_per_rank), r->pipeline_bubble,
        static_cast<double>(p - 1) / static_cast<double>(o.microbatches + p - 1));
  }
  if (o.trace) {
    if (absl::Status s = WriteTrace(absl::GetFlag(FLAGS_trace), *mesh, r->trace); !s.ok()) {
      return Fail(s);
    }
    std::cout << "trace: " << absl::GetFlag(FLAGS_trace) << " (open in https://ui.perfetto.dev)\n";
  }
  if (!o.save_path.empty()) std::cout << "saved: " << o.save_path << "\n";
  return 0;
}

}  // namespace
}  // namespace shardmap

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "trains GPT-2 with data / fully sharded / hybrid / tensor / sequence / context / expert "
      "parallelism on simulated CPU devices or GPUs (--device=cuda). Example: train_gpt --mesh=dp=2,tp=2 --sp --text=FILE");
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (rest.size() > 1) {
    std::cerr << "train_gpt: unexpected argument '" << rest[1] << "' (flags are --name=value)\n";
    return 2;
  }
  return shardmap::Main();
}
