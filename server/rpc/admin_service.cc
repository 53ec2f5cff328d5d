#include "server/rpc/admin_service.h"

#include <cmath>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

#include "lib/sched/scheduler.h"
#include "server/rpc/raw_call.h"
#include "server/util/grpc_status.h"
#include "server/util/log.h"

namespace dispatchd::rpc {
namespace {

std::string Reason(sched::WaitReason r) { return std::string(sched::ToString(r)); }

// One structured line per admin action, naming who did it (`local` with no authentication).
template <typename... Args>
void Audit(const auth::Principal& caller, const char* action, fmt::format_string<Args...> what,
           Args&&... args) {
  server::Log("audit")->info("action={} principal={} {}", action,
                             caller.authenticated ? caller.name : "local",
                             fmt::format(what, std::forward<Args>(args)...));
}

// The scheduler's part of a StatsResponse: tiers, models, keys (capped) and each type's head
// wait reason.
void AddSchedulerStats(const sched::SchedulerStats& s, size_t max_keys, v1::StatsResponse* resp) {
  absl::flat_hash_map<std::string, sched::WaitReason> type_heads;
  for (const sched::SchedulerStats::Type& t : s.types) type_heads[t.name] = t.head;
  for (v1::TypeStats& t : *resp->mutable_types()) {
    auto it = type_heads.find(t.type());
    t.set_head_wait_reason(Reason(it == type_heads.end() ? sched::WaitReason::kNone : it->second));
  }
  for (const sched::SchedulerStats::Tier& t : s.tiers) {
    v1::TierStats* out = resp->add_tiers();
    out->set_tier(t.name);
    out->set_priority(t.priority);
    out->set_cap(t.cap == config::kUnlimited ? 0 : t.cap);
    out->set_queued(t.queued);
    out->set_running(t.running);
    out->set_head_wait_reason(Reason(t.head));
  }
  for (const sched::SchedulerStats::Model& m : s.models) {
    v1::ModelStats* out = resp->add_models();
    out->set_model(m.name);
    out->set_queued(m.queued);
    out->set_running(m.running);
    const bool limited = m.tokens >= 0;
    out->set_tokens(limited ? m.tokens : -1);
    out->set_rate_per_second(limited ? m.per_second : 0);
    out->set_burst(limited ? m.burst : 0);
    out->set_resident_on(m.resident_on);
    out->set_head_wait_reason(Reason(m.head));
  }
  // Keys come sorted by cost, lowest first: the first ones are those served next.
  for (size_t i = 0; i < s.keys.size() && i < max_keys; ++i) {
    const sched::SchedulerStats::Key& k = s.keys[i];
    v1::KeyStats* out = resp->add_keys();
    out->set_fairness_key(k.name);
    out->set_tenant(k.tenant);
    out->set_queued(k.queued);
    out->set_running(k.running);
    out->set_cost(k.cost);
    out->set_head_wait_reason(Reason(k.head));
  }
  resp->set_keys_total(s.keys_total);
  resp->set_virtual_time(s.virtual_time);
  // Tenants with work first, then by name; at most as many as keys.
  std::vector<const sched::SchedulerStats::Tenant*> tenants;
  for (const sched::SchedulerStats::Tenant& t : s.tenants) tenants.push_back(&t);
  std::stable_sort(tenants.begin(), tenants.end(), [](const auto* a, const auto* b) {
    return (a->queued + a->running > 0) > (b->queued + b->running > 0);
  });
  for (size_t i = 0; i < tenants.size() && i < max_keys; ++i) {
    const sched::SchedulerStats::Tenant& t = *tenants[i];
    v1::TenantStats* out = resp->add_tenants();
    out->set_tenant(t.name);
    out->set_weight(t.weight);
    out->set_queued(t.queued);
    out->set_running(t.running);
    out->set_share(t.share);
    out->set_fair_share(t.fair_share);
    out->set_cost(t.cost);
    out->set_max_running(t.max_running == config::kUnlimited ? 0 : t.max_running);
    out->set_min_running(t.min_running);
    out->set_keys(t.keys);
  }
}

// The rate limit a SetRateLimitRequest asks for, or INVALID_ARGUMENT naming the field.
absl::StatusOr<config::RateLimit> ParseRateLimit(const v1::SetRateLimitRequest& req) {
  if (req.model().empty()) return absl::InvalidArgumentError("model: required");
  for (const auto& [name, value] : {std::pair{"rpm", req.rpm()}, std::pair{"rps", req.rps()}}) {
    if (value == 0) continue;  // unset
    if (!(value > 0)) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": must be > 0, got ", value));
    }
    if (!std::isfinite(value)) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": must be finite"));
    }
  }
  if (req.rpm() != 0 && req.rps() != 0) {
    return absl::InvalidArgumentError(
        "rpm, rps: set one, not both (rpm: per minute, rps: per second)");
  }
  if (req.has_burst() && req.burst() < 1) {
    return absl::InvalidArgumentError(absl::StrCat("burst: must be >= 1, got ", req.burst()));
  }
  config::RateLimit limit;
  limit.per_second = req.rpm() != 0 ? req.rpm() / 60 : req.rps();
  if (!limit.limited()) {
    if (req.has_burst()) {
      return absl::InvalidArgumentError(
          "burst: needs rpm or rps (to clear the limit, send neither rpm, rps nor burst)");
    }
    return config::RateLimit{.per_second = 0, .burst = 1};
  }
  limit.burst = req.has_burst() ? req.burst() : 1;
  return limit;
}

