// The operator's view end to end: AdminService.Stats per tier, type, model and fairness key,
// SetRateLimit, and ListWorkers' resident models and VRAM, read through dispatchctl (and the
// gRPC API where dispatchctl refuses a request itself) against a real daemon and workers.

#include <chrono>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include <grpcpp/grpcpp.h>

#include "tests/e2e/e2e_test.h"
#include "tests/e2e/harness.h"

namespace dispatchd::e2e {
namespace {

using ::testing::HasSubstr;

// Two tiers, a rate-limited model (60/min, burst 2) with a VRAM budget, and a conflict group.
constexpr char kTypesAndTiers[] = R"(  - name: chat
    tier: interactive
    model: llama
    rpm: 60
    burst: 2
    vram_gb: 10
  - name: index
    tier: batch
    conflict_group: repo
tiers:
  - name: interactive
    value: 4
  - name: batch
    value: 2
)";

class StatsTest : public E2eTest {
 protected:
  void SetUp() override {
    E2eTest::SetUp();
    if (HasFatalFailure()) return;
    DaemonOptions options;
    options.types = {};
    options.extra_yaml = kTypesAndTiers;
    daemon_ = E2eTest::StartDaemon(options);
    ASSERT_NE(daemon_, nullptr);
  }

  std::unique_ptr<Worker> StartWorker(WorkerOptions options) {
    return E2eTest::StartWorker(*daemon_, options);
  }

  // Submits a job; its id, or empty (and a failure) if refused.
  std::string Submit(const std::string& type, const std::string& key,
                     const std::string& resource = "") {
    v1::JobSpec spec = Spec(type, "payload");
    spec.set_fairness_key(key);
    spec.set_resource_id(resource);
    absl::StatusOr<std::string> id = daemon_->Submit(spec);
    EXPECT_TRUE(id.ok()) << id.status();
    return id.ok() ? *id : "";
  }

  // Runs `dispatchctl --json <command>` and evaluates the Python expression `expr` on the parsed
  // JSON `d`, with `by(list, field, name)` picking the entry of d[list] whose `field` is `name`.
  // Returns what it printed, stripped, or an "ERROR ..." line with the output to show.
  std::string CtlJson(const std::string& command, const std::string& expr) {
    CommandResult json = daemon_->Ctl({"--json", command});
    if (json.exit_code != 0) return absl::StrCat("ERROR dispatchctl: ", json.err);
    CommandResult r = RunCommand({"/usr/bin/python3", "-c",
                                  absl::StrCat("import json,sys\nd=json.load(sys.stdin)\n"
                                               "def by(l, f, n):\n"
                                               "  m=[x for x in d.get(l, []) if x[f]==n]\n"
                                               "  return m[0] if m else {}\n"
                                               "print(",
                                               expr, ")")},
                                 absl::Seconds(30), json.out);
    if (r.exit_code != 0) return absl::StrCat("ERROR python: ", r.err, "\njson: ", json.out);
    return std::string(absl::StripAsciiWhitespace(r.out));
  }

  std::string Stats(const std::string& expr) { return CtlJson("stats", expr); }

  // Polls Stats(expr) until it prints "True"; the last answer otherwise.
  std::string WaitForStats(const std::string& expr, absl::Duration timeout = absl::Seconds(30)) {
    std::string last;
    WaitFor(
        [&] {
          last = Stats(expr);
          return last == "True";
        },
        timeout);
    return last;
  }

