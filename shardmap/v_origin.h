// Where a V of unknown layout came from. A value whose type on an axis is V (per-device values,
// layout unknown) usually fails ops later (an all_reduce that wants P, a gather that wants S);
// the op that made it is what the user must fix. Typed ops stamp each new V with an origin (the
// op, why its layout became unknown, its operands' types, the likely fix) and every op passes
// its operands' origins on, so a later type or shape error names the cause:
//
//   all_reduce: takes a partial sum (P), but x is V on axis 'tp'. ... x is V on 'tp' since
//   einsum("bsrd,bkd->bsrk"): a's dim 'r' and b's dim 'k' are both sharded over 'tp' ...
//
// Origins are recorded once per distinct (op, reason, operands) in a process-wide table (a few
// per program site; ranks share it), and referred to by a 16-bit id in AxisType::origin.
#ifndef SHARDMAP_SHARDMAP_V_ORIGIN_H_
#define SHARDMAP_SHARDMAP_V_ORIGIN_H_

#include <cstdint>
#include <string>

namespace shardmap {

// How a V came to be: a layout lost (each device still holds a piece of one whole tensor, in an
// order the types no longer know: a reshape, a slice), shards mixed (an elementwise op of
// operands sharded on different dims: no device holds a piece of any whole), or intended.
enum class VKind : uint8_t { kLayoutLost, kMixed, kIntended };

struct VOrigin {
  std::string op;        // "einsum(\"bsd,btd->bst\")", "reshape", "as_varying"
  std::string reason;    // why the layout is unknown
  std::string operands;  // "a=f32[2,4]{tp:S1}, b=f32[4,8]{tp:S1}"
  std::string fix;       // the likely fix at that op
  // kIntended: declared by the program (as_varying, ppermute): a later error is not a bug of
  // this op, and a cast (reinterpret) may be what the program means. Otherwise a fix never
  // proposes a cast.
  VKind kind = VKind::kLayoutLost;
  bool intended() const { return kind == VKind::kIntended; }
};

// Records o (or finds the same record) and returns its id (>= 1); 0 when the table is full.
uint16_t RecordVOrigin(const VOrigin& o);
// The record of id, or nullptr for 0 / an unknown id. Records are never removed or changed.
const VOrigin* FindVOrigin(uint16_t id);

// " x is V on 'tp' since <op>: <reason> (operands: ...)": the sentence errors append.
std::string DescribeVOrigin(const char* operand, const std::string& axis, const VOrigin& o);

}  // namespace shardmap

#endif  // SHARDMAP_SHARDMAP_V_ORIGIN_H_
