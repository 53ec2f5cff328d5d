#include "server/store/pg_rows.h"

#include <exception>
#include <iterator>
#include <new>
#include <type_traits>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "pqxx/array"
#include <libpq-fe.h>

#include "lib/util/status_macros.h"
#include "server/store/pg_statements.h"

namespace dispatchd::store {
namespace {

// The names of enum Col's columns, for messages.
constexpr const char* kColNames[] = {"id",
                                     "type",
                                     "payload",
                                     "resource_id",
                                     "fairness_key",
                                     "idempotency_key",
                                     "max_attempts",
                                     "timeout_ms",
                                     "dispatch_deadline_us",
                                     "not_before_us",
                                     "labels",
                                     "state",
                                     "attempt",
                                     "worker_id",
                                     "result",
                                     "error",
                                     "created_us",
                                     "dispatched_us",
                                     "started_us",
                                     "finished_us",
                                     "updated_us",
                                     "owner",
                                     "seq",
                                     "attempts"};
static_assert(std::size(kColNames) == kColCount, "a name for every column of a job");

// Parses an integer column that is never NULL. Internal naming `job_id` and `column` otherwise.
template <typename Int>
absl::StatusOr<Int> IntFromCell(TextCell cell, absl::string_view job_id, absl::string_view column) {
  if (cell.is_null()) {
    return absl::InternalError(absl::StrCat("job ", job_id, ": ", column, ": unexpected NULL"));
  }
  Int value = 0;
  if (!absl::SimpleAtoi(cell.text(), &value)) {
    return absl::InternalError(
        absl::StrCat("job ", job_id, ": ", column, ": not an integer: \"", cell.text(), "\""));
  }
  return value;
}

// A time column: microseconds since the epoch, NULL as InfinitePast ("not yet").
absl::StatusOr<absl::Time> TimeFromCell(TextCell cell, absl::string_view job_id,
                                        absl::string_view column) {
  if (cell.is_null()) return absl::InfinitePast();
  DISPATCHD_ASSIGN_OR_RETURN(int64_t us, IntFromCell<int64_t>(cell, job_id, column));
  return absl::FromUnixMicros(us);
}

// The earlier attempts from kColAttempts: six elements an attempt (DISPATCHD_PG_ATTEMPTS_ARRAY),
// '' for a time or worker it lacks.
absl::StatusOr<std::vector<job::EndedAttempt>> AttemptsFromCell(TextCell cell,
                                                                absl::string_view job_id) {
  constexpr size_t kFields = 6;
  std::vector<job::EndedAttempt> out;
  absl::StatusOr<std::vector<std::string>> items = TextArrayFromCell(cell);
  if (!items.ok() || items->size() % kFields != 0) {
    return absl::InternalError(absl::StrCat(
        "job ", job_id,
        ": attempts: ", items.ok() ? "want six fields per attempt" : items.status().message()));
  }
  auto time = [job_id](const std::string& us, absl::Time* t) {
    if (us.empty()) return absl::OkStatus();
    int64_t value = 0;
    if (!absl::SimpleAtoi(us, &value)) {
      return absl::InternalError(
          absl::StrCat("job ", job_id, ": attempts: not a time in us: \"", us, "\""));
    }
    *t = absl::FromUnixMicros(value);
    return absl::OkStatus();
  };
  out.reserve(items->size() / kFields);
  for (size_t i = 0; i < items->size(); i += kFields) {
    const std::string* f = &(*items)[i];
    job::EndedAttempt& a = out.emplace_back();
    if (!absl::SimpleAtoi(f[0], &a.attempt)) {
      return absl::InternalError(
          absl::StrCat("job ", job_id, ": attempts: not an attempt number: \"", f[0], "\""));
    }
    a.worker_id = f[1];
    DISPATCHD_RETURN_IF_ERROR(time(f[2], &a.dispatched_at));
    DISPATCHD_RETURN_IF_ERROR(time(f[3], &a.started_at));
    DISPATCHD_RETURN_IF_ERROR(time(f[4], &a.ended_at));
    a.error = f[5];
  }
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Rows.

absl::StatusOr<std::vector<std::string>> TextArrayFromCell(TextCell cell) {
  std::vector<std::string> out;
  if (cell.is_null()) return out;
  try {
    // Scans byte by byte, as libpqxx does for every server-side encoding (all keep ASCII bytes
    // out of their multibyte characters).
    pqxx::array_parser parser(cell.c_str());
    while (true) {
      auto [juncture, value] = parser.get_next();
      switch (juncture) {
        case pqxx::array_parser::string_value:
          out.push_back(std::move(value));
          break;
        case pqxx::array_parser::null_value:
          return absl::InternalError("unexpected NULL in a text array");
        case pqxx::array_parser::row_start:
        case pqxx::array_parser::row_end:
          break;
        case pqxx::array_parser::done:
          return out;
      }
    }
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("malformed text array: ", e.what()));
  }
}

std::string BytesFromCell(TextCell cell) {
  if (cell.is_null()) return "";
  size_t size = 0;
  unsigned char* bytes =
      PQunescapeBytea(reinterpret_cast<const unsigned char*>(cell.c_str()), &size);
  // NULL only when out of memory, which any allocation reports the same way.
  if (bytes == nullptr) throw std::bad_alloc();
  std::string out(reinterpret_cast<const char*>(bytes), size);
  PQfreemem(bytes);
  return out;
}

absl::StatusOr<job::Job> JobFromRow(const TextRow& row) {
  if (row.size() < kColCount) {
    return absl::InternalError(
        absl::StrCat("job row: ", row.size(), " columns, expected at least ", kColCount));
  }
  auto text = [&row](Col col) { return std::string(row[col].text()); };
  job::Job job;
  job.id = text(kColId);
  auto integer = [&](Col col, auto* out) -> absl::Status {
    using Int = std::remove_pointer_t<decltype(out)>;
    DISPATCHD_ASSIGN_OR_RETURN(*out, IntFromCell<Int>(row[col], job.id, kColNames[col]));
    return absl::OkStatus();
  };
  auto time = [&](Col col, absl::Time* out) -> absl::Status {
    DISPATCHD_ASSIGN_OR_RETURN(*out, TimeFromCell(row[col], job.id, kColNames[col]));
    return absl::OkStatus();
  };
  job::JobSpec& spec = job.spec;
  spec.type = text(kColType);
  spec.payload = BytesFromCell(row[kColPayload]);
  spec.resource_id = text(kColResourceId);
  spec.fairness_key = text(kColFairnessKey);
  spec.idempotency_key = text(kColIdempotencyKey);
  DISPATCHD_RETURN_IF_ERROR(integer(kColMaxAttempts, &spec.max_attempts));
  int64_t timeout_ms = 0;
  DISPATCHD_RETURN_IF_ERROR(integer(kColTimeoutMs, &timeout_ms));
  spec.timeout = absl::Milliseconds(timeout_ms);
  if (row[kColDispatchDeadlineUs].is_null()) {
    spec.dispatch_deadline = absl::InfiniteDuration();
  } else {
    int64_t deadline_us = 0;
    DISPATCHD_RETURN_IF_ERROR(integer(kColDispatchDeadlineUs, &deadline_us));
    spec.dispatch_deadline = absl::Microseconds(deadline_us);
  }
  DISPATCHD_RETURN_IF_ERROR(time(kColNotBeforeUs, &spec.not_before));
  absl::StatusOr<std::vector<std::string>> labels = TextArrayFromCell(row[kColLabels]);
  if (!labels.ok()) {
    return absl::InternalError(
        absl::StrCat("job ", job.id, ": labels: ", labels.status().message()));
  }
  if (labels->size() % 2 != 0) {
    return absl::InternalError(absl::StrCat("job ", job.id, ": malformed labels"));
  }
  for (size_t i = 0; i < labels->size(); i += 2) {
    spec.labels[(*labels)[i]] = std::move((*labels)[i + 1]);
  }
  const absl::string_view state = row[kColState].text();
  std::optional<job::JobState> parsed = job::ParseJobState(state);
  if (!parsed.has_value()) {
    return absl::InternalError(absl::StrCat("job ", job.id, ": unknown state \"", state, "\""));
  }
  job.state = *parsed;
  DISPATCHD_RETURN_IF_ERROR(integer(kColAttempt, &job.attempt));
  job.worker_id = text(kColWorkerId);
  job.result = BytesFromCell(row[kColResult]);
  job.error = text(kColError);
  DISPATCHD_RETURN_IF_ERROR(time(kColCreatedUs, &job.created_at));
  DISPATCHD_RETURN_IF_ERROR(time(kColDispatchedUs, &job.dispatched_at));
  DISPATCHD_RETURN_IF_ERROR(time(kColStartedUs, &job.started_at));
  DISPATCHD_RETURN_IF_ERROR(time(kColFinishedUs, &job.finished_at));
  DISPATCHD_RETURN_IF_ERROR(time(kColUpdatedUs, &job.updated_at));
  job.owner = text(kColOwner);
  DISPATCHD_RETURN_IF_ERROR(integer(kColSeq, &job.seq));
  DISPATCHD_ASSIGN_OR_RETURN(job.earlier_attempts, AttemptsFromCell(row[kColAttempts], job.id));
  return job;
}

absl::StatusOr<JobRef> RefFromRow(const TextRow& row) {
  if (row.size() < 5) {
    return absl::InternalError(
        absl::StrCat("job ref row: ", row.size(), " columns, expected at least 5"));
  }
  JobRef ref{.job_id = std::string(row[0].text()),
             .state = job::ParseJobState(row[1].text()).value_or(job::JobState::kQueued),
             .worker_id = std::string(row[3].text())};
  DISPATCHD_ASSIGN_OR_RETURN(ref.attempt, IntFromCell<int32_t>(row[2], ref.job_id, "attempt"));
  DISPATCHD_ASSIGN_OR_RETURN(ref.updated_at, TimeFromCell(row[4], ref.job_id, "updated_us"));
  return ref;
}

// ---------------------------------------------------------------------------------------------
// Parameters.

std::string TextArrayLiteral(const std::vector<std::string>& items) {
  std::string out = "{";
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += ',';
    out += '"';
    for (char c : items[i]) {
      if (c == '"' || c == '\\') out += '\\';
      out += c;
    }
    out += '"';
  }
  out += '}';
  return out;
}

std::string OptionalIntArrayLiteral(const std::vector<std::optional<int64_t>>& items) {
  std::string out = "{";
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += ',';
    if (items[i]) {
      absl::StrAppend(&out, *items[i]);
    } else {
      out += "NULL";
    }
  }
  out += '}';
  return out;
}

