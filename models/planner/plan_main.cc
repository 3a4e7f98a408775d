// plan (alias plan_gpt): which parallelism to use for a registered model (--model=gpt2|llama3,
// --preset a named shape) on N GPUs. Enumerates the meshes that divide the problem (dp / FSDP /
// HSDP, tp with and without SP, pp with each schedule and microbatch count, cp, ep), runs one
// shape-only step of the model per rank role of each (models/train/gpt_shape_only.h), predicts
// its step time on a hardware profile (models/planner/cost_model.h), and prints them ranked with
// tokens/s, MFU, memory, collectives and bubble, and every refused mesh with its reason.
//
//   bazel run //models/planner:plan -- --model=llama3 --preset=llama3_8b --gpus=8 --batch=16
//   bazel run //models/planner:plan -- --layers=48 --d_model=1600 --heads=25 --vocab=50257
//       --seq=1024 --batch=512 --gpus=8 --profile=h200_node        (one command)
//   bazel run //models/planner:plan -- --model=gpt2 --gpus=4 --profile=measure   # this CPU
//   bazel run //models/planner:plan_gpt -- --model=7b --gpus=64 --mesh="dp_shard=8,tp=8 +sp"
//
// plan_gpt's --model named a GPT-2 shape (gpt2, gpt2-xl, 7b, 70b, custom): those names still
// work (with a note), as GPT-2 of that shape; --preset names the registry's presets.
//
// Docs: docs/planner.md.
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "base/command_line.h"
#include "models/train/overlap_flags.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "models/gpt/gpt_flags.h"
#include "models/model/registry.h"
#include "models/planner/plan_cli.h"

ABSL_FLAG(std::string, model, "gpt2",
          "the model, by its registered name: gpt2 or llama3 (plan_gpt's shape names gpt2-xl, "
          "7b, 70b and custom still mean GPT-2 of that shape)");
ABSL_FLAG(std::string, preset, "",
          "a named shape of --model (gpt2: gpt2, gpt2-medium, gpt2-large, gpt2-xl; llama3: "
          "llama3_debug, llama3_8b, llama3_70b, llama3_405b); shape flags given explicitly "
          "override the preset's");
SHARDMAP_GPT_CONFIG_FLAGS(/*layers=*/12, /*d_model=*/768, /*heads=*/12, /*vocab=*/50304,
                          /*seq=*/1024, /*dtype=*/"bf16");
ABSL_FLAG(int64_t, kv_heads, 0,
          "llama3: key/value heads of grouped-query attention (0: the preset's, else --heads)");
ABSL_FLAG(int64_t, ffn_dim, 0,
          "llama3: the SwiGLU MLP's width (0: the preset's, else Llama 3's rule from --d_model)");
ABSL_FLAG(double, rope_theta, 0, "llama3: the rotary embedding's base (0: the preset's)");
ABSL_FLAG(double, norm_eps, 0, "llama3: RMSNorm's eps (0: the preset's)");
ABSL_FLAG(int64_t, batch, 512, "global batch (sequences per optimizer step)");
ABSL_FLAG(int, gpus, 8, "number of GPUs (or simulated ranks with --profile=measure)");
ABSL_FLAG(int, gpus_per_node, 0, "GPUs per node (0: the profile's)");
ABSL_FLAG(std::string, profile, "h100_node",
          "hardware profile: a100_node, h100_node, h200_node, a profile file (models/planner/"
          "hardware_profile.h's format), or 'measure' (this CPU, measured now)");
ABSL_FLAG(std::string, tp_bench_profile, "",
          "a `tp_bench --device=cuda --profile_out=FILE` file: its GEMM rates (and intra-node "
          "link) replace the profile's");
ABSL_FLAG(std::string, collectives_bench, "",
          "collectives_bench --benchmark_format=json output: fitted in-process collective costs");
ABSL_FLAG(bool, tp_across_nodes, false, "allow tp groups larger than a node");
ABSL_FLAG(int, max_pp, 0, "largest pipeline size to enumerate (0: any)");
ABSL_FLAG(int, max_cp, 0, "largest context-parallel size to enumerate (0: any)");
ABSL_FLAG(std::string, schedules, "1f1b,gpipe,interleaved_1f1b", "pipeline schedules to try");
ABSL_FLAG(std::string, virtual_stages, "2,4",
          "model chunks per stage to try with interleaved_1f1b (those that split the layers)");