// The answer of a standby to a call only the leader can serve.
grpc::Status NotLeader(const ha::LeaderInfo& leader) {
  return grpc::Status(
      grpc::StatusCode::UNAVAILABLE,
      leader.address.empty()
          ? std::string("this daemon is a standby and no leader is known yet; try again")
          : absl::StrCat("this daemon is a standby; ask the leader at ", leader.address));
}

}  // namespace

grpc::ServerUnaryReactor* AdminServiceImpl::Stats(grpc::CallbackServerContext* ctx,
                                                  const grpc::ByteBuffer* request,
                                                  grpc::ByteBuffer* response) {
  bool parsed = false;
  auto* reactor = StartUnary<v1::StatsRequest, v1::StatsResponse>(request, response, &parsed);
  if (!parsed) return reactor;
  v1::StatsResponse* resp = &reactor->response();
  if (!Authorize(ctx, auth::Method::kStats, reactor)) return reactor;
  executor_.Schedule([this, resp, reactor] {
    absl::StatusOr<std::vector<store::TypeStateCount>> counts = store_.CountByTypeAndState();
    if (!counts.ok()) {
      reactor->Reply(server::ToGrpcStatus(counts.status()));
      return;
    }
    std::map<std::string, v1::TypeStats> by_type;
    const std::shared_ptr<const config::Config> config = config_.Get();
    for (const config::JobTypeConfig& t : config->types) by_type[t.name].set_type(t.name);
    for (const store::TypeStateCount& c : *counts) {
      v1::TypeStats& s = by_type[c.type];
      s.set_type(c.type);
      switch (c.state) {
        case job::JobState::kQueued:
          s.set_queued(c.count);
          break;
        case job::JobState::kDispatched:
          s.set_dispatched(c.count);
          break;
        case job::JobState::kRunning:
          s.set_running(c.count);
          break;
        case job::JobState::kSucceeded:
          s.set_succeeded(c.count);
          break;
        case job::JobState::kFailed:
          s.set_failed(c.count);
          break;
        case job::JobState::kCancelled:
          s.set_cancelled(c.count);
          break;
        case job::JobState::kExpired:
          s.set_expired(c.count);
          break;
      }
    }
    for (auto& [name, s] : by_type) *resp->add_types() = std::move(s);
    const ha::LeaderInfo leader = leadership_.leader();
    resp->mutable_leader()->set_is_leader(leader.is_leader);
    resp->mutable_leader()->set_address(leader.address);
    resp->mutable_leader()->set_epoch(leader.epoch);
    if (std::shared_ptr<dispatch::Dispatcher> d = leadership_.dispatcher()) {
      for (const v1::WorkerInfo& w : d->Workers()) {
        resp->set_workers(resp->workers() + 1);
        resp->set_slots_total(resp->slots_total() + w.slots());
        resp->set_slots_busy(resp->slots_busy() + w.busy());
      }
      AddSchedulerStats(d->SchedulerStats(kMaxStatsKeys), kMaxStatsKeys, resp);
      resp->set_accounting_repairs(d->repairs());
    }
    reactor->Reply(grpc::Status::OK);
  });
  return reactor;
}

