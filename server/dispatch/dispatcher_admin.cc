// What other threads ask of the dispatcher loop and wait for: the scheduler's figures, why a job
// waits, and the settings an operator changes live (rate limits, tenant weights, a reloaded
// config). Each runs on the loop through RunOnLoop or AskLoop. See dispatcher.h.

#include <optional>
#include <string>
#include <utility>

#include "server/dispatch/dispatcher.h"
#include "server/dispatch/queue_pager.h"
#include "server/util/log.h"

namespace dispatchd::dispatch {

sched::SchedulerStats Dispatcher::SchedulerStats(size_t max_keys) {
  return AskLoop([this, max_keys] {
           loop_role_.Assert();
           return StatsNow(max_keys);
         })
      .value_or(sched::SchedulerStats{});
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
  struct Answer {
    std::optional<sched::WaitInfo> wait;
    bool outside = false;
  };
  std::optional<Answer> answer = AskLoop([this, id = job.id, queue = QueueOf(job), seq = job.seq] {
    loop_role_.Assert();
    Answer out;
    if (scheduler_.IsPending(id)) {
      out.wait = scheduler_.WhyWaiting(id, clock_.TimeNow());
    } else if (pager_.PagedOut(queue, seq)) {
      // In line behind every job of its queue held here.
      out.outside = true;
      out.wait = sched::WaitInfo{.reason = sched::WaitReason::kInLine,
                                 .position = scheduler_.queued_of(queue.first, queue.second) + 1};
    }
    return out;
  });
  if (!answer.has_value()) return std::nullopt;
  if (paged_out != nullptr) *paged_out = answer->outside;
  return std::move(answer->wait);
}

bool Dispatcher::SetRateLimit(const std::string& rate_key, config::RateLimit limit) {
  return AskLoop([this, rate_key, limit] {
           loop_role_.Assert();
           const bool set = scheduler_.SetRateLimit(rate_key, limit, clock_.TimeNow());
           if (set) {
             server::Log("dispatch")
                 ->info("rate limit set key={} per_second={} burst={}", rate_key, limit.per_second,
                        limit.burst);
           }
           return set;
         })
      .value_or(false);
}

bool Dispatcher::SetTenantWeight(const std::string& tenant, double weight) {
  return AskLoop([this, tenant, weight] {
           loop_role_.Assert();
           const bool set = scheduler_.SetTenantWeight(tenant, weight, clock_.TimeNow());
           if (set) {
             server::Log("dispatch")->info("tenant weight set tenant={} weight={}", tenant, weight);
           }
           return set;
         })
      .value_or(false);
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
