#include "collectives/peer_failure_board.h"

#include <chrono>
#include <condition_variable>
#include <functional>
#include <thread>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace shardmap::collectives {

namespace {

constexpr char kRecordVersion[] = "v1";
// How often a waiting read looks at the store again. A failure is rare and reads happen only
// after one, so a short interval costs nothing while keeping the failure path fast.
constexpr absl::Duration kRecheck = absl::Milliseconds(20);
// Poll starts at most one check per interval: callers poll in tight wait loops, and every rank
// of a job asks the same store.
constexpr absl::Duration kPollInterval = absl::Milliseconds(100);

// Runs `work` on a detached helper thread and waits at most `limit` for it. nullopt when it did
// not finish in time: the helper (which owns everything it touches, the store included) is left
// to finish on its own, bounded by the store's own timeout. So a stopped or unreachable store
// can delay failure handling by `limit`, never more.
template <typename T>
std::optional<T> RunBounded(absl::Duration limit, std::function<T()> work) {
  struct Shared {
    std::mutex mu;
    std::condition_variable cv;
    std::optional<T> result;
  };
  auto shared = std::make_shared<Shared>();
  std::thread([shared, work = std::move(work)]() {
    T r = work();
    std::lock_guard<std::mutex> l(shared->mu);
    shared->result = std::move(r);
    shared->cv.notify_all();
  }).detach();
  std::unique_lock<std::mutex> l(shared->mu);
  shared->cv.wait_for(l, absl::ToChronoNanoseconds(std::max(limit, absl::ZeroDuration())),
                      [&] { return shared->result.has_value(); });
  return std::move(shared->result);
}

// Reads `key` once it exists, looking every kRecheck until `deadline`. Never calls Get on a key
// that may be missing: a Get that times out closes the store client's connection for good.
absl::StatusOr<std::string> GetWhenSet(TcpStore& store, const std::string& key,
                                       absl::Time deadline) {
  while (true) {
    absl::StatusOr<bool> has = store.Check({key});
    if (!has.ok()) return has.status();
    if (*has) return store.Get(key);
    if (absl::Now() >= deadline) return absl::NotFoundError(absl::StrCat("'", key, "' not set"));
    absl::SleepFor(std::min(kRecheck, std::max(deadline - absl::Now(), absl::ZeroDuration())));
  }
}

std::optional<PeerFailure> DecodeOrNothing(const absl::StatusOr<std::string>& record) {
  if (!record.ok()) return std::nullopt;
  absl::StatusOr<PeerFailure> f = DecodePeerFailure(*record);
  if (!f.ok()) return std::nullopt;
  return *std::move(f);
}

}  // namespace

// Helper threads hand records over as strings and callers decode them: an absl::Status shared
// between threads is freed by whichever drops it last, through Abseil's reference count, which
// ThreadSanitizer cannot see into (Debian's Abseil is not instrumented).
struct PeerFailureBoard::PollState {
  absl::Time started;
  std::mutex mu;
  bool done = false;
  std::optional<std::string> record;  // the first failure's record, once seen
};

PeerFailureBoard::PeerFailureBoard(std::shared_ptr<TcpStore> store, std::string prefix,
                                   absl::Duration op_limit)
    : store_(std::move(store)), prefix_(std::move(prefix)), op_limit_(op_limit) {}

std::string PeerFailureBoard::FailureKey(int64_t n) const {
  return absl::StrCat(prefix_, "/failure/", n);
}

std::string PeerFailureBoard::CallKey(absl::string_view group_key, int group_rank) const {
  return absl::StrCat(prefix_, "/call/", group_key, "/", group_rank);
}

absl::Status PeerFailureBoard::Publish(const absl::Status& why) {
  if (why.ok()) return absl::InvalidArgumentError("PeerFailureBoard::Publish: the status is OK");
  // The counter makes exactly one publication the first (number 1); later ones are kept under
  // their own numbers for whoever wants them, but First() reads number 1 only.
  std::function<absl::Status()> work = [store = store_, counter = absl::StrCat(prefix_, "/count"),
                                        prefix = prefix_,
                                        record = EncodePeerFailure(store_->rank(), why)]() {
    absl::StatusOr<int64_t> n = store->Add(counter, 1);
    if (!n.ok()) return n.status();
    return store->Set(absl::StrCat(prefix, "/failure/", *n), record);
  };
  std::optional<absl::Status> s = RunBounded(op_limit_, std::move(work));
  if (!s.has_value()) {
    return absl::DeadlineExceededError(
        absl::StrCat("publishing this rank's failure: the store did not answer within ",
                     absl::FormatDuration(op_limit_)));
  }
  return *s;
}

