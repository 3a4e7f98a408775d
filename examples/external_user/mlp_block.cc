#include "mlp_block.h"

#include <vector>

#include "shardmap/collective_ops.h"
#include "shardmap/ops.h"
#include "shardmap/partition_spec.h"

namespace external_user {

using shardmap::None;
using shardmap::P;
using shardmap::Value;

Value MlpBlock(const Value& x, const Value& w1, const Value& b1, const Value& w2,
               const Value& b2) {
  Value a = shardmap::gelu(x.matmul(w1) + b1);      // column-parallel: S1 on tp
  return shardmap::all_reduce(a.matmul(w2), "tp") + b2;  // row-parallel: P -> R on tp
}

shardmap::ShardMap MakeMlpBlock(const shardmap::Mesh& mesh) {
  shardmap::ShardFn fn = [](const std::vector<Value>& in) -> std::vector<Value> {
    Value y = MlpBlock(in[0], in[1], in[2], in[3], in[4]);
    return {shardmap::sum_partial(y * y, {}), y};  // the loss: P on dp (this device's rows)
  };
  shardmap::ShardMapOptions o;
  o.input_names = {"x", "w1", "b1", "w2", "b2"};
  o.output_names = {"loss", "y"};
  return shardmap::shard_map(fn, mesh,
                             {P("dp", None), P(None, "tp"), P("tp"), P("tp", None), P()},
                             {P().Unreduced({"dp"}), P("dp", None)}, o);
}

}  // namespace external_user
