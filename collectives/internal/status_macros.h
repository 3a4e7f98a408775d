// Small status helpers for collectives/ (Debian's Abseil ships no status macros).
//
//   SM_COLL_RETURN_IF_ERROR(DoThing());
//   SM_COLL_ASSIGN_OR_RETURN(auto v, MaybeValue());
#ifndef SHARDMAP_COLLECTIVES_INTERNAL_STATUS_MACROS_H_
#define SHARDMAP_COLLECTIVES_INTERNAL_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define SM_COLL_RETURN_IF_ERROR(expr)        \
  do {                                       \
    ::absl::Status sm_coll_status_ = (expr); \
    if (!sm_coll_status_.ok()) return sm_coll_status_; \
  } while (0)

#define SM_COLL_CONCAT_INNER(a, b) a##b
#define SM_COLL_CONCAT(a, b) SM_COLL_CONCAT_INNER(a, b)
#define SM_COLL_ASSIGN_OR_RETURN(lhs, expr) \
  SM_COLL_ASSIGN_OR_RETURN_IMPL(SM_COLL_CONCAT(sm_coll_statusor_, __LINE__), lhs, expr)
#define SM_COLL_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return tmp.status();                 \
  lhs = std::move(tmp).value()

#endif  // SHARDMAP_COLLECTIVES_INTERNAL_STATUS_MACROS_H_