  std::unique_ptr<Daemon> daemon_;
};

TEST_F(StatsTest, QueuedJobsShowPerTierTypeModelAndKeyWaitingForAWorker) {
  std::vector<std::string> chat;
  for (const char* key : {"alice", "alice", "bob"}) chat.push_back(Submit("chat", key));
  Submit("index", "alice", "repo-1");
  Submit("index", "carol", "repo-2");

  // The scheduler loads the jobs as their rows commit; wait until it holds all five.
  EXPECT_EQ(WaitForStats("by('tiers','tier','interactive').get('queued')=='3' and "
                         "by('tiers','tier','batch').get('queued')=='2'"),
            "True");
  EXPECT_EQ(Stats("[(t['tier'], t['priority'], t['cap'], t['queued'], t['running'], "
                  "t['head_wait_reason']) for t in d['tiers']]"),
            "[('interactive', 4, 4, '3', '0', 'no_worker'), "
            "('batch', 2, 2, '2', '0', 'no_worker')]");
  EXPECT_EQ(Stats("[(t['type'], t['queued'], t['head_wait_reason']) for t in d['types']]"),
            "[('chat', '3', 'no_worker'), ('index', '2', 'no_worker')]");
  // The model's bucket is full (burst 2) and refills at 60/min; no worker has it loaded.
  EXPECT_EQ(Stats("[(m['model'], m['queued'], m['running'], m['tokens'], m['rate_per_second'], "
                  "m['burst'], m['resident_on'], m['head_wait_reason']) for m in d['models']]"),
            "[('llama', '3', '0', 2, 1, 2, '0', 'no_worker')]");
  EXPECT_EQ(Stats("[(k['fairness_key'], k['queued'], k['running'], k['head_wait_reason']) "
                  "for k in d['keys']], d['keys_total']"),
            "[('alice', '3', '0', 'no_worker'), ('bob', '1', '0', 'no_worker'), "
            "('carol', '1', '0', 'no_worker')] 3");

  // One job's view: alice's second chat job is second in her line, and no key comes before hers.
  CommandResult status = daemon_->Ctl({"status", chat[1]});
  EXPECT_EQ(status.exit_code, 4) << status.err;  // still active
  EXPECT_THAT(status.out, HasSubstr("no_worker, position 2 (0 keys ahead)")) << status.out;

  CommandResult table = daemon_->Ctl({"stats"});
  ASSERT_EQ(table.exit_code, 0) << table.err;
  for (const char* want : {"TIER", "TYPE", "MODEL", "KEY", "WAITING-ON", "TOKENS", "interactive",
                           "batch", "llama", "alice", "no_worker", "1/s"}) {
    EXPECT_THAT(table.out, HasSubstr(want)) << table.out;
  }
}

// dispatchctl top: a refreshing view; piped, each refresh follows the last, and from the second
// one on it shows rates.
TEST_F(StatsTest, TopShowsQueuesRatesAndRateLimitedModels) {
  for (int i = 0; i < 3; ++i) Submit("chat", "alice");
  Submit("index", "bob", "repo-1");
  ASSERT_EQ(WaitForStats("by('types','type','chat').get('queued')=='3'"), "True");
  CommandResult top = daemon_->Ctl({"top", "--interval", "200ms", "--iterations", "3"});
  ASSERT_EQ(top.exit_code, 0) << top.err;
  EXPECT_THAT(top.out, ::testing::Not(HasSubstr("\033["))) << "no terminal codes when piped";
  const std::vector<std::string> pages = absl::StrSplit(top.out, "dispatchd ", absl::SkipEmpty());
  ASSERT_EQ(pages.size(), 3u) << top.out;
  EXPECT_THAT(pages[0], HasSubstr(absl::StrCat(daemon_->address(), "  workers 0  slots 0/0 busy")));
  EXPECT_THAT(pages[0], ::testing::ContainsRegex("chat +3 +0 +- +- +no_worker"));
  EXPECT_THAT(pages[0], ::testing::ContainsRegex("index +1 +0 +- +- +no_worker"));
  EXPECT_THAT(pages[0], ::testing::ContainsRegex("llama +3 +0 +2 +1/s +no_worker"));
  // The second refresh has a rate: nothing finished in between.
  EXPECT_THAT(pages[1], ::testing::ContainsRegex("chat +3 +0 +0 +0 +no_worker")) << pages[1];

  CommandResult bad = daemon_->Ctl({"top", "--interval", "soon"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("--interval"));
}

TEST_F(StatsTest, WorkerTakesJobsTokensDropAndRateLimitChangesLetTheRestRun) {
  for (int i = 0; i < 3; ++i) Submit("chat", "alice");
  ASSERT_EQ(WaitForStats("by('models','model','llama').get('queued')=='3'"), "True");
  // One token per 1000 s from now on, the two in the bucket kept: after the worker takes two
  // jobs, the third waits on the rate limit for good.
  CommandResult slow = daemon_->Ctl({"set-rate-limit", "llama", "--rpm", "0.06", "--burst", "2"});
  ASSERT_EQ(slow.exit_code, 0) << slow.err;
  EXPECT_EQ(Stats("by('models','model','llama')['tokens']"), "2");

  auto w = StartWorker(
      {.id = "w1", .types = {"chat", "index"}, .slots = 8, .mode = {"--simulate", "100%:30s"}});
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(WaitForStats("by('models','model','llama')['running']=='2' and "
                         "by('models','model','llama')['queued']=='1' and "
                         "by('models','model','llama')['tokens'] < 1 and "
                         "by('models','model','llama')['head_wait_reason']=='rate_limit' and "
                         "by('tiers','tier','interactive')['running']=='2' and "
                         "by('keys','fairness_key','alice')['running']=='2' and "
                         "d['slots_busy']==2"),
            "True");
  EXPECT_EQ(WaitForStats("by('types','type','chat').get('running')=='2'"), "True");
  EXPECT_EQ(Stats("by('types','type','chat')['head_wait_reason']"), "rate_limit");

  // A faster rate lets the third job go at once; stats show the new rate and burst.
  CommandResult fast = daemon_->Ctl({"set-rate-limit", "llama", "--rps", "5", "--burst", "3"});
  ASSERT_EQ(fast.exit_code, 0) << fast.err;
  EXPECT_THAT(fast.out, HasSubstr("llama: rate 5/s, burst 3"));
  EXPECT_EQ(WaitForStats("by('models','model','llama')['running']=='3' and "
                         "by('models','model','llama')['queued']=='0' and "
                         "by('models','model','llama')['rate_per_second']==5 and "
                         "by('models','model','llama')['burst']==3"),
            "True");
  EXPECT_EQ(Stats("by('models','model','llama')['head_wait_reason']"), "none");
}

TEST_F(StatsTest, SetRateLimitRefusesBadRequestsAndClears) {
  // An unknown model: NOT_FOUND naming it, exit 5.
  CommandResult unknown = daemon_->Ctl({"set-rate-limit", "gpt-9", "--rpm", "10"});
  EXPECT_EQ(unknown.exit_code, 5) << unknown.out << unknown.err;
  EXPECT_THAT(unknown.err, HasSubstr("NOT_FOUND"));
  EXPECT_THAT(unknown.err, HasSubstr("no configured type uses model \"gpt-9\""));
  EXPECT_THAT(unknown.err, HasSubstr("llama"));  // the configured ones are listed

  // dispatchctl refuses what it can tell is wrong (exit 2, usage).
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"set-rate-limit", "llama", "--rpm", "10", "--rps", "1"},
        {"set-rate-limit", "llama", "--rpm", "0"},
        {"set-rate-limit", "llama"},
        {"set-rate-limit", "llama", "--clear", "--burst", "2"}}) {
    CommandResult r = daemon_->Ctl(args);
    EXPECT_EQ(r.exit_code, 2) << absl::StrJoin(args, " ") << ": " << r.out << r.err;
  }
  CommandResult zero = daemon_->Ctl({"set-rate-limit", "llama", "--rpm", "0"});
  EXPECT_THAT(zero.err, HasSubstr("--rpm: must be > 0"));

  // The daemon names the field of a bad request: INVALID_ARGUMENT, exit 2.
  CommandResult burst = daemon_->Ctl({"set-rate-limit", "llama", "--rps", "1", "--burst", "0"});
  EXPECT_EQ(burst.exit_code, 2);
  EXPECT_THAT(burst.err, HasSubstr("INVALID_ARGUMENT: burst: must be >= 1"));
  CommandResult negative = daemon_->Ctl({"set-rate-limit", "llama", "--rps=-1"});
  EXPECT_EQ(negative.exit_code, 2);
  EXPECT_THAT(negative.err, HasSubstr("--rps: must be > 0"));
  struct Case {
    double rpm, rps;
    int burst;  // 0: unset
    std::string model, want;
  };
  for (const Case& c : std::vector<Case>{
           {10, 1, 0, "llama", "rpm, rps: set one, not both"},
           {0, -1, 0, "llama", "rps: must be > 0"},
           {-5, 0, 0, "llama", "rpm: must be > 0"},
           {0, 0, 2, "llama", "burst: needs rpm or rps"},
           {0, 1, 0, "", "model: required"},
       }) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::SetRateLimitRequest req;
    req.set_model(c.model);
    req.set_rpm(c.rpm);
    req.set_rps(c.rps);
    if (c.burst != 0) req.set_burst(c.burst);
    v1::SetRateLimitResponse resp;
    grpc::Status s = daemon_->admin().SetRateLimit(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.want;
    EXPECT_THAT(s.error_message(), HasSubstr(c.want));
  }
  // Nothing changed.
  EXPECT_EQ(Stats("[(m['model'], m['rate_per_second'], m['burst']) for m in d['models']]"),
            "[('llama', 1, 2)]");

  // --clear removes the limit; a type without a model can be limited by its name.
  CommandResult clear = daemon_->Ctl({"set-rate-limit", "llama", "--clear"});
  EXPECT_EQ(clear.exit_code, 0) << clear.err;
  EXPECT_THAT(clear.out, HasSubstr("llama: no rate limit"));
  CommandResult index = daemon_->Ctl({"--json", "set-rate-limit", "index", "--rpm", "120"});
  EXPECT_EQ(index.exit_code, 0) << index.err;
  EXPECT_THAT(index.out, HasSubstr("\"rate_per_second\":2"));
  EXPECT_EQ(Stats("[(m['model'], m['tokens'], m['rate_per_second'], m['burst']) "
                  "for m in d['models']]"),
            "[('index', 1, 2, 1), ('llama', -1, 0, 0)]");
}

