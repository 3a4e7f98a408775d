#include "models/train/checkpoint_rotation.h"

#include <algorithm>
#include <csignal>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "models/components/checkpoint.h"
#include "models/gpt/gpt_checkpoint.h"

namespace shardmap {
namespace {

constexpr char kSuffix[] = ".safetensors";
constexpr int64_t kMaxStep = int64_t{1} << 53;

bool IsDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// (directory, file-name prefix before ".step<N>.safetensors").
std::pair<std::string, std::string> Split(const std::string& dir_or_prefix) {
  if (absl::EndsWith(dir_or_prefix, "/") || IsDirectory(dir_or_prefix)) {
    std::string dir = dir_or_prefix;
    while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
    return {dir, "gpt"};
  }
  std::string p = dir_or_prefix;
  if (absl::EndsWith(p, kSuffix)) p.resize(p.size() - std::strlen(kSuffix));
  const size_t slash = p.rfind('/');
  if (slash == std::string::npos) return {".", p};
  return {slash == 0 ? "/" : p.substr(0, slash), p.substr(slash + 1)};
}

std::string Join(const std::string& dir, const std::string& name) {
  return dir == "/" ? "/" + name : dir + "/" + name;
}

absl::Status SyncPath(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("cannot open '", path, "' to fsync it (",
                                            std::strerror(errno), ")"));
  }
  const bool ok = ::fsync(fd) == 0;
  const int err = errno;
  ::close(fd);
  if (!ok) {
    return absl::DataLossError(
        absl::StrCat("fsync of '", path, "' failed (", std::strerror(err), ")"));
  }
  return absl::OkStatus();
}

absl::Status Invalid(const std::string& msg) { return absl::InvalidArgumentError(msg); }

constexpr DType kDTypes[] = {DType::kF32, DType::kF64, DType::kBF16, DType::kF16};

}  // namespace

absl::Status CheckpointRotation::Validate() const {
  if (dir_or_prefix.empty()) {
    return Invalid("checkpoint path is empty; give a directory or a file prefix (e.g. runs/gpt)");
  }
  if (keep_last < 0) {
    return Invalid(absl::StrCat("keep_last ", keep_last,
                                " is negative; give the number of checkpoints to keep (0: all)"));
  }
  return absl::OkStatus();
}

std::string CheckpointRotation::PathFor(int64_t step) const {
  auto [dir, prefix] = Split(dir_or_prefix);
  return Join(dir, absl::StrCat(prefix, ".step", step, kSuffix));
}

absl::Status CheckpointRotation::CheckWritable() const {
  if (absl::Status s = Validate(); !s.ok()) return s;
  const std::string dir = Split(dir_or_prefix).first;
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint directory '", dir, "' (of '", dir_or_prefix, "') does not exist (",
        std::strerror(errno), "); create it before training"));
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint directory '", dir, "' (of '", dir_or_prefix, "') is not a directory"));
  }
  const std::string probe = Join(dir, absl::StrCat(".write_probe.", ::getpid()));
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot create files in checkpoint directory '", dir, "' (", std::strerror(errno),
        "); fix its permissions or choose another path before training"));
  }
  ::close(fd);
  std::remove(probe.c_str());
  return absl::OkStatus();
}

