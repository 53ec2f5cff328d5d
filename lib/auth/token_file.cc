#include "lib/auth/token_file.h"

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace dispatchd::auth {
namespace {

constexpr size_t kMaxNameBytes = 128;
constexpr absl::string_view kDigestPrefix = "sha256:";

bool ValidName(absl::string_view name) {
  if (name.empty() || name.size() > kMaxNameBytes) return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '@' &&
        c != ':' && c != '-') {
      return false;
    }
  }
  return true;
}

bool ValidHex(absl::string_view hex) {
  for (char c : hex) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

}  // namespace

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  volatile unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = diff | static_cast<unsigned char>(a[i] ^ b[i]);
  }
  return diff == 0;
}

absl::StatusOr<TokenTable> TokenTable::Parse(absl::string_view text, absl::string_view file_name) {
  TokenTable table;
  absl::flat_hash_map<std::string, size_t> by_name;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    auto fail = [&](absl::string_view what) {
      return absl::InvalidArgumentError(absl::StrCat(file_name, ":", line_no, ": ", what));
    };
    if (size_t hash = line.find('#'); hash != absl::string_view::npos) line = line.substr(0, hash);
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (fields.empty()) continue;
    if (fields.size() < 3 || fields.size() > 4) {
      return fail("want `name role sha256:<64 hex digits> [types=a,b]`");
    }
    Principal p;
    if (!ValidName(fields[0])) {
      return fail(absl::StrCat("name: 1 to ", kMaxNameBytes,
                               " bytes of letters, digits and ._@:- expected"));
    }
    p.name = std::string(fields[0]);
    absl::StatusOr<Role> role = ParseRole(fields[1]);
    if (!role.ok()) return fail(absl::StrCat("role: ", role.status().message()));
    p.role = *role;
    absl::string_view digest_hex = fields[2];
    if (!absl::ConsumePrefix(&digest_hex, kDigestPrefix) || digest_hex.size() != 64 ||
        !ValidHex(digest_hex)) {
      // The field may be a token pasted by mistake: never repeat it.
      return fail(
          "digest: want sha256: and 64 hex digits (the SHA-256 of the token, not the "
          "token itself)");
    }
    if (fields.size() == 4) {
      absl::string_view types = fields[3];
      if (!absl::ConsumePrefix(&types, "types=")) return fail("options: only types= is known");
      if (p.role != Role::kWorker) return fail("types=: only a worker's entry may limit types");
      for (absl::string_view t : absl::StrSplit(types, ',')) {
        if (t.empty()) return fail("types=: an empty type name");
        p.types.emplace_back(t);
      }
    }
    size_t index;
    if (auto it = by_name.find(p.name); it != by_name.end()) {
      const Principal& first = table.principals_[it->second];
      if (first.role != p.role || first.types != p.types) {
        return fail(absl::StrCat("name: \"", p.name,
                                 "\" is listed earlier with another role or other types"));
      }
      index = it->second;
    } else {
      index = table.principals_.size();
      by_name.emplace(p.name, index);
      table.principals_.push_back(std::move(p));
    }
    std::string digest = absl::HexStringToBytes(absl::AsciiStrToLower(digest_hex));
    if (!table.entries_.emplace(std::move(digest), index).second) {
      return fail("digest: the same token is listed twice");
    }
  }
  return table;
}

const Principal* TokenTable::Find(const TokenDigest& digest) const {
  const absl::string_view key(reinterpret_cast<const char*>(digest.data()), digest.size());
  auto it = entries_.find(key);
  if (it == entries_.end() || !ConstantTimeEquals(it->first, key)) return nullptr;
  return &principals_[it->second];
}

}  // namespace dispatchd::auth
