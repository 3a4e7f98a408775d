#include "tensor/tensor.h"

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tensor/cuda/device_memory.h"
#include "tensor/error.h"
#include "tensor/internal/accounting.h"
#include "tensor/internal/cpu_allocator.h"

namespace shardmap {

std::string ShapeToString(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
}

int64_t NumElements(absl::Span<const int64_t> shape) {
  int64_t n = 1;
  bool overflow = false;
  for (int64_t d : shape) {
    if (d == 0) return 0;
    overflow = overflow || __builtin_mul_overflow(n, d, &n);
  }
  if (overflow) OpFail("shape ", ShapeToString(shape), " has more elements than int64 can count");
  return n;
}

std::shared_ptr<Storage> Storage::AllocateCpu(size_t nbytes) {
  std::shared_ptr<Storage> s = std::make_shared<Storage>(Key());
  s->nbytes_ = nbytes;
  if (nbytes <= kInlineBytes) {
    const uintptr_t at = reinterpret_cast<uintptr_t>(s->inline_);
    s->data_ = s->inline_ + ((64 - at % 64) % 64);
  } else {
    s->data_ = internal::AllocateAligned(nbytes);
  }
  if (internal::tls_accounting.tracker != nullptr) [[unlikely]] s->Track();
  return s;
}

std::shared_ptr<Storage> Storage::AllocateMeta(size_t nbytes) {
  std::shared_ptr<Storage> s = std::make_shared<Storage>(Key());
  s->nbytes_ = nbytes;
  s->device_ = Device::Meta();
  if (internal::tls_accounting.tracker != nullptr) s->Track();
  return s;
}

std::shared_ptr<Storage> Storage::AllocateOn(Device device, size_t nbytes) {
  if (device.is_meta()) return AllocateMeta(nbytes);
  if (!device.is_cuda()) return AllocateCpu(nbytes);
  std::shared_ptr<Storage> s = std::make_shared<Storage>(Key());
  s->data_ = cuda::DeviceAllocate(device.index, nbytes);
  s->nbytes_ = nbytes;
  s->device_ = device;
  if (internal::tls_accounting.tracker != nullptr) [[unlikely]] s->Track();
  return s;
}

void Storage::Release() {
  if (released_) return;
  if (tracker_ != nullptr) Untrack();
  tracker_.reset();
  if (device_.is_cuda()) {
    cuda::DeviceFree(device_.index, data_);
    data_ = nullptr;
  } else if (!device_.is_meta() && nbytes_ > kInlineBytes) {
    internal::FreeAligned(data_, nbytes_);
    data_ = nullptr;
  }
  released_ = true;
}

void Storage::Adopt(Storage& from) {
  if (!released_ || from.released_ || &from == this || from.nbytes_ != nbytes_ ||
      from.device_ != device_) {
    OpFail("Storage::Adopt: needs a released storage and a live one of the same size and device "
           "(have ", nbytes_, " bytes on ", device_.ToString(), released_ ? ", released" : ", live",
           " and ", from.nbytes_, " bytes on ", from.device_.ToString(),
           from.released_ ? ", released" : ", live", ")");
  }
  if (!device_.is_cuda() && !device_.is_meta() && nbytes_ <= kInlineBytes) {
    std::memcpy(data_, from.data_, nbytes_);  // inline buffers stay in their objects
  } else {
    data_ = from.data_;
    from.data_ = nullptr;
  }
  tracker_ = std::move(from.tracker_);
  op_scope_ = from.op_scope_;
  from.released_ = true;
  released_ = false;
}

void Tensor::ReleaseBuffer() const {
  if (storage_ == nullptr) OpFail("ReleaseBuffer: the tensor is undefined");
  storage_->Release();
}

void Tensor::RefillBuffer(const Tensor& from) const {
  if (storage_ == nullptr || from.storage_ == nullptr) OpFail("RefillBuffer: undefined tensor");
  if (from.shape() != shape() || from.dtype() != dtype() || from.offset_bytes_ != offset_bytes_) {
    OpFail("RefillBuffer: ", ShapeString(), " cannot take the buffer of ", from.ShapeString());
  }
  storage_->Adopt(*from.storage_);
}

Storage::~Storage() {
  if (released_) return;
  if (tracker_ != nullptr) [[unlikely]] Untrack();
  if (device_.is_meta()) {
    // no buffer
  } else if (device_.is_cuda()) {
    cuda::DeviceFree(device_.index, data_);
  } else if (nbytes_ > kInlineBytes) {
    internal::FreeAligned(data_, nbytes_);
  }
}

std::string Device::ToString() const {
  switch (kind) {
    case DeviceKind::kCUDA: return absl::StrCat("cuda:", index);
    case DeviceKind::kMeta: return "meta";
    case DeviceKind::kCPU: break;
  }
  return "cpu";
}

Tensor Tensor::Empty(absl::Span<const int64_t> shape, DType dtype, Device device) {
  if (!IsValidDType(dtype)) {
    OpFail("tensor: invalid DType value ", static_cast<int>(dtype), " for shape ",
           ShapeToString(shape), " (not one of f32, f64, bf16, f16, i32, i64)");
  }
  int64_t numel = 1;
  bool overflow = false, has_zero = false;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0) {
      OpFail("tensor: dim ", i, " of shape ", ShapeToString(shape),
             " is negative; sizes must be >= 0");
    }
    has_zero = has_zero || shape[i] == 0;
    overflow = overflow || __builtin_mul_overflow(numel, shape[i], &numel);
  }
  if (has_zero) numel = 0;
  // Byte counts must fit too (2^62 bytes is far beyond any machine; the allocator reports less).
  // (Every dtype is at most 8 bytes, so below 2^59 elements the division is not needed.)
  const bool huge = overflow || (numel >= (int64_t{1} << 59) &&
                                 numel > (int64_t{1} << 62) / static_cast<int64_t>(DTypeSize(dtype)));
  if (!has_zero && huge) {
    OpFail("tensor: shape ", ShapeToString(shape), " of ", DTypeName(dtype),
           " has too many elements to address");
  }
  Tensor t;
  t.shape_.assign(shape.begin(), shape.end());
  t.numel_ = numel;
  t.dtype_ = dtype;
  t.storage_ = device.kind == DeviceKind::kCPU ? Storage::AllocateCpu(t.nbytes())
                                               : Storage::AllocateOn(device, t.nbytes());
  return t;
}