absl::StatusOr<std::string> CheckpointRotation::Save(
    int64_t step, const std::function<absl::Status(const std::string& path)>& writer) const {
  if (absl::Status s = Validate(); !s.ok()) return s;
  if (step < 0 || step > kMaxStep) {
    return Invalid(absl::StrCat("checkpoint step ", step, " is outside [0, 2^53]"));
  }
  const std::string path = PathFor(step);
  const std::string dir = Split(dir_or_prefix).first;
  const std::string tmp = absl::StrCat(path, ".tmp.", ::getpid());
  auto fail = [&](const absl::Status& s) {
    std::remove(tmp.c_str());
    return absl::Status(s.code(), absl::StrCat("saving step ", step, " to '", path, "' failed: ",
                                               s.message(),
                                               " (the earlier checkpoints are untouched)"));
  };
  if (absl::Status s = writer(tmp); !s.ok()) return fail(s);
  struct stat st;
  if (::stat(tmp.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return fail(absl::InternalError(absl::StrCat("the writer left no file at '", tmp, "'")));
  }
  if (absl::Status s = SyncPath(tmp, false); !s.ok()) return fail(s);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return fail(absl::DataLossError(
        absl::StrCat("rename of '", tmp, "' failed (", std::strerror(errno), ")")));
  }
  if (absl::Status s = SyncPath(dir, true); !s.ok()) return s;
  if (keep_last > 0) {
    absl::StatusOr<std::vector<std::pair<int64_t, std::string>>> all = List();
    if (!all.ok()) return all.status();
    std::vector<std::pair<int64_t, std::string>> older;
    for (const auto& e : *all) {
      if (e.first >= step) continue;
      if (run_id.has_value()) {  // another run's (or an unreadable) file stays
        absl::StatusOr<std::string> id = CheckpointRunId(e.second);
        if (!id.ok() || *id != *run_id) continue;
      }
      older.push_back(e);
    }
    // Keep `step` and the keep_last - 1 newest before it.
    const int64_t drop = static_cast<int64_t>(older.size()) - (keep_last - 1);
    for (int64_t i = 0; i < drop; ++i) {
      if (std::remove(older[i].second.c_str()) != 0 && errno != ENOENT) {
        return absl::InternalError(absl::StrCat("saved '", path, "' but could not delete old '",
                                                older[i].second, "' (", std::strerror(errno),
                                                ")"));
      }
    }
  }
  return path;
}

absl::StatusOr<std::vector<std::pair<int64_t, std::string>>> CheckpointRotation::List() const {
  if (absl::Status s = Validate(); !s.ok()) return s;
  auto [dir, prefix] = Split(dir_or_prefix);
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) {
    return absl::NotFoundError(absl::StrCat("cannot list checkpoint directory '", dir, "' (",
                                            std::strerror(errno), ")"));
  }
  std::vector<std::pair<int64_t, std::string>> out;
  const std::string head = prefix + ".step";
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (!absl::StartsWith(name, head) || !absl::EndsWith(name, kSuffix)) continue;
    const std::string digits =
        name.substr(head.size(), name.size() - head.size() - std::strlen(kSuffix));
    int64_t step = 0;
    if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos ||
        !absl::SimpleAtoi(digits, &step)) {
      continue;
    }
    out.emplace_back(step, Join(dir, name));
  }
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

absl::StatusOr<std::string> CheckpointRotation::Latest() const {
  absl::StatusOr<std::vector<std::pair<int64_t, std::string>>> all = List();
  if (!all.ok()) return all.status();
  if (all->empty()) {
    auto [dir, prefix] = Split(dir_or_prefix);
    return absl::NotFoundError(absl::StrCat("no checkpoint matches '",
                                            Join(dir, absl::StrCat(prefix, ".step<N>", kSuffix)),
                                            "'"));
  }
  return all->back().second;
}

absl::StatusOr<std::string> CheckpointRotation::LatestComplete(
    std::vector<std::string>* skipped) const {
  absl::StatusOr<std::vector<std::pair<int64_t, std::string>>> all = List();
  if (!all.ok()) return all.status();
  for (auto it = all->rbegin(); it != all->rend(); ++it) {
    absl::StatusOr<GptCheckpointInfo> info = ReadGptCheckpointInfo(it->second);
    if (info.ok() && run_id.has_value()) {
      absl::StatusOr<std::string> id = CheckpointRunId(it->second);
      if (!id.ok() || *id != *run_id) continue;  // another run's
    }
    if (info.ok()) return it->second;
    skipped->push_back(absl::StrCat(it->second, ": ", info.status().message()));
  }
  if (all->empty()) return Latest().status();  // NotFound naming the pattern
  if (skipped->empty()) {  // other runs' checkpoints only
    return absl::NotFoundError(
        absl::StrCat("no checkpoint of run ", *run_id, " under '", dir_or_prefix, "'"));
  }
  return absl::NotFoundError(absl::StrCat("no complete checkpoint under '", dir_or_prefix,
                                          "': ", absl::StrJoin(*skipped, "; ")));
}

