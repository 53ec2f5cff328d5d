#pragma once

// Tiny gMock matchers for absl::Status and absl::StatusOr (abseil ships its own from LTS 20240722).
//   EXPECT_THAT(store.Get(id), IsOk());
//   EXPECT_THAT(Admit(q, job), StatusIs(absl::StatusCode::kResourceExhausted));

#include <ostream>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"

namespace dispatchd::testing {

inline const absl::Status& GetStatus(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& s) {
  return s.status();
}

MATCHER(IsOk, "is OK") {
  const absl::Status& s = GetStatus(arg);
  if (!s.ok()) *result_listener << "status is " << s.ToString();
  return s.ok();
}

MATCHER_P(StatusIs, code, "has status code " + ::testing::PrintToString(code)) {
  const absl::Status& s = GetStatus(arg);
  *result_listener << "status is " << s.ToString();
  return s.code() == code;
}

MATCHER_P2(StatusIs, code, substring,
           "has status code " + ::testing::PrintToString(code) + " and a message containing \"" +
               std::string(substring) + "\"") {
  const absl::Status& s = GetStatus(arg);
  *result_listener << "status is " << s.ToString();
  return s.code() == code && s.message().find(substring) != absl::string_view::npos;
}

}  // namespace dispatchd::testing