std::optional<PeerFailure> PeerFailureBoard::First(absl::Duration wait) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (seen_.has_value()) return seen_;
  }
  const absl::Time deadline = absl::Now() + wait;
  std::function<absl::StatusOr<std::string>()> work = [store = store_, key = FailureKey(1),
                                                       deadline]() {
    return GetWhenSet(*store, key, deadline);
  };
  // A little past the deadline: a reply already on its way is still taken.
  std::optional<absl::StatusOr<std::string>> record =
      RunBounded(wait + absl::Milliseconds(100), std::move(work));
  if (!record.has_value()) return std::nullopt;
  std::optional<PeerFailure> f = DecodeOrNothing(*record);
  if (f.has_value()) {
    std::lock_guard<std::mutex> l(mu_);
    if (!seen_.has_value()) seen_ = f;
    return seen_;
  }
  return std::nullopt;
}

std::optional<PeerFailure> PeerFailureBoard::Poll() {
  std::shared_ptr<PollState> state;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (seen_.has_value()) return seen_;
    if (poll_ != nullptr) {
      std::lock_guard<std::mutex> pl(poll_->mu);
      if (!poll_->done) return std::nullopt;  // a check is in flight
      if (poll_->record.has_value()) {
        std::optional<PeerFailure> f = DecodeOrNothing(*poll_->record);
        if (f.has_value()) {
          seen_ = std::move(f);
          return seen_;
        }
      }
      if (absl::Now() - poll_->started < kPollInterval) return std::nullopt;
    }
    poll_ = std::make_shared<PollState>();
    poll_->started = absl::Now();
    state = poll_;
  }
  std::thread([state, store = store_, key = FailureKey(1)]() {
    std::optional<std::string> record;
    absl::StatusOr<bool> has = store->Check({key});
    if (has.ok() && *has) {
      absl::StatusOr<std::string> got = store->Get(key);
      if (got.ok()) record = *std::move(got);
    }
    std::lock_guard<std::mutex> l(state->mu);
    state->record = std::move(record);
    state->done = true;
  }).detach();
  return std::nullopt;
}

PeerFailureBoard::StuckCallDiagnosis PeerFailureBoard::DiagnoseStuckCall(
    absl::string_view group_key, absl::string_view group_name, int group_rank, int group_size,
    absl::string_view call, absl::Duration wait) {
  const absl::Time deadline = absl::Now() + wait;
  std::vector<std::string> keys;
  for (int r = 0; r < group_size; ++r) keys.push_back(CallKey(group_key, r));
  // The helper fills a shared copy as it goes, so what arrived before the limit is kept.
  struct Partial {
    std::mutex mu;
    std::vector<std::optional<std::string>> calls;
    std::optional<std::string> first;  // the first failure's record (see PollState)
  };
  auto partial = std::make_shared<Partial>();
  partial->calls.resize(group_size);
  std::function<bool()> work = [store = store_, keys, own = keys[group_rank],
                                value = std::string(call), failure_key = FailureKey(1), deadline,
                                partial, group = std::string(group_name)]() {
    if (!store->Set(own, value).ok()) return false;
    std::vector<std::optional<std::string>> calls(keys.size());
    while (true) {
      absl::StatusOr<bool> failed = store->Check({failure_key});
      if (!failed.ok()) return false;
      if (*failed) {
        absl::StatusOr<std::string> record = store->Get(failure_key);
        if (!record.ok()) return false;
        std::lock_guard<std::mutex> l(partial->mu);
        partial->first = *std::move(record);
        return true;
      }
      size_t missing = 0;
      for (size_t r = 0; r < keys.size(); ++r) {
        if (calls[r].has_value()) continue;
        absl::StatusOr<bool> has = store->Check({keys[r]});
        if (!has.ok()) return false;
        if (!*has) {
          ++missing;
          continue;
        }
        absl::StatusOr<std::string> c = store->Get(keys[r]);
        if (!c.ok()) return false;
        calls[r] = *std::move(c);
        std::lock_guard<std::mutex> l(partial->mu);
        partial->calls[r] = calls[r];
      }
      if (missing == 0 || MismatchFromCalls(group, calls).has_value()) return true;
      if (absl::Now() >= deadline) return true;
      absl::SleepFor(kRecheck);
    }
  };
  RunBounded(wait + absl::Milliseconds(100), std::move(work));
  StuckCallDiagnosis d;
  std::lock_guard<std::mutex> l(partial->mu);
  if (partial->first.has_value()) d.first = DecodeOrNothing(*partial->first);
  if (!d.first.has_value()) d.mismatch = MismatchFromCalls(group_name, partial->calls);
  if (d.first.has_value()) {
    std::lock_guard<std::mutex> sl(mu_);
    if (!seen_.has_value()) seen_ = d.first;
  }
  return d;
}

