#include "shardmap/shard_map.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "collectives/communicator.h"
#include "shardmap/sharding.h"
#include "tensor/error.h"

namespace shardmap {

namespace {

// "w1" or "input 1": the unquoted label the spec validators quote themselves.
std::string Label(const std::vector<std::string>& names, const char* kind, size_t k) {
  return k < names.size() ? names[k] : absl::StrCat(kind, " ", k);
}

}  // namespace

ShardMap::ShardMap(ShardFn fn, Mesh mesh, std::vector<PartitionSpec> in_specs,
                   std::vector<PartitionSpec> out_specs, ShardMapOptions options)
    : fn_(std::move(fn)), mesh_(std::move(mesh)), in_specs_(std::move(in_specs)),
      out_specs_(std::move(out_specs)), options_(std::move(options)) {
  spec_status_ = [&]() -> absl::Status {
    if (!fn_) return absl::InvalidArgumentError("shard_map: the function is empty");
    for (size_t k = 0; k < in_specs_.size(); ++k) {
      const std::string what = Label(options_.input_names, "input", k);
      if (absl::Status s = in_specs_[k].ValidateAxes(mesh_, what); !s.ok()) return s;
      if (!in_specs_[k].unreduced().empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "in_spec ", in_specs_[k].ToString(), " of ", InputName(k),
            " has unreduced axes; an input cannot be a pending sum (pass the reduced tensor, or "
            "reduce inside the function)"));
      }
    }
    for (size_t k = 0; k < out_specs_.size(); ++k) {
      const std::string what = Label(options_.output_names, "output", k);
      if (absl::Status s = out_specs_[k].ValidateAxes(mesh_, what); !s.ok()) return s;
    }
    for (int i : options_.invariant_inputs) {
      if (i < 0 || i >= static_cast<int>(in_specs_.size())) {
        return absl::InvalidArgumentError(absl::StrCat(
            "shard_map: options.invariant_inputs names input ", i, " but there are ",
            in_specs_.size(), " inputs"));
      }
    }
    auto too_many = [](const char* kind, size_t names, size_t specs) {
      return absl::InvalidArgumentError(absl::StrCat("shard_map: options.", kind, "_names has ",
                                                     names, " names for ", specs, " ", kind,
                                                     "s"));
    };
    if (options_.input_names.size() > in_specs_.size()) {
      return too_many("input", options_.input_names.size(), in_specs_.size());
    }
    if (options_.output_names.size() > out_specs_.size()) {
      return too_many("output", options_.output_names.size(), out_specs_.size());
    }
    return absl::OkStatus();
  }();
  if (!spec_status_.ok()) return;
  input_types_.reserve(in_specs_.size());
  for (size_t k = 0; k < in_specs_.size(); ++k) {
    AxisType unnamed = options_.unnamed_input_type;
    for (int i : options_.invariant_inputs) {
      if (i == static_cast<int>(k)) unnamed = AxisType::I();
    }
    input_types_.push_back(in_specs_[k].InputType(mesh_, unnamed));
  }
}

std::vector<PartitionSpec> ShardMap::GradientSpecs() const {
  if (!spec_status_.ok()) return in_specs_;
  std::vector<PartitionSpec> specs;
  specs.reserve(in_specs_.size());
  for (size_t k = 0; k < in_specs_.size(); ++k) {
    std::vector<std::string> pending;
    for (int i = 0; i < mesh_.num_axes(); ++i) {
      if (input_types_[k][i].kind == AxisKind::kR) pending.push_back(mesh_.axis_names()[i]);
    }
    specs.push_back(in_specs_[k].Unreduced(pending));
  }
  return specs;
}

absl::StatusOr<ShardMap> ShardMap::Create(ShardFn fn, Mesh mesh,
                                          std::vector<PartitionSpec> in_specs,
                                          std::vector<PartitionSpec> out_specs,
                                          ShardMapOptions options) {
  ShardMap f(std::move(fn), std::move(mesh), std::move(in_specs), std::move(out_specs),
             std::move(options));
  if (!f.spec_status_.ok()) return f.spec_status_;
  return f;
}

std::string ShardMap::InputName(size_t k) const {
  if (k < options_.input_names.size()) return absl::StrCat("'", options_.input_names[k], "'");
  return absl::StrCat("input ", k);
}

std::string ShardMap::OutputName(size_t k) const {
  if (k < options_.output_names.size()) return absl::StrCat("'", options_.output_names[k], "'");
  return absl::StrCat("output ", k);
}

