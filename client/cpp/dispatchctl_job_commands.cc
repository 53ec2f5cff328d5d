#include "client/cpp/dispatchctl_job_commands.h"

#include <iostream>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include <unistd.h>

#include "client/cpp/dispatchctl_exit.h"
#include "client/cpp/dispatchctl_render.h"
#include "proto/convert/time_proto.h"

namespace dispatchd::client::ctl {

int CmdSubmit(Client& client, const SpecFlags& flags, bool json) {
  absl::StatusOr<v1::JobSpec> spec = flags.Build();
  if (!spec.ok()) return Usage(spec.status().message());
  absl::StatusOr<v1::SubmitResponse> r = client.Submit(*spec);
  if (!r.ok()) return Fail(r.status());
  if (json) {
    std::cout << ToJson(*r) << "\n";
  } else {
    std::cout << r->job_id() << (r->deduplicated() ? " (deduplicated)" : "") << "\n";
  }
  if (r->deduplicated()) {
    std::cerr << "dispatchctl: deduplicated: idempotency key \"" << spec->idempotency_key()
              << "\" matched job " << r->job_id() << "; nothing new was queued\n";
  }
  return kOk;
}

int CmdRun(Client& client, const SpecFlags& flags, bool json, absl::Duration wait) {
  absl::StatusOr<v1::JobSpec> spec = flags.Build();
  if (!spec.ok()) return Usage(spec.status().message());
  absl::StatusOr<v1::Job> job = client.RunSync(*spec, wait);
  if (!job.ok()) return Fail(job.status());
  if (json) {
    std::cout << ToJson(*job) << "\n";
  } else if (job->state() == v1::JOB_STATE_SUCCEEDED) {
    PrintRunResult(*job);
  } else {
    std::cerr << "dispatchctl: job " << job->id() << " " << StateName(job->state())
              << (job->error().empty() ? "" : ": ") << job->error() << "\n";
  }
  return ExitForState(job->state());
}

int CmdStatus(Client& client, const std::string& id, bool json) {
  absl::StatusOr<v1::Job> job = client.Status(id);
  if (!job.ok()) return Fail(job.status());
  if (json) {
    std::cout << ToJson(*job) << "\n";
  } else {
    PrintJob(*job);
  }
  return ExitForState(job->state());
}

int CmdCancel(Client& client, const std::string& id, bool json) {
  absl::StatusOr<v1::Job> job = client.Cancel(id);
  if (!job.ok()) return Fail(job.status());
  if (json) {
    std::cout << ToJson(*job) << "\n";
  } else {
    std::cout << job->id() << " " << StateName(job->state()) << "\n";
  }
  if (job->state() == v1::JOB_STATE_CANCELLED) return kOk;
  return IsTerminal(job->state()) ? kFailedPrecondition : kJobActive;
}

int CmdWatch(Client& client, const std::string& id, bool json, absl::Duration wait) {
  v1::JobState last = v1::JOB_STATE_UNSPECIFIED;
  bool any = false;
  std::optional<ProgressLine> progress;
  if (!json && isatty(STDOUT_FILENO)) progress.emplace();
  absl::Status s = client.Watch(
      id,
      [&](const v1::Job& job) {
        any = true;
        last = job.state();
        if (json) {
          std::cout << ToJson(job) << std::endl;
          return;
        }
        // The time of the change as the daemon recorded it, else when it arrived here.
        absl::Time at =
            job.has_updated_at() ? proto_convert::FromProto(job.updated_at()) : absl::Now();
        const std::string line =
            absl::StrCat(FormatUtcTime(at), " ", StateName(job.state()), " attempt=", job.attempt(),
                         " worker=", job.worker_id().empty() ? "-" : job.worker_id());
        if (progress.has_value()) {
          progress->Event(line, StateName(job.state()), at);
        } else {
          std::cout << line << std::endl;
        }
      },
      wait);
  progress.reset();
  if (!s.ok()) return Fail(s);
  if (!any) return kJobActive;
  return ExitForState(last);
}

}  // namespace dispatchd::client::ctl
