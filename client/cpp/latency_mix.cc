#include "client/cpp/latency_mix.h"

#include <cmath>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace dispatchd::client {
namespace {

absl::Status Bad(absl::string_view part, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("latency mix \"", part, "\": ", why));
}

absl::StatusOr<absl::Duration> ParseNonNegative(absl::string_view part, absl::string_view text) {
  text = absl::StripAsciiWhitespace(text);
  absl::Duration d;
  if (text.empty() || !absl::ParseDuration(text, &d) || d == absl::InfiniteDuration()) {
    return Bad(part, absl::StrCat("bad duration \"", text, "\""));
  }
  if (d < absl::ZeroDuration()) return Bad(part, absl::StrCat("negative duration \"", text, "\""));
  return d;
}

}  // namespace

absl::Duration LatencyMix::Sample(std::mt19937_64& rng) const {
  std::uniform_real_distribution<double> unit(0.0, 100.0);
  double pick = unit(rng);
  const Bucket* bucket = &buckets_.back();
  double acc = 0;
  for (const Bucket& b : buckets_) {
    acc += b.percent;
    if (pick < acc) {
      bucket = &b;
      break;
    }
  }
  if (bucket->max <= bucket->min) return bucket->min;
  int64_t lo = absl::ToInt64Nanoseconds(bucket->min);
  int64_t hi = absl::ToInt64Nanoseconds(bucket->max);
  std::uniform_int_distribution<int64_t> span(lo, hi);
  return absl::Nanoseconds(span(rng));
}

absl::StatusOr<LatencyMix> ParseLatencyMix(absl::string_view spec) {
  LatencyMix mix;
  if (absl::StripAsciiWhitespace(spec).empty()) return Bad(spec, "empty");
  double total = 0;
  for (absl::string_view raw : absl::StrSplit(spec, ',')) {
    absl::string_view part = absl::StripAsciiWhitespace(raw);
    if (part.empty()) return Bad(spec, "empty bucket");
    LatencyMix::Bucket bucket;
    absl::string_view range = part;
    if (size_t colon = part.find(':'); colon != absl::string_view::npos) {
      absl::string_view pct = absl::StripAsciiWhitespace(part.substr(0, colon));
      range = part.substr(colon + 1);
      if (!absl::ConsumeSuffix(&pct, "%")) {
        return Bad(part, absl::StrCat("percentage \"", pct, "\" must end in %"));
      }
      if (!absl::SimpleAtod(pct, &bucket.percent) || !std::isfinite(bucket.percent) ||
          bucket.percent <= 0 || bucket.percent > 100) {
        return Bad(part, absl::StrCat("bad percentage \"", pct, "%\" (want 0 < P <= 100)"));
      }
    } else {
      bucket.percent = 100;
    }
    range = absl::StripAsciiWhitespace(range);
    // The range separator is the first '-' after the first character (a leading '-' is a sign).
    size_t dash = range.size() > 1 ? range.find('-', 1) : absl::string_view::npos;
    if (dash == absl::string_view::npos) {
      absl::StatusOr<absl::Duration> d = ParseNonNegative(part, range);
      if (!d.ok()) return d.status();
      bucket.min = bucket.max = *d;
    } else {
      absl::StatusOr<absl::Duration> lo = ParseNonNegative(part, range.substr(0, dash));
      if (!lo.ok()) return lo.status();
      absl::StatusOr<absl::Duration> hi = ParseNonNegative(part, range.substr(dash + 1));
      if (!hi.ok()) return hi.status();
      if (*hi < *lo) return Bad(part, "range end is before its start");
      bucket.min = *lo;
      bucket.max = *hi;
    }
    total += bucket.percent;
    mix.buckets_.push_back(bucket);
  }
  if (std::fabs(total - 100.0) > 1e-6) {
    return Bad(spec, absl::StrCat("percentages add up to ", total, ", not 100"));
  }
  return mix;
}

}  // namespace dispatchd::client
