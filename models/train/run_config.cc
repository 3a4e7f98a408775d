#include "models/train/run_config.h"

#include <sys/stat.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "models/components/bounded_read.h"

namespace shardmap {
namespace {

constexpr uint64_t kFnvPrime = 0x100000001b3ull;
constexpr char kFlagPrefix[] = "run.flag.";

uint64_t Fmix64(uint64_t k) {  // MurmurHash3's finaliser
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdull;
  k ^= k >> 33;
  k *= 0xc4ceb9fe1a85ec53ull;
  k ^= k >> 33;
  return k;
}

uint64_t LoadLe64(const unsigned char* p) {
  uint64_t w;
  std::memcpy(&w, p, 8);
  if constexpr (std::endian::native == std::endian::big) w = __builtin_bswap64(w);
  return w;
}

// Calls `chunk` with the file's bytes, 1 MiB at a time.
absl::Status ReadFile(const std::string& path, const std::function<void(absl::string_view)>& chunk,
                      int64_t* bytes) {
  // A regular file only (a FIFO or device is refused at once), read up to its size at open
  // time: a file that grows meanwhile is hashed as it was.
  absl::StatusOr<BoundedFile> f = OpenBoundedFile(path, int64_t{1} << 50, "file");
  if (absl::IsNotFound(f.status())) {
    return absl::NotFoundError(absl::StrCat("'", path, "': ", std::strerror(ENOENT)));
  }
  if (!f.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("'", path, "' is not a regular file (",
                                                      f.status().message(), ")"));
  }
  std::vector<char> buf(1 << 20);
  *bytes = 0;
  while (*bytes < f->size()) {
    const int64_t n = std::min<int64_t>(static_cast<int64_t>(buf.size()), f->size() - *bytes);
    if (!f->ReadAt(buf.data(), n, *bytes)) {
      return absl::DataLossError(absl::StrCat("reading '", path, "' failed"));
    }
    chunk(absl::string_view(buf.data(), static_cast<size_t>(n)));
    *bytes += n;
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> ParseHex(const std::string& key, const std::string& v) {
  uint64_t h = 0;
  if (v.size() != 16 || !absl::SimpleHexAtoi(v, &h)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metadata '", key, "' = '", v, "' is not 16 hex digits; the file is damaged or edited"));
  }
  return h;
}

}  // namespace

const std::vector<RunSetting>& RunSettings() {
  static const auto* settings = new std::vector<RunSetting>{
      {"batch", OnResume::kAdopt},        {"grad_accum", OnResume::kAdopt},
      {"steps", OnResume::kAdopt},        {"lr", OnResume::kAdopt},
      {"beta1", OnResume::kAdopt},        {"beta2", OnResume::kAdopt},
      {"eps", OnResume::kAdopt},          {"weight_decay", OnResume::kAdopt},
      {"clip", OnResume::kAdopt},         {"lr_schedule", OnResume::kAdopt},
      {"min_lr", OnResume::kAdopt},       {"warmup_steps", OnResume::kAdopt},
      {"decay_steps", OnResume::kAdopt},  {"data_order", OnResume::kAdopt},
      {"mesh", OnResume::kAdopt},         {"sp", OnResume::kAdopt},
      {"microbatches", OnResume::kAdopt}, {"schedule", OnResume::kAdopt},
      {"stage_layers", OnResume::kAdopt}, {"virtual_stages", OnResume::kAdopt},
      {"eval_every", OnResume::kAdopt},   {"eval_steps", OnResume::kAdopt},
      {"val_data", OnResume::kAdopt},     {"tokenizer", OnResume::kAdopt},
      {"text", OnResume::kAdopt, "data"}, {"data", OnResume::kAdopt, "data"},
      {"val_fraction", OnResume::kRefuse}, {"seed", OnResume::kRefuseUnderRandomOrder},
  };
  return *settings;
}

void ContentHasher::Update(absl::string_view bytes) {
  length_ += bytes.size();
  const unsigned char* p = reinterpret_cast<const unsigned char*>(bytes.data());
  size_t n = bytes.size();
  while (npending_ > 0 && npending_ < 8 && n > 0) {
    pending_[npending_++] = *p++;
    --n;
  }
  if (npending_ == 8) {
    Word(LoadLe64(pending_));
    npending_ = 0;
  }
  for (; n >= 8 && words_ % 4 != 0; p += 8, n -= 8) Word(LoadLe64(p));
  if (n >= 32) {  // whole blocks of four words, the lanes in registers
    uint64_t a = lanes_[0], b = lanes_[1], c = lanes_[2], d = lanes_[3];
    const uint64_t blocks = n / 32;
    for (uint64_t i = 0; i < blocks; ++i, p += 32) {
      a = (a ^ LoadLe64(p)) * kFnvPrime;
      b = (b ^ LoadLe64(p + 8)) * kFnvPrime;
      c = (c ^ LoadLe64(p + 16)) * kFnvPrime;
      d = (d ^ LoadLe64(p + 24)) * kFnvPrime;
    }
    lanes_[0] = a, lanes_[1] = b, lanes_[2] = c, lanes_[3] = d;
    words_ += 4 * blocks;
    n -= 32 * blocks;
  }
  for (; n >= 8; p += 8, n -= 8) Word(LoadLe64(p));
  for (; n > 0; --n) pending_[npending_++] = *p++;
}

uint64_t ContentHasher::Finish() const {
  ContentHasher last = *this;
  if (npending_ > 0) {
    unsigned char word[8] = {};
    std::memcpy(word, pending_, npending_);
    last.Word(LoadLe64(word));
  }
  auto rotl = [](uint64_t x, int r) { return (x << r) | (x >> (64 - r)); };
  return Fmix64(last.lanes_[0] ^ rotl(last.lanes_[1], 16) ^ rotl(last.lanes_[2], 32) ^
                rotl(last.lanes_[3], 48) ^ length_);
}

uint64_t HashContent(absl::string_view bytes) {
  ContentHasher h;
  h.Update(bytes);
  return h.Finish();
}

absl::StatusOr<FileIdentity> IdentifyFile(const std::string& path) {
  ContentHasher h;
  FileIdentity id{path};
  if (absl::Status s = ReadFile(path, [&](absl::string_view c) { h.Update(c); }, &id.bytes);
      !s.ok()) {
    return s;
  }
  id.hash = h.Finish();
  return id;
}

absl::StatusOr<uint64_t> HashFiles(const std::vector<std::string>& paths) {
  uint64_t h = 0;
  for (const std::string& p : paths) {
    absl::StatusOr<FileIdentity> id = IdentifyFile(p);
    if (!id.ok()) return id.status();
    h = Fmix64(h ^ id->hash) * kFnvPrime;
  }
  return h;
}

std::string HashHex(uint64_t hash) { return absl::StrFormat("%016x", hash); }

std::string NewRunId() {
  uint64_t id = 0;
  std::FILE* f = std::fopen("/dev/urandom", "rb");
  const bool read = f != nullptr && std::fread(&id, sizeof(id), 1, f) == 1;
  if (f != nullptr) std::fclose(f);
  if (!read) {
    std::random_device rd;
    id = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }
  return HashHex(id);
}

std::map<std::string, std::string> RunConfigMetadata(const RunConfig& run) {
  std::map<std::string, std::string> m = {{"run.id", run.id}};
  for (const auto& [name, value] : run.flags) m[kFlagPrefix + name] = value;
  if (run.data.has_value()) {
    m["run.data.path"] = run.data->path;
    m["run.data.bytes"] = absl::StrCat(run.data->bytes);
    m["run.data.hash"] = HashHex(run.data->hash);
  }
  if (run.tokenizer_hash.has_value()) m["run.tokenizer.hash"] = HashHex(*run.tokenizer_hash);
  return m;
}

absl::StatusOr<RunConfig> RunConfigFromMetadata(const std::map<std::string, std::string>& m) {
  RunConfig run;
  bool any = false;
  for (const auto& [key, value] : m) {
    if (!absl::StartsWith(key, "run.")) continue;
    any = true;
    if (absl::StartsWith(key, kFlagPrefix)) run.flags[key.substr(sizeof(kFlagPrefix) - 1)] = value;
  }
  if (!any) {
    return absl::NotFoundError(
        "no run configuration in the metadata (written before run configurations were stored)");
  }
  if (auto it = m.find("run.id"); it != m.end()) run.id = it->second;
  if (auto it = m.find("run.data.hash"); it != m.end()) {
    absl::StatusOr<uint64_t> h = ParseHex(it->first, it->second);
    if (!h.ok()) return h.status();
    FileIdentity d;
    d.hash = *h;
    if (auto p = m.find("run.data.path"); p != m.end()) d.path = p->second;
    if (auto b = m.find("run.data.bytes"); b != m.end() &&
                                           (!absl::SimpleAtoi(b->second, &d.bytes) || d.bytes < 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "metadata 'run.data.bytes' = '", b->second, "' is not a byte count; the file is "
          "damaged or edited"));
    }
    run.data = d;
  }
  if (auto it = m.find("run.tokenizer.hash"); it != m.end()) {
    absl::StatusOr<uint64_t> h = ParseHex(it->first, it->second);
    if (!h.ok()) return h.status();
    run.tokenizer_hash = *h;
  }
  return run;
}

absl::StatusOr<Reconciled> ReconcileRunConfig(const RunConfig& saved,
                                              const std::map<std::string, std::string>& now,
                                              const std::set<std::string>& given,
                                              const std::string& checkpoint) {
  Reconciled out;
  auto value = [](const std::map<std::string, std::string>& m, const std::string& k) {
    auto it = m.find(k);
    return it == m.end() ? std::string() : it->second;
  };
  const bool random_order = value(saved.flags, "data_order") == "random";
  std::set<std::string> groups_given;
  for (const RunSetting& s : RunSettings()) {
    if (s.group != nullptr && given.count(s.flag)) groups_given.insert(s.group);
  }
  for (const RunSetting& s : RunSettings()) {
    auto it = saved.flags.find(s.flag);
    if (it == saved.flags.end()) continue;  // a file from before this setting was stored
    const std::string& was = it->second;
    const bool is_given = s.group != nullptr ? groups_given.count(s.group) > 0
                                             : given.count(s.flag) > 0;
    if (!is_given) {
      if (value(now, s.flag) != was) out.adopt[s.flag] = was;
      continue;
    }
    if (!given.count(s.flag) || value(now, s.flag) == was) continue;
    const std::string is = value(now, s.flag);
    const bool refuse = s.on_resume == OnResume::kRefuse ||
                        (s.on_resume == OnResume::kRefuseUnderRandomOrder && random_order);
    if (refuse) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--", s.flag, "=", is, " but the run in '", checkpoint, "' has ", s.flag, " '", was,
          "'",
          s.on_resume == OnResume::kRefuse
              ? " (it decides which tokens are trained on)"
              : " (its batches are drawn in random order from that seed)",
          ", which cannot change mid-run: drop --", s.flag,
          " to continue the run, or start a new run from these weights with --init=", checkpoint));
    }
    out.notes.push_back(absl::StrCat("note: --", s.flag, "=", is, " changes the run's ", s.flag,
                                     " '", was, "' (", checkpoint, ")"));
  }
  return out;
}

