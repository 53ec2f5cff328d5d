// The worker's jobs. Each assignment is answered against the jobs running and max_concurrent
// (the worker is the authority on its own capacity); a job accepted runs on a HandlerPool thread
// (with run_inline, on the stream's reader), and its result is kept until acknowledged and sent if
// a session is welcomed; a CancelJob reaches the handler through its JobContext. HandlerPool, at
// the top, owns the threads.

#include "client/cpp/worker_handler_pool.h"

#include <climits>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

#include "client/cpp/worker.h"
#include "client/cpp/worker_log.h"
#include "proto/convert/time_proto.h"

namespace dispatchd::client {
namespace worker_internal {

HandlerPool::~HandlerPool() {
  std::vector<std::thread> threads;
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
    threads.swap(threads_);
  }
  for (std::thread& t : threads) t.join();
}

bool HandlerPool::Start(std::function<void()> task) {
  absl::MutexLock l(&mu_);
  ready_.push_back(std::move(task));
  if (idle_ >= static_cast<int>(ready_.size())) return true;
  try {
    threads_.emplace_back(&HandlerPool::Loop, this);
    ++idle_;
  } catch (const std::system_error&) {
    if (threads_.empty()) {
      ready_.pop_back();
      return false;
    }
    // A thread that exists takes the job when its current one ends.
  }
  return true;
}

void HandlerPool::Loop() {
  while (true) {
    std::function<void()> task;
    {
      absl::MutexLock l(&mu_);
      auto work = [this]()
                      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !ready_.empty(); };
      mu_.Await(absl::Condition(&work));
      if (ready_.empty()) return;  // stopping
      task = std::move(ready_.front());
      ready_.pop_front();
      --idle_;
    }
    task();
    absl::MutexLock l(&mu_);
    ++idle_;
  }
}

}  // namespace worker_internal

namespace {

using worker_internal::Log;

const char* ReasonName(v1::Reject::Reason r) {
  switch (r) {
    case v1::Reject::REASON_RESOURCE_EXHAUSTED:
      return "resource_exhausted";
    case v1::Reject::REASON_UNSUPPORTED:
      return "unsupported";
    case v1::Reject::REASON_DRAINING:
      return "draining";
    default:
      return "unspecified";
  }
}

}  // namespace

