#pragma once

// A latency mix for simulated jobs: weighted buckets of durations, drawn at random.
//
//   absl::StatusOr<LatencyMix> mix = ParseLatencyMix("95%:1s-5s,5%:20s-40s");
//   std::mt19937_64 rng(seed);
//   absl::Duration d = mix->Sample(rng);
//
// A LatencyMix is an immutable value: const methods are safe from any thread (the generator passed
// to Sample is the caller's to guard).

#include <random>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace dispatchd::client {

class LatencyMix {
 public:
  // One bucket: `percent` of the draws are uniform in [min, max] (min == max: a fixed value).
  struct Bucket {
    double percent = 0;
    absl::Duration min;
    absl::Duration max;
  };

  const std::vector<Bucket>& buckets() const { return buckets_; }

  // Draws one duration: picks a bucket by weight, then a uniform duration within it.
  absl::Duration Sample(std::mt19937_64& rng) const;

 private:
  friend absl::StatusOr<LatencyMix> ParseLatencyMix(absl::string_view spec);
  std::vector<Bucket> buckets_;
};

// Parses `P%:RANGE[,P%:RANGE...]`, where P is a percentage (decimals allowed) and RANGE is a
// duration (`2s`) or a range `A-B` with A <= B, in absl::ParseDuration syntax (`250ms`, `1.5s`,
// `2m`). The percentages must add up to 100. A bare RANGE with no `P%:` means 100%.
// Errors are INVALID_ARGUMENT and name the bad part, e.g. `latency mix "95%:1s-x": bad duration
// "x"`.
absl::StatusOr<LatencyMix> ParseLatencyMix(absl::string_view spec);

}  // namespace dispatchd::client