ABSL_FLAG(std::string, recompute, "none,selective,full",
          "activation recomputation settings to try per mesh (the fastest that fits is shown)");
ABSL_FLAG(std::string, recompute_memory, "measured",
          "a recomputing mesh's memory: measured (a shape-only step with the trainer's own "
          "--recompute: what this framework keeps) or estimate (Korthikanti et al.'s accounting, "
          "what Megatron-LM keeps)");
ABSL_FLAG(std::string, reshard_after_forward, "true,false",
          "FSDP meshes: reshard_after_forward settings to try (false shows as 'keep')");
ABSL_FLAG(std::string, data_parallel, "dp,fsdp,hsdp",
          "data-parallel forms to enumerate: dp (DDP), fsdp (dp_shard), hsdp "
          "(dp_replicate x dp_shard)");
ABSL_FLAG(std::string, sp, "both",
          "with tp: 'both' (with and without sequence parallelism), 'on' (SP only) or 'off' "
          "(never SP)");
// --overlap, --bucket_mb, --fsdp_prefetch: models/train/overlap_flags.h (the trainer's own flags).
ABSL_FLAG(std::string, microbatch_factors, "1,2,4,8", "microbatches = pp x each of these");
ABSL_FLAG(std::string, mesh, "",
          "only these meshes, ';'-separated, each 'axes [+sp] [schedule/mMICROBATCHES] "
          "[gaMICROSTEPS]' (parts separated by spaces or ':'), e.g. "
          "\"dp_shard=8,tp=8 +sp;pp=4,dp_shard=16 1f1b/m16\"");
ABSL_FLAG(std::string, attention, "auto",
          "the attention the shape-only steps run and the plan prices: flash (the fused kernel, "
          "no [b, heads, t, t] scores kept; head_dim <= 128), materialised (einsum scores, e.g. "
          "Megatron-LM in 2021), or auto (flash on a GPU profile where head_dim <= 128, else "
          "materialised). Replaces the SHARDMAP_ATTENTION environment variable for the planner");
ABSL_FLAG(std::string, shape_only_device, "meta",
          "where the shape-only steps run: meta (nothing computed) or cpu (real ops on zeros: "
          "small models only)");
ABSL_FLAG(bool, reuse_profiles, true,
          "price many microbatches from two short shape-only steps and a pipeline's middle "
          "stages from three (exact: docs/planner.md); false: every mesh's and stage's own step");
ABSL_FLAG(double, time_limit, 0,
          "seconds the search may take (0: no limit): past it, the meshes not yet priced are "
          "left out and the best of those priced is printed (progress and the best so far go to "
          "stderr meanwhile)");
ABSL_FLAG(int, top, 20, "ranked rows to print (0: all)");
ABSL_FLAG(bool, refused, true, "list the refused meshes with their reasons");
ABSL_FLAG(std::string, print_profile, "",
          "write the resolved hardware profile to this file (e.g. with --profile=measure) and go on");

namespace shardmap {
namespace {

// "plan" or "plan_gpt": the name the binary was run by, in its messages.
std::string* program = new std::string("plan");

int Fail(const absl::Status& s) {
  std::cerr << *program << ": " << s.message() << "\n";
  return 2;
}

absl::StatusOr<std::vector<int>> Ints(const std::string& flag, const std::string& text) {
  std::vector<int> out;
  for (absl::string_view p : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    int v = 0;
    if (!absl::SimpleAtoi(p, &v) || v < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, ": '", p, "' is not a positive integer (e.g. 1,2,4)"));
    }
    out.push_back(v);
  }
  if (out.empty()) return absl::InvalidArgumentError(absl::StrCat("--", flag, " is empty"));
  return out;
}

bool Explicit(const char* name);

