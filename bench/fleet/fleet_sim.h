#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

#include "dispatchd/v1/worker_service.grpc.pb.h"

namespace dispatchd::bench {

// Runs callbacks at their time on one thread, in time order (ties in the order they were set).
// Thread-safe: At() may be called from any thread, a callback included.
class TimerQueue {
 public:
  TimerQueue();
  ~TimerQueue();  // drops the callbacks not yet run
  TimerQueue(const TimerQueue&) = delete;
  TimerQueue& operator=(const TimerQueue&) = delete;

  void At(absl::Time when, absl::AnyInvocable<void()> fn) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Run() ABSL_LOCKS_EXCLUDED(mu_);

  absl::Mutex mu_;
  std::map<std::pair<absl::Time, uint64_t>, absl::AnyInvocable<void()>> due_ ABSL_GUARDED_BY(mu_);
  uint64_t seq_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

struct FleetOptions {
  std::string server = "127.0.0.1:7411";
  int workers = 1;
  int first = 1;  // worker ids are <id_prefix><first> ... in turn
  std::string id_prefix = "sim";
  std::vector<std::string> types;  // served by every worker
  int slots = 4;
  double vram_gb = 80;                          // one GPU of this size per worker
  std::map<std::string, double> model_vram_gb;  // models the simulator knows the size of
  int min_ms = 50;   // a job whose payload is not a number of milliseconds
  int max_ms = 500;  //   runs a uniform draw from [min_ms, max_ms]
  uint64_t seed = 1;
  absl::Duration flap_every = absl::ZeroDuration();  // each worker drops its stream this often
  absl::Duration reconnect_delay = absl::Milliseconds(20);
  int streams_per_channel = 1;  // 1: one connection per worker, as separate hosts have
  std::string start_log;        // `JOB_ID ATTEMPT US` per job started, if set
};

// What the fleet did, summed over its workers.
struct FleetCounters {
  std::atomic<int64_t> connects{0}, welcomes{0}, assigned{0}, accepted{0}, rejected{0}, results{0},
      results_resent{0}, acks{0}, heartbeats{0}, model_loads{0}, evictions{0}, cancels{0},
      adopted{0}, dropped{0}, flaps{0};
};

class SimWorker;

// Simulated GPU workers, each with its own WorkerService.Connect stream, driven by gRPC's
// callback API and one TimerQueue: no thread per worker or per job. A worker holds each job for
// the milliseconds its payload names (or a seeded draw), loads the job's model when it is not
// resident (evicting idle models by name until it fits, as the scheduler assumes), keeps results
// until acknowledged and reports what it holds after a reconnect, as a real worker must.
//
//   Fleet fleet(options); fleet.Start(); ... fleet.Stop(absl::Seconds(5));
//
// Thread-safe. Start and Stop are called once each, from one thread.
class Fleet {
 public:
  explicit Fleet(FleetOptions options);
  ~Fleet();
  Fleet(const Fleet&) = delete;
  Fleet& operator=(const Fleet&) = delete;

  void Start();
  // Cancels every stream and waits up to `grace` for them to end; false if some did not.
  bool Stop(absl::Duration grace);

  const FleetCounters& counters() const { return counters_; }
  int64_t ConnectedNow() const { return connected_.load(); }

 private:
  friend class SimWorker;
  friend class Session;

  void LogStart(const std::string& job_id, int32_t attempt, int64_t us)
      ABSL_LOCKS_EXCLUDED(log_mu_);

  const FleetOptions options_;
  FleetCounters counters_;
  std::atomic<int64_t> connected_{0};
  std::atomic<int64_t> live_sessions_{0};
  std::atomic<bool> stopping_{false};
  std::vector<std::shared_ptr<grpc::Channel>> channels_;
  std::vector<std::unique_ptr<v1::WorkerService::Stub>> stubs_;
  std::vector<std::unique_ptr<SimWorker>> workers_;
  absl::Mutex log_mu_;
  FILE* start_log_ ABSL_GUARDED_BY(log_mu_) = nullptr;
  TimerQueue timers_;  // last: destroyed first, so no callback outlives the workers
};

}  // namespace dispatchd::bench
