#include "bench/loadgen/load_driver.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <iterator>
#include <memory>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include <grpcpp/alarm.h>
#include <grpcpp/grpcpp.h>

#include "client/cpp/dispatch_client.h"
#include "dispatchd/v1/admin_service.grpc.pb.h"
#include "dispatchd/v1/job_service.grpc.pb.h"

namespace dispatchd::bench {
namespace {

namespace v1 = ::dispatchd::v1;

// How long to wait before resending a refused call that carries no retry-after-ms trailer.
constexpr absl::Duration kDefaultRetryAfter = absl::Milliseconds(10);
// Error messages kept for the summary; the rest are only counted.
constexpr size_t kMaxErrorMessages = 5;

int64_t NowMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::chrono::system_clock::time_point In(absl::Duration d) {
  return std::chrono::system_clock::now() + absl::ToChronoMicroseconds(d);
}

std::chrono::system_clock::time_point AtMicros(int64_t us) {
  return std::chrono::system_clock::time_point(std::chrono::microseconds(us));
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> NewChannel(const std::string& server,
                                                          const client::Credentials& credentials) {
  absl::StatusOr<std::string> target = client::ChannelTarget(server);
  if (!target.ok()) return target.status();
  grpc::ChannelArguments args = client::DaemonChannelArguments();
  // A subchannel pool of its own, so that every channel is a connection of its own: N clients,
  // not N views of one connection.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return grpc::CreateCustomChannel(
      *target,
      credentials.channel != nullptr ? credentials.channel : grpc::InsecureChannelCredentials(),
      args);
}

absl::Status Connect(grpc::Channel& channel, const std::string& server, absl::Duration timeout) {
  if (channel.WaitForConnected(In(timeout))) return absl::OkStatus();
  return absl::DeadlineExceededError(
      absl::StrCat("cannot connect to ", server, " within ", absl::FormatDuration(timeout)));
}

enum class RpcKind { kSubmit, kSubmitBatch, kRunSync };

// The spec every call carries.
v1::JobSpec MakeSpec(const JobTemplate& job) {
  v1::JobSpec spec;
  spec.set_type(job.type);
  spec.set_payload(job.payload);
  return spec;
}

// Something a completion queue hands back: an answer or an alarm.
class Tag {
 public:
  virtual void Fire(bool ok) = 0;

 protected:
  ~Tag() = default;
};

// What one thread's calls observed; merged into the RunSummary at the end.
struct Tally {
  int64_t jobs = 0;
  int64_t calls = 0;
  int64_t resource_exhausted = 0;
  int64_t errors = 0;
  int64_t late = 0;
  std::vector<std::string> error_messages;
  int64_t first_sent_us = 0;
  int64_t last_answered_us = 0;
  std::vector<int64_t> latencies_us;
  std::vector<JobRecord> records;

  void Error(std::string message) {
    ++errors;
    if (error_messages.size() < kMaxErrorMessages) error_messages.push_back(std::move(message));
  }
};

// The outcome of an answered call, as the owner of the call acts on it.
enum class Answer { kDone, kRetry, kFailed };

// One call slot on one completion queue: sends a call of `jobs` specs and takes its answer. The
// owner decides what comes next (another call, a resend after the daemon's hint, or nothing).
// Confined to the thread that drives its completion queue.
class Call final : private Tag {
 public:
  // Calls `on_answer` with the slot after each answer.
  Call(RpcKind kind, v1::JobService::Stub& stub, grpc::CompletionQueue& cq, const v1::JobSpec& spec,
       const client::Credentials& credentials, absl::Duration timeout,
       std::function<void(Call&)> on_answer)
      : kind_(kind),
        stub_(stub),
        cq_(cq),
        spec_(spec),
        credentials_(credentials),
        timeout_(timeout),
        on_answer_(std::move(on_answer)),
        retry_(this) {
    *submit_request_.mutable_spec() = spec;
    *run_sync_request_.mutable_spec() = spec;
  }

  // Sends a new call for `jobs` jobs (1 unless kSubmitBatch).
  void Send(int64_t seq, int64_t jobs) {
    seq_ = seq;
    jobs_ = jobs;
    if (kind_ == RpcKind::kSubmitBatch && batch_request_.specs_size() != jobs) {
      batch_request_.clear_specs();
      for (int64_t i = 0; i < jobs; ++i) *batch_request_.add_specs() = spec_;
    }
    Resend();
  }

  // Sends the same call again after `delay`.
  void ResendAfter(absl::Duration delay) { alarm_.Set(&cq_, In(delay), &retry_); }

