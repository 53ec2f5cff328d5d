// libFuzzer target: one worker stream, as the dispatcher sees it. A dispatch::Dispatcher runs
// against an in-memory store (tests/testing/fake_job_store.h) preloaded with queued jobs of three
// types, and a fake clock; a worker says Hello and then sends whatever the input holds (accepts,
// rejects, results, heartbeats, batches, draining, garbage), interleaved with what else happens
// around a stream: time passing, a client cancelling a job, a job submitted, the database failing
// a call, the worker reconnecting. Whatever the worker sends, the dispatcher must not crash, must
// stop cleanly, and must leave every row in a state the job's life allows: no job succeeds or
// fails without having been assigned to this worker at that attempt, none runs past its
// attempts, none is cancelled that no one cancelled.
//
// Input: records, each [op][length: 2 bytes, little-endian][a serialized dispatchd.v1.
// WorkerMessage of that many bytes]. The first record's message is the Hello: one that does not
// pass rpc::CheckHello ends the stream before the dispatcher hears of it, as WorkerService does.
// The op byte of each record:
//   bits 0-2  the fake clock moves on by kAdvance[bits] after the message
//   bit 3     an empty job_id (and a zero attempt) in the message is filled in from the
//             assignments the worker got, the most recent first, so that a mutated stream still
//             talks about the jobs the worker really holds
//   bit 4     wait until the dispatcher has settled (its writes done, its replies sent)
//   bits 5-7  an event before the message: see Event below
//
// DISPATCHD_WRITE_SEEDS=DIR fuzz_worker_stream writes the seed corpus to DIR and exits
// (tests/fuzz/corpus/fuzz_worker_stream/ holds its output); DISPATCHD_FUZZ_LOG=debug logs what
// the dispatcher does with an input replayed.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "google/protobuf/stubs/common.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"

#include "dispatchd/v1/worker_service.pb.h"
#include "lib/config/config.h"
#include "lib/job/job.h"
#include "lib/sched/admission.h"
#include "lib/sched/admission_gate.h"
#include "lib/util/check.h"
#include "server/config/yaml_config.h"
#include "server/dispatch/dispatcher.h"
#include "server/dispatch/job_events.h"
#include "server/dispatch/worker_link.h"
#include "server/rpc/raw_call.h"
#include "server/rpc/worker_service.h"
#include "server/util/log.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/fake_job_store.h"

namespace {

using ::dispatchd::job::JobState;
namespace v1 = ::dispatchd::v1;

// A plain type, one with a model and VRAM (placed only on a worker with the memory), and one
// whose orphans fail; short timeouts so that a few clock steps reach them.
constexpr char kConfig[] = R"(
state_dir: /tmp
heartbeat_interval: 5s
worker_stale_after: 15s
orphan_grace: 30s
types:
  - name: echo
    max_attempts: 3
    timeout: 30s
  - name: llm.generate
    model: llama
    vram_gb: 16
    max_attempts: 2
    timeout: 60s
  - name: embed.text
    max_attempts: 2
    timeout: 10s
    on_orphan: fail
)";

constexpr absl::Duration kAdvance[] = {
    absl::ZeroDuration(), absl::Milliseconds(20), absl::Milliseconds(60), absl::Milliseconds(250),
    absl::Seconds(1),     absl::Seconds(6),       absl::Seconds(20),      absl::Seconds(120)};

enum Op : uint8_t {
  kPatchIds = 1 << 3,
  kSettle = 1 << 4,
};
// Bits 5-7 of the op.
enum class Event : uint8_t {
  kNone = 0,
  kCancelLast = 2,     // a client cancels the job most recently assigned
  kFailNextCall = 3,   // the store's next call fails UNAVAILABLE
  kReconnect = 4,      // the stream ends and the worker connects again with its Hello
  kSubmit = 5,         // a client submits a new job
  kAbortNextCall = 6,  // the store's next call fails ABORTED (a serialization conflict)
};

