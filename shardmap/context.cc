#include "shardmap/context.h"

#include <exception>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "shardmap/internal/self_communicator.h"
#include "tensor/error.h"

namespace shardmap {

RankContext::RankContext(Mesh mesh, int rank, collectives::Communicator* world, TypeCheck check)
    : mesh_(std::move(mesh)), rank_(rank), coords_(mesh_.Coords(rank)), world_(world),
      check_(check) {
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

collectives::Communicator& RankContext::Comm(AxisMask mask) {
  AxisMask all = (AxisMask{1} << mesh_.num_axes()) - 1;
  if (mask == all) return *world_;
  std::unique_ptr<collectives::Communicator>& c = comms_[mask];
  if (c == nullptr) {
    absl::StatusOr<std::unique_ptr<collectives::Communicator>> split =
        world_->Split(mesh_.GroupColor(rank_, mask), mesh_.GroupIndex(rank_, mask));
    if (!split.ok()) {
      throw OpError(absl::Status(split.status().code(),
                                 absl::StrCat("while creating the communicator of axes ",
                                              mesh_.MaskToString(mask), ": ",
                                              split.status().message())));
    }
    c = *std::move(split);
  }
  return *c;
}

int RankContext::CountCollectives(const char* op, AxisMask axes, bool backward) const {
  int n = 0;
  for (const CollectiveRecord& r : log_) {
    if (std::string(r.op) == op && r.axes == axes && r.backward == backward) ++n;
  }
  return n;
}

SingleRankContext::SingleRankContext(Mesh mesh, TypeCheck check)
    : self_(std::make_unique<internal::SelfCommunicator>()) {
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

namespace {

absl::Status RunBody(RankContext& ctx, const std::function<void(RankContext&)>& body) {
  ScopedRankContext scope(&ctx);
  absl::Status s = CatchOpError([&] { body(ctx); });
  if (!s.ok()) {
    std::vector<std::string> parts;
    for (int i = 0; i < ctx.mesh().num_axes(); ++i) {
      parts.push_back(absl::StrCat(ctx.mesh().axis_names()[i], "=", ctx.coord(i)));
    }
    return absl::Status(s.code(), absl::StrCat("at mesh coordinates (", absl::StrJoin(parts, ","),
                                               "): ", s.message()));
  }
  return s;
}

}  // namespace

absl::Status RunOnCommunicator(collectives::Communicator& comm, const Mesh& mesh,
                               const std::function<void(RankContext&)>& body, TypeCheck check) {
  if (comm.size() != mesh.size()) {
    return absl::InvalidArgumentError(absl::StrCat("mesh ", mesh.ShortString(), " has ",
                                                   mesh.size(), " ranks but the communicator ",
                                                   comm.name(), " has ", comm.size()));
  }
  RankContext ctx(mesh, comm.rank(), &comm, check);
  return RunBody(ctx, body);
}

absl::Status RunSpmd(const Mesh& mesh, const std::function<void(RankContext&)>& body,
                     const SpmdOptions& options) {
  return collectives::RunInProcess(
      mesh.size(),
      [&](collectives::Communicator& comm) -> absl::Status {
        RankContext ctx(mesh, comm.rank(), &comm, options.check);
        return RunBody(ctx, body);
      },
      options.comm);
}

}  // namespace shardmap
