// libFuzzer target: arbitrary bytes as the daemon's YAML config file, through what start-up and
// SIGHUP do with it: server::ParseConfig (yaml-cpp, then the key-by-key reader, then
// Config::Validate), then Warnings() and the reload merge. A bad file must give a Status naming
// a position, never a crash, an escaping exception, a leak or undefined behaviour; and a config
// that parses must be one that Validate() accepts.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

#include "lib/config/config.h"
#include "lib/util/check.h"
#include "server/config/yaml_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<dispatchd::config::Config> config =
      dispatchd::server::ParseConfig(text, "fuzz.yaml");
  if (!config.ok()) {
    DISPATCHD_CHECK(absl::IsInvalidArgument(config.status()),
                    "a refusal that is not INVALID_ARGUMENT");
    DISPATCHD_CHECK(config.status().message().substr(0, 9) == "fuzz.yaml",
                    "an error that does not name the file");
    return 0;
  }
  DISPATCHD_CHECK(config->Validate().ok(), "ParseConfig returned a config Validate() refuses");
  for (const std::string& warning : config->Warnings()) {
    DISPATCHD_CHECK(!warning.empty(), "an empty warning");
  }
  for (const dispatchd::config::JobTypeConfig& t : config->types) {
    DISPATCHD_CHECK(config->FindType(t.name) != nullptr, "a configured type is not found");
  }
  // SIGHUP with the same file changes nothing that waits for a restart; a reload onto a daemon
  // started with the defaults takes the reloadable keys, and the result is still valid.
  std::vector<std::string> restart_only;
  dispatchd::config::Config same = dispatchd::config::MergeReload(*config, *config, &restart_only);
  DISPATCHD_CHECK(restart_only.empty(), "reloading the same file changes restart-only keys");
  DISPATCHD_CHECK(same.Validate().ok(), "reloading the same file gives an invalid config");
  restart_only.clear();
  dispatchd::config::Config defaults;
  defaults.types.push_back({.name = "default"});
  dispatchd::config::Config merged =
      dispatchd::config::MergeReload(defaults, *config, &restart_only);
  DISPATCHD_CHECK(merged.Validate().ok(), "a reload of a valid config gives an invalid one");
  return 0;
}
