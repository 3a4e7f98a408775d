#include "models/components/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
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

const char* FileDType(DType t) {
  switch (t) {
    case DType::kF32: return "F32";
    case DType::kF64: return "F64";
    case DType::kBF16: return "BF16";
    default: return nullptr;
  }
}

bool ParseDType(const std::string& s, DType* t) {
  if (s == "F32") *t = DType::kF32;
  else if (s == "F64") *t = DType::kF64;
  else if (s == "BF16") *t = DType::kBF16;
  else return false;
  return true;
}

}  // namespace

absl::Status WriteSafetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string> names;
  int64_t offset = 0;
  for (const NamedTensor& t : tensors) {
    const char* dt = t.tensor.defined() ? FileDType(t.tensor.dtype()) : nullptr;
    if (dt == nullptr || t.tensor.is_cuda()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "WriteSafetensors('", path, "'): tensor '", t.name, "' is ",
          t.tensor.defined() ? t.tensor.ShapeString() : "undefined",
          "; only F32, F64 and BF16 host tensors are written (cast it, or copy it to the CPU)"));
    }
    if (t.name == "__metadata__" || !names.insert(t.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("WriteSafetensors('", path,
                                                     "'): tensor name '", t.name,
                                                     "' is reserved or repeated"));
    }
    const int64_t n = static_cast<int64_t>(t.tensor.nbytes());
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
    for (const NamedTensor& t : tensors) {
      ok = ok && WriteAll(fd, t.tensor.raw_data(), t.tensor.nbytes());
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
    if (!ParseDType(dt->get<std::string>(), &e.dtype)) {
      return bad(absl::StrCat("dtype ", dt->get<std::string>(),
                              " is not supported (F32, F64, BF16)"));
    }
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
    if (e.end - e.begin != numel * static_cast<int64_t>(DTypeSize(e.dtype))) {
      return bad(absl::StrCat("holds ", e.end - e.begin, " bytes but ", dt->get<std::string>(),
                              ShapeToString(e.shape), " needs ",
                              numel * static_cast<int64_t>(DTypeSize(e.dtype))));
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
  const int64_t elem = static_cast<int64_t>(DTypeSize(e->dtype));
  Tensor raw = Tensor::Empty(size, e->dtype);
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
  char* dst = static_cast<char*>(raw.raw_data());
  if (raw.numel() == 0) return dtype == e->dtype ? raw : Cast(raw, dtype);
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
  return dtype == e->dtype ? raw : Cast(raw, dtype);
}

absl::StatusOr<Tensor> SafetensorsFile::Read(const std::string& name) const {
  const SafetensorsEntry* e = Find(name);
  if (e == nullptr) return Bad(path_, absl::StrCat("no tensor '", name, "'"));
  std::vector<int64_t> zero(e->shape.size(), 0);
  return ReadBlock(name, e->shape, zero, e->shape, e->dtype);
}

}  // namespace shardmap