  // Reads the answer of the call that just completed: kDone (with its jobs in `records` when
  // `keep`, its latency in `tally`), kRetry (RESOURCE_EXHAUSTED: `retry_after` is the hint) or
  // kFailed (counted as an error in `tally`).
  Answer Read(Tally& tally, bool count_latency, bool keep, absl::Duration* retry_after) {
    const int64_t now = NowMicros();
    if (!status_.ok()) {
      absl::Status s = client::FromGrpcStatus(status_, context_.get());
      if (absl::IsResourceExhausted(s)) {
        ++tally.resource_exhausted;
        *retry_after = client::RetryAfter(s).value_or(kDefaultRetryAfter);
        last_refusal_ = s.ToString();
        return Answer::kRetry;
      }
      tally.Error(absl::StrCat(RpcName(), ": ", s.ToString()));
      return Answer::kFailed;
    }
    std::vector<const std::string*> ids;
    switch (kind_) {
      case RpcKind::kSubmit:
        if (submit_response_.deduplicated()) {
          tally.Error(absl::StrCat("Submit: job ", submit_response_.job_id(),
                                   " deduplicated (no idempotency key was sent)"));
          return Answer::kFailed;
        }
        ids.push_back(&submit_response_.job_id());
        break;
      case RpcKind::kSubmitBatch:
        if (batch_response_.results_size() != jobs_) {
          tally.Error(absl::StrCat("SubmitBatch: ", batch_response_.results_size(), " results for ",
                                   jobs_, " specs"));
          return Answer::kFailed;
        }
        for (const v1::SubmitResponse& r : batch_response_.results()) ids.push_back(&r.job_id());
        break;
      case RpcKind::kRunSync:
        if (run_sync_response_.job().state() != v1::JOB_STATE_SUCCEEDED) {
          tally.Error(absl::StrCat("RunSync: job ", run_sync_response_.job().id(), " ended ",
                                   v1::JobState_Name(run_sync_response_.job().state()), ": ",
                                   run_sync_response_.job().error()));
          return Answer::kFailed;
        }
        ids.push_back(&run_sync_response_.job().id());
        break;
    }
    ++tally.calls;
    tally.jobs += static_cast<int64_t>(ids.size());
    tally.last_answered_us = std::max(tally.last_answered_us, now);
    if (count_latency) tally.latencies_us.push_back(now - sent_us_);
    if (keep) {
      for (const std::string* id : ids) {
        tally.records.push_back(
            {.seq = seq_, .job_id = *id, .sent_us = sent_us_, .answered_us = now});
      }
    }
    return Answer::kDone;
  }

  int64_t seq() const { return seq_; }
  int64_t jobs() const { return jobs_; }
  int64_t sent_us() const { return sent_us_; }
  const std::string& last_refusal() const { return last_refusal_; }

 private:
  // Fires the alarm of ResendAfter.
  class Retry final : public Tag {
   public:
    explicit Retry(Call* call) : call_(call) {}
    void Fire(bool ok) override {
      if (ok) call_->Resend();
    }

   private:
    Call* const call_;
  };

  const char* RpcName() const {
    switch (kind_) {
      case RpcKind::kSubmit:
        return "Submit";
      case RpcKind::kSubmitBatch:
        return "SubmitBatch";
      case RpcKind::kRunSync:
        return "RunSync";
    }
    return "?";
  }

  void Resend() {
    context_ = std::make_unique<grpc::ClientContext>();
    context_->set_deadline(In(timeout_));
    credentials_.Apply(*context_);
    sent_us_ = NowMicros();
    switch (kind_) {
      case RpcKind::kSubmit:
        submit_reader_ = stub_.PrepareAsyncSubmit(context_.get(), submit_request_, &cq_);
        submit_reader_->StartCall();
        submit_reader_->Finish(&submit_response_, &status_, static_cast<Tag*>(this));
        break;
      case RpcKind::kSubmitBatch:
        batch_reader_ = stub_.PrepareAsyncSubmitBatch(context_.get(), batch_request_, &cq_);
        batch_reader_->StartCall();
        batch_reader_->Finish(&batch_response_, &status_, static_cast<Tag*>(this));
        break;
      case RpcKind::kRunSync:
        run_sync_reader_ = stub_.PrepareAsyncRunSync(context_.get(), run_sync_request_, &cq_);
        run_sync_reader_->StartCall();
        run_sync_reader_->Finish(&run_sync_response_, &status_, static_cast<Tag*>(this));
        break;
    }
  }

  void Fire(bool /*ok: always true for a unary call's Finish*/) override { on_answer_(*this); }

