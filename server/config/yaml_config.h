#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

#include "lib/config/config.h"

namespace dispatchd::server {

// Reads and validates the daemon's YAML config file. Every error names the file, line, column
// and key, e.g. `dispatchd.yaml:12:22: types[1].timeout: invalid duration "ten"`; unknown keys
// are errors, so a typo never silently falls back to a default. Thread-compatible.
absl::StatusOr<config::Config> LoadConfigFile(const std::string& path);

// As LoadConfigFile, from text; `name` stands for the file in messages.
absl::StatusOr<config::Config> ParseConfig(absl::string_view yaml, absl::string_view name);

// Every key the parser reads, in full: `listen`, `postgres.url`, ..., `tiers[].name`,
// `types[].rpm`. docs/configuration.md documents exactly these (a test compares them).
std::vector<std::string> KnownConfigKeys();

}  // namespace dispatchd::server
