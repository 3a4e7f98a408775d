#include "tensor/cuda/nn/nn_ops.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tensor/error.h"

#if SHARDMAP_HAS_CUDA
#include <cuda_runtime.h>

#include "tensor/cuda/device_memory.h"
#include "tensor/cuda/internal/cuda_check.h"
#include "tensor/cuda/internal/op_context.h"
#include "tensor/cuda/nn/kernels.h"
#include "tensor/cuda/runtime.h"
#endif

namespace shardmap::cuda {

#if SHARDMAP_HAS_CUDA

namespace {

using internal::BadPosition;
using internal::DeviceIndexAt;
using internal::OnDevice;

namespace k = nn_kernels;

#define SM_NN_LAUNCH(expr) SM_CUDA_CHECK(static_cast<cudaError_t>(expr))

DType ComputeType(DType t) { return t == DType::kF64 ? DType::kF64 : DType::kF32; }

int64_t Prod(const Shape& s, int begin, int end) {
  int64_t n = 1;
  for (int i = begin; i < end; ++i) n *= s[i];
  return n;
}

Shape RowShape(const Tensor& x) { return Shape(x.shape().begin(), x.shape().end() - 1); }

// "[1,2]": the multi-index of flat position i (the CPU ops' format).
std::string IndexString(absl::Span<const int64_t> shape, int64_t i) {
  std::vector<int64_t> idx(shape.size());
  for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
    idx[d] = shape[d] == 0 ? 0 : i % shape[d];
    i = shape[d] == 0 ? 0 : i / shape[d];
  }
  return absl::StrCat("[", absl::StrJoin(idx, ","), "]");
}


// t in dtype `to` on its device (t itself when it already is); undefined stays undefined.
Tensor CastTo(const Tensor& t, DType to, void* stream) {
  if (!t.defined() || t.dtype() == to) return t;
  Tensor out = Tensor::Empty(t.shape(), to, t.device());
  SM_NN_LAUNCH(k::LaunchCast(t.raw_data(), t.dtype(), out.raw_data(), to, t.numel(), stream));
  return out;
}

const void* PtrOrNull(const Tensor& t) { return t.defined() ? t.raw_data() : nullptr; }



NormBackward NormBackwardImpl(const Tensor& x, const Tensor& gamma, const Tensor& mean,
                              const Tensor& rstd, const Tensor& dy, bool rms) {
  OnDevice on(x);
  const DType ct = ComputeType(x.dtype());
  const Tensor g = CastTo(gamma, ct, on.stream), rc = CastTo(rstd, ct, on.stream);
  const Tensor mc = rms ? Tensor() : CastTo(mean, ct, on.stream);
  const int64_t h = x.dim(-1), rows = rstd.numel();
  NormBackward out;
  out.dx = Tensor::Empty(x.shape(), x.dtype(), on.device);
  const DType pt0 = gamma.defined() ? gamma.dtype() : x.dtype();
  if (rows > 0 && k::VecNormUsable(x.dtype(), h,
                                   {x.raw_data(), dy.raw_data(), out.dx.raw_data(), PtrOrNull(g)})) {
    // x and dy read once: dx and the parameter gradients' partial rows in one pass.
    if (gamma.defined()) out.dgamma = Tensor::Empty({h}, pt0, on.device);
    if (!rms) out.dbeta = Tensor::Empty({h}, pt0, on.device);
    const bool params = out.dgamma.defined() || out.dbeta.defined();
    Tensor work = Tensor::Empty({params ? 2 * k::VecNormPartialRows(x.dtype(), rows, h) * h : 1},
                                DType::kF32, on.device);
    SM_NN_LAUNCH(k::LaunchNormBackwardVec(
        x.raw_data(), PtrOrNull(g), PtrOrNull(mc), rc.raw_data(), dy.raw_data(),
        out.dx.raw_data(), x.dtype(), rows, h, rms, work.raw_data(),
        out.dgamma.defined() ? out.dgamma.raw_data() : nullptr, pt0,
        out.dbeta.defined() ? out.dbeta.raw_data() : nullptr, pt0, on.stream));
    return out;
  }
  SM_NN_LAUNCH(k::LaunchNormBackwardDx(x.raw_data(), PtrOrNull(g), PtrOrNull(mc), rc.raw_data(),
                                       dy.raw_data(), out.dx.raw_data(), x.dtype(), rows, h, rms,
                                       on.stream));
  const DType pt = gamma.defined() ? gamma.dtype() : x.dtype();
  if (gamma.defined()) out.dgamma = Tensor::Empty({h}, pt, on.device);
  if (!rms) out.dbeta = Tensor::Empty({h}, pt, on.device);
  if (out.dgamma.defined() || out.dbeta.defined()) {
    Tensor work = Tensor::Empty({2 * k::NormParamChunks(rows) * h}, ct, on.device);
    SM_NN_LAUNCH(k::LaunchNormBackwardParams(
        x.raw_data(), PtrOrNull(mc), rc.raw_data(), dy.raw_data(), x.dtype(), rows, h, rms,
        work.raw_data(), out.dgamma.defined() ? out.dgamma.raw_data() : nullptr, pt,
        out.dbeta.defined() ? out.dbeta.raw_data() : nullptr, pt, on.stream));
  }
  return out;
}

}  // namespace