// The search's flags: schedules, microbatch factors, chunks, recomputation, reshard, the
// data-parallel forms, SP, and the overlapped step's settings.
absl::Status SetSearchFlags(planner::PlanRequest& req) {
  req.schedules.clear();
  for (absl::string_view s :
       absl::StrSplit(absl::GetFlag(FLAGS_schedules), ',', absl::SkipWhitespace())) {
    if (s != "1f1b" && s != "gpipe" && s != "interleaved_1f1b") {
      return (absl::InvalidArgumentError(absl::StrCat(
          "--schedules: unknown schedule '", s, "' (1f1b, gpipe, interleaved_1f1b)")));
    }
    req.schedules.emplace_back(s);
  }
  if (req.schedules.empty()) return (absl::InvalidArgumentError("--schedules is empty"));
  absl::StatusOr<std::vector<int>> factors =
      Ints("microbatch_factors", absl::GetFlag(FLAGS_microbatch_factors));
  if (!factors.ok()) return (factors.status());
  req.microbatch_factors = *factors;
  absl::StatusOr<std::vector<int>> chunks =
      Ints("virtual_stages", absl::GetFlag(FLAGS_virtual_stages));
  if (!chunks.ok()) return (chunks.status());
  req.virtual_stages = *chunks;
  req.recompute.clear();
  for (absl::string_view r :
       absl::StrSplit(absl::GetFlag(FLAGS_recompute), ',', absl::SkipWhitespace())) {
    absl::StatusOr<planner::Recompute> mode = planner::ParseRecompute(std::string(r));
    if (!mode.ok()) return (absl::InvalidArgumentError(absl::StrCat("--", mode.status().message())));
    req.recompute.push_back(*mode);
  }
  if (req.recompute.empty()) return (absl::InvalidArgumentError("--recompute is empty"));
  const std::string memory = absl::GetFlag(FLAGS_recompute_memory);
  if (memory != "measured" && memory != "estimate") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--recompute_memory='", memory, "': use measured (this framework's trainer) or estimate "
        "(Korthikanti et al.'s accounting, e.g. to price Megatron-LM's runs)"));
  }
  req.measure_recompute = memory == "measured";
  req.reshard_after_forward.clear();
  for (absl::string_view r : absl::StrSplit(absl::GetFlag(FLAGS_reshard_after_forward), ',',
                                            absl::SkipWhitespace())) {
    if (r != "true" && r != "false") {
      return (absl::InvalidArgumentError(absl::StrCat(
          "--reshard_after_forward: '", r, "' is neither true nor false")));
    }
    req.reshard_after_forward.push_back(r == "true");
  }
  if (req.reshard_after_forward.empty()) {
    return (absl::InvalidArgumentError("--reshard_after_forward is empty"));
  }
  req.data_parallel.clear();
  for (absl::string_view f :
       absl::StrSplit(absl::GetFlag(FLAGS_data_parallel), ',', absl::SkipWhitespace())) {
    if (f != "dp" && f != "fsdp" && f != "hsdp") {
      return (absl::InvalidArgumentError(
          absl::StrCat("--data_parallel: '", f, "' is none of dp, fsdp, hsdp")));
    }
    req.data_parallel.emplace_back(f);
  }
  if (req.data_parallel.empty()) return (absl::InvalidArgumentError("--data_parallel is empty"));
  const std::string sp = absl::GetFlag(FLAGS_sp);
  if (sp != "both" && sp != "on" && sp != "off") {
    return (absl::InvalidArgumentError("--sp " + sp + ": use both, on or off"));
  }
  req.sp_variants = sp == "both";
  req.no_sp = sp == "off";
  absl::StatusOr<OverlapOptions> overlap = OverlapOptionsFromFlags();
  if (!overlap.ok()) return overlap.status();
  req.step.overlap = overlap->on;
  req.step.bucket_bytes = static_cast<double>(overlap->bucket_bytes);
  req.step.fsdp_prefetch = overlap->fsdp_prefetch;
  return absl::OkStatus();
}

// plan_gpt's --model names: GPT-2 of these shapes (its vocabulary padded to 50304, as
// nanoGPT's; 7b and 70b are GPT-2 blocks at Llama 2's widths and depths).
struct LegacyShape {
  const char* name;
  int64_t layers, d, heads, vocab, seq;
};
constexpr LegacyShape kLegacyShapes[] = {{"gpt2-xl", 48, 1600, 25, 50304, 1024},
                                         {"7b", 32, 4096, 32, 32000, 4096},
                                         {"70b", 80, 8192, 64, 32000, 4096},
                                         {"custom", 12, 768, 12, 50304, 1024}};

