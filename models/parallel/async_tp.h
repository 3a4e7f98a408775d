// Async tensor parallelism ("collective matmul"): the sequence-parallel linears of gpt_layers.h
// with their collective decomposed into a ring of non-blocking ppermutes, so that each step's
// transfer overlaps the step's matmul. Per-device code; the backward pass comes from the autograd
// (the transposes of ppermute_start / Wait(), shardmap/async_collectives.h), not written by hand.
//
//   TensorParallel tp{"tp", /*sp=*/true};
//   RingColumnParallelLinear fc{w1, b1, tp};   // = ColumnParallelLinear: all_gather(x) @ w1 + b1
//   RingRowParallelLinear proj{w2, b2, tp};    // = RowParallelLinear: reduce_scatter(h @ w2) + b2
//   RingMlp mlp{fc, proj};
//   Value y = mlp(x);                          // x [rows/n, d] S0 on tp -> y [rows/n, d]
//
// Column (all_gather -> matmul), n devices on tp, device r: at step k it holds the row block of
// device (r - k) mod n, starts passing it to device r + 1, multiplies it by w1 (that output block
// is done) and waits for the next block. Row (matmul -> reduce_scatter): at step k device r
// multiplies its rows of block (r - 1 - k) mod n by w2 while the running sum for that block
// arrives from device r - 1; it adds the two and passes the sum on; after n - 1 steps the sum of
// block r is complete. Each ring moves (n - 1) blocks of [rows/n, d] per device each way, the
// bytes of the all_gather / reduce_scatter it replaces. The MLP keeps the hidden activation as
// its n row blocks, so gelu runs per block and no concat or slice is needed between the rings.
//
// Backward: the tape runs the VJPs in reverse, so the transpose of each Wait() starts the
// reverse transfer of that step's cotangent and the transpose of its start waits for it after the
// step's matmul VJPs: the backward rings (a reduce-scatter ring for the column layer, an
// all-gather ring for the row layer) overlap the same way.
//
// Types: a ppermuted block is V on tp (the rule cannot know which block arrived), so outputs are
// V where the plain layers give S1 (column) / S0 (row); out_specs naming tp at those dims accept
// them. The numbers equal the plain SP layers' (tested in f64). tp.sp must be set (the ring is
// the SP decomposition); with tp.axis empty or of size 1 the layers are the plain matmuls.
#ifndef SHARDMAP_MODELS_PARALLEL_ASYNC_TP_H_
#define SHARDMAP_MODELS_PARALLEL_ASYNC_TP_H_

#include <vector>

#include "models/parallel/layers.h"
#include "shardmap/value.h"

namespace shardmap {

// y = all_gather(x, 0, tp) @ weight + bias; weight [in, out] S1 on tp, bias [out] S0 on tp.
struct RingColumnParallelLinear {
  Value weight, bias;
  TensorParallel tp;
  // The output's row blocks: Blocks(x)[j] = (device j's rows of x) @ weight + bias.
  std::vector<Value> Blocks(const Value& x) const;
  // The blocks concatenated: ColumnParallelLinear's output [n * rows, out/n].
  Value operator()(const Value& x) const;
};

// y = reduce_scatter(x @ weight, 0, tp) + bias; weight [in, out] S0 on tp, bias [out] R.
struct RingRowParallelLinear {
  Value weight, bias;
  TensorParallel tp;
  // blocks[j]: rows of x that device j's output holds (n blocks of equal shape).
  Value operator()(const std::vector<Value>& blocks) const;
  // x [rows, in/n] S1 on tp, rows divisible by n: cut into n row blocks first.
  Value operator()(const Value& x) const;
};

// c_proj(gelu_tanh(c_fc(x))) with both rings; the hidden activation stays in row blocks.
struct RingMlp {
  RingColumnParallelLinear c_fc;
  RingRowParallelLinear c_proj;
  Value operator()(const Value& x) const;
};

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_PARALLEL_ASYNC_TP_H_