Tensor Tensor::Zeros(absl::Span<const int64_t> shape, DType dtype, Device device) {
  Tensor t = Empty(shape, dtype, device);
  if (device.is_meta()) return t;
  if (device.is_cuda()) {
    cuda::MemsetZero(t.raw_data(), device.index, t.nbytes());
  } else if (t.nbytes() > 0) {
    std::memset(t.raw_data(), 0, t.nbytes());
  }
  return t;
}

namespace {

void FillWith(Tensor& t, double value) {
  const int64_t n = t.numel();
  switch (t.dtype()) {
    case DType::kF32: std::fill_n(t.data<float>(), n, static_cast<float>(value)); break;
    case DType::kF64: std::fill_n(t.data<double>(), n, value); break;
    case DType::kI32: std::fill_n(t.data<int32_t>(), n, static_cast<int32_t>(value)); break;
    case DType::kI64: std::fill_n(t.data<int64_t>(), n, static_cast<int64_t>(value)); break;
    case DType::kBF16:
      std::fill_n(static_cast<uint16_t*>(t.raw_data()), n, FloatToBF16(static_cast<float>(value)));
      break;
    case DType::kF16:
      std::fill_n(static_cast<uint16_t*>(t.raw_data()), n, FloatToF16(static_cast<float>(value)));
      break;
  }
}

void SetFromDouble(Tensor& t, int64_t i, double v) {
  switch (t.dtype()) {
    case DType::kF32: t.data<float>()[i] = static_cast<float>(v); break;
    case DType::kF64: t.data<double>()[i] = v; break;
    case DType::kI32: t.data<int32_t>()[i] = static_cast<int32_t>(v); break;
    case DType::kI64: t.data<int64_t>()[i] = static_cast<int64_t>(v); break;
    case DType::kBF16:
      static_cast<uint16_t*>(t.raw_data())[i] = FloatToBF16(static_cast<float>(v));
      break;
    case DType::kF16:
      static_cast<uint16_t*>(t.raw_data())[i] = FloatToF16(static_cast<float>(v));
      break;
  }
}

}  // namespace

