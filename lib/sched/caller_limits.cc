#include "lib/sched/caller_limits.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace dispatchd::sched {
namespace {

absl::string_view KeyOf(CallerLimits::Stream kind) {
  return kind == CallerLimits::Stream::kWorker ? "limits.worker_streams_per_principal"
                                               : "limits.watches_per_principal";
}

absl::string_view NounOf(CallerLimits::Stream kind) {
  return kind == CallerLimits::Stream::kWorker ? "worker streams" : "Watch subscriptions";
}

}  // namespace

absl::Status CallerLimits::Open(Stream kind, absl::string_view principal, int limit) {
  absl::MutexLock l(&mu_);
  int& open = CountsOf(kind)[principal];
  if (open >= limit) {
    return absl::ResourceExhaustedError(absl::StrCat("this principal holds ", open, " open ",
                                                     NounOf(kind), ", the most ", KeyOf(kind),
                                                     " allows (", limit, "); close one first"));
  }
  ++open;
  return absl::OkStatus();
}

void CallerLimits::Close(Stream kind, absl::string_view principal) {
  absl::MutexLock l(&mu_);
  Counts& counts = CountsOf(kind);
  auto it = counts.find(principal);
  if (it == counts.end()) return;
  if (--it->second <= 0) counts.erase(it);
}

int CallerLimits::OpenCount(Stream kind, absl::string_view principal) const {
  absl::MutexLock l(&mu_);
  const Counts& counts = kind == Stream::kWorker ? workers_ : watches_;
  auto it = counts.find(principal);
  return it == counts.end() ? 0 : it->second;
}

absl::Status CallerLimits::TakeSubmits(absl::string_view principal, int64_t jobs,
                                       const config::RateLimit& rate, absl::Time now,
                                       absl::Duration* retry_after) {
  if (!rate.limited() || jobs <= 0) return absl::OkStatus();
  if (jobs > rate.burst) {
    return absl::InvalidArgumentError(
        absl::StrCat("limits.submit_burst: a call of ", jobs, " jobs exceeds the ", rate.burst,
                     " this principal may submit at once; split the batch"));
  }
  absl::MutexLock l(&mu_);
  auto [it, inserted] = buckets_.try_emplace(principal, rate, now);
  TokenBucket& bucket = it->second;
  if (!inserted && !(bucket.limit() == rate)) bucket.Reconfigure(rate, now);
  if (bucket.TryTake(now, jobs)) return absl::OkStatus();
  *retry_after = std::max(bucket.NextTokensAt(jobs) - now, absl::Milliseconds(1));
  return absl::ResourceExhaustedError(absl::StrCat(
      "limits.submit_rate: this principal may submit ", rate.per_second, " jobs a second (burst ",
      rate.burst, "); retry in ", absl::FormatDuration(*retry_after)));
}

}  // namespace dispatchd::sched
