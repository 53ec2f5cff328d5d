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
// standby answers ListWorkers, SetRateLimit and SetTenantWeight UNAVAILABLE, naming the leader.
// Admins only; each action that changes something (reload, drain, rate limit, tenant weight)
// leaves an audit line in the log.
// Thread-safe.
// Every method takes raw bytes (see raw_call.h).
using RawAdminService = v1::AdminService::WithRawCallbackMethod_Stats<
    v1::AdminService::WithRawCallbackMethod_ListWorkers<
        v1::AdminService::WithRawCallbackMethod_SetRateLimit<
            v1::AdminService::WithRawCallbackMethod_DrainWorker<
                v1::AdminService::WithRawCallbackMethod_Reload<
                    v1::AdminService::WithRawCallbackMethod_SetTenantWeight<
                        v1::AdminService::Service>>>>>>;

class AdminServiceImpl final : public RawAdminService {
 public:
  // Re-reads the config file and applies it (the daemon's SIGHUP path); an error status when
  // the file is refused. Blocking; called on the executor.
  using Reloader = std::function<absl::StatusOr<v1::ReloadResponse>()>;

  AdminServiceImpl(const config::LiveConfig& config, const auth::Gate& gate, store::JobStore& store,
                   ha::Leadership& leadership, server::Executor& executor, Reloader reload)
      : config_(config),
        gate_(gate),
        store_(store),
        leadership_(leadership),
        executor_(executor),
        reload_(std::move(reload)) {}

  grpc::ServerUnaryReactor* Stats(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                  grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ListWorkers(grpc::CallbackServerContext* ctx,
                                        const grpc::ByteBuffer* request,
                                        grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* SetRateLimit(grpc::CallbackServerContext* ctx,
                                         const grpc::ByteBuffer* request,
                                         grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* DrainWorker(grpc::CallbackServerContext* ctx,
                                        const grpc::ByteBuffer* request,
                                        grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Reload(grpc::CallbackServerContext* ctx,
                                   const grpc::ByteBuffer* request,
                                   grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* SetTenantWeight(grpc::CallbackServerContext* ctx,
                                            const grpc::ByteBuffer* request,
                                            grpc::ByteBuffer* response) override;

  // Fairness keys listed in a StatsResponse (the lowest-cost ones); `keys_total` counts all.
  static constexpr size_t kMaxStatsKeys = 100;

 private:
  // The caller, if it may call `method`; else answers `call` with the refusal.
  template <typename Call>
  std::optional<auth::Principal> Authorize(grpc::CallbackServerContext* ctx, auth::Method method,
                                           Call* call) const {
    absl::StatusOr<auth::Principal> caller = gate_.Authorize(*ctx, method);
    if (caller.ok()) return *std::move(caller);
    call->Reply(caller.status());
    return std::nullopt;
  }

  const config::LiveConfig& config_;
  const auth::Gate& gate_;
  store::JobStore& store_;
  ha::Leadership& leadership_;
  server::Executor& executor_;
  const Reloader reload_;
};

}  // namespace dispatchd::rpc