Tensor Tensor::Ones(absl::Span<const int64_t> shape, DType dtype, Device device) {
  return Full(shape, 1.0, dtype, device);
}

Tensor Tensor::Full(absl::Span<const int64_t> shape, double value, DType dtype, Device device) {
  Tensor t = Empty(shape, dtype, device);
  if (device.is_meta()) return t;
  if (device.is_cuda()) {
    cuda::Fill(t.raw_data(), device.index, dtype, t.numel(), value);
  } else {
    FillWith(t, value);
  }
  return t;
}

Tensor Tensor::Scalar(double value, DType dtype) { return Full({}, value, dtype); }

Tensor Tensor::Arange(int64_t n, DType dtype) {
  Tensor t = Empty({n}, dtype);
  for (int64_t i = 0; i < n; ++i) SetFromDouble(t, i, static_cast<double>(i));
  return t;
}

template <typename T>
Tensor Tensor::FromVector(absl::Span<const int64_t> shape, const std::vector<T>& values,
                          DType dtype) {
  Tensor t = Empty(shape, dtype);
  if (static_cast<int64_t>(values.size()) != t.numel()) {
    OpFail("tensor: FromVector got ", values.size(), " values for shape ", ShapeToString(shape),
           " (", t.numel(), " elements)");
  }
  if (dtype == DTypeOf<T>()) {
    if (!values.empty()) std::memcpy(t.raw_data(), values.data(), t.nbytes());
  } else {
    for (int64_t i = 0; i < t.numel(); ++i) SetFromDouble(t, i, static_cast<double>(values[i]));
  }
  return t;
}
template Tensor Tensor::FromVector<float>(absl::Span<const int64_t>, const std::vector<float>&,
                                          DType);
template Tensor Tensor::FromVector<double>(absl::Span<const int64_t>, const std::vector<double>&,
                                           DType);
template Tensor Tensor::FromVector<int32_t>(absl::Span<const int64_t>,
                                            const std::vector<int32_t>&, DType);
template Tensor Tensor::FromVector<int64_t>(absl::Span<const int64_t>,
                                            const std::vector<int64_t>&, DType);

void Tensor::DimFail(int i) const {
  OpFail("tensor: dim ", i, " is out of range for ", ShapeString(), " (rank ", rank(), ")");
}

void Tensor::DataFail(DType asked) const {
  OpFail("tensor: data<", DTypeName(asked), ">() on a ", ShapeString(), " tensor");
}

double Tensor::at(int64_t i) const {
  if (i < 0 || i >= numel_) OpFail("tensor: index ", i, " out of range for ", ShapeString());
  if (is_meta()) return 0;  // shape-only execution reads zeros (tensor.h)
  if (is_cuda()) return SliceFlat(i).To(Device::Cpu()).at(0);
  switch (dtype_) {
    case DType::kF32: return data<float>()[i];
    case DType::kF64: return data<double>()[i];
    case DType::kI32: return data<int32_t>()[i];
    case DType::kI64: return static_cast<double>(data<int64_t>()[i]);
    case DType::kBF16: return BF16ToFloat(static_cast<const uint16_t*>(raw_data())[i]);
    case DType::kF16: return F16ToFloat(static_cast<const uint16_t*>(raw_data())[i]);
  }
  return 0;
}

double Tensor::item() const {
  if (numel_ != 1) OpFail("tensor: item() needs exactly one element, got ", ShapeString());
  return at(0);
}

template <typename T>
std::vector<T> Tensor::ToVector() const {
  if (is_cuda()) return To(Device::Cpu()).ToVector<T>();
  std::vector<T> out(numel_);
  if (is_meta()) return out;  // zeros
  for (int64_t i = 0; i < numel_; ++i) out[i] = static_cast<T>(at(i));
  return out;
}
template std::vector<float> Tensor::ToVector<float>() const;
template std::vector<double> Tensor::ToVector<double>() const;
template std::vector<int64_t> Tensor::ToVector<int64_t>() const;

