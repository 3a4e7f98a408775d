#include "models/components/bounded_read.h"

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace shardmap {
namespace {

std::string TmpDir() {
  const char* t = std::getenv("TEST_TMPDIR");
  return t != nullptr ? t : "/tmp";
}

std::string WriteText(const std::string& name, const std::string& text) {
  const std::string path = TmpDir() + "/" + name;
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

TEST(BoundedReadTest, ReadsARegularFileWhole) {
  const std::string p = WriteText("a.txt", "hello\nworld");
  absl::StatusOr<std::string> s = ReadBoundedFile(p, 100, "--profile");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(*s, "hello\nworld");
  absl::StatusOr<BoundedFile> f = OpenBoundedFile(p, 11, "--profile");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->size(), 11);
  char buf[5];
  ASSERT_TRUE(f->ReadAt(buf, 5, 6));
  EXPECT_EQ(std::string(buf, 5), "world");
  EXPECT_FALSE(f->ReadAt(buf, 5, 8));  // past the end: a short read is refused
  EXPECT_TRUE(CheckRegularFile(p, "x").ok());
}

TEST(BoundedReadTest, RefusesAFileOverTheLimit) {
  const std::string p = WriteText("big.txt", std::string(101, 'x'));
  absl::StatusOr<std::string> s = ReadBoundedFile(p, 100, "encoder.json");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("encoder.json '" + p + "' has 101 bytes, more than the "
                                      "limit of 100"),
            std::string::npos)
      << s.status();
}

TEST(BoundedReadTest, RefusesDevicesFifosAndDirectoriesAtOnce) {
  const std::string fifo = TmpDir() + "/pipe";
  ::unlink(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const auto start = std::chrono::steady_clock::now();
  for (const auto& [path, kind] : {std::pair<std::string, std::string>{fifo, "a FIFO"},
                                   {"/dev/zero", "a character device"},
                                   {TmpDir(), "a directory"}}) {
    absl::StatusOr<std::string> s = ReadBoundedFile(path, int64_t{1} << 40, "--vocab");
    ASSERT_FALSE(s.ok()) << path;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.status().message().find("--vocab '" + path + "' is " + kind), std::string::npos)
        << s.status();
    EXPECT_FALSE(CheckRegularFile(path, "--vocab").ok());
  }
  // Nothing blocked on the FIFO (no writer) or read /dev/zero to its (absent) end.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
}

TEST(BoundedReadTest, MissingFileIsNotFound) {
  absl::StatusOr<std::string> s = ReadBoundedFile(TmpDir() + "/nope", 10, "--resume");
  EXPECT_EQ(s.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(s.status().message().find("--resume '"), std::string::npos);
}

TEST(BoundedReadTest, CountsJsonMembersOutsideStrings) {
  EXPECT_EQ(CountJsonMembers(R"({"a": 1, "b": {"c": "x:y", "d\":": [1, 2]}})"), 4);
  EXPECT_EQ(CountJsonMembers("[]"), 0);
  EXPECT_TRUE(CheckCount(5, 5, "entries", "f").ok());
  absl::Status s = CheckCount(6, 5, "entries", "f");
  EXPECT_EQ(s.message(),
            "entries in 'f': 6 exceeds the limit of 5: not the file meant, or damaged");
}

}  // namespace
}  // namespace shardmap
