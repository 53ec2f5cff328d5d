// Admission end to end: max_active and max_queue_depth refuse before anything is written (with a
// retry-after-ms trailer), idempotency keys deduplicate within their window, and Status says why
// a queued job waits. Real dispatchd, dispatch-worker and dispatchctl processes; row counts are
// read straight from the test's database.

#include <algorithm>
#include <chrono>
#include <latch>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "pqxx/connection"
#include "pqxx/nontransaction"
#include "pqxx/result"

#include "client/cpp/dispatch_client.h"
#include "tests/e2e/e2e_test.h"
#include "tests/e2e/harness.h"

namespace dispatchd::e2e {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// What a Submit or RunSync answered, with the trailers the server sent.
struct Answer {
  grpc::Status status;
  std::string job_id;
  bool deduplicated = false;
  std::multimap<std::string, std::string> trailers;

  // The retry-after-ms trailer as a number; -1 if missing or not a decimal number.
  int64_t RetryAfterMs() const {
    auto it = trailers.find("retry-after-ms");
    int64_t ms = -1;
    if (it == trailers.end() || it->second.empty() ||
        !std::all_of(it->second.begin(), it->second.end(), absl::ascii_isdigit) ||
        !absl::SimpleAtoi(it->second, &ms)) {
      return -1;
    }
    return ms;
  }
};

std::chrono::system_clock::time_point In(absl::Duration d) {
  return std::chrono::system_clock::now() + absl::ToChronoMilliseconds(d);
}

Answer SubmitTo(v1::JobService::Stub& stub, const v1::JobSpec& spec) {
  grpc::ClientContext ctx;
  ctx.set_deadline(In(absl::Seconds(10)));
  v1::SubmitRequest req;
  *req.mutable_spec() = spec;
  v1::SubmitResponse resp;
  Answer a;
  a.status = stub.Submit(&ctx, req, &resp);
  a.job_id = resp.job_id();
  a.deduplicated = resp.deduplicated();
  for (const auto& [k, v] : ctx.GetServerTrailingMetadata()) {
    a.trailers.emplace(std::string(k.data(), k.size()), std::string(v.data(), v.size()));
  }
  return a;
}

Answer RunSyncTo(v1::JobService::Stub& stub, const v1::JobSpec& spec, absl::Duration wait) {
  grpc::ClientContext ctx;
  ctx.set_deadline(In(wait));
  v1::RunSyncRequest req;
  *req.mutable_spec() = spec;
  v1::RunSyncResponse resp;
  Answer a;
  a.status = stub.RunSync(&ctx, req, &resp);
  a.job_id = resp.job().id();
  for (const auto& [k, v] : ctx.GetServerTrailingMetadata()) {
    a.trailers.emplace(std::string(k.data(), k.size()), std::string(v.data(), v.size()));
  }
  return a;
}

v1::JobSpec KeyedSpec(const std::string& type, const std::string& payload,
                      const std::string& idempotency_key, const std::string& fairness_key = "") {
  v1::JobSpec spec = Spec(type, payload);
  spec.set_idempotency_key(idempotency_key);
  if (!fairness_key.empty()) spec.set_fairness_key(fairness_key);
  return spec;
}

class AdmissionTest : public E2eTest {
 protected:
  // A daemon whose `types:` list and further top-level settings are `yaml` (types first).
  std::unique_ptr<Daemon> StartDaemon(const std::string& yaml) {
    return E2eTest::StartDaemon({.types = {}, .extra_yaml = yaml});
  }

  int64_t Rows() { return QueryInt("SELECT count(*) FROM jobs"); }

  // Submits `spec` until it is accepted (the gate learns of drained jobs after a loop turn).
  Answer SubmitUntilAccepted(Daemon& d, const v1::JobSpec& spec) {
    Answer a;
    WaitFor(
        [&] {
          a = SubmitTo(d.jobs(), spec);
          return a.status.error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED;
        },
        absl::Seconds(30));
    return a;
  }
};

TEST_F(AdmissionTest, MaxActiveRefusesBeyondTheCeilingWithRetryAfterAndWritesNothing) {
  auto d = StartDaemon("  - name: echo\nmax_active: 3\n");
  ASSERT_NE(d, nullptr);
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) {
    Answer a = SubmitTo(d->jobs(), Spec("echo", absl::StrCat("job ", i)));
    ASSERT_TRUE(a.status.ok()) << a.status.error_message();
    ids.push_back(a.job_id);
  }

