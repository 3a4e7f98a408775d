#include "collectives/internal/collective_op.h"

namespace shardmap::collectives::internal {

const char* OpName(Op op) {
  switch (op) {
    case Op::kAllReduce: return "AllReduce";
    case Op::kAllGather: return "AllGather";
    case Op::kReduceScatter: return "ReduceScatter";
    case Op::kAllToAll: return "AllToAll";
    case Op::kAllGatherV: return "AllGatherV";
    case Op::kReduceScatterV: return "ReduceScatterV";
    case Op::kAllToAllV: return "AllToAllV";
    case Op::kBroadcast: return "Broadcast";
    case Op::kPpermute: return "Ppermute";
    case Op::kBarrier: return "Barrier";
    case Op::kSplit: return "Split";
  }
  return "unknown op";
}

}  // namespace shardmap::collectives::internal