void Worker::HandleAssign(const std::shared_ptr<Session>& session, v1::Assign* assign) {
  std::shared_ptr<spdlog::logger> log = Log();
  // What to answer each assignment, decided one by one against the jobs running.
  enum class Action { kAcceptNew, kAcceptAgain, kReject };
  struct Answer {
    const v1::Assignment* assignment;
    Action action = Action::kReject;
    v1::Reject::Reason reason = v1::Reject::REASON_UNSPECIFIED;
    std::string detail;
    std::optional<v1::Result> resend;  // its result, if it already finished
    std::shared_ptr<RunningJob> job;   // kAcceptNew
    int running = 0;                   // jobs running before it
    bool written = false;
  };
  std::vector<Answer> answers;
  answers.reserve(assign->assignments_size());
  {
    absl::MutexLock l(&mu_);
    for (v1::Assignment& a : *assign->mutable_assignments()) {
      Answer& ans = answers.emplace_back(Answer{.assignment = &a});
      JobKey key(a.job_id(), a.attempt());
      ans.running = static_cast<int>(running_.size());
      if (running_.contains(key)) {
        ans.action = Action::kAcceptAgain;
      } else if (const v1::Result* kept = results_.Find(key); kept != nullptr) {
        ans.action = Action::kAcceptAgain;
        ans.resend = *kept;
      } else if (shutdown_ || draining_) {
        ans.reason = v1::Reject::REASON_DRAINING;
        ans.detail = "worker is draining";
      } else if (!types_.contains(a.type())) {
        ans.reason = v1::Reject::REASON_UNSUPPORTED;
        ans.detail = absl::StrCat("worker does not serve type \"", a.type(), "\"");
      } else if (ans.running >= max_concurrent_) {
        ans.reason = v1::Reject::REASON_RESOURCE_EXHAUSTED;
        ans.detail = absl::StrCat(ans.running, " of ", max_concurrent_, " jobs running");
      } else {
        ans.action = Action::kAcceptNew;
        ans.job = std::make_shared<RunningJob>();
        ans.job->key = key;
        // The job's context takes the assignment over; the answer reads it from there.
        ans.job->context = std::make_shared<JobContext>(std::move(a));
        ans.assignment = &ans.job->context->assignment();
        running_.emplace(key, ans.job);
      }
    }
  }

  // The answers go in one Batch where the daemon reads them, else one message each. A job
  // starts only once its Accept is written.
  auto fill = [](const Answer& ans, v1::Accept* accept, v1::Reject* reject) {
    const v1::Assignment& a = *ans.assignment;
    if (ans.action == Action::kReject) {
      reject->set_job_id(a.job_id());
      reject->set_attempt(a.attempt());
      reject->set_reason(ans.reason);
      reject->set_message(ans.detail);
    } else {
      accept->set_job_id(a.job_id());
      accept->set_attempt(a.attempt());
    }
  };
  if (session->batching() && answers.size() > 1) {
    v1::WorkerMessage out;
    v1::Batch* batch = out.mutable_batch();
    for (const Answer& ans : answers) {
      if (ans.action == Action::kReject) {
        fill(ans, nullptr, batch->add_rejects());
      } else {
        fill(ans, batch->add_accepts(), nullptr);
      }
    }
    const bool written = session->Write(out);
    for (Answer& ans : answers) ans.written = written;
  } else {
    for (Answer& ans : answers) {
      v1::WorkerMessage out;
      if (ans.action == Action::kReject) {
        fill(ans, nullptr, out.mutable_reject());
      } else {
        fill(ans, out.mutable_accept(), nullptr);
      }
      ans.written = session->Write(out);
    }
  }

  std::vector<std::shared_ptr<RunningJob>> inline_jobs;  // accepted, with run_inline
  for (Answer& ans : answers) {
    const v1::Assignment& a = *ans.assignment;
    switch (ans.action) {
      case Action::kReject:
        log->info("rejected job={} attempt={} reason={} detail={}", a.job_id(), a.attempt(),
                  ReasonName(ans.reason), ans.detail);
        break;
      case Action::kAcceptAgain:
        log->info("accepted again job={} attempt={} (already held)", a.job_id(), a.attempt());
        if (ans.resend.has_value() && ans.written) {
          session->SendResult(*ans.resend, /*others_running=*/false);
        }
        break;
      case Action::kAcceptNew: {
        const JobKey& key = ans.job->key;
        absl::MutexLock l(&mu_);
        if (!ans.written) {
          // The daemon never saw the Accept: it will offer the job again.
          running_.erase(key);
          if (draining_ && running_.empty()) jobs_done_at_ = absl::Now();
          log->warn("accept not delivered job={} attempt={}", a.job_id(), a.attempt());
          break;
        }
        if (options_.run_inline) {
          inline_jobs.push_back(ans.job);
        } else if (!handlers_.Start([this, job = ans.job] { RunJob(job); })) {
          running_.erase(key);
          v1::Result result;
          result.set_job_id(key.first);
          result.set_attempt(key.second);
          result.mutable_failure()->set_message("worker could not start a handler thread");
          result.mutable_failure()->set_retryable(true);
          results_.Keep(key, std::move(result));
          log->error("thread start failed job={} attempt={}", key.first, key.second);
          break;
        }
        log->info("accepted job={} attempt={} type={} running={}", a.job_id(), a.attempt(),
                  a.type(), ans.running + 1);
        break;
      }
    }
  }

  // With run_inline, the jobs just accepted run here, one after another, and their results go
  // out together.
  std::vector<v1::Result> results;
  std::shared_ptr<Session> to;
  for (const std::shared_ptr<RunningJob>& job : inline_jobs) {
    v1::Result result = RunHandler(*job);
    bool others_running = false;
    if (std::shared_ptr<Session> s = FinishJob(*job, result, &others_running); s != nullptr) {
      to = std::move(s);
      results.push_back(std::move(result));
    }
  }
  if (to != nullptr) to->SendResults(std::move(results));
}

