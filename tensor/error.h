// The one typed error that ops throw inside per-device code; public boundaries (shard_map,
// value_and_grad, ...) catch it and return its Status.
//
//   throw OpError(absl::InvalidArgumentError("matmul: inner dims differ: f32[2,3] @ f32[4,5]"));
//   absl::Status s = CatchOpError([&] { Matmul(a, b); });   // InvalidArgument, message kept
#ifndef SHARDMAP_TENSOR_ERROR_H_
#define SHARDMAP_TENSOR_ERROR_H_

#include <exception>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace shardmap {

class OpError : public std::exception {
 public:
  explicit OpError(absl::Status status)
      : status_(std::move(status)), what_(status_.ToString()) {}
  const absl::Status& status() const { return status_; }
  const char* what() const noexcept override { return what_.c_str(); }

 private:
  absl::Status status_;
  std::string what_;
};

// Throws OpError(InvalidArgument) built from the pieces: OpFail("matmul: ", "inner dims ...").
template <typename... Args>
[[noreturn]] void OpFail(const Args&... args) {
  throw OpError(absl::InvalidArgumentError(absl::StrCat(args...)));
}

// Runs fn; returns OkStatus, the Status of an OpError it threw, or Internal for any other
// exception (so no per-device failure escapes a public boundary as an exception).
template <typename Fn>
absl::Status CatchOpError(Fn&& fn) {
  try {
    fn();
    return absl::OkStatus();
  } catch (const OpError& e) {
    return e.status();
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("unexpected exception: ", e.what()));
  }
}

}  // namespace shardmap

#endif  // SHARDMAP_TENSOR_ERROR_H_