  Answer refused = SubmitTo(d->jobs(), Spec("echo", "one too many"));
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.status.error_message(), StartsWith("max_active:"));
  EXPECT_GT(refused.RetryAfterMs(), 0) << "trailers: " << refused.trailers.size();

  // RunSync goes through the same gate, trailer included.
  Answer sync = RunSyncTo(d->jobs(), Spec("echo", "sync too"), absl::Seconds(10));
  EXPECT_EQ(sync.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(sync.status.error_message(), StartsWith("max_active:"));
  EXPECT_GT(sync.RetryAfterMs(), 0);

  // dispatchctl reports the refusal with its own exit code and the hint.
  CommandResult ctl = d->Ctl({"submit", "--type", "echo", "--payload", "ctl"});
  EXPECT_EQ(ctl.exit_code, 6) << ctl.out << ctl.err;
  EXPECT_THAT(ctl.err, HasSubstr("max_active"));
  EXPECT_THAT(ctl.err, HasSubstr("retry after"));

  // Refusals wrote nothing, and a bad spec is still INVALID_ARGUMENT, not a refusal.
  EXPECT_EQ(Rows(), 3);
  EXPECT_EQ(SubmitTo(d->jobs(), Spec("gold", "x")).status.error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);

  // Once a worker drains them, submits are accepted again.
  auto w = StartWorker(*d, {.id = "w1", .slots = 2});
  ASSERT_NE(w, nullptr);
  std::vector<v1::Job> jobs;
  ASSERT_TRUE(d->WaitForTerminal(ids, &jobs, absl::Seconds(60)));
  for (const v1::Job& j : jobs) EXPECT_EQ(j.state(), v1::JOB_STATE_SUCCEEDED) << j.id();
  Answer again = SubmitUntilAccepted(*d, Spec("echo", "after drain"));
  EXPECT_TRUE(again.status.ok()) << again.status.error_message();
  CommandResult run = d->Ctl({"run", "--type", "echo", "--payload", "hello"});
  EXPECT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(absl::StripTrailingAsciiWhitespace(run.out), "hello");
  EXPECT_EQ(Rows(), 5);
}

TEST_F(AdmissionTest, MaxQueueDepthRefusesOnlyItsTypeAndRecoversOnceDrained) {
  auto d = StartDaemon("  - name: echo\n    max_queue_depth: 2\n  - name: other\n");
  ASSERT_NE(d, nullptr);
  std::vector<std::string> ids;
  for (int i = 0; i < 2; ++i) {
    Answer a = SubmitTo(d->jobs(), Spec("echo", absl::StrCat("job ", i)));
    ASSERT_TRUE(a.status.ok()) << a.status.error_message();
    ids.push_back(a.job_id);
  }
  Answer refused = SubmitTo(d->jobs(), Spec("echo", "too deep"));
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.status.error_message(), StartsWith("max_queue_depth:"));
  EXPECT_THAT(refused.status.error_message(), HasSubstr("echo"));
  EXPECT_GT(refused.RetryAfterMs(), 0);

  Answer other = SubmitTo(d->jobs(), Spec("other", "another type"));
  EXPECT_TRUE(other.status.ok()) << other.status.error_message();
  EXPECT_EQ(Rows(), 3);
  EXPECT_EQ(QueryInt("SELECT count(*) FROM jobs WHERE type = 'echo'"), 2);

  auto w = StartWorker(*d, {.id = "w1", .types = {"echo"}, .slots = 2});
  ASSERT_NE(w, nullptr);
  std::vector<v1::Job> jobs;
  ASSERT_TRUE(d->WaitForTerminal(ids, &jobs, absl::Seconds(60)));
  Answer again = SubmitUntilAccepted(*d, Spec("echo", "after drain"));
  EXPECT_TRUE(again.status.ok()) << again.status.error_message();
  EXPECT_EQ(QueryInt("SELECT count(*) FROM jobs WHERE type = 'echo'"), 3);
}

