// Tensor: a dense, contiguous, row-major array with shared storage.
//
//   Tensor a = Tensor::FromVector<float>({2, 3}, {1, 2, 3, 4, 5, 6});
//   Tensor b = a.Reshape({3, 2});        // a view: same storage, no copy
//   b.data<float>()[0] = 7;              // a.data<float>()[0] is 7 too
//   Tensor c = a.Clone();                // a deep copy
//   a.ShapeString();                     // "f32[2,3]"
//
//   Tensor g = a.To(Device::Cuda(0));   // a copy on GPU 0 (ops on g run CUDA kernels)
//   Tensor h = Add(g, g).To(Device::Cpu());
//
// Copies of a Tensor share storage (like a shared_ptr). Every tensor is contiguous: ops that
// change layout (transpose, permute, slice of an inner dim) produce new storage.
//
// Meta tensors (Device::Meta()) have a shape, a dtype and accounted storage but no data: every op
// checks its arguments as usual and returns outputs of the right shape, dtype and device without
// computing anything (shape-only execution; see tensor/op_counter.h and tensor/memory_tracker.h).
// Host reads of a meta tensor -- at(), item(), ToVector(), To(Device::Cpu()) -- give ZEROS, so
// the same program (one that reads its loss or gradient norm on the host) runs unchanged in
// shape-only mode; the values it reads there are 0, never data.
//
//   Tensor m = Tensor::Empty({4096, 4096}, DType::kBF16, Device::Meta());  // allocates nothing
//   Matmul(m, m).ShapeString();   // "bf16[4096,4096]", computed in ~1 us
//   m.item();                     // throws (numel != 1), as on the CPU
//   Sum(m, {0, 1}).item();        // 0: host reads of meta tensors are zeros
//
// Device tensors: storage comes from the device's caching allocator (tensor/cuda/device_memory.h)
// on the calling thread's current stream; data<T>() is then a device pointer, and at(), item(),
// ToVector() copy to the host first (they wait for the stream).
#ifndef SHARDMAP_TENSOR_TENSOR_H_
#define SHARDMAP_TENSOR_TENSOR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/types/span.h"
#include "tensor/dtype.h"

namespace shardmap {

using Shape = absl::InlinedVector<int64_t, 6>;

std::string ShapeToString(absl::Span<const int64_t> shape);  // "[2,3]"
int64_t NumElements(absl::Span<const int64_t> shape);

enum class DeviceKind : uint8_t { kCPU, kCUDA, kMeta };

struct Device {
  DeviceKind kind = DeviceKind::kCPU;
  int index = 0;
  static Device Cpu() { return Device{}; }
  static Device Cuda(int index) { return Device{DeviceKind::kCUDA, index}; }
  // The data-less device of shape-only execution (index 0).
  static Device Meta() { return Device{DeviceKind::kMeta, 0}; }
  bool is_cuda() const { return kind == DeviceKind::kCUDA; }
  bool is_meta() const { return kind == DeviceKind::kMeta; }
  std::string ToString() const;  // "cpu", "cuda:1", "meta"
  bool operator==(const Device& o) const { return kind == o.kind && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
};

namespace internal {
struct TrackerState;  // tensor/memory_tracker.cc
}  // namespace internal

// Owns one allocation. Meta storage has nbytes() but data() == nullptr. CPU storage is 64-byte
// aligned. Buffers of up to kInlineBytes live inside the Storage object itself, so a small tensor
// costs one heap allocation (Storage and its shared_ptr control block together), not three.
class Storage {
  class Key {  // lets std::make_shared call the constructor, but only from Storage
    friend class Storage;
    Key() = default;
  };

 public:
  static constexpr size_t kInlineBytes = 64;

  static std::shared_ptr<Storage> AllocateCpu(size_t nbytes);
  // No buffer: data() is null, nbytes() is kept for accounting.
  static std::shared_ptr<Storage> AllocateMeta(size_t nbytes);
  // On any device: CPU, meta, or the device's caching allocator (for use on this thread's
  // current stream; throws OpError without CUDA or the device).
  static std::shared_ptr<Storage> AllocateOn(Device device, size_t nbytes);
  explicit Storage(Key) {}
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }

  // FSDP's reshard_after_forward (models/train/fsdp_params.h). Release() frees the buffer but
  // keeps the object (and its nbytes), so the tensors sharing it stay defined and keep their
  // shape; they must not be read until Adopt(). Adopt(from) takes over from's buffer (the same
  // nbytes and device; `from` is released). Memory trackers follow the buffer. Throws OpError.
  void Release();
  void Adopt(Storage& from);
  bool released() const { return released_; }

 private:
  // Every MemoryTracker live on the allocating thread (innermost; it links to the outer ones),
  // or null; and the op scope it was allocated in (0: outside any op). See memory_tracker.h.
  void Track();
  void Untrack();

