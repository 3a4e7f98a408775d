#include "models/data/text_tokenizer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "models/data/bpe_tokenizer.h"
#include "models/data/tiktoken_tokenizer.h"

namespace shardmap {
namespace {

class Gpt2Text : public TextTokenizer {
 public:
  explicit Gpt2Text(BpeTokenizer t) : t_(std::move(t)) {}
  std::vector<int32_t> Encode(absl::string_view text) const override { return t_.Encode(text); }
  absl::StatusOr<std::string> Decode(absl::Span<const int64_t> ids) const override {
    return t_.Decode(ids);
  }
  int64_t vocab_size() const override { return t_.vocab_size(); }
  std::string kind() const override { return "GPT-2 BPE"; }

 private:
  BpeTokenizer t_;
};

class Llama3Text : public TextTokenizer {
 public:
  explicit Llama3Text(TiktokenTokenizer t) : t_(std::move(t)) {}
  std::vector<int32_t> Encode(absl::string_view text) const override { return t_.Encode(text); }
  absl::StatusOr<std::string> Decode(absl::Span<const int64_t> ids) const override {
    return t_.Decode(ids);
  }
  int64_t vocab_size() const override { return t_.vocab_size(); }
  std::string kind() const override { return "Llama 3 (tiktoken)"; }

 private:
  TiktokenTokenizer t_;
};

bool IsFile(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// The first bytes of a regular file (at most 4 KiB).
absl::StatusOr<std::string> Head(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(
        absl::StrCat("tokenizer '", path, "': cannot open: ", std::strerror(errno)));
  }
  std::string head(4096, '\0');
  const ssize_t n = ::read(fd, head.data(), head.size());
  ::close(fd);
  if (n < 0) return absl::NotFoundError(absl::StrCat("tokenizer '", path, "': cannot read"));
  head.resize(static_cast<size_t>(n));
  return head;
}

// Why a file that is not tiktoken's is not accepted, with what it looks like.
absl::Status NotATokenizerFile(const std::string& path, absl::string_view head) {
  std::string looks;
  if (!head.empty() && head[0] == '{') {
    looks = "it looks like JSON (encoder.json or vocab.json?): give the folder that holds it and "
            "its merges file";
  } else if (absl::StartsWith(head, "#version")) {
    looks = "it looks like GPT-2's vocab.bpe: give the folder that holds it and encoder.json";
  } else if (!head.empty() && head[0] == '\x0a') {
    looks = "it looks like a SentencePiece model (Llama 1 and 2's tokenizer.model), which is not "
            "supported";
  } else if (head.empty()) {
    looks = "it is empty";
  } else {
    looks = "its first line is not \"BASE64 RANK\"";
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "tokenizer '", path, "' is neither a tiktoken tokenizer.model (Llama 3's: lines \"BASE64 "
      "RANK\") nor a folder with GPT-2's encoder.json + vocab.bpe (or Hugging Face's vocab.json + "
      "merges.txt): ", looks));
}

}  // namespace

absl::StatusOr<std::vector<std::string>> TextTokenizerFiles(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(
        absl::StrCat("tokenizer '", path, "': ", std::strerror(errno),
                     "; give Llama 3's tokenizer.model or a folder with GPT-2's encoder.json and "
                     "vocab.bpe"));
  }
  if (S_ISREG(st.st_mode)) {
    absl::StatusOr<std::string> head = Head(path);
    if (!head.ok()) return head.status();
    if (!LooksLikeTiktoken(*head)) return NotATokenizerFile(path, *head);
    return std::vector<std::string>{path};
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tokenizer '", path, "' is neither a regular file nor a folder"));
  }
  const std::string dir = absl::StrCat(path, "/");
  if (IsFile(dir + "encoder.json") && IsFile(dir + "vocab.bpe")) {
    return std::vector<std::string>{dir + "encoder.json", dir + "vocab.bpe"};
  }
  if (IsFile(dir + "vocab.json") && IsFile(dir + "merges.txt")) {
    return std::vector<std::string>{dir + "vocab.json", dir + "merges.txt"};
  }
  if (IsFile(dir + "tokenizer.model")) return TextTokenizerFiles(dir + "tokenizer.model");
  return absl::NotFoundError(absl::StrCat(
      "tokenizer '", path, "': needs encoder.json and vocab.bpe (GPT-2's files) or vocab.json "
      "and merges.txt (Hugging Face's) or tokenizer.model (Llama 3's) in that folder"));
}

absl::StatusOr<std::unique_ptr<TextTokenizer>> LoadTextTokenizer(const std::string& path) {
  absl::StatusOr<std::vector<std::string>> files = TextTokenizerFiles(path);
  if (!files.ok()) return files.status();
  if (files->size() == 1) {
    absl::StatusOr<TiktokenTokenizer> t = TiktokenTokenizer::Load(files->front());
    if (!t.ok()) return t.status();
    return std::make_unique<Llama3Text>(*std::move(t));
  }
  absl::StatusOr<BpeTokenizer> t = BpeTokenizer::Load((*files)[0], (*files)[1]);
  if (!t.ok()) return t.status();
  return std::make_unique<Gpt2Text>(*std::move(t));
}

}  // namespace shardmap
