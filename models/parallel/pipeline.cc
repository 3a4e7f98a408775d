#include "models/parallel/pipeline.h"

#include <chrono>
#include <map>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "autograd/tape.h"
#include "autograd/value_and_grad.h"
#include "shardmap/collective_ops.h"
#include "shardmap/context.h"
#include "shardmap/ops.h"
#include "shardmap/tape_hook.h"
#include "tensor/error.h"

namespace shardmap {
namespace {

double NowUs() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string ActionName(const PipeAction& a, bool chunks) {
  const std::string chunk = chunks ? absl::StrCat(".", a.chunk) : "";
  switch (a.kind) {
    case PipeAction::kForward:
      return absl::StrCat("F", a.microbatch, chunk);
    case PipeAction::kBackward:
      return absl::StrCat("B", a.microbatch, chunk);
    default:
      return ".";
  }
}

bool SameKinds(const SpmdType& a, const SpmdType& b) {
  if (a.num_axes() != b.num_axes()) return false;
  for (int i = 0; i < a.num_axes(); ++i) {
    if (a[i].kind != b[i].kind) return false;
  }
  return true;
}

// Stage s's actions in its schedule's order (arguments checked by StageActions).
std::vector<PipeAction> StageOrder(Schedule schedule, int p, int m, int s, int v) {
  std::vector<PipeAction> order;
  auto f = [&](int mb, int chunk = 0) { order.push_back({PipeAction::kForward, mb, chunk}); };
  auto b = [&](int mb, int chunk = 0) { order.push_back({PipeAction::kBackward, mb, chunk}); };
  if (schedule == Schedule::kGpipe) {
    for (int i = 0; i < m; ++i) f(i);
    for (int i = 0; i < m; ++i) b(i);
    return order;
  }
  if (schedule == Schedule::kInterleaved1F1B && v > 1) {
    // Megatron-LM's interleaved order: the k-th forward runs chunk (k mod pv) / p of
    // microbatch (k / pv) p + k mod p; backwards visit the chunks in reverse.
    const int total = m * v;
    const int warmup = m == p ? total : std::min(total, (p - s - 1) * 2 + (v - 1) * p);
    auto mb_of = [&](int k) { return (k / (p * v)) * p + k % p; };
    auto fchunk = [&](int k) { return (k % (p * v)) / p; };
    for (int k = 0; k < warmup; ++k) f(mb_of(k), fchunk(k));
    for (int i = 0; i < total - warmup; ++i) {
      f(mb_of(warmup + i), fchunk(warmup + i));
      b(mb_of(i), v - 1 - fchunk(i));
    }
    for (int k = total - warmup; k < total; ++k) b(mb_of(k), v - 1 - fchunk(k));
    return order;
  }
  const int warmup = std::min(p - 1 - s, m);
  for (int i = 0; i < warmup; ++i) f(i);
  for (int i = 0; i < m - warmup; ++i) {
    f(warmup + i);
    b(i);
  }
  for (int i = m - warmup; i < m; ++i) b(i);
  return order;
}

// One stage's end of the boundary ops and of the lockstep transfers.
class PipeLink {
 public:
  PipeLink(const std::string& axis, int stage, int stages, const PipelineStage& spec)
      : axis_(axis), stage_(stage), stages_(stages), spec_(spec) {}

  // The input of microbatch mb (received at an earlier tick), as a pp_recv op on `tape`.
  Value Receive(int mb, Tape& tape) {
    auto it = fwd_in_.find(mb);
    if (it == fwd_in_.end()) {
      OpFail("pipeline stage ", stage_, ": the input of microbatch ", mb,
             " has not arrived (a timetable that runs a forward before its predecessor's)");
    }
    Value x(it->second, spec_.boundary_type);
    fwd_in_.erase(it);
    Value token = tape.Watch(Value(Tensor::Empty({0}, x.dtype(), x.tensor.device()), x.type));
    tape.Record("pp_recv", {&token}, x, [this](const Value& g, uint32_t, Value*) {
      bwd_out_ = g.tensor;  // to the previous stage at the end of this tick
    });
    return x;
  }