Tensor Softmax(const Tensor& x, int dim, bool log) {
  OnDevice on(x);
  Tensor out = Tensor::Empty(x.shape(), x.dtype(), on.device);
  if (x.numel() == 0) return out;
  if (dim == x.rank() - 1 &&
      k::VecNormUsable(x.dtype(), x.shape()[dim], {x.raw_data(), out.raw_data()})) {
    SM_NN_LAUNCH(k::LaunchSoftmaxVec(x.raw_data(), out.raw_data(), x.dtype(),
                                     x.numel() / x.shape()[dim], x.shape()[dim], log, on.stream));
    return out;
  }
  SM_NN_LAUNCH(k::LaunchSoftmax(x.raw_data(), out.raw_data(), x.dtype(), Prod(x.shape(), 0, dim),
                                x.shape()[dim], Prod(x.shape(), dim + 1, x.rank()), log,
                                on.stream));
  return out;
}

Tensor SoftmaxBackward(const Tensor& y, const Tensor& dy, int dim, bool log) {
  OnDevice on(y);
  Tensor dx = Tensor::Empty(y.shape(), y.dtype(), on.device);
  if (y.numel() == 0) return dx;
  if (dim == y.rank() - 1 &&
      k::VecNormUsable(y.dtype(), y.shape()[dim], {y.raw_data(), dy.raw_data(), dx.raw_data()})) {
    SM_NN_LAUNCH(k::LaunchSoftmaxBackwardVec(y.raw_data(), dy.raw_data(), dx.raw_data(),
                                             y.dtype(), y.numel() / y.shape()[dim],
                                             y.shape()[dim], log, on.stream));
    return dx;
  }
  SM_NN_LAUNCH(k::LaunchSoftmaxBackward(y.raw_data(), dy.raw_data(), dx.raw_data(), y.dtype(),
                                        Prod(y.shape(), 0, dim), y.shape()[dim],
                                        Prod(y.shape(), dim + 1, y.rank()), log, on.stream));
  return dx;
}

NormForward LayerNorm(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps) {
  OnDevice on(x);
  const DType ct = ComputeType(x.dtype());
  const Tensor g = CastTo(gamma, ct, on.stream), b = CastTo(beta, ct, on.stream);
  NormForward r;
  r.y = Tensor::Empty(x.shape(), x.dtype(), on.device);
  r.mean = Tensor::Empty(RowShape(x), ct, on.device);
  r.rstd = Tensor::Empty(RowShape(x), ct, on.device);
  if (k::VecNormUsable(x.dtype(), x.dim(-1),
                       {x.raw_data(), r.y.raw_data(), PtrOrNull(g), PtrOrNull(b)})) {
    SM_NN_LAUNCH(k::LaunchNormVec(x.raw_data(), PtrOrNull(g), PtrOrNull(b), r.y.raw_data(),
                                  r.mean.raw_data(), r.rstd.raw_data(), x.dtype(),
                                  r.mean.numel(), x.dim(-1), eps, /*rms=*/false, on.stream));
    return r;
  }
  SM_NN_LAUNCH(k::LaunchNorm(x.raw_data(), PtrOrNull(g), PtrOrNull(b), r.y.raw_data(),
                             r.mean.raw_data(), r.rstd.raw_data(), x.dtype(), r.mean.numel(),
                             x.dim(-1), eps, /*rms=*/false, on.stream));
  return r;
}