  const RpcKind kind_;
  v1::JobService::Stub& stub_;
  grpc::CompletionQueue& cq_;
  const v1::JobSpec& spec_;
  const client::Credentials& credentials_;
  const absl::Duration timeout_;
  const std::function<void(Call&)> on_answer_;
  Retry retry_;
  grpc::Alarm alarm_;

  int64_t seq_ = 0;
  int64_t jobs_ = 0;
  int64_t sent_us_ = 0;
  std::string last_refusal_;
  std::unique_ptr<grpc::ClientContext> context_;
  grpc::Status status_;
  v1::SubmitRequest submit_request_;
  v1::SubmitResponse submit_response_;
  std::unique_ptr<grpc::ClientAsyncResponseReader<v1::SubmitResponse>> submit_reader_;
  v1::SubmitBatchRequest batch_request_;
  v1::SubmitBatchResponse batch_response_;
  std::unique_ptr<grpc::ClientAsyncResponseReader<v1::SubmitBatchResponse>> batch_reader_;
  v1::RunSyncRequest run_sync_request_;
  v1::RunSyncResponse run_sync_response_;
  std::unique_ptr<grpc::ClientAsyncResponseReader<v1::RunSyncResponse>> run_sync_reader_;
};

// Says once per process that refusals are being retried, so that a run that stalls on admission
// is visible.
void NoteFirstRefusal(const std::string& refusal) {
  static std::atomic<bool> noted{false};
  if (!noted.exchange(true)) {
    std::fprintf(stderr,
                 "dispatch-loadgen: %s; resending refused calls after the retry-after-ms hint "
                 "(counted as resource_exhausted)\n",
                 refusal.c_str());
  }
}

// Takes every tag off `cq` until `done()` holds, then shuts it down and drains it.
void Drive(grpc::CompletionQueue& cq, const std::function<bool()>& done) {
  void* tag = nullptr;
  bool ok = false;
  while (!done() && cq.Next(&tag, &ok)) static_cast<Tag*>(tag)->Fire(ok);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
}

RunSummary Merge(std::vector<Tally>& tallies) {
  RunSummary out;
  std::vector<int64_t> latencies;
  for (Tally& t : tallies) {
    out.jobs += t.jobs;
    out.calls += t.calls;
    out.resource_exhausted += t.resource_exhausted;
    out.errors += t.errors;
    out.late += t.late;
    for (std::string& m : t.error_messages) {
      if (out.error_messages.size() < kMaxErrorMessages) out.error_messages.push_back(std::move(m));
    }
    if (t.first_sent_us != 0 && (out.start_us == 0 || t.first_sent_us < out.start_us)) {
      out.start_us = t.first_sent_us;
    }
    out.end_us = std::max(out.end_us, t.last_answered_us);
    latencies.insert(latencies.end(), t.latencies_us.begin(), t.latencies_us.end());
    std::move(t.records.begin(), t.records.end(), std::back_inserter(out.records));
  }
  out.call_latency = Summarize(latencies);
  return out;
}

// The calls of one flood thread: its clients' slots on one completion queue.
class FloodLane {
 public:
  FloodLane(const FloodOptions& options, const v1::JobSpec& spec, std::atomic<int64_t>& remaining,
            std::atomic<int64_t>& next_seq, std::atomic<bool>& stop)
      : options_(options), spec_(spec), remaining_(remaining), next_seq_(next_seq), stop_(stop) {}

  void AddClient(v1::JobService::Stub& stub) {
    const RpcKind kind = options_.batch > 1 ? RpcKind::kSubmitBatch : RpcKind::kSubmit;
    for (int i = 0; i < options_.inflight; ++i) {
      calls_.push_back(std::make_unique<Call>(kind, stub, cq_, spec_, options_.credentials,
                                              options_.call_timeout,
                                              [this](Call& c) { OnAnswer(c); }));
    }
  }

  // Sends the first call of every slot and drives them until all are done.
  void Run() {
    for (std::unique_ptr<Call>& c : calls_) {
      ++live_;
      Next(*c);
    }
    Drive(cq_, [this] { return live_ == 0; });
  }

  Tally& tally() { return tally_; }

 private:
  // Sends the slot's next call, or retires the slot when no job is left (or after an error).
  void Next(Call& c) {
    int64_t n = 0;
    if (!stop_.load(std::memory_order_relaxed)) {
      int64_t left = remaining_.load(std::memory_order_relaxed);
      do {
        n = std::min<int64_t>(left, options_.batch);
      } while (n > 0 && !remaining_.compare_exchange_weak(left, left - n));
    }
    if (n <= 0) {
      --live_;
      return;
    }
    c.Send(next_seq_.fetch_add(1, std::memory_order_relaxed), n);
    if (tally_.first_sent_us == 0) tally_.first_sent_us = c.sent_us();
  }