  // Sends y (microbatch mb) at the end of this tick; returns the pp_send token to seed mb's
  // backward with.
  Value Send(int mb, const Value& y_in, Tape& tape) {
    if (y_in.shape() != spec_.boundary_shape || y_in.dtype() != spec_.boundary_dtype ||
        !SameKinds(y_in.type, spec_.boundary_type)) {
      const Value& y = y_in;
      RankContext* ctx = RankContext::Current();
      const std::vector<std::string> names =
          ctx ? ctx->mesh().axis_names() : std::vector<std::string>{};
      OpFail("pipeline stage ", stage_, " output of microbatch ", mb, " is ",
             DTypeName(y.dtype()), ShapeToString(y.shape()), y.type.ToString(names),
             " but the stage boundary carries ", DTypeName(spec_.boundary_dtype),
             ShapeToString(spec_.boundary_shape), spec_.boundary_type.ToString(names),
             "; every stage must send the boundary's shape, dtype and type");
    }
    // V and S(d) are one kind (per-device values); ops may forget the d (a reshape), so the
    // boundary keeps the layout it was declared with.
    Value y = y_in;
    y.type = spec_.boundary_type;
    fwd_out_ = y.tensor;
    Value token(Tensor::Empty({0}, y.dtype(), y.tensor.device()), y.type);
    if (y.node >= 0) {
      const SpmdType dual = Dual(y_in.type);
      tape.Record("pp_send", {&y_in}, token, [this, mb, dual](const Value&, uint32_t, Value* d) {
        auto it = bwd_in_.find(mb);
        if (it == bwd_in_.end()) {
          OpFail("pipeline stage ", stage_, ": the cotangent of microbatch ", mb,
                 " has not arrived from the next stage (a backward before its successor's)");
        }
        d[0] = Value(it->second, dual);
        bwd_in_.erase(it);
      });
    }
    return token;
  }

  // The transfers at the end of `tick`: forwards if any stage with a successor ran a forward,
  // backwards if any stage with a predecessor ran a backward (the same decision on every rank).
  void Exchange(const Timetable& tt, int tick) {
    NoGradScope no_tape;
    // Only the pairs whose source ran the matching action this tick (the same list on every
    // rank); the other ranks pass a buffer of the same size that nobody reads.
    std::vector<std::pair<int, int>> fwd, bwd;
    for (int s = 0; s < stages_; ++s) {
      const PipeAction& a = tt.at(tick, s);
      if (a.kind == PipeAction::kForward && s + 1 < stages_) fwd.push_back({s, s + 1});
      if (a.kind == PipeAction::kBackward && s > 0) bwd.push_back({s, s - 1});
    }
    if (!fwd.empty()) {
      Value send(fwd_out_.defined() ? fwd_out_ : Zeros(), spec_.boundary_type);
      Value got = ppermute(send, axis_, fwd);
      const PipeAction& prev = stage_ > 0 ? tt.at(tick, stage_ - 1) : PipeAction{};
      if (prev.kind == PipeAction::kForward) fwd_in_[prev.microbatch] = got.tensor;
    }
    if (!bwd.empty()) {
      Value send(bwd_out_.defined() ? bwd_out_ : Zeros(), Dual(spec_.boundary_type));
      Value got = ppermute(send, axis_, bwd);
      const PipeAction& next = stage_ + 1 < stages_ ? tt.at(tick, stage_ + 1) : PipeAction{};
      if (next.kind == PipeAction::kBackward) bwd_in_[next.microbatch] = got.tensor;
    }
    fwd_out_ = Tensor();
    bwd_out_ = Tensor();
  }

 private:
  // On the rank's device (its GPU for GPU ranks): the boundary buffers the ppermutes fill.
  Tensor Zeros() const {
    return Tensor::Zeros(spec_.boundary_shape, spec_.boundary_dtype,
                         RankContext::Get("RunPipeline").device());
  }

  std::string axis_;
  int stage_, stages_;
  const PipelineStage& spec_;
  std::map<int, Tensor> fwd_in_, bwd_in_;  // by microbatch, received and not yet used
  Tensor fwd_out_, bwd_out_;               // this tick's sends
};

}  // namespace

absl::StatusOr<Schedule> ParseSchedule(const std::string& name) {
  if (name == "gpipe") return Schedule::kGpipe;
  if (name == "1f1b") return Schedule::kOneFOneB;
  if (name == "interleaved_1f1b") return Schedule::kInterleaved1F1B;
  return absl::InvalidArgumentError(absl::StrCat(
      "--schedule: unknown pipeline schedule '", name, "'; use gpipe, 1f1b or interleaved_1f1b"));
}

const char* ScheduleName(Schedule s) {
  switch (s) {
    case Schedule::kGpipe:
      return "gpipe";
    case Schedule::kOneFOneB:
      return "1f1b";
    default:
      return "interleaved_1f1b";
  }
}

absl::StatusOr<std::vector<PipeAction>> StageActions(Schedule schedule, int stages,
                                                     int microbatches, int stage,
                                                     int virtual_stages) {
  if (stages < 1 || microbatches < 1 || virtual_stages < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pipeline: stages (", stages, "), microbatches (", microbatches,
        ") and virtual stages (", virtual_stages, ") must be >= 1"));
  }
  if (stage < 0 || stage >= stages) {
    return absl::InvalidArgumentError(
        absl::StrCat("pipeline: stage ", stage, " outside [0, ", stages, ")"));
  }
  if (virtual_stages > 1 && schedule != Schedule::kInterleaved1F1B) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pipeline: --virtual_stages ", virtual_stages, " needs --schedule=interleaved_1f1b (",
        ScheduleName(schedule), " runs one chunk per stage)"));
  }
  if (schedule == Schedule::kInterleaved1F1B && virtual_stages > 1 &&
      microbatches % stages != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pipeline: the interleaved schedule runs microbatches in groups of the ", stages,
        " stages; ", microbatches, " microbatches is not a multiple of ", stages,
        ": use a multiple (e.g. ", stages * ((microbatches + stages - 1) / stages), ")"));
  }
  return StageOrder(schedule, stages, microbatches, stage, virtual_stages);
}