std::optional<int64_t> OptionalMicros(absl::Time t) {
  if (t == absl::InfinitePast()) return std::nullopt;
  return absl::ToUnixMicros(t);
}

InsertColumns::InsertColumns(const std::vector<const job::Job*>& jobs) {
  for (const job::Job* job : jobs) {
    const job::JobSpec& spec = job->spec;
    ids.push_back(job->id);
    owners.push_back(job->owner);
    workers.push_back(job->worker_id);
    types.push_back(spec.type);
    payloads_hex.push_back(absl::BytesToHexString(spec.payload));
    resource_ids.push_back(spec.resource_id);
    fairness_keys.push_back(spec.fairness_key);
    idempotency_keys.push_back(spec.idempotency_key);
    std::vector<std::string> keys, values;
    for (const auto& [key, value] : spec.labels) {
      keys.push_back(key);
      values.push_back(value);
    }
    label_keys.push_back(TextArrayLiteral(keys));
    label_values.push_back(TextArrayLiteral(values));
    max_attempts.push_back(spec.max_attempts);
    timeouts_ms.push_back(absl::ToInt64Milliseconds(spec.timeout));
    deadlines_us.push_back(spec.dispatch_deadline == absl::InfiniteDuration()
                               ? std::nullopt
                               : std::optional(absl::ToInt64Microseconds(spec.dispatch_deadline)));
    not_befores_us.push_back(OptionalMicros(spec.not_before));
  }
}

