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

// One stage's end of the boundary ops and of the lockstep transfers. Virtual stage vs = chunk *
// p + stage sends to vs + 1 (stage s + 1, or stage 0's next chunk from the last stage: a ring
// when there are chunks) and its cotangent back to vs - 1. Received tensors wait in inboxes keyed
// by (microbatch, the receiving chunk).
class PipeLink {
 public:
  PipeLink(const std::string& axis, int stage, int stages, int chunks, const PipelineStage& spec)
      : axis_(axis), stage_(stage), stages_(stages), chunks_(chunks), spec_(spec) {}

  // The input of microbatch mb on `chunk` (received at an earlier tick), as a pp_recv op on
  // `tape`.
  Value Receive(int mb, int chunk, Tape& tape) {
    auto it = fwd_in_.find({mb, chunk});
    if (it == fwd_in_.end()) {
      OpFail("pipeline stage ", stage_, ": the input of microbatch ", mb, Chunk(chunk),
             " has not arrived (a timetable that runs a forward before its predecessor's)");
    }
    Value x(it->second, spec_.boundary_type);
    fwd_in_.erase(it);
    Value token = tape.Watch(Value(Tensor::Empty({0}, x.dtype(), x.tensor.device()), x.type));
    tape.Record("pp_recv", {&token}, x, [this](const Value& g, uint32_t, Value*) {
      bwd_out_ = g.tensor;  // to the previous (virtual) stage at the end of this tick
    });
    return x;
  }

