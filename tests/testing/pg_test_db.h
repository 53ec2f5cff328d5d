#pragma once

#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dispatchd::testing {

// A fresh, empty database on the PostgreSQL server of the `pg` CTest fixture (tests/pg), dropped
// when this object is destroyed. Tests run through ctest, which starts the server and sets
// DISPATCHD_TEST_PG_URL_FILE to the file holding its URL.
//
//   absl::StatusOr<TestDatabase> db = TestDatabase::Create("store");
//   auto store = PgJobStore::Connect({.url = db->url()});
//
// Movable, not copyable. Thread-compatible.
class TestDatabase {
 public:
  // Creates database `<prefix>_<pid>_<counter>_<random>` (prefix lowercased, reduced to
  // [a-z0-9_]), with the server's default locale or with `locale` (LC_COLLATE and LC_CTYPE, a
  // locale the server's machine has). FailedPrecondition when the fixture's URL is not
  // available.
  static absl::StatusOr<TestDatabase> Create(absl::string_view prefix,
                                             absl::string_view locale = "");

  TestDatabase(TestDatabase&& other) noexcept;
  TestDatabase& operator=(TestDatabase&& other) noexcept;
  TestDatabase(const TestDatabase&) = delete;
  TestDatabase& operator=(const TestDatabase&) = delete;
  // Drops the database, disconnecting any session still on it; errors are ignored.
  ~TestDatabase();

  // libpq URL of the new database.
  const std::string& url() const { return url_; }
  // Its name.
  const std::string& name() const { return name_; }
  // URL of the server's maintenance database (for sessions outside the test database).
  const std::string& server_url() const { return server_url_; }

 private:
  TestDatabase(std::string server_url, std::string name, std::string url)
      : server_url_(std::move(server_url)), name_(std::move(name)), url_(std::move(url)) {}
  void Drop();

  std::string server_url_;
  std::string name_;  // empty once moved from
  std::string url_;
};

// `url` with its database replaced by `database` (URI or keyword/value form).
std::string UrlWithDatabase(absl::string_view url, absl::string_view database);

}  // namespace dispatchd::testing
