// The walking skeleton end to end: dispatchctl -> dispatchd -> PostgreSQL -> dispatch-worker and
// back, with real processes on 127.0.0.1 and a database of the test's own.

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "google/protobuf/util/time_util.h"
#include "grpcpp/client_context.h"
#include "gtest/gtest.h"
#include <signal.h>

#include "tests/e2e/e2e_test.h"
#include "tests/e2e/harness.h"

namespace dispatchd::e2e {
namespace {

using ::google::protobuf::util::TimeUtil;
using ::testing::HasSubstr;

class DispatchTest : public E2eTest {
 protected:
  // Parses JSON with Python's json module and prints the value at `path` (a Python expression
  // on `d`), so that the test checks real JSON rather than a substring.
  static CommandResult JsonField(const std::string& json, const std::string& path) {
    return RunCommand({"/usr/bin/python3", "-c",
                       absl::StrCat("import json,sys; d=json.load(sys.stdin); print(", path, ")")},
                      absl::Seconds(30), json);
  }

  // Runs `req` with RunSync on `d` (within 30 s), then reads the job it answered with Status:
  // both rows, or a failure of the test.
  static bool RunSyncThenStatus(Daemon& d, const v1::RunSyncRequest& req, v1::Job* run,
                                v1::Job* status) {
    v1::RunSyncResponse run_resp;
    {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
      const grpc::Status s = d.jobs().RunSync(&ctx, req, &run_resp);
      if (!s.ok()) {
        ADD_FAILURE() << "RunSync: " << s.error_message();
        return false;
      }
    }
    v1::StatusRequest status_req;
    status_req.set_job_id(run_resp.job().id());
    v1::StatusResponse status_resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    const grpc::Status s = d.jobs().Status(&ctx, status_req, &status_resp);
    if (!s.ok()) {
      ADD_FAILURE() << "Status: " << s.error_message();
      return false;
    }
    *run = run_resp.job();
    *status = status_resp.job();
    return true;
  }
};

TEST_F(DispatchTest, CtlRunPrintsWorkerResultAndStatusShowsSucceeded) {
  auto d = StartDaemon();
  ASSERT_NE(d, nullptr);
  auto w = StartWorker(*d, {.id = "w1", .mode = {"--exec", "cat"}});
  ASSERT_NE(w, nullptr);
  ASSERT_TRUE(d->WaitForWorkers(1));

  CommandResult run = d->Ctl({"run", "--type", "echo", "--payload", "hello"});
  EXPECT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(absl::StripTrailingAsciiWhitespace(run.out), "hello");

  // The same with --json gives the job record, hence its id.
  CommandResult json_run = d->Ctl({"--json", "run", "--type", "echo", "--payload", "hello"});
  ASSERT_EQ(json_run.exit_code, 0) << json_run.err;
  CommandResult id = JsonField(json_run.out, "d['id']");
  ASSERT_EQ(id.exit_code, 0) << id.err << json_run.out;
  std::string job_id(absl::StripAsciiWhitespace(id.out));

  CommandResult status = d->Ctl({"status", job_id});
  EXPECT_EQ(status.exit_code, 0) << status.err;
  EXPECT_THAT(status.out, HasSubstr("SUCCEEDED"));
  EXPECT_THAT(status.out, HasSubstr("created"));
  EXPECT_THAT(status.out, HasSubstr("started"));
  EXPECT_THAT(status.out, HasSubstr("finished"));

  CommandResult json_status = d->Ctl({"--json", "status", job_id});
  EXPECT_EQ(json_status.exit_code, 0) << json_status.err;
  CommandResult state = JsonField(json_status.out, "d['state'], bool(d['finished_at'])");
  ASSERT_EQ(state.exit_code, 0) << state.err << json_status.out;
  EXPECT_EQ(absl::StripAsciiWhitespace(state.out), "JOB_STATE_SUCCEEDED True");
}

TEST_F(DispatchTest, RunSyncAnswersTheRowStatusReadsAndAnIdleWorkerGetsTheJobFromItsInsert) {
  auto d = StartDaemon();
  ASSERT_NE(d, nullptr);
  auto w = StartWorker(*d, {.id = "w1", .mode = {"--exec", "cat"}});
  ASSERT_NE(w, nullptr);
  ASSERT_TRUE(d->WaitForWorkers(1));

  // Every field the store rounds: the answer must be the row, not the request.
  v1::RunSyncRequest req;
  v1::JobSpec* spec = req.mutable_spec();
  spec->set_type("echo");
  spec->set_payload(std::string("bin\0ary", 7));
  spec->set_resource_id("doc-7");
  spec->set_fairness_key("alice");
  spec->set_max_attempts(2);
  spec->mutable_timeout()->set_seconds(90);
  spec->mutable_timeout()->set_nanos(500'123'456);
  spec->mutable_dispatch_deadline()->set_seconds(12);
  spec->mutable_dispatch_deadline()->set_nanos(345'678'901);
  const absl::Time not_before = absl::Now() - absl::Seconds(1) + absl::Nanoseconds(789);
  spec->mutable_not_before()->set_seconds(absl::ToUnixSeconds(not_before));
  spec->mutable_not_before()->set_nanos(static_cast<int32_t>(absl::ToInt64Nanoseconds(
      not_before - absl::FromUnixSeconds(absl::ToUnixSeconds(not_before)))));
  v1::Job run, status;
  ASSERT_TRUE(RunSyncThenStatus(*d, req, &run, &status));
  EXPECT_EQ(run.state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(run.result(), spec->payload());
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(run, status))
      << "RunSync:\n"
      << run.DebugString() << "Status:\n"
      << status.DebugString();
  // The worker was idle: the insert itself wrote the job DISPATCHED to it, in one commit.
  EXPECT_EQ(run.dispatched_at().seconds(), run.created_at().seconds());
  EXPECT_EQ(run.dispatched_at().nanos(), run.created_at().nanos());
  EXPECT_EQ(run.worker_id(), "w1");
}

TEST_F(DispatchTest, RunSyncOfAJobRetriedOnceAnswersTheRowStatusReads) {
  auto d = StartDaemon({.types = {{.name = "flaky", .max_attempts = 2, .retry_backoff = "100ms"}}});
  ASSERT_NE(d, nullptr);
  // The first attempt fails, retryably (exit 75): the retry moves the row's not_before.
  auto w = StartWorker(
      *d,
      {.id = "w1",
       .types = {"flaky"},
       .mode = {"--exec",
                "if [ \"$DISPATCHD_ATTEMPT\" = 1 ]; then echo 'first try' >&2; exit 75; fi; cat"}});
  ASSERT_NE(w, nullptr);
  ASSERT_TRUE(d->WaitForWorkers(1));
  v1::RunSyncRequest req;
  req.mutable_spec()->set_type("flaky");
  req.mutable_spec()->set_payload("second try");
  v1::Job run, status;
  ASSERT_TRUE(RunSyncThenStatus(*d, req, &run, &status));
  EXPECT_EQ(run.state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(run.attempt(), 2);
  EXPECT_EQ(run.result(), "second try");
  EXPECT_TRUE(run.spec().has_not_before());
  // The attempt that failed is kept, whole: the timeline of the job page and dispatchctl status.
  ASSERT_EQ(run.earlier_attempts_size(), 1);
  const v1::JobAttempt& first = run.earlier_attempts(0);
  EXPECT_EQ(first.attempt(), 1);
  EXPECT_EQ(first.worker_id(), "w1");
  EXPECT_THAT(first.error(), HasSubstr("first try"));
  EXPECT_TRUE(first.has_dispatched_at());
  EXPECT_TRUE(first.has_started_at());
  EXPECT_LE(TimeUtil::TimestampToMicroseconds(first.started_at()),
            TimeUtil::TimestampToMicroseconds(first.ended_at()));
  EXPECT_LE(TimeUtil::TimestampToMicroseconds(first.ended_at()),
            TimeUtil::TimestampToMicroseconds(run.dispatched_at()));
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(run, status))
      << "RunSync:\n"
      << run.DebugString() << "Status:\n"
      << status.DebugString();
  CommandResult shown = d->Ctl({"status", run.id()});
  EXPECT_EQ(shown.exit_code, 0) << shown.err;
  EXPECT_THAT(shown.out,
              ::testing::ContainsRegex("attempt 1: +w1, started .*, failed .*first try"));
}

TEST_F(DispatchTest, TwoOneSlotWorkersNeverRunMoreThanTwoJobs) {
  auto d = StartDaemon();
  ASSERT_NE(d, nullptr);
  auto w1 = StartWorker(*d, {.id = "w1", .slots = 1, .mode = {"--simulate", "100%:2s"}});
  auto w2 = StartWorker(*d, {.id = "w2", .slots = 1, .mode = {"--simulate", "100%:2s"}});
  ASSERT_TRUE(d->WaitForWorkers(2));

  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<std::string> id = d->Submit(Spec("echo", absl::StrCat("job ", i)));
    ASSERT_TRUE(id.ok()) << id.status();
    ids.push_back(*id);
  }
  std::vector<v1::Job> jobs;
  ASSERT_TRUE(d->WaitForTerminal(ids, &jobs, absl::Seconds(60)));
  for (const v1::Job& j : jobs) EXPECT_EQ(j.state(), v1::JOB_STATE_SUCCEEDED) << j.id();
  // The daemon's own record: never more than two jobs between started_at and finished_at. (Not
  // a sample of Status calls, one job at a time: a job read RUNNING before its end and another
  // read after its successor started would count three.)
  EXPECT_LE(MostRunning(jobs), 2);

