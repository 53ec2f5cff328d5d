// dispatch-fleet: simulated GPU workers for bench/bench.py's fleet scenario, hundreds of
// WorkerService streams in one process (gRPC's callback API and one timer thread).
//
//   dispatch-fleet --server 127.0.0.1:7411 --workers 500 --types t0,t1 --models m0=24,m1=16
//   dispatch-fleet ... --first 501 --slots 4 --start-log starts-501
//   dispatch-fleet ... --workers 1 --flap-every 1s          # drops its stream every second
//
// Each worker holds a job for the milliseconds its payload names (ASCII digits), or for a draw
// from [--min-ms, --max-ms] when the payload is anything else. Runs until SIGTERM or SIGINT, then
// ends its streams and prints one JSON line of counters on stdout (see --help).
// Exit status: 0; 1 if the streams did not end in time; 2 on a usage error.

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include <CLI/CLI.hpp>
#include <pthread.h>
#include <signal.h>

#include "bench/fleet/fleet_sim.h"
#include "bench/tool_main.h"

namespace dispatchd::bench {
namespace {

int UsageError(const std::string& message) { return bench::UsageError("dispatch-fleet", message); }

int Main(int argc, char** argv) {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  CLI::App app{
      "dispatch-fleet: simulated GPU workers, many streams per process, for bench/bench.py's "
      "fleet scenario. Prints on exit one JSON line: connects, welcomes, assigned, accepted, "
      "rejected, results (jobs finished), results_resent (after a reconnect), acks, heartbeats, "
      "model_loads, evictions, cancels, adopted and dropped (held jobs the daemon did or did not "
      "re-adopt after a reconnect), flaps, cpu_s."};
  FleetOptions o;
  std::string types_flag, models_flag, flap_flag = "0s", reconnect_flag = "20ms";
  app.add_option("--server", o.server, "Daemon address host:port")->capture_default_str();
  app.add_option("--workers", o.workers, "Workers (streams) in this process")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  app.add_option("--first", o.first, "Number of the first worker")->capture_default_str();
  app.add_option("--id-prefix", o.id_prefix, "Worker ids are PREFIX<number>")
      ->capture_default_str();
  app.add_option("--types", types_flag, "Job types every worker serves, comma-separated")
      ->required();
  app.add_option("--models", models_flag,
                 "VRAM of each model in GB, MODEL=GB,... (a model not listed takes none)");
  app.add_option("--slots", o.slots, "Jobs each worker runs at once")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  app.add_option("--vram-gb", o.vram_gb, "GPU memory of each worker, GB")->capture_default_str();
  app.add_option("--min-ms", o.min_ms, "Shortest drawn job, ms")->capture_default_str();
  app.add_option("--max-ms", o.max_ms, "Longest drawn job, ms")->capture_default_str();
  app.add_option("--seed", o.seed, "Seed of the drawn durations")->capture_default_str();
  app.add_option("--flap-every", flap_flag, "Each worker drops its stream this often (0s: never)")
      ->capture_default_str();
  app.add_option("--reconnect-delay", reconnect_flag, "Pause before a worker reconnects")
      ->capture_default_str();
  app.add_option("--streams-per-channel", o.streams_per_channel,
                 "Worker streams sharing one connection (1: a connection each)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--start-log", o.start_log,
                 "Write `JOB_ID ATTEMPT US` per job accepted (system clock, us since the epoch)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  o.types = absl::StrSplit(types_flag, ',', absl::SkipEmpty());
  if (o.types.empty()) return UsageError("--types: at least one type");
  for (absl::string_view entry : absl::StrSplit(models_flag, ',', absl::SkipEmpty())) {
    std::vector<std::string> kv = absl::StrSplit(entry, '=');
    double gb = 0;
    if (kv.size() != 2 || !absl::SimpleAtod(kv[1], &gb) || gb < 0) {
      return UsageError(absl::StrFormat("--models: \"%s\" is not MODEL=GB", entry));
    }
    o.model_vram_gb[kv[0]] = gb;
  }
  if (!absl::ParseDuration(flap_flag, &o.flap_every)) {
    return UsageError("--flap-every: not a duration");
  }
  if (!absl::ParseDuration(reconnect_flag, &o.reconnect_delay)) {
    return UsageError("--reconnect-delay: not a duration");
  }
  if (o.min_ms < 0 || o.max_ms < o.min_ms) return UsageError("need 0 <= --min-ms <= --max-ms");

  // Signals go to sigwait below, not to gRPC's threads.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  Fleet fleet(o);
  fleet.Start();
  int sig = 0;
  sigwait(&stop_signals, &sig);
  const bool ended = fleet.Stop(absl::Seconds(10));
  const FleetCounters& c = fleet.counters();
  std::printf(
      "{\"workers\":%d,\"connects\":%lld,\"welcomes\":%lld,\"assigned\":%lld,\"accepted\":%lld,"
      "\"rejected\":%lld,\"results\":%lld,\"results_resent\":%lld,\"acks\":%lld,"
      "\"heartbeats\":%lld,\"model_loads\":%lld,\"evictions\":%lld,\"cancels\":%lld,"
      "\"adopted\":%lld,\"dropped\":%lld,\"flaps\":%lld,\"cpu_s\":%.3f}\n",
      o.workers, static_cast<long long>(c.connects.load()),
      static_cast<long long>(c.welcomes.load()), static_cast<long long>(c.assigned.load()),
      static_cast<long long>(c.accepted.load()), static_cast<long long>(c.rejected.load()),
      static_cast<long long>(c.results.load()), static_cast<long long>(c.results_resent.load()),
      static_cast<long long>(c.acks.load()), static_cast<long long>(c.heartbeats.load()),
      static_cast<long long>(c.model_loads.load()), static_cast<long long>(c.evictions.load()),
      static_cast<long long>(c.cancels.load()), static_cast<long long>(c.adopted.load()),
      static_cast<long long>(c.dropped.load()), static_cast<long long>(c.flaps.load()),
      CpuSeconds());
  std::fflush(stdout);
  if (!ended) {
    std::fprintf(stderr, "dispatch-fleet: streams still open after 10 s\n");
    std::_Exit(1);  // gRPC would wait for them in its destructors
  }
  return 0;
}

}  // namespace
}  // namespace dispatchd::bench

int main(int argc, char** argv) { return dispatchd::bench::Main(argc, argv); }
