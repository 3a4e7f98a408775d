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
// JSON): the header length against the file size, dtypes, shapes, offsets in range, sizes
// matching shape x dtype, no overlaps; errors name the file and the tensor.
//
// Dtypes: F32, F64, BF16, F16, I32 and I64 are held as themselves; U16 (token ids) is read
// widened into an I32 tensor, and an I32/I64 tensor is written as U16 when stored_dtypes asks
// (an error names the first value outside [0, 65535]). Any other file dtype (U8, I8, I16, U32,
// U64, BOOL, F8_*) is an error naming the tensor, the dtype and the ones supported. ReadBlock
// converts on read, except floating to integer (it would truncate) and i64 values that do not
// fit a requested i32.
//
//   WriteSafetensors("tokens.safetensors", {{"ids", ids_i32}}, {}, {{"ids", "U16"}});
//   Tensor ids = *SafetensorsFile::Open("tokens.safetensors")->Read("ids");   // i32
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

// Tensors must be F32, F64, BF16, F16, I32 or I64 CPU tensors with unique names.
// stored_dtypes: {name: "U16"} stores that I32/I64 tensor as U16 (the only conversion offered).
absl::Status WriteSafetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                              const std::map<std::string, std::string>& metadata = {},
                              const std::map<std::string, std::string>& stored_dtypes = {});

struct SafetensorsEntry {
  std::string name;
  DType dtype;             // the dtype it is held in once read
  std::string file_dtype;  // as the file names it: "U16" is held as I32
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
  // The whole tensor in its stored shape and held dtype (entry.dtype).
  absl::StatusOr<Tensor> Read(const std::string& name) const;

 private:
  std::string path_;
  int64_t data_start_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_COMPONENTS_CHECKPOINT_H_
