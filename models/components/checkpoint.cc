#include "models/components/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstring>
#include <limits>
#include <set>

#include "absl/strings/str_cat.h"
#include "models/components/atomic_file.h"
#include "models/components/bounded_read.h"
#include "nlohmann/json.hpp"
#include "tensor/ops/shape_ops.h"

namespace shardmap {
namespace {

constexpr int64_t kMaxHeader = int64_t{100} << 20;  // as the reference implementation
// Header members (tensor names, their dtype / shape / offsets, metadata entries), counted before
// the JSON is built: a GPT of 1000 layers with its moments has ~150k. 8.8M tiny metadata entries
// within the 100 MiB would otherwise take GiBs and minutes to parse.
constexpr int64_t kMaxHeaderMembers = int64_t{1} << 20;
constexpr int64_t kMaxMetadata = 1 << 16;
// Files are read with pread at offsets the header gives; the limit only keeps sizes sane.
constexpr int64_t kMaxFile = int64_t{1} << 50;

absl::Status Bad(const std::string& path, const std::string& msg) {
  return absl::InvalidArgumentError(absl::StrCat("safetensors file '", path, "': ", msg));
}

// The file dtypes read and written, each with the DType it is held in and its bytes per element.
// U16 (token ids, as nanoGPT and Hugging Face datasets store them) is held widened in I32.
struct FileType {
  const char* name;
  DType dtype;
  int64_t bytes;
};
constexpr FileType kFileTypes[] = {
    {"F32", DType::kF32, 4}, {"F64", DType::kF64, 8}, {"BF16", DType::kBF16, 2},
    {"F16", DType::kF16, 2}, {"I32", DType::kI32, 4}, {"I64", DType::kI64, 8},
    {"U16", DType::kI32, 2},
};
constexpr char kSupported[] = "F32, F64, BF16, F16, I32, I64, and U16 (held as I32)";

const FileType* FindFileType(const std::string& name) {
  for (const FileType& f : kFileTypes) {
    if (name == f.name) return &f;
  }
  return nullptr;
}

// The file dtype a tensor of dtype t is written as (nullptr: none).
const char* FileDType(DType t) {
  for (const FileType& f : kFileTypes) {
    if (f.dtype == t) return f.name;
  }
  return nullptr;
}

int64_t FileBytes(const SafetensorsEntry& e) { return FindFileType(e.file_dtype)->bytes; }

// t's values as little-endian uint16 bytes; an error naming the first value outside [0, 65535].
absl::StatusOr<std::string> ToU16(const std::string& path, const std::string& name,
                                  const Tensor& t) {
  if (t.dtype() != DType::kI32 && t.dtype() != DType::kI64) {
    return absl::InvalidArgumentError(absl::StrCat(
        "WriteSafetensors('", path, "'): tensor '", name, "' is ", t.ShapeString(),
        "; only i32 and i64 tensors are stored as U16"));
  }
  std::vector<int64_t> v = t.ToVector<int64_t>();
  std::vector<uint16_t> u(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] < 0 || v[i] > 65535) {
      return absl::InvalidArgumentError(absl::StrCat(
          "WriteSafetensors('", path, "'): tensor '", name, "' holds ", v[i], " at element ", i,
          ", outside U16's [0, 65535]; store it as I32 or I64 instead"));
    }
    u[i] = static_cast<uint16_t>(v[i]);
  }
  return std::string(reinterpret_cast<const char*>(u.data()), u.size() * sizeof(uint16_t));
}

// The bytes of each tensor as stored: its own, or U16 for the names in stored_dtypes.
absl::StatusOr<std::vector<std::string>> StoredBytes(
    const std::string& path, const std::vector<NamedTensor>& tensors,
    const std::map<std::string, std::string>& stored_dtypes, std::vector<const char*>* names) {
  std::vector<std::string> bytes(tensors.size());
  std::set<std::string> used;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const NamedTensor& t = tensors[i];
    auto it = stored_dtypes.find(t.name);
    if (it == stored_dtypes.end()) continue;
    used.insert(t.name);
    if (it->second != "U16") {
      return absl::InvalidArgumentError(
          absl::StrCat("WriteSafetensors('", path, "'): stored dtype '", it->second,
                       "' for tensor '", t.name, "': only U16 can be asked for (tensors are "
                       "otherwise stored in their own dtype)"));
    }
    absl::StatusOr<std::string> u = ToU16(path, t.name, t.tensor);
    if (!u.ok()) return u.status();
    bytes[i] = *std::move(u);
    (*names)[i] = "U16";
  }
  for (const auto& [name, dt] : stored_dtypes) {
    if (!used.count(name)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "WriteSafetensors('", path, "'): stored_dtypes names '", name,
          "', which is not among the tensors written"));
    }
  }
  return bytes;
}