  void OnAnswer(Call& c) {
    absl::Duration retry_after;
    switch (c.Read(tally_, /*count_latency=*/true, options_.keep_records, &retry_after)) {
      case Answer::kDone:
        Next(c);
        break;
      case Answer::kRetry:
        NoteFirstRefusal(c.last_refusal());
        c.ResendAfter(retry_after);
        break;
      case Answer::kFailed:
        stop_.store(true);
        --live_;
        break;
    }
  }

  const FloodOptions& options_;
  const v1::JobSpec& spec_;
  std::atomic<int64_t>& remaining_;
  std::atomic<int64_t>& next_seq_;
  std::atomic<bool>& stop_;
  grpc::CompletionQueue cq_;
  std::vector<std::unique_ptr<Call>> calls_;
  int live_ = 0;
  Tally tally_;
};

// Paced probes on one channel and one completion queue (driven by the calling thread).
class ProbeRun final : private Tag {
 public:
  ProbeRun(const ProbeOptions& options, v1::JobService::Stub& stub)
      : options_(options), spec_(MakeSpec(options.job)) {
    const RpcKind kind = options.kind == ProbeKind::kRunSync ? RpcKind::kRunSync : RpcKind::kSubmit;
    for (int i = 0; i < options.inflight; ++i) {
      calls_.push_back(std::make_unique<Call>(kind, stub, cq_, spec_, options.credentials,
                                              options.call_timeout,
                                              [this](Call& c) { OnAnswer(c); }));
      free_.push_back(calls_.back().get());
    }
  }

  Tally Run() {
    start_us_ = NowMicros();
    Fire(true);  // the first probe is due now
    Drive(cq_,
          [this] { return failed_ || (sent_ == options_.count && free_.size() == calls_.size()); });
    return std::move(tally_);
  }

 private:
  // The pacing alarm: one more probe is due.
  void Fire(bool ok) override {
    if (!ok || failed_) return;
    ++due_;
    if (!free_.empty()) Send(/*late=*/false);
    if (due_ < options_.count) {
      const double interval_us = 1e6 / options_.rate;
      const auto at =
          start_us_ + static_cast<int64_t>(std::llround(interval_us * static_cast<double>(due_)));
      pace_.Set(&cq_, AtMicros(at), static_cast<Tag*>(this));
    }
  }

  void Send(bool late) {
    Call* c = free_.back();
    free_.pop_back();
    if (late) ++tally_.late;
    c->Send(sent_++, 1);
    if (tally_.first_sent_us == 0) tally_.first_sent_us = c->sent_us();
  }

  void OnAnswer(Call& c) {
    absl::Duration retry_after;
    switch (c.Read(tally_, /*count_latency=*/c.seq() >= options_.warmup, options_.keep_records,
                   &retry_after)) {
      case Answer::kDone:
        free_.push_back(&c);
        if (sent_ < due_) Send(/*late=*/true);
        break;
      case Answer::kRetry:
        NoteFirstRefusal(c.last_refusal());
        c.ResendAfter(retry_after);
        break;
      case Answer::kFailed:
        free_.push_back(&c);
        failed_ = true;
        break;
    }
  }

  const ProbeOptions& options_;
  const v1::JobSpec spec_;
  grpc::CompletionQueue cq_;
  grpc::Alarm pace_;
  std::vector<std::unique_ptr<Call>> calls_;
  std::vector<Call*> free_;
  int64_t start_us_ = 0;
  int64_t due_ = 0;
  int64_t sent_ = 0;
  bool failed_ = false;
  Tally tally_;
};

absl::Status CheckJob(const JobTemplate& job) {
  if (job.type.empty()) return absl::InvalidArgumentError("--type: required");
  if (job.payload.empty()) return absl::InvalidArgumentError("--payload: at least one byte");
  return absl::OkStatus();
}

}  // namespace

LatencySummary Summarize(std::vector<int64_t>& samples) {
  LatencySummary s;
  if (samples.empty()) return s;
  std::sort(samples.begin(), samples.end());
  const size_t n = samples.size();
  // Nearest rank: the smallest sample with at least q of the samples at or below it.
  auto rank = [&](double q) {
    size_t k = static_cast<size_t>(std::ceil(q * static_cast<double>(n)));
    return samples[std::clamp<size_t>(k, 1, n) - 1];
  };
  s.count = static_cast<int64_t>(n);
  s.p50_us = rank(0.5);
  s.p90_us = rank(0.9);
  s.p99_us = rank(0.99);
  s.p999_us = rank(0.999);
  s.max_us = samples.back();
  double sum = 0;
  for (int64_t v : samples) sum += static_cast<double>(v);
  s.mean_us = sum / static_cast<double>(n);
  return s;
}

absl::Status WaitForDaemon(const std::string& server, const client::Credentials& credentials,
                           int workers, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = NewChannel(server, credentials);
  if (!channel.ok()) return channel.status();
  if (absl::Status s = Connect(**channel, server, timeout); !s.ok()) return s;
  if (workers <= 0) return absl::OkStatus();
  std::unique_ptr<v1::AdminService::Stub> admin = v1::AdminService::NewStub(*channel);
  int seen = 0;
  while (absl::Now() < deadline) {
    grpc::ClientContext context;
    context.set_deadline(In(absl::Seconds(5)));
    credentials.Apply(context);
    v1::ListWorkersResponse response;
    grpc::Status status = admin->ListWorkers(&context, v1::ListWorkersRequest(), &response);
    if (!status.ok()) return client::FromGrpcStatus(status, &context);
    seen = response.workers_size();
    if (seen >= workers) return absl::OkStatus();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "only ", seen, " of ", workers, " workers connected within ", absl::FormatDuration(timeout)));
}

