#include "tests/testing/pg_test_db.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <random>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "pqxx/connection"
#include "pqxx/nontransaction"
#include <unistd.h>

namespace dispatchd::testing {
namespace {

constexpr char kUrlFileEnv[] = "DISPATCHD_TEST_PG_URL_FILE";

absl::StatusOr<std::string> ServerUrl() {
  const char* path = std::getenv(kUrlFileEnv);
  if (path == nullptr || *path == '\0') {
    return absl::FailedPreconditionError(
        absl::StrCat(kUrlFileEnv,
                     " is not set: run this test through ctest so the pg fixture starts "
                     "PostgreSQL (e.g. ctest -L store)"));
  }
  std::ifstream in(path);
  if (!in) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot read ", path, " (", kUrlFileEnv,
                     "): the pg fixture did not start PostgreSQL; run this test through ctest"));
  }
  std::stringstream content;
  content << in.rdbuf();
  std::string url(absl::StripAsciiWhitespace(content.str()));
  if (url.empty()) return absl::FailedPreconditionError(absl::StrCat(path, " is empty"));
  return url;
}

std::string UniqueName(absl::string_view prefix) {
  static std::atomic<int> counter{0};
  std::string clean;
  for (char c : prefix) {
    c = absl::ascii_tolower(static_cast<unsigned char>(c));
    clean += (absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_') ? c : '_';
  }
  if (clean.empty() || absl::ascii_isdigit(static_cast<unsigned char>(clean.front()))) {
    clean.insert(0, "t");
  }
  clean.resize(std::min<size_t>(clean.size(), 30));
  std::random_device rd;
  return absl::StrCat(clean, "_", getpid(), "_", counter.fetch_add(1), "_", rd() % 1000000);
}

}  // namespace

std::string UrlWithDatabase(absl::string_view url, absl::string_view database) {
  const size_t scheme = url.find("://");
  if (scheme == absl::string_view::npos) {
    // Keyword/value form: a later keyword overrides an earlier one.
    return absl::StrCat(url, " dbname=", database);
  }
  const size_t authority_end = url.find_first_of("/?", scheme + 3);
  if (authority_end == absl::string_view::npos) return absl::StrCat(url, "/", database);
  const size_t query = url.find('?', authority_end);
  return absl::StrCat(url.substr(0, authority_end), "/", database,
                      query == absl::string_view::npos ? "" : url.substr(query));
}

absl::StatusOr<TestDatabase> TestDatabase::Create(absl::string_view prefix,
                                                  absl::string_view locale) {
  absl::StatusOr<std::string> server_url = ServerUrl();
  if (!server_url.ok()) return server_url.status();
  std::string name = UniqueName(prefix);
  try {
    pqxx::connection conn(*server_url);
    pqxx::nontransaction txn(conn);
    // Identifiers cannot be parameters; quote_name escapes the (already restricted) name.
    std::string create = absl::StrCat("CREATE DATABASE ", txn.quote_name(name));
    if (!locale.empty()) {
      absl::StrAppend(&create, " TEMPLATE template0 LOCALE ", txn.quote(std::string(locale)));
    }
    txn.exec(create);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("create test database ", name, ": ", e.what()));
  }
  std::string url = UrlWithDatabase(*server_url, name);
  return TestDatabase(*std::move(server_url), std::move(name), std::move(url));
}

TestDatabase::TestDatabase(TestDatabase&& other) noexcept
    : server_url_(std::move(other.server_url_)),
      name_(std::exchange(other.name_, "")),
      url_(std::move(other.url_)) {}

TestDatabase& TestDatabase::operator=(TestDatabase&& other) noexcept {
  if (this != &other) {
    Drop();
    server_url_ = std::move(other.server_url_);
    name_ = std::exchange(other.name_, "");
    url_ = std::move(other.url_);
  }
  return *this;
}

TestDatabase::~TestDatabase() { Drop(); }

void TestDatabase::Drop() {
  if (name_.empty()) return;
  try {
    pqxx::connection conn(server_url_);
    pqxx::nontransaction txn(conn);
    txn.exec(absl::StrCat("DROP DATABASE IF EXISTS ", txn.quote_name(name_), " WITH (FORCE)"));
  } catch (const std::exception&) {
    // Best effort: the fixture's server and its data are removed at the end of the run anyway.
  }
  name_.clear();
}

}  // namespace dispatchd::testing