NormForward RmsNorm(const Tensor& x, const Tensor& gamma, double eps) {
  OnDevice on(x);
  const DType ct = ComputeType(x.dtype());
  const Tensor g = CastTo(gamma, ct, on.stream);
  NormForward r;
  r.y = Tensor::Empty(x.shape(), x.dtype(), on.device);
  r.rstd = Tensor::Empty(RowShape(x), ct, on.device);
  if (k::VecNormUsable(x.dtype(), x.dim(-1), {x.raw_data(), r.y.raw_data(), PtrOrNull(g)})) {
    SM_NN_LAUNCH(k::LaunchNormVec(x.raw_data(), PtrOrNull(g), nullptr, r.y.raw_data(), nullptr,
                                  r.rstd.raw_data(), x.dtype(), r.rstd.numel(), x.dim(-1), eps,
                                  /*rms=*/true, on.stream));
    return r;
  }
  SM_NN_LAUNCH(k::LaunchNorm(x.raw_data(), PtrOrNull(g), nullptr, r.y.raw_data(), nullptr,
                             r.rstd.raw_data(), x.dtype(), r.rstd.numel(), x.dim(-1), eps,
                             /*rms=*/true, on.stream));
  return r;
}

NormBackward LayerNormBackward(const Tensor& x, const Tensor& gamma, const Tensor& mean,
                               const Tensor& rstd, const Tensor& dy) {
  return NormBackwardImpl(x, gamma, mean, rstd, dy, /*rms=*/false);
}

NormBackward RmsNormBackward(const Tensor& x, const Tensor& gamma, const Tensor& rstd,
                             const Tensor& dy) {
  return NormBackwardImpl(x, gamma, Tensor(), rstd, dy, /*rms=*/true);
}

Tensor Embedding(const Tensor& table, const Tensor& ids) {
  OnDevice on(table);
  const int64_t v = table.dim(0), h = table.dim(1);
  Shape out_shape = ids.shape();
  out_shape.push_back(h);
  Tensor out = Tensor::Empty(out_shape, table.dtype(), on.device);
  if (ids.numel() == 0) return out;
  BadPosition bad(on);
  SM_NN_LAUNCH(k::LaunchEmbedding(table.raw_data(), v,
                                  h * static_cast<int64_t>(DTypeSize(table.dtype())),
                                  ids.raw_data(), ids.dtype() == DType::kI64, ids.numel(),
                                  out.raw_data(), bad.ptr(), on.stream));
  bad.Check([ids, table_shape = table.ShapeString(), v](int64_t i) {
    OpFail("embedding: id ", DeviceIndexAt(ids, i), " at ", IndexString(ids.shape(), i), " of ids ",
           ids.ShapeString(), " is out of range for table ", table_shape,
           "; expected 0 <= id < ", v);
  });
  return out;
}

Tensor EmbeddingBackward(const Tensor& ids, const Tensor& dy, int64_t num_rows) {
  OnDevice on(dy);
  const DType ct = ComputeType(dy.dtype());
  const int64_t h = dy.dim(-1);
  Tensor acc = Tensor::Empty({num_rows, h}, ct, on.device);
  if (ids.numel() >= (int64_t{1} << 31) || num_rows >= (int64_t{1} << 31) - 1) {
    OpFail("embedding_backward: ", ids.numel(), " ids over a table of ", num_rows,
           " rows; the deterministic backward sorts 32-bit keys, so both must be below 2^31: "
           "split the batch or the table");
  }
  const size_t scratch_bytes = k::EmbeddingBackwardScratchBytes(ids.numel(), num_rows);
  Tensor scratch;
  if (scratch_bytes > 0) {
    scratch = Tensor::Empty({static_cast<int64_t>((scratch_bytes + 7) / 8)}, DType::kI64,
                            on.device);
  }
  BadPosition bad(on);
  SM_NN_LAUNCH(k::LaunchEmbeddingBackward(ids.raw_data(), ids.dtype() == DType::kI64,
                                          ids.numel(), dy.raw_data(), dy.dtype(), h, num_rows,
                                          acc.raw_data(), bad.ptr(),
                                          scratch.defined() ? scratch.raw_data() : nullptr,
                                          on.stream));
  if (ids.numel() > 0) {
    bad.Check([ids, num_rows](int64_t i) {
      OpFail("embedding_backward: id ", DeviceIndexAt(ids, i), " at ", IndexString(ids.shape(), i),
             " of ids ", ids.ShapeString(), " is out of range; expected 0 <= id < ", num_rows);
    });
  }
  return CastTo(acc, dy.dtype(), on.stream);
}

namespace {

[[noreturn]] void BadTarget(const char* op, const Tensor& targets, int64_t i, int64_t v,
                            int64_t ignore_index) {
  OpFail(op, ": target ", DeviceIndexAt(targets, i), " at ", IndexString(targets.shape(), i),
         " of targets ", targets.ShapeString(), " is out of range; expected 0 <= target < ", v,
         " or ignore_index (", ignore_index, ")");
}

}  // namespace