int64_t RanMicros(absl::Duration ran) {
  return ran == absl::InfiniteDuration() || ran < absl::ZeroDuration()
             ? -1
             : absl::ToInt64Microseconds(ran);
}

FinishColumns::FinishColumns(const std::vector<FinishRequest>& reqs) {
  std::vector<std::string> id, state, result, error;
  std::vector<int32_t> attempt;
  std::vector<int64_t> ran;
  std::vector<int> times;  // 1 or 0, which PostgreSQL reads as a bool
  for (const FinishRequest& r : reqs) {
    times.push_back(r.row_times ? 1 : 0);
    id.push_back(r.job_id);
    attempt.push_back(r.attempt);
    state.emplace_back(job::ToString(r.state));
    result.push_back(absl::BytesToHexString(r.result));
    error.push_back(r.error);
    ran.push_back(RanMicros(r.ran));
  }
  ids = TextArrayLiteral(id);
  attempts = IntArrayLiteral(attempt);
  states = TextArrayLiteral(state);
  results = TextArrayLiteral(result);
  errors = TextArrayLiteral(error);
  ran_us = IntArrayLiteral(ran);
  row_times = IntArrayLiteral(times);
}

absl::Status CheckNoNul(absl::string_view field, absl::string_view value) {
  if (absl::StrContains(value, absl::string_view("\0", 1))) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": contains a NUL byte"));
  }
  return absl::OkStatus();
}