std::string Timetable::ToString() const {
  std::string out;
  for (int s = 0; s < stages_; ++s) {
    std::vector<std::string> row;
    for (int t = 0; t < num_ticks(); ++t) row.push_back(ActionName(at(t, s), virtual_stages_ > 1));
    absl::StrAppend(&out, "stage ", s, ": ", absl::StrJoin(row, " "), "\n");
  }
  return out;
}

int Timetable::MaxInFlight(int stage) const {
  int now = 0, most = 0;
  for (int t = 0; t < num_ticks(); ++t) {
    const PipeAction& a = at(t, stage);
    if (a.kind == PipeAction::kForward) most = std::max(most, ++now);
    if (a.kind == PipeAction::kBackward) --now;
  }
  return most;
}

double Timetable::TheoreticalBubble() const {
  return static_cast<double>(stages_ - 1) / static_cast<double>(microbatches_ + stages_ - 1);
}

absl::StatusOr<Timetable> MakeTimetable(Schedule schedule, int stages, int microbatches,
                                        int virtual_stages) {
  const int p = stages, m = microbatches, v = virtual_stages;
  std::vector<std::vector<PipeAction>> order(std::max(p, 0));
  for (int s = 0; s < p; ++s) {
    absl::StatusOr<std::vector<PipeAction>> o = StageActions(schedule, p, m, s, v);
    if (!o.ok()) return o.status();
    order[s] = *std::move(o);
  }
  if (p < 1) return StageActions(schedule, p, m, 0, v).status();
  // done_f[vs][mb] / done_b[vs][mb]: the tick it ran at on virtual stage vs = chunk * p + stage
  // (-1: not yet).
  std::vector<std::vector<int>> done_f(p * v, std::vector<int>(m, -1)), done_b = done_f;
  std::vector<size_t> next(p, 0);
  Timetable tt;
  tt.stages_ = p;
  tt.microbatches_ = m;
  tt.virtual_stages_ = v;
  tt.schedule_ = schedule;
  const int last = p * v - 1;
  auto ran = [](int at, int tick) { return at >= 0 && at < tick; };
  for (int tick = 0;; ++tick) {
    bool left = false;
    for (int s = 0; s < p; ++s) left |= next[s] < order[s].size();
    if (!left) break;
    if (tick > 4 * v * (m + p) + 4) {
      return absl::InternalError("pipeline timetable: no progress (a bug in the schedule)");
    }
    std::vector<PipeAction> row(p);
    for (int s = 0; s < p; ++s) {
      if (next[s] == order[s].size()) continue;
      const PipeAction a = order[s][next[s]];
      const int vs = a.chunk * p + s;
      const bool ready = a.kind == PipeAction::kForward
                             ? (vs == 0 || ran(done_f[vs - 1][a.microbatch], tick))
                             : (vs == last ? ran(done_f[vs][a.microbatch], tick)
                                           : ran(done_b[vs + 1][a.microbatch], tick));
      if (!ready) continue;
      row[s] = a;
      (a.kind == PipeAction::kForward ? done_f : done_b)[vs][a.microbatch] = tick;
      ++next[s];
    }
    tt.ticks_.push_back(std::move(row));
  }
  return tt;
}

absl::StatusOr<std::vector<int64_t>> SplitLayers(int64_t layers, int stages,
                                                 const std::vector<int64_t>& sizes) {
  if (stages < 1) return absl::InvalidArgumentError("pipeline: stages must be >= 1");
  if (layers < stages) {
    return absl::InvalidArgumentError(
        absl::StrCat("pipeline: ", layers, " layers cannot fill pp=", stages,
                     " stages (each stage needs at least one block); use pp <= layers"));
  }
  if (!sizes.empty()) {
    int64_t total = 0;
    for (int64_t n : sizes) {
      if (n < 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            "pipeline: stage sizes ", absl::StrJoin(sizes, ","), " give a stage no layers"));
      }
      total += n;
    }
    if (static_cast<int>(sizes.size()) != stages || total != layers) {
      return absl::InvalidArgumentError(absl::StrCat(
          "pipeline: stage sizes ", absl::StrJoin(sizes, ","), " must be ", stages,
          " numbers summing to the ", layers, " layers"));
    }
    return sizes;
  }
  std::vector<int64_t> out(stages, layers / stages);
  for (int s = 0; s < layers % stages; ++s) ++out[s];
  return out;
}

