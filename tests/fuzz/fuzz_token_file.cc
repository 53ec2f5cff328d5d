// libFuzzer target: arbitrary bytes as the daemon's tokens file (auth.tokens_file), through
// auth::TokenTable::Parse as start-up and reload run it. A bad file must give INVALID_ARGUMENT
// naming the file and a line, never a crash, a leak or undefined behaviour; a file that parses
// must parse the same way again, and looking up any digest must be safe.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"

#include "lib/auth/principal.h"
#include "lib/auth/token_file.h"
#include "lib/util/check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using dispatchd::auth::Principal;
  using dispatchd::auth::TokenDigest;
  using dispatchd::auth::TokenTable;
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<TokenTable> table = TokenTable::Parse(text, "tokens");
  if (!table.ok()) {
    DISPATCHD_CHECK(absl::IsInvalidArgument(table.status()),
                    "a refusal that is not INVALID_ARGUMENT");
    DISPATCHD_CHECK(absl::StartsWith(table.status().message(), "tokens:"),
                    "an error that does not name the file and line");
    return 0;
  }
  DISPATCHD_CHECK(table->principals() <= table->size(), "more principals than tokens");
  absl::StatusOr<TokenTable> again = TokenTable::Parse(text, "tokens");
  DISPATCHD_CHECK(
      again.ok() && again->size() == table->size() && again->principals() == table->principals(),
      "the same file parsed differently");
  // Any 32 bytes of the input as a presented digest: found or not, what is found is whole.
  for (size_t at = 0; at + 32 <= size; at += 32) {
    TokenDigest digest;
    std::memcpy(digest.data(), data + at, digest.size());
    if (const Principal* p = table->Find(digest)) {
      DISPATCHD_CHECK(!p->name.empty() && p->authenticated, "a found principal has no name");
      DISPATCHD_CHECK(p->types.empty() || p->role == dispatchd::auth::Role::kWorker,
                      "types on a principal that is not a worker");
    }
  }
  return 0;
}
