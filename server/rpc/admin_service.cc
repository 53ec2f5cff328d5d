#include "server/rpc/admin_service.h"

#include <map>
#include <string>

#include "server/util/grpc_status.h"

namespace dispatchd::rpc {

grpc::ServerUnaryReactor* AdminServiceImpl::Stats(grpc::CallbackServerContext* ctx,
                                                  const v1::StatsRequest*,
                                                  v1::StatsResponse* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  executor_.Schedule([this, resp, reactor] {
    absl::StatusOr<std::vector<store::TypeStateCount>> counts = store_.CountByTypeAndState();
    if (!counts.ok()) {
      reactor->Finish(server::ToGrpcStatus(counts.status()));
      return;
    }
    std::map<std::string, v1::TypeStats> by_type;
    for (const config::JobTypeConfig& t : config_.types) by_type[t.name].set_type(t.name);
    for (const store::TypeStateCount& c : *counts) {
      v1::TypeStats& s = by_type[c.type];
      s.set_type(c.type);
      switch (c.state) {
        case job::JobState::kQueued: s.set_queued(c.count); break;
        case job::JobState::kDispatched: s.set_dispatched(c.count); break;
        case job::JobState::kRunning: s.set_running(c.count); break;
        case job::JobState::kSucceeded: s.set_succeeded(c.count); break;
        case job::JobState::kFailed: s.set_failed(c.count); break;
        case job::JobState::kCancelled: s.set_cancelled(c.count); break;
        case job::JobState::kExpired: s.set_expired(c.count); break;
      }
    }
    for (auto& [name, s] : by_type) *resp->add_types() = std::move(s);
    for (const v1::WorkerInfo& w : dispatcher_.Workers()) {
      resp->set_workers(resp->workers() + 1);
      resp->set_slots_total(resp->slots_total() + w.slots());
      resp->set_slots_busy(resp->slots_busy() + w.busy());
    }
    reactor->Finish(grpc::Status::OK);
  });
  return reactor;
}

grpc::ServerUnaryReactor* AdminServiceImpl::ListWorkers(grpc::CallbackServerContext* ctx,
                                                        const v1::ListWorkersRequest*,
                                                        v1::ListWorkersResponse* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  executor_.Schedule([this, resp, reactor] {
    for (v1::WorkerInfo& w : dispatcher_.Workers()) *resp->add_workers() = std::move(w);
    reactor->Finish(grpc::Status::OK);
  });
  return reactor;
}

}  // namespace dispatchd::rpc