TEST_F(StatsTest, WorkersShowResidentModelsAndVramWhileAndAfterAJobOfTheModelRuns) {
  auto w = StartWorker({.id = "gpu-1",
                        .types = {"chat", "index"},
                        .slots = 2,
                        .mode = {"--simulate", "100%:60s", "--gpu-memory-gb", "80"}});
  ASSERT_NE(w, nullptr);
  ASSERT_TRUE(daemon_->WaitForWorkers(1));
  const std::string view =
      "[(x['worker_id'], x['busy'], x['models_resident'], x['vram_gb'], x['vram_in_use_gb'], "
      "x['model_loads']) for x in d['workers']]";
  EXPECT_EQ(CtlJson("workers", view), "[('gpu-1', 0, [], 80, 0, '0')]");

  // While the job runs its model is resident and its 10 GB are in use; loading it was a swap.
  absl::StatusOr<std::string> id = daemon_->Submit(Spec("chat", "hi"));
  ASSERT_TRUE(id.ok()) << id.status();
  std::string last;
  EXPECT_TRUE(WaitFor(
      [&] {
        last = CtlJson("workers", view);
        return last == "[('gpu-1', 1, ['llama'], 80, 10, '1')]";
      },
      absl::Seconds(30)))
      << last;
  CommandResult table = daemon_->Ctl({"workers"});
  ASSERT_EQ(table.exit_code, 0) << table.err;
  for (const char* want : {"MODELS", "VRAM GB", "LOADS", "gpu-1", "llama", "10/80"}) {
    EXPECT_THAT(table.out, HasSubstr(want)) << table.out;
  }
  EXPECT_EQ(Stats("by('models','model','llama')['resident_on']"), "1");

  // After it ends the model stays resident (the worker reports it) but no VRAM is in use.
  ASSERT_EQ(daemon_->Ctl({"cancel", *id}).exit_code, 0);
  EXPECT_TRUE(WaitFor(
      [&] {
        last = CtlJson("workers", view);
        return last == "[('gpu-1', 0, ['llama'], 80, 0, '1')]";
      },
      absl::Seconds(30)))
      << last;
  EXPECT_EQ(Stats("by('models','model','llama')['resident_on']"), "1");
}