absl::StatusOr<std::vector<std::string>> CheckpointRotation::RemoveStaleTemporaries() const {
  if (absl::Status s = Validate(); !s.ok()) return s;
  auto [dir, prefix] = Split(dir_or_prefix);
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return std::vector<std::string>{};  // nothing saved there yet
  std::vector<std::string> removed;
  const std::string head = prefix + ".step", tmp_tag = std::string(kSuffix) + ".tmp.";
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    const size_t tag = name.rfind(tmp_tag);
    if (!absl::StartsWith(name, head) || tag == std::string::npos) continue;
    int64_t pid = 0;
    if (!absl::SimpleAtoi(name.substr(tag + tmp_tag.size()), &pid) || pid <= 0) continue;
    // Alive (or not ours to signal): another process may be writing it right now.
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    const std::string path = Join(dir, name);
    if (std::remove(path.c_str()) == 0) removed.push_back(path);
  }
  ::closedir(d);
  std::sort(removed.begin(), removed.end());
  return removed;
}

absl::StatusOr<std::map<std::string, std::vector<std::pair<int64_t, std::string>>>>
CheckpointRotation::ListRuns(std::vector<std::string>* unreadable) const {
  absl::StatusOr<std::vector<std::pair<int64_t, std::string>>> all = List();
  if (!all.ok()) return all.status();
  std::map<std::string, std::vector<std::pair<int64_t, std::string>>> runs;
  for (const auto& e : *all) {
    absl::StatusOr<std::string> id = CheckpointRunId(e.second);
    if (id.ok()) {
      runs[*id].push_back(e);
    } else {
      unreadable->push_back(e.second);
    }
  }
  return runs;
}

absl::StatusOr<std::string> CheckpointRunId(const std::string& path) {
  absl::StatusOr<SafetensorsFile> f = SafetensorsFile::Open(path);
  if (!f.ok()) return f.status();
  auto it = f->metadata().find("run.id");
  return it == f->metadata().end() ? std::string() : it->second;
}

namespace {

const std::string kFix =
    "; the checkpoint was not written with its model configuration (or was edited): give the "
    "shape flags (--layers, --d_model, --heads, --vocab, --seq) explicitly";

absl::StatusOr<std::string> Get(const std::map<std::string, std::string>& m,
                                const std::string& key) {
  auto it = m.find(key);
  if (it == m.end()) return absl::NotFoundError(absl::StrCat("metadata lacks '", key, "'", kFix));
  return it->second;
}

absl::Status ReadInt(const std::map<std::string, std::string>& m, const std::string& key,
                     int64_t min, int64_t* out) {
  absl::StatusOr<std::string> v = Get(m, key);
  if (!v.ok()) return v.status();
  if (!absl::SimpleAtoi(*v, out)) {
    return Invalid(absl::StrCat("metadata '", key, "' = '", *v, "' is not an integer", kFix));
  }
  if (*out < min) {
    return Invalid(absl::StrCat("metadata '", key, "' = ", *out, " must be >= ", min, kFix));
  }
  return absl::OkStatus();
}

absl::Status ReadDouble(const std::map<std::string, std::string>& m, const std::string& key,
                        double* out) {
  absl::StatusOr<std::string> v = Get(m, key);
  if (!v.ok()) return v.status();
  if (!absl::SimpleAtod(*v, out) || !std::isfinite(*out)) {
    return Invalid(absl::StrCat("metadata '", key, "' = '", *v, "' is not a finite number",
                                kFix));
  }
  return absl::OkStatus();
}

absl::StatusOr<DType> ReadDType(const std::string& key, const std::string& v) {
  for (DType t : kDTypes) {
    if (v == DTypeName(t)) return t;
  }
  return Invalid(absl::StrCat("metadata '", key, "' = '", v,
                              "' is not a floating dtype (f32, f64, bf16, f16)", kFix));
}

}  // namespace

