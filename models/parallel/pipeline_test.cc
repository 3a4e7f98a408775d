// Pipeline timetables (the textbook GPipe and 1F1B orders, dependencies, length, activations in
// flight), the layer split, and the executor: a 3-stage toy network run over pp with both
// schedules gives the single-device loss and gradients, and so does the interleaved schedule on
// p*v layers (p = 1, 2, 3; its gradient hook hands each chunk's sums over bitwise); bad
// boundaries and chunk lists are errors.
#include "models/parallel/pipeline.h"

#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "autograd/tape.h"
#include "autograd/value_and_grad.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shardmap/collective_ops.h"
#include "shardmap/context.h"
#include "shardmap/nn_ops.h"
#include "shardmap/ops.h"
#include "shardmap/spmd_runner.h"
#include "tensor/error.h"
#include "tensor/random.h"

namespace shardmap {
namespace {

using ::testing::HasSubstr;

Timetable Make(Schedule s, int p, int m) {
  absl::StatusOr<Timetable> tt = MakeTimetable(s, p, m);
  EXPECT_TRUE(tt.ok()) << tt.status();
  return *tt;
}

TEST(TimetableTest, OneFOneBOnTwoStagesIsTheTextbookOrder) {
  // Forward and backward one tick each: stage 1 alternates from its first input on; stage 0
  // warms up with one extra forward.
  EXPECT_EQ(Make(Schedule::kOneFOneB, 2, 4).ToString(),
            "stage 0: F0 F1 . B0 F2 B1 F3 B2 . B3\n"
            "stage 1: . F0 B0 F1 B1 F2 B2 F3 B3 .\n");
}

TEST(TimetableTest, GpipeRunsAllForwardsThenAllBackwards) {
  EXPECT_EQ(Make(Schedule::kGpipe, 3, 2).ToString(),
            "stage 0: F0 F1 . . . . B0 B1\n"
            "stage 1: . F0 F1 . . B0 B1 .\n"
            "stage 2: . . F0 F1 B0 B1 . .\n");
}

TEST(TimetableTest, EveryScheduleRespectsDependenciesAndFinishesIn2TimesMPlusPMinus1) {
  for (Schedule sched : {Schedule::kGpipe, Schedule::kOneFOneB}) {
    for (int p = 1; p <= 5; ++p) {
      for (int m = 1; m <= 9; ++m) {
        Timetable tt = Make(sched, p, m);
        SCOPED_TRACE(absl::StrCat(ScheduleName(sched), " p=", p, " m=", m, "\n", tt.ToString()));
        EXPECT_EQ(tt.num_ticks(), 2 * (m + p - 1));
        std::vector<std::vector<int>> f(p, std::vector<int>(m, -1)), b = f;
        for (int t = 0; t < tt.num_ticks(); ++t) {
          for (int s = 0; s < p; ++s) {
            const PipeAction& a = tt.at(t, s);
            if (a.kind == PipeAction::kIdle) continue;
            auto& slot = (a.kind == PipeAction::kForward ? f : b)[s][a.microbatch];
            EXPECT_EQ(slot, -1) << "ran twice";
            slot = t;
          }
        }
        int idle = 0;
        for (int s = 0; s < p; ++s) {
          for (int i = 0; i < m; ++i) {
            ASSERT_GE(f[s][i], 0);
            ASSERT_GE(b[s][i], 0);
            if (s > 0) {
              EXPECT_GT(f[s][i], f[s - 1][i]);
            }
            if (s + 1 < p) {
              EXPECT_GT(b[s][i], b[s + 1][i]);
            }
            EXPECT_GT(b[s][i], f[s][i]);
          }
          // In flight: GPipe holds every microbatch, 1F1B at most p - s.
          EXPECT_EQ(tt.MaxInFlight(s), sched == Schedule::kGpipe ? m : std::min(p - s, m));
          for (int t = 0; t < tt.num_ticks(); ++t) idle += tt.at(t, s).kind == PipeAction::kIdle;
        }
        // The bubble: each stage idles 2(p-1) of 2(m+p-1) ticks.
        EXPECT_NEAR(static_cast<double>(idle) / (p * tt.num_ticks()), tt.TheoreticalBubble(),
                    1e-12);
      }
    }
  }
}

TEST(TimetableTest, BadArgumentsAreErrors) {
  EXPECT_THAT(MakeTimetable(Schedule::kGpipe, 0, 4).status().message(), HasSubstr("stages (0)"));
  EXPECT_THAT(MakeTimetable(Schedule::kGpipe, 2, 0).status().message(),
              HasSubstr("microbatches (0)"));
  EXPECT_THAT(ParseSchedule("zb").status().message(),
              HasSubstr("use gpipe, 1f1b or interleaved_1f1b"));
  EXPECT_EQ(*ParseSchedule("1f1b"), Schedule::kOneFOneB);
  EXPECT_EQ(*ParseSchedule("interleaved_1f1b"), Schedule::kInterleaved1F1B);
  EXPECT_THAT(MakeTimetable(Schedule::kOneFOneB, 2, 4, 2).status().message(),
              HasSubstr("needs --schedule=interleaved_1f1b"));
  EXPECT_THAT(MakeTimetable(Schedule::kInterleaved1F1B, 4, 6, 2).status().message(),
              HasSubstr("not a multiple of 4"));
  EXPECT_THAT(MakeTimetable(Schedule::kInterleaved1F1B, 2, 4, 0).status().message(),
              HasSubstr("virtual stages (0)"));
  EXPECT_FALSE(StageActions(Schedule::kOneFOneB, 2, 4, 2).ok());  // no stage 2
}

TEST(TimetableTest, InterleavedIsMegatronsOrder) {
  // p = 2, m = 4, v = 2: stage 0 warms up with (p-1)*2 + (v-1)*p = 4 chunk-forwards, stage 1
  // with 2; forwards go in groups of p microbatches per chunk, backwards chunks in reverse.
  auto order = [](int s) {
    std::vector<std::string> names;
    const absl::StatusOr<std::vector<PipeAction>> actions =
        StageActions(Schedule::kInterleaved1F1B, 2, 4, s, 2);
    for (const PipeAction& a : *actions) {
      names.push_back(absl::StrCat(a.kind == PipeAction::kForward ? "F" : "B", a.microbatch, ".",
                                   a.chunk));
    }
    return absl::StrJoin(names, " ");
  };
  EXPECT_EQ(order(0),
            "F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0");
  EXPECT_EQ(order(1),
            "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0");
  // One chunk: interleaved is 1F1B.
  EXPECT_EQ(MakeTimetable(Schedule::kInterleaved1F1B, 3, 5)->ToString(),
            MakeTimetable(Schedule::kOneFOneB, 3, 5)->ToString());
}

TEST(TimetableTest, InterleavedRespectsVirtualStageDependencies) {
  for (int p : {1, 2, 3, 4}) {
    for (int v : {2, 3}) {
      for (int m : {p, 2 * p, 3 * p}) {
        absl::StatusOr<Timetable> tt = MakeTimetable(Schedule::kInterleaved1F1B, p, m, v);
        ASSERT_TRUE(tt.ok()) << tt.status();
        SCOPED_TRACE(absl::StrCat("p=", p, " v=", v, " m=", m, "\n", tt->ToString()));
        const int vs_count = p * v;
        std::vector<std::vector<int>> f(vs_count, std::vector<int>(m, -1)), b = f;
        for (int t = 0; t < tt->num_ticks(); ++t) {
          for (int s = 0; s < p; ++s) {
            const PipeAction& a = tt->at(t, s);
            if (a.kind == PipeAction::kIdle) continue;
            ASSERT_LT(a.chunk, v);
            auto& slot = (a.kind == PipeAction::kForward ? f : b)[a.chunk * p + s][a.microbatch];
            EXPECT_EQ(slot, -1) << "ran twice";
            slot = t;
          }
        }
        for (int vs = 0; vs < vs_count; ++vs) {
          for (int i = 0; i < m; ++i) {
            ASSERT_GE(f[vs][i], 0);
            ASSERT_GE(b[vs][i], 0);
            if (vs > 0) {
              EXPECT_GT(f[vs][i], f[vs - 1][i]);
            }
            if (vs + 1 < vs_count) {
              EXPECT_GT(b[vs][i], b[vs + 1][i]);
            }
            EXPECT_GT(b[vs][i], f[vs][i]);
          }
        }
        // Fewer ticks than 1F1B at v times the work per tick count: the bubble shrinks.
        if (p > 1 && m > p) {
          const double bubble_ticks = tt->num_ticks() - 2.0 * m * v;
          EXPECT_LT(bubble_ticks / v, 2.0 * (p - 1)) << "no smaller bubble";
        }
      }
    }
  }
}

TEST(SplitLayersTest, EvenUnevenExplicitAndTooFew) {
  EXPECT_EQ(*SplitLayers(4, 2), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(*SplitLayers(4, 3), (std::vector<int64_t>{2, 1, 1}));
  EXPECT_EQ(*SplitLayers(5, 3, {1, 3, 1}), (std::vector<int64_t>{1, 3, 1}));
  EXPECT_THAT(SplitLayers(2, 3).status().message(), HasSubstr("2 layers cannot fill pp=3"));
  EXPECT_THAT(SplitLayers(5, 3, {2, 2}).status().message(), HasSubstr("summing to the 5"));
  EXPECT_THAT(SplitLayers(5, 3, {3, 2, 0}).status().message(), HasSubstr("no layers"));
}

// Toy network: x0 = inputs[mb], x_{s+1} = tanh(x_s W_s) for s < 3, loss = sum over mb of
// sum(x_3^2). Stage s holds W_s.
constexpr int kRows = 2, kWidth = 3, kStages = 3, kMicro = 4;

Tensor Weight(int s) { return RandomNormal({kWidth, kWidth}, 11 + s, 0.0, 0.8, DType::kF64); }
Tensor Input(int mb) { return RandomNormal({kRows, kWidth}, 100 + mb, 0.0, 1.0, DType::kF64); }

// The single-device reference: loss and dL/dW_s.
std::pair<double, std::vector<Tensor>> Reference(int layers = kStages) {
  std::pair<double, std::vector<Tensor>> out;
  absl::Status st = RunSpmd(Mesh(), [&](RankContext&) {
    Tape tape;
    std::vector<Value> w;
    for (int s = 0; s < layers; ++s) w.push_back(tape.Watch(Value::Replicated(Weight(s))));
    Value loss;
    {
      ScopedRecorder rec(&tape);
      for (int mb = 0; mb < kMicro; ++mb) {
        Value x = Value::Replicated(Input(mb));
        for (int s = 0; s < layers; ++s) x = tanh(x.matmul(w[s]));
        Value l = sum(x * x, {});
        loss = loss.defined() ? loss + l : l;
      }
    }
    std::vector<Value> g = tape.Backward(loss, LossSeed(loss), w);
    out.first = loss.item();
    for (const Value& v : g) out.second.push_back(v.tensor);
  });
  EXPECT_TRUE(st.ok()) << st;
  return out;
}

class PipelineExecutorTest : public ::testing::TestWithParam<Schedule> {};

TEST_P(PipelineExecutorTest, ThreeStagesGiveTheSingleDeviceLossAndGradients) {
  const auto [ref_loss, ref_grads] = Reference();
  Mesh mesh = *Mesh::Create({{"pp", kStages}});
  Timetable tt = Make(GetParam(), kStages, kMicro);
  std::vector<Tensor> grads(kStages);
  double loss = 0;
  absl::Mutex mu;
  absl::Status st = RunSpmd(mesh, [&](RankContext& ctx) {
    const int s = ctx.coord(0);
    SpmdType v(1);
    v[0] = AxisType::V();
    PipelineStage stage{
        .forward = [&](int mb, int, const Value& in, const std::vector<Value>& p) -> Value {
          Value x = s == 0 ? Value::Replicated(Input(mb)) : in;
          Value y = tanh(x.matmul(p[0]));
          return s == kStages - 1 ? sum(y * y, {}) : y;
        },
        .boundary_shape = {kRows, kWidth},
        .boundary_dtype = DType::kF64,
        .boundary_type = v};
    PipelineResult r = RunPipeline(tt, "pp", stage, {Value(Weight(s), v)});
    absl::MutexLock lock(&mu);
    grads[s] = r.grads[0].tensor;
    if (s == kStages - 1) loss = r.loss.item();
  });
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_NEAR(loss, ref_loss, 1e-12 * std::fabs(ref_loss));
  for (int s = 0; s < kStages; ++s) {
    for (int64_t i = 0; i < ref_grads[s].numel(); ++i) {
      EXPECT_NEAR(grads[s].at(i), ref_grads[s].at(i), 1e-12) << "stage " << s << " elem " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Schedules, PipelineExecutorTest,
                         ::testing::Values(Schedule::kGpipe, Schedule::kOneFOneB),
                         [](const ::testing::TestParamInfo<Schedule>& i) {
                           return std::string(ScheduleName(i.param) == std::string("gpipe")
                                                  ? "gpipe"
                                                  : "one_f_one_b");
                         });

TEST(PipelineExecutorTest, PeakActivationsFollowMicrobatchesInFlight) {
  // Same toy, stage 0's tape peak: 1F1B holds p microbatches, GPipe m.
  Mesh mesh = *Mesh::Create({{"pp", kStages}});
  std::vector<int64_t> peak(2);
  for (Schedule sched : {Schedule::kGpipe, Schedule::kOneFOneB}) {
    Timetable tt = Make(sched, kStages, kMicro);
    absl::Status st = RunSpmd(mesh, [&](RankContext& ctx) {
      const int s = ctx.coord(0);
      SpmdType v(1);
      v[0] = AxisType::V();
      PipelineStage stage{.forward = [&](int mb, int, const Value& in, const std::vector<Value>& p) {
                            Value x = s == 0 ? Value::Replicated(Input(mb)) : in;
                            Value y = tanh(x.matmul(p[0]));
                            return s == kStages - 1 ? sum(y * y, {}) : y;
                          },
                          .boundary_shape = {kRows, kWidth},
                          .boundary_dtype = DType::kF64,
                          .boundary_type = v};
      PipelineResult r = RunPipeline(tt, "pp", stage, {Value(Weight(s), v)});
      if (s == 0) peak[sched == Schedule::kGpipe ? 0 : 1] = r.peak_saved_bytes;
    });
    ASSERT_TRUE(st.ok()) << st;
  }
  ASSERT_GT(peak[1], 0);
  EXPECT_EQ(peak[0] * kStages, peak[1] * kMicro);  // m : p
}

// Interleaved: p stages x v chunks run the p*v-layer toy (layer vs = chunk * p + stage holds
// W_vs). Each rank passes its weights in reverse chunk order (param_chunks says which is which).
struct Interleaved {
  double loss = 0;
  std::vector<Tensor> grads;     // by layer
  std::vector<int> ready_order;  // stage 0's on_final_grad order (layers), when hooked
};

Interleaved RunInterleaved(int p, int v, int m, bool hook) {
  Interleaved out;
  out.grads.resize(p * v);
  Timetable tt = *MakeTimetable(Schedule::kInterleaved1F1B, p, m, v);
  absl::Mutex mu;
  Mesh mesh = p > 1 ? *Mesh::Create({{"pp", p}}) : Mesh();
  absl::Status st = RunSpmd(mesh, [&](RankContext& ctx) {
    const int s = p > 1 ? ctx.coord(0) : 0;
    SpmdType type(mesh.num_axes());
    if (p > 1) type[0] = AxisType::V();
    std::vector<Value> params;
    PipelineStage stage;
    for (int c = v - 1; c >= 0; --c) {
      params.push_back(Value(Weight(c * p + s), type));
      stage.param_chunks.push_back(c);
    }
    stage.forward = [&, s](int mb, int chunk, const Value& in, const std::vector<Value>& w) {
      EXPECT_EQ(w.size(), 1u);
      EXPECT_EQ(w[0].tensor.at(0), Weight(chunk * p + s).at(0)) << "chunk " << chunk;
      const int vs = chunk * p + s;
      Value x = vs == 0 ? Value(Input(mb), type) : in;
      Value y = tanh(x.matmul(w[0]));
      return vs == p * v - 1 ? sum(y * y, {}) : y;
    };
    stage.boundary_shape = {kRows, kWidth};
    stage.boundary_dtype = DType::kF64;
    stage.boundary_type = type;
    std::vector<Tensor> hooked(params.size());
    std::vector<int> order;
    if (hook) {
      stage.on_final_grad = [&](int k, const Value& g) {
        EXPECT_FALSE(hooked[k].defined()) << "parameter " << k << " handed over twice";
        hooked[k] = g.tensor;
        order.push_back((v - 1 - k) * p + s);
      };
    }
    PipelineResult r = RunPipeline(tt, p > 1 ? "pp" : "", stage, params);
    absl::MutexLock lock(&mu);
    if (hook) {
      EXPECT_TRUE(r.grads.empty());
      if (s == 0) out.ready_order = order;
    }
    for (int k = 0; k < v; ++k) {
      out.grads[(v - 1 - k) * p + s] = hook ? hooked[k] : r.grads[k].tensor;
    }
    if (s == p - 1) out.loss = r.loss.item();
  });
  EXPECT_TRUE(st.ok()) << st;
  return out;
}

TEST(PipelineExecutorTest, InterleavedGivesTheSingleDeviceLossAndGradients) {
  // (p, v, m): two and three stages (a ring of 2 and of 3), three chunks, one stage's chunks
  // handed round on itself, m a multiple of p above and at p.
  for (auto [p, v, m] : {std::tuple{2, 2, 4}, std::tuple{3, 2, 3}, std::tuple{3, 2, 6},
                         std::tuple{2, 3, 2}, std::tuple{1, 3, 2}}) {
    SCOPED_TRACE(absl::StrCat("p=", p, " v=", v, " m=", m));
    const int layers = p * v;
    // The reference runs kMicro microbatches; this one m of them.
    std::pair<double, std::vector<Tensor>> ref;
    {
      absl::Status st = RunSpmd(Mesh(), [&](RankContext&) {
        Tape tape;
        std::vector<Value> w;
        for (int l = 0; l < layers; ++l) w.push_back(tape.Watch(Value::Replicated(Weight(l))));
        Value loss;
        {
          ScopedRecorder rec(&tape);
          for (int mb = 0; mb < m; ++mb) {
            Value x = Value::Replicated(Input(mb));
            for (int l = 0; l < layers; ++l) x = tanh(x.matmul(w[l]));
            Value l = sum(x * x, {});
            loss = loss.defined() ? loss + l : l;
          }
        }
        std::vector<Value> g = tape.Backward(loss, LossSeed(loss), w);
        ref.first = loss.item();
        for (const Value& x : g) ref.second.push_back(x.tensor);
      });
      ASSERT_TRUE(st.ok()) << st;
    }
    Interleaved got = RunInterleaved(p, v, m, /*hook=*/false);
    EXPECT_NEAR(got.loss, ref.first, 1e-12 * std::fabs(ref.first));
    for (int l = 0; l < layers; ++l) {
      ASSERT_TRUE(got.grads[l].defined()) << "layer " << l;
      for (int64_t i = 0; i < ref.second[l].numel(); ++i) {
        EXPECT_NEAR(got.grads[l].at(i), ref.second[l].at(i), 1e-12) << "layer " << l << " elem " << i;
      }
    }
    // The gradient hook: the same sums bitwise, each parameter once, a chunk's as soon as its
    // last backward on the rank ran (chunk v-1's first: the drain ends with chunk 0).
    Interleaved hooked = RunInterleaved(p, v, m, /*hook=*/true);
    for (int l = 0; l < layers; ++l) {
      ASSERT_TRUE(hooked.grads[l].defined()) << "layer " << l;
      for (int64_t i = 0; i < ref.second[l].numel(); ++i) {
        EXPECT_EQ(hooked.grads[l].at(i), got.grads[l].at(i)) << "layer " << l << " elem " << i;
      }
    }
    std::vector<int> expected;
    for (int c = v - 1; c >= 0; --c) expected.push_back(c * p);
    EXPECT_EQ(hooked.ready_order, expected);
  }
}

TEST(PipelineExecutorTest, InterleavedChunksOfTheParametersMustBeNamed) {
  Mesh mesh = *Mesh::Create({{"pp", 2}});
  Timetable tt = *MakeTimetable(Schedule::kInterleaved1F1B, 2, 2, 2);
  auto run = [&](std::vector<int> chunks) {
    return RunSpmd(mesh, [&](RankContext& ctx) {
      SpmdType v(1);
      v[0] = AxisType::V();
      PipelineStage stage{.forward = [&](int, int, const Value& in, const std::vector<Value>&) {
                            return in;
                          },
                          .param_chunks = chunks,
                          .boundary_shape = {kRows, kWidth},
                          .boundary_dtype = DType::kF64,
                          .boundary_type = v};
      RunPipeline(tt, "pp", stage, {Value(Weight(ctx.coord(0)), v), Value(Weight(2), v)});
    });
  };
  EXPECT_THAT(run({}).message(), HasSubstr("runs 2 model chunks but its PipelineStage has no "
                                           "param_chunks"));
  EXPECT_THAT(run({0}).message(), HasSubstr("has 2 parameters but param_chunks names 1"));
  EXPECT_THAT(run({0, 2}).message(), HasSubstr("parameter 1 is on chunk 2 but the timetable has "
                                               "chunks 0 to 1"));
}

TEST(PipelineExecutorTest, AStageOutputOfTheWrongShapeIsAnError) {
  Mesh mesh = *Mesh::Create({{"pp", 2}});
  Timetable tt = Make(Schedule::kGpipe, 2, 2);
  absl::Status st = RunSpmd(mesh, [&](RankContext& ctx) {
    const int s = ctx.coord(0);
    SpmdType v(1);
    v[0] = AxisType::V();
    PipelineStage stage{.forward = [&](int mb, int, const Value& in, const std::vector<Value>& p) {
                          Value x = s == 0 ? Value::Replicated(Input(mb)) : in;
                          Value y = tanh(x.matmul(p[0]));
                          return s == 1 ? sum(y * y, {}) : y;
                        },
                        .boundary_shape = {kRows, kWidth + 1},
                        .boundary_dtype = DType::kF64,
                        .boundary_type = v};
    RunPipeline(tt, "pp", stage, {Value(Weight(s), v)});
  });
  EXPECT_THAT(st.message(), HasSubstr("but the stage boundary carries f64[2,4]"));
  absl::Status wrong_axis = RunSpmd(*Mesh::Create({{"pp", 3}}), [&](RankContext&) {
    RunPipeline(tt, "pp", PipelineStage{}, {});
  });
  EXPECT_THAT(wrong_axis.message(), HasSubstr("the timetable has 2 stages"));
}

TEST(PipelineCommunicatorsTest, StagesMayIssueDifferentCollectivesButAGroupMustAgree) {
  Mesh mesh = *Mesh::Create({{"pp", 2}, {"tp", 2}});
  // Stage 0 reduces over tp once, stage 1 twice: fine once numbered per axis set.
  absl::Status ok = RunSpmd(mesh, [&](RankContext& ctx) {
    CreateAllCommunicators(ctx);
    SpmdType p(2);
    p[1] = AxisType::P();
    Value x(Tensor::Full({3}, 1.0, DType::kF64), p);
    for (int i = 0; i <= ctx.coord(0); ++i) {
      EXPECT_DOUBLE_EQ(all_reduce(x, "tp").tensor.at(0), 2.0);
    }
    Value v(Tensor::Full({2}, ctx.coord(0) + 1.0, DType::kF64), SpmdType(2));
    v.type[0] = AxisType::V();
    Value got = ppermute(v, "pp", {{0, 1}, {1, 0}});
    EXPECT_DOUBLE_EQ(got.tensor.at(0), 2.0 - ctx.coord(0));
  });
  EXPECT_TRUE(ok.ok()) << ok;
  // Inside one tp group the shapes differ: still caught.
  absl::Status bad = RunSpmd(mesh, [&](RankContext& ctx) {
    CreateAllCommunicators(ctx);
    SpmdType p(2);
    p[1] = AxisType::P();
    (void)all_reduce(Value(Tensor::Full({2 + ctx.coord(1)}, 1.0, DType::kF64), p), "tp");
  });
  EXPECT_THAT(bad.message(), HasSubstr("mismatched collectives"));
}

}  // namespace
}  // namespace shardmap
