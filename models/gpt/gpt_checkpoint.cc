#include "models/gpt/gpt_checkpoint.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "tensor/ops/shape_ops.h"

namespace shardmap {

absl::StatusOr<std::vector<NamedTensor>> CheckpointTensors(const Model& model,
                                                           const std::vector<NamedTensor>& params,
                                                           const AdamState* moments) {
  const std::vector<ParamInfo>& infos = model.params();
  if (params.size() != infos.size() ||
      (moments != nullptr && (moments->exp_avg.size() != infos.size() ||
                              moments->exp_avg_sq.size() != infos.size()))) {
    return absl::InvalidArgumentError(
        absl::StrCat("one tensor per model parameter (", infos.size(), ") is needed, got ",
                     params.size()));
  }
  std::vector<NamedTensor> out;
  for (size_t i = 0; i < infos.size(); ++i) {
    if (params[i].name != infos[i].name) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", i, " is '", params[i].name,
                                                     "' but the model's is '", infos[i].name,
                                                     "'"));
    }
    out.push_back({model.CheckpointName(infos[i]),
                   params[i].tensor.Reshape(model.CheckpointShape(infos[i]))});
  }
  if (moments != nullptr) {
    for (size_t i = 0; i < infos.size(); ++i) {
      const std::string name = model.CheckpointName(infos[i]);
      const Shape shape = model.CheckpointShape(infos[i]);
      out.push_back({"optimizer.exp_avg." + name, moments->exp_avg[i].tensor.Reshape(shape)});
      out.push_back({"optimizer.exp_avg_sq." + name, moments->exp_avg_sq[i].tensor.Reshape(shape)});
    }
  }
  return out;
}

absl::Status SaveGpt(const std::string& path, const Model& layout,
                     const std::vector<NamedTensor>& params, const AdamState* moments,
                     int64_t step) {
  absl::StatusOr<std::vector<NamedTensor>> out = CheckpointTensors(layout, params, moments);
  if (!out.ok()) return out.status();
  return WriteSafetensors(path, *out, {{"format", "pt"}, {"step", absl::StrCat(step)}});
}

absl::Status CheckGptCheckpoint(const SafetensorsFile& file, const Model& layout,
                                bool need_optimizer) {
  for (const ParamInfo& p : layout.params()) {
    const std::string saved = layout.CheckpointName(p);
    std::vector<std::string> names = {saved};
    if (need_optimizer) {
      names.push_back("optimizer.exp_avg." + saved);
      names.push_back("optimizer.exp_avg_sq." + saved);
    }
    for (const std::string& name : names) {
      const SafetensorsEntry* e = file.Find(name);
      if (e == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(
            "checkpoint '", file.path(), "' has no tensor '", name, "'",
            need_optimizer ? " (--resume needs a checkpoint saved by train_gpt --save)" : ""));
      }
      if (e->shape != layout.CheckpointShape(p)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "checkpoint '", file.path(), "': tensor '", name, "' is ", ShapeToString(e->shape),
            " but the model (--layers/--d_model/--heads/--vocab/--seq) needs ",
            ShapeToString(layout.CheckpointShape(p))));
      }
    }
  }
  if (need_optimizer && file.metadata().count("step") == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint '", file.path(), "' has no 'step' in its metadata"));
  }
  return absl::OkStatus();
}

absl::StatusOr<SafetensorsFile> OpenGptCheckpoint(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat("checkpoint '", path, "': ", std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint '", path, "' is ", S_ISDIR(st.st_mode) ? "a directory" : "not a regular file",
        "; name a .safetensors file (written by train_gpt --save, or GPT-2's model.safetensors)"));
  }
  return SafetensorsFile::Open(path);
}

absl::StatusOr<int64_t> CheckpointStep(const SafetensorsFile& file) {
  auto it = file.metadata().find("step");
  if (it == file.metadata().end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint '", file.path(), "' has no 'step' in its metadata"));
  }
  int64_t step = 0;
  constexpr int64_t kMaxStep = int64_t{1} << 53;
  if (!absl::SimpleAtoi(it->second, &step) || step < 0 || step > kMaxStep) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint '", file.path(), "': step '", it->second,
        "' is not a whole number in [0, 2^53]; the file is damaged or was not written by "
        "train_gpt --save"));
  }
  return step;
}

absl::Status CheckSavePath(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot save to '", path, "': it is a directory; name a file in it"));
  }
  // Saving replaces the file: a device, FIFO or socket would become a regular file.
  if (stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot save to '", path, "': it exists and is not a regular file (",
        S_ISCHR(st.st_mode) ? "a character device" : S_ISBLK(st.st_mode) ? "a block device"
        : S_ISFIFO(st.st_mode) ? "a FIFO" : S_ISSOCK(st.st_mode) ? "a socket" : "a special file",
        "), which saving would replace; name a new or regular file"));
  }
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot save to '", path, "': directory '", dir, "' does not exist; create it first"));
  }
  if (access(dir.c_str(), W_OK) != 0) {
    return absl::FailedPreconditionError(absl::StrCat("cannot save to '", path, "': directory '",
                                                      dir, "' is not writable (",
                                                      std::strerror(errno), ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Tensor> ReadGptShard(const SafetensorsFile& file, const std::string& tensor,
                                    const ParamInfo& p, const Mesh& mesh, int rank, DType dtype) {
  // The rank's block of the stored (FSDP-padded) tensor; the file holds the unpadded one, so
  // the block is read clipped to it and padded with zeros (ParamInfo::fsdp_pad).
  const Shape& g = p.global_shape;
  const Shape stored = StoredShape(p);
  std::vector<int64_t> start(g.size(), 0), size(g.begin(), g.end());
  Shape block = stored;
  for (int d = 0; d < p.spec.size(); ++d) {
    const int n = p.spec.NumBlocks(mesh, d);
    if (n <= 1) continue;
    block[d] = stored[d] / n;
    start[d] = p.spec.BlockIndex(mesh, rank, d) * block[d];
    size[d] = std::max<int64_t>(0, std::min(block[d], g[d] - start[d]));
    start[d] = std::min(start[d], g[d]);
  }
  if (p.fsdp_pad == 0) return file.ReadBlock(tensor, g, start, size, dtype);
  Tensor out = Tensor::Zeros(block, dtype);
  if (size[p.fsdp_dim] == 0) return out;  // this rank holds padding only
  absl::StatusOr<Tensor> part = file.ReadBlock(tensor, g, start, size, dtype);
  if (!part.ok()) return part.status();
  SliceAssign(out, p.fsdp_dim, 0, *part);
  return out;
}

}  // namespace shardmap