absl::Status CheckSameData(const RunConfig& saved, const std::optional<FileIdentity>& data,
                           const std::optional<uint64_t>& tokenizer_hash,
                           const std::string& checkpoint, std::vector<std::string>* notes) {
  if (saved.data.has_value() && data.has_value()) {
    const FileIdentity& was = *saved.data;
    if (was.hash != data->hash || was.bytes != data->bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the training data '", data->path, "' (", data->bytes, " bytes, hash ",
          HashHex(data->hash), ") is not the run's: '", checkpoint, "' was trained on '",
          was.path, "' (", was.bytes, " bytes, hash ", HashHex(was.hash),
          "); give that file to continue the run, or start a new run from these weights with "
          "--init=", checkpoint));
    }
    if (was.path != data->path) {
      notes->push_back(absl::StrCat("note: the training data '", data->path,
                                    "' has the content of the run's '", was.path, "'"));
    }
  }
  if (saved.tokenizer_hash.has_value() != tokenizer_hash.has_value() ||
      (tokenizer_hash.has_value() && *saved.tokenizer_hash != *tokenizer_hash)) {
    if (saved.flags.count("tokenizer") == 0 && !saved.tokenizer_hash.has_value()) {
      return absl::OkStatus();  // a file from before tokenizers were stored
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "the tokenizer (", tokenizer_hash.has_value() ? HashHex(*tokenizer_hash) : "none",
        ") is not the run's (",
        saved.tokenizer_hash.has_value() ? HashHex(*saved.tokenizer_hash) : "none",
        "): the token ids would mean other text; give the run's --tokenizer (or none), or "
        "start a new run from these weights with --init=", checkpoint));
  }
  return absl::OkStatus();
}

}  // namespace shardmap
