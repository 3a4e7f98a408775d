#include "models/run/trace_merge.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace shardmap {
namespace {

std::string Dir(const std::string& name) {
  const char* t = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(t != nullptr ? t : "/tmp") + "/" + name;
  ::mkdir(dir.c_str(), 0755);
  return dir;
}

std::string Read(const std::string& path) {
  std::ifstream f(path);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

void Write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

TEST(TraceMergeTest, AppendsThePartsAndRemovesThem) {
  const std::string trace = Dir("merge") + "/t.json";
  Write(trace, R"([{"name":"a","tid":0}])");
  Write(TracePartPath(trace, 1), R"([{"name":"b","tid":1}])");
  Write(TracePartPath(trace, 2), R"([{"name":"c","tid":2}])");
  ASSERT_TRUE(MergeTraceParts(trace, 3).ok());
  nlohmann::json j = nlohmann::json::parse(Read(trace));
  ASSERT_EQ(j.size(), 3u);
  EXPECT_EQ(j[2]["name"], "c");
  EXPECT_NE(::access(TracePartPath(trace, 1).c_str(), F_OK), 0);
  EXPECT_NE(::access(TracePartPath(trace, 2).c_str(), F_OK), 0);
}

// Issue 48: the merge wrote "<trace>.tmp.<pid>" with a plain open: a symlink planted there made
// rank 0 overwrite the file it points to, and left the trace a link to it.
TEST(TraceMergeTest, NeverWritesThroughASymlinkAtAPredictableTemporaryName) {
  const std::string dir = Dir("planted");
  const std::string trace = dir + "/t.json";
  const std::string victim = Dir("outside") + "/victim.txt";
  Write(victim, "precious\n");
  Write(trace, R"([{"name":"a"}])");
  Write(TracePartPath(trace, 1), R"([{"name":"b"}])");
  const std::string old_temp = trace + ".tmp." + std::to_string(::getpid());
  ASSERT_EQ(::symlink(victim.c_str(), old_temp.c_str()), 0);
  ASSERT_TRUE(MergeTraceParts(trace, 2).ok());
  EXPECT_EQ(Read(victim), "precious\n");
  struct stat st;
  ASSERT_EQ(::lstat(trace.c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(nlohmann::json::parse(Read(trace)).size(), 2u);
}

TEST(TraceMergeTest, AMissingOrDamagedPartIsNamedAndTheTraceKept) {
  const std::string trace = Dir("damaged") + "/t.json";
  Write(trace, R"([{"name":"a"}])");
  absl::Status missing = MergeTraceParts(trace, 2);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.message().find("t.json.rank1"), std::string::npos) << missing;
  Write(TracePartPath(trace, 1), "{not json");
  absl::Status damaged = MergeTraceParts(trace, 2);
  ASSERT_FALSE(damaged.ok());
  EXPECT_NE(damaged.message().find("is not a trace to merge"), std::string::npos) << damaged;
  EXPECT_EQ(Read(trace), R"([{"name":"a"}])");
}

}  // namespace
}  // namespace shardmap