absl::StatusOr<GptConfig> GptConfigFromMetadata(const std::map<std::string, std::string>& m) {
  GptConfig c;
  for (auto [key, field] : {std::pair<const char*, int64_t*>{"gpt.layers", &c.layers},
                            {"gpt.d_model", &c.d_model},
                            {"gpt.heads", &c.heads},
                            {"gpt.vocab", &c.vocab},
                            {"gpt.seq", &c.seq}}) {
    if (absl::Status s = ReadInt(m, key, 1, field); !s.ok()) return s;
  }
  if (c.d_model % c.heads != 0) {
    return Invalid(absl::StrCat("metadata: d_model ", c.d_model, " is not divisible by heads ",
                                c.heads, kFix));
  }
  absl::StatusOr<std::string> dtype = Get(m, "gpt.dtype");
  if (!dtype.ok()) return dtype.status();
  absl::StatusOr<DType> dt = ReadDType("gpt.dtype", *dtype);
  if (!dt.ok()) return dt.status();
  c.dtype = *dt;
  if (auto it = m.find("gpt.compute"); it != m.end()) {
    absl::StatusOr<DType> ct = ReadDType("gpt.compute", it->second);
    if (!ct.ok()) return ct.status();
    c.compute = *ct;
  }
  if (absl::Status s = ReadInt(m, "gpt.moe.experts", 0, &c.moe.experts); !s.ok()) return s;
  if (absl::Status s = ReadInt(m, "gpt.moe.topk", 0, &c.moe.topk); !s.ok()) return s;
  if (absl::Status s = ReadDouble(m, "gpt.moe.capacity_factor", &c.moe.capacity_factor);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = ReadDouble(m, "gpt.moe.aux_loss_coef", &c.moe.aux_loss_coef); !s.ok()) {
    return s;
  }
  absl::StatusOr<std::string> axes = Get(m, "gpt.moe.expert_axes");
  if (!axes.ok()) return axes.status();
  c.moe.expert_axes = absl::StrSplit(*axes, ',', absl::SkipEmpty());
  if (absl::Status s = ValidateMoeConfig(c.moe, 1); !s.ok()) {
    return Invalid(absl::StrCat("metadata: ", s.message(), kFix));
  }
  return c;
}

absl::StatusOr<int64_t> StepFromMetadata(const std::map<std::string, std::string>& m) {
  auto it = m.find("step");
  if (it == m.end()) {
    return absl::NotFoundError(
        "metadata lacks 'step': the file holds parameters only (e.g. written by --save without "
        "training state); use it with --init, not --resume");
  }
  int64_t step = 0;
  if (!absl::SimpleAtoi(it->second, &step)) {
    return Invalid(absl::StrCat("metadata 'step' = '", it->second,
                                "' is not an integer; the file is corrupt or was edited"));
  }
  if (step < 0 || step > kMaxStep) {
    return Invalid(absl::StrCat("metadata 'step' = ", step,
                                " is outside [0, 2^53]; the file is corrupt or was edited"));
  }
  return step;
}

absl::Status SaveGptWithConfig(const std::string& path, const Model& layout,
                               const std::vector<NamedTensor>& params, const AdamState* moments,
                               int64_t step, const std::map<std::string, std::string>& extra) {
  if (step < 0 || step > kMaxStep) {
    return Invalid(absl::StrCat("checkpoint step ", step, " is outside [0, 2^53]"));
  }
  absl::StatusOr<std::vector<NamedTensor>> out = CheckpointTensors(layout, params, moments);
  if (!out.ok()) {
    return Invalid(absl::StrCat("saving '", path, "': ", out.status().message()));
  }
  std::map<std::string, std::string> meta = extra;
  meta.merge(layout.ShapeMetadata());
  meta["format"] = "pt";
  meta["step"] = absl::StrCat(step);
  return WriteSafetensors(path, *out, meta);
}

absl::StatusOr<GptCheckpointInfo> ReadGptCheckpointInfo(const std::string& path) {
  absl::StatusOr<SafetensorsFile> f = SafetensorsFile::Open(path);
  if (!f.ok()) return f.status();
  auto prefixed = [&](const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat("checkpoint '", path, "': ", s.message()));
  };
  GptCheckpointInfo info;
  absl::StatusOr<GptConfig> c = GptConfigFromMetadata(f->metadata());
  if (!c.ok()) return prefixed(c.status());
  info.config = *c;
  absl::StatusOr<int64_t> step = StepFromMetadata(f->metadata());
  if (!step.ok()) return prefixed(step.status());
  info.step = *step;
  return info;
}

}  // namespace shardmap