  // Sends y (microbatch mb, from `chunk`) at the end of this tick; returns the pp_send token to
  // seed the backward with.
  Value Send(int mb, int chunk, const Value& y_in, Tape& tape) {
    if (y_in.shape() != spec_.boundary_shape || y_in.dtype() != spec_.boundary_dtype ||
        !SameKinds(y_in.type, spec_.boundary_type)) {
      const Value& y = y_in;
      RankContext* ctx = RankContext::Current();
      const std::vector<std::string> names =
          ctx ? ctx->mesh().axis_names() : std::vector<std::string>{};
      OpFail("pipeline stage ", stage_, " output of microbatch ", mb, Chunk(chunk), " is ",
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
      tape.Record("pp_send", {&y_in}, token,
                  [this, mb, chunk, dual](const Value&, uint32_t, Value* d) {
                    auto it = bwd_in_.find({mb, chunk});
                    if (it == bwd_in_.end()) {
                      OpFail("pipeline stage ", stage_, ": the cotangent of microbatch ", mb,
                             Chunk(chunk),
                             " has not arrived from the next stage (a backward before its "
                             "successor's)");
                    }
                    d[0] = Value(it->second, dual);
                    bwd_in_.erase(it);
                  });
    }
    return token;
  }

  // The transfers at the end of `tick`: forwards if any (virtual) stage with a successor ran a
  // forward, backwards if any with a predecessor ran a backward (the same decision on every
  // rank).
  void Exchange(const Timetable& tt, int tick) {
    NoGradScope no_tape;
    const int p = stages_, last = p * chunks_ - 1;
    // Only the pairs whose source ran the matching action this tick (the same list on every
    // rank); the other ranks pass a buffer of the same size that nobody reads.
    std::vector<std::pair<int, int>> fwd, bwd;
    for (int s = 0; s < p; ++s) {
      const PipeAction& a = tt.at(tick, s);
      const int vs = a.chunk * p + s;
      if (a.kind == PipeAction::kForward && vs < last) fwd.push_back({s, (s + 1) % p});
      if (a.kind == PipeAction::kBackward && vs > 0) bwd.push_back({s, (s + p - 1) % p});
    }
    const int prev = (stage_ + p - 1) % p, next = (stage_ + 1) % p;
    if (!fwd.empty()) {
      const PipeAction& a = tt.at(tick, prev);
      const int vs = a.chunk * p + prev;
      Tensor got = Move(fwd_out_, spec_.boundary_type, fwd);
      if (a.kind == PipeAction::kForward && vs < last) fwd_in_[{a.microbatch, (vs + 1) / p}] = got;
    }
    if (!bwd.empty()) {
      const PipeAction& a = tt.at(tick, next);
      const int vs = a.chunk * p + next;
      Tensor got = Move(bwd_out_, Dual(spec_.boundary_type), bwd);
      if (a.kind == PipeAction::kBackward && vs > 0) bwd_in_[{a.microbatch, (vs - 1) / p}] = got;
    }
    fwd_out_ = Tensor();
    bwd_out_ = Tensor();
  }

 private:
  // One typed ppermute of `out` (or zeros, for a rank that sends nothing) over `pairs`; one
  // stage (chunks only: the ring is this stage itself) keeps what it sent.
  Tensor Move(const Tensor& out, const SpmdType& type,
              const std::vector<std::pair<int, int>>& pairs) {
    if (stages_ == 1) return out;
    Value send(out.defined() ? out : Zeros(), type);
    return ppermute(send, axis_, pairs).tensor;
  }

  // On the rank's device (its GPU for GPU ranks): the boundary buffers the ppermutes fill.
  Tensor Zeros() const {
    return Tensor::Zeros(spec_.boundary_shape, spec_.boundary_dtype,
                         RankContext::Get("RunPipeline").device());
  }

  std::string Chunk(int chunk) const {
    return chunks_ > 1 ? absl::StrCat(" (chunk ", chunk, ")") : std::string();
  }

  std::string axis_;
  int stage_, stages_, chunks_;
  const PipelineStage& spec_;
  // By (microbatch, chunk): received and not yet used.
  std::map<std::pair<int, int>, Tensor> fwd_in_, bwd_in_;
  Tensor fwd_out_, bwd_out_;  // this tick's sends
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

namespace {

// Which parameters each chunk runs with (indices into params, in order): spec.param_chunks, or
// every parameter on chunk 0 when it is empty. Throws OpError for a malformed list.
std::vector<std::vector<int>> ChunkParams(const PipelineStage& spec, int chunks, int stage,
                                          size_t num_params) {
  std::vector<std::vector<int>> of(chunks);
  if (spec.param_chunks.empty() && chunks > 1 && num_params > 0) {
    OpFail("RunPipeline: stage ", stage, " runs ", chunks, " model chunks but its PipelineStage "
           "has no param_chunks; say which chunk each of its ", num_params, " parameters "
           "belongs to");
  }
  if (!spec.param_chunks.empty() && spec.param_chunks.size() != num_params) {
    OpFail("RunPipeline: stage ", stage, " has ", num_params, " parameters but param_chunks "
           "names ", spec.param_chunks.size(), "; give one chunk per parameter");
  }
  for (size_t k = 0; k < num_params; ++k) {
    const int c = spec.param_chunks.empty() ? 0 : spec.param_chunks[k];
    if (c < 0 || c >= chunks) {
      OpFail("RunPipeline: stage ", stage, " parameter ", k, " is on chunk ", c,
             " but the timetable has chunks 0 to ", chunks - 1, " per stage");
    }
    of[c].push_back(static_cast<int>(k));
  }
  return of;
}

}  // namespace

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
  const int s = ai < 0 ? 0 : ctx.coord(ai);
  const int p = tt.stages(), v = tt.virtual_stages(), last_vs = p * v - 1;
  const std::vector<std::vector<int>> chunk_params = ChunkParams(stage, v, s, params.size());
  CreateAllCommunicators(ctx);
  PipeLink link(axis, s, p, v, stage);
  Tape tape;
  if (stage.backward_observer != nullptr) tape.set_backward_observer(stage.backward_observer);
  std::vector<Value> watched;
  for (const Value& x : params) watched.push_back(tape.Watch(x));
  std::vector<std::vector<Value>> chunk_watched(v);
  for (int c = 0; c < v; ++c) {
    for (int k : chunk_params[c]) chunk_watched[c].push_back(watched[k]);
  }
  // pp_send tokens, or losses on the last virtual stage, by microbatch * v + chunk.
  std::vector<Value> outs(static_cast<size_t>(tt.microbatches()) * v);
  std::vector<int> last_backward(v, -1);  // per chunk: this stage's last backward tick
  for (int t = 0; t < tt.num_ticks(); ++t) {
    const PipeAction& a = tt.at(t, s);
    if (a.kind == PipeAction::kBackward) last_backward[a.chunk] = t;
  }
  PipelineResult r;
  r.grads.resize(params.size());  // undefined until a chunk's first backward adds to it
  const double start = NowUs();
  for (int t = 0; t < tt.num_ticks(); ++t) {
    const PipeAction& a = tt.at(t, s);
    const int vs = a.chunk * p + s;
    const double t0 = NowUs();
    Value* slot = a.kind == PipeAction::kIdle
                      ? nullptr
                      : &outs[static_cast<size_t>(a.microbatch) * v + a.chunk];
    if (a.kind == PipeAction::kForward) {
      Value& out = *slot;
      Value x = vs > 0 ? link.Receive(a.microbatch, a.chunk, tape) : Value();
      ScopedRecorder rec(&tape);
      Value y = stage.forward(a.microbatch, a.chunk, x, chunk_watched[a.chunk]);
      if (vs < last_vs) {
        out = link.Send(a.microbatch, a.chunk, y, tape);
      } else {
        // The last virtual stage's loss is its share of the pipeline's (the others add nothing).
        if (ai >= 0 && y.type[ai].kind == AxisKind::kV) y = reinterpret(y, axis);
        out = y;
        NoGradScope no_tape;
        Value plain(y.tensor, y.type);
        r.loss = r.loss.defined() ? r.loss + plain : plain;
      }
    } else if (a.kind == PipeAction::kBackward) {
      Value& out = *slot;
      const std::vector<int>& ks = chunk_params[a.chunk];
      Value seed = vs == last_vs ? LossSeed(out)
                                 : Value(Tensor::Empty({0}, out.dtype(), out.tensor.device()),
                                         Dual(out.type));
      Tape::GradReadyFn on_ready;
      if (stage.on_final_grad && t == last_backward[a.chunk]) {
        // The microbatches' sum, as below (the same op in the same order), handed over.
        on_ready = [&](int i, const Value& g) {
          const int k = ks[i];
          stage.on_final_grad(k, r.grads[k].defined() ? r.grads[k] + g : g);
        };
      }
      std::vector<Value> g = tape.BackwardAndRelease(out, seed, chunk_watched[a.chunk], on_ready);
      out = Value();
      NoGradScope no_tape;
      for (size_t i = 0; i < g.size(); ++i) {
        Value& sum = r.grads[ks[i]];
        sum = on_ready ? Value() : sum.defined() ? sum + g[i] : g[i];  // handed over, or added
      }
    }
    if (a.kind != PipeAction::kIdle) {
      const double t1 = NowUs();
      r.busy_us += t1 - t0;
      r.spans.push_back({a, t0, t1 - t0});
    }
    link.Exchange(tt, t);
  }
  if (stage.on_final_grad) r.grads.clear();  // handed over
  r.total_us = NowUs() - start;
  r.peak_saved_bytes = tape.peak_saved_bytes();
  r.recorded_bytes = tape.recorded_bytes();
  r.largest_recorded_bytes = tape.largest_recorded_bytes();
  return r;
}

}  // namespace shardmap
