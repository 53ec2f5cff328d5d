// SIGHUP (or AdminService.Reload) re-reads the config file while jobs flow: a new rate limit holds
// at once, a new type is accepted, a change that needs a restart is named and left alone, and a
// file that does not load is refused with the running config left in force. No job is lost across
// any of it.

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include <signal.h>

#include "proto/convert/time_proto.h"
#include "tests/e2e/e2e_test.h"
#include "tests/e2e/harness.h"

namespace dispatchd::e2e {
namespace {

using ::testing::HasSubstr;

// echo, and a model limited to 1 dispatch a second (burst 1).
constexpr char kTypes[] = R"(  - name: echo
    retry_backoff: 100ms
  - name: llm
    model: m1
    rpm: 60
    burst: 1
)";

constexpr char kApplied[] = R"(dispatchd_config_reloads_total{outcome="applied"})";
constexpr char kRefused[] = R"(dispatchd_config_reloads_total{outcome="refused"})";

class ReloadTest : public E2eTest {
 protected:
  void SetUp() override {
    E2eTest::SetUp();
    if (HasFatalFailure()) return;
    DaemonOptions options;
    options.types = {};
    options.extra_yaml = kTypes;
    daemon_ = StartDaemon(options);
    ASSERT_NE(daemon_, nullptr);
    original_ = ReadFile(daemon_->config_path());
    worker_ = StartWorker(*daemon_, {.id = "w", .types = {"echo", "llm", "fresh"}, .slots = 8});
    ASSERT_NE(worker_, nullptr);
    ASSERT_TRUE(daemon_->WaitForWorkers(1));
  }

  // Writes `yaml` as the daemon's config file, sends SIGHUP and waits until the daemon counts
  // the `reloads`-th outcome (applied or refused).
  void Reload(const std::string& yaml, int reloads) {
    std::ofstream(daemon_->config_path()) << yaml;
    daemon_->process().Signal(SIGHUP);
    ASSERT_TRUE(
        WaitFor([&] { return daemon_->Metric(kApplied) + daemon_->Metric(kRefused) >= reloads; },
                absl::Seconds(10)))
        << daemon_->process().Log();
  }

  // Jobs of `type` the daemon has dispatched so far (placed now, or ended); -1 if Stats fails.
  int64_t Dispatched(const std::string& type) {
    absl::StatusOr<v1::TypeStats> t = daemon_->TypeStats(type);
    if (absl::IsNotFound(t.status())) return 0;
    if (!t.ok()) return -1;
    return t->dispatched() + t->running() + t->succeeded() + t->failed();
  }

  std::vector<std::string> SubmitMany(const std::string& type, int n) {
    std::vector<std::string> ids;
    for (int i = 0; i < n; ++i) {
      absl::StatusOr<std::string> id = daemon_->Submit(Spec(type, "reload"));
      EXPECT_TRUE(id.ok()) << id.status();
      if (id.ok()) ids.push_back(*id);
    }
    return ids;
  }

  std::unique_ptr<Daemon> daemon_;
  std::unique_ptr<Worker> worker_;
  std::string original_;
};

TEST_F(ReloadTest, NewRateLimitHoldsAtOnceAndEveryJobCompletes) {
  const absl::Time submitted = absl::Now();
  const std::vector<std::string> ids = SubmitMany("llm", 20);
  // The old limit at work: the burst and a refill have gone out, the next job waits for a token.
  ASSERT_TRUE(WaitFor(
      [&] {
        return Dispatched("llm") >= 2 &&
               daemon_->Metric(R"(dispatchd_rate_limit_waiting{model="m1"})") == 1;
      },
      absl::Seconds(10)))
      << Dispatched("llm");

  // 1/s becomes 100/s: the 18 or so jobs still waiting go out in well under a second, where the
  // old limit would take 18 s.
  const absl::Time reloaded = absl::Now();
  Reload(absl::StrReplaceAll(original_, {{"rpm: 60\n", "rpm: 6000\n"}}), 1);
  std::vector<v1::Job> jobs;
  ASSERT_TRUE(daemon_->WaitForTerminal(ids, &jobs, absl::Seconds(60)));
  std::vector<absl::Time> dispatched;
  for (const v1::Job& j : jobs) {
    EXPECT_EQ(j.state(), v1::JOB_STATE_SUCCEEDED) << j.id();
    dispatched.push_back(proto_convert::FromProto(j.dispatched_at()));
  }
  std::sort(dispatched.begin(), dispatched.end());
  // Before the reload the old bucket held: at most burst + rate * t, plus one for clock skew
  // between the test and the database.
  const int64_t before = std::count_if(dispatched.begin(), dispatched.end(),
                                       [&](absl::Time t) { return t < reloaded; });
  EXPECT_LE(before, 1 + absl::ToInt64Seconds(reloaded - submitted) + 1);
  EXPECT_GE(before, 1);
  // After it, the new rate: the rest went out within a few bucket periods of the old rate.
  EXPECT_LT(dispatched.back() - reloaded, absl::Seconds(5))
      << "last dispatch " << absl::FormatDuration(dispatched.back() - reloaded)
      << " after the reload";
  EXPECT_EQ(daemon_->Metric(kApplied), 1);
  EXPECT_EQ(daemon_->Metric(kRefused), 0);
}

TEST_F(ReloadTest, NewTypeIsAcceptedAndRestartOnlyKeysAreNamed) {
  absl::StatusOr<std::string> refused = daemon_->Submit(Spec("fresh", "x"));
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("fresh"));

