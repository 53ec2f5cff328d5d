#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

#include "lib/auth/principal.h"

namespace dispatchd::auth {

// SHA-256 of a bearer token: all the daemon keeps of it.
using TokenDigest = std::array<uint8_t, 32>;

// The principals of a tokens file, found by the digest of a presented token. The file holds one
// entry per line, fields apart by spaces; `#` starts a comment:
//
//   # name       role     digest                   options
//   alice        client   sha256:2c26b46b68ff...
//   gpu-host-1   worker   sha256:fcde2b2edba5...   types=embed,chat
//
// `name` is 1 to 128 bytes of letters, digits and `._@:-`; `role` is client, worker, admin or
// gateway; the digest is `sha256:` and 64 hex digits of the SHA-256 of the token; `types=` (a
// worker's only) limits the job types it may serve. A name may appear on several lines, with the
// same role and types, to hold an old and a new token while clients move over. Tokens must be
// random (for example `dispatchctl token new`), never passwords: a fast hash is enough only for
// secrets that cannot be guessed. Thread-compatible; immutable once parsed.
class TokenTable {
 public:
  // Parses `text`; an error names `file_name`, the line and the field.
  static absl::StatusOr<TokenTable> Parse(absl::string_view text, absl::string_view file_name);

  // The principal holding a token of digest `digest`, or nullptr. The stored digest is compared
  // in constant time; finding the entry depends only on the presented digest, which tells a
  // caller nothing it does not know.
  const Principal* Find(const TokenDigest& digest) const;

  size_t size() const { return entries_.size(); }
  // Distinct principals named in the file.
  size_t principals() const { return principals_.size(); }

 private:
  std::vector<Principal> principals_;
  // Digest (as raw bytes in a string) -> index into principals_.
  absl::flat_hash_map<std::string, size_t> entries_;
};

// True if `a` and `b` hold the same bytes; the time taken does not depend on where they differ.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

}  // namespace dispatchd::auth