// What the dispatcher sent down one stream, and whether it ended the stream. Messages sent after
// the end are kept too (a real stream drops them): an Assign among them still means that the
// dispatcher gave the job to this worker, whose row then names it.
class RecordingLink final : public dispatchd::dispatch::WorkerLink {
 public:
  void Send(v1::DaemonMessage msg) override {
    absl::MutexLock l(&mu_);
    sent_.push_back(std::move(msg));
  }
  void Close(const absl::Status& status) override {
    absl::MutexLock l(&mu_);
    if (closed_) return;
    closed_ = true;
    status_ = status;
  }
  std::string peer() const override { return "ipv4:127.0.0.1:40000"; }

  bool closed() const {
    absl::MutexLock l(&mu_);
    return closed_;
  }
  size_t sent_count() const {
    absl::MutexLock l(&mu_);
    return sent_.size();
  }
  // The messages sent from `from` on.
  std::vector<v1::DaemonMessage> SentFrom(size_t from) const {
    absl::MutexLock l(&mu_);
    if (from >= sent_.size()) return {};
    return {sent_.begin() + static_cast<std::ptrdiff_t>(from), sent_.end()};
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<v1::DaemonMessage> sent_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

const dispatchd::config::Config& FuzzConfig() {
  static const dispatchd::config::Config* const config = [] {
    absl::StatusOr<dispatchd::config::Config> c =
        dispatchd::server::ParseConfig(kConfig, "fuzz_worker_stream.yaml");
    DISPATCHD_CHECK(c.ok(), "the fuzz target's own config does not parse");
    return new dispatchd::config::Config(*std::move(c));
  }();
  return *config;
}

// A job as Submit writes it: the spec resolved against the config.
dispatchd::job::Job NewJob(const std::string& id, const std::string& type,
                           const std::string& fairness_key,
                           absl::Duration dispatch_deadline = absl::InfiniteDuration()) {
  dispatchd::job::JobSpec spec;
  spec.type = type;
  spec.payload = "payload of " + id;
  spec.fairness_key = fairness_key;
  spec.dispatch_deadline = dispatch_deadline;
  absl::StatusOr<dispatchd::job::JobSpec> resolved =
      dispatchd::sched::ResolveSpec(FuzzConfig(), std::move(spec));
  DISPATCHD_CHECK(resolved.ok(), "the fuzz target's own job does not resolve");
  dispatchd::job::Job job;
  job.id = id;
  job.spec = *std::move(resolved);
  return job;
}

// The jobs in the store when the dispatcher starts: two queues of echo, one job of each other
// type, and an echo job that expires if no worker takes it within 10 s.
std::vector<dispatchd::job::Job> Preloaded() {
  return {NewJob("j1", "echo", "team-a"),       NewJob("j2", "echo", "team-a"),
          NewJob("j3", "echo", "team-b"),       NewJob("j4", "llm.generate", "team-a"),
          NewJob("j5", "embed.text", "team-b"), NewJob("j6", "echo", "team-b", absl::Seconds(10))};
}

// One run of the target: everything one input touches.
class Harness {
 public:
  explicit Harness(v1::Hello hello)
      : hello_(std::move(hello)),
        gate_(FuzzConfig()),
        dispatcher_(FuzzConfig(), store_, clock_, events_, gate_) {}

  // Whatever the input, the stream ends and the dispatcher stops.
  ~Harness() { dispatcher_.Stop(); }

  void Start() {
    for (const dispatchd::job::Job& job : Preloaded()) {
      DISPATCHD_CHECK(store_.Insert(job).ok(), "preloading the store failed");
      max_attempts_[job.id] = job.spec.max_attempts;
    }
    DISPATCHD_CHECK(dispatcher_.Start().ok(), "the dispatcher does not start on a fine store");
    Connect();
    Settle();
  }

  void Record(uint8_t op, v1::WorkerMessage msg) {
    switch (static_cast<Event>(op >> 5)) {
      case Event::kCancelLast:
        CancelLast();
        break;
      case Event::kFailNextCall:
        store_.FailCall(1, absl::UnavailableError("fuzz: down"));
        break;
      case Event::kAbortNextCall:
        store_.FailCall(1, absl::AbortedError("fuzz: conflict"));
        break;
      case Event::kReconnect:
        if (!disconnected_) dispatcher_.WorkerDisconnected(link_);
        Connect();
        reconnected_ = true;
        break;
      case Event::kSubmit:
        Submit();
        break;
      default:
        break;
    }
    if (op & kPatchIds) Patch(&msg);
    // A stream the dispatcher ended reads nothing more, and its reactor reports the end.
    if (!link_->closed()) {
      dispatcher_.WorkerMessage(link_, std::move(msg));
    } else if (!disconnected_) {
      dispatcher_.WorkerDisconnected(link_);
      disconnected_ = true;
    }
    clock_.Advance(kAdvance[op & 7]);
    if (op & kSettle) Settle();
  }

  void Finish() {
    Settle();
    if (!disconnected_) dispatcher_.WorkerDisconnected(link_);
    Settle();
    dispatcher_.Stop();
    CollectAssignments();
    Check();
  }

 private:
  void Connect() {
    link_ = std::make_shared<RecordingLink>();
    disconnected_ = false;
    links_.push_back(link_);
    read_.push_back(0);
    dispatcher_.WorkerConnected(link_, hello_);
  }

  // Waits until the dispatcher has nothing more to do for now: its loop has run every task
  // posted so far and the turns it wrote have come back, which shows as no new store call and
  // no new message to the worker over a few round trips through the loop (Workers() waits for
  // the loop). The writes run on a thread of their own, hence more than one round trip.
  void Settle() {
    int quiet = 0;
    for (int i = 0; i < 64 && quiet < 3; ++i) {
      const int64_t calls = store_.calls();
      const int64_t turns = dispatcher_.turns_answered();
      const size_t sent = link_->sent_count();
      dispatcher_.Workers();
      // Quiet: no store call began, no turn came back and nothing was sent in a loop turn.
      quiet = store_.calls() == calls && dispatcher_.turns_answered() == turns &&
                      link_->sent_count() == sent
                  ? quiet + 1
                  : 0;
    }
    CollectAssignments();
  }

  // Reads the Assigns sent since the last look, on every link.
  void CollectAssignments() {
    for (size_t i = 0; i < links_.size(); ++i) {
      for (const v1::DaemonMessage& msg : links_[i]->SentFrom(read_[i])) {
        ++read_[i];
        if (!msg.has_assign()) continue;
        for (const v1::Assignment& a : msg.assign().assignments()) {
          auto attempts = max_attempts_.find(a.job_id());
          DISPATCHD_CHECK(attempts != max_attempts_.end(), "assigned a job that does not exist");
          DISPATCHD_CHECK(a.attempt() >= 1 && a.attempt() <= attempts->second,
                          "assigned an attempt outside [1, max_attempts]");
          DISPATCHD_CHECK(a.payload() == "payload of " + a.job_id(),
                          "assigned a job without its payload");
          assigned_.emplace(a.job_id(), a.attempt());
          recent_.push_back({a.job_id(), a.attempt()});
        }
      }
    }
  }

  // The k-th most recent assignment, if there are so many.
  const std::pair<std::string, int32_t>* Recent(size_t k) const {
    return k < recent_.size() ? &recent_[recent_.size() - 1 - k] : nullptr;
  }

  template <typename T>
  void Fill(T* m, size_t k) {
    const std::pair<std::string, int32_t>* r = Recent(k);
    if (r == nullptr) return;
    if (m->job_id().empty()) m->set_job_id(r->first);
    if (m->attempt() == 0) m->set_attempt(r->second);
  }
  template <typename List>
  void FillAll(List* list) {
    size_t k = 0;
    for (auto& m : *list) Fill(&m, k++);
  }

  void Patch(v1::WorkerMessage* msg) {
    CollectAssignments();
    switch (msg->msg_case()) {
      case v1::WorkerMessage::kAccept:
        Fill(msg->mutable_accept(), 0);
        break;
      case v1::WorkerMessage::kReject:
        Fill(msg->mutable_reject(), 0);
        break;
      case v1::WorkerMessage::kResult:
        Fill(msg->mutable_result(), 0);
        break;
      case v1::WorkerMessage::kHeartbeat:
        FillAll(msg->mutable_heartbeat()->mutable_running_jobs());
        break;
      case v1::WorkerMessage::kBatch:
        FillAll(msg->mutable_batch()->mutable_accepts());
        FillAll(msg->mutable_batch()->mutable_rejects());
        FillAll(msg->mutable_batch()->mutable_results());
        break;
      default:
        break;
    }
  }

  void CancelLast() {
    CollectAssignments();
    const std::pair<std::string, int32_t>* r = Recent(0);
    if (r == nullptr) return;
    absl::StatusOr<dispatchd::store::CancelOutcome> c = store_.Cancel(r->first, "fuzz: cancel");
    if (!c.ok()) return;  // it ended already, or the store failed the call
    cancelled_.insert(r->first);
    dispatcher_.JobCancelled(r->first, c->previous);
  }

  void Submit() {
    const std::string id = absl::StrCat("s", ++submitted_);
    dispatchd::job::Job job = NewJob(id, submitted_ % 2 ? "echo" : "llm.generate", "team-c");
    absl::Duration retry_after;
    absl::StatusOr<dispatchd::sched::Reservation> reserved =
        gate_.TryAdmit(job.spec.type, &retry_after);
    if (!reserved.ok()) return;
    if (!store_.Insert(job).ok()) return;  // the reservation goes back
    reserved->Written();
    max_attempts_[id] = job.spec.max_attempts;
    absl::StatusOr<dispatchd::job::Job> row = store_.Get(id);
    if (!row.ok()) row = store_.Get(id);  // a planned failure takes one call only
    DISPATCHD_CHECK(row.ok(), "the store lost a job it inserted");
    DISPATCHD_CHECK(dispatcher_.JobQueued(*row, *reserved), "the dispatcher stopped early");
  }

  // What must hold once the dispatcher has stopped, whatever the worker said.
  void Check() {
    for (const std::shared_ptr<RecordingLink>& link : links_) {
      DISPATCHD_CHECK(link->closed(), "a worker stream is still open after Stop()");
    }
    DISPATCHD_CHECK(store_.misuses() == 0, "the dispatcher broke a precondition of the store");
    const std::vector<dispatchd::job::Job> jobs = store_.AllJobs();
    DISPATCHD_CHECK(jobs.size() == max_attempts_.size(), "the store lost or gained a job");
    for (const dispatchd::job::Job& job : jobs) {
      const int state = static_cast<int>(job.state);
      DISPATCHD_CHECK(state >= 0 && state <= static_cast<int>(JobState::kExpired),
                      "a job in no valid state");
      DISPATCHD_CHECK(job.attempt >= 0 && job.attempt <= job.spec.max_attempts,
                      "a job ran more attempts than it has");
      // A worker that reconnects names the jobs it still runs in its Hello, and the dispatcher
      // believes it for a row placed on it, even one whose Assign went to the stream that had
      // just ended (dropped, so not seen here).
      const bool was_assigned = assigned_.contains({job.id, job.attempt}) ||
                                (reconnected_ && job.worker_id == hello_.worker_id());
      switch (job.state) {
        case JobState::kQueued:
          DISPATCHD_CHECK(job.worker_id.empty(), "a queued job names a worker");
          break;
        case JobState::kDispatched:
        case JobState::kRunning:
          DISPATCHD_CHECK(job.worker_id == hello_.worker_id(),
                          "a placed job names a worker that never connected");
          break;
        case JobState::kSucceeded:
          DISPATCHD_CHECK(was_assigned, "a job succeeded at an attempt never assigned");
          break;
        case JobState::kFailed:
          DISPATCHD_CHECK(was_assigned, "a job failed at an attempt never assigned");
          break;
        case JobState::kCancelled:
          DISPATCHD_CHECK(cancelled_.contains(job.id), "a job no one cancelled is cancelled");
          break;
        case JobState::kExpired:
          DISPATCHD_CHECK(job.spec.dispatch_deadline != absl::InfiniteDuration(),
                          "a job without a dispatch deadline expired");
          break;
      }
    }
  }

  const v1::Hello hello_;
  dispatchd::testing::FakeClock clock_;
  dispatchd::testing::FakeJobStore store_{&clock_};
  dispatchd::dispatch::JobEvents events_;
  dispatchd::sched::AdmissionGate gate_;
  dispatchd::dispatch::Dispatcher dispatcher_;

  std::shared_ptr<RecordingLink> link_;                     // the stream now
  std::vector<std::shared_ptr<RecordingLink>> links_;       // every stream, the current one last
  std::vector<size_t> read_;                                // of each, the messages looked at
  absl::flat_hash_map<std::string, int32_t> max_attempts_;  // every job in the store
  std::set<std::pair<std::string, int32_t>> assigned_;      // (job, attempt) sent in an Assign
  std::vector<std::pair<std::string, int32_t>> recent_;     // the same, in order
  absl::flat_hash_set<std::string> cancelled_;
  int submitted_ = 0;
  bool disconnected_ = false;  // WorkerDisconnected was called for the stream now
  bool reconnected_ = false;
};

// One record of the input, or false at its end.
bool NextRecord(const uint8_t*& data, size_t& size, uint8_t* op, std::string* body) {
  if (size < 3) return false;
  *op = data[0];
  const size_t len = std::min<size_t>(data[1] | (size_t{data[2]} << 8), size - 3);
  body->assign(reinterpret_cast<const char*>(data + 3), len);
  data += 3 + len;
  size -= 3 + len;
  return true;
}

// A message as the stream's reactor parses it; false if it does not (the stream then ends).
bool Parse(const std::string& body, v1::WorkerMessage* msg) {
  grpc::Slice slice(body.data(), body.size());
  grpc::ByteBuffer raw(&slice, 1);
  absl::Status parsed = dispatchd::rpc::ParseRequest(&raw, msg);
  DISPATCHD_CHECK(parsed.ok() || absl::IsInvalidArgument(parsed),
                  "a message that does not parse is not INVALID_ARGUMENT");
  return parsed.ok();
}

// ---------------------------------------------------------------------------------------------
// Seeds (DISPATCHD_WRITE_SEEDS).

std::string Rec(uint8_t op, const v1::WorkerMessage& msg) {
  const std::string body = msg.SerializeAsString();
  DISPATCHD_CHECK(body.size() <= 0xffff, "a seed message too long");
  std::string out;
  out.push_back(static_cast<char>(op));
  out.push_back(static_cast<char>(body.size() & 0xff));
  out.push_back(static_cast<char>(body.size() >> 8));
  return out + body;
}

uint8_t OpOf(Event event, uint8_t bits = 0) {
  return static_cast<uint8_t>((static_cast<uint8_t>(event) << 5) | bits);
}

v1::WorkerMessage HelloMsg(bool gpu, int slots = 2) {
  v1::WorkerMessage m;
  v1::Hello* h = m.mutable_hello();
  h->set_worker_id("w1");
  for (const char* t : {"echo", "llm.generate", "embed.text"}) h->add_types(t);
  h->set_slots(slots);
  if (gpu) {
    v1::Gpu* g = h->add_gpus();
    g->set_id("0");
    g->set_memory_total_bytes(int64_t{24} << 30);
  }
  return m;
}
v1::WorkerMessage AcceptMsg() {
  v1::WorkerMessage m;
  m.mutable_accept();
  return m;
}
v1::WorkerMessage ResultMsg(bool ok, bool retryable = false) {
  v1::WorkerMessage m;
  if (ok) {
    m.mutable_result()->set_output("done");
  } else {
    m.mutable_result()->mutable_failure()->set_message("boom");
    m.mutable_result()->mutable_failure()->set_retryable(retryable);
  }
  return m;
}
v1::WorkerMessage RejectMsg() {
  v1::WorkerMessage m;
  m.mutable_reject()->set_reason(v1::Reject::REASON_RESOURCE_EXHAUSTED);
  return m;
}
v1::WorkerMessage HeartbeatMsg(int held) {
  v1::WorkerMessage m;
  for (int i = 0; i < held; ++i) m.mutable_heartbeat()->add_running_jobs();
  m.mutable_heartbeat()->set_ram_used_bytes(int64_t{1} << 30);
  m.mutable_heartbeat()->set_ram_total_bytes(int64_t{16} << 30);
  return m;
}

void WriteSeeds(const std::string& dir) {
  constexpr uint8_t kS = kSettle, kP = kPatchIds | kSettle;
  const uint8_t k60ms = 2, k20s = 6, k2min = 7;
  v1::WorkerMessage batch;
  for (int i = 0; i < 2; ++i) {
    batch.mutable_batch()->add_accepts();
    batch.mutable_batch()->add_results()->set_output("out");
  }
  v1::WorkerMessage draining;
  draining.mutable_draining();
  const std::vector<std::pair<std::string, std::string>> seeds = {
      {"accept_result", Rec(kS, HelloMsg(true)) + Rec(kP | k60ms, AcceptMsg()) +
                            Rec(kP, ResultMsg(true)) + Rec(kP, AcceptMsg()) +
                            Rec(kP, ResultMsg(true))},
      {"result_before_accept", Rec(kS, HelloMsg(false)) + Rec(kP, ResultMsg(true))},
      {"failure_retried", Rec(kS, HelloMsg(false, 1)) + Rec(kP, AcceptMsg()) +
                              Rec(kP | 5, ResultMsg(false, true)) + Rec(kP, AcceptMsg()) +
                              Rec(kP, ResultMsg(false, false))},
      {"reject", Rec(kS, HelloMsg(true)) + Rec(kP, RejectMsg()) + Rec(kP, RejectMsg())},
      {"batch", Rec(kS, HelloMsg(true)) + Rec(kP | k60ms, batch)},
      {"heartbeat_timeout", Rec(kS, HelloMsg(true)) + Rec(kP, AcceptMsg()) +
                                Rec(kP | k20s, HeartbeatMsg(1)) + Rec(kP | k2min, HeartbeatMsg(0))},
      {"silent_worker", Rec(kS, HelloMsg(false)) + Rec(kS | k20s, HeartbeatMsg(0)) +
                            Rec(kS | k2min, HeartbeatMsg(0))},
      {"cancel_running", Rec(kS, HelloMsg(false)) + Rec(kP, AcceptMsg()) +
                             Rec(OpOf(Event::kCancelLast, kP), ResultMsg(true))},
      {"store_fails", Rec(kS, HelloMsg(false)) + Rec(OpOf(Event::kFailNextCall, kP), AcceptMsg()) +
                          Rec(OpOf(Event::kAbortNextCall, kP | k60ms), ResultMsg(true)) +
                          Rec(kP | 4, ResultMsg(true))},
      {"reconnect", Rec(kS, HelloMsg(true)) + Rec(kP | k60ms, AcceptMsg()) +
                        Rec(OpOf(Event::kReconnect, kP), ResultMsg(true))},
      {"submit_drain", Rec(kS, HelloMsg(true, 1)) + Rec(OpOf(Event::kSubmit, kS), draining) +
                           Rec(kP, AcceptMsg()) + Rec(kP, ResultMsg(true))},
      {"hello_twice", Rec(kS, HelloMsg(false)) + Rec(kS, HelloMsg(false))},
      {"empty_message", Rec(kS, HelloMsg(false)) + Rec(kS, v1::WorkerMessage())},
      {"expiry", Rec(kS, HelloMsg(false, 1)) + Rec(kS | k20s, HeartbeatMsg(0))},
  };
  for (const auto& [name, bytes] : seeds) {
    std::ofstream out(dir + "/" + name, std::ios::binary | std::ios::trunc);
    out << bytes;
    DISPATCHD_CHECK(out.good(), "cannot write a seed");
  }
  std::printf("wrote %zu seeds to %s\n", seeds.size(), dir.c_str());
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  google::protobuf::SetLogHandler(nullptr);
  // The dispatcher logs each worker and job at info; a run makes millions of them. To follow
  // one input, replay it with DISPATCHD_FUZZ_LOG=debug.
  const char* level = std::getenv("DISPATCHD_FUZZ_LOG");
  dispatchd::server::SetLogLevel(level != nullptr ? level : "error");
  FuzzConfig();
  if (const char* dir = std::getenv("DISPATCHD_WRITE_SEEDS")) {
    WriteSeeds(dir);
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  uint8_t op = 0;
  std::string body;
  v1::WorkerMessage first;
  // The Hello, as WorkerService checks it before the dispatcher hears of the stream.
  if (!NextRecord(data, size, &op, &body) || !Parse(body, &first) || !first.has_hello() ||
      !dispatchd::rpc::CheckHello(first.hello(), FuzzConfig().limits.max_id_bytes).ok()) {
    return 0;
  }
  Harness harness(std::move(*first.mutable_hello()));
  harness.Start();
  // Later messages, until one does not parse (the reactor then ends the stream).
  while (NextRecord(data, size, &op, &body)) {
    v1::WorkerMessage msg;
    if (!Parse(body, &msg)) break;
    harness.Record(op, std::move(msg));
  }
  harness.Finish();
  return 0;
}
