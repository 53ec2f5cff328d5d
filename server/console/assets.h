#pragma once

#include <string_view>
#include <vector>

namespace dispatchd::console {

// One file of server/console/static/, compiled in.
struct Asset {
  std::string_view name;  // file name, e.g. "console.js"
  std::string_view data;
};

// Every file of the page (generated: console_assets.cc). Immutable.
const std::vector<Asset>& Assets();

}  // namespace dispatchd::console