void CreateAllCommunicators(RankContext& ctx) {
  const int n = ctx.mesh().num_axes();
  for (AxisMask mask = 1; mask < (AxisMask{1} << n); ++mask) ctx.Comm(mask);
  ctx.set_number_per_axis_set(true);
}

PipelineResult RunPipeline(const Timetable& tt, const std::string& axis,
                           const PipelineStage& stage, const std::vector<Value>& params) {
  RankContext& ctx = RankContext::Get("RunPipeline");
  const int ai = axis.empty() ? -1 : ctx.mesh().AxisIndex(axis);
  // One stage needs no axis (microbatching only).
  if ((ai < 0 && tt.stages() != 1) || (ai >= 0 && ctx.mesh().axis_size(ai) != tt.stages())) {
    OpFail("RunPipeline: the timetable has ", tt.stages(), " stages but the mesh ",
           ctx.mesh().ShortString(), " has ",
           ai < 0 ? std::string("no axis '") + axis + "'"
                  : absl::StrCat(ctx.mesh().axis_size(ai), " devices on '", axis, "'"));
  }
  if (tt.virtual_stages() > 1) {
    OpFail("RunPipeline: a timetable of ", tt.virtual_stages(),
           " model chunks per stage (interleaved 1F1B) is not run by this executor yet; use one "
           "chunk per stage (--schedule=1f1b)");
  }
  const int s = ai < 0 ? 0 : ctx.coord(ai);
  CreateAllCommunicators(ctx);
  const int p = tt.stages();
  const bool last = s == p - 1;
  PipeLink link(axis, s, p, stage);
  Tape tape;
  if (stage.backward_observer != nullptr) tape.set_backward_observer(stage.backward_observer);
  std::vector<Value> watched;
  for (const Value& v : params) watched.push_back(tape.Watch(v));
  std::vector<Value> outs(tt.microbatches());  // pp_send tokens, or losses on the last stage
  int last_backward = -1;  // this stage's last backward tick
  for (int t = 0; t < tt.num_ticks(); ++t) {
    if (tt.at(t, s).kind == PipeAction::kBackward) last_backward = t;
  }
  PipelineResult r;
  const double start = NowUs();
  for (int t = 0; t < tt.num_ticks(); ++t) {
    const PipeAction& a = tt.at(t, s);
    const double t0 = NowUs();
    if (a.kind == PipeAction::kForward) {
      Value x = s > 0 ? link.Receive(a.microbatch, tape) : Value();
      ScopedRecorder rec(&tape);
      Value y = stage.forward(a.microbatch, x, watched);
      if (!last) {
        outs[a.microbatch] = link.Send(a.microbatch, y, tape);
      } else {
        // The last stage's loss is its share of the pipeline's (the others add nothing).
        if (ai >= 0 && y.type[ai].kind == AxisKind::kV) y = reinterpret(y, axis);
        outs[a.microbatch] = y;
        NoGradScope no_tape;
        Value plain(y.tensor, y.type);
        r.loss = r.loss.defined() ? r.loss + plain : plain;
      }
    } else if (a.kind == PipeAction::kBackward) {
      Value& out = outs[a.microbatch];
      Value seed = last ? LossSeed(out)
                        : Value(Tensor::Empty({0}, out.dtype(), out.tensor.device()),
                                Dual(out.type));
      Tape::GradReadyFn on_ready;
      if (stage.on_final_grad && t == last_backward) {
        // The microbatches' sum, as below (the same op in the same order), handed over.
        on_ready = [&](int k, const Value& g) {
          stage.on_final_grad(k, r.grads.empty() ? g : r.grads[k] + g);
        };
      }
      std::vector<Value> g = tape.BackwardAndRelease(out, seed, watched, on_ready);
      out = Value();
      NoGradScope no_tape;
      if (on_ready) {
        r.grads.clear();  // handed over
      } else if (r.grads.empty()) {
        r.grads = std::move(g);
      } else {
        for (size_t i = 0; i < g.size(); ++i) r.grads[i] = r.grads[i] + g[i];
      }
    }
    if (a.kind != PipeAction::kIdle) {
      const double t1 = NowUs();
      r.busy_us += t1 - t0;
      r.spans.push_back({a, t0, t1 - t0});
    }
    link.Exchange(tt, t);
  }
  r.total_us = NowUs() - start;
  r.peak_saved_bytes = tape.peak_saved_bytes();
  r.recorded_bytes = tape.recorded_bytes();
  r.largest_recorded_bytes = tape.largest_recorded_bytes();
  return r;
}

}  // namespace shardmap