  std::string next = original_ + "  - name: fresh\n";
  next = absl::StrReplaceAll(next, {{"orphan_grace: 5s\n", "orphan_grace: 7s\n"}});
  Reload(next, 1);
  const std::vector<std::string> ids = SubmitMany("fresh", 3);
  std::vector<v1::Job> jobs;
  ASSERT_TRUE(daemon_->WaitForTerminal(ids, &jobs, absl::Seconds(60)));
  for (const v1::Job& j : jobs) EXPECT_EQ(j.state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(daemon_->Metric(kApplied), 1);
  // A reload by SIGHUP has no caller to answer: the log is where an operator learns which keys
  // wait for a restart (AdminService.Reload returns them, see the last test).
  EXPECT_THAT(daemon_->process().Log(),
              HasSubstr("reload: orphan_grace differs in the file; it keeps its running value"));
}

TEST_F(ReloadTest, InvalidFileIsRefusedAndTheRunningConfigStays) {
  Reload("types: [ {name: echo\n", 1);
  Reload(absl::StrReplaceAll(original_, {{"rpm: 60\n", "rpm: -5\n"}}), 2);
  EXPECT_EQ(daemon_->Metric(kRefused), 2);
  EXPECT_EQ(daemon_->Metric(kApplied), 0);
  // After a SIGHUP the log is the only place that names what the file got wrong.
  EXPECT_THAT(daemon_->process().Log(), HasSubstr("types[1].rpm"));

  // Still serving with the old config: both types run, llm still at 1/s.
  const absl::Time submitted = absl::Now();
  std::vector<std::string> ids = SubmitMany("echo", 3);
  const std::vector<std::string> llm = SubmitMany("llm", 3);
  ids.insert(ids.end(), llm.begin(), llm.end());
  std::vector<v1::Job> jobs;
  ASSERT_TRUE(daemon_->WaitForTerminal(ids, &jobs, absl::Seconds(60)));
  absl::Time last_llm = absl::InfinitePast();
  for (const v1::Job& j : jobs) {
    EXPECT_EQ(j.state(), v1::JOB_STATE_SUCCEEDED);
    if (j.spec().type() == "llm")
      last_llm = std::max(last_llm, proto_convert::FromProto(j.dispatched_at()));
  }
  // Three jobs through a 1/s bucket with burst 1 take at least 2 s.
  EXPECT_GE(last_llm - submitted, absl::Milliseconds(1900));
  EXPECT_EQ(daemon_->process().Running(), true);
}

TEST_F(ReloadTest, ReloadCallAppliesTheFileOrRefusesItNamingTheProblem) {
  // A file that does not load: exit 7 (FAILED_PRECONDITION) with the reason, nothing changes.
  std::ofstream(daemon_->config_path())
      << absl::StrReplaceAll(original_ + "  - name: fresh\n", {{"rpm: 60\n", "rpm: -5\n"}});
  CommandResult refused = daemon_->Ctl({"reload"});
  EXPECT_EQ(refused.exit_code, 7) << refused.out << refused.err;
  EXPECT_THAT(refused.err, HasSubstr("FAILED_PRECONDITION"));
  EXPECT_THAT(refused.err, HasSubstr("the running config stays in force"));
  EXPECT_THAT(refused.err, HasSubstr("types[1].rpm"));
  EXPECT_FALSE(daemon_->Submit(Spec("fresh", "x")).ok());
  EXPECT_EQ(daemon_->Metric(kRefused), 1);
  EXPECT_EQ(daemon_->Metric(kApplied), 0);

  // A good one: applied before the call returns, restart-only keys named in the answer.
  std::ofstream(daemon_->config_path()) << absl::StrReplaceAll(
      original_ + "  - name: fresh\n", {{"orphan_grace: 5s\n", "orphan_grace: 7s\n"}});
  CommandResult applied = daemon_->Ctl({"reload"});
  ASSERT_EQ(applied.exit_code, 0) << applied.out << applied.err;
  EXPECT_EQ(daemon_->Metric(kApplied), 1);
  EXPECT_THAT(applied.out, HasSubstr("reloaded " + daemon_->config_path() + ": 3 types, 0 tiers"));
  EXPECT_THAT(applied.out, HasSubstr("orphan_grace differs in the file"));
  CommandResult json = daemon_->Ctl({"--json", "reload"});
  ASSERT_EQ(json.exit_code, 0) << json.err;
  EXPECT_THAT(json.out, HasSubstr("\"restart_only\":[\"orphan_grace\"]"));
  const std::vector<std::string> ids = SubmitMany("fresh", 2);
  std::vector<v1::Job> jobs;
  ASSERT_TRUE(daemon_->WaitForTerminal(ids, &jobs, absl::Seconds(60)));
  for (const v1::Job& j : jobs) EXPECT_EQ(j.state(), v1::JOB_STATE_SUCCEEDED);
}

}  // namespace
}  // namespace dispatchd::e2e
