#include "spmd_testing/rejection.h"

#include <chrono>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tensor/error.h"

namespace shardmap::spmd_testing {
namespace {

// Shared by the caller and the program's thread, which may outlive the caller on a timeout.
struct Outcome {
  std::mutex mu;
  std::condition_variable done_cv;
  bool done = false;
  absl::Status status;
};

absl::Status RunCatching(const std::function<absl::Status()>& program) {
  try {
    return program();
  } catch (const OpError& e) {
    return e.status();
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("exception: ", e.what()));
  }
}

}  // namespace

::testing::AssertionResult RejectedWithStatus(std::function<absl::Status()> program,
                                              const std::vector<std::string>& fragments,
                                              absl::Duration timeout) {
  auto outcome = std::make_shared<Outcome>();
  std::thread worker([outcome, program = std::move(program)] {
    absl::Status s = RunCatching(program);
    std::lock_guard<std::mutex> lock(outcome->mu);
    outcome->status = std::move(s);
    outcome->done = true;
    outcome->done_cv.notify_all();
  });
  absl::Status status;
  {
    std::unique_lock<std::mutex> lock(outcome->mu);
    const bool finished = outcome->done_cv.wait_for(
        lock, absl::ToChronoMilliseconds(timeout), [&] { return outcome->done; });
    if (!finished) {
      lock.unlock();
      worker.detach();
      return ::testing::AssertionFailure()
             << "still running after " << absl::FormatDuration(timeout)
             << " (a hang?); expected a rejection containing '"
             << absl::StrJoin(fragments, "', '") << "'";
    }
    status = outcome->status;
  }
  worker.join();
  if (status.ok()) {
    return ::testing::AssertionFailure() << "accepted (OK); expected a rejection containing '"
                                         << absl::StrJoin(fragments, "', '") << "'";
  }
  const std::string message = status.ToString();
  for (const std::string& f : fragments) {
    if (message.find(f) == std::string::npos) {
      return ::testing::AssertionFailure()
             << "rejected, but the message lacks '" << f << "': " << message;
    }
  }
  return ::testing::AssertionSuccess() << "rejected: " << message;
}

}  // namespace shardmap::spmd_testing
