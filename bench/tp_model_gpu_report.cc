// The TP model fed with one GPU run's measurements (bench/tp_model_gpu.h): reads the profile
// `tp_bench --device=cuda --profile_out=FILE` wrote and prints markdown, every assumption next
// to its table:
//   1. GEMM efficiency per TP degree: each layer's per-rank GEMM shapes, TFLOP/s at t = 1..8;
//   2. validation: the shared-GPU layer rows (t virtual ranks on one card) predicted from the
//      GEMM and collective times, beside the measured step times, err per row and a summary;
//   3. 8 GPUs per node on 1-64 nodes: TP 8 in each node + data parallel across nodes, and one
//      TP group over all GPUs, for the transformer block (fwd + bwd) with and without SP.
//
//   tp_model_gpu_report --profile=gpu_profile.txt --tokens=4096 --d=2048 > tp_model_gpu.md
//
// Exit status 2 with the reason for a bad flag or an unreadable or malformed profile.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/tp_layers.h"
#include "bench/tp_model.h"
#include "bench/tp_model_gpu.h"

ABSL_FLAG(std::string, profile, "", "the profile tp_bench --device=cuda --profile_out wrote");
ABSL_FLAG(int64_t, tokens, 512, "tokens per layer step, as the tp_bench run");
ABSL_FLAG(int64_t, d, 512, "hidden size, as the tp_bench run");

