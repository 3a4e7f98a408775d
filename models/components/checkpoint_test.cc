// Safetensors: round trips (F32, F64, BF16), block reads against slices of the whole tensor, a
// file laid out by hand from the format's description, atomic replacement, clear errors for
// malformed headers, and a fuzz loop over corrupted headers (never a crash or a read past the
// data).
#include "models/components/checkpoint.h"

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensor/ops/shape_ops.h"
#include "tests/test_util.h"

namespace shardmap {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::Rand;

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir ? dir : "/tmp", "/", name);
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// 8-byte little-endian length + header + data.
std::string Pack(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(n >> (8 * i));
  return out + header + data;
}

TEST(SafetensorsTest, RoundTripsDTypesShapesAndMetadata) {
  std::string path = TempPath("roundtrip.safetensors");
  Tensor a = Rand({3, 5}, 1, DType::kF32), b = Rand({2, 3, 4}, 2, DType::kF64);
  Tensor c = Cast(Rand({7}, 3, DType::kF32), DType::kBF16);
  Tensor s = Tensor::Scalar(2.5, DType::kF64);
  ASSERT_TRUE(WriteSafetensors(path, {{"a", a}, {"b", b}, {"c", c}, {"s", s}}, {{"step", "7"}})
                  .ok());
  absl::StatusOr<SafetensorsFile> f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->metadata().at("step"), "7");
  EXPECT_EQ(f->entries().size(), 4u);
  for (auto [name, t] : std::vector<std::pair<std::string, Tensor>>{
           {"a", a}, {"b", b}, {"c", c}, {"s", s}}) {
    absl::StatusOr<Tensor> got = f->Read(name);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE(testing::TensorsBitwiseEqual(*got, t)) << name;
  }
}

TEST(SafetensorsTest, BlocksMatchSlicesOfTheWholeTensorInAnyView) {
  std::string path = TempPath("blocks.safetensors");
  Tensor w = Rand({4, 6}, 4, DType::kF64);  // read as [4, 3, 2] too (a [d, 3d] c_attn weight)
  ASSERT_TRUE(WriteSafetensors(path, {{"w", w}}).ok());
  SafetensorsFile f = *SafetensorsFile::Open(path);
  Tensor view = w.Reshape({4, 3, 2});
  for (int64_t s0 = 0; s0 < 4; s0 += 2) {
    for (int64_t s2 = 0; s2 < 2; ++s2) {
      absl::StatusOr<Tensor> got = f.ReadBlock("w", {4, 3, 2}, {s0, 0, s2}, {2, 3, 1},
                                               DType::kF64);
      ASSERT_TRUE(got.ok()) << got.status();
      Tensor want = Slice(Slice(view, 0, s0, 2), 2, s2, 1);
      EXPECT_TRUE(testing::TensorsBitwiseEqual(*got, want)) << s0 << "," << s2;
    }
  }
  // Conversion on read: F64 file, F32 block.
  absl::StatusOr<Tensor> f32 = f.ReadBlock("w", {4, 6}, {1, 2}, {3, 4}, DType::kF32);
  ASSERT_TRUE(f32.ok());
  EXPECT_TENSOR_NEAR(*f32, Cast(Slice(Slice(w, 0, 1, 3), 1, 2, 4), DType::kF32), 1e-6);
  EXPECT_THAT(std::string(f.ReadBlock("w", {4, 6}, {3, 0}, {2, 6}, DType::kF64).status().message()),
              HasSubstr("out of range in dim 0"));
  EXPECT_THAT(std::string(f.ReadBlock("w", {5, 5}, {0, 0}, {1, 1}, DType::kF64).status().message()),
              HasSubstr("cannot be read as a block of [5,5]"));
}

// A file written from the format's description (as PyTorch's safetensors writes it), not by us.
TEST(SafetensorsTest, ReadsAFileLaidOutByHand) {
  std::string path = TempPath("hand.safetensors");
  float data[3] = {1.5f, -2.0f, 4.25f};
  std::string bytes(reinterpret_cast<const char*>(data), sizeof(data));
  WriteFile(path, Pack(R"({"__metadata__":{"format":"pt"},"x":{"dtype":"F32","shape":[3],)"
                       R"("data_offsets":[0,12]}})",
                       bytes));
  absl::StatusOr<SafetensorsFile> f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  Tensor x = *f->Read("x");
  EXPECT_EQ(x.ShapeString(), "f32[3]");
  EXPECT_EQ(x.at(0), 1.5);
  EXPECT_EQ(x.at(2), 4.25);
  EXPECT_EQ(f->metadata().at("format"), "pt");
}