  void* data_ = nullptr;
  size_t nbytes_ = 0;
  Device device_;
  std::shared_ptr<internal::TrackerState> tracker_;
  uint64_t op_scope_ = 0;
  bool released_ = false;
  // Over-sized by 63 so a 64-byte-aligned window fits without an over-aligned (slower) new.
  unsigned char inline_[kInlineBytes + 63];
};

class Tensor {
 public:
  Tensor() = default;  // undefined: defined() is false

  // Uninitialised memory. Throws OpError on negative sizes.
  static Tensor Empty(absl::Span<const int64_t> shape, DType dtype, Device device = Device::Cpu());
  static Tensor Zeros(absl::Span<const int64_t> shape, DType dtype = DType::kF32,
                      Device device = Device::Cpu());
  static Tensor Ones(absl::Span<const int64_t> shape, DType dtype = DType::kF32,
                     Device device = Device::Cpu());
  static Tensor Full(absl::Span<const int64_t> shape, double value, DType dtype = DType::kF32,
                     Device device = Device::Cpu());
  static Tensor Scalar(double value, DType dtype = DType::kF32);  // rank 0
  // 0, 1, ..., n-1.
  static Tensor Arange(int64_t n, DType dtype = DType::kF32);
  // Copies `values` (numel must match the shape). For bf16/f16 pass floats: they are rounded.
  template <typename T>
  static Tensor FromVector(absl::Span<const int64_t> shape, const std::vector<T>& values,
                           DType dtype = DTypeOf<T>());

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  // dim(-1) is the last dim. Throws OpError when out of range.
  int64_t dim(int i) const {
    const int r = rank();
    if (i < -r || i >= r) [[unlikely]] DimFail(i);
    return shape_[i < 0 ? i + r : i];
  }
  int64_t numel() const { return numel_; }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device() : Device{}; }
  bool is_cuda() const { return device().is_cuda(); }
  bool is_meta() const { return device().is_meta(); }
  size_t nbytes() const { return static_cast<size_t>(numel_) * DTypeSize(dtype_); }

  // Typed element access; throws OpError when T does not match dtype().
  template <typename T> T* data() {
    if (DTypeOf<T>() != dtype_) [[unlikely]] DataFail(DTypeOf<T>());
    return static_cast<T*>(raw_data());
  }
  template <typename T> const T* data() const {
    if (DTypeOf<T>() != dtype_) [[unlikely]] DataFail(DTypeOf<T>());
    return static_cast<const T*>(raw_data());
  }
  // Null on meta (also for views: no offset is added to a null buffer).
  void* raw_data() { return const_cast<void*>(std::as_const(*this).raw_data()); }
  const void* raw_data() const {
    const char* base = static_cast<const char*>(storage_->data());
    return base == nullptr ? nullptr : base + offset_bytes_;
  }

  // Element i (row-major) converted to double, any dtype. For tests and printing. 0 on meta.
  double at(int64_t flat_index) const;
  // The only element of a tensor with numel()==1, as double (0 on meta).
  double item() const;
  // All elements converted to T (double or float or int64_t); zeros on meta.
  template <typename T> std::vector<T> ToVector() const;

  // A view with a new shape of the same numel; one dim may be -1 (inferred).
  Tensor Reshape(absl::Span<const int64_t> shape) const;
  // Rows [start, start+length) of dim 0, as a view (contiguous, so no copy).
  Tensor SliceRows(int64_t start, int64_t length) const;
  // A deep copy on the same device.
  Tensor Clone() const;
  // This tensor on `device`: itself (shared storage) when already there, else a copy. To meta:
  // a data-less tensor of the same shape; from meta: zeros.
  Tensor To(Device device) const;
  bool SharesStorageWith(const Tensor& other) const { return storage_ == other.storage_; }
  // Storage::Release / Adopt on this tensor's storage (every tensor sharing it sees the change):
  // FSDP frees a gathered parameter after its forward and refills it for the backward.
  void ReleaseBuffer() const;
  void RefillBuffer(const Tensor& from) const;
  bool buffer_released() const { return storage_ != nullptr && storage_->released(); }

  // "f32[2,3]"
  std::string ShapeString() const;

 private:
  Tensor SliceFlat(int64_t i) const;  // element i as a [1] view
  // The cold halves of the inline accessors (kept out of line so callers stay small).
  [[noreturn]] void DimFail(int i) const;
  [[noreturn]] void DataFail(DType asked) const;

  std::shared_ptr<Storage> storage_;
  size_t offset_bytes_ = 0;
  Shape shape_;
  int64_t numel_ = 0;
  DType dtype_ = DType::kF32;
};

}  // namespace shardmap

#endif  // SHARDMAP_TENSOR_TENSOR_H_
