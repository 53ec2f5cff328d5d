#include "server/store/pg_rows.h"

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pqxx/array"

#include "lib/job/job.h"
#include "server/store/job_store.h"
#include "server/store/pg_statements.h"
#include "tests/testing/status_matchers.h"

namespace dispatchd::store {
namespace {

using ::dispatchd::testing::IsOk;
using ::dispatchd::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::Pair;
using ::testing::UnorderedElementsAre;

MATCHER_P(IsOkAndHolds, matcher, "is OK and holds a matching value") {
  if (!arg.ok()) {
    *result_listener << "status is " << arg.status().ToString();
    return false;
  }
  return ::testing::ExplainMatchResult(matcher, *arg, result_listener);
}

// A row of every column of a job, as PostgreSQL prints them, for a running job with labels.
TextRow FullRow() {
  TextRow row(kColCount);
  row[kColId] = "job-1";
  row[kColType] = "render";
  row[kColPayload] = "\\x7061796c6f6164";  // "payload"
  row[kColResourceId] = "gpu-7";
  row[kColFairnessKey] = "tenant-a";
  row[kColIdempotencyKey] = "key-9";
  row[kColMaxAttempts] = "5";
  row[kColTimeoutMs] = "30000";
  row[kColDispatchDeadlineUs] = "2500000";
  row[kColNotBeforeUs] = "1700000000000001";
  row[kColLabels] = R"({{env,prod},{"team name","a,b"}})";
  row[kColState] = "RUNNING";
  row[kColAttempt] = "2";
  row[kColWorkerId] = "worker-3";
  row[kColResult] = "\\x";
  row[kColError] = "last try timed out";
  row[kColCreatedUs] = "1700000000000000";
  row[kColDispatchedUs] = "1700000000100000";
  row[kColStartedUs] = "1700000000200000";
  row[kColFinishedUs] = std::nullopt;
  row[kColUpdatedUs] = "1700000000300000";
  row[kColOwner] = "alice";
  row[kColSeq] = "42";
  // Attempt 1 ran on worker-1 and was retried; its started time is known.
  row[kColAttempts] =
      R"({{1,worker-1,1699999999000000,1699999999100000,1699999999500000,"out of memory, GPU 0"}})";
  return row;
}

TEST(JobFromRowTest, FullRowConvertsToTheJobItDescribes) {
  absl::StatusOr<job::Job> job = JobFromRow(FullRow());
  ASSERT_THAT(job, IsOk());
  EXPECT_EQ(job->id, "job-1");
  EXPECT_EQ(job->spec.type, "render");
  EXPECT_EQ(job->spec.payload, "payload");
  EXPECT_EQ(job->spec.resource_id, "gpu-7");
  EXPECT_EQ(job->spec.fairness_key, "tenant-a");
  EXPECT_EQ(job->spec.idempotency_key, "key-9");
  EXPECT_EQ(job->spec.max_attempts, 5);
  EXPECT_EQ(job->spec.timeout, absl::Seconds(30));
  EXPECT_EQ(job->spec.dispatch_deadline, absl::Milliseconds(2500));
  EXPECT_EQ(job->spec.not_before, absl::FromUnixMicros(1700000000000001));
  EXPECT_THAT(job->spec.labels,
              UnorderedElementsAre(Pair("env", "prod"), Pair("team name", "a,b")));
  EXPECT_EQ(job->state, job::JobState::kRunning);
  EXPECT_EQ(job->attempt, 2);
  EXPECT_EQ(job->worker_id, "worker-3");
  EXPECT_EQ(job->result, "");
  EXPECT_EQ(job->error, "last try timed out");
  EXPECT_EQ(job->created_at, absl::FromUnixSeconds(1700000000));
  EXPECT_EQ(job->dispatched_at, absl::FromUnixMillis(1700000000100));
  EXPECT_EQ(job->started_at, absl::FromUnixMillis(1700000000200));
  EXPECT_EQ(job->finished_at, absl::InfinitePast());
  EXPECT_EQ(job->updated_at, absl::FromUnixMillis(1700000000300));
  EXPECT_EQ(job->owner, "alice");
  EXPECT_EQ(job->seq, 42);
  ASSERT_EQ(job->earlier_attempts.size(), 1u);
  const job::EndedAttempt& first = job->earlier_attempts[0];
  EXPECT_EQ(first.attempt, 1);
  EXPECT_EQ(first.worker_id, "worker-1");
  EXPECT_EQ(first.dispatched_at, absl::FromUnixSeconds(1699999999));
  EXPECT_EQ(first.started_at, absl::FromUnixMillis(1699999999100));
  EXPECT_EQ(first.ended_at, absl::FromUnixMillis(1699999999500));
  EXPECT_EQ(first.error, "out of memory, GPU 0");
}

TEST(JobFromRowTest, AnAttemptThatFailedBeforeItsAcceptHasNoStartTime) {
  TextRow row = FullRow();
  row[kColAttempts] =
      R"({{1,worker-1,1699999999000000,"",1699999999500000,lost},{2,"",10,"",20,""}})";
  absl::StatusOr<job::Job> job = JobFromRow(row);
  ASSERT_THAT(job, IsOk());
  ASSERT_EQ(job->earlier_attempts.size(), 2u);
  EXPECT_EQ(job->earlier_attempts[0].started_at, absl::InfinitePast());
  EXPECT_EQ(job->earlier_attempts[0].error, "lost");
  EXPECT_EQ(job->earlier_attempts[1].attempt, 2);
  EXPECT_EQ(job->earlier_attempts[1].worker_id, "");
  EXPECT_EQ(job->earlier_attempts[1].ended_at, absl::FromUnixMicros(20));
}

TEST(JobFromRowTest, MalformedAttemptsAreInternalNamingTheJob) {
  TextRow row = FullRow();
  row[kColAttempts] = "{{1,worker-1,10,20,30}}";  // five fields
  EXPECT_THAT(JobFromRow(row), StatusIs(absl::StatusCode::kInternal,
                                        "job job-1: attempts: want six fields per attempt"));
  row[kColAttempts] = "{{one,worker-1,10,20,30,x}}";
  EXPECT_THAT(JobFromRow(row), StatusIs(absl::StatusCode::kInternal,
                                        "job job-1: attempts: not an attempt number: \"one\""));
  row[kColAttempts] = "{{1,worker-1,soon,20,30,x}}";
  EXPECT_THAT(JobFromRow(row), StatusIs(absl::StatusCode::kInternal,
                                        "job job-1: attempts: not a time in us: \"soon\""));
}

TEST(JobFromRowTest, NullsReadAsNone) {
  TextRow row = FullRow();
  for (Col col :
       {kColPayload, kColResourceId, kColFairnessKey, kColIdempotencyKey, kColDispatchDeadlineUs,
        kColNotBeforeUs, kColLabels, kColWorkerId, kColResult, kColError, kColDispatchedUs,
        kColStartedUs, kColFinishedUs, kColUpdatedUs, kColOwner, kColAttempts}) {
    row[col] = std::nullopt;
  }
  absl::StatusOr<job::Job> job = JobFromRow(row);
  ASSERT_THAT(job, IsOk());
  EXPECT_EQ(job->spec.payload, "");
  EXPECT_EQ(job->spec.resource_id, "");
  EXPECT_EQ(job->spec.fairness_key, "");
  EXPECT_EQ(job->spec.idempotency_key, "");
  EXPECT_EQ(job->spec.dispatch_deadline, absl::InfiniteDuration());
  EXPECT_EQ(job->spec.not_before, absl::InfinitePast());
  EXPECT_TRUE(job->spec.labels.empty());
  EXPECT_EQ(job->worker_id, "");
  EXPECT_EQ(job->result, "");
  EXPECT_EQ(job->error, "");
  EXPECT_EQ(job->dispatched_at, absl::InfinitePast());
  EXPECT_EQ(job->started_at, absl::InfinitePast());
  EXPECT_EQ(job->finished_at, absl::InfinitePast());
  EXPECT_EQ(job->updated_at, absl::InfinitePast());
  EXPECT_EQ(job->owner, "");
  EXPECT_TRUE(job->earlier_attempts.empty());
}

TEST(JobFromRowTest, CellsPastTheJobsColumnsAreIgnored) {
  TextRow row = FullRow();
  row.push_back("7");  // e.g. the queue length LoadQueuedHeads reads
  absl::StatusOr<job::Job> job = JobFromRow(row);
  ASSERT_THAT(job, IsOk());
  EXPECT_EQ(job->seq, 42);
  EXPECT_EQ(job->earlier_attempts.size(), 1u);
}

TEST(JobFromRowTest, ByteaWithZeroAndFfBytesRoundTrips) {
  const std::string bytes("\x00\xff\x00\x7f\x80", 5);
  job::Job written;
  written.spec.payload = bytes;
  // The store writes payloads as hex and PostgreSQL prints bytea as "\x" and hex.
  const InsertColumns columns({&written});
  ASSERT_EQ(columns.payloads_hex.size(), 1u);
  const std::string printed = "\\x" + columns.payloads_hex[0];
  TextRow row = FullRow();
  row[kColPayload] = printed;
  row[kColResult] = printed;
  absl::StatusOr<job::Job> job = JobFromRow(row);
  ASSERT_THAT(job, IsOk());
  EXPECT_EQ(job->spec.payload, bytes);
  EXPECT_EQ(job->result, bytes);
}

TEST(JobFromRowTest, ByteaInEscapeFormatReads) {
  TextRow row = FullRow();
  row[kColPayload] = "\\000\\377a";  // bytea_output = 'escape'
  absl::StatusOr<job::Job> job = JobFromRow(row);
  ASSERT_THAT(job, IsOk());
  EXPECT_EQ(job->spec.payload, std::string("\x00\xff"
                                           "a",
                                           3));
}

TEST(JobFromRowTest, OddNumberOfLabelCellsIsInternalNamingTheJob) {
  TextRow row = FullRow();
  row[kColLabels] = "{{env,prod},{lonely}}";
  EXPECT_THAT(JobFromRow(row),
              StatusIs(absl::StatusCode::kInternal, "job job-1: malformed labels"));
}

TEST(JobFromRowTest, NullLabelIsInternalNamingTheJobAndColumn) {
  TextRow row = FullRow();
  row[kColLabels] = "{{env,NULL}}";
  EXPECT_THAT(JobFromRow(row), StatusIs(absl::StatusCode::kInternal, "job job-1: labels: "));
}

TEST(JobFromRowTest, UnknownStateIsInternalNamingTheJob) {
  TextRow row = FullRow();
  row[kColState] = "PAUSED";
  EXPECT_THAT(JobFromRow(row),
              StatusIs(absl::StatusCode::kInternal, "job job-1: unknown state \"PAUSED\""));
}

TEST(JobFromRowTest, NonNumericAttemptIsInternalNamingTheColumn) {
  TextRow row = FullRow();
  row[kColAttempt] = "two";
  EXPECT_THAT(JobFromRow(row),
              StatusIs(absl::StatusCode::kInternal, "job job-1: attempt: not an integer"));
}

TEST(JobFromRowTest, MaxAttemptsPastInt32IsInternalNamingTheColumn) {
  TextRow row = FullRow();
  row[kColMaxAttempts] = "2147483648";
  EXPECT_THAT(JobFromRow(row), StatusIs(absl::StatusCode::kInternal, "max_attempts"));
}

TEST(JobFromRowTest, MalformedTimeIsInternalNamingTheColumn) {
  TextRow row = FullRow();
  row[kColCreatedUs] = "2023-11-14 22:13:20+00";
  EXPECT_THAT(JobFromRow(row),
              StatusIs(absl::StatusCode::kInternal, "job job-1: created_us: not an integer"));
}

TEST(JobFromRowTest, NullSeqIsInternalNamingTheColumn) {
  TextRow row = FullRow();
  row[kColSeq] = std::nullopt;
  EXPECT_THAT(JobFromRow(row), StatusIs(absl::StatusCode::kInternal, "job job-1: seq: "));
}

TEST(JobFromRowTest, ShortRowIsInternal) {
  TextRow row = FullRow();
  row.pop_back();
  EXPECT_THAT(JobFromRow(row), StatusIs(absl::StatusCode::kInternal, "23 columns"));
}

TEST(RefFromRowTest, RowConvertsToTheRef) {
  absl::StatusOr<JobRef> ref = RefFromRow({"job-1", "DISPATCHED", "3", "worker-2", "1000001"});
  ASSERT_THAT(ref, IsOk());
  EXPECT_EQ(ref->job_id, "job-1");
  EXPECT_EQ(ref->state, job::JobState::kDispatched);
  EXPECT_EQ(ref->attempt, 3);
  EXPECT_EQ(ref->worker_id, "worker-2");
  EXPECT_EQ(ref->updated_at, absl::FromUnixMicros(1000001));
}

TEST(RefFromRowTest, NullWorkerAndTimeReadAsNone) {
  absl::StatusOr<JobRef> ref = RefFromRow({"job-1", "QUEUED", "0", std::nullopt, std::nullopt});
  ASSERT_THAT(ref, IsOk());
  EXPECT_EQ(ref->worker_id, "");
  EXPECT_EQ(ref->updated_at, absl::InfinitePast());
}

TEST(RefFromRowTest, NonNumericAttemptIsInternalNamingTheJobAndColumn) {
  EXPECT_THAT(RefFromRow({"job-1", "RUNNING", "x", "w", "1"}),
              StatusIs(absl::StatusCode::kInternal, "job job-1: attempt: not an integer"));
}

// What the parser of libpqxx reads back from a literal, as PostgreSQL would.
std::vector<std::string> Parse(const std::string& literal) {
  std::vector<std::string> out;
  pqxx::array_parser parser(literal.c_str());
  while (true) {
    auto [juncture, value] = parser.get_next();
    if (juncture == pqxx::array_parser::done) return out;
    if (juncture == pqxx::array_parser::null_value) out.push_back("<SQL NULL>");
    if (juncture == pqxx::array_parser::string_value) out.push_back(std::move(value));
  }
}

TEST(TextArrayLiteralTest, EveryItemReadsBackVerbatim) {
  const std::vector<std::string> items = {"plain",    "say \"hi\"", "back\\slash", "a,b",
                                          "{braces}", "NULL",       "null",        "",
                                          " padded ", "trailing\\", "\"",          "grüße, 日本"};
  const std::string literal = TextArrayLiteral(items);
  EXPECT_EQ(Parse(literal), items) << literal;
  EXPECT_THAT(TextArrayFromCell(literal), IsOkAndHolds(items));
}

TEST(TextArrayLiteralTest, NoItemsIsTheEmptyArray) {
  EXPECT_EQ(TextArrayLiteral({}), "{}");
  EXPECT_TRUE(Parse(TextArrayLiteral({})).empty());
  EXPECT_EQ(Parse(TextArrayLiteral({""})), std::vector<std::string>{""});
}

TEST(TextArrayFromCellTest, NullCellIsNoItemsAndNullElementIsInternal) {
  EXPECT_THAT(TextArrayFromCell(std::nullopt), IsOkAndHolds(::testing::IsEmpty()));
  EXPECT_THAT(TextArrayFromCell("{a,NULL}"), StatusIs(absl::StatusCode::kInternal));
}

TEST(IntArrayLiteralTest, IntegersAndAbsentOnes) {
  EXPECT_EQ(IntArrayLiteral(std::vector<int32_t>{1, -2, 0}), "{1,-2,0}");
  EXPECT_EQ(IntArrayLiteral(std::vector<int64_t>{}), "{}");
  EXPECT_EQ(OptionalIntArrayLiteral({5, std::nullopt, -1}), "{5,NULL,-1}");
}

TEST(OptionalMicrosTest, InfinitePastIsNull) {
  EXPECT_EQ(OptionalMicros(absl::InfinitePast()), std::nullopt);
  EXPECT_EQ(OptionalMicros(absl::FromUnixMicros(-7)), -7);
  EXPECT_EQ(OptionalMicros(absl::FromUnixMicros(1700000000000001)), 1700000000000001);
}

TEST(InsertColumnsTest, OneElementPerJobInOrder) {
  job::Job a;
  a.id = "a";
  a.owner = "alice";
  a.spec.type = "t";
  a.spec.labels = {{"k\"1", "v,1"}, {"k2", ""}};
  a.spec.max_attempts = 3;
  a.spec.timeout = absl::Milliseconds(1500);
  a.spec.dispatch_deadline = absl::Microseconds(7);
  a.spec.not_before = absl::FromUnixMicros(9);
  job::Job b;
  b.id = "b";
  const InsertColumns c({&a, &b});
  EXPECT_THAT(c.ids, ElementsAre("a", "b"));
  EXPECT_THAT(c.owners, ElementsAre("alice", ""));
  // Keys and values in two parallel arrays, in the (unspecified) order of the map.
  ASSERT_EQ(c.label_keys.size(), 2u);
  ASSERT_EQ(c.label_values.size(), 2u);
  const std::vector<std::string> keys = Parse(c.label_keys[0]);
  const std::vector<std::string> values = Parse(c.label_values[0]);
  ASSERT_EQ(keys.size(), values.size());
  std::vector<std::pair<std::string, std::string>> labels;
  for (size_t i = 0; i < keys.size(); ++i) labels.emplace_back(keys[i], values[i]);
  EXPECT_THAT(labels, UnorderedElementsAre(Pair("k\"1", "v,1"), Pair("k2", "")));
  EXPECT_EQ(c.label_keys[1], "{}");
  EXPECT_EQ(c.label_values[1], "{}");
  EXPECT_THAT(c.max_attempts, ElementsAre(3, 0));
  EXPECT_THAT(c.timeouts_ms, ElementsAre(1500, 0));
  EXPECT_THAT(c.deadlines_us, ElementsAre(7, std::nullopt));
  EXPECT_THAT(c.not_befores_us, ElementsAre(9, std::nullopt));
}

TEST(BatchColumnsTest, ArraysOfIdsAttemptsAndWorkers) {
  const BatchColumns c(std::vector<ClaimRequest>{{.job_id = "a", .attempt = 0, .worker_id = "w1"},
                                                 {.job_id = "b", .attempt = 2, .worker_id = "w2"}});
  EXPECT_EQ(c.ids, R"({"a","b"})");
  EXPECT_EQ(c.attempts, "{0,2}");
  EXPECT_EQ(c.workers, R"({"w1","w2"})");
}

TEST(FinishColumnsTest, UnknownOrNegativeRunTimeIsMinusOne) {
  const FinishColumns c(std::vector<FinishRequest>{
      {.job_id = "a",
       .attempt = 1,
       .state = job::JobState::kSucceeded,
       .result = "\xff",
       .ran = absl::Milliseconds(3)},
      {.job_id = "b", .attempt = 2, .state = job::JobState::kFailed, .error = "boom"},
      {.job_id = "c", .attempt = 1, .state = job::JobState::kCancelled, .ran = -absl::Seconds(1)}});
  EXPECT_EQ(c.ids, R"({"a","b","c"})");
  EXPECT_EQ(c.attempts, "{1,2,1}");
  EXPECT_EQ(c.states, R"({"SUCCEEDED","FAILED","CANCELLED"})");
  EXPECT_EQ(c.results, R"({"ff","",""})");
  EXPECT_EQ(c.errors, R"({"","boom",""})");
  EXPECT_EQ(c.ran_us, "{3000,-1,-1}");
}

job::Job ValidJob() {
  job::Job job;
  job.id = "job-1";
  job.spec.type = "echo";
  return job;
}

TEST(ValidateForInsertTest, AValidJobPasses) { EXPECT_THAT(ValidateForInsert(ValidJob()), IsOk()); }

TEST(ValidateForInsertTest, EmptyIdNamesId) {
  job::Job job = ValidJob();
  job.id.clear();
  EXPECT_THAT(ValidateForInsert(job),
              StatusIs(absl::StatusCode::kInvalidArgument, "id: must not be empty"));
}

TEST(ValidateForInsertTest, NulInATextFieldNamesTheField) {
  const std::string nul("a\0b", 3);
  struct Case {
    const char* field;
    void (*set)(job::Job&, const std::string&);
  };
  const Case cases[] = {
      {"id", [](job::Job& j, const std::string& v) { j.id = v; }},
      {"type", [](job::Job& j, const std::string& v) { j.spec.type = v; }},
      {"resource_id", [](job::Job& j, const std::string& v) { j.spec.resource_id = v; }},
      {"fairness_key", [](job::Job& j, const std::string& v) { j.spec.fairness_key = v; }},
      {"idempotency_key", [](job::Job& j, const std::string& v) { j.spec.idempotency_key = v; }},
      {"labels", [](job::Job& j, const std::string& v) { j.spec.labels[v] = "x"; }},
      {"labels", [](job::Job& j, const std::string& v) { j.spec.labels["x"] = v; }},
  };
  for (const Case& c : cases) {
    job::Job job = ValidJob();
    c.set(job, nul);
    EXPECT_THAT(ValidateForInsert(job), StatusIs(absl::StatusCode::kInvalidArgument,
                                                 absl::StrCat(c.field, ": contains a NUL byte")))
        << c.field;
  }
}

TEST(ValidateForInsertTest, NulInPayloadIsAllowed) {
  job::Job job = ValidJob();
  job.spec.payload = std::string("\0", 1);
  EXPECT_THAT(ValidateForInsert(job), IsOk());
}

TEST(ValidateForInsertTest, NegativeMaxAttemptsNamesMaxAttempts) {
  job::Job job = ValidJob();
  job.spec.max_attempts = -1;
  EXPECT_THAT(ValidateForInsert(job),
              StatusIs(absl::StatusCode::kInvalidArgument, "max_attempts: must be >= 0, got -1"));
}

TEST(ValidateForInsertTest, InfiniteOrNegativeTimeoutNamesTimeout) {
  for (absl::Duration timeout : {absl::InfiniteDuration(), absl::Seconds(-1)}) {
    job::Job job = ValidJob();
    job.spec.timeout = timeout;
    EXPECT_THAT(ValidateForInsert(job),
                StatusIs(absl::StatusCode::kInvalidArgument, "timeout: must be finite and >= 0"));
  }
}

TEST(ValidateForInsertTest, NegativeDispatchDeadlineNamesIt) {
  job::Job job = ValidJob();
  job.spec.dispatch_deadline = absl::Seconds(-1);
  EXPECT_THAT(ValidateForInsert(job),
              StatusIs(absl::StatusCode::kInvalidArgument, "dispatch_deadline: must be >= 0"));
}

TEST(ValidateForInsertTest, InfiniteFutureNotBeforeNamesIt) {
  job::Job job = ValidJob();
  job.spec.not_before = absl::InfiniteFuture();
  EXPECT_THAT(ValidateForInsert(job), StatusIs(absl::StatusCode::kInvalidArgument,
                                               "not_before: must not be infinite-future"));
}

}  // namespace
}  // namespace dispatchd::store
