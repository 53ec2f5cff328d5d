#include "client/cpp/dispatchctl_admin_commands.h"

#include <cstdint>
#include <iostream>
#include <map>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include <unistd.h>

#include "client/cpp/dispatchctl_exit.h"
#include "client/cpp/dispatchctl_render.h"

namespace dispatchd::client::ctl {

int CmdTop(Client& client, absl::Duration interval, int iterations) {
  const bool tty = isatty(STDOUT_FILENO) != 0;
  std::map<std::string, std::pair<int64_t, int64_t>> last;  // type: succeeded, failed
  absl::Time last_at = absl::InfinitePast();
  for (int i = 0; iterations <= 0 || i < iterations; ++i) {
    if (i > 0) absl::SleepFor(interval);
    absl::StatusOr<v1::StatsResponse> r = client.Stats();
    if (!r.ok()) return Fail(r.status());
    const absl::Time now = absl::Now();
    const double seconds = absl::ToDoubleSeconds(now - last_at);
    std::ostringstream page;
    if (tty) page << "\033[H\033[2J";
    const v1::LeaderInfo& leader = r->leader();
    page << "dispatchd " << (leader.address().empty() ? "(no leader)" : leader.address())
         << "  workers " << r->workers() << "  slots " << r->slots_busy() << "/" << r->slots_total()
         << " busy  " << absl::FormatTime("%H:%M:%S", now, absl::LocalTimeZone()) << "\n\n";
    std::cout << page.str();
    std::vector<std::vector<std::string>> rows = {
        {"TYPE", "QUEUED", "RUNNING", "DONE/S", "FAILED/S", "WAITING-ON"}};
    for (const v1::TypeStats& t : r->types()) {
      std::string done = "-", failed = "-";
      if (auto it = last.find(t.type()); it != last.end() && seconds > 0) {
        done = FormatNumber(static_cast<double>(t.succeeded() - it->second.first) / seconds, 1);
        failed = FormatNumber(static_cast<double>(t.failed() - it->second.second) / seconds, 1);
      }
      last[t.type()] = {t.succeeded(), t.failed()};
      rows.push_back({t.type(), absl::StrCat(t.queued()),
                      absl::StrCat(t.dispatched() + t.running()), done, failed,
                      WaitCell(t.head_wait_reason(), t.queued())});
    }
    PrintTable(rows);
    std::vector<std::vector<std::string>> models = {
        {"MODEL", "QUEUED", "RUNNING", "TOKENS", "RATE", "WAITING-ON"}};
    for (const v1::ModelStats& m : r->models()) {
      if (m.tokens() < 0) continue;  // only the rate-limited ones
      models.push_back({m.model(), absl::StrCat(m.queued()), absl::StrCat(m.running()),
                        FormatNumber(m.tokens()), FormatRate(m.rate_per_second()),
                        WaitCell(m.head_wait_reason(), m.queued())});
    }
    if (models.size() > 1) {
      std::cout << "\n";
      PrintTable(models);
    }
    if (!tty) std::cout << "\n";
    std::cout << std::flush;
    last_at = now;
  }
  return kOk;
}

int CmdDrain(Client& client, const std::string& worker_id, bool json) {
  absl::StatusOr<v1::DrainWorkerResponse> r = client.DrainWorker(worker_id);
  if (!r.ok()) return Fail(r.status());
  if (json) {
    std::cout << ToJson(*r) << "\n";
  } else {
    const v1::WorkerInfo& w = r->worker();
    std::cout << w.worker_id() << ": draining; " << w.busy()
              << (w.busy() == 1 ? " job finishes" : " jobs finish")
              << " first, and no new job goes to it\n";
  }
  return kOk;
}

int CmdReload(Client& client, bool json) {
  absl::StatusOr<v1::ReloadResponse> r = client.Reload();
  if (!r.ok()) return Fail(r.status());
  if (json) {
    std::cout << ToJson(*r) << "\n";
    return kOk;
  }
  std::cout << "reloaded " << r->path() << ": " << r->types()
            << (r->types() == 1 ? " type" : " types") << ", " << r->tiers()
            << (r->tiers() == 1 ? " tier" : " tiers") << "\n";
  for (const std::string& key : r->restart_only()) {
    std::cout << "  " << key
              << " differs in the file; it keeps its running value until a restart\n";
  }
  return kOk;
}

int CmdHealth(Client& client, const std::string& service, bool json) {
  absl::StatusOr<grpc::health::v1::HealthCheckResponse::ServingStatus> r = client.Health(service);
  if (!r.ok()) return Fail(r.status());
  const std::string name = grpc::health::v1::HealthCheckResponse::ServingStatus_Name(*r);
  if (json) {
    grpc::health::v1::HealthCheckResponse response;
    response.set_status(*r);
    std::cout << ToJson(response) << "\n";
  } else {
    std::cout << name << "\n";
  }
  return *r == grpc::health::v1::HealthCheckResponse::SERVING ? kOk : kNotServing;
}

int CmdWorkers(Client& client, bool json) {
  absl::StatusOr<v1::ListWorkersResponse> r = client.ListWorkers();
  if (!r.ok()) return Fail(r.status());
  if (json) {
    std::cout << ToJson(*r) << "\n";
    return kOk;
  }
  PrintWorkers(*r);
  return kOk;
}

int CmdStats(Client& client, bool json) {
  absl::StatusOr<v1::StatsResponse> r = client.Stats();
  if (!r.ok()) return Fail(r.status());
  if (json) {
    std::cout << ToJson(*r) << "\n";
    return kOk;
  }
  PrintStats(*r);
  return kOk;
}

int CmdSetRateLimit(Client& client, const RateLimitFlags& flags, bool json) {
  v1::SetRateLimitRequest req;
  req.set_model(flags.model);
  if (!flags.clear) {
    if (!flags.rpm.has_value() && !flags.rps.has_value()) {
      return Usage("set-rate-limit: give --rpm N or --rps N (or --clear to remove the limit)");
    }
    // 0 on the wire means "unset" (and both unset clears the limit): refuse it here.
    for (const auto& [flag, value] :
         {std::pair{"--rpm", flags.rpm}, std::pair{"--rps", flags.rps}}) {
      if (value.has_value() && !(*value > 0)) {
        return Usage(absl::StrCat(flag, ": must be > 0, got ", FormatNumber(*value, 6)));
      }
    }
    if (flags.rpm.has_value()) req.set_rpm(*flags.rpm);
    if (flags.rps.has_value()) req.set_rps(*flags.rps);
    if (flags.burst.has_value()) req.set_burst(*flags.burst);
  }
  absl::StatusOr<v1::SetRateLimitResponse> r = client.SetRateLimit(req);
  if (!r.ok()) return Fail(r.status());
  if (json) {
    std::cout << ToJson(*r) << "\n";
  } else if (r->rate_per_second() <= 0) {
    std::cout << r->model() << ": no rate limit (until the daemon's next config load)\n";
  } else {
    std::cout << r->model() << ": rate " << FormatRate(r->rate_per_second()) << ", burst "
              << r->burst() << " (until the daemon's next config load)\n";
  }
  return kOk;
}

int CmdSetWeight(Client& client, const std::string& tenant, double weight, bool json) {
  v1::SetTenantWeightRequest req;
  req.set_tenant(tenant);
  req.set_weight(weight);
  absl::StatusOr<v1::SetTenantWeightResponse> r = client.SetTenantWeight(req);
  if (!r.ok()) return Fail(r.status());
  if (json) {
    std::cout << ToJson(*r) << "\n";
  } else {
    std::cout << r->tenant() << ": weight " << FormatNumber(r->weight(), 6)
              << " (until the daemon's next config load)\n";
  }
  return kOk;
}

}  // namespace dispatchd::client::ctl
