#include "shardmap/runtime/rank_context.h"

#include <chrono>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "collectives/self_communicator.h"
#include "shardmap/runtime/collective_recorder.h"
#include "tensor/error.h"

namespace shardmap {

RankContext::RankContext(Mesh mesh, int rank, collectives::Communicator* world, TypeCheck check,
                         Device device)
    : mesh_(std::move(mesh)), rank_(rank), coords_(mesh_.Coords(rank)), world_(world),
      check_(check), device_(device) {
  comms_.resize(size_t{1} << mesh_.num_axes());
}

RankContext::~RankContext() = default;

RankContext& RankContext::Get(const char* op) {
  if (current_ == nullptr) {
    OpFail(op, ": no SPMD context on this thread; typed ops run inside shard_map, RunSpmd or a "
               "SingleRankContext");
  }
  return *current_;
}

namespace {

// CallTag words of a typed collective: bytes only (no pointers), so ranks in other processes
// (Gloo) compare and format them too. The op name's first 32 chars (the rest folded into the
// last name word), mask | dtype << 8 | rank << 32, the program-order number, the dims.
enum TagWord { kName, kMeta = kName + 4, kSeq, kDims, kTagWords = kDims + 8 };
static_assert(kTagWords <= collectives::CallTag::kWords);
static_assert(kMaxMeshAxes <= 8, "the axis mask takes the low byte of kMeta");
constexpr uint64_t kRaggedDim = ~uint64_t{0};
constexpr size_t kNameChars = 4 * sizeof(uint64_t);

// "all_reduce over 'tp' of f32[4,8] (collective #3 of its program)"; axis names from the
// formatting thread's context (the ranks of one world share the mesh).
std::string DescribeTypedCollective(const uint64_t* w) {
  const AxisMask mask = static_cast<AxisMask>(w[kMeta] & 0xff);
  const uint64_t dtype = (w[kMeta] >> 8) & 0xff, rank = w[kMeta] >> 32;
  std::string axes = absl::StrCat("axes mask ", mask);
  if (RankContext* ctx = RankContext::Current()) axes = ctx->mesh().MaskToString(mask);
  std::vector<std::string> dims;
  for (uint64_t d = 0; d < rank && d < 8; ++d) {
    dims.push_back(w[kDims + d] == kRaggedDim ? "*" : absl::StrCat(w[kDims + d]));
  }
  if (rank > 8) dims.push_back("...");
  char name[kNameChars + 1] = {};
  std::memcpy(name, &w[kName], kNameChars);
  const bool valid_dtype = IsValidDType(static_cast<DType>(dtype));
  return absl::StrCat(name, " over ", axes, " of ",
                      valid_dtype ? DTypeName(static_cast<DType>(dtype)) : "invalid dtype", "[",
                      absl::StrJoin(dims, ","), "] (collective #", w[kSeq], " of its program)");
}

}  // namespace

collectives::Communicator& RankContext::CommFor(const char* op, AxisMask mask, const Tensor& x,
                                                int ragged_dim) {
  collectives::CallTag tag;
  uint64_t* w = tag.words;
  const size_t len = std::strlen(op);
  std::memcpy(&w[kName], op, std::min(len, kNameChars));
  for (size_t k = kNameChars; k < len; ++k) {  // fold a longer name into the last name word
    w[kName + 3] = (w[kName + 3] ^ static_cast<unsigned char>(op[k])) * 1099511628211ull;
  }
  w[kMeta] = uint64_t{mask} | static_cast<uint64_t>(x.dtype()) << 8 |
             static_cast<uint64_t>(x.rank()) << 32;
  ++collective_seq_;
  if (per_axis_set_) {  // stage programs (models/parallel/pipeline.h): numbered per axis set
    if (seq_by_mask_.size() <= mask) seq_by_mask_.resize(mask + 1);
    w[kSeq] = ++seq_by_mask_[mask];
  } else {
    w[kSeq] = collective_seq_;
  }
  for (int d = 0; d < x.rank(); ++d) {
    const uint64_t size = d == ragged_dim ? kRaggedDim : static_cast<uint64_t>(x.dim(d));
    if (d < 8) {
      w[kDims + d] = size;
    } else {  // fold the dims past the 8th into the last word
      w[kDims + 7] = (w[kDims + 7] ^ size) * 1099511628211ull;
    }
  }
  tag.describe = &DescribeTypedCollective;
  if (comms_[mask] == nullptr && mask != AllAxes()) world_->TagNextCall(tag);  // the Split
  collectives::Communicator& comm = Comm(mask);
  comm.TagNextCall(tag);
  return comm;
}

AxisMask RankContext::AllAxes() const { return (AxisMask{1} << mesh_.num_axes()) - 1; }

collectives::Communicator& RankContext::Comm(AxisMask mask) {
  if (mask == AllAxes()) return *world_;
  std::unique_ptr<collectives::Communicator>& c = comms_[mask];
  if (c == nullptr) {
    // The color names the axis set as well as the group, so ranks that create communicators of
    // different axis sets at the same point (rank-dependent collectives) never share a group,
    // even on backends that ignore the call tags; a group that comes out smaller than the mesh
    // says then shows the disagreement.
    const int64_t keyed = int64_t{mask} * mesh_.size() + mesh_.GroupColor(rank_, mask);
    const int color = keyed <= std::numeric_limits<int>::max() ? static_cast<int>(keyed)
                                                               : mesh_.GroupColor(rank_, mask);
    absl::StatusOr<std::unique_ptr<collectives::Communicator>> split =
        world_->Split(color, mesh_.GroupIndex(rank_, mask));
    if (!split.ok()) {
      throw OpError(absl::Status(split.status().code(),
                                 absl::StrCat("while creating the communicator of axes ",
                                              mesh_.MaskToString(mask), ": ",
                                              split.status().message())));
    }
    if (*split == nullptr || (*split)->size() != mesh_.GroupSize(mask)) {
      OpFail("while creating the communicator of axes ", mesh_.MaskToString(mask), ": this "
             "rank's group has ", *split == nullptr ? 0 : (*split)->size(), " ranks but the mesh ",
             mesh_.ShortString(), " puts ", mesh_.GroupSize(mask), " in it: the ranks of the "
             "group issued collectives over different axes at the same point (rank-dependent "
             "control flow before this call)");
    }
    c = *std::move(split);
  }
  return *c;
}

double SteadyClockUs() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void RankContext::EndCollective(size_t index) {
  if (index >= log_.size()) return;
  log_[index].end_us = SteadyClockUs();
  log_[index].started = true;
}

void RankContext::LogCollective(const char* op, AxisMask axes, int64_t bytes, DType dtype,
                                double start_us, double end_us) {
  const double now = SteadyClockUs();
  log_.push_back({op, axes, bytes, in_backward_, dtype, recomputing_,
                  start_us > 0 ? start_us : now, end_us > 0 ? end_us : now});
  if (internal::AnyRecorderActive()) internal::RecordCollective(rank_, mesh_, log_.back());
}

int RankContext::CountCollectives(const char* op, AxisMask axes, bool backward) const {
  int n = 0;
  for (const CollectiveRecord& r : log_) {
    if (std::string(r.op) == op && r.axes == axes && r.backward == backward) ++n;
  }
  return n;
}

SingleRankContext::SingleRankContext(Mesh mesh, TypeCheck check)
    : self_(std::make_unique<collectives::SelfCommunicator>()) {
  if (mesh.size() != 1) {
    throw OpError(absl::InvalidArgumentError(absl::StrCat(
        "SingleRankContext needs a mesh of one rank (all axes of size 1), got ",
        mesh.ShortString())));
  }
  ctx_ = std::make_unique<RankContext>(std::move(mesh), 0, self_.get(), check);
  scope_ = std::make_unique<ScopedRankContext>(ctx_.get());
}

SingleRankContext::~SingleRankContext() = default;

std::string RankDescription(const Mesh& mesh, int rank) {
  std::vector<std::string> parts;
  for (int i = 0; i < mesh.num_axes(); ++i) {
    parts.push_back(absl::StrCat(mesh.axis_names()[i], "=", mesh.Coord(rank, i)));
  }
  return absl::StrCat("rank ", rank, " (", absl::StrJoin(parts, ","), ")");
}

}  // namespace shardmap