  std::vector<JournalEvent> events = ReadJournal(w1->journal_path(), "w1");
  std::vector<JournalEvent> more = ReadJournal(w2->journal_path(), "w2");
  events.insert(events.end(), more.begin(), more.end());
  EXPECT_EQ(events.size(), 6u);  // three starts, three ends
  EXPECT_LE(MaxConcurrent(events), 2);
  EXPECT_LE(MaxConcurrent(ReadJournal(w1->journal_path(), "w1")), 1);
  EXPECT_LE(MaxConcurrent(ReadJournal(w2->journal_path(), "w2")), 1);
}

TEST_F(DispatchTest, WorkerBackpressureRefusesExtraJobsAndNoneIsLostOrRunTwice) {
  auto d = StartDaemon();
  ASSERT_NE(d, nullptr);
  // Advertises 4 slots but its backpressure allows 1: it must answer RESOURCE_EXHAUSTED.
  auto liar = StartWorker(
      *d, {.id = "a-liar", .slots = 4, .max_concurrent = 1, .mode = {"--simulate", "100%:300ms"}});
  ASSERT_TRUE(d->WaitForWorkers(1));
  auto honest =
      StartWorker(*d, {.id = "b-honest", .slots = 1, .mode = {"--simulate", "100%:300ms"}});
  ASSERT_TRUE(d->WaitForWorkers(2));

  std::vector<std::string> ids;
  for (int i = 0; i < 12; ++i) {
    absl::StatusOr<std::string> id = d->Submit(Spec("echo", absl::StrCat("job ", i)));
    ASSERT_TRUE(id.ok()) << id.status();
    ids.push_back(*id);
  }
  std::vector<v1::Job> jobs;
  ASSERT_TRUE(d->WaitForTerminal(ids, &jobs, absl::Seconds(90)));
  for (const v1::Job& j : jobs) {
    EXPECT_EQ(j.state(), v1::JOB_STATE_SUCCEEDED) << j.id();
    EXPECT_EQ(j.attempt(), 1) << j.id();  // a refusal never consumes an attempt
  }

  std::vector<JournalEvent> a = ReadJournal(liar->journal_path(), "a");
  std::vector<JournalEvent> b = ReadJournal(honest->journal_path(), "b");
  EXPECT_LE(MaxConcurrent(a), 1);
  a.insert(a.end(), b.begin(), b.end());
  EXPECT_TRUE(EachStartedOnce(a, ids));
  // The refusals were real: the daemon counted them.
  EXPECT_GE(d->Metric("dispatchd_worker_refusals_total{reason=\"resource_exhausted\"}"), 1);
}

TEST_F(DispatchTest, TurnsInFlightAsConfiguredRunEveryJobOnce) {
  // Three turns on a pool of four: the daemon says how many it keeps in flight, and with turns
  // overlapping every job still succeeds at its first attempt and starts once.
  auto d = StartDaemon({.postgres_yaml = "  pool_size: 4\n  turns_in_flight: 3\n"});
  ASSERT_NE(d, nullptr);
  EXPECT_TRUE(WaitFor([&] { return absl::StrContains(d->process().Log(), "turns_in_flight=3"); },
                      absl::Seconds(10)))
      << d->process().Log();
  const std::vector<std::string> names = {"w1", "w2", "w3"};
  std::vector<std::unique_ptr<Worker>> workers;
  for (const std::string& id : names) {
    workers.push_back(StartWorker(*d, {.id = id, .slots = 8}));
    ASSERT_NE(workers.back(), nullptr);
  }
  std::vector<std::string> ids;
  for (int i = 0; i < 300; ++i) {
    absl::StatusOr<std::string> id = d->Submit(Spec("echo", absl::StrCat("payload ", i)));
    ASSERT_TRUE(id.ok()) << id.status();
    ids.push_back(*id);
  }
  std::vector<v1::Job> jobs;
  ASSERT_TRUE(d->WaitForTerminal(ids, &jobs, absl::Seconds(120)));
  for (size_t i = 0; i < jobs.size(); ++i) {
    EXPECT_EQ(jobs[i].state(), v1::JOB_STATE_SUCCEEDED) << jobs[i].id();
    EXPECT_EQ(jobs[i].result(), absl::StrCat("payload ", i));
    EXPECT_EQ(jobs[i].attempt(), 1);
  }
  EXPECT_TRUE(EachStartedOnce(Journals(workers), ids));
}

TEST_F(DispatchTest, KillNineWithHundredQueuedJobsThenRestartCompletesEachOnce) {
  auto d = StartDaemon();
  ASSERT_NE(d, nullptr);
  std::vector<std::string> ids;
  for (int i = 0; i < 100; ++i) {
    absl::StatusOr<std::string> id = d->Submit(Spec("echo", absl::StrCat("payload ", i)));
    ASSERT_TRUE(id.ok()) << id.status();
    ids.push_back(*id);
  }
  d->Kill9();
  ASSERT_TRUE(d->Restart().ok());
  auto w = StartWorker(*d, {.id = "w1", .slots = 8});
  ASSERT_NE(w, nullptr);

  std::vector<v1::Job> jobs;
  ASSERT_TRUE(d->WaitForTerminal(ids, &jobs, absl::Seconds(120)));
  for (size_t i = 0; i < jobs.size(); ++i) {
    EXPECT_EQ(jobs[i].state(), v1::JOB_STATE_SUCCEEDED) << jobs[i].id();
    EXPECT_EQ(jobs[i].result(), absl::StrCat("payload ", i));
    EXPECT_EQ(jobs[i].attempt(), 1);
  }
  EXPECT_TRUE(EachStartedOnce(w->Journal(), ids));
}

TEST_F(DispatchTest, KillNineWhileJobsRunWorkerReportsThemAndNoneRunsTwice) {
  auto d = StartDaemon();
  ASSERT_NE(d, nullptr);
  auto w = StartWorker(*d, {.id = "w1", .slots = 4, .mode = {"--simulate", "100%:3s"}});
  ASSERT_TRUE(d->WaitForWorkers(1));
  std::vector<std::string> ids;
  for (int i = 0; i < 8; ++i) {
    absl::StatusOr<std::string> id = d->Submit(Spec("echo", absl::StrCat("job ", i)));
    ASSERT_TRUE(id.ok()) << id.status();
    ids.push_back(*id);
  }
  ASSERT_TRUE(WaitFor(
      [&] {
        int running = 0;
        for (const std::string& id : ids) {
          absl::StatusOr<v1::Job> j = d->Status(id);
          running += j.ok() && j->state() == v1::JOB_STATE_RUNNING;
        }
        return running == 4;
      },
      absl::Seconds(30)));
  d->Kill9();
  ASSERT_TRUE(d->Restart().ok());

  std::vector<v1::Job> jobs;
  ASSERT_TRUE(d->WaitForTerminal(ids, &jobs, absl::Seconds(120)));
  for (const v1::Job& j : jobs) {
    EXPECT_EQ(j.state(), v1::JOB_STATE_SUCCEEDED) << j.id() << " " << j.error();
    EXPECT_EQ(j.attempt(), 1) << j.id();
  }
  EXPECT_TRUE(EachStartedOnce(w->Journal(), ids));
}

TEST_F(DispatchTest, ResultOfJobThatFinishedWhileDaemonWasDownIsKeptNotRerun) {
  auto d = StartDaemon();
  ASSERT_NE(d, nullptr);
  auto w = StartWorker(*d, {.id = "w1", .slots = 2, .mode = {"--simulate", "100%:1s"}});
  ASSERT_TRUE(d->WaitForWorkers(1));
  std::vector<std::string> ids = {*d->Submit(Spec("echo", "a")), *d->Submit(Spec("echo", "b"))};
  ASSERT_TRUE(WaitFor(
      [&] {
        return d->Status(ids[0])->state() == v1::JOB_STATE_RUNNING &&
               d->Status(ids[1])->state() == v1::JOB_STATE_RUNNING;
      },
      absl::Seconds(30)));
  d->Kill9();
  // Both jobs end on the worker while no daemon can record their results.
  ASSERT_TRUE(WaitFor(
      [&] {
        int ended = 0;
        for (const JournalEvent& e : ReadJournal(w->journal_path(), "w1")) ended += !e.start;
        return ended == 2;
      },
      absl::Seconds(30)));
  ASSERT_TRUE(d->Restart().ok());
  std::vector<v1::Job> jobs;
  ASSERT_TRUE(d->WaitForTerminal(ids, &jobs, absl::Seconds(60)));
  for (const v1::Job& j : jobs) {
    EXPECT_EQ(j.state(), v1::JOB_STATE_SUCCEEDED) << j.id() << " " << j.error();
    EXPECT_EQ(j.attempt(), 1) << j.id();
  }
  int starts = 0;
  for (const JournalEvent& e : ReadJournal(w->journal_path(), "w1")) starts += e.start;
  EXPECT_EQ(starts, 2) << "a job ran again after its result was resent";
}

TEST_F(DispatchTest, TypeMaxConcurrencyHoldsAcrossWorkers) {
  auto d = StartDaemon({.types = {{.name = "echo", .max_concurrency = 1}}});
  ASSERT_NE(d, nullptr);
  auto w1 = StartWorker(*d, {.id = "w1", .slots = 3, .mode = {"--simulate", "100%:400ms"}});
  auto w2 = StartWorker(*d, {.id = "w2", .slots = 3, .mode = {"--simulate", "100%:400ms"}});
  ASSERT_TRUE(d->WaitForWorkers(2));
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i) ids.push_back(*d->Submit(Spec("echo", "x")));
  std::vector<v1::Job> jobs;
  ASSERT_TRUE(d->WaitForTerminal(ids, &jobs, absl::Seconds(60)));
  for (const v1::Job& j : jobs) EXPECT_EQ(j.state(), v1::JOB_STATE_SUCCEEDED);
  std::vector<JournalEvent> events = ReadJournal(w1->journal_path(), "w1");
  std::vector<JournalEvent> more = ReadJournal(w2->journal_path(), "w2");
  events.insert(events.end(), more.begin(), more.end());
  EXPECT_EQ(MaxConcurrent(events), 1);
}