Tensor Tensor::Reshape(absl::Span<const int64_t> shape) const {
  Shape out(shape.begin(), shape.end());
  int infer = -1;
  int64_t known = 1;
  bool overflow = false, has_zero = false;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == -1) {
      if (infer >= 0) OpFail("reshape: more than one -1 in ", ShapeToString(shape));
      infer = static_cast<int>(i);
    } else if (out[i] < 0) {
      OpFail("reshape: negative size in ", ShapeToString(shape));
    } else {
      has_zero = has_zero || out[i] == 0;
      overflow = overflow || __builtin_mul_overflow(known, out[i], &known);
    }
  }
  if (has_zero) {
    known = 0;
  } else if (overflow) {
    OpFail("reshape: ", ShapeToString(shape), " has more elements than int64 can count (",
           ShapeString(), " has ", numel_, ")");
  }
  if (infer >= 0) {
    if (known == 0 || numel_ % known != 0) {
      OpFail("reshape: cannot infer -1 reshaping ", ShapeString(), " to ", ShapeToString(shape));
    }
    out[infer] = numel_ / known;
    known *= out[infer];
  }
  if (known != numel_) {
    OpFail("reshape: ", ShapeString(), " has ", numel_, " elements but ", ShapeToString(shape),
           " has ", known);
  }
  Tensor t = *this;
  t.shape_ = std::move(out);
  return t;
}

Tensor Tensor::SliceRows(int64_t start, int64_t length) const {
  if (rank() == 0) OpFail("slice_rows: ", ShapeString(), " has no dim 0");
  if (start < 0 || length < 0 || start > shape_[0] || length > shape_[0] - start) {
    int64_t end = 0;
    const std::string rows = __builtin_add_overflow(start, length, &end)
                                 ? absl::StrCat(length, " rows from row ", start)
                                 : absl::StrCat("rows [", start, ", ", end, ")");
    OpFail("slice_rows: ", rows, " out of range for ", ShapeString(),
           " (start and length must be >= 0 and start + length <= ", shape_[0], ")");
  }
  Tensor t = *this;
  const int64_t row = shape_[0] == 0 ? 0 : numel_ / shape_[0];
  t.offset_bytes_ += static_cast<size_t>(start * row) * DTypeSize(dtype_);
  t.shape_[0] = length;
  t.numel_ = length * row;
  return t;
}

Tensor Tensor::Clone() const {
  const Device dev = device();
  Tensor t = Empty(shape_, dtype_, dev);
  if (dev.is_meta()) return t;
  if (dev.is_cuda()) {
    cuda::CopyDeviceToDevice(t.raw_data(), dev.index, raw_data(), dev.index, nbytes());
  } else if (nbytes() > 0) {
    std::memcpy(t.raw_data(), raw_data(), nbytes());
  }
  return t;
}

Tensor Tensor::To(Device target) const {
  if (!defined()) OpFail("tensor: To(", target.ToString(), ") of an undefined tensor");
  const Device from = device();
  if (from == target) return *this;
  if (target.is_meta()) return Empty(shape_, dtype_, target);
  if (from.is_meta()) return Zeros(shape_, dtype_, target);  // shape-only values read as 0
  Tensor t = Empty(shape_, dtype_, target);
  if (!from.is_cuda()) {
    cuda::CopyHostToDevice(t.raw_data(), target.index, raw_data(), nbytes());
  } else if (!target.is_cuda()) {
    cuda::CopyDeviceToHost(t.raw_data(), raw_data(), from.index, nbytes());
  } else {
    cuda::CopyDeviceToDevice(t.raw_data(), target.index, raw_data(), from.index, nbytes());
  }
  return t;
}

Tensor Tensor::SliceFlat(int64_t i) const {
  Tensor t = *this;
  t.offset_bytes_ += static_cast<size_t>(i) * DTypeSize(dtype_);
  t.shape_.assign({1});
  t.numel_ = 1;
  return t;
}

std::string Tensor::ShapeString() const {
  return absl::StrCat(DTypeName(dtype_), ShapeToString(shape_));
}

}  // namespace shardmap