// The model the flags describe: --model's registered name with --preset's shape, each shape
// flag given on the command line in its place (without --preset, every shape flag's value, its
// default included); --dtype always (the planner's default is bf16 mixed precision).
absl::Status ModelFromFlags(planner::PlanRequest& req) {
  std::string model = absl::GetFlag(FLAGS_model);
  ModelArgs& args = req.args;
  args.preset = absl::GetFlag(FLAGS_preset);
  GptConfigFlagValues values = SHARDMAP_GPT_CONFIG_FLAG_VALUES();
  for (const LegacyShape& p : kLegacyShapes) {
    if (model != p.name) continue;
    if (!args.preset.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--model ", model, " is plan_gpt's name of a GPT-2 shape; with --preset, name the model: "
          "--model=gpt2 --preset=", args.preset));
    }
    std::cerr << *program << ": note: --model=" << model << " is plan_gpt's GPT-2 shape "
              << p.layers << " x " << p.d << " (" << p.heads << " heads, vocab " << p.vocab
              << ", seq " << p.seq << "): read as --model=gpt2 with those shape flags; "
              << "--preset names the registry's shapes (--model=gpt2 --preset=gpt2-xl is "
              << "OpenAI's, vocab 50257)\n";
    model = "gpt2";
    if (!Explicit("layers")) values.layers = p.layers;
    if (!Explicit("d_model")) values.d_model = p.d;
    if (!Explicit("heads")) values.heads = p.heads;
    if (!Explicit("vocab")) values.vocab = p.vocab;
    if (!Explicit("seq")) values.seq = p.seq;
  }
  absl::StatusOr<const ModelSpec*> spec = FindModel(model);
  if (!spec.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        spec.status().message(),
        " (or plan_gpt's GPT-2 shape names gpt2-xl, 7b, 70b, custom)"));
  }
  req.model = model;
  // The shape flags are checked with their names (sizes >= 1, d_model / heads, --dtype, MoE).
  absl::StatusOr<GptConfig> checked = GptConfigFromFlags(values);
  if (!checked.ok()) return checked.status();
  if (checked->moe.on()) {
    if (absl::Status s = ValidateMoeConfig(checked->moe, 1); !s.ok()) return s;
  }
  args.moe = checked->moe;
  const bool preset = !args.preset.empty();
  auto shape = [&](const char* name, int64_t value, std::optional<int64_t>* out) {
    if (!preset || Explicit(name)) *out = value;
  };
  shape("layers", values.layers, &args.layers);
  shape("d_model", values.d_model, &args.d_model);
  shape("heads", values.heads, &args.heads);
  shape("vocab", values.vocab, &args.vocab);
  shape("seq", values.seq, &args.seq);
  if (Explicit("kv_heads")) args.kv_heads = absl::GetFlag(FLAGS_kv_heads);
  if (Explicit("ffn_dim")) args.ffn_dim = absl::GetFlag(FLAGS_ffn_dim);
  if (Explicit("rope_theta")) args.rope_theta = absl::GetFlag(FLAGS_rope_theta);
  if (Explicit("norm_eps")) args.norm_eps = absl::GetFlag(FLAGS_norm_eps);
  args.dtype = values.dtype;
  // The model's own checks run in PlanText, after the bounds (a huge --layers is refused before
  // a parameter table of that size is built).
  return absl::OkStatus();
}