TEST_F(StatsTest, KeyListIsCappedAtTheHundredLowestCostKeys) {
  for (int i = 0; i < 105; ++i) Submit("index", absl::StrCat("key-", 1000 + i));
  EXPECT_EQ(WaitForStats("d['keys_total']=='105'"), "True");
  EXPECT_EQ(Stats("len(d['keys']), d['keys'][0]['fairness_key']"), "100 key-1000");
  CommandResult table = daemon_->Ctl({"stats"});
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_THAT(table.out, HasSubstr("(the 100 lowest-cost of 105 fairness keys)"));
}

TEST_F(StatsTest, CtlSubmitSaysWhenARepeatWasDeduplicated) {
  const std::vector<std::string> args = {"submit", "--type",         "chat",  "--payload",
                                         "hi",     "--fairness-key", "alice", "--idempotency-key",
                                         "order-7"};
  CommandResult first = daemon_->Ctl(args);
  ASSERT_EQ(first.exit_code, 0) << first.err;
  EXPECT_THAT(first.err, ::testing::Not(HasSubstr("deduplicated")));
  const std::string id(absl::StripAsciiWhitespace(first.out));
  CommandResult again = daemon_->Ctl(args);
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_EQ(absl::StripAsciiWhitespace(again.out), absl::StrCat(id, " (deduplicated)"));
  EXPECT_THAT(again.err,
              HasSubstr(absl::StrCat("deduplicated: idempotency key \"order-7\" matched job ", id,
                                     "; nothing new was queued")));
}

}  // namespace
// A model type without a VRAM budget is allowed but warned about at start, naming the key.
using StartupWarningTest = E2eTest;

TEST_F(StartupWarningTest, ModelWithoutVramBudgetIsLoggedAtStart) {
  DaemonOptions options;
  options.types = {};
  options.extra_yaml = R"(  - name: embed
    model: bge
  - name: chat
    model: llama
    vram_gb: 10
)";
  std::unique_ptr<Daemon> d = StartDaemon(options);
  ASSERT_NE(d, nullptr);
  std::string log = d->process().Log();
  EXPECT_THAT(log, HasSubstr("types[0].vram_gb"));
  EXPECT_THAT(log, HasSubstr("\"bge\""));
  EXPECT_THAT(log, ::testing::Not(HasSubstr("\"llama\") has no VRAM budget")));
}

}  // namespace dispatchd::e2e