Tensor CrossEntropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index) {
  OnDevice on(logits);
  const DType ct = ComputeType(logits.dtype());
  const int64_t v = logits.dim(-1), rows = targets.numel();
  Tensor loss = Tensor::Empty(targets.shape(), ct, on.device);
  if (rows == 0) return loss;
  BadPosition bad(on);
  SM_NN_LAUNCH(k::LaunchCrossEntropy(logits.raw_data(), logits.dtype(), targets.raw_data(),
                                     targets.dtype() == DType::kI64, loss.raw_data(), rows, v,
                                     ignore_index, bad.ptr(), on.stream));
  bad.Check([targets, v, ignore_index](int64_t i) {
    BadTarget("cross_entropy", targets, i, v, ignore_index);
  });
  return loss;
}

Tensor CrossEntropyBackward(const Tensor& logits, const Tensor& targets, const Tensor& dloss,
                            int64_t ignore_index) {
  OnDevice on(logits);
  const DType ct = ComputeType(logits.dtype());
  const int64_t v = logits.dim(-1), rows = targets.numel();
  Tensor dx = Tensor::Empty(logits.shape(), logits.dtype(), on.device);
  if (rows == 0) return dx;
  const Tensor dl = CastTo(dloss, ct, on.stream);
  BadPosition bad(on);
  SM_NN_LAUNCH(k::LaunchCrossEntropyBackward(
      logits.raw_data(), logits.dtype(), targets.raw_data(), targets.dtype() == DType::kI64,
      dl.raw_data(), dx.raw_data(), rows, v, ignore_index, bad.ptr(), on.stream));
  bad.Check([targets, v, ignore_index](int64_t i) {
    BadTarget("cross_entropy_backward", targets, i, v, ignore_index);
  });
  return dx;
}

Tensor CausalMask(const Tensor& scores, int64_t offset, double fill) {
  OnDevice on(scores);
  Tensor out = Tensor::Empty(scores.shape(), scores.dtype(), on.device);
  const int64_t s = scores.dim(-2), t = scores.dim(-1);
  const int64_t mats = s * t == 0 ? 0 : scores.numel() / (s * t);
  SM_NN_LAUNCH(k::LaunchCausalMask(scores.raw_data(), out.raw_data(), scores.dtype(), mats, s, t,
                                   offset, fill, on.stream));
  return out;
}

Tensor CausalSoftmax(const Tensor& scores, int64_t offset) {
  OnDevice on(scores);
  Tensor out = Tensor::Empty(scores.shape(), scores.dtype(), on.device);
  const int64_t s = scores.dim(-2), t = scores.dim(-1);
  const int64_t mats = s * t == 0 ? 0 : scores.numel() / (s * t);
  SM_NN_LAUNCH(k::LaunchCausalSoftmax(scores.raw_data(), out.raw_data(), scores.dtype(), mats, s,
                                      t, offset, on.stream));
  return out;
}

#else  // !SHARDMAP_HAS_CUDA

namespace {
[[noreturn]] void NoCuda(const char* op) {
  OpFail(op, ": a CUDA tensor, but this build of shardmap was built without CUDA");
}
}  // namespace

Tensor Softmax(const Tensor&, int, bool log) { NoCuda(log ? "log_softmax" : "softmax"); }
Tensor SoftmaxBackward(const Tensor&, const Tensor&, int, bool log) {
  NoCuda(log ? "log_softmax_backward" : "softmax_backward");
}
NormForward LayerNorm(const Tensor&, const Tensor&, const Tensor&, double) {
  NoCuda("layer_norm");
}
NormBackward LayerNormBackward(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                               const Tensor&) {
  NoCuda("layer_norm_backward");
}
NormForward RmsNorm(const Tensor&, const Tensor&, double) { NoCuda("rms_norm"); }
NormBackward RmsNormBackward(const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  NoCuda("rms_norm_backward");
}
Tensor Embedding(const Tensor&, const Tensor&) { NoCuda("embedding"); }
Tensor EmbeddingBackward(const Tensor&, const Tensor&, int64_t) { NoCuda("embedding_backward"); }
Tensor CrossEntropy(const Tensor&, const Tensor&, int64_t) { NoCuda("cross_entropy"); }
Tensor CrossEntropyBackward(const Tensor&, const Tensor&, const Tensor&, int64_t) {
  NoCuda("cross_entropy_backward");
}
Tensor CausalMask(const Tensor&, int64_t, double) { NoCuda("causal_mask"); }
Tensor CausalSoftmax(const Tensor&, int64_t) { NoCuda("causal_softmax"); }

#endif  // SHARDMAP_HAS_CUDA

}  // namespace shardmap::cuda
