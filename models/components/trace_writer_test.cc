#include "models/components/trace_writer.h"

#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <sys/stat.h>
#include <unistd.h>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace shardmap {
namespace {

std::string TempPath(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return std::string(tmp != nullptr ? tmp : "/tmp") + "/" + name + "." +
         std::to_string(::getpid());
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

TEST(StepFilterTest, ParsesStepsAndRanges) {
  auto f = StepFilter::Parse("2,5-7");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_FALSE(f->all());
  std::vector<int64_t> in;
  for (int64_t s = 0; s < 12; ++s) {
    if (f->Contains(s)) in.push_back(s);
  }
  EXPECT_EQ(in, (std::vector<int64_t>{2, 5, 6, 7}));
  EXPECT_EQ(f->last(), 7);
  auto merged = StepFilter::Parse(" 9, 3-4,5 ,0-0,4-6");
  ASSERT_TRUE(merged.ok()) << merged.status();
  EXPECT_EQ(merged->ranges(), (std::vector<std::pair<int64_t, int64_t>>{{0, 0}, {3, 6}, {9, 9}}));
  EXPECT_EQ(merged->last(), 9);
  for (const char* every : {"", "all", "  "}) {
    auto a = StepFilter::Parse(every);
    ASSERT_TRUE(a.ok());
    EXPECT_TRUE(a->all());
    EXPECT_TRUE(a->Contains(0));
    EXPECT_TRUE(a->Contains(123456789));
    EXPECT_EQ(a->last(), -1);
  }
  EXPECT_TRUE(StepFilter().Contains(5));
}

TEST(StepFilterTest, RejectsBadSyntax) {
  const std::pair<const char*, const char*> cases[] = {
      {"a", "'a' is not a step number"},
      {"1,,2", "an empty entry"},
      {"3,", "an empty entry"},
      {"-1", "'-1' is not a range"},
      {"5-", "'5-' is not a range"},
      {"7-5", "range '7-5' ends before it starts"},
      {"1-2-3", "'1-2-3' is not a range"},
      {"+4", "'+4' is not a step number"},
      {"2.5", "'2.5' is not a step number"},
      {"99999999999999999999", "is not a step number"},
      {"ALL", "'ALL' is not a step number"},
  };
  for (const auto& [text, why] : cases) {
    absl::StatusOr<StepFilter> f = StepFilter::Parse(text);
    ASSERT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_NE(f.status().message().find(why), std::string::npos) << f.status();
    EXPECT_NE(f.status().message().find("e.g. \"2,5-7\""), std::string::npos) << f.status();
  }
}

TEST(TraceWriterTest, ClosedFileIsValidJsonWithEveryEvent) {
  const std::string path = TempPath("closed.json");
  auto w = TraceWriter::Open(path, /*origin_us=*/1000);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE((*w)->ThreadName(0, "rank 0 (dp=0)").ok());
  ASSERT_TRUE((*w)->Span("forward", "phase", 0, 1010, 25.5).ok());
  ASSERT_TRUE((*w)->Span("all_reduce(dp)", "collective", 1, 1040, 3, {{"bytes", 4096}}).ok());
  ASSERT_TRUE((*w)->Instant("clip", "collective", 1, 1050).ok());
  ASSERT_TRUE((*w)->Write({{"name", "c"}, {"ph", "C"}, {"pid", 0}, {"ts", 1060},
                           {"args", {{"loss", 5.5}}}}).ok());
  EXPECT_EQ((*w)->events_written(), 5);
  ASSERT_TRUE((*w)->Close().ok());
  ASSERT_TRUE((*w)->Close().ok());  // idempotent
  const nlohmann::json j = nlohmann::json::parse(ReadFile(path));
  ASSERT_TRUE(j.is_array());
  ASSERT_EQ(j.size(), 5u);
  EXPECT_EQ(j[0]["ph"], "M");
  EXPECT_EQ(j[0]["args"]["name"], "rank 0 (dp=0)");
  EXPECT_EQ(j[1]["name"], "forward");
  EXPECT_EQ(j[1]["ph"], "X");
  EXPECT_DOUBLE_EQ(j[1]["ts"].get<double>(), 10.0);  // origin subtracted
  EXPECT_DOUBLE_EQ(j[1]["dur"].get<double>(), 25.5);
  EXPECT_EQ(j[2]["tid"], 1);
  EXPECT_EQ(j[2]["args"]["bytes"], 4096);
  EXPECT_EQ(j[3]["ph"], "i");
  EXPECT_DOUBLE_EQ(j[3]["ts"].get<double>(), 50.0);
  EXPECT_DOUBLE_EQ(j[4]["args"]["loss"].get<double>(), 5.5);
  EXPECT_EQ((*w)->Span("late", "phase", 0, 0, 1).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(TraceWriterTest, EmptyTraceIsAnEmptyArray) {
  const std::string path = TempPath("empty.json");
  {
    auto w = TraceWriter::Open(path);
    ASSERT_TRUE(w.ok());
  }  // the destructor closes
  EXPECT_EQ(nlohmann::json::parse(ReadFile(path)), nlohmann::json::array());
}

// A run killed before Close(): what was flushed is "[" + whole events, which the lenient
// importers complete with "]".
TEST(TraceWriterTest, UnclosedFileHoldsWholeEvents) {
  const std::string path = TempPath("crash.json");
  auto w = TraceWriter::Open(path);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(ReadFile(path), "[");  // created at Open: a crash at step 0 leaves a readable file
  EXPECT_EQ(nlohmann::json::parse(ReadFile(path) + "]"), nlohmann::json::array());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE((*w)->Span("step", "phase", 0, i, 1).ok());
  ASSERT_TRUE((*w)->Flush().ok());
  ASSERT_TRUE((*w)->Span("unflushed", "phase", 0, 9, 1).ok());
  nlohmann::json partial = nlohmann::json::parse(ReadFile(path) + "]");
  ASSERT_EQ(partial.size(), 3u);
  EXPECT_EQ(partial[2]["ts"], 2);
  // Past the buffer size, events reach the file without Flush(), still whole.
  std::string big(1000, 'x');
  for (int i = 0; i < 2000; ++i) ASSERT_TRUE((*w)->Span(big, "op", 0, i, 1).ok());
  nlohmann::json more = nlohmann::json::parse(ReadFile(path) + "]");
  EXPECT_GT(more.size(), 1000u);
  EXPECT_LT(more.size(), 2004u);
  ASSERT_TRUE((*w)->Close().ok());
  EXPECT_EQ(nlohmann::json::parse(ReadFile(path)).size(), 2004u);
}

TEST(TraceWriterTest, ConcurrentRanksWriteWholeEvents) {
  const std::string path = TempPath("threads.json");
  auto w = TraceWriter::Open(path);
  ASSERT_TRUE(w.ok());
  std::vector<std::thread> ranks;
  for (int r = 0; r < 4; ++r) {
    ranks.emplace_back([&, r] {
      for (int i = 0; i < 500; ++i) {
        ASSERT_TRUE((*w)->Span("op", "op", r, i, 1, {{"i", i}}).ok());
        if (i % 100 == 0) {
          ASSERT_TRUE((*w)->Flush().ok());
        }
      }
    });
  }
  for (std::thread& t : ranks) t.join();
  ASSERT_TRUE((*w)->Close().ok());
  const nlohmann::json j = nlohmann::json::parse(ReadFile(path));
  ASSERT_EQ(j.size(), 2000u);
  std::vector<int> per_rank(4);
  for (const auto& e : j) ++per_rank[e["tid"].get<int>()];
  EXPECT_EQ(per_rank, (std::vector<int>{500, 500, 500, 500}));
}

TEST(TraceWriterTest, Errors) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = tmp != nullptr ? tmp : "/tmp";
  auto d = TraceWriter::Open(dir);
  ASSERT_EQ(d.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(d.status().message().find("'" + dir + "'"), std::string::npos) << d.status();
  EXPECT_NE(d.status().message().find("is a directory"), std::string::npos) << d.status();
  auto m = TraceWriter::Open(dir + "/no/such/dir/t.json");
  ASSERT_EQ(m.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(m.status().message().find("directory does not exist"), std::string::npos)
      << m.status();
  EXPECT_EQ(TraceWriter::Open("").status().code(), absl::StatusCode::kInvalidArgument);
  auto full = TraceWriter::Open("/dev/full");  // every write fails with ENOSPC
  ASSERT_EQ(full.status().code(), absl::StatusCode::kDataLoss) << full.status();
  EXPECT_NE(full.status().message().find("disk full"), std::string::npos) << full.status();
  auto w = TraceWriter::Open(TempPath("bad_event.json"));
  ASSERT_TRUE(w.ok());
  EXPECT_EQ((*w)->Write(nlohmann::json::array({1, 2})).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*w)->events_written(), 0);
}

}  // namespace
}  // namespace shardmap