grpc::ServerUnaryReactor* AdminServiceImpl::ListWorkers(grpc::CallbackServerContext* ctx,
                                                        const grpc::ByteBuffer* request,
                                                        grpc::ByteBuffer* response) {
  bool parsed = false;
  auto* reactor =
      StartUnary<v1::ListWorkersRequest, v1::ListWorkersResponse>(request, response, &parsed);
  if (!parsed) return reactor;
  v1::ListWorkersResponse* resp = &reactor->response();
  if (!Authorize(ctx, auth::Method::kListWorkers, reactor)) return reactor;
  executor_.Schedule([this, resp, reactor] {
    std::shared_ptr<dispatch::Dispatcher> d = leadership_.dispatcher();
    if (d == nullptr) {
      reactor->Reply(NotLeader(leadership_.leader()));
      return;
    }
    for (v1::WorkerInfo& w : d->Workers()) *resp->add_workers() = std::move(w);
    reactor->Reply(grpc::Status::OK);
  });
  return reactor;
}

grpc::ServerUnaryReactor* AdminServiceImpl::DrainWorker(grpc::CallbackServerContext* ctx,
                                                        const grpc::ByteBuffer* request,
                                                        grpc::ByteBuffer* response) {
  bool parsed = false;
  auto* reactor =
      StartUnary<v1::DrainWorkerRequest, v1::DrainWorkerResponse>(request, response, &parsed);
  if (!parsed) return reactor;
  const v1::DrainWorkerRequest* req = &reactor->request();
  v1::DrainWorkerResponse* resp = &reactor->response();
  std::optional<auth::Principal> caller = Authorize(ctx, auth::Method::kDrainWorker, reactor);
  if (!caller) return reactor;
  if (req->worker_id().empty()) {
    reactor->Reply(
        grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "worker_id: required (see ListWorkers)"));
    return reactor;
  }
  executor_.Schedule([this, req, resp, reactor, caller = *std::move(caller)] {
    std::shared_ptr<dispatch::Dispatcher> d = leadership_.dispatcher();
    if (d == nullptr) {
      reactor->Reply(NotLeader(leadership_.leader()));
      return;
    }
    Audit(caller, "drain_worker", "worker={}", req->worker_id());
    absl::StatusOr<v1::WorkerInfo> worker = d->DrainWorker(req->worker_id());
    if (!worker.ok()) {
      const absl::Status& status = worker.status();
      reactor->Reply(
          absl::IsNotFound(status)
              ? absl::Status(status.code(), absl::StrCat("worker_id: ", status.message()))
              : status);
      return;
    }
    *resp->mutable_worker() = *std::move(worker);
    reactor->Reply(grpc::Status::OK);
  });
  return reactor;
}

grpc::ServerUnaryReactor* AdminServiceImpl::Reload(grpc::CallbackServerContext* ctx,
                                                   const grpc::ByteBuffer* request,
                                                   grpc::ByteBuffer* response) {
  bool parsed = false;
  auto* reactor = StartUnary<v1::ReloadRequest, v1::ReloadResponse>(request, response, &parsed);
  if (!parsed) return reactor;
  v1::ReloadResponse* resp = &reactor->response();
  std::optional<auth::Principal> caller = Authorize(ctx, auth::Method::kReload, reactor);
  if (!caller) return reactor;
  if (!reload_) {
    reactor->Reply(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                                "reload: this daemon has no config file"));
    return reactor;
  }
  executor_.Schedule([this, resp, reactor, caller = *std::move(caller)] {
    Audit(caller, "reload", "via=AdminService.Reload");
    absl::StatusOr<v1::ReloadResponse> done = reload_();
    if (!done.ok()) {
      reactor->Reply(server::ToGrpcStatus(done.status()));
      return;
    }
    *resp = *std::move(done);
    reactor->Reply(grpc::Status::OK);
  });
  return reactor;
}