absl::StatusOr<RunSummary> RunFlood(const FloodOptions& options) {
  if (absl::Status s = CheckJob(options.job); !s.ok()) return s;
  if (options.jobs < 1) return absl::InvalidArgumentError("--jobs: at least 1");
  if (options.clients < 1) return absl::InvalidArgumentError("--clients: at least 1");
  if (options.inflight < 1) return absl::InvalidArgumentError("--inflight: at least 1");
  if (options.batch < 1 || options.batch > 10000) {
    return absl::InvalidArgumentError("--batch: between 1 and 10000");
  }
  if (options.threads < 1) return absl::InvalidArgumentError("--threads: at least 1");

  std::vector<std::shared_ptr<grpc::Channel>> channels;
  std::vector<std::unique_ptr<v1::JobService::Stub>> stubs;
  for (int i = 0; i < options.clients; ++i) {
    absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
        NewChannel(options.server, options.credentials);
    if (!channel.ok()) return channel.status();
    if (absl::Status s = Connect(**channel, options.server, options.call_timeout); !s.ok()) {
      return s;
    }
    stubs.push_back(v1::JobService::NewStub(*channel));
    channels.push_back(*std::move(channel));
  }

  const v1::JobSpec spec = MakeSpec(options.job);
  std::atomic<int64_t> remaining{options.jobs};
  std::atomic<int64_t> next_seq{0};
  std::atomic<bool> stop{false};
  const int threads = std::min(options.threads, options.clients);
  std::vector<std::unique_ptr<FloodLane>> lanes;
  for (int t = 0; t < threads; ++t) {
    lanes.push_back(std::make_unique<FloodLane>(options, spec, remaining, next_seq, stop));
  }
  for (int i = 0; i < options.clients; ++i) lanes[i % threads]->AddClient(*stubs[i]);

  std::vector<std::thread> running;
  for (int t = 1; t < threads; ++t) running.emplace_back([&lane = *lanes[t]] { lane.Run(); });
  lanes[0]->Run();
  for (std::thread& t : running) t.join();

  std::vector<Tally> tallies;
  tallies.reserve(lanes.size());
  for (std::unique_ptr<FloodLane>& lane : lanes) tallies.push_back(std::move(lane->tally()));
  return Merge(tallies);
}

absl::StatusOr<RunSummary> RunProbes(const ProbeOptions& options) {
  if (absl::Status s = CheckJob(options.job); !s.ok()) return s;
  if (options.count < 1) return absl::InvalidArgumentError("--count: at least 1");
  if (options.warmup < 0 || options.warmup >= options.count) {
    return absl::InvalidArgumentError("--warmup: from 0 to --count - 1");
  }
  if (!(options.rate > 0)) return absl::InvalidArgumentError("--rate: must be positive");
  if (options.inflight < 1) return absl::InvalidArgumentError("--inflight: at least 1");

  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      NewChannel(options.server, options.credentials);
  if (!channel.ok()) return channel.status();
  if (absl::Status s = Connect(**channel, options.server, options.call_timeout); !s.ok()) return s;
  std::unique_ptr<v1::JobService::Stub> stub = v1::JobService::NewStub(*channel);
  ProbeRun run(options, *stub);
  std::vector<Tally> tallies;
  tallies.push_back(run.Run());
  return Merge(tallies);
}

}  // namespace dispatchd::bench