TEST(SafetensorsTest, WritesAreAtomic) {
  std::string path = TempPath("atomic.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"a", Tensor::Ones({2})}}).ok());
  std::string before = ReadFile(path);
  // A failing write (an unsupported dtype) leaves the old file and no temporary behind.
  absl::Status s = WriteSafetensors(path, {{"a", Tensor::Zeros({2}, DType::kI64)}});
  EXPECT_THAT(std::string(s.message()), HasSubstr("only F32, F64 and BF16"));
  EXPECT_EQ(ReadFile(path), before);
  // A directory that does not exist: an error, nothing written.
  s = WriteSafetensors(TempPath("no/such/dir/x.safetensors"), {{"a", Tensor::Ones({2})}});
  EXPECT_THAT(std::string(s.message()), HasSubstr("cannot create"));
  // A successful write replaces the file in one rename.
  ASSERT_TRUE(WriteSafetensors(path, {{"b", Tensor::Ones({3})}}).ok());
  EXPECT_NE(SafetensorsFile::Open(path)->Find("b"), nullptr);
  EXPECT_NE(access((path + ".tmp." + std::to_string(getpid())).c_str(), F_OK), 0);
  // A symlink planted at the predictable old temporary name is not written through.
  const std::string victim = TempPath("victim.txt");
  WriteFile(victim, "precious");
  const std::string link = path + ".tmp." + std::to_string(getpid());
  ASSERT_EQ(symlink(victim.c_str(), link.c_str()), 0);
  ASSERT_TRUE(WriteSafetensors(path, {{"c", Tensor::Ones({3})}}).ok());
  EXPECT_EQ(ReadFile(victim), "precious");
  unlink(link.c_str());
}

// The fault probe's files: a FIFO named like a checkpoint (no writer: an open that waited would
// hang), a device, and a header within the 100 MiB limit holding millions of tiny metadata
// entries (parsed whole, GiBs and minutes). Each is refused at once with the reason.
TEST(SafetensorsTest, HostileFilesAreRefusedQuickly) {
  const auto start = std::chrono::steady_clock::now();
  const std::string fifo = TempPath("fifo.safetensors");
  ::unlink(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  absl::StatusOr<SafetensorsFile> f = SafetensorsFile::Open(fifo);
  EXPECT_THAT(std::string(f.status().message()),
              HasSubstr("is a FIFO (named pipe), not a regular"));
  f = SafetensorsFile::Open("/dev/zero");
  EXPECT_THAT(std::string(f.status().message()), HasSubstr("is a character device"));
  std::string header = R"({"__metadata__": {)";
  for (int i = 0; i < 1200000; ++i) absl::StrAppend(&header, i ? "," : "", "\"", i, "\":\"\"");
  header += "}}";
  const std::string many = TempPath("many.safetensors");
  WriteFile(many, Pack(header, ""));
  f = SafetensorsFile::Open(many);
  EXPECT_THAT(std::string(f.status().message()),
              HasSubstr("safetensors header members in '" + many + "': 1200001 exceeds the limit"));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
}

TEST(SafetensorsTest, MalformedFilesAreClearErrorsNamingTheTensor) {
  std::string path = TempPath("bad.safetensors");
  std::string d8(8, '\0');
  auto error = [&](const std::string& bytes) {
    WriteFile(path, bytes);
    absl::StatusOr<SafetensorsFile> f = SafetensorsFile::Open(path);
    EXPECT_FALSE(f.ok());
    return f.ok() ? std::string() : std::string(f.status().message());
  };
  EXPECT_THAT(error("abc"), HasSubstr("fewer than the 8-byte header length"));
  std::string huge = Pack("{}", "");
  huge[0] = 100;  // header length 100 > file
  EXPECT_THAT(error(huge), HasSubstr("header length 100 exceeds the file"));
  EXPECT_THAT(error(Pack("{not json", "")), HasSubstr("not a JSON object"));
  EXPECT_THAT(error(Pack(R"({"w":{"dtype":"I8","shape":[8],"data_offsets":[0,8]}})", d8)),
              AllOf(HasSubstr("tensor 'w'"), HasSubstr("I8 is not supported")));
  EXPECT_THAT(error(Pack(R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", d8)),
              AllOf(HasSubstr("tensor 'w'"), HasSubstr("not a size")));
  EXPECT_THAT(error(Pack(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}})", d8)),
              AllOf(HasSubstr("tensor 'w'"), HasSubstr("outside the 8-byte data section")));
  EXPECT_THAT(error(Pack(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", d8)),
              AllOf(HasSubstr("tensor 'w'"), HasSubstr("holds 8 bytes but F32[3] needs 12")));
  EXPECT_THAT(error(Pack(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                         R"("v":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                         d8)),
              AllOf(HasSubstr("'w'"), HasSubstr("'v'"), HasSubstr("overlap")));
  EXPECT_THAT(error(Pack(R"({"w":{"shape":[2],"data_offsets":[0,8]}})", d8)),
              AllOf(HasSubstr("tensor 'w'"), HasSubstr("no dtype")));
  EXPECT_THAT(error(Pack(R"({"w":{"dtype":"F32","shape":[2]}})", d8)),
              AllOf(HasSubstr("tensor 'w'"), HasSubstr("data_offsets")));
  EXPECT_THAT(std::string(SafetensorsFile::Open(TempPath("missing")).status().message()),
              HasSubstr("cannot open"));
}

// Corrupt random bytes of a valid header (and sometimes its length field): Open either fails
// with a message or yields entries that all read within the file.
TEST(SafetensorsTest, FuzzCorruptedHeaders) {
  std::string path = TempPath("fuzz_src.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"wte.weight", Rand({4, 3}, 1, DType::kF32)},
                                      {"h.0.ln_1.bias", Rand({3}, 2, DType::kF64)},
                                      {"c", Cast(Rand({5}, 3, DType::kF32), DType::kBF16)}},
                               {{"step", "1"}})
                  .ok());
  const std::string good = ReadFile(path);
  uint64_t header_len = 0;
  for (int i = 0; i < 8; ++i) header_len |= static_cast<uint64_t>(static_cast<uint8_t>(good[i])) << (8 * i);
  const std::string fuzz = TempPath("fuzz.safetensors");
  const char kChars[] = "{}[],:\"0123456789-eE.FBI \x00\xff";
  uint64_t x = 99;
  int opened = 0, failed = 0;
  for (int iter = 0; iter < 600; ++iter) {
    std::string bytes = good;
    auto next = [&] {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      return x >> 33;
    };
    const int edits = 1 + static_cast<int>(next() % 4);
    for (int e = 0; e < edits; ++e) {
      uint64_t kind = next() % 10;
      if (kind == 0) {
        if (bytes.size() >= 8) bytes[next() % 8] = static_cast<char>(next());  // the length
      } else if (kind == 1) {
        if (!bytes.empty()) bytes.resize(next() % bytes.size());  // truncation
      } else {
        size_t pos = 8 + next() % header_len;
        if (pos < bytes.size()) bytes[pos] = kChars[next() % (sizeof(kChars) - 1)];
      }
    }
    WriteFile(fuzz, bytes);
    absl::StatusOr<SafetensorsFile> f = SafetensorsFile::Open(fuzz);
    if (!f.ok()) {
      EXPECT_THAT(std::string(f.status().message()), HasSubstr("safetensors file"));
      ++failed;
      continue;
    }
    ++opened;
    for (const SafetensorsEntry& e : f->entries()) {
      absl::StatusOr<Tensor> t = f->Read(e.name);
      EXPECT_TRUE(t.ok()) << t.status();  // validated offsets are always readable
    }
  }
  EXPECT_GT(failed, 50);  // the corruptions are mostly caught
  EXPECT_GT(opened, 5);   // and some (e.g. digits in names) still parse
}

}  // namespace
}  // namespace shardmap