absl::Status ShardMap::ValidateGlobal(const std::vector<Tensor>& inputs) const {
  if (!spec_status_.ok()) return spec_status_;
  if (inputs.size() != in_specs_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("shard_map got ", inputs.size(),
                                                   " inputs but has ", in_specs_.size(),
                                                   " in_specs"));
  }
  for (size_t k = 0; k < inputs.size(); ++k) {
    if (!inputs[k].defined()) {
      return absl::InvalidArgumentError(absl::StrCat("shard_map ", InputName(k), " is undefined"));
    }
    if (inputs[k].is_cuda()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shard_map (global view) ", InputName(k), " ", inputs[k].ShapeString(), " lives on ",
          inputs[k].device().ToString(), "; the global view takes whole host tensors (each rank "
          "copies its block to its own device, see options.placement): pass ",
          "t.To(Device::Cpu()), or call the local view with shards on the ranks' devices"));
    }
    absl::Status s = in_specs_[k].Validate(mesh_, inputs[k].shape(),
                                           Label(options_.input_names, "input", k));
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

std::vector<Value> ShardMap::TypeLocalInputs(const std::vector<Tensor>& local) const {
  if (!spec_status_.ok()) throw OpError(spec_status_);
  if (local.size() != in_specs_.size()) {
    OpFail("shard_map got ", local.size(), " local inputs but has ", in_specs_.size(),
           " in_specs");
  }
  std::vector<Value> vals;
  vals.reserve(local.size());
  for (size_t k = 0; k < local.size(); ++k) {
    if (!local[k].defined()) OpFail("shard_map (local view): ", InputName(k), " is undefined");
    if (in_specs_[k].size() > local[k].rank()) {
      OpFail("spec ", in_specs_[k].ToString(), " of ", InputName(k),
             " has more dims than the local shard ", local[k].ShapeString());
    }
    vals.emplace_back(local[k], input_types_[k]);
  }
  return vals;
}

void ShardMap::CheckOutputs(const std::vector<Value>& outputs) const {
  if (outputs.size() != out_specs_.size()) {
    OpFail("shard_map's function returned ", outputs.size(), " outputs but there are ",
           out_specs_.size(), " out_specs");
  }
  RankContext& ctx = RankContext::Get("shard_map");
  for (size_t k = 0; k < outputs.size(); ++k) {
    if (!outputs[k].defined()) OpFail("shard_map ", OutputName(k), " is undefined");
    if (ctx.checked()) {
      CheckOutputType(outputs[k], mesh_, out_specs_[k], OutputName(k));
    }
  }
  if (options_.check_replication) CheckReplicationAtRuntime(outputs, "shard_map output");
}

Tensor ShardMap::LocalInput(const Tensor& global, size_t k, const RankContext& ctx) const {
  return ShardOf(global, mesh_, in_specs_[k], ctx.rank()).To(ctx.device());
}

void ShardMap::CheckLocalDevices(const RankContext& ctx,
                                 const std::vector<Tensor>& local_inputs) const {
  for (size_t k = 0; k < local_inputs.size(); ++k) {
    const Tensor& t = local_inputs[k];
    if (!t.defined() || t.device() == ctx.device()) continue;
    OpFail("shard_map (local view): ", InputName(k), " ", t.ShapeString(), " lives on ",
           t.device().ToString(), " but ", RankDescription(mesh_, ctx.rank()), " runs on ",
           ctx.device().ToString(), "; move the shard with t.To(ctx.device()) (or create it "
           "there) before calling");
  }
}

ShardMap::RankResult ShardMap::RunLocal(const std::vector<Tensor>& local_inputs,
                                        const RankBody& body, const char* what) const {
  RankContext& ctx = RankContext::Get(what);
  if (!(ctx.mesh() == mesh_)) {
    OpFail(what, ": the running program's mesh is ", ctx.mesh().ShortString(),
           " but this shard_map is over ", mesh_.ShortString());
  }
  CheckLocalDevices(ctx, local_inputs);
  std::vector<Value> typed = TypeLocalInputs(local_inputs);
  if (ctx.checked()) CheckSameLocalShapes(ctx, local_inputs);
  RankResult r = body(typed);
  if (!r.outputs_checked) CheckOutputs(r.outputs);
  return r;
}

std::vector<Value> ShardMap::CallLocal(const std::vector<Tensor>& local_inputs) const {
  return RunLocal(local_inputs,
                  [this](const std::vector<Value>& in) { return RankResult{fn_(in), {}}; },
                  "shard_map (local view)")
      .outputs;
}