TEST_F(AdmissionTest, ConcurrentSubmitsNeverOvershootMaxActive) {
  auto d = StartDaemon("  - name: echo\nmax_active: 5\n");
  ASSERT_NE(d, nullptr);
  constexpr int kClients = 20;
  std::vector<Answer> answers(kClients);
  std::latch start(kClients);
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      // A channel each, so that the calls really travel at once.
      auto stub = v1::JobService::NewStub(grpc::CreateCustomChannel(
          d->address(), grpc::InsecureChannelCredentials(), client::DaemonChannelArguments()));
      start.arrive_and_wait();
      answers[i] = SubmitTo(*stub, Spec("echo", absl::StrCat("client ", i)));
    });
  }
  for (std::thread& t : threads) t.join();
  int accepted = 0, refused = 0;
  for (const Answer& a : answers) {
    if (a.status.ok()) {
      ++accepted;
    } else {
      EXPECT_EQ(a.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
          << a.status.error_message();
      EXPECT_THAT(a.status.error_message(), StartsWith("max_active:"));
      EXPECT_GT(a.RetryAfterMs(), 0);
      ++refused;
    }
  }
  EXPECT_EQ(accepted, 5);
  EXPECT_EQ(refused, kClients - 5);
  EXPECT_EQ(Rows(), 5);
}

