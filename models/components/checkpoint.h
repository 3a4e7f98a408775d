// Safetensors files (the Hugging Face format): an 8-byte little-endian header length, a JSON
// header {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
// "__metadata__": {"key": "value"}}, then the tensors' bytes. Files hold whole (global) tensors;
// a rank reads only the block it holds.
//
//   absl::Status s = WriteSafetensors("ckpt.safetensors", {{"wte.weight", wte}}, {{"step", "3"}});
//   absl::StatusOr<SafetensorsFile> f = SafetensorsFile::Open("ckpt.safetensors");
//   absl::StatusOr<Tensor> rows = f->ReadBlock("wte.weight", {64, 16}, /*start=*/{32, 0},
//                                              /*size=*/{32, 16}, DType::kF32);
//
// Writes are atomic: a temporary file in the same directory, fsync, then rename, so a reader
// never sees a half-written checkpoint. Open validates the whole header (parsed with nlohmann
// JSON): the header length against the file size, dtypes (F32, F64, BF16), shapes, offsets in
// range, sizes matching shape x dtype, no overlaps; errors name the file and the tensor.
#ifndef SHARDMAP_MODELS_COMPONENTS_CHECKPOINT_H_
#define SHARDMAP_MODELS_COMPONENTS_CHECKPOINT_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "models/components/optimizer.h"
#include "tensor/tensor.h"

namespace shardmap {

// Tensors must be F32, F64 or BF16 CPU tensors with unique names.
absl::Status WriteSafetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                              const std::map<std::string, std::string>& metadata = {});

struct SafetensorsEntry {
  std::string name;
  DType dtype;
  Shape shape;
  int64_t begin = 0, end = 0;  // byte range, relative to the data section
};

class SafetensorsFile {
 public:
  static absl::StatusOr<SafetensorsFile> Open(const std::string& path);

  const std::string& path() const { return path_; }
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const SafetensorsEntry* Find(const std::string& name) const;  // nullptr when absent

  // The block [start, start + size) of tensor `name` viewed as `view_shape` (any shape with the
  // stored number of elements, e.g. [d, 3, d] for a stored [d, 3d]), converted to `dtype`.
  absl::StatusOr<Tensor> ReadBlock(const std::string& name, absl::Span<const int64_t> view_shape,
                                   absl::Span<const int64_t> start,
                                   absl::Span<const int64_t> size, DType dtype) const;
  // The whole tensor in its stored shape and dtype.
  absl::StatusOr<Tensor> Read(const std::string& name) const;

 private:
  std::string path_;
  int64_t data_start_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_COMPONENTS_CHECKPOINT_H_