// raw (the stored dtype) as `dtype`: floating to integer is refused (it would truncate), and
// i64 to i32 checks that every value fits.
absl::StatusOr<Tensor> ConvertBlock(const std::string& path, const std::string& name,
                                    const Tensor& raw, DType dtype) {
  if (raw.dtype() == dtype) return raw;
  if (IsFloating(raw.dtype()) && !IsFloating(dtype)) {
    return Bad(path, absl::StrCat("tensor '", name, "' is floating point (", raw.ShapeString(),
                                  "); reading it as ", DTypeName(dtype),
                                  " would truncate it: read it as a floating dtype"));
  }
  if (raw.dtype() == DType::kI64 && dtype == DType::kI32) {
    const int64_t* v = raw.data<int64_t>();
    for (int64_t i = 0; i < raw.numel(); ++i) {
      if (v[i] < INT32_MIN || v[i] > INT32_MAX) {
        return Bad(path, absl::StrCat("tensor '", name, "' holds ", v[i], " at element ", i,
                                      " of the block, outside i32: read it as i64"));
      }
    }
  }
  return Cast(raw, dtype);
}

}  // namespace

absl::Status WriteSafetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                              const std::map<std::string, std::string>& metadata,
                              const std::map<std::string, std::string>& stored_dtypes) {
  std::vector<const char*> stored(tensors.size(), nullptr);
  absl::StatusOr<std::vector<std::string>> converted =
      StoredBytes(path, tensors, stored_dtypes, &stored);
  if (!converted.ok()) return converted.status();
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string> names;
  int64_t offset = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const NamedTensor& t = tensors[i];
    const char* dt = t.tensor.defined() ? FileDType(t.tensor.dtype()) : nullptr;
    if (dt == nullptr || t.tensor.is_cuda()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "WriteSafetensors('", path, "'): tensor '", t.name, "' is ",
          t.tensor.defined() ? t.tensor.ShapeString() : "undefined",
          "; only F32, F64, BF16, F16, I32 and I64 host tensors are written (cast it, or copy "
          "it to the CPU)"));
    }
    if (stored[i] != nullptr) dt = stored[i];
    if (t.name == "__metadata__" || !names.insert(t.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("WriteSafetensors('", path,
                                                     "'): tensor name '", t.name,
                                                     "' is reserved or repeated"));
    }
    const int64_t n = stored[i] != nullptr ? static_cast<int64_t>((*converted)[i].size())
                                           : static_cast<int64_t>(t.tensor.nbytes());
    header[t.name] = {{"dtype", dt},
                      {"shape", std::vector<int64_t>(t.tensor.shape().begin(),
                                                     t.tensor.shape().end())},
                      {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data section starts 8-byte aligned
  uint64_t len = text.size();
  unsigned char le[8];
  for (int i = 0; i < 8; ++i) le[i] = static_cast<unsigned char>(len >> (8 * i));
  absl::Status s = WriteFileAtomically(path, [&](int fd) {
    bool ok = WriteAll(fd, le, 8) && WriteAll(fd, text.data(), text.size());
    for (size_t i = 0; i < tensors.size(); ++i) {
      const std::string& c = (*converted)[i];
      ok = ok && (stored[i] != nullptr ? WriteAll(fd, c.data(), c.size())
                                       : WriteAll(fd, tensors[i].tensor.raw_data(),
                                                  tensors[i].tensor.nbytes()));
    }
    return ok;
  });
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat("WriteSafetensors: ", s.message()));
  return absl::OkStatus();
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Open(const std::string& path) {
  absl::StatusOr<BoundedFile> f = OpenBoundedFile(path, kMaxFile, "safetensors file");
  if (!f.ok()) return f.status();
  const int64_t file_size = f->size();
  unsigned char le[8];
  if (file_size < 8 || !f->ReadAt(le, 8, 0)) {
    return Bad(path, absl::StrCat("the file has ", file_size,
                                  " bytes, fewer than the 8-byte header length"));
  }
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(le[i]) << (8 * i);
  if (n > static_cast<uint64_t>(file_size - 8) || n > static_cast<uint64_t>(kMaxHeader)) {
    return Bad(path, absl::StrCat("header length ", n, " exceeds the file (", file_size,
                                  " bytes) or the 100 MiB limit: not a safetensors file, or "
                                  "truncated"));
  }
  std::string text(n, '\0');
  if (!f->ReadAt(text.data(), static_cast<int64_t>(n), 8)) {
    return Bad(path, "cannot read the header");
  }
  if (absl::Status s = CheckCount(CountJsonMembers(text), kMaxHeaderMembers,
                                  "safetensors header members", path);
      !s.ok()) {
    return s;
  }
  nlohmann::json header = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) {
    return Bad(path, "the header is not a JSON object");
  }
  SafetensorsFile out;
  out.path_ = path;
  out.data_start_ = 8 + static_cast<int64_t>(n);
  const int64_t data_size = file_size - out.data_start_;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) return Bad(path, "__metadata__ is not an object");
      if (absl::Status s = CheckCount(static_cast<int64_t>(v.size()), kMaxMetadata,
                                      "__metadata__ entries", path);
          !s.ok()) {
        return s;
      }
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) {
          return Bad(path, absl::StrCat("__metadata__ value of '", m.key(), "' is not a string"));
        }
        out.metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    auto bad = [&](const std::string& what) {
      return Bad(path, absl::StrCat("tensor '", name, "': ", what));
    };
    if (!v.is_object()) return bad("entry is not an object");
    SafetensorsEntry e;
    e.name = name;
    auto dt = v.find("dtype");
    if (dt == v.end() || !dt->is_string()) return bad("no dtype string");
    const FileType* ft = FindFileType(dt->get<std::string>());
    if (ft == nullptr) {
      return bad(absl::StrCat("dtype ", dt->get<std::string>(), " is not supported (", kSupported,
                              "): convert it before saving, e.g. tensor.to(torch.int32)"));
    }
    e.dtype = ft->dtype;
    e.file_dtype = ft->name;
    auto sh = v.find("shape");
    if (sh == v.end() || !sh->is_array()) return bad("no shape array");
    int64_t numel = 1;
    for (const nlohmann::json& d : *sh) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > (uint64_t{1} << 40)) {
        return bad(absl::StrCat("shape ", sh->dump(), " has an entry that is not a size"));
      }
      const int64_t s = d.get<int64_t>();
      if (s != 0 && numel > (int64_t{1} << 50) / s) return bad("shape is too large");
      numel *= s;
      e.shape.push_back(s);
    }
    auto off = v.find("data_offsets");
    if (off == v.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
        !(*off)[1].is_number_unsigned()) {
      return bad("data_offsets is not [begin, end]");
    }
    const uint64_t b = (*off)[0].get<uint64_t>(), en = (*off)[1].get<uint64_t>();
    if (b > en || en > static_cast<uint64_t>(data_size)) {
      return bad(absl::StrCat("data_offsets [", b, ", ", en, "] are outside the ", data_size,
                              "-byte data section"));
    }
    e.begin = static_cast<int64_t>(b);
    e.end = static_cast<int64_t>(en);
    if (e.end - e.begin != numel * ft->bytes) {
      return bad(absl::StrCat("holds ", e.end - e.begin, " bytes but ", dt->get<std::string>(),
                              ShapeToString(e.shape), " needs ", numel * ft->bytes));
    }
    out.entries_.push_back(std::move(e));
  }
  std::vector<const SafetensorsEntry*> by_offset;
  for (const SafetensorsEntry& e : out.entries_) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const auto* a, const auto* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    if (by_offset[i]->begin < by_offset[i - 1]->end) {
      return Bad(path, absl::StrCat("tensors '", by_offset[i - 1]->name, "' and '",
                                    by_offset[i]->name, "' overlap"));
    }
  }
  return out;
}

