#include "models/components/atomic_file.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace shardmap {
namespace {

class AtomicFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* t = std::getenv("TEST_TMPDIR");
    dir_ = std::string(t != nullptr ? t : "/tmp") + "/atomic_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    ::mkdir(dir_.c_str(), 0755);
  }
  std::vector<std::string> Files() const {
    std::vector<std::string> out;
    DIR* d = ::opendir(dir_.c_str());
    while (const dirent* e = ::readdir(d)) {
      const std::string n = e->d_name;
      if (n != "." && n != "..") out.push_back(n);
    }
    ::closedir(d);
    std::sort(out.begin(), out.end());
    return out;
  }
  static std::string Read(const std::string& p) {
    std::stringstream s;
    s << std::ifstream(p).rdbuf();
    return s.str();
  }
  std::string dir_;
};

TEST_F(AtomicFileTest, WritesAndReplaces) {
  const std::string p = dir_ + "/f";
  ASSERT_TRUE(WriteFileAtomically(p, [](int fd) { return WriteAll(fd, "one", 3); }).ok());
  ASSERT_TRUE(WriteFileAtomically(p, [](int fd) { return WriteAll(fd, "two!", 4); }).ok());
  EXPECT_EQ(Read(p), "two!");
  EXPECT_EQ(Files(), std::vector<std::string>{"f"});
}

TEST_F(AtomicFileTest, AFailedWriteLeavesTheOldFileAndNoTemporary) {
  const std::string p = dir_ + "/f";
  ASSERT_TRUE(WriteFileAtomically(p, [](int fd) { return WriteAll(fd, "old", 3); }).ok());
  absl::Status s = WriteFileAtomically(p, [](int fd) {
    WriteAll(fd, "par", 3);
    errno = ENOSPC;
    return false;
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("No space left"), std::string::npos) << s;
  EXPECT_EQ(Read(p), "old");
  EXPECT_EQ(Files(), std::vector<std::string>{"f"});
}

// The probe's case: a symlink planted where a predictable temporary would be, and at the final
// name. Neither target outside the directory is written.
TEST_F(AtomicFileTest, NeverWritesThroughAPlantedSymlink) {
  const std::string victim = dir_ + "_victim";
  std::ofstream(victim) << "precious";
  const std::string p = dir_ + "/f";
  for (const std::string& name : {p + ".tmp." + std::to_string(::getpid()), p}) {
    ASSERT_EQ(::symlink(victim.c_str(), name.c_str()), 0);
  }
  ASSERT_TRUE(WriteFileAtomically(p, [](int fd) { return WriteAll(fd, "new", 3); }).ok());
  EXPECT_EQ(Read(victim), "precious");
  struct stat st;
  ASSERT_EQ(::lstat(p.c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));  // the link at the final name was replaced, not followed
  EXPECT_EQ(Read(p), "new");
}

TEST_F(AtomicFileTest, TemporaryNamesAreFreshAndExclusive) {
  const std::string base = dir_ + "/g";
  absl::StatusOr<ExclusiveTemp> a = CreateExclusiveTemp(base);
  absl::StatusOr<ExclusiveTemp> b = CreateExclusiveTemp(base);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->path, b->path);
  EXPECT_EQ(a->path.rfind(base + ".tmp." + std::to_string(::getpid()) + ".", 0), 0u) << a->path;
  ::close(a->fd);
  ::close(b->fd);
  absl::StatusOr<ExclusiveTemp> bad = CreateExclusiveTemp(dir_ + "/no/such/dir/x");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace shardmap
