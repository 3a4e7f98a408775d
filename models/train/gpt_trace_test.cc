// The --trace JSON of a training step: per rank, spans for the backward pass's ops (one per VJP,
// inside the "backward" phase) and for the collectives the VJPs issued, whose names and bytes are
// exactly the backward entries of the rank's collective log (the independent record).
#include "models/gpt/gpt_trace.h"

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/gpt.h"
#include "models/train/gpt_test_util.h"
#include "nlohmann/json.hpp"

namespace shardmap {
namespace {

std::vector<int64_t> Tokens(int64_t n, int64_t vocab) {
  std::vector<int64_t> t(n);
  for (int64_t i = 0; i < n; ++i) t[i] = (i * 7 + i / 13) % vocab;
  return t;
}

struct Traced {
  Mesh mesh;
  TrainResult result;
  nlohmann::json json;  // parsed back from its text
};

Traced TraceOneStep(const std::string& mesh_text, bool sp, int64_t layers = 1,
                    int64_t microbatches = 1, int64_t batch = 6) {
  GptConfig c = gpt_testing::SmallConfig();
  c.layers = layers;
  Traced t;
  t.mesh = *ParseMesh(mesh_text);
  absl::StatusOr<GptLayout> layout = GptLayout::Create(t.mesh, c, sp);
  EXPECT_TRUE(layout.ok()) << layout.status();
  TrainOptions o;
  o.steps = 1;
  o.batch = batch;
  o.pipeline.microbatches = microbatches;
  o.tracing.keep_events = true;
  absl::StatusOr<TrainResult> r = TrainGpt(*layout, InitGpt(c, 3), Tokens(200, c.vocab), o);
  EXPECT_TRUE(r.ok()) << r.status();
  if (r.ok()) t.result = *r;
  t.json = nlohmann::json::parse(TraceJson(t.mesh, t.result.trace).dump());
  return t;
}

// "op(axes)" -> bytes summed, of rank 0's backward log entries.
std::map<std::string, std::pair<int, int64_t>> BackwardLog(const Traced& t) {
  std::map<std::string, std::pair<int, int64_t>> m;
  for (const CollectiveRecord& r : t.result.log) {
    if (!r.backward) continue;
    auto& e = m[std::string(r.op) + "(" + t.mesh.MaskToString(r.axes) + ")"];
    e.first += 1;
    e.second += r.bytes;
  }
  return m;
}

void ExpectBackwardSpans(const std::string& mesh_text, bool sp,
                         const std::vector<std::string>& want_ops) {
  SCOPED_TRACE(mesh_text);
  const Traced t = TraceOneStep(mesh_text, sp);
  const nlohmann::json& ev = t.json.at("traceEvents");
  const auto want_collectives = BackwardLog(t);
  ASSERT_FALSE(want_collectives.empty()) << "this layout communicates in the backward pass";
  for (int rank = 0; rank < t.mesh.size(); ++rank) {
    SCOPED_TRACE(rank);
    double bwd_start = -1, bwd_end = -1;
    for (const auto& e : ev) {
      if (e["tid"] == rank && e.value("cat", "") == "phase" && e["name"] == "backward") {
        bwd_start = e["ts"].get<double>();
        bwd_end = bwd_start + e["dur"].get<double>();
      }
    }
    ASSERT_GE(bwd_start, 0) << "no backward phase";
    std::map<std::string, int> ops;
    std::map<std::string, std::pair<int, int64_t>> collectives;
    for (const auto& e : ev) {
      if (e["tid"] != rank) continue;
      const std::string cat = e.value("cat", "");
      if (cat != "backward op" && cat != "collective (backward)") continue;
      EXPECT_EQ(e["ph"], "X");
      const double ts = e["ts"], end = ts + e["dur"].get<double>();
      EXPECT_GE(ts, bwd_start - 1e-3);  // within the backward phase (us; the JSON rounds)
      EXPECT_LE(end, bwd_end + 1e-3);
      if (cat == "backward op") {
        ops[e["name"]] += 1;
      } else {
        auto& c = collectives[e["name"]];
        c.first += 1;
        c.second += e["args"]["bytes"].get<int64_t>();
      }
    }
    for (const std::string& op : want_ops) EXPECT_GT(ops[op], 0) << "no backward span of " << op;
    // Every rank contributes the same bytes in SPMD: each equals rank 0's log.
    EXPECT_EQ(collectives, want_collectives);
  }
}

TEST(GptTraceTest, FsdpTensorParallelBackwardOpsAndCollectives) {
  // The backward of the FSDP all_gather is a reduce_scatter over dp_shard; under SP the
  // all_gather / reduce_scatter over tp swap in the backward.
  ExpectBackwardSpans("dp_shard=2,tp=2", true,
                      {"all_gather", "reduce_scatter", "einsum", "layer_norm", "matmul"});
}

TEST(GptTraceTest, TensorParallelThreeRanks) {
  ExpectBackwardSpans("tp=3", false, {"all_reduce", "einsum", "embedding", "gelu"});
}

TEST(GptTraceTest, OneTrackPerRankAndPhases) {
  const Traced t = TraceOneStep("dp=2", false);
  const nlohmann::json& ev = t.json.at("traceEvents");
  std::map<int, std::vector<std::string>> phases;
  int tracks = 0;
  for (const auto& e : ev) {
    if (e["ph"] == "M") ++tracks;
    if (e.value("cat", "") == "phase") phases[e["tid"].get<int>()].push_back(e["name"]);
  }
  EXPECT_EQ(tracks, 4);  // each rank's, and its collectives'
  for (int r = 0; r < 2; ++r) {
    EXPECT_THAT(phases[r], ::testing::ElementsAre("forward", "backward", "grad reduce + clip",
                                                  "optimizer"));
  }
  // dp has no backward collectives (gradients are all-reduced after the backward): instants.
  int instants = 0;
  for (const auto& e : ev) {
    if (e["ph"] == "i") {
      ++instants;
      EXPECT_EQ(e.value("cat", ""), "collective");
      EXPECT_GT(e["args"]["bytes"].get<int64_t>(), 0);
    }
  }
  EXPECT_GT(instants, 0);
}

// Each rank's collectives track holds one span per collective of its log, from its start to its
// completion; FSDP's prefetched all-gathers (started one unit ahead) are in flight while the
// rank computes the unit before: their spans overlap op spans of the rank's own track.
TEST(GptTraceTest, CollectivesTrackShowsStartedCallsBesideCompute) {
  const Traced t = TraceOneStep("dp_shard=2", false, /*layers=*/3);
  const nlohmann::json& ev = t.json.at("traceEvents");
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE(rank);
    std::vector<std::pair<double, double>> compute, gathers;
    int in_flight = 0;
    for (const auto& e : ev) {
      if (e["ph"] != "X") continue;
      const std::string cat = e.value("cat", "");
      const double ts = e["ts"], end = ts + e["dur"].get<double>();
      if (e["tid"] == rank && (cat == "op" || cat == "backward op")) compute.push_back({ts, end});
      if (e["tid"] == kCollectiveTrackBase + rank && absl::StartsWith(cat, "in flight")) {
        ++in_flight;
        if (absl::StartsWith(e["name"].get<std::string>(), "all_gather") && cat == "in flight") {
          gathers.push_back({ts, end});
        }
      }
    }
    EXPECT_EQ(in_flight, static_cast<int>(t.result.log.size()));
    int overlapping = 0;
    for (auto [gs, ge] : gathers) {
      for (auto [cs, ce] : compute) overlapping += cs >= gs && ce <= ge && ce > cs;
    }
    EXPECT_GT(overlapping, 0) << "no op ran while an all-gather was in flight";
  }
}

// FSDP in pipeline stages (stage_fsdp.h; pp2 x dp_shard=2, 2 microbatches, stage 0 holds the
// embeddings and blocks 0-1): rank 0's collectives track shows its calls (one span each), one
// flat all_gather and one reduce_scatter per unit, and a unit's reduce-scatter in flight while
// the backward of the blocks below it runs.
TEST(GptTraceTest, PipelineStagesShowTheirFsdpCallsBesideTheBackward) {
  const Traced t = TraceOneStep("pp=2,dp_shard=2", false, /*layers=*/4, /*microbatches=*/2,
                                /*batch=*/8);
  const nlohmann::json& ev = t.json.at("traceEvents");
  std::vector<std::pair<double, double>> backward, scatters;
  int in_flight = 0, gathers = 0;
  for (const auto& e : ev) {
    if (e["ph"] != "X") continue;
    const std::string cat = e.value("cat", ""), name = e.value("name", "");
    const double ts = e["ts"], end = ts + e["dur"].get<double>();
    if (e["tid"] == 0 && cat == "backward op") backward.push_back({ts, end});
    if (e["tid"] == kCollectiveTrackBase && absl::StartsWith(cat, "in flight")) {
      ++in_flight;
      gathers += absl::StartsWith(name, "all_gather");
      if (absl::StartsWith(name, "reduce_scatter")) scatters.push_back({ts, end});
    }
  }
  EXPECT_EQ(in_flight, static_cast<int>(t.result.log.size()));
  EXPECT_EQ(gathers, 3);  // the embeddings, block 0, block 1
  ASSERT_EQ(scatters.size(), 3u);
  int overlapping = 0;
  for (auto [ss, se] : scatters) {
    for (auto [bs, be] : backward) overlapping += bs >= ss && be <= se && be > bs;
  }
  EXPECT_GT(overlapping, 0) << "no backward op ran while a reduce-scatter was in flight";
}

TEST(GptTraceTest, WriteTraceFailsClearlyOnAnUnwritablePath) {
  absl::Status s = WriteTrace("/nonexistent-dir/trace.json", Mesh(), {});
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("cannot write --trace"));
}

}  // namespace
}  // namespace shardmap
