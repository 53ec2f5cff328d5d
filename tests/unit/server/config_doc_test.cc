// docs/configuration.md names every key the daemon's config parser reads, and no other: each
// table row's first cell is a key (`postgres.url`; in the `tiers[]`, `types[]` and `tenants[]`
// sections a name relative to the list, `name` meaning `types[].name` and `rates[].model`
// meaning `tenants[].rates[].model`), compared with KnownConfigKeys().
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"

#include "server/config/yaml_config.h"

namespace dispatchd::server {
namespace {

std::set<std::string> DocumentedKeys(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  std::set<std::string> keys;
  std::string section;  // "tiers[]", "types[]" or "tenants[]" inside those sections, else ""
  std::string line;
  while (std::getline(in, line)) {
    if (absl::StartsWith(line, "## ")) {
      section.clear();
      for (const char* list : {"tiers[]", "types[]", "tenants[]"}) {
        if (line == absl::StrCat("## `", list, "`")) section = list;
      }
      continue;
    }
    if (!absl::StartsWith(line, "| `")) continue;
    const size_t end = line.find('`', 3);
    if (end == std::string::npos) continue;
    std::string key = line.substr(3, end - 3);
    if (!section.empty()) key = absl::StrCat(section, ".", key);
    keys.insert(key);
  }
  return keys;
}

TEST(ConfigDocTest, ReferenceNamesEveryKeyAndNoOther) {
  const std::set<std::string> documented =
      DocumentedKeys(std::string(DISPATCHD_SOURCE_DIR) + "/docs/configuration.md");
  const std::vector<std::string> known_list = KnownConfigKeys();
  const std::set<std::string> known(known_list.begin(), known_list.end());
  std::vector<std::string> missing, unknown;
  for (const std::string& k : known) {
    if (!documented.contains(k)) missing.push_back(k);
  }
  for (const std::string& k : documented) {
    if (!known.contains(k)) unknown.push_back(k);
  }
  EXPECT_TRUE(missing.empty()) << "read by the daemon but not in docs/configuration.md: "
                               << absl::StrJoin(missing, ", ");
  EXPECT_TRUE(unknown.empty()) << "in docs/configuration.md but not read by the daemon: "
                               << absl::StrJoin(unknown, ", ");
  EXPECT_GT(known.size(), 40u) << "the parser's key lists look empty";
}

}  // namespace
}  // namespace dispatchd::server
