#include "collectives/async_lane.h"

#include <algorithm>
#include <exception>
#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"

namespace shardmap::collectives {
namespace {

struct LaneCall {
  std::string what;
  CallTag tag;
  AsyncLane::Call call;
  bool done = false;   // guarded by State::mu
  absl::Status status;  // guarded by State::mu, set with done
};

}  // namespace

struct AsyncLane::State {
  std::string name;
  std::function<void(const absl::Status&)> report_misuse;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::shared_ptr<LaneCall>> queue;  // guarded by mu
  bool stop = false;                            // guarded by mu
  absl::Status failure;                         // guarded by mu: the lane's first failure
  std::string failed_call;                      // guarded by mu: the call that failed first

  // `what` refused because of the lane's first failure (mu held).
  absl::Status Refusal(const std::string& what) const {
    return absl::Status(failure.code(),
                        absl::StrCat(what, " refused: an earlier started call on '", name,
                                     "' failed (", failed_call, "): ", failure.message()));
  }
  void Fail(const absl::Status& s, const std::string& what) {  // mu held
    if (failure.ok()) {
      failure = s;
      failed_call = what;
    }
  }
};

namespace {

class LaneHandle final : public PendingCollective {
 public:
  LaneHandle(std::shared_ptr<AsyncLane::State> state, std::shared_ptr<LaneCall> call)
      : state_(std::move(state)), call_(std::move(call)), exceptions_(std::uncaught_exceptions()) {}

  ~LaneHandle() override {
    if (waited_) return;
    const bool unwinding = std::uncaught_exceptions() > exceptions_;
    const absl::Status misuse =
        unwinding
            ? absl::AbortedError(absl::StrCat(
                  call_->what, ": abandoned without Wait() while an exception unwound the "
                  "caller's stack (the exception is the error to look at)"))
            : absl::FailedPreconditionError(absl::StrCat(
                  call_->what, ": started but never waited; call Wait() on every started "
                  "collective before its handle goes out of scope"));
    {
      std::lock_guard<std::mutex> l(state_->mu);
      state_->Fail(misuse, call_->what);
      state_->cv.notify_all();
    }
    if (state_->report_misuse) state_->report_misuse(misuse);
    (void)Await();  // the buffers are the caller's again only once the call is over
  }

  absl::Status Wait() override {
    if (waited_) {
      return absl::FailedPreconditionError(
          absl::StrCat(call_->what, ": Wait() called twice; wait each started call exactly once"));
    }
    waited_ = true;
    return Await();
  }

 private:
  absl::Status Await() {
    std::unique_lock<std::mutex> l(state_->mu);
    state_->cv.wait(l, [&] { return call_->done; });
    return call_->status;
  }

