// A training run's whole configuration in its checkpoints' metadata, so that a resume continues
// the run that wrote the file: the settings a command line does not give come from the file;
// a setting it changes is named (one note each); a setting that cannot change mid-run (the
// training data's content, the held-out split, the seed of a random batch order, the tokenizer)
// is refused. The model's shape and dtype ride along as gpt.* keys (checkpoint_rotation.h).
//
//   RunConfig now = ...;  // this command line's values of RunSettings(), the data, the run id
//   std::map<std::string, std::string> meta = RunConfigMetadata(now);   // into the checkpoint
//   absl::StatusOr<RunConfig> saved = RunConfigFromMetadata(file.metadata());
//   absl::StatusOr<Reconciled> r = ReconcileRunConfig(*saved, now.flags, given, "ck.safetensors");
//   // r->adopt: {"batch": "4", ...} for the flags not given; r->notes: "note: --lr=0.02 ...".
//   absl::Status same = CheckSameData(*saved, *IdentifyFile("train.bin"), "ck.safetensors");
//
// Metadata keys (strings): "run.id" (16 hex digits, made at a fresh start and kept by every
// resume), "run.flag.<name>" for each setting of RunSettings() (the flag's value as absl prints
// it), "run.data.path", "run.data.bytes", "run.data.hash" (HashFileContent, 16 hex digits) of the
// training data file, "run.tokenizer.hash" (the tokenizer's two files hashed in turn; absent
// without one).
//
// The content hash (HashContent): the data as little-endian 64-bit words (the last one
// zero-padded); word j goes into lane j mod 4 (lane i starts at FNV-1a's offset basis + i) as
// lane = (lane ^ word) * FNV-1a's 64-bit prime; the result is MurmurHash3's fmix64 of
// lane0 ^ rotl(lane1, 16) ^ rotl(lane2, 32) ^ rotl(lane3, 48) ^ the byte length. Four lanes keep
// four multiplies in flight: 4.5-5 GB/s in memory, 1.6 GB/s reading a cached file (IdentifyFile)
// on this CPU (-O2). Not cryptographic: it tells a changed or
// different file from the same one.
#ifndef SHARDMAP_MODELS_TRAIN_RUN_CONFIG_H_
#define SHARDMAP_MODELS_TRAIN_RUN_CONFIG_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace shardmap {

// How a setting may differ on a resume from the run's value.
enum class OnResume {
  kAdopt,                   // not given: the run's value; given and different: a note
  kRefuse,                  // given and different: refused
  kRefuseUnderRandomOrder,  // refused when the run reads its batches in random order
};
struct RunSetting {
  const char* flag;
  OnResume on_resume;
  const char* group = nullptr;  // settings of one group are adopted together or not at all
};
// The settings stored and reconciled (train_gpt's flag names).
const std::vector<RunSetting>& RunSettings();

// A file's identity: its path, size and HashFileContent.
struct FileIdentity {
  std::string path;
  int64_t bytes = 0;
  uint64_t hash = 0;
};

// Streaming HashContent (see the header comment).
class ContentHasher {
 public:
  void Update(absl::string_view bytes);
  uint64_t Finish() const;

 private:
  void Word(uint64_t w) {  // word n goes to lane n % 4
    lanes_[words_ % 4] = (lanes_[words_ % 4] ^ w) * 0x100000001b3ull;
    ++words_;
  }

  // FNV-1a's offset basis + the lane's index.
  uint64_t lanes_[4] = {0xcbf29ce484222325ull, 0xcbf29ce484222326ull, 0xcbf29ce484222327ull,
                        0xcbf29ce484222328ull};
  uint64_t words_ = 0;
  uint64_t length_ = 0;
  unsigned char pending_[8] = {};
  int npending_ = 0;
};
uint64_t HashContent(absl::string_view bytes);
// Reads the whole file. NotFound / FailedPrecondition naming the path.
absl::StatusOr<FileIdentity> IdentifyFile(const std::string& path);
// The files hashed one after the other (each one's length mixed in), e.g. a tokenizer's two.
absl::StatusOr<uint64_t> HashFiles(const std::vector<std::string>& paths);
std::string HashHex(uint64_t hash);

struct RunConfig {
  std::string id;                            // "" in files written before run ids
  std::map<std::string, std::string> flags;  // setting -> value
  std::optional<FileIdentity> data;          // the training data file
  std::optional<uint64_t> tokenizer_hash;
};

// A new run id: 16 hex digits from /dev/urandom (std::random_device if it cannot be read).
std::string NewRunId();

std::map<std::string, std::string> RunConfigMetadata(const RunConfig& run);
// NotFound when the metadata holds no run.* key (a file written before run configurations, or
// by another program); InvalidArgument naming a damaged key.
absl::StatusOr<RunConfig> RunConfigFromMetadata(const std::map<std::string, std::string>& m);

struct Reconciled {
  std::map<std::string, std::string> adopt;  // flags not given: the run's values
  std::vector<std::string> notes;            // one line per value the command line changes
};
// `now`: this command line's value of every setting; `given`: the settings on the command
// line. Settings the file lacks are left as they are. InvalidArgument naming the flag, both
// values and the way out for a setting that cannot change.
absl::StatusOr<Reconciled> ReconcileRunConfig(const RunConfig& saved,
                                              const std::map<std::string, std::string>& now,
                                              const std::set<std::string>& given,
                                              const std::string& checkpoint);

// The training data and the tokenizer against the run's: a different content is refused
// (InvalidArgument: to train these weights on other data start a new run with --init); the
// same content under another path adds a note. Nothing to compare when the file has none.
absl::Status CheckSameData(const RunConfig& saved, const std::optional<FileIdentity>& data,
                           const std::optional<uint64_t>& tokenizer_hash,
                           const std::string& checkpoint, std::vector<std::string>* notes);

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_TRAIN_RUN_CONFIG_H_
