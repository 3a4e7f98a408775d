// Safetensors: round trips (F32, F64, BF16, F16, I32, I64, U16), block reads against slices of the whole tensor, a
// file laid out by hand from the format's description, atomic replacement, clear errors for
// malformed headers and unsupported dtypes, integer files laid out by hand, and a fuzz loop over corrupted headers (never a crash or a read past the
// data).
#include "models/components/checkpoint.h"

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <type_traits>

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

// Little-endian bytes of each value in T (the file's layout on any host).
template <typename T>
std::string LittleEndian(const std::vector<T>& values) {
  std::string out;
  for (T v : values) {
    using U = std::make_unsigned_t<T>;
    const U u = static_cast<U>(v);
    for (size_t i = 0; i < sizeof(T); ++i) out.push_back(static_cast<char>(u >> (8 * i)));
  }
  return out;
}

TEST(SafetensorsTest, RoundTripsIntegerAndF16Tensors) {
  const std::string path = TempPath("ints.safetensors");
  const int64_t big = (int64_t{1} << 53) + 1;  // not a double: must survive bit for bit
  Tensor i32 = Tensor::FromVector<int32_t>({2, 3}, {0, -1, INT32_MIN, INT32_MAX, 7, 65536});
  Tensor i64 = Tensor::FromVector<int64_t>({3}, {big, -big, INT64_MAX});
  Tensor u16 = Tensor::FromVector<int64_t>({5}, {0, 1, 255, 256, 65535});  // stored as U16
  Tensor f16 = Cast(Rand({4}, 5, DType::kF32), DType::kF16);
  ASSERT_TRUE(WriteSafetensors(path, {{"i32", i32}, {"i64", i64}, {"u16", u16}, {"f16", f16}},
                               {}, {{"u16", "U16"}})
                  .ok());
  absl::StatusOr<SafetensorsFile> f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->Find("u16")->file_dtype, "U16");
  EXPECT_EQ(f->Find("u16")->end - f->Find("u16")->begin, 10);  // 2 bytes an element
  EXPECT_TRUE(testing::TensorsBitwiseEqual(*f->Read("i32"), i32));
  EXPECT_TRUE(testing::TensorsBitwiseEqual(*f->Read("i64"), i64));
  EXPECT_TRUE(testing::TensorsBitwiseEqual(*f->Read("f16"), f16));
  Tensor got = *f->Read("u16");  // held widened, as i32
  EXPECT_EQ(got.dtype(), DType::kI32);
  EXPECT_EQ(got.ToVector<int64_t>(), u16.ToVector<int64_t>());
  // A block of the U16 tensor, and conversions that keep every value.
  EXPECT_EQ(f->ReadBlock("u16", {5}, {2}, {3}, DType::kI64)->ToVector<int64_t>(),
            (std::vector<int64_t>{255, 256, 65535}));
  EXPECT_EQ(f->ReadBlock("i32", {2, 3}, {1, 0}, {1, 3}, DType::kF64)->ToVector<double>(),
            (std::vector<double>{INT32_MAX, 7, 65536}));
}

// A file laid out as Python's safetensors writes one (save_file({"ids": torch.tensor(..,
// dtype=torch.int64), ...})): the 8-byte little-endian header length, the JSON header padded
// with spaces to 8 bytes, then the data, each built here byte by byte.
TEST(SafetensorsTest, ReadsIntegerFileLaidOutByHand) {
  const std::string path = TempPath("hand_ints.safetensors");
  std::string header =
      R"({"ids":{"dtype":"I64","shape":[3],"data_offsets":[0,24]},)"
      R"("mask":{"dtype":"I32","shape":[2,2],"data_offsets":[24,40]},)"
      R"("tok":{"dtype":"U16","shape":[3],"data_offsets":[40,46]},)"
      R"("__metadata__":{"format":"pt"}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  const std::string data = LittleEndian<int64_t>({-5, 0, int64_t{1} << 40}) +
                           LittleEndian<int32_t>({1, -2, 3, INT32_MIN}) +
                           LittleEndian<uint16_t>({65535, 0, 50256});
  WriteFile(path, Pack(header, data));
  absl::StatusOr<SafetensorsFile> f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->Read("ids")->ShapeString(), "i64[3]");
  EXPECT_EQ(f->Read("ids")->ToVector<int64_t>(), (std::vector<int64_t>{-5, 0, int64_t{1} << 40}));
  EXPECT_EQ(f->Read("mask")->ShapeString(), "i32[2,2]");
  EXPECT_EQ(f->Read("mask")->ToVector<int64_t>(), (std::vector<int64_t>{1, -2, 3, INT32_MIN}));
  EXPECT_EQ(f->Read("tok")->ShapeString(), "i32[3]");
  EXPECT_EQ(f->Read("tok")->ToVector<int64_t>(), (std::vector<int64_t>{65535, 0, 50256}));
  // Written back by us: the same bytes for the I64 and I32 tensors.
  const std::string again = TempPath("hand_ints_again.safetensors");
  ASSERT_TRUE(WriteSafetensors(again, {{"ids", *f->Read("ids")}, {"mask", *f->Read("mask")},
                                       {"tok", *f->Read("tok")}},
                               {}, {{"tok", "U16"}})
                  .ok());
  const std::string bytes = ReadFile(again);
  EXPECT_EQ(bytes.substr(bytes.size() - data.size()), data);
}

