#include "server/store/pg_conninfo.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/string_view.h"
#include <libpq-fe.h>

namespace dispatchd::store {
namespace {

// Quotes a libpq keyword/value value: single quotes, with \ and ' escaped by a backslash.
std::string QuoteConninfoValue(absl::string_view value) {
  return absl::StrCat("'", absl::StrReplaceAll(value, {{"\\", "\\\\"}, {"'", "\\'"}}), "'");
}

// The password written in `url` ("scheme://user:PASSWORD@host" or "password=PASSWORD"), so that
// it can be masked in libpq's parse errors, which quote the input.
std::string PasswordIn(absl::string_view url) {
  if (size_t scheme = url.find("://"); scheme != absl::string_view::npos) {
    absl::string_view rest = url.substr(scheme + 3);
    rest = rest.substr(0, rest.find_first_of("/?"));
    size_t at = rest.rfind('@');
    if (at == absl::string_view::npos) return "";
    absl::string_view userinfo = rest.substr(0, at);
    size_t colon = userinfo.find(':');
    return colon == absl::string_view::npos ? "" : std::string(userinfo.substr(colon + 1));
  }
  size_t key = url.find("password");
  if (key == absl::string_view::npos) return "";
  absl::string_view rest = url.substr(key + 8);
  size_t eq = rest.find('=');
  if (eq == absl::string_view::npos) return "";
  rest = rest.substr(eq + 1);
  while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
  return std::string(rest.substr(0, rest.find(' ')));
}

}  // namespace

absl::StatusOr<Target> ParseTarget(const std::string& url, absl::Duration connect_timeout,
                                   const std::string& application_name,
                                   absl::Duration tcp_user_timeout) {
  char* error = nullptr;
  PQconninfoOption* options = PQconninfoParse(url.c_str(), &error);
  if (options == nullptr) {
    std::string reason = error != nullptr ? error : "out of memory";
    PQfreemem(error);
    if (std::string password = PasswordIn(url); !password.empty()) {
      reason = absl::StrReplaceAll(reason, {{password, "***"}});
    }
    while (!reason.empty() && (reason.back() == '\n' || reason.back() == ' ')) reason.pop_back();
    return absl::InvalidArgumentError(absl::StrCat("postgres: invalid connection URL: ", reason));
  }
  std::vector<std::string> parts;
  std::string host, hostaddr, port, dbname, user;
  std::string url_name;
  bool has_timeout = false, has_keepalives = false, has_user_timeout = false;
  for (PQconninfoOption* o = options; o->keyword != nullptr; ++o) {
    if (o->val == nullptr) continue;
    const absl::string_view keyword = o->keyword;
    if (keyword == "application_name") {
      url_name = o->val;
      continue;
    }
    if (keyword == "host") host = o->val;
    if (keyword == "hostaddr") hostaddr = o->val;
    if (keyword == "port") port = o->val;
    if (keyword == "dbname") dbname = o->val;
    if (keyword == "user") user = o->val;
    if (keyword == "connect_timeout") has_timeout = true;
    if (absl::StartsWith(keyword, "keepalives")) has_keepalives = true;
    if (keyword == "tcp_user_timeout") has_user_timeout = true;
    parts.push_back(absl::StrCat(keyword, "=", QuoteConninfoValue(o->val)));
  }
  PQconninfoFree(options);
  if (!has_timeout && connect_timeout != absl::InfiniteDuration()) {
    const int64_t seconds =
        std::max<int64_t>(1, absl::ToInt64Seconds(absl::Ceil(connect_timeout, absl::Seconds(1))));
    parts.push_back(absl::StrCat("connect_timeout=", seconds));
  }
  std::string name = !application_name.empty() ? application_name
                     : !url_name.empty()       ? url_name
                                               : "dispatchd";
  parts.push_back(absl::StrCat("application_name=", QuoteConninfoValue(name)));
  if (!has_keepalives) {
    parts.push_back("keepalives=1 keepalives_idle=10 keepalives_interval=5 keepalives_count=3");
  }
  if (!has_user_timeout && tcp_user_timeout != absl::InfiniteDuration()) {
    parts.push_back(absl::StrCat(
        "tcp_user_timeout=", std::max<int64_t>(1, absl::ToInt64Milliseconds(tcp_user_timeout))));
  }
  if (host.empty()) host = hostaddr;
  if (port.empty()) port = "5432";
  if (dbname.empty()) dbname = user;
  std::string endpoint;
  if (host.empty()) {
    endpoint = absl::StrCat("local socket port ", port);
  } else if (host.front() == '/' || host.front() == '@') {
    endpoint = absl::StrCat("socket ", host, " port ", port);
  } else {
    endpoint = absl::StrCat(host, ":", port);
  }
  if (!dbname.empty()) absl::StrAppend(&endpoint, "/", dbname);
  return Target{absl::StrJoin(parts, " "), std::move(endpoint)};
}

}  // namespace dispatchd::store