TEST_F(DispatchTest, RetryableFailuresUseUpMaxAttemptsThenFail) {
  auto d = StartDaemon({.types = {{.name = "flaky", .max_attempts = 3}}});
  ASSERT_NE(d, nullptr);
  // Exit code 75 (EX_TEMPFAIL) is a retryable failure.
  auto w = StartWorker(
      *d, {.id = "w1", .types = {"flaky"}, .mode = {"--exec", "echo 'disk on fire' >&2; exit 75"}});
  ASSERT_TRUE(d->WaitForWorkers(1));
  absl::StatusOr<std::string> id = d->Submit(Spec("flaky", "x"));
  ASSERT_TRUE(id.ok()) << id.status();
  std::vector<v1::Job> jobs;
  ASSERT_TRUE(d->WaitForTerminal({*id}, &jobs, absl::Seconds(60)));
  EXPECT_EQ(jobs[0].state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(jobs[0].attempt(), 3);
  EXPECT_THAT(jobs[0].error(), HasSubstr("disk on fire"));
}

TEST_F(DispatchTest, NonRetryableFailureEndsAtOnce) {
  auto d = StartDaemon({.types = {{.name = "broken", .max_attempts = 5}}});
  ASSERT_NE(d, nullptr);
  auto w = StartWorker(
      *d, {.id = "w1", .types = {"broken"}, .mode = {"--exec", "echo 'bad input' >&2; exit 3"}});
  ASSERT_TRUE(d->WaitForWorkers(1));
  CommandResult run = d->Ctl({"run", "--type", "broken", "--payload", "x"});
  EXPECT_EQ(run.exit_code, 1);  // the job FAILED
  EXPECT_THAT(run.err, HasSubstr("bad input"));
}

TEST_F(DispatchTest, ExecutionTimeoutCancelsAttemptAndCountsAsFailure) {
  auto d = StartDaemon({.types = {{.name = "slow", .max_attempts = 2, .timeout = "500ms"}}});
  ASSERT_NE(d, nullptr);
  auto w = StartWorker(
      *d, {.id = "w1", .types = {"slow"}, .slots = 2, .mode = {"--simulate", "100%:20s"}});
  ASSERT_TRUE(d->WaitForWorkers(1));
  absl::StatusOr<std::string> id = d->Submit(Spec("slow", "x"));
  ASSERT_TRUE(id.ok());
  std::vector<v1::Job> jobs;
  ASSERT_TRUE(d->WaitForTerminal({*id}, &jobs, absl::Seconds(60)));
  EXPECT_EQ(jobs[0].state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(jobs[0].attempt(), 2);
  EXPECT_THAT(jobs[0].error(), HasSubstr("timeout"));
}

TEST_F(DispatchTest, CancelQueuedAndRunningJobs) {
  auto d = StartDaemon({.types = {{.name = "echo"}, {.name = "nobody"}}});
  ASSERT_NE(d, nullptr);
  auto w = StartWorker(*d, {.id = "w1", .mode = {"--simulate", "100%:30s"}});
  ASSERT_TRUE(d->WaitForWorkers(1));

  // Queued: no worker serves the type.
  std::string queued = *d->Submit(Spec("nobody", "x"));
  CommandResult c1 = d->Ctl({"cancel", queued});
  EXPECT_EQ(c1.exit_code, 0) << c1.err;
  EXPECT_EQ(d->Status(queued)->state(), v1::JOB_STATE_CANCELLED);

  // Running: the worker is told and frees its slot, so the next job runs there.
  std::string running = *d->Submit(Spec("echo", "x"));
  ASSERT_TRUE(WaitFor([&] { return d->Status(running)->state() == v1::JOB_STATE_RUNNING; },
                      absl::Seconds(30)));
  CommandResult c2 = d->Ctl({"cancel", running});
  EXPECT_EQ(c2.exit_code, 0) << c2.err;
  EXPECT_EQ(d->Status(running)->state(), v1::JOB_STATE_CANCELLED);
  ASSERT_TRUE(WaitFor(
      [&] {
        for (const JournalEvent& e : ReadJournal(w->journal_path(), "w1")) {
          if (!e.start && e.job_id == running) return true;
        }
        return false;
      },
      absl::Seconds(30)))
      << "the worker never stopped the cancelled job";

  // Cancelling a finished job is refused.
  CommandResult c3 = d->Ctl({"cancel", running});
  EXPECT_EQ(c3.exit_code, 7) << c3.out << c3.err;  // FAILED_PRECONDITION
}

TEST_F(DispatchTest, WatchStreamsStatesUntilTerminal) {
  auto d = StartDaemon();
  ASSERT_NE(d, nullptr);
  std::string id = *d->Submit(Spec("echo", "watch me"));
  // The watch starts before any worker exists, so it sees the job go through its states.
  absl::StatusOr<std::unique_ptr<Process>> watch = Process::Start(
      {DispatchctlBin(), "--server", d->address(), "watch", id}, dir_.File("watch.log"));
  ASSERT_TRUE(watch.ok());
  ASSERT_TRUE(
      WaitFor([&] { return absl::StrContains((*watch)->Log(), "QUEUED"); }, absl::Seconds(30)));
  auto w = StartWorker(*d, {.id = "w1"});
  absl::StatusOr<int> rc = (*watch)->Wait(absl::Seconds(60));
  ASSERT_TRUE(rc.ok()) << (*watch)->Log();
  EXPECT_EQ(*rc, 0);
  std::string log = (*watch)->Log();
  EXPECT_THAT(log, HasSubstr("QUEUED"));
  EXPECT_THAT(log, HasSubstr("SUCCEEDED"));
  EXPECT_LT(log.find("QUEUED"), log.find("SUCCEEDED"));
}

TEST_F(DispatchTest, WorkersAndStatsShowTheFleet) {
  auto d = StartDaemon();
  ASSERT_NE(d, nullptr);
  auto w = StartWorker(*d, {.id = "gpu-7", .slots = 3});
  ASSERT_TRUE(d->WaitForWorkers(1));
  ASSERT_EQ(d->Ctl({"run", "--type", "echo", "--payload", "x"}).exit_code, 0);
  CommandResult workers = d->Ctl({"workers"});
  EXPECT_EQ(workers.exit_code, 0) << workers.err;
  EXPECT_THAT(workers.out, HasSubstr("gpu-7"));
  CommandResult stats = d->Ctl({"stats"});
  EXPECT_EQ(stats.exit_code, 0) << stats.err;
  EXPECT_THAT(stats.out, HasSubstr("echo"));
  CommandResult json = d->Ctl({"--json", "stats"});
  ASSERT_EQ(json.exit_code, 0) << json.err;
  CommandResult succeeded = JsonField(
      json.out, "[t for t in d['types'] if t['type']=='echo'][0]['succeeded'], d['slots_total']");
  ASSERT_EQ(succeeded.exit_code, 0) << succeeded.err << json.out;
  EXPECT_EQ(absl::StripAsciiWhitespace(succeeded.out), "1 3");
}

}  // namespace
}  // namespace dispatchd::e2e
