// What other threads ask of the dispatcher loop and wait for: the scheduler's figures, why a job
// waits, and the settings an operator changes live (rate limits, tenant weights, a reloaded
// config). Each runs on the loop through RunOnLoop. See dispatcher.h.

#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "server/dispatch/dispatcher.h"
#include "server/dispatch/queue_pager.h"
#include "server/util/log.h"

namespace dispatchd::dispatch {

sched::SchedulerStats Dispatcher::SchedulerStats(size_t max_keys) {
  auto out = std::make_shared<sched::SchedulerStats>();
  // A late task may still write *out: read it only if the loop ran it in time.
  if (!RunOnLoop([this, out, max_keys] {
        loop_role_.Assert();
        *out = StatsNow(max_keys);
      })) {
    return {};
  }
  return std::move(*out);
}

sched::SchedulerStats Dispatcher::StatsNow(size_t max_keys) {
  sched::SchedulerStats out = scheduler_.Stats(clock_.TimeNow(), max_keys);
  pager_.ForEachUnheld([&](const QueueId& queue, int64_t unheld) {
    loop_role_.Assert();
    scheduler_.AddQueued(out, queue.first, queue.second, unheld);
  });
  return out;
}

std::optional<sched::WaitInfo> Dispatcher::WhyWaiting(const job::Job& job, bool* paged_out) {
  auto out = std::make_shared<std::optional<sched::WaitInfo>>();
  auto outside = std::make_shared<bool>(false);
  if (!RunOnLoop([this, out, outside, id = job.id, queue = QueueOf(job), seq = job.seq] {
        loop_role_.Assert();
        if (scheduler_.IsPending(id)) {
          *out = scheduler_.WhyWaiting(id, clock_.TimeNow());
          return;
        }
        if (pager_.PagedOut(queue, seq)) {
          // In line behind every job of its queue held here.
          *outside = true;
          *out = sched::WaitInfo{.reason = sched::WaitReason::kInLine,
                                 .position = scheduler_.queued_of(queue.first, queue.second) + 1};
        }
      })) {
    return std::nullopt;
  }
  if (paged_out != nullptr) *paged_out = *outside;
  return *out;
}

bool Dispatcher::SetRateLimit(const std::string& rate_key, config::RateLimit limit) {
  auto out = std::make_shared<bool>(false);
  bool ran = RunOnLoop([this, out, rate_key, limit] {
    loop_role_.Assert();
    *out = scheduler_.SetRateLimit(rate_key, limit, clock_.TimeNow());
    if (*out) {
      server::Log("dispatch")
          ->info("rate limit set key={} per_second={} burst={}", rate_key, limit.per_second,
                 limit.burst);
    }
  });
  return ran && *out;
}

bool Dispatcher::SetTenantWeight(const std::string& tenant, double weight) {
  auto out = std::make_shared<bool>(false);
  bool ran = RunOnLoop([this, out, tenant, weight] {
    loop_role_.Assert();
    *out = scheduler_.SetTenantWeight(tenant, weight, clock_.TimeNow());
    if (*out) {
      server::Log("dispatch")->info("tenant weight set tenant={} weight={}", tenant, weight);
    }
  });
  return ran && *out;
}

bool Dispatcher::UpdateConfig(config::Config config) {
  return RunOnLoop([this, config = std::move(config)]() mutable {
    loop_role_.Assert();
    config_ = std::move(config);
    scheduler_.UpdateConfig(config_, clock_.TimeNow());
    for (const std::string& warning : config_.Warnings()) {
      server::Log("dispatch")->warn("{}", warning);
    }
  });
}

}  // namespace dispatchd::dispatch