  const std::shared_ptr<AsyncLane::State> state_;
  const std::shared_ptr<LaneCall> call_;
  const int exceptions_;
  bool waited_ = false;
};

}  // namespace

bool IsTagged(const CallTag& tag) {
  return tag.describe != nullptr ||
         std::any_of(std::begin(tag.words), std::end(tag.words), [](uint64_t w) { return w != 0; });
}

std::string StartedCallName(const char* op, DataType dtype, const ReduceOp* reduce, size_t count,
                            const std::string& group) {
  std::string s = absl::StrCat(op, "(", IsValidDataType(dtype) ? DataTypeName(dtype) : "invalid dtype");
  if (reduce != nullptr) {
    absl::StrAppend(&s, ", ", IsValidReduceOp(*reduce) ? ReduceOpName(*reduce) : "invalid op");
  }
  absl::StrAppend(&s, ", count=", count, ") on '", group, "'");
  return s;
}

AsyncLane::AsyncLane(std::unique_ptr<Communicator> dup, LaneOptions options)
    : state_(std::make_shared<State>()),
      dup_(std::move(dup)),
      dup_name_(dup_ == nullptr ? std::string() : dup_->name()) {
  state_->name = std::move(options.name);
  state_->report_misuse = std::move(options.report_misuse);
  thread_ = std::thread([this] { Run(); });
}

AsyncLane::~AsyncLane() {
  {
    std::lock_guard<std::mutex> l(state_->mu);
    state_->stop = true;
    state_->cv.notify_all();
  }
  thread_.join();
}

absl::StatusOr<std::unique_ptr<PendingCollective>> AsyncLane::Start(std::string what,
                                                                    const CallTag& tag,
                                                                    Call call) {
  auto c = std::make_shared<LaneCall>();
  c->tag = tag;
  c->call = std::move(call);
  {
    std::lock_guard<std::mutex> l(state_->mu);
    if (!state_->failure.ok()) return state_->Refusal(what);
    c->what = std::move(what);
    state_->queue.push_back(c);
    state_->cv.notify_all();
  }
  return std::unique_ptr<PendingCollective>(std::make_unique<LaneHandle>(state_, std::move(c)));
}

void AsyncLane::Run() {
  while (true) {
    std::shared_ptr<LaneCall> c;
    absl::Status refused;
    {
      std::unique_lock<std::mutex> l(state_->mu);
      state_->cv.wait(l, [&] { return state_->stop || !state_->queue.empty(); });
      if (state_->queue.empty()) return;  // stopping, and nothing left to run
      c = std::move(state_->queue.front());
      state_->queue.pop_front();
      if (!state_->failure.ok()) refused = state_->Refusal(c->what);
    }
    absl::Status s = refused;
    if (refused.ok()) {
      if (dup_ == nullptr) {
        s = absl::FailedPreconditionError(
            absl::StrCat(c->what, ": this rank is in no duplicate group (the lane has none)"));
      } else {
        if (IsTagged(c->tag)) dup_->TagNextCall(c->tag);
        try {
          s = c->call(*dup_);
        } catch (const std::exception& e) {
          s = absl::InternalError(absl::StrCat(c->what, " threw an exception: ", e.what()));
        } catch (...) {
          s = absl::InternalError(absl::StrCat(c->what, " threw a non-std exception"));
        }
      }
    }
    std::lock_guard<std::mutex> l(state_->mu);
    c->call = nullptr;
    c->status = s;
    c->done = true;
    if (!s.ok()) state_->Fail(s, c->what);
    state_->cv.notify_all();
  }
}

absl::StatusOr<std::unique_ptr<AsyncLane>> OpenAsyncLane(Communicator& group,
                                                         LaneOptions options) {
  absl::StatusOr<std::unique_ptr<Communicator>> dup = group.Split(0, group.rank());
  if (!dup.ok()) {
    return absl::Status(dup.status().code(),
                        absl::StrCat("opening the lane of started calls of '", group.name(),
                                     "' (a Split(0, rank) every rank makes at its first started "
                                     "call): ", dup.status().message()));
  }
  if (*dup == nullptr) {
    return absl::InternalError(absl::StrCat("Split(0, rank) of '", group.name(),
                                            "' returned no group for color 0"));
  }
  return std::make_unique<AsyncLane>(std::move(*dup), std::move(options));
}

absl::StatusOr<std::unique_ptr<PendingCollective>> LazyAsyncLane::Start(Communicator& self,
                                                                        std::string what,
                                                                        const CallTag& tag,
                                                                        AsyncLane::Call call) {
  if (!open_failure_.ok()) {
    return absl::Status(open_failure_.code(),
                        absl::StrCat(what, " refused: ", open_failure_.message()));
  }
  if (lane_ == nullptr) {
    absl::StatusOr<std::unique_ptr<AsyncLane>> l = OpenAsyncLane(self, options_);
    if (!l.ok()) {
      open_failure_ = l.status();
      return absl::Status(l.status().code(), absl::StrCat(what, ": ", l.status().message()));
    }
    lane_ = std::move(*l);
  }
  return lane_->Start(std::move(what), tag, std::move(call));
}

}  // namespace shardmap::collectives