const SafetensorsEntry* SafetensorsFile::Find(const std::string& name) const {
  for (const SafetensorsEntry& e : entries_) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

absl::StatusOr<Tensor> SafetensorsFile::ReadBlock(const std::string& name,
                                                  absl::Span<const int64_t> view_shape,
                                                  absl::Span<const int64_t> start,
                                                  absl::Span<const int64_t> size,
                                                  DType dtype) const {
  const SafetensorsEntry* e = Find(name);
  if (e == nullptr) return Bad(path_, absl::StrCat("no tensor '", name, "'"));
  const int rank = static_cast<int>(view_shape.size());
  if (NumElements(view_shape) != NumElements(e->shape) ||
      static_cast<int>(start.size()) != rank || static_cast<int>(size.size()) != rank) {
    return Bad(path_, absl::StrCat("tensor '", name, "' is ", ShapeToString(e->shape),
                                   " and cannot be read as a block of ",
                                   ShapeToString(view_shape)));
  }
  for (int d = 0; d < rank; ++d) {
    if (start[d] < 0 || size[d] < 0 || start[d] + size[d] > view_shape[d]) {
      return Bad(path_, absl::StrCat("block out of range in dim ", d, " of tensor '", name, "'"));
    }
  }
  const int64_t elem = FileBytes(*e);
  // Read into raw, or, for U16, into a buffer widened into raw afterwards.
  Tensor raw = Tensor::Empty(size, e->dtype);
  const bool widen = elem != static_cast<int64_t>(DTypeSize(e->dtype));
  std::vector<uint16_t> narrow(widen ? raw.numel() : 0);
  // The innermost contiguous run: trailing whole dims merge with the last partial one.
  int k = rank - 1;
  int64_t run = rank == 0 ? 1 : size[rank - 1];
  while (k > 0 && start[k] == 0 && size[k] == view_shape[k]) {
    --k;
    run *= size[k];
  }
  // Row-major strides of the view.
  std::vector<int64_t> stride(rank, 1);
  for (int d = rank - 2; d >= 0; --d) stride[d] = stride[d + 1] * view_shape[d + 1];
  absl::StatusOr<BoundedFile> f = OpenBoundedFile(path_, kMaxFile, "safetensors file");
  if (!f.ok()) return f.status();
  std::vector<int64_t> idx(std::max(k, 0), 0);  // index within the block over dims [0, k)
  char* dst = widen ? reinterpret_cast<char*>(narrow.data()) : static_cast<char*>(raw.raw_data());
  if (raw.numel() == 0) return ConvertBlock(path_, name, raw, dtype);
  while (true) {
    int64_t flat = 0;
    for (int d = 0; d < k; ++d) flat += (start[d] + idx[d]) * stride[d];
    if (rank > 0) flat += start[k] * stride[k];
    if (!f->ReadAt(dst, run * elem, data_start_ + e->begin + flat * elem)) {
      return Bad(path_, absl::StrCat("cannot read tensor '", name, "' (truncated file?)"));
    }
    dst += run * elem;
    int d = k - 1;
    for (; d >= 0; --d) {
      if (++idx[d] < size[d]) break;
      idx[d] = 0;
    }
    if (d < 0) break;
  }
  if (widen) {
    int32_t* w = raw.data<int32_t>();
    for (size_t i = 0; i < narrow.size(); ++i) w[i] = narrow[i];
  }
  return ConvertBlock(path_, name, raw, dtype);
}

absl::StatusOr<Tensor> SafetensorsFile::Read(const std::string& name) const {
  const SafetensorsEntry* e = Find(name);
  if (e == nullptr) return Bad(path_, absl::StrCat("no tensor '", name, "'"));
  std::vector<int64_t> zero(e->shape.size(), 0);
  return ReadBlock(name, e->shape, zero, e->shape, e->dtype);
}

}  // namespace shardmap
