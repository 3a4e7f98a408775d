#include "shardmap/runtime/host_collectives.h"

#include <cstring>

#include "tensor/error.h"
#include "tensor/tensor.h"

namespace shardmap {

namespace {

// Host bytes -> a device tensor of `count` elements on `device` (current stream).
Tensor Staged(const void* host, size_t count, collectives::DataType dtype, Device device) {
  Tensor t = Tensor::Empty({static_cast<int64_t>(count)}, static_cast<DType>(dtype));
  if (count > 0) std::memcpy(t.raw_data(), host, t.nbytes());
  return t.To(device);
}

void Unstage(const Tensor& dev, void* host) {
  Tensor t = dev.To(Device::Cpu());
  if (t.numel() > 0) std::memcpy(host, t.raw_data(), t.nbytes());
}

}  // namespace

absl::Status AllGatherHost(collectives::Communicator& comm, const void* send, void* recv,
                           size_t send_count, collectives::DataType dtype) {
  const collectives::MemorySpace m = comm.memory_space();
  if (!m.device) return comm.AllGather(send, recv, send_count, dtype);
  absl::Status result;
  absl::Status s = CatchOpError([&] {
    const Device d = Device::Cuda(m.device_index);
    Tensor in = Staged(send, send_count, dtype, d);
    Tensor out = Tensor::Empty({static_cast<int64_t>(send_count) * comm.size()},
                               static_cast<DType>(dtype), d);
    result = comm.AllGather(in.raw_data(), out.raw_data(), send_count, dtype);
    if (result.ok()) Unstage(out, recv);
  });
  return s.ok() ? result : s;
}

absl::Status AllReduceHost(collectives::Communicator& comm, const void* send, void* recv,
                           size_t count, collectives::DataType dtype, collectives::ReduceOp op) {
  const collectives::MemorySpace m = comm.memory_space();
  if (!m.device) return comm.AllReduce(send, recv, count, dtype, op);
  absl::Status result;
  absl::Status s = CatchOpError([&] {
    Tensor buf = Staged(send, count, dtype, Device::Cuda(m.device_index));
    result = comm.AllReduce(buf.raw_data(), buf.raw_data(), count, dtype, op);
    if (result.ok()) Unstage(buf, recv);
  });
  return s.ok() ? result : s;
}

}  // namespace shardmap