absl::Status ValidateForInsert(const job::Job& job) {
  const job::JobSpec& spec = job.spec;
  if (job.id.empty()) return absl::InvalidArgumentError("id: must not be empty");
  DISPATCHD_RETURN_IF_ERROR(CheckNoNul("id", job.id));
  DISPATCHD_RETURN_IF_ERROR(CheckNoNul("type", spec.type));
  DISPATCHD_RETURN_IF_ERROR(CheckNoNul("resource_id", spec.resource_id));
  DISPATCHD_RETURN_IF_ERROR(CheckNoNul("fairness_key", spec.fairness_key));
  DISPATCHD_RETURN_IF_ERROR(CheckNoNul("idempotency_key", spec.idempotency_key));
  for (const auto& [key, value] : spec.labels) {
    DISPATCHD_RETURN_IF_ERROR(CheckNoNul("labels", key));
    DISPATCHD_RETURN_IF_ERROR(CheckNoNul("labels", value));
  }
  if (spec.max_attempts < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_attempts: must be >= 0, got ", spec.max_attempts));
  }
  if (spec.timeout < absl::ZeroDuration() || spec.timeout == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("timeout: must be finite and >= 0, got ", absl::FormatDuration(spec.timeout)));
  }
  if (spec.dispatch_deadline < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("dispatch_deadline: must be >= 0, got ",
                                                   absl::FormatDuration(spec.dispatch_deadline)));
  }
  if (spec.not_before == absl::InfiniteFuture()) {
    return absl::InvalidArgumentError("not_before: must not be infinite-future");
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// pqxx adapters.

void ToTextRow(const pqxx::row& row, TextRow* cells) {
  cells->clear();
  cells->reserve(row.size());
  for (pqxx::row::size_type i = 0; i < row.size(); ++i) cells->push_back(CellOf(row[i]));
}

absl::StatusOr<job::Job> RowToJob(const pqxx::row& row) {
  TextRow cells;
  ToTextRow(row, &cells);
  return JobFromRow(cells);
}

absl::StatusOr<std::vector<job::Job>> RowsToJobs(const pqxx::result& rows) {
  std::vector<job::Job> jobs;
  jobs.reserve(rows.size());
  TextRow cells;
  for (const pqxx::row& row : rows) {
    ToTextRow(row, &cells);
    DISPATCHD_ASSIGN_OR_RETURN(job::Job job, JobFromRow(cells));
    jobs.push_back(std::move(job));
  }
  return jobs;
}

absl::StatusOr<std::vector<JobRef>> RowsToRefs(const pqxx::result& rows) {
  std::vector<JobRef> refs;
  refs.reserve(rows.size());
  TextRow cells;
  for (const pqxx::row& row : rows) {
    ToTextRow(row, &cells);
    DISPATCHD_ASSIGN_OR_RETURN(JobRef ref, RefFromRow(cells));
    refs.push_back(std::move(ref));
  }
  return refs;
}

std::vector<std::string> Ids(const pqxx::result& rows) {
  std::vector<std::string> ids;
  ids.reserve(rows.size());
  for (const pqxx::row& row : rows) ids.push_back(TextFromField(row[0]));
  return ids;
}

}  // namespace dispatchd::store