grpc::ServerUnaryReactor* AdminServiceImpl::SetRateLimit(grpc::CallbackServerContext* ctx,
                                                         const grpc::ByteBuffer* request,
                                                         grpc::ByteBuffer* response) {
  bool parsed = false;
  auto* reactor =
      StartUnary<v1::SetRateLimitRequest, v1::SetRateLimitResponse>(request, response, &parsed);
  if (!parsed) return reactor;
  const v1::SetRateLimitRequest* req = &reactor->request();
  v1::SetRateLimitResponse* resp = &reactor->response();
  std::optional<auth::Principal> caller = Authorize(ctx, auth::Method::kSetRateLimit, reactor);
  if (!caller) return reactor;
  absl::StatusOr<config::RateLimit> limit = ParseRateLimit(*req);
  if (!limit.ok()) {
    reactor->Reply(server::ToGrpcStatus(limit.status()));
    return reactor;
  }
  executor_.Schedule([this, req, resp, reactor, limit = *limit, caller = *std::move(caller)] {
    std::shared_ptr<dispatch::Dispatcher> d = leadership_.dispatcher();
    if (d == nullptr) {
      reactor->Reply(NotLeader(leadership_.leader()));
      return;
    }
    Audit(caller, "set_rate_limit", "model={} rate_per_second={} burst={}", req->model(),
          limit.per_second, limit.burst);
    if (!d->SetRateLimit(req->model(), limit)) {
      std::set<std::string> configured;  // sorted, for the message
      const std::shared_ptr<const config::Config> config = config_.Get();
      for (const config::JobTypeConfig& t : config->types) configured.insert(t.rate_key());
      if (configured.contains(req->model())) {
        // Configured, yet the dispatcher did not apply it: the daemon is stopping.
        reactor->Reply(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                    "the dispatcher did not apply the rate limit; try again"));
        return;
      }
      std::vector<std::string> known(configured.begin(), configured.end());
      constexpr size_t kMaxNamed = 20;
      const bool more = known.size() > kMaxNamed;
      if (more) known.resize(kMaxNamed);
      reactor->Reply(grpc::Status(
          grpc::StatusCode::NOT_FOUND,
          absl::StrCat("model: no configured type uses model \"", req->model(),
                       "\" (configured models, and types without one: ", absl::StrJoin(known, ", "),
                       more ? ", ..." : "", ")")));
      return;
    }
    resp->set_model(req->model());
    resp->set_rate_per_second(limit.per_second);
    resp->set_burst(limit.limited() ? limit.burst : 0);
    reactor->Reply(grpc::Status::OK);
  });
  return reactor;
}

grpc::ServerUnaryReactor* AdminServiceImpl::SetTenantWeight(grpc::CallbackServerContext* ctx,
                                                            const grpc::ByteBuffer* request,
                                                            grpc::ByteBuffer* response) {
  bool parsed = false;
  auto* reactor = StartUnary<v1::SetTenantWeightRequest, v1::SetTenantWeightResponse>(
      request, response, &parsed);
  if (!parsed) return reactor;
  const v1::SetTenantWeightRequest* req = &reactor->request();
  v1::SetTenantWeightResponse* resp = &reactor->response();
  std::optional<auth::Principal> caller = Authorize(ctx, auth::Method::kSetTenantWeight, reactor);
  if (!caller) return reactor;
  if (req->tenant().empty()) {
    reactor->Reply(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "tenant: required"));
    return reactor;
  }
  if (!(req->weight() >= 0.001 && req->weight() <= 1e6)) {
    reactor->Reply(
        grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                     absl::StrCat("weight: must be in [0.001, 1000000], got ", req->weight())));
    return reactor;
  }
  executor_.Schedule([this, req, resp, reactor, caller = *std::move(caller)] {
    std::shared_ptr<dispatch::Dispatcher> d = leadership_.dispatcher();
    if (d == nullptr) {
      reactor->Reply(NotLeader(leadership_.leader()));
      return;
    }
    Audit(caller, "set_tenant_weight", "tenant={} weight={}", req->tenant(), req->weight());
    if (!d->SetTenantWeight(req->tenant(), req->weight())) {
      // The weight was checked above: the daemon is stopping.
      reactor->Reply(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                  "the dispatcher did not apply the weight; try again"));
      return;
    }
    resp->set_tenant(req->tenant());
    resp->set_weight(req->weight());
    reactor->Reply(grpc::Status::OK);
  });
  return reactor;
}

}  // namespace dispatchd::rpc