// Even sharding gives every rank the same local shape, so a rank whose shard differs was handed
// the wrong slice. Each shard fits the spec on its own, so only a comparison across ranks (one
// small all_gather of the shapes over the world) catches it here, instead of as a confusing
// count mismatch in the first collective (or not at all).
void ShardMap::CheckSameLocalShapes(RankContext& ctx,
                                    const std::vector<Tensor>& local_inputs) const {
  constexpr int kMaxDims = 8;
  constexpr int kRecord = kMaxDims + 2;  // dtype, rank, dims
  const size_t count = local_inputs.size() * kRecord;
  std::vector<int64_t> mine(count, -1);
  for (size_t k = 0; k < local_inputs.size(); ++k) {
    const Tensor& t = local_inputs[k];
    mine[k * kRecord] = static_cast<int64_t>(t.dtype());
    mine[k * kRecord + 1] = t.rank();
    for (int d = 0; d < t.rank() && d < kMaxDims; ++d) mine[k * kRecord + 2 + d] = t.dim(d);
  }
  const int n = ctx.world().size();
  std::vector<int64_t> all(count * n);
  absl::Status s = AllGatherHost(ctx.world(), mine.data(), all.data(), count,
                                 collectives::DataType::kI64);
  if (!s.ok()) throw OpError(s);
  auto shape_of = [&](int r, size_t k) {
    const int64_t* rec = &all[r * count + k * kRecord];
    Shape shape;
    for (int d = 0; d < rec[1] && d < kMaxDims; ++d) shape.push_back(rec[2 + d]);
    return absl::StrCat(DTypeName(static_cast<DType>(rec[0])), ShapeToString(shape));
  };
  for (size_t k = 0; k < local_inputs.size(); ++k) {
    for (int r = 1; r < n; ++r) {
      if (!std::equal(&all[k * kRecord], &all[(k + 1) * kRecord], &all[r * count + k * kRecord])) {
        OpFail("shard_map (local view): ", InputName(k), " has local shard ", shape_of(0, k),
               " on rank 0 but ", shape_of(r, k), " on rank ", r, "; under spec ",
               in_specs_[k].ToString(),
               " every rank holds an equal shard. Fix: pass each rank its own slice of the "
               "global tensor (ShardOf), not a differently sized piece");
      }
    }
  }
}

SpmdType ShardMap::AssemblyType(const SpmdType& rank0, const PartitionSpec& spec) const {
  if (options_.check != TypeCheck::kErased) return rank0;
  // Types are not tracked: read the result as the spec states it (R, P on unreduced axes).
  SpmdType t(mesh_.num_axes(), AxisType::R());
  for (const std::string& a : spec.unreduced()) t[mesh_.AxisIndex(a)] = AxisType::P();
  return t;
}

absl::StatusOr<ShardMap::GlobalResult> ShardMap::RunGlobal(
    const std::vector<Tensor>& inputs, const RankBody& body,
    const std::vector<PartitionSpec>& extra_specs) const {
  if (absl::Status s = ValidateGlobal(inputs); !s.ok()) return s;
  const int n = mesh_.size();
  // Per rank: outputs then extras, back on the host.
  std::vector<std::vector<Tensor>> locals(n);
  std::vector<SpmdType> types;
  absl::Mutex mu;
  absl::Status s = RunSpmd(
      mesh_,
      [&](RankContext& ctx) {
        std::vector<Tensor> mine;
        mine.reserve(inputs.size());
        for (size_t k = 0; k < inputs.size(); ++k) mine.push_back(LocalInput(inputs[k], k, ctx));
        RankResult r = body(TypeLocalInputs(mine));
        if (!r.outputs_checked) CheckOutputs(r.outputs);
        if (r.extras.size() != extra_specs.size()) {
          OpFail("shard_map: ", r.extras.size(), " extra results for ", extra_specs.size(),
                 " specs");
        }
        // Back to the host on the rank's own stream (ordered after the work that made them).
        std::vector<Tensor>& out = locals[ctx.rank()];
        for (const Value& v : r.outputs) out.push_back(v.tensor.To(Device::Cpu()));
        for (const Value& v : r.extras) {
          out.push_back(v.defined() ? v.tensor.To(Device::Cpu()) : Tensor());
        }
        if (ctx.rank() == 0) {
          absl::MutexLock lock(&mu);
          for (const Value& v : r.outputs) types.push_back(v.type);
          for (const Value& v : r.extras) types.push_back(v.type);
          if (options_.collective_log) *options_.collective_log = ctx.collective_log();
        }
      },
      spmd_options());
  if (!s.ok()) return s;
  GlobalResult result;
  const size_t nout = out_specs_.size();
  for (size_t k = 0; k < nout + extra_specs.size(); ++k) {
    const bool extra = k >= nout;
    const PartitionSpec& spec = extra ? extra_specs[k - nout] : out_specs_[k];
    std::vector<Tensor>& dest = extra ? result.extras : result.outputs;
    if (!locals[0][k].defined()) {
      dest.push_back(Tensor());
      continue;
    }
    std::vector<Tensor> per_rank(n);
    for (int r = 0; r < n; ++r) per_rank[r] = locals[r][k];
    absl::StatusOr<Tensor> g = Assemble(mesh_, spec, per_rank, AssemblyType(types[k], spec));
    if (!g.ok()) {
      return absl::Status(g.status().code(),
                          absl::StrCat("while assembling ",
                                       extra ? absl::StrCat("extra result ", k - nout)
                                             : OutputName(k),
                                       ": ", g.status().message()));
    }
    dest.push_back(*std::move(g));
  }
  return result;
}

absl::StatusOr<std::vector<Tensor>> ShardMap::operator()(const std::vector<Tensor>& inputs) const {
  absl::StatusOr<GlobalResult> r = RunGlobal(
      inputs, [this](const std::vector<Value>& in) { return RankResult{fn_(in), {}}; }, {});
  if (!r.ok()) return r.status();
  return std::move(r->outputs);
}

}  // namespace shardmap