int Main() {
  planner::PlanRequest req;
  if (absl::Status s = ModelFromFlags(req); !s.ok()) return Fail(s);
  req.global_batch = absl::GetFlag(FLAGS_batch);
  req.gpus = absl::GetFlag(FLAGS_gpus);
  req.gpus_per_node = absl::GetFlag(FLAGS_gpus_per_node);
  if (req.gpus_per_node < 0) {
    return Fail(absl::InvalidArgumentError("--gpus_per_node must be >= 0 (0: the profile's)"));
  }
  req.tp_across_nodes = absl::GetFlag(FLAGS_tp_across_nodes);
  req.max_pp = absl::GetFlag(FLAGS_max_pp);
  req.max_cp = absl::GetFlag(FLAGS_max_cp);
  req.reuse_profiles = absl::GetFlag(FLAGS_reuse_profiles);
  req.time_limit_s = absl::GetFlag(FLAGS_time_limit);
  if (!(req.time_limit_s >= 0)) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "--time_limit ", req.time_limit_s, " must be >= 0 seconds (0: no limit)")));
  }
  if (req.max_pp < 0 || req.max_cp < 0) {
    return Fail(absl::InvalidArgumentError("--max_pp and --max_cp must be >= 0 (0: any)"));
  }
  if (absl::Status s = SetSearchFlags(req); !s.ok()) return Fail(s);
  for (absl::string_view one :
       absl::StrSplit(absl::GetFlag(FLAGS_mesh), ';', absl::SkipWhitespace())) {
    req.only_meshes.emplace_back(one);
  }
  planner::PlanCliOptions cli;
  cli.profile = absl::GetFlag(FLAGS_profile);
  cli.tp_bench_profile = absl::GetFlag(FLAGS_tp_bench_profile);
  cli.collectives_bench = absl::GetFlag(FLAGS_collectives_bench);
  cli.top = absl::GetFlag(FLAGS_top);
  const std::string so = absl::GetFlag(FLAGS_shape_only_device);
  if (so != "meta" && so != "cpu") {
    return Fail(absl::InvalidArgumentError("--shape_only_device " + so + ": use meta or cpu"));
  }
  cli.shape_only_on_cpu = so == "cpu";
  cli.attention = absl::GetFlag(FLAGS_attention);
  if (cli.attention == "auto") cli.attention.clear();
  cli.list_refusals = absl::GetFlag(FLAGS_refused);
  if (const std::string out = absl::GetFlag(FLAGS_print_profile); !out.empty()) {
    absl::StatusOr<planner::HardwareProfile> hw = planner::ResolveProfile(cli);
    if (!hw.ok()) return Fail(hw.status());
    // Every write error is said (a full disk, /dev/full); the profile is kept in memory, not
    // read back from what was written.
    FILE* f = fopen(out.c_str(), "w");
    if (f == nullptr) return Fail(absl::InvalidArgumentError("--print_profile: cannot write " + out));
    const bool wrote = fputs(hw->ToText().c_str(), f) >= 0 && fflush(f) == 0;
    if (fclose(f) != 0 || !wrote) {
      return Fail(absl::InvalidArgumentError(absl::StrCat(
          "--print_profile: writing '", out, "' failed (", std::strerror(errno), ")")));
    }
    cli.resolved = *hw;  // measured once, reused
  }
  // On a terminal one line rewritten in place; in a log (not a terminal) one line each.
  const bool tty = isatty(fileno(stderr)) != 0;
  auto best = std::make_shared<std::string>();
  req.on_best = [best](const std::string& mesh, double step_s) {
    *best = absl::StrCat(mesh, " ", absl::SixDigits(step_s), " s/step");
  };
  req.progress = [tty, best](int done, int total) {
    if (done % 25 == 0 || done == total) {
      std::cerr << (tty ? "\r" : "") << *program << ": profiled " << done << " of " << total
                << " meshes" << (best->empty() ? "" : "; best so far ") << *best
                << (tty && done != total ? "" : "\n") << std::flush;
    }
  };
  absl::StatusOr<std::string> text = planner::PlanText(req, cli);
  if (!text.ok()) return Fail(text.status());
  std::cout << *text;
  // Nothing fits: the prices are printed, and the exit status says it.
  if (absl::StrContains(*text, "\nno mesh fits ")) {
    std::cerr << *program << ": no mesh fits (their prices are above, marked OOM)\n";
    return 2;
  }
  return 0;
}

std::vector<std::string>* explicit_flags = new std::vector<std::string>;
bool Explicit(const char* name) {
  return std::find(explicit_flags->begin(), explicit_flags->end(), name) != explicit_flags->end();
}

}  // namespace
}  // namespace shardmap

int main(int argc, char** argv) {
  const std::string argv0 = argv[0];
  *shardmap::program = argv0.substr(argv0.find_last_of('/') + 1);
  const std::string usage = absl::StrCat(
      *shardmap::program, ": rank the meshes (FSDP, TP+SP, PP, CP, EP) for a model (gpt2, "
      "llama3) on N GPUs by predicted step time, from shape-only step profiles and a hardware "
      "profile.\n  plan --model=llama3 --preset=llama3_8b --gpus=64 --batch=512 "
      "[--profile=h100_node|h200_node|FILE|measure]");
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) == 0) {
      a = a.substr(2);
      shardmap::explicit_flags->push_back(a.substr(0, a.find('=')));
    }
  }
  // --help lists this file's flags under either name (Abseil matches plan_main.cc to `plan` only)
  // and the overlapped step's, defined once for the trainer and the planner.
  if (absl::Status st = shardmap::base::ParseFlagsOnly(
          argc, argv,
          {.usage = usage.c_str(),
           .help_files = {"models/planner/plan_main.cc", "models/train/overlap_flags"}});
      !st.ok()) {
    return shardmap::base::ExitWithError(*shardmap::program, st);
  }
  return shardmap::Main();
}
