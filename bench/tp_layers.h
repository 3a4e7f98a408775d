// The tensor-parallel layer cases of //bench:tp_bench and //bench:tp_model_report: builds a GPT
// layer (models/gpt_layers.h) sharded over `tp` simulated CPU devices (in-process ranks), runs
// warm-up + measured steps (forward, or forward + backward through the tape), and returns rank
// 0's step times with the time and bytes spent in collectives (bench/timed_communicator.h).
//
//   LayerCase c{Layer::kMlp, /*tp=*/2, /*sp=*/true, /*fwd_bwd=*/true, /*tokens=*/512, /*d=*/512};
//   absl::StatusOr<LayerTiming> t = RunLayer(c, /*warmup=*/1, /*measured=*/3);
//   absl::StatusOr<LayerTiming> one = RunUnsharded(c, 1, 3);   // same layer, one device, no TP
//
// Shapes: activations [tokens, d]; MLP ffn = 4d; attention heads of 64 (d/64 heads), sequences
// of min(tokens, 128) tokens. Parameters are f32, drawn from N(0, 0.02) (LayerNorm weights ~1).
#ifndef SHARDMAP_BENCH_TP_LAYERS_H_
#define SHARDMAP_BENCH_TP_LAYERS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/timed_communicator.h"

namespace shardmap::bench {

enum class Layer { kColumn, kRow, kMlp, kAttention, kBlock };
const char* LayerName(Layer l);  // "column_parallel_linear", ..., "block"

struct LayerCase {
  Layer layer = Layer::kMlp;
  int tp = 1;
  bool sp = false;
  bool fwd_bwd = false;
  int64_t tokens = 512;
  int64_t d = 512;
  int64_t head_dim = 64;
  int64_t seq_len = 0;  // tokens per sequence; 0: min(tokens, 128)
  int64_t seq() const { return seq_len > 0 ? seq_len : (tokens < 128 ? tokens : 128); }
  int64_t ffn() const { return 4 * d; }
  // e.g. "mlp/tp:2/tokens:512/d:512/sp/fwd_bwd"
  std::string Name() const;
};

// Matmul FLOPs of one step of the whole (unsharded) layer: 2mnk per GEMM, backward twice the
// forward (grads of inputs and weights). Elementwise ops are not counted.
double LayerFlops(const LayerCase& c);

struct LayerTiming {
  std::vector<double> seconds;   // wall time per measured step (rank 0, fenced by barriers)
  double cpu_seconds = 0;        // mean over ranks and steps of the rank thread's CPU time
  double comm_seconds = 0;       // mean per step, rank 0, wall time inside collectives
  double comm_cpu_seconds = 0;   // mean over ranks and steps, CPU time inside collectives
  CommStats comm;                // rank 0, one step (the last)
  double Mean() const;
  double Min() const;
};

absl::StatusOr<LayerTiming> RunLayer(const LayerCase& c, int warmup, int measured);
// The same layer with tensor parallelism off, on the calling thread (c.tp and c.sp ignored).
absl::StatusOr<LayerTiming> RunUnsharded(const LayerCase& c, int warmup, int measured);

}  // namespace shardmap::bench

#endif  // SHARDMAP_BENCH_TP_LAYERS_H_
