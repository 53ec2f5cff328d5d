// The load generator of bench/ (dispatch-loadgen) against a real daemon and worker: it reports
// every job it queued, every job exists in the database and ran once, refused calls are resent
// after the daemon's hint, and an unexpected error fails the run. Counts only, never timings.

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pqxx/connection"
#include "pqxx/nontransaction"
#include "pqxx/result"
#include <signal.h>

#include "tests/e2e/e2e_test.h"
#include "tests/e2e/harness.h"

namespace dispatchd::e2e {
namespace {

using ::testing::HasSubstr;

// One line of dispatch-loadgen --record.
struct Record {
  int64_t seq = 0;
  std::string job_id;
};

class LoadgenTest : public E2eTest {
 protected:
  std::unique_ptr<Daemon> StartDaemon(const std::string& extra_yaml = "") {
    DaemonOptions options{.types = {{.name = "noop"}}};
    options.extra_yaml = extra_yaml;
    return E2eTest::StartDaemon(options);
  }

  // A reference worker in echo mode that records each handler start.
  std::unique_ptr<Worker> StartWorker(const Daemon& d) {
    return E2eTest::StartWorker(
        d,
        {.id = "w1", .types = {"noop"}, .slots = 8, .mode = {"--echo", "--start-log", StartLog()}});
  }
  std::string StartLog() const { return dir_.File("starts"); }

  static std::vector<std::string> LoadgenArgv(const Daemon& d, std::vector<std::string> args) {
    std::vector<std::string> argv = {
        DISPATCH_LOADGEN_BIN, "--server", d.address(), "--type", "noop", "--call-timeout", "60s"};
    argv.insert(argv.end(), args.begin(), args.end());
    return argv;
  }

  // The values of `keys` in the JSON summary line of `out`, read with Python's json module so
  // that the line must be real JSON. A key path is a Python subscript chain, e.g. "['jobs']".
  static std::map<std::string, int64_t> Summary(const std::string& out,
                                                const std::vector<std::string>& keys) {
    std::string line;
    for (absl::string_view l : absl::StrSplit(out, '\n')) {
      if (absl::StartsWith(l, "{")) line = std::string(l);
    }
    std::vector<std::string> exprs;
    for (const std::string& k : keys) exprs.push_back(absl::StrCat("int(d", k, ")"));
    CommandResult r =
        RunCommand({"/usr/bin/python3", "-c",
                    absl::StrCat("import json,sys; d=json.loads(sys.stdin.read()); print(",
                                 absl::StrJoin(exprs, ", "), ")")},
                   absl::Seconds(30), line);
    std::map<std::string, int64_t> values;
    std::vector<std::string> fields =
        absl::StrSplit(r.out, absl::ByAnyChar(" \n"), absl::SkipEmpty());
    EXPECT_EQ(r.exit_code, 0) << r.err << "\nline: " << line;
    EXPECT_EQ(fields.size(), keys.size()) << r.out;
    for (size_t i = 0; i < keys.size() && i < fields.size(); ++i) {
      int64_t v = 0;
      EXPECT_TRUE(absl::SimpleAtoi(fields[i], &v)) << fields[i];
      values[keys[i]] = v;
    }
    return values;
  }

  static std::vector<Record> ReadRecords(const std::string& path) {
    CommandResult cat = RunCommand({"/bin/cat", path});
    std::vector<Record> out;
    for (absl::string_view line : absl::StrSplit(cat.out, '\n', absl::SkipEmpty())) {
      std::vector<std::string> f = absl::StrSplit(line, ' ');
      EXPECT_EQ(f.size(), 4u) << line;
      if (f.size() != 4) continue;
      Record r;
      EXPECT_TRUE(absl::SimpleAtoi(f[0], &r.seq)) << line;
      r.job_id = f[1];
      out.push_back(r);
    }
    return out;
  }

