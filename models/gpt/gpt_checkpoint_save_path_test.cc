// CheckSavePath (models/gpt_checkpoint.h): --save names a new or regular file in a writable
// directory; a directory, a character device, a FIFO or a socket is refused (saving replaces the
// file, which would turn a device or FIFO into a regular file), with what and how to fix it.
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/gpt/gpt_checkpoint.h"

namespace shardmap {
namespace {

using ::testing::HasSubstr;

std::string TmpDir() {
  const char* d = std::getenv("TEST_TMPDIR");
  return d != nullptr ? d : "/tmp";
}

TEST(CheckSavePathTest, NewAndRegularFilesAreAccepted) {
  const std::string fresh = TmpDir() + "/fresh.safetensors";
  std::remove(fresh.c_str());
  EXPECT_TRUE(CheckSavePath(fresh).ok());
  const std::string regular = TmpDir() + "/regular.safetensors";
  FILE* f = std::fopen(regular.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fclose(f);
  EXPECT_TRUE(CheckSavePath(regular).ok());
}

TEST(CheckSavePathTest, ADirectoryIsRefused) {
  EXPECT_THAT(CheckSavePath(TmpDir()).ToString(), HasSubstr("it is a directory"));
}

TEST(CheckSavePathTest, ACharacterDeviceIsRefused) {
  const absl::Status s = CheckSavePath("/dev/null");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.ToString(), HasSubstr("'/dev/null': it exists and is not a regular file "
                                      "(a character device)"));
  EXPECT_THAT(s.ToString(), HasSubstr("name a new or regular file"));
}

TEST(CheckSavePathTest, AFifoIsRefused) {
  const std::string fifo = TmpDir() + "/save.fifo";
  std::remove(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  const absl::Status s = CheckSavePath(fifo);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.ToString(), HasSubstr("not a regular file (a FIFO)"));
  struct stat st;
  ASSERT_EQ(::stat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode)) << "the check must leave the FIFO alone";
}

TEST(CheckSavePathTest, ASocketIsRefused) {
  // A short folder of its own: a socket's path must fit sockaddr_un (108 bytes).
  char dir[] = "/tmp/save_path_testXXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr) << std::strerror(errno);
  const std::string path = std::string(dir) + "/save.sock";
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strcpy(a.sun_path, path.c_str());
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0) << std::strerror(errno);
  EXPECT_THAT(CheckSavePath(path).ToString(), HasSubstr("not a regular file (a socket)"));
  ::close(fd);
  std::remove(path.c_str());
  ::rmdir(dir);
}

TEST(CheckSavePathTest, AMissingDirectoryIsRefused) {
  EXPECT_THAT(CheckSavePath(TmpDir() + "/no/such/dir/x.safetensors").ToString(),
              HasSubstr("does not exist; create it first"));
}

}  // namespace
}  // namespace shardmap