absl::Status StatusAfterFailure(const absl::Status& own, FailureOrigin origin, int own_rank,
                                const std::optional<PeerFailure>& first) {
  if (origin == FailureOrigin::kLocal || !first.has_value() || first->status.ok() ||
      first->rank == own_rank) {
    return own;
  }
  return absl::Status(first->status.code(),
                      absl::StrCat("rank ", first->rank, " failed: ", first->status.message(),
                                   " (here: ", own.message(), ")"));
}

namespace {

// The call's place in its group's sequence: what follows the last '#' ("" when none).
absl::string_view CallNumber(absl::string_view call) {
  const size_t hash = call.rfind('#');
  return hash == absl::string_view::npos ? absl::string_view() : call.substr(hash + 1);
}

}  // namespace

std::optional<absl::Status> MismatchFromCalls(absl::string_view group,
                                              absl::Span<const std::optional<std::string>> calls) {
  auto mismatch = [&](int a, int b) {
    return absl::InvalidArgumentError(
        absl::StrCat("mismatched collectives on group '", group, "': rank ", a, " called ",
                     *calls[a], " but rank ", b, " called ", *calls[b],
                     " (every rank of a group must issue the same collectives in the same "
                     "order)"));
  };
  const int n = static_cast<int>(calls.size());
  bool all = true;
  for (int r = 0; r < n; ++r) all = all && calls[r].has_value();
  for (int a = 0; a < n; ++a) {
    if (!calls[a].has_value()) continue;
    for (int b = a + 1; b < n; ++b) {
      if (!calls[b].has_value() || *calls[a] == *calls[b]) continue;
      // Different calls at the same place of the sequence: a mismatch. At different places only
      // when every rank is stuck: with a rank missing, one may simply have got further (its part
      // of a broadcast was done) while the others wait for the missing rank.
      const absl::string_view na = CallNumber(*calls[a]);
      if (all || (!na.empty() && na == CallNumber(*calls[b]))) return mismatch(a, b);
    }
  }
  return std::nullopt;
}

std::string EncodePeerFailure(int rank, const absl::Status& status) {
  return absl::StrCat(kRecordVersion, " ", rank, " ", static_cast<int>(status.code()), "\n",
                      status.message());
}

absl::StatusOr<PeerFailure> DecodePeerFailure(absl::string_view record) {
  auto malformed = [&](absl::string_view why) {
    return absl::DataLossError(
        absl::StrCat("malformed peer failure record (", why, "): '", record.substr(0, 64), "'"));
  };
  const size_t nl = record.find('\n');
  if (nl == absl::string_view::npos) return malformed("no header line");
  const absl::string_view head = record.substr(0, nl);
  const absl::string_view message = record.substr(nl + 1);
  const size_t s1 = head.find(' ');
  const size_t s2 = s1 == absl::string_view::npos ? s1 : head.find(' ', s1 + 1);
  if (s2 == absl::string_view::npos || head.substr(0, s1) != kRecordVersion) {
    return malformed("bad header");
  }
  int rank = -1, code = 0;
  if (!absl::SimpleAtoi(head.substr(s1 + 1, s2 - s1 - 1), &rank) || rank < 0) {
    return malformed("bad rank");
  }
  if (!absl::SimpleAtoi(head.substr(s2 + 1), &code) || code <= 0 ||
      code > static_cast<int>(absl::StatusCode::kUnauthenticated)) {
    return malformed("bad status code");
  }
  return PeerFailure{rank, absl::Status(static_cast<absl::StatusCode>(code), message)};
}

}  // namespace shardmap::collectives
