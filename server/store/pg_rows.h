#pragma once

// PgJobStore's conversions between its model and PostgreSQL's text forms, apart from any
// connection: rows read back as text cells (TextRow) become jobs and refs, and requests become
// the array parameters its statements take. Everything here but the pqxx adapters at the end runs
// without a server, so it is tested without one. Internal to server/store.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "pqxx/result"  // and pqxx::row, pqxx::field: 6.4's headers of those do not stand alone

#include "lib/job/job.h"
#include "server/store/job_store.h"

namespace dispatchd::store {

// ---------------------------------------------------------------------------------------------
// Rows.

// One column of a row as PostgreSQL's text output, or SQL NULL. It borrows the text, which must
// outlive it. The text is a C string (ends in a NUL), as libpq hands values out and as
// PQunescapeBytea and pqxx::array_parser need them; PostgreSQL text never holds a NUL itself.
// A value, cheap to copy; thread-compatible, as the text it borrows is.
class TextCell {
 public:
  // SQL NULL.
  constexpr TextCell() = default;
  constexpr TextCell(std::nullopt_t) {}  // NOLINT(google-explicit-constructor): reads as NULL
  // REQUIRES: text[size] == '\0'.
  constexpr TextCell(const char* text, size_t size) : text_(text), size_(size) {}
  // A C string (a literal); nullptr is SQL NULL.
  TextCell(const char* text)  // NOLINT(google-explicit-constructor)
      : TextCell(text, text == nullptr ? 0 : std::strlen(text)) {}
  TextCell(const std::string& text)  // NOLINT(google-explicit-constructor)
      : TextCell(text.c_str(), text.size()) {}
  TextCell(std::string&&) = delete;  // would borrow a temporary

  bool is_null() const { return text_ == nullptr; }
  // The text; empty for NULL.
  absl::string_view text() const {
    return is_null() ? absl::string_view() : absl::string_view(text_, size_);
  }
  // REQUIRES: !is_null().
  const char* c_str() const { return text_; }

 private:
  const char* text_ = nullptr;
  size_t size_ = 0;
};

// A row read back from PostgreSQL, one cell per column in the statement's order.
using TextRow = std::vector<TextCell>;

// A job from a row whose columns are DISPATCHD_PG_JOB_COLUMNS (enum Col in pg_job_columns.h);
// cells from kColCount on are ignored. Text columns read NULL as empty, a NULL dispatch deadline
// as InfiniteDuration, NULL times as InfinitePast and NULL attempts as none; payload and result
// are bytea text (hex or escape format). Internal, naming the job and the column, for a row no
// statement of the store returns: too few cells, an integer column that is NULL or not an
// integer, malformed labels or attempts, an unknown state.
absl::StatusOr<job::Job> JobFromRow(const TextRow& row);

// A ref from a row of (id, state, attempt, worker_id, updated_at in us), as kGetRefs and
// kLoadPlacedRefs return them. A state it does not know reads as QUEUED. Internal, naming the
// job and the column, for a row too short or an attempt that is not an integer.
absl::StatusOr<JobRef> RefFromRow(const TextRow& row);

// The elements of a text array of any dimension, in storage order; none for NULL. Internal for
// a NULL element or text that is not an array.
absl::StatusOr<std::vector<std::string>> TextArrayFromCell(TextCell cell);

// The bytes of a bytea column's text (hex "\x00ff" or escape format); empty for NULL.
std::string BytesFromCell(TextCell cell);

// ---------------------------------------------------------------------------------------------
// Parameters.

// A PostgreSQL array literal of text elements: each element double-quoted, with double quotes
// and backslashes escaped by a backslash, so any text (commas, braces, "NULL") reads back verbatim.
std::string TextArrayLiteral(const std::vector<std::string>& items);

// An array literal of integers.
template <typename Int>
std::string IntArrayLiteral(const std::vector<Int>& items) {
  return absl::StrCat("{", absl::StrJoin(items, ","), "}");
}

// Like IntArrayLiteral, with NULL for an absent element.
std::string OptionalIntArrayLiteral(const std::vector<std::optional<int64_t>>& items);

// Microseconds since the epoch, or NULL for InfinitePast ("none").
std::optional<int64_t> OptionalMicros(absl::Time t);

// kInsertJobs' parameters for `jobs`, in order, before each column becomes an array literal.
struct InsertColumns {
  std::vector<std::string> ids, types, payloads_hex, resource_ids, fairness_keys, idempotency_keys,
      label_keys, label_values, owners, workers;
  std::vector<int32_t> max_attempts;
  std::vector<int64_t> timeouts_ms;
  std::vector<std::optional<int64_t>> deadlines_us, not_befores_us;

  explicit InsertColumns(const std::vector<const job::Job*>& jobs);
};

// The parameters of the marks' or claims' arrays: ids, attempts, worker ids.
struct BatchColumns {
  std::string ids, attempts, workers;

  // `Request`: ClaimRequest or MarkRequest.
  template <typename Request>
  explicit BatchColumns(const std::vector<Request>& reqs) {
    std::vector<std::string> id, worker;
    std::vector<int32_t> attempt;
    for (const Request& r : reqs) {
      id.push_back(r.job_id);
      attempt.push_back(r.attempt);
      worker.push_back(r.worker_id);
    }
    ids = TextArrayLiteral(id);
    attempts = IntArrayLiteral(attempt);
    workers = TextArrayLiteral(worker);
  }
};

// A run time as the finishes and retries carry it: microseconds, or -1 when it is unknown
// (infinite) or negative.
int64_t RanMicros(absl::Duration ran);

// The parameters of the finishes' arrays, run times as RanMicros gives them.
struct FinishColumns {
  std::string ids, attempts, states, results, errors, ran_us, row_times;

  explicit FinishColumns(const std::vector<FinishRequest>& reqs);
};

// InvalidArgument, naming the field, unless `job` can be inserted as it is: a non-empty id, no
// NUL in any text (libpq would cut it short), max_attempts >= 0, a finite timeout >= 0, a
// dispatch deadline >= 0 and a not_before that is not infinite-future.
absl::Status ValidateForInsert(const job::Job& job);

// InvalidArgument naming `field` if `value` holds a NUL byte: libpq takes text parameters as C
// strings, and a NUL would silently cut the value short.
absl::Status CheckNoNul(absl::string_view field, absl::string_view value);

// ---------------------------------------------------------------------------------------------
// pqxx adapters: the cells of a result, borrowed without copying their text.

inline TextCell CellOf(const pqxx::field& f) {
  return f.is_null() ? TextCell() : TextCell(f.c_str(), f.size());
}

// Fills `cells` with the cells of `row`, reusing its storage across the rows of a result.
void ToTextRow(const pqxx::row& row, TextRow* cells);

// A text column, NULL read as empty.
inline std::string TextFromField(const pqxx::field& f) { return std::string(CellOf(f).text()); }

// A bytea column, NULL read as empty.
inline std::string BytesFromField(const pqxx::field& f) { return BytesFromCell(CellOf(f)); }

// JobFromRow of one row, and of every row of a result.
absl::StatusOr<job::Job> RowToJob(const pqxx::row& row);
absl::StatusOr<std::vector<job::Job>> RowsToJobs(const pqxx::result& rows);

// RefFromRow of every row of a result.
absl::StatusOr<std::vector<JobRef>> RowsToRefs(const pqxx::result& rows);

// The first column of every row, as text: the ids a write returns.
std::vector<std::string> Ids(const pqxx::result& rows);

}  // namespace dispatchd::store
