#include "lib/job/job.h"

#include "gtest/gtest.h"

namespace dispatchd::job {
namespace {

constexpr JobState kAll[] = {JobState::kQueued,    JobState::kDispatched, JobState::kRunning,
                             JobState::kSucceeded, JobState::kFailed,     JobState::kCancelled,
                             JobState::kExpired};

TEST(JobStateTest, NamesRoundTrip) {
  for (JobState s : kAll) EXPECT_EQ(ParseJobState(ToString(s)), s) << ToString(s);
  EXPECT_EQ(ParseJobState("queued"), std::nullopt);
  EXPECT_EQ(ParseJobState(""), std::nullopt);
}

TEST(JobStateTest, TerminalStatesHaveNoWayOut) {
  for (JobState from : kAll) {
    if (!IsTerminal(from)) continue;
    for (JobState to : kAll) EXPECT_FALSE(IsLegalTransition(from, to)) << ToString(from);
  }
}

TEST(JobStateTest, RefusalReturnsDispatchedToQueue) {
  EXPECT_TRUE(IsLegalTransition(JobState::kDispatched, JobState::kQueued));
  EXPECT_TRUE(IsLegalTransition(JobState::kDispatched, JobState::kRunning));
}

TEST(JobStateTest, QueuedJobCannotSkipToRunningOrSuccess) {
  EXPECT_FALSE(IsLegalTransition(JobState::kQueued, JobState::kRunning));
  EXPECT_FALSE(IsLegalTransition(JobState::kQueued, JobState::kSucceeded));
}

TEST(JobStateTest, OnlyQueuedJobsExpire) {
  for (JobState from : kAll) {
    EXPECT_EQ(IsLegalTransition(from, JobState::kExpired), from == JobState::kQueued)
        << ToString(from);
  }
}

}  // namespace
}  // namespace dispatchd::job
