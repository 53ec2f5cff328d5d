#include "server/ha/leadership.h"

#include <algorithm>
#include <chrono>
#include <future>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

#include "server/metrics/daemon_metrics.h"
#include "server/util/log.h"
#include "server/util/thread_name.h"

namespace dispatchd::ha {
namespace {

constexpr absl::Duration kTick = absl::Milliseconds(100);
constexpr absl::Duration kReconnectPause = absl::Seconds(1);
constexpr absl::Duration kAdmissionRefresh = absl::Seconds(1);

}  // namespace

std::string ApplicationName(const std::string& daemon_id) {
  return absl::StrCat("dispatchd ", daemon_id);
}

Leadership::Leadership(const config::Config& config, LeadershipOptions options,
                       store::JobStore& store, Clock& clock, dispatch::JobEvents& events,
                       sched::AdmissionGate& admission)
    : config_(config),
      options_(std::move(options)),
      store_(store),
      clock_(clock),
      events_(events),
      admission_(admission),
      tick_(std::min(kTick, config.ha.lease / 8)),
      interval_(config.ha.lease / 4),
      standby_intake_(std::make_shared<dispatch::StandbyIntake>(store, events)),
      intake_(standby_intake_) {}

Leadership::~Leadership() { Stop(); }

absl::Status Leadership::Start(std::string address) {
  address_ = std::move(address);
  absl::StatusOr<std::unique_ptr<store::PgLeaderLease>> lease = OpenLease();
  if (!lease.ok()) return lease.status();
  lease_ = *std::move(lease);
  if (!TryLead(clock_.TimeNow())) {
    lease_.reset();
    return absl::UnavailableError("leader election: the database session failed at once");
  }
  database_ok_.store(true);
  thread_ = std::thread([this] {
    server::SetThreadName("leadership");
    Loop();
  });
  return absl::OkStatus();
}

void Leadership::Stop() {
  {
    absl::MutexLock l(&mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
  const int64_t epoch = epoch_;
  if (epoch > 0) Demote("the daemon is stopping");
  // Hand over at once: a standby waiting in AwaitRelease takes the lock now, not at its next try.
  // If the announcement fails, the lock still goes with the session below.
  if (epoch > 0 && lease_ != nullptr) {
    if (absl::Status released = lease_->Release(epoch); released.ok()) {
      server::Log("ha")->info("handed the lease over epoch={}", epoch);
    } else {
      server::Log("ha")->warn("could not announce the lease handover: {}", released.message());
    }
  }
  lease_.reset();
}

bool Leadership::Stopping() const {
  absl::MutexLock l(&mu_);
  return stopping_;
}

std::shared_ptr<dispatch::Dispatcher> Leadership::dispatcher() const {
  absl::MutexLock l(&mu_);
  return dispatcher_;
}

std::shared_ptr<dispatch::JobIntake> Leadership::intake() const {
  absl::MutexLock l(&mu_);
  return intake_;
}

LeaderInfo Leadership::leader() const {
  absl::MutexLock l(&mu_);
  return info_;
}

void Leadership::UpdateConfig(const config::Config& config) {
  std::shared_ptr<dispatch::Dispatcher> d;
  {
    absl::MutexLock l(&mu_);
    reloaded_ = std::make_shared<const config::Config>(config);
    d = dispatcher_;
  }
  // A term that starts meanwhile takes `reloaded_`; this one is told here.
  if (d != nullptr) d->UpdateConfig(config);
}

bool Leadership::MakingProgress(absl::Duration stall, std::string* why) const {
  const absl::Time now = absl::Now();
  if (const absl::Duration idle = now - absl::FromUnixNanos(last_round_ns_.load()); idle > stall) {
    *why = absl::StrCat("the leader election thread has not come round for ",
                        absl::FormatDuration(idle));
    return false;
  }
  if (std::shared_ptr<dispatch::Dispatcher> d = dispatcher()) {
    if (const absl::Duration idle = now - d->LastLoop(); idle > stall) {
      *why =
          absl::StrCat("the dispatcher loop has not come round for ", absl::FormatDuration(idle));
      return false;
    }
  }
  return true;
}

bool Leadership::Serving(absl::Duration stall, std::string* why) const {
  if (!database_ok_.load()) {
    *why = "the database cannot be reached";
    return false;
  }
  if (std::shared_ptr<dispatch::Dispatcher> d = dispatcher()) {
    if (const absl::Duration idle = absl::Now() - d->LastLoop(); idle > stall) {
      *why =
          absl::StrCat("the dispatcher loop has not come round for ", absl::FormatDuration(idle));
      return false;
    }
  }
  return true;
}

absl::StatusOr<std::unique_ptr<store::PgLeaderLease>> Leadership::OpenLease() const {
  // A statement on the lease session that takes half a lease fails, and so does the session if
  // the network drops its packets that long: the leader then steps down (LeadTick's watchdog)
  // before a standby may end its sessions at a whole lease.
  absl::StatusOr<std::unique_ptr<store::PgLeaderLease>> lease =
      store::PgLeaderLease::Connect(options_.url, ApplicationName(options_.daemon_id),
                                    options_.connect_timeout, config_.ha.lease / 2);
  if (!lease.ok()) return lease;
  // Every daemon hears a leader hand over (Release); a standby then tries the lock at once.
  if (absl::Status listening = (*lease)->ListenForRelease(); !listening.ok()) return listening;
  return lease;
}

void Leadership::Loop() {
  while (!Stopping()) {
    last_round_ns_.store(absl::ToUnixNanos(absl::Now()));
    const absl::Time now = clock_.TimeNow();
    if (lease_ == nullptr) {
      if (now >= next_connect_) {
        absl::StatusOr<std::unique_ptr<store::PgLeaderLease>> lease = OpenLease();
        if (lease.ok()) {
          lease_ = *std::move(lease);
          next_try_ = now;
          server::Log("ha")->info("leader election session open again");
        } else {
          next_connect_ = now + kReconnectPause;
          server::Log("ha")->warn("leader election cannot reach the database: {}",
                                  lease.status().message());
        }
      }
    }
    bool ok = true;
    if (lease_ != nullptr) ok = epoch_ > 0 ? LeadTick(now) : StandbyTick(now);
    database_ok_.store(lease_ != nullptr && ok);
    if (!ok) {
      lease_.reset();  // ends the session: a leader's lock goes with it
      next_connect_ = now + kReconnectPause;
    }
    // The leader waits inside LeadTick (for notifications); a standby waits for a handover, and
    // a daemon without a session for its next try.
    if (epoch_ == 0 && lease_ != nullptr) {
      absl::StatusOr<bool> released = lease_->AwaitRelease(tick_);
      if (!released.ok()) {
        lease_.reset();
        next_connect_ = now + kReconnectPause;
      } else if (*released) {
        server::Log("ha")->info("the leader handed its lease over: trying it now");
        next_try_ = now;
      }
    } else if (lease_ == nullptr) {
      absl::MutexLock l(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&stopping_), tick_);
    }
  }
}

bool Leadership::LeadTick(absl::Time now) {
  // Renew before anything else this round may spend time on.
  if (!RenewIfDue(now)) return false;
  absl::StatusOr<std::vector<std::string>> ids = lease_->AwaitNotifications(tick_);
  if (!ids.ok()) {
    Demote(absl::StrCat("lost its database session: ", ids.status().message()));
    return false;
  }
  if (ids->empty()) return true;
  absl::flat_hash_set<std::string> seen;
  std::vector<std::string> unique;
  for (std::string& id : *ids) {
    if (seen.insert(id).second) unique.push_back(std::move(id));
  }
  absl::StatusOr<std::vector<job::Job>> rows = store_.GetMany(unique);
  if (!rows.ok()) {
    // The dispatcher's reconcile finds these rows later.
    server::Log("ha")->warn("cannot read {} changed jobs: {}", unique.size(),
                            rows.status().message());
    return true;
  }
  if (std::shared_ptr<dispatch::Dispatcher> d = dispatcher(); d && !rows->empty()) {
    d->RowsChanged(*std::move(rows));
  }
  return true;
}

bool Leadership::RenewIfDue(absl::Time now) {
  // The watchdog: a leader that has not renewed for ¾ of a lease steps down on its own, so it
  // stops dispatching before any standby may end its sessions (at a whole lease).
  if (now - renewed_ >= config_.ha.lease * 3 / 4) {
    Demote(
        absl::StrCat("its lease was last renewed ", absl::FormatDuration(now - renewed_), " ago"));
    return false;
  }
  if (now < next_renew_) return true;
  if (absl::Status renewed = lease_->Renew(epoch_); !renewed.ok()) {
    Demote(absl::StrCat("could not renew its lease: ", renewed.message()));
    return false;
  }
  renewed_ = now;
  next_renew_ = now + interval_;
  return true;
}

bool Leadership::StandbyTick(absl::Time now) {
  PollWatched();
  if (now >= next_refresh_) {
    next_refresh_ = now + kAdmissionRefresh;
    RefreshAdmission();
  }
  if (now >= next_try_) return TryLead(now);
  return true;
}

bool Leadership::TryLead(absl::Time now) {
  next_try_ = now + interval_;
  absl::StatusOr<std::optional<int64_t>> epoch =
      lease_->TryAcquire(options_.daemon_id, address_, config_.ha.lease / 2);
  if (!epoch.ok()) {
    server::Log("ha")->warn("leader election failed: {}", epoch.status().message());
    return false;
  }
  if (epoch->has_value()) {
    Promote(**epoch, now);
    return true;
  }
  absl::StatusOr<store::LeaderRecord> record = lease_->Read();
  if (!record.ok()) {
    server::Log("ha")->warn("cannot read the leader record: {}", record.status().message());
    return false;
  }
  bool changed;
  {
    absl::MutexLock l(&mu_);
    changed = info_.epoch != record->epoch || info_.address != record->address;
    info_ = LeaderInfo{.is_leader = false, .address = record->address, .epoch = record->epoch};
  }
  if (changed) {
    server::Log("ha")->info("standby leader={} epoch={} holder={}", record->address, record->epoch,
                            record->holder);
  }
  // The lock is held, but the lease has not moved for a whole lease: the leader is frozen or cut
  // off. End its sessions, which frees the lock and any row lock its writes hold.
  if (!record->holder.empty() && record->holder != options_.daemon_id &&
      record->since_renewal > config_.ha.lease) {
    absl::StatusOr<int> ended = lease_->Evict(ApplicationName(record->holder));
    if (ended.ok()) metrics::Metrics().lease_lapses.With({}).Inc();
    server::Log("ha")->warn(
        "leader {} (epoch {}) has not renewed its lease for {}: ended {} of its sessions",
        record->holder, record->epoch, absl::FormatDuration(record->since_renewal),
        ended.ok() ? *ended : -1);
    next_try_ = now;  // take the lock on the next round
  }
  return true;
}

void Leadership::Promote(int64_t epoch, absl::Time now) {
  store_.SetFence(epoch);
  if (absl::Status listening = lease_->Listen(); !listening.ok()) {
    server::Log("ha")->warn("cannot listen for job changes: {}", listening.message());
    lease_.reset();
    next_connect_ = now + kReconnectPause;
    return;
  }
  // Loading a large backlog may take longer than a lease: keep renewing while it loads, or the
  // standbys would take this daemon for frozen and end its sessions.
  epoch_ = epoch;
  renewed_ = now;
  next_renew_ = now + interval_;
  std::shared_ptr<const config::Config> reloaded;
  {
    absl::MutexLock l(&mu_);
    reloaded = reloaded_;
  }
  auto d = std::make_shared<dispatch::Dispatcher>(reloaded != nullptr ? *reloaded : config_, store_,
                                                  clock_, events_, admission_);
  std::future<absl::Status> loading = std::async(std::launch::async, [&d] { return d->Start(); });
  bool renewing = true;
  while (loading.wait_for(std::chrono::microseconds(absl::ToInt64Microseconds(tick_))) !=
         std::future_status::ready) {
    if (renewing && !RenewIfDue(clock_.TimeNow())) renewing = false;  // demoted: d not yet shown
  }
  absl::Status started = loading.get();
  if (!renewing || !started.ok()) {
    if (!started.ok()) {
      server::Log("ha")->error("won the lease at epoch {} but cannot load jobs: {}", epoch,
                               started.message());
    }
    d->Stop();
    epoch_ = 0;
    lease_.reset();  // gives the lease up
    next_connect_ = now + kReconnectPause;
    return;
  }
  watched_.clear();
  // Counted before the term is shown, so that whoever sees this daemon lead sees the term.
  metrics::Metrics().leader_terms.With({}).Inc();
  std::shared_ptr<const config::Config> missed;  // a reload while the term was starting
  {
    absl::MutexLock l(&mu_);
    if (reloaded_ != reloaded) missed = reloaded_;
    dispatcher_ = d;
    intake_ = std::make_shared<dispatch::LeaderIntake>(d, *standby_intake_);
    info_ = LeaderInfo{.is_leader = true, .address = address_, .epoch = epoch};
  }
  if (missed != nullptr) d->UpdateConfig(*missed);
  server::Log("ha")->info("became leader epoch={} address={} daemon={}", epoch, address_,
                          options_.daemon_id);
}

void Leadership::Demote(const std::string& why) {
  std::shared_ptr<dispatch::Dispatcher> d;
  {
    absl::MutexLock l(&mu_);
    d = std::move(dispatcher_);
    intake_ = standby_intake_;
    info_ = LeaderInfo{};  // a standby round reads who leads next
  }
  const int64_t epoch = epoch_;
  epoch_ = 0;
  if (d != nullptr) d->Stop();
  server::Log("ha")->warn("stepped down epoch={}: {}", epoch, why);
  // A term lost while its jobs were still loading was never counted as begun (Promote), so its
  // end is not counted either: step-downs never outnumber terms.
  if (d != nullptr) metrics::Metrics().leader_step_downs.With({}).Inc();
}

void Leadership::PollWatched() {
  std::vector<std::string> ids = events_.WatchedJobs();
  if (ids.empty()) {
    watched_.clear();
    return;
  }
  absl::StatusOr<std::vector<store::JobRef>> refs = store_.GetRefs(ids);
  if (!refs.ok()) return;
  absl::flat_hash_map<std::string, job::JobState> next;
  for (const store::JobRef& r : *refs) {
    auto it = watched_.find(r.job_id);
    if (it == watched_.end() || it->second != r.state) events_.Publish(r.job_id, r.state);
    next[r.job_id] = r.state;
  }
  watched_ = std::move(next);
}

void Leadership::RefreshAdmission() {
  absl::StatusOr<std::vector<store::TypeStateCount>> counts = store_.CountActiveByTypeAndState();
  if (!counts.ok()) return;
  int64_t active = 0;
  absl::flat_hash_map<std::string, int64_t> queued, by_owner;
  for (const store::TypeStateCount& c : *counts) {
    active += c.count;
    if (c.state == job::JobState::kQueued) queued[c.type] += c.count;
    by_owner[c.owner] += c.count;
  }
  admission_.Publish(active, std::move(queued));
  admission_.PublishOwners(by_owner);
}

}  // namespace dispatchd::ha
