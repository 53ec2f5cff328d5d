#pragma once

#include <functional>
#include <optional>
#include <utility>

#include "absl/status/statusor.h"
#include "dispatchd/v1/admin_service.grpc.pb.h"
#include "lib/config/config.h"
#include "lib/config/live_config.h"
#include "server/auth/grpc_auth.h"
#include "server/ha/leadership.h"
#include "server/store/job_store.h"
#include "server/util/executor.h"

namespace dispatchd::rpc {

// AdminService: what the daemon is doing now. Workers and the scheduler live on the leader: a
// standby answers ListWorkers and SetRateLimit UNAVAILABLE, naming the leader. Admins only; each
// action that changes something (reload, drain, rate limit) leaves an audit line in the log.
// Thread-safe.
class AdminServiceImpl final : public v1::AdminService::CallbackService {
 public:
  // Re-reads the config file and applies it (the daemon's SIGHUP path); an error status when
  // the file is refused. Blocking; called on the executor.
  using Reloader = std::function<absl::StatusOr<v1::ReloadResponse>()>;

  AdminServiceImpl(const config::LiveConfig& config, const auth::Gate& gate,
                   store::JobStore& store, ha::Leadership& leadership, server::Executor& executor,
                   Reloader reload)
      : config_(config),
        gate_(gate),
        store_(store),
        leadership_(leadership),
        executor_(executor),
        reload_(std::move(reload)) {}

  grpc::ServerUnaryReactor* Stats(grpc::CallbackServerContext* ctx, const v1::StatsRequest* req,
                                  v1::StatsResponse* resp) override;
  grpc::ServerUnaryReactor* ListWorkers(grpc::CallbackServerContext* ctx,
                                        const v1::ListWorkersRequest* req,
                                        v1::ListWorkersResponse* resp) override;
  grpc::ServerUnaryReactor* SetRateLimit(grpc::CallbackServerContext* ctx,
                                         const v1::SetRateLimitRequest* req,
                                         v1::SetRateLimitResponse* resp) override;
  grpc::ServerUnaryReactor* DrainWorker(grpc::CallbackServerContext* ctx,
                                        const v1::DrainWorkerRequest* req,
                                        v1::DrainWorkerResponse* resp) override;
  grpc::ServerUnaryReactor* Reload(grpc::CallbackServerContext* ctx, const v1::ReloadRequest* req,
                                   v1::ReloadResponse* resp) override;

  // Fairness keys listed in a StatsResponse (the lowest-cost ones); `keys_total` counts all.
  static constexpr size_t kMaxStatsKeys = 100;

 private:
  // The caller, if it may call `method`; else finishes `reactor` with the refusal.
  std::optional<auth::Principal> Authorize(grpc::CallbackServerContext* ctx, auth::Method method,
                                           grpc::ServerUnaryReactor* reactor) const;

  const config::LiveConfig& config_;
  const auth::Gate& gate_;
  store::JobStore& store_;
  ha::Leadership& leadership_;
  server::Executor& executor_;
  const Reloader reload_;
};

}  // namespace dispatchd::rpc
