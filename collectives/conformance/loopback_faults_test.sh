#!/usr/bin/env bash
# The conformance suite can fail: the loopback backend with each injected fault must fail the
# suite's case about that promise (and the test binary must exit non-zero).
set -uo pipefail
# The faulted runs below fail on purpose: their gtest XML must not replace this test's result.
unset XML_OUTPUT_FILE GTEST_OUTPUT
bin="collectives/conformance/loopback_conformance_test"
check() {  # check FAULT CASE: with FAULT, CASE fails
  local out
  out=$(SHARDMAP_LOOPBACK_FAULT="$1" "$bin" --gtest_filter="*$2*" 2>&1)
  local rc=$?
  if [[ $rc -eq 0 ]]; then
    echo "FAIL: fault $1: the suite passed"; echo "$out" | tail -20; exit 1
  fi
  if ! grep -q "\[  FAILED  \] Backend/BackendConformanceTest.$2/loopback" <<<"$out"; then
    echo "FAIL: fault $1: $2 did not fail"; echo "$out" | tail -40; exit 1
  fi
  echo "ok: fault $1 fails $2"
}
"$bin" --gtest_filter='*AllReduce*:*Split*' >/dev/null 2>&1 ||
  { echo "FAIL: the unfaulted loopback fails"; exit 1; }
check allreduce_off_by_one AllReduceEveryDtypeAndOpMatchesTheReference
for c in AllGatherAndAllGatherVEveryDtype ReduceScatterAndReduceScatterVEveryDtypeAndOp \
         AllToAllAndAllToAllVEveryDtype BroadcastFromEveryRoot SendRecvAroundARing \
         PpermuteShiftAndPartialPermutation; do
  check outputs_off_by_one "$c"
done
check split_ignores_key SplitMakesGroupsOrderedByKey
check errors_lose_their_code MismatchedCallsFailOnEveryRankNamingBoth
check errors_lose_their_code BadArgumentsAreRefusedOnEveryRank
check errors_lose_their_code ASilentRankTimesOutItsPeers
check errors_lose_their_text AFailingRankFailsItsPeersWithoutAHang
check errors_lose_their_text MismatchedCallsFailOnEveryRankNamingBoth
check barrier_does_not_wait BarrierWaitsForEveryRank
check wait_twice_is_ok PpermuteStartHandlesWaitInAnyOrderAndOnlyOnce
# The started calls (AllReduceStart, AllGatherStart, ReduceScatterStart).
check allreduce_off_by_one StartedCallsMatchTheReferenceAndTheBlockingBits
check outputs_off_by_one StartedCallsMatchTheReferenceAndTheBlockingBits
check wait_twice_is_ok StartedCallsRefuseASecondWait
check errors_lose_their_code MismatchedStartedCallsFailOnEveryRank
check errors_lose_their_text AFailingRankFailsItsPeersStartedCalls
echo PASS