namespace shardmap::bench {
namespace {

constexpr int kTps[] = {1, 2, 4, 8};

std::vector<DType> DTypesIn(const GpuProfile& p) {
  std::vector<DType> out;
  for (DType dt : {DType::kBF16, DType::kF32}) {
    for (const auto& [key, sec] : p.gemm_s) {
      if (key.first == dt) {
        out.push_back(dt);
        break;
      }
    }
  }
  return out;
}

std::string Ms(double s) { return absl::StrFormat("%.3f", 1e3 * s); }

void GemmEfficiency(const GpuProfile& p, int64_t tokens, int64_t d) {
  printf("## GEMM efficiency per TP degree (one GEMM alone on the card)\n\n");
  printf("Each layer's per-rank forward GEMMs at TP t (tokens %lld, d %lld, ffn 4d, heads of "
         "64, sequences of %lld), timed alone on GPU 0 with CUDA events (mean of 20 calls after "
         "3 warm-ups). TFLOP/s, and in brackets the fraction of the t = 1 shape's rate: how "
         "much of the card a rank's smaller GEMM still uses.\n\n",
         (long long)tokens, (long long)d, (long long)std::min<int64_t>(tokens, 128));
  struct Role {
    const char* name;
    Layer layer;
    int index;  // in RankGemms of the forward layer
  };
  const Role roles[] = {{"column fc [T,d]x[d,4d/t]", Layer::kColumn, 0},
                        {"row proj [T,4d/t]x[4d/t,d]", Layer::kRow, 0},
                        {"qkv [T,d]x[d,3d/t]", Layer::kAttention, 0},
                        {"scores (T/s)(h/t) x [s,64]x[64,s]", Layer::kAttention, 1},
                        {"p v (T/s)(h/t) x [s,s]x[s,64]", Layer::kAttention, 2},
                        {"attn proj [T,d/t]x[d/t,d]", Layer::kAttention, 3}};
  for (DType dt : DTypesIn(p)) {
    printf("### %s\n\n| GEMM |", DTypeName(dt));
    for (int t : kTps) printf(" t=%d shape | TFLOP/s |", t);
    printf("\n|---|");
    for (size_t i = 0; i < std::size(kTps); ++i) printf("---|---|");
    printf("\n");
    for (const Role& r : roles) {
      printf("| %s |", r.name);
      double base = 0;
      for (int t : kTps) {
        LayerCase c{r.layer, t, false, false, tokens, d};
        const GemmShape g = RankGemms(c)[r.index];
        auto it = p.gemm_s.find({dt, g});
        if (it == p.gemm_s.end()) {
          printf(" %s | not measured |", g.ToString().c_str());
          continue;
        }
        const double rate = g.Flops() / it->second;
        if (t == 1) base = rate;
        printf(" %s | %.1f (%.2f) |", g.ToString().c_str(), rate / 1e12,
               base > 0 ? rate / base : 0.0);
      }
      printf("\n");
    }
    printf("\n");
  }
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

void Validation(const GpuProfile& p, int64_t tokens, int64_t d) {
  printf("## Validation: the model against the one-GPU measurements\n\n");
  printf("The t ranks are virtual ranks on one GPU (a stream each): the card runs all t ranks' "
         "GEMMs, so predicted compute = t x (one rank's per-rank GEMMs at their measured "
         "times, above), and predicted comm = the layer's collectives (bench/tp_model.h "
         "LayerCollectives) at their measured cost over t virtual ranks (in-process device "
         "copies and reductions, not NCCL). Not in the model: elementwise work (GELU, "
         "LayerNorm, softmax and mask, residual adds, bias), the tape, launch gaps, and any "
         "overlap of the ranks' streams (small GEMMs of several ranks can share the card, which "
         "makes the measurement faster than the prediction). err = (predicted - measured) / "
         "measured; measured = the longest rank's CUDA-event span per step (mean); fenced = "
         "rank 0's host time between barriers with the streams drained.\n\n");
  printf("| row | measured ms | fenced ms | predicted ms | compute ms | comm ms | err |\n"
         "|---|---|---|---|---|---|---|\n");
  std::vector<double> errs;
  int within = 0;
  for (DType dt : DTypesIn(p)) {
    for (Layer layer : {Layer::kColumn, Layer::kRow, Layer::kMlp, Layer::kAttention,
                        Layer::kBlock, Layer::kAsyncMlp}) {
      for (bool fwd_bwd : {false, true}) {
        for (bool sp : {false, true}) {
          if (layer == Layer::kAsyncMlp && !sp) continue;
          for (int t : kTps) {
            LayerCase c{layer, t, sp, fwd_bwd, tokens, d};
            c.backend = Backend::kSharedGpu;
            c.dtype = dt;
            auto m = p.layers.find(c.Name());
            if (m == p.layers.end()) continue;
            absl::StatusOr<Prediction> pred = PredictSharedGpu(p, c);
            if (!pred.ok()) {
              printf("| %s | %s | %s | not predicted: %s ||||\n", c.Name().c_str(),
                     Ms(m->second.seconds).c_str(), Ms(m->second.fenced_seconds).c_str(),
                     std::string(pred.status().message()).c_str());
              continue;
            }
            const double err = pred->total() / m->second.seconds - 1;
            errs.push_back(std::fabs(err));
            within += std::fabs(err) <= 0.2;
            printf("| %s | %s | %s | %s | %s | %s | %+.0f%% |\n", c.Name().c_str(),
                   Ms(m->second.seconds).c_str(), Ms(m->second.fenced_seconds).c_str(),
                   Ms(pred->total()).c_str(), Ms(pred->compute_s).c_str(),
                   Ms(pred->comm_s).c_str(), 100 * err);
          }
        }
      }
    }
  }
  if (errs.empty()) {
    printf("\nNo shared-GPU layer rows in the profile to validate against.\n\n");
    return;
  }
  printf("\nSummary over %zu predicted rows: |err| median %.0f%%, max %.0f%%, within 20%%: %d.\n\n",
         errs.size(), 100 * Median(errs), 100 * *std::max_element(errs.begin(), errs.end()),
         within);
}

void MultiNode(const GpuProfile& p, int64_t tokens, int64_t d) {
  const ClusterLinks links = LinksFromProfile(p);
  const std::vector<DType> dts = DTypesIn(p);
  if (dts.empty()) {
    printf("## Multi-node predictions\n\nNo GEMMs in the profile: nothing to predict from.\n");
    return;
  }
  const DType dt = dts.front();  // bf16 when measured
  printf("## Predicted step times: %d GPUs per node, 1-64 nodes\n\n", links.gpus_per_node);
  printf("Assumptions: one transformer block (tokens %lld per TP group per step, d %lld, ffn "
         "4d, heads of 64, sequences of %lld), forward + backward, %s. Per-GPU GEMM times from "
         "this run's GPU (%s) by shape at t = %d; the TP-over-all-GPUs rows scale the FLOPs at "
         "the t = %d per-rank rate (their smaller GEMMs were not measured, and heads < t is not "
         "realizable: d/64 = %lld heads). Elementwise work is not included. No overlap of "
         "communication with compute. Ring collectives: all_reduce = alpha + 2(t-1)/t S/B, "
         "all_gather / reduce_scatter = alpha + (t-1)/t S/B.\n\n"
         "* intra-node link: %s\n* inter-node link: %s\n\n"
         "TP %d + DP: TP over the %d GPUs of each node, data parallel across nodes (each node a "
         "replica with its own %lld tokens): the step plus the gradient all_reduce of each "
         "rank's parameters (%s) over the nodes (one GPU per node per ring, every GPU's own "
         "NIC). TP all: one TP group over all GPUs processing %lld tokens, its collectives on "
         "the inter-node ring. tokens/s: the whole cluster's.\n\n",
         (long long)tokens, (long long)d, (long long)std::min<int64_t>(tokens, 128),
         DTypeName(dt), p.device.c_str(), links.gpus_per_node, links.gpus_per_node,
         (long long)(d / 64), links.intra_source.c_str(), links.inter_source.c_str(),
         links.gpus_per_node, links.gpus_per_node, (long long)tokens, DTypeName(dt),
         (long long)tokens);
  for (bool sp : {false, true}) {
    printf("### block fwd+bwd, %s, %s\n\n", DTypeName(dt),
           sp ? "with sequence parallelism" : "without sequence parallelism");
    printf("| nodes | GPUs | TP%d+DP ms | compute | TP comm | DP all_reduce | tokens/s | TP all "
           "ms | compute | comm | tokens/s |\n|---|---|---|---|---|---|---|---|---|---|---|\n",
           links.gpus_per_node);
    for (int nodes : {1, 2, 4, 8, 16, 32, 64}) {
      LayerCase c{Layer::kBlock, 0, sp, true, tokens, d};
      c.backend = Backend::kGpuPerRank;
      c.dtype = dt;
      absl::StatusOr<MultiNodeRow> r = PredictMultiNode(p, c, nodes, links);
      if (!r.ok()) {
        printf("| %d | %d | not predicted: %s ||||||||\n", nodes, nodes * links.gpus_per_node,
               std::string(r.status().message()).c_str());
        continue;
      }
      const bool too_few_heads = nodes * links.gpus_per_node > d / 64;
      printf("| %d | %d | %s | %s | %s | %s | %.3g | %s%s | %s | %s | %.3g |\n", nodes,
             nodes * links.gpus_per_node, Ms(r->tp_node_total()).c_str(),
             Ms(r->tp_node.compute_s).c_str(), Ms(r->tp_node.comm_s).c_str(),
             Ms(r->dp_allreduce_s).c_str(), r->tokens_per_s_tp_node, Ms(r->tp_all.total()).c_str(),
             too_few_heads ? " (t > heads)" : "",
             Ms(r->tp_all.compute_s).c_str(), Ms(r->tp_all.comm_s).c_str(),
             r->tokens_per_s_tp_all);
    }
    printf("\n");
  }
}

}  // namespace
}  // namespace shardmap::bench

int main(int argc, char** argv) {
  using namespace shardmap::bench;
  absl::ParseCommandLine(argc, argv);
  const std::string path = absl::GetFlag(FLAGS_profile);
  const int64_t tokens = absl::GetFlag(FLAGS_tokens), d = absl::GetFlag(FLAGS_d);
  if (path.empty()) {
    fprintf(stderr, "tp_model_gpu_report: --profile=FILE is required (tp_bench --device=cuda "
                    "--profile_out=FILE writes it)\n");
    return 2;
  }
  if (tokens < 1 || d < 64 || d % 64 != 0) {
    fprintf(stderr, "tp_model_gpu_report: --tokens=%lld --d=%lld: need tokens >= 1 and d a "
                    "positive multiple of 64, as the tp_bench run\n",
            (long long)tokens, (long long)d);
    return 2;
  }
  std::ifstream f(path);
  if (!f) {
    fprintf(stderr, "tp_model_gpu_report: cannot read --profile=%s\n", path.c_str());
    return 2;
  }
  std::stringstream ss;
  ss << f.rdbuf();
  absl::StatusOr<GpuProfile> p = ParseGpuProfile(ss.str());
  if (!p.ok()) {
    fprintf(stderr, "tp_model_gpu_report: %s: %s\n", path.c_str(),
            std::string(p.status().message()).c_str());
    return 2;
  }
  printf("# TP model on the GPU\n\nFrom the profile of one `tp_bench --device=cuda` run on %s.\n\n",
         p->device.empty() ? "an unnamed GPU" : p->device.c_str());
  GemmEfficiency(*p, tokens, d);
  Validation(*p, tokens, d);
  MultiNode(*p, tokens, d);
  return 0;
}