void Worker::HandleCancel(const v1::CancelJob& cancel) {
  std::vector<JobKey> hit;
  {
    absl::MutexLock l(&mu_);
    for (auto it = running_.lower_bound(JobKey(cancel.job_id(), INT32_MIN));
         it != running_.end() && it->first.first == cancel.job_id(); ++it) {
      if (cancel.attempt() != 0 && it->first.second != cancel.attempt()) continue;
      it->second->context->Cancel(cancel.reason().empty() ? "cancelled by the daemon"
                                                          : cancel.reason());
      hit.push_back(it->first);
    }
  }
  if (hit.empty()) {
    Log()->info("cancel for unknown job={} attempt={} (already finished?)", cancel.job_id(),
                cancel.attempt());
  }
  for (const JobKey& key : hit) {
    Log()->info("cancelled job={} attempt={} reason={}", key.first, key.second, cancel.reason());
  }
}

void Worker::RunJob(std::shared_ptr<RunningJob> job) {
  v1::Result result = RunHandler(*job);
  bool others_running = false;
  std::shared_ptr<Session> session = FinishJob(*job, result, &others_running);
  if (session != nullptr) session->SendResult(std::move(result), others_running);
}

v1::Result Worker::RunHandler(RunningJob& job) {
  absl::Time start = absl::Now();
  JobOutcome outcome;
  try {
    outcome = handler_(*job.context);
  } catch (const std::exception& e) {
    outcome = JobOutcome::Failure(absl::StrCat("handler threw: ", e.what()), false);
  } catch (...) {
    outcome = JobOutcome::Failure("handler threw a non-exception", false);
  }
  absl::Duration run_time = absl::Now() - start;
  if (outcome.ok && static_cast<int64_t>(outcome.output.size()) > options_.max_output_bytes) {
    outcome = JobOutcome::Failure(absl::StrCat("output too large: ", outcome.output.size(),
                                               " bytes, limit ", options_.max_output_bytes),
                                  false);
  }

  v1::Result result;
  result.set_job_id(job.key.first);
  result.set_attempt(job.key.second);
  if (outcome.ok) {
    result.set_output(std::move(outcome.output));
  } else {
    result.mutable_failure()->set_message(std::move(outcome.message));
    result.mutable_failure()->set_retryable(outcome.retryable);
  }
  *result.mutable_run_time() = proto_convert::ToProto(run_time);
  return result;
}

std::shared_ptr<Worker::Session> Worker::FinishJob(const RunningJob& job, const v1::Result& result,
                                                   bool* others_running) {
  std::shared_ptr<spdlog::logger> log = Log();
  const JobKey& key = job.key;
  std::shared_ptr<Session> session;
  bool dropped;
  {
    absl::MutexLock l(&mu_);
    running_.erase(key);
    *others_running = !running_.empty();
    dropped = job.drop_result;
    if (!dropped) {
      results_.Keep(key, result);
      if (welcomed_) session = session_;
    }
    if (draining_ && running_.empty()) jobs_done_at_ = absl::Now();
  }
  if (!log->should_log(spdlog::level::info)) return dropped ? nullptr : session;
  const bool ok = !result.has_failure();
  const std::string run_time = absl::FormatDuration(proto_convert::FromProto(result.run_time()));
  if (dropped) {
    log->info("finished job={} attempt={} ok={} run_time={} (result dropped: not re-adopted)",
              key.first, key.second, ok, run_time);
    return nullptr;
  }
  log->info("finished job={} attempt={} ok={} run_time={}{}{}", key.first, key.second, ok, run_time,
            ok ? "" : " error=", result.failure().message());
  return session;
}

}  // namespace dispatchd::client