TEST(SafetensorsTest, IntegerDTypesWeCannotHoldOrConvertAreClearErrors) {
  const std::string path = TempPath("bad_ints.safetensors");
  std::string d8(8, '\0');
  for (const char* dt : {"U8", "I16", "U32", "U64", "BOOL", "F8_E4M3"}) {
    WriteFile(path, Pack(absl::StrCat(R"({"w":{"dtype":")", dt,
                                      R"(","shape":[1],"data_offsets":[0,8]}})"),
                         d8));
    EXPECT_THAT(std::string(SafetensorsFile::Open(path).status().message()),
                AllOf(HasSubstr("tensor 'w'"), HasSubstr(absl::StrCat(dt, " is not supported")),
                      HasSubstr("I32, I64, and U16"), HasSubstr("torch.int32")))
        << dt;
  }
  Tensor ids = Tensor::FromVector<int64_t>({3}, {4, -1, 9});
  EXPECT_THAT(std::string(WriteSafetensors(path, {{"ids", ids}}, {}, {{"ids", "U16"}}).message()),
              AllOf(HasSubstr("tensor 'ids' holds -1 at element 1"), HasSubstr("I32 or I64")));
  EXPECT_THAT(std::string(WriteSafetensors(path, {{"ids", ids}}, {}, {{"ids", "U8"}}).message()),
              HasSubstr("stored dtype 'U8' for tensor 'ids': only U16"));
  EXPECT_THAT(std::string(WriteSafetensors(path, {{"ids", ids}}, {}, {{"x", "U16"}}).message()),
              HasSubstr("names 'x', which is not among the tensors"));
  EXPECT_THAT(std::string(WriteSafetensors(path, {{"w", Tensor::Ones({2})}}, {}, {{"w", "U16"}})
                              .message()),
              HasSubstr("only i32 and i64 tensors are stored as U16"));
  ASSERT_TRUE(WriteSafetensors(path, {{"w", Tensor::Ones({2})},
                                      {"big", Tensor::FromVector<int64_t>({2}, {1, 1LL << 33})}})
                  .ok());
  SafetensorsFile f = *SafetensorsFile::Open(path);
  EXPECT_THAT(std::string(f.ReadBlock("w", {2}, {0}, {2}, DType::kI32).status().message()),
              AllOf(HasSubstr("tensor 'w' is floating point"), HasSubstr("would truncate")));
  EXPECT_THAT(std::string(f.ReadBlock("big", {2}, {0}, {2}, DType::kI32).status().message()),
              AllOf(HasSubstr("holds 8589934592 at element 1"), HasSubstr("read it as i64")));
  EXPECT_EQ(f.ReadBlock("big", {2}, {0}, {1}, DType::kI32)->ToVector<int64_t>(),
            (std::vector<int64_t>{1}));
}

TEST(SafetensorsTest, WritesAreAtomic) {
  std::string path = TempPath("atomic.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"a", Tensor::Ones({2})}}).ok());
  std::string before = ReadFile(path);
  // A failing write (a value U16 cannot hold) leaves the old file and no temporary behind.
  absl::Status s = WriteSafetensors(path, {{"a", Tensor::FromVector<int64_t>({2}, {1, 70000})}},
                                    {}, {{"a", "U16"}});
  EXPECT_THAT(std::string(s.message()), HasSubstr("outside U16's [0, 65535]"));
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