  // How many times each job's handler started, from the worker's start log.
  std::map<std::string, int> Starts() const {
    CommandResult cat = RunCommand({"/bin/cat", StartLog()});
    std::map<std::string, int> out;
    for (absl::string_view line : absl::StrSplit(cat.out, '\n', absl::SkipEmpty())) {
      std::vector<std::string> f = absl::StrSplit(line, ' ');
      EXPECT_EQ(f.size(), 3u) << line;
      if (!f.empty()) ++out[f[0]];
    }
    return out;
  }

  // Waits for every job to end, then checks that `records` name exactly the rows of the
  // database, each SUCCEEDED at its first attempt, and (after the worker drained and wrote its
  // start log) that the worker started each once.
  void ExpectEveryJobRanOnce(const std::vector<Record>& records, Worker& worker) {
    std::set<std::string> ids;
    for (const Record& r : records) ids.insert(r.job_id);
    EXPECT_EQ(ids.size(), records.size()) << "a job id was reported twice";
    ASSERT_TRUE(WaitFor(
        [&] {
          return QueryInt(
                     "SELECT count(*) FROM jobs WHERE state IN ('QUEUED', 'DISPATCHED', "
                     "'RUNNING')") == 0;
        },
        absl::Seconds(60)));
    pqxx::connection conn(db().url());
    pqxx::nontransaction txn(conn);
    std::set<std::string> rows;
    for (const pqxx::row& row : txn.exec("SELECT id, state, attempt FROM jobs")) {
      rows.insert(row[0].as<std::string>());
      EXPECT_EQ(row[1].as<std::string>(), "SUCCEEDED") << row[0].as<std::string>();
      EXPECT_EQ(row[2].as<int>(), 1) << row[0].as<std::string>();
    }
    EXPECT_EQ(rows, ids);

    worker.process().Signal(SIGTERM);
    absl::StatusOr<int> exit = worker.process().Wait(absl::Seconds(30));
    ASSERT_TRUE(exit.ok()) << exit.status();
    EXPECT_EQ(*exit, 0) << worker.process().Log();
    std::map<std::string, int> starts = Starts();
    EXPECT_EQ(starts.size(), ids.size());
    for (const std::string& id : ids) EXPECT_EQ(starts[id], 1) << id;
  }
};

TEST_F(LoadgenTest, FloodQueuesEveryJobOnceAndResendsRefusedCalls) {
  // Room for 10 active jobs and no worker yet: the flood's calls are refused until one comes.
  auto d = StartDaemon("max_active: 10\n");
  ASSERT_NE(d, nullptr);
  absl::StatusOr<std::unique_ptr<Process>> loadgen =
      Process::Start(LoadgenArgv(*d, {"--record", dir_.File("records"), "flood", "--jobs", "300",
                                      "--clients", "2", "--inflight", "16", "--threads", "2"}),
                     dir_.File("loadgen.log"));
  ASSERT_TRUE(loadgen.ok()) << loadgen.status();
  ASSERT_TRUE(WaitFor([&] { return absl::StrContains((*loadgen)->Log(), "RESOURCE_EXHAUSTED"); },
                      absl::Seconds(60)))
      << (*loadgen)->Log();
  auto w = StartWorker(*d);
  ASSERT_NE(w, nullptr);

  absl::StatusOr<int> exit = (*loadgen)->Wait(absl::Seconds(120));
  ASSERT_TRUE(exit.ok()) << exit.status();
  ASSERT_EQ(*exit, 0) << (*loadgen)->Log();
  std::map<std::string, int64_t> s = Summary(
      (*loadgen)->Log(),
      {"['jobs']", "['calls']", "['errors']", "['resource_exhausted']", "['latency_us']['count']"});
  EXPECT_EQ(s["['jobs']"], 300);
  EXPECT_EQ(s["['calls']"], 300);
  EXPECT_EQ(s["['errors']"], 0);
  EXPECT_GE(s["['resource_exhausted']"], 1);
  EXPECT_EQ(s["['latency_us']['count']"], 300);
  std::vector<Record> records = ReadRecords(dir_.File("records"));
  ASSERT_EQ(records.size(), 300u);
  ExpectEveryJobRanOnce(records, *w);
}

TEST_F(LoadgenTest, BatchFloodQueuesEveryJobOnce) {
  auto d = StartDaemon();
  ASSERT_NE(d, nullptr);
  auto w = StartWorker(*d);
  ASSERT_NE(w, nullptr);
  // 250 jobs in batches of 100: calls of 100, 100 and 50 specs.
  CommandResult r = RunCommand(
      LoadgenArgv(*d, {"--wait-workers", "1", "--record", dir_.File("records"), "flood", "--jobs",
                       "250", "--batch", "100", "--clients", "2", "--inflight", "2"}),
      absl::Seconds(120));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::map<std::string, int64_t> s =
      Summary(r.out, {"['jobs']", "['calls']", "['errors']", "['batch']"});
  EXPECT_EQ(s["['jobs']"], 250);
  EXPECT_EQ(s["['calls']"], 3);
  EXPECT_EQ(s["['errors']"], 0);
  EXPECT_EQ(s["['batch']"], 100);
  std::vector<Record> records = ReadRecords(dir_.File("records"));
  ASSERT_EQ(records.size(), 250u);
  ExpectEveryJobRanOnce(records, *w);
}

TEST_F(LoadgenTest, ProbesCountEveryCallAndLeaveOutTheWarmup) {
  auto d = StartDaemon();
  ASSERT_NE(d, nullptr);
  auto w = StartWorker(*d);
  ASSERT_NE(w, nullptr);
  CommandResult submit = RunCommand(
      LoadgenArgv(*d, {"--wait-workers", "1", "--record", dir_.File("submit"), "probe", "--rpc",
                       "submit", "--count", "30", "--warmup", "5", "--rate", "200"}),
      absl::Seconds(120));
  ASSERT_EQ(submit.exit_code, 0) << submit.err;
  std::map<std::string, int64_t> s =
      Summary(submit.out, {"['jobs']", "['errors']", "['latency_us']['count']"});
  EXPECT_EQ(s["['jobs']"], 30);
  EXPECT_EQ(s["['errors']"], 0);
  EXPECT_EQ(s["['latency_us']['count']"], 25);

  CommandResult run_sync =
      RunCommand(LoadgenArgv(*d, {"--record", dir_.File("runsync"), "probe", "--rpc", "runsync",
                                  "--count", "20", "--inflight", "2", "--rate", "100"}),
                 absl::Seconds(120));
  ASSERT_EQ(run_sync.exit_code, 0) << run_sync.err;
  s = Summary(run_sync.out, {"['jobs']", "['errors']", "['latency_us']['count']"});
  EXPECT_EQ(s["['jobs']"], 20);
  EXPECT_EQ(s["['errors']"], 0);
  EXPECT_EQ(s["['latency_us']['count']"], 20);

  std::vector<Record> records = ReadRecords(dir_.File("submit"));
  std::vector<Record> more = ReadRecords(dir_.File("runsync"));
  records.insert(records.end(), more.begin(), more.end());
  ASSERT_EQ(records.size(), 50u);
  ExpectEveryJobRanOnce(records, *w);
}

TEST_F(LoadgenTest, AnUnexpectedErrorFailsTheRun) {
  auto d = StartDaemon();
  ASSERT_NE(d, nullptr);
  CommandResult r =
      RunCommand({DISPATCH_LOADGEN_BIN, "--server", d->address(), "--type", "no.such.type", "flood",
                  "--jobs", "10", "--clients", "1", "--inflight", "2"},
                 absl::Seconds(60));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("INVALID_ARGUMENT"));
  EXPECT_THAT(r.err, HasSubstr("FAILED"));
  std::map<std::string, int64_t> s = Summary(r.out, {"['jobs']", "['errors']"});
  EXPECT_EQ(s["['jobs']"], 0);
  EXPECT_GE(s["['errors']"], 1);
  EXPECT_EQ(QueryInt("SELECT count(*) FROM jobs"), 0);

  CommandResult usage = RunCommand({DISPATCH_LOADGEN_BIN, "flood", "--jobs", "10", "--batch", "0"});
  EXPECT_EQ(usage.exit_code, 2);
  EXPECT_THAT(usage.err, HasSubstr("--batch"));
}

}  // namespace
}  // namespace dispatchd::e2e
