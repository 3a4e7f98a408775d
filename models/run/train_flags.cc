#include "models/run/train_flags.h"

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "collectives/backend_registry.h"
#include "models/gpt/gpt_flags.h"

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
ABSL_FLAG(std::string, devices, "", "cpu:N simulated ranks (default: the mesh size)");
ABSL_FLAG(std::string, backend, "inprocess",
          absl::StrCat("a registered backend (collectives/backend_registry.h): ",
                       shardmap::collectives::BackendFlagHelp(),
                       "; process-per-rank backends take --nproc_per_node=<mesh size>; rank 0 "
                       "prints"));
ABSL_FLAG(bool, cuda_graph, true,
          "GPU: capture the static step once (after one eager warm-up step) and replay it as a "
          "CUDA graph: one in-process GPU rank, no pipeline/MoE/--trace, f32 master weights "
          "(the summary says \"captured (N replays)\" or why not); false: every step eagerly");
ABSL_FLAG(double, collective_timeout, 300,
          "--backend=gloo/nccl: seconds a rank waits for a peer in one collective (and to "
          "connect) before the job fails naming the peer; a stopped or hung peer is detected "
          "after this long");
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

bool IsTrainFlagFile(absl::string_view file) {
  for (const char* f : kTrainFlagFiles) {
    if (absl::StrContains(file, f)) return true;
  }
  return false;
}

}  // namespace shardmap