TEST_F(AdmissionTest, RepeatedIdempotencyKeyReturnsTheSameJobMarkedDeduplicated) {
  auto d = StartDaemon("  - name: echo\nmax_active: 2\n");
  ASSERT_NE(d, nullptr);
  Answer first = SubmitTo(d->jobs(), KeyedSpec("echo", "order", "order-1"));
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  EXPECT_FALSE(first.deduplicated);
  Answer again = SubmitTo(d->jobs(), KeyedSpec("echo", "order", "order-1"));
  ASSERT_TRUE(again.status.ok()) << again.status.error_message();
  EXPECT_TRUE(again.deduplicated);
  EXPECT_EQ(again.job_id, first.job_id);

  // dispatchctl from the same host is the same caller: it gets the same job.
  CommandResult ctl =
      d->Ctl({"submit", "--type", "echo", "--payload", "order", "--idempotency-key", "order-1"});
  EXPECT_EQ(ctl.exit_code, 0) << ctl.err;
  EXPECT_EQ(absl::StripTrailingAsciiWhitespace(ctl.out),
            absl::StrCat(first.job_id, " (deduplicated)"));

  // Another fairness key with the same idempotency key is another job.
  Answer bob = SubmitTo(d->jobs(), KeyedSpec("echo", "order", "order-1", "bob"));
  ASSERT_TRUE(bob.status.ok()) << bob.status.error_message();
  EXPECT_FALSE(bob.deduplicated);
  EXPECT_NE(bob.job_id, first.job_id);
  EXPECT_EQ(Rows(), 2);

  // Repeats held no admission room: at max_active 2 with both jobs active, a new job is refused
  // (the reservations of the duplicates were given back, not leaked)...
  Answer full = SubmitTo(d->jobs(), Spec("echo", "new work"));
  EXPECT_EQ(full.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  // ...and after the jobs end, within the default 24h window, a repeat is still the same job.
  auto w = StartWorker(*d, {.id = "w1"});
  ASSERT_NE(w, nullptr);
  std::vector<v1::Job> jobs;
  ASSERT_TRUE(d->WaitForTerminal({first.job_id, bob.job_id}, &jobs, absl::Seconds(60)));
  Answer after = SubmitUntilAccepted(*d, KeyedSpec("echo", "order", "order-1"));
  ASSERT_TRUE(after.status.ok()) << after.status.error_message();
  EXPECT_TRUE(after.deduplicated);
  EXPECT_EQ(after.job_id, first.job_id);
  // RunSync with the key answers with the finished job at once.
  Answer sync = RunSyncTo(d->jobs(), KeyedSpec("echo", "order", "order-1"), absl::Seconds(10));
  ASSERT_TRUE(sync.status.ok()) << sync.status.error_message();
  EXPECT_EQ(sync.job_id, first.job_id);
  // And the gate gave every duplicate's room back: two new jobs fit under max_active 2.
  for (int i = 0; i < 2; ++i) {
    Answer a = SubmitUntilAccepted(*d, Spec("echo", absl::StrCat("fresh ", i)));
    EXPECT_TRUE(a.status.ok()) << a.status.error_message();
  }
  EXPECT_EQ(Rows(), 4);
}

TEST_F(AdmissionTest, IdempotencyKeyIsFreeAgainAfterTheWindow) {
  auto d = StartDaemon("  - name: echo\nidempotency_window: 1s\n");
  ASSERT_NE(d, nullptr);
  auto w = StartWorker(*d, {.id = "w1"});
  ASSERT_NE(w, nullptr);
  ASSERT_TRUE(d->WaitForWorkers(1));
  Answer first = SubmitTo(d->jobs(), KeyedSpec("echo", "nightly", "report-7"));
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  std::vector<v1::Job> jobs;
  ASSERT_TRUE(d->WaitForTerminal({first.job_id}, &jobs, absl::Seconds(60)));
  ASSERT_EQ(jobs[0].state(), v1::JOB_STATE_SUCCEEDED);

  // The key is free once the 1 s window has passed and the release sweep (about once a second)
  // has run; until then the same submit is answered as a duplicate and changes nothing.
  Answer later;
  bool fresh = WaitFor(
      [&] {
        later = SubmitTo(d->jobs(), KeyedSpec("echo", "nightly", "report-7"));
        return later.status.ok() && !later.deduplicated;
      },
      absl::Seconds(15));
  ASSERT_TRUE(fresh) << later.status.error_message() << " deduplicated=" << later.deduplicated;
  EXPECT_NE(later.job_id, first.job_id);
  ASSERT_TRUE(d->WaitForTerminal({later.job_id}, &jobs, absl::Seconds(60)));
  EXPECT_EQ(jobs[0].state(), v1::JOB_STATE_SUCCEEDED);
  // The old job is still readable; the new one now holds the key.
  absl::StatusOr<v1::Job> old = d->Status(first.job_id);
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_EQ(old->state(), v1::JOB_STATE_SUCCEEDED);
  Answer repeat = SubmitTo(d->jobs(), KeyedSpec("echo", "nightly", "report-7"));
  ASSERT_TRUE(repeat.status.ok());
  if (repeat.deduplicated) {
    EXPECT_EQ(repeat.job_id, later.job_id);
  }
  EXPECT_EQ(QueryInt("SELECT count(*) FROM jobs "
                     "WHERE idempotency_key = 'report-7'"),
            repeat.deduplicated ? 2 : 3);
}

// What a SubmitBatch answered.
struct BatchAnswer {
  grpc::Status status;
  v1::SubmitBatchResponse resp;
  std::multimap<std::string, std::string> trailers;
};

BatchAnswer SubmitBatchTo(v1::JobService::Stub& stub, const std::vector<v1::JobSpec>& specs) {
  grpc::ClientContext ctx;
  ctx.set_deadline(In(absl::Seconds(20)));
  v1::SubmitBatchRequest req;
  for (const v1::JobSpec& spec : specs) *req.add_specs() = spec;
  BatchAnswer a;
  a.status = stub.SubmitBatch(&ctx, req, &a.resp);
  for (const auto& [k, v] : ctx.GetServerTrailingMetadata()) {
    a.trailers.emplace(std::string(k.data(), k.size()), std::string(v.data(), v.size()));
  }
  return a;
}

TEST_F(AdmissionTest, SubmitBatchQueuesEveryJobInItsOrderAndEachRunsOnce) {
  auto d = StartDaemon("  - name: echo\n");
  ASSERT_NE(d, nullptr);
  std::vector<v1::JobSpec> specs;
  for (int i = 0; i < 200; ++i) specs.push_back(Spec("echo", absl::StrCat("batch job ", i)));
  BatchAnswer a = SubmitBatchTo(d->jobs(), specs);
  ASSERT_TRUE(a.status.ok()) << a.status.error_message();
  ASSERT_EQ(a.resp.results_size(), 200);
  std::vector<std::string> ids;
  for (const v1::SubmitResponse& r : a.resp.results()) {
    EXPECT_FALSE(r.deduplicated());
    ids.push_back(r.job_id());
  }
  // Committed before the answer, in the request's order.
  pqxx::connection conn(db().url());
  pqxx::nontransaction txn(conn);
  std::vector<std::string> stored;
  for (const pqxx::row& row : txn.exec("SELECT id FROM jobs ORDER BY seq")) {
    stored.push_back(row[0].as<std::string>());
  }
  EXPECT_EQ(stored, ids);

  auto w = StartWorker(*d, {.id = "w1", .slots = 8});
  ASSERT_NE(w, nullptr);
  std::vector<v1::Job> jobs;
  ASSERT_TRUE(d->WaitForTerminal(ids, &jobs, absl::Seconds(60)));
  for (size_t i = 0; i < jobs.size(); ++i) {
    EXPECT_EQ(jobs[i].state(), v1::JOB_STATE_SUCCEEDED) << jobs[i].id();
    EXPECT_EQ(jobs[i].result(), absl::StrCat("batch job ", i));
  }
  int starts = 0;
  for (const JournalEvent& e : ReadJournal(w->journal_path(), "w1")) starts += e.start ? 1 : 0;
  EXPECT_EQ(starts, 200);
}

TEST_F(AdmissionTest, SubmitBatchRefusesABadSpecByItsIndexAndWritesNothing) {
  auto d = StartDaemon("  - name: echo\n");
  ASSERT_NE(d, nullptr);
  std::vector<v1::JobSpec> specs = {Spec("echo", "a"), Spec("echo", "b"), Spec("echo", "c"),
                                    Spec("gold", "d"), Spec("echo", "e")};
  BatchAnswer bad = SubmitBatchTo(d->jobs(), specs);
  EXPECT_EQ(bad.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(bad.status.error_message(), StartsWith("specs[3].type: unknown job type \"gold\""));

  specs[3] = Spec("echo", "");
  bad = SubmitBatchTo(d->jobs(), specs);
  EXPECT_EQ(bad.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(bad.status.error_message(), StartsWith("specs[3].payload:"));

  BatchAnswer empty = SubmitBatchTo(d->jobs(), {});
  EXPECT_EQ(empty.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(empty.status.error_message(), StartsWith("specs: between 1 and 10000 jobs, got 0"));
  EXPECT_EQ(Rows(), 0);

  // The daemon still serves.
  specs[3] = Spec("echo", "d");
  BatchAnswer good = SubmitBatchTo(d->jobs(), specs);
  ASSERT_TRUE(good.status.ok()) << good.status.error_message();
  EXPECT_EQ(Rows(), 5);
}

TEST_F(AdmissionTest, SubmitBatchIsAdmittedWhollyOrNotAtAll) {
  auto d = StartDaemon("  - name: echo\n  - name: other\n    max_queue_depth: 2\nmax_active: 5\n");
  ASSERT_NE(d, nullptr);
  std::vector<v1::JobSpec> six(6, Spec("echo", "x"));
  BatchAnswer refused = SubmitBatchTo(d->jobs(), six);
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.status.error_message(), StartsWith("max_active:"));
  EXPECT_EQ(refused.trailers.count("retry-after-ms"), 1u);
  EXPECT_EQ(Rows(), 0);

  // A type's queue depth counts too: the third "other" job sinks the batch.
  std::vector<v1::JobSpec> mixed = {Spec("echo", "1"), Spec("other", "2"), Spec("other", "3"),
                                    Spec("other", "4")};
  refused = SubmitBatchTo(d->jobs(), mixed);
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.status.error_message(), StartsWith("max_queue_depth:"));
  EXPECT_EQ(Rows(), 0);

  // The refusals held no room: five fit exactly, and then nothing more.
  six.pop_back();
  BatchAnswer five = SubmitBatchTo(d->jobs(), six);
  ASSERT_TRUE(five.status.ok()) << five.status.error_message();
  EXPECT_EQ(five.resp.results_size(), 5);
  EXPECT_EQ(SubmitTo(d->jobs(), Spec("echo", "sixth")).status.error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(Rows(), 5);
}

TEST_F(AdmissionTest, SubmitBatchDeduplicatesRepeatedKeysWithinAndAcrossCalls) {
  // Admission reserves room for every spec before the insert finds the repeats (as for Submit),
  // so the batch needs room for all four.
  auto d = StartDaemon("  - name: echo\nmax_active: 5\n");
  ASSERT_NE(d, nullptr);
  Answer held = SubmitTo(d->jobs(), KeyedSpec("echo", "first", "k1"));
  ASSERT_TRUE(held.status.ok()) << held.status.error_message();
  BatchAnswer a = SubmitBatchTo(
      d->jobs(), {KeyedSpec("echo", "again", "k1"), KeyedSpec("echo", "new", "k2"),
                  KeyedSpec("echo", "new again", "k2"), KeyedSpec("echo", "bob", "k1", "bob")});
  ASSERT_TRUE(a.status.ok()) << a.status.error_message();
  ASSERT_EQ(a.resp.results_size(), 4);
  EXPECT_TRUE(a.resp.results(0).deduplicated());
  EXPECT_EQ(a.resp.results(0).job_id(), held.job_id);
  EXPECT_FALSE(a.resp.results(1).deduplicated());
  EXPECT_TRUE(a.resp.results(2).deduplicated());
  EXPECT_EQ(a.resp.results(2).job_id(), a.resp.results(1).job_id());
  EXPECT_FALSE(a.resp.results(3).deduplicated());
  EXPECT_EQ(Rows(), 3);
  // The duplicates' admission room was given back: two more jobs fit under max_active 5, and
  // then no more.
  for (int i = 0; i < 2; ++i) {
    Answer more = SubmitTo(d->jobs(), Spec("echo", absl::StrCat("more ", i)));
    EXPECT_TRUE(more.status.ok()) << more.status.error_message();
  }
  EXPECT_EQ(SubmitTo(d->jobs(), Spec("echo", "full")).status.error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(Rows(), 5);
}

// Many Submit calls in flight at once share transactions (group commit), and still each returns
// only once its own row is committed. Rows written by one transaction share its xmin.
TEST_F(AdmissionTest, ConcurrentSubmitsShareCommitsAndEachIsDurableWhenAcknowledged) {
  auto d = StartDaemon("  - name: echo\n");
  ASSERT_NE(d, nullptr);
  constexpr int kThreads = 8;
  constexpr int kPerThread = 100;
  std::vector<std::vector<std::string>> ids(kThreads);
  std::vector<int> missing(kThreads, 0);
  std::latch go(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      // Each thread keeps 25 calls in flight on the async API.
      pqxx::connection conn(db().url());
      grpc::CompletionQueue cq;
      struct Call {
        grpc::ClientContext ctx;
        v1::SubmitResponse resp;
        grpc::Status status;
      };
      std::vector<std::unique_ptr<Call>> calls;
      int sent = 0, done = 0;
      auto send = [&] {
        auto call = std::make_unique<Call>();
        call->ctx.set_deadline(In(absl::Seconds(30)));
        v1::SubmitRequest req;
        *req.mutable_spec() = Spec("echo", absl::StrCat("t", t, " n", sent));
        auto rpc = d->jobs().AsyncSubmit(&call->ctx, req, &cq);
        rpc->Finish(&call->resp, &call->status, call.get());
        calls.push_back(std::move(call));
        ++sent;
      };
      go.arrive_and_wait();
      while (sent < 25) send();
      void* tag;
      bool ok;
      while (done < kPerThread && cq.Next(&tag, &ok)) {
        auto* call = static_cast<Call*>(tag);
        ++done;
        if (call->status.ok()) {
          // Acknowledged: the row must already be committed, seen from another session.
          pqxx::nontransaction txn(conn);
          if (txn.exec_params("SELECT 1 FROM jobs WHERE id = $1", call->resp.job_id()).empty()) {
            ++missing[t];
          }
          ids[t].push_back(call->resp.job_id());
        }
        if (sent < kPerThread) send();
      }
      cq.Shutdown();
      while (cq.Next(&tag, &ok)) {
      }
    });
  }
  for (std::thread& t : threads) t.join();
  int acknowledged = 0;
  for (int t = 0; t < kThreads; ++t) {
    acknowledged += static_cast<int>(ids[t].size());
    EXPECT_EQ(missing[t], 0) << "thread " << t;
  }
  EXPECT_EQ(acknowledged, kThreads * kPerThread);
  EXPECT_EQ(Rows(), kThreads * kPerThread);
  const int64_t transactions = QueryInt("SELECT count(DISTINCT xmin::text) FROM jobs_active");
  EXPECT_LT(transactions, kThreads * kPerThread / 2)
      << "800 concurrent submits were written by " << transactions << " transactions";
}

TEST_F(AdmissionTest, StatusSaysWhyAQueuedJobWaitsAndWhereItStands) {
  auto d = StartDaemon("  - name: echo\n  - name: gpu\n");
  ASSERT_NE(d, nullptr);
  auto w = StartWorker(
      *d, {.id = "w1", .types = {"echo"}, .slots = 1, .mode = {"--simulate", "100%:60s"}});
  ASSERT_NE(w, nullptr);
  ASSERT_TRUE(d->WaitForWorkers(1));

  // No connected worker serves "gpu".
  absl::StatusOr<std::string> gpu = d->Submit(Spec("gpu", "needs a gpu"));
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  absl::StatusOr<v1::Job> gpu_job = d->Status(*gpu);
  ASSERT_TRUE(gpu_job.ok()) << gpu_job.status();
  EXPECT_EQ(gpu_job->state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(gpu_job->wait_reason(), "no_worker");
  EXPECT_EQ(gpu_job->queue_position(), 1);
  EXPECT_EQ(gpu_job->keys_ahead(), 0);

  // The only echo slot is busy with a long job.
  absl::StatusOr<std::string> busy = d->Submit(Spec("echo", "long"));
  ASSERT_TRUE(busy.ok()) << busy.status();
  ASSERT_TRUE(WaitFor(
      [&] {
        absl::StatusOr<v1::Job> j = d->Status(*busy);
        return j.ok() && j->state() == v1::JOB_STATE_RUNNING;
      },
      absl::Seconds(30)));
  absl::StatusOr<v1::Job> running = d->Status(*busy);
  ASSERT_TRUE(running.ok());
  EXPECT_EQ(running->wait_reason(), "");  // only queued jobs wait
  EXPECT_EQ(running->queue_position(), 0);

  absl::StatusOr<std::string> next = d->Submit(Spec("echo", "next"));
  absl::StatusOr<std::string> after = d->Submit(Spec("echo", "after"));
  ASSERT_TRUE(next.ok() && after.ok());
  absl::StatusOr<v1::Job> next_job = d->Status(*next);
  ASSERT_TRUE(next_job.ok()) << next_job.status();
  EXPECT_EQ(next_job->state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(next_job->wait_reason(), "workers_busy");
  EXPECT_EQ(next_job->queue_position(), 1);
  absl::StatusOr<v1::Job> after_job = d->Status(*after);
  ASSERT_TRUE(after_job.ok()) << after_job.status();
  EXPECT_EQ(after_job->wait_reason(), "workers_busy");
  EXPECT_EQ(after_job->queue_position(), 2);
  EXPECT_EQ(after_job->keys_ahead(), 0);

  // The wait fields travel in dispatchctl's JSON too.
  CommandResult json = d->Ctl({"--json", "status", *after});
  EXPECT_EQ(json.exit_code, 4) << json.err;  // still active
  EXPECT_THAT(json.out, HasSubstr("workers_busy"));
}

}  // namespace
}  // namespace dispatchd::e2e
