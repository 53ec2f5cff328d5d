#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

#include "lib/config/config.h"
#include "lib/job/job.h"
#include "lib/sched/cost_estimator.h"
#include "lib/sched/scheduler_introspection.h"
#include "lib/sched/token_bucket.h"

namespace dispatchd::sched {

// A job waiting for a worker, as the scheduler sees it.
struct PendingJob {
  std::string id;
  std::string type;
  int32_t attempt = 0;  // attempts started so far
  std::string resource_id;
  std::string fairness_key;
  // The principal that submitted it (empty without authentication): names its tenant.
  std::string owner;
  job::Labels labels;
  absl::Time not_before = absl::InfinitePast();
  // Arrival (the job's created_at): FIFO order, kept when a refused job returns to the queue.
  absl::Time arrival = absl::InfinitePast();
};

// A job already on a worker (re-adopted after a reconnect or a restart).
struct PlacedJob {
  std::string id;
  std::string type;
  std::string resource_id;
  std::string fairness_key;
  std::string owner;
  std::string worker_id;
};

// A connected worker, as it registered.
struct WorkerSpec {
  std::string id;
  std::vector<std::string> types;
  int slots = 1;
  job::Labels labels;
  // Total GPU memory in GB; negative: none reported, models are not limited by VRAM.
  double vram_gb = -1;
  // Models loaded on it now.
  std::vector<std::string> models_resident;
};

// Decision: offer job `job_id` (at `attempt` attempts started) to worker `worker_id`.
struct Dispatch {
  std::string job_id;
  int32_t attempt = 0;
  std::string worker_id;
  std::string model;
  // The worker does not have `model` loaded: this dispatch makes it load it.
  bool loads_model = false;
  // The job's estimated cost, and its fairness key's accumulated cost with it charged.
  double cost = 0;
  double key_cost = 0;
};

// What a scheduler has learned that outlives it: each tenant's and key's settled cost (what
// ended jobs were charged, corrected; not the estimates of jobs in service), the virtual time,
// and the cost estimates. Persisted by the caller so that a restart or a failover keeps shares.
struct FairAccounts {
  struct Account {
    std::string tenant;
    std::string key;  // empty: the tenant's own account
    double cost = 0;
  };
  struct Estimate {
    std::string type;
    std::string resource;
    double cost = 0;
  };
  double virtual_time = 0;
  std::vector<Account> accounts;
  std::vector<Estimate> estimates;
};

// Decides which pending job goes to which worker, and when.
//
// Order. Candidates are ordered by (tier priority, highest first; accumulated cost of the job's
// fairness key, lowest first; arrival). A candidate is skipped, never waited on, when its tier or
// type is at its cap, a job of the same conflict group runs on its resource_id, its model's token
// bucket is empty, or no worker can take it. When a job is admitted its key's cost grows by the
// job's estimated cost (CostEstimator); a key that becomes active again starts no lower than the
// virtual time, the smallest start tag of the jobs in service (start-time fair queuing), so idle
// time banks no credit.
//
// Placement. Workers are filled in a fixed rank order (join order), so surplus workers drain to
// idle. A worker with a free slot takes, in its highest tier with work for it:
//   1. a job of a model it must load that has waited longer than its type's max_affinity_wait,
//      if that job's key has used less than the key of the job rule 2 would pick: the bounded
//      swap budget (one client's many models never thrash a worker; a lighter client is served
//      within about max_affinity_wait plus one job);
//   2. else the best-ordered job of a model it has resident (or a job with no model): affinity;
//   3. else it loads a model it can serve that no other worker holds, if one waits (it needs a
//      load whoever takes it; a second worker on a held model may cost a load the mix did not
//      need), the deepest queue first; else the model with the deepest queue divided by the
//      workers already holding it (ties by order).
// Before all three, a tenant below its min_running floor takes the slot, with a load if need be.
// A model loads only if the VRAM of the models in use on the worker plus the new one fits; idle
// resident models are evicted to make room. A worker that must leave a model still in use for a
// starved one takes no more work until the swap fits.
//
// The "fifo" policy orders by arrival alone and ignores tiers (priority and cap) and model
// affinity; type caps, conflicts, rate limits and VRAM still hold: a plain queue to compare
// against.
//
// The scheduler is pure: it takes events and returns decisions; it never touches a socket, a
// database or a clock. The caller passes `now`.
//
// Usage:
//   Scheduler s(config);
//   s.AddWorker({.id = "w1", .types = {"echo"}, .slots = 2});
//   s.Enqueue({.id = "j1", .type = "echo", .fairness_key = "alice"});
//   for (const Dispatch& d : s.Decide(now)) { /* claim in the store, send to the worker */ }
//   s.Finished("j1", now, /*ran=*/absl::Seconds(3));
//
// Not thread-safe: owned and driven by one thread (the dispatcher loop).
class Scheduler {
 public:
  explicit Scheduler(const config::Config& config, absl::Time now = absl::UnixEpoch());
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Replaces types, tiers, rate limits and policy. Buckets keep their tokens. Jobs of types no
  // longer configured stay queued until a config names them again.
  void UpdateConfig(const config::Config& config, absl::Time now);

  // Changes the rate limit of a model (or of a type with no model) until the next UpdateConfig;
  // a limit with per_second == 0 removes it. False if no configured type uses `rate_key`.
  bool SetRateLimit(const std::string& rate_key, config::RateLimit limit, absl::Time now);

  // Seeds the cost estimate of (type, resource_id), e.g. from persisted observations.
  void SetCostEstimate(const std::string& type, const std::string& resource_id, double cost,
                       absl::Time now);

  // Changes a tenant's weight until the next UpdateConfig (a tenant not in the config, too). False
  // unless 0.001 <= weight <= 1e6.
  bool SetTenantWeight(const std::string& tenant, double weight, absl::Time now);

  // The accounts changed since the last call, or all of them with `all`.
  FairAccounts TakeAccounts(bool all = false);
  // Takes accounts saved by an earlier scheduler, before any job is enqueued or adopted: jobs
  // adopted after it are charged on top, as jobs in service.
  void RestoreAccounts(const FairAccounts& accounts, absl::Time now);

  // A job became QUEUED. Re-enqueueing a job the scheduler already holds keeps one copy.
  void Enqueue(PendingJob job);

  // Removes a pending job (cancelled, expired). True if it was pending.
  bool RemovePending(const std::string& job_id);

  // A worker connected. Rejoining with a known id replaces its registration but keeps its rank
  // and the jobs placed on it.
  void AddWorker(const WorkerSpec& worker);

  // A worker is gone. Returns the ids of the jobs placed on it, which no longer count against any
  // cap; the caller decides their fate (return to queue, re-adopt, on_orphan).
  std::vector<std::string> RemoveWorker(const std::string& worker_id);

  // The worker stops taking new work.
  void SetDraining(const std::string& worker_id, bool draining);

  // The worker's memory passed its throttle threshold (true) or fell below its resume threshold
  // (false): a throttled worker gets no new jobs (see NextThrottleState).
  void SetThrottled(const std::string& worker_id, bool throttled);

  // The worker reported the models it has loaded (Hello, heartbeat).
  void SetResidentModels(const std::string& worker_id, const std::vector<std::string>& models);

  // Records a job already running on a worker (re-adoption). It counts against caps, conflicts,
  // slots and VRAM as any placed job, and its key's cost as any admitted job.
  void Adopt(const PlacedJob& job);

  // The worker refused the job because its own slots are full. The job leaves the worker (the
  // caller re-enqueues it once it is QUEUED again), its key's cost is refunded, and the worker is
  // believed to accept no more than it holds now, until it frees a slot or reports its load. The
  // token it took stays taken: the bucket bounds offers, not only runs.
  void Refused(const std::string& job_id);

  // A dispatch that never reached its worker (the store refused the claim): the placement is
  // undone and the key's cost refunded, as if Decide had not picked it. The token stays taken.
  void Retract(const std::string& job_id);

  // A placed job ended (result, cancel, timeout): its slot, caps and conflict are free. `ran` is
  // the attempt's observed wall time, if it ran to an outcome; it updates the cost estimate.
  void Finished(const std::string& job_id, absl::Time now,
                std::optional<absl::Duration> ran = std::nullopt);

  // The worker reported its load: it is believed to accept its advertised slots again.
  void Heartbeat(const std::string& worker_id);

  // Picks the dispatches possible now, at most `limit`, and counts each as placed.
  std::vector<Dispatch> Decide(absl::Time now, size_t limit = SIZE_MAX);

  // With `off`, every choice of Decide walks the fairness orders afresh rather than reuse an
  // answer found earlier in the same decision: the same decisions, slower. For the tests and
  // `sched_decision_trace`, which check that they are the same.
  void DisableDecisionMemoForTesting(bool off) { memo_disabled_ = off; }

  // Why the pending job waits (kNone if not pending) and its place in line.
  WaitInfo WhyWaiting(const std::string& job_id, absl::Time now) const;

  // When the caller should call Decide again if nothing else happens: the next not_before, the
  // next token of a bucket that holds work back, or the next housekeeping; InfiniteFuture if none.
  absl::Time NextWakeup(absl::Time now) const;

  // A snapshot for operators; `keys` holds the `max_keys` lowest-cost fairness keys.
  SchedulerStats Stats(absl::Time now, size_t max_keys = SIZE_MAX) const;
  // Counts `n` more queued jobs of `type` for `fairness_key` in `stats`, under its type, tier,
  // model and key: jobs the caller keeps out of the scheduler (they wait in the database).
  void AddQueued(SchedulerStats& stats, const std::string& type, const std::string& fairness_key,
                 int64_t n) const;

  // Recounts every count derived from the jobs held (running and queued per type, tier and
  // model; a worker's busy slots and VRAM in use; running jobs per conflict key; a key's jobs;
  // ready jobs per group) and returns one line per count that had drifted, e.g.
  // "worker gpu-1: busy 3, jobs placed on it 2". With `repair` the counts are set right, so a
  // leaked slot cannot freeze a queue nor a lost one break a cap. A drift is a bug: the caller
  // logs it.
  std::vector<std::string> Audit(bool repair);

  size_t pending_count() const { return pending_count_; }
  size_t placed_count() const { return placed_count_; }
  // Jobs of `type` waiting (queued, including those not yet due).
  int64_t queued_of_type(const std::string& type) const;
  // Jobs of `type` for `fairness_key` waiting (queued, including those not yet due).
  int64_t queued_of(const std::string& type, const std::string& fairness_key) const;
  int running_of_type(const std::string& type) const;
  bool IsPlaced(const std::string& job_id) const;
  bool IsPending(const std::string& job_id) const;
  // Worker holding a placed job, or empty.
  std::string WorkerOf(const std::string& job_id) const;
  // Ids of the jobs placed on `worker_id`, sorted; empty for an unknown worker.
  std::vector<std::string> JobsOn(const std::string& worker_id) const;
  std::vector<WorkerView> Workers() const;
  // One worker's slots, busy slots and model loads; nullopt for an unknown worker.
  std::optional<WorkerLoad> LoadOf(const std::string& worker_id) const;
  // Accumulated cost of a fairness key (of the first tenant that has one by that name).
  double KeyCost(const std::string& fairness_key) const;
  // Weight-normalised accumulated cost of a tenant; 0 if unknown.
  double TenantCost(const std::string& tenant) const;
  // Jobs of a tenant pending or placed; 0 if unknown.
  int64_t TenantActive(const std::string& tenant) const;
  // The tenant of the (first) fairness key of that name; empty if none.
  std::string TenantOfKey(const std::string& fairness_key) const;

 private:
  friend class SchedulerTestPeer;  // tests inject drift to check Audit
  struct Job;
  struct Lane;
  struct Group;
  struct TypeState;
  struct TierState;
  struct ModelState;
  struct KeyState;
  struct TenantState;
  struct TierTenant;
  struct WorkerState;
  struct Choice;
  struct Policy;

  // Defined in scheduler_internal.h.
  struct Ord;
  struct TierKey;

  // Configuration (scheduler_config.cc).
  void ApplyConfig(const config::Config& config, absl::Time now);
  TypeState& TypeFor(const std::string& name);

  // Pending-job bookkeeping (scheduler_queue.cc).
  Group& GroupFor(TypeState& type, const job::Labels& labels);
  Lane& LaneFor(Group& group, KeyState& key);
  void PromoteDue(absl::Time now);
  void AddToLane(Job& job);
  void RemoveFromLane(Job& job);
  void ReadyInsert(Lane& lane, Job& job);
  void ReadyErase(Lane& lane, Job& job);
  void RefileLane(Lane& lane);
  static std::string ConflictKey(const TypeState& type, const std::string& resource);
  void SetConflictBusy(const std::string& conflict, bool busy);

  // Tenants, keys and what they are charged (scheduler_accounts.cc).
  TenantState& TenantFor(const std::string& owner);
  KeyState& KeyFor(TenantState& tenant, const std::string& name);
  void ApplyTenant(TenantState& tenant, absl::Time now);
  TierKey& TierKeyFor(KeyState& key, TierState& tier);
  TierTenant& TierTenantFor(TenantState& tenant, TierState& tier);
  // Moves the key to its cost in every tier order it is in.
  void RefileKey(KeyState& key);
  // Moves the tenant to its (rank, cost) in every tier order it is in.
  void RefileTenant(TenantState& tenant);
  // Files the key in its tenant's order in `tier` at its (cost, oldest ready head) there, or
  // takes it out when it has no ready lane there; then the tenant likewise in the tier's order.
  void SyncKey(TierState& tier, KeyState& key, TierKey& tk);
  void SyncTenant(TierState& tier, TenantState& tenant, TierTenant& tt);
  // True if `a` comes before `b` in the order BestJob walks; with `strict_cost`, only if its
  // tenant's or its key's cost is lower (arrival does not count).
  static bool Before(const Job& a, const Job& b, bool strict_cost = false);
  // The tenant of `lane` may run one more of its jobs now: under max_running, a token in its
  // bucket for the lane's model.
  bool TenantOpen(const TenantState& tenant, const TypeState& type, absl::Time now) const;
  // The first lane of `g`, by its head's arrival, whose tenant may run a job now; null if none.
  Lane* FirstOpenLane(const Group& g, absl::Time now) const;
  void ActivateKey(KeyState& key);
  void DeactivateKey(KeyState& key);
  void CountPending(Job& j, int delta);
  void CountPlaced(Job& j, int delta);
  // Charges the job's estimated cost to its key and its tenant; the caller refiles them.
  void Charge(Job& job, absl::Time now);
  // Corrects the charge of a job that ends to what it used, in seconds (0: a full refund).
  void Settle(Job& job, double used);
  // The tenants' virtual time: the smallest tenant start tag of the jobs in service.
  double VirtualTime() const;
  // The virtual time of `tenant`'s keys.
  static double KeyVirtualTime(const TenantState& tenant);
  // The tenant's share of the placed jobs, and its fair share by weight among tenants with work.
  std::pair<double, double> TenantShares(const TenantState& tenant) const;
  // Counts a job of `type` started at `now` in its start rate.
  void CountStart(TypeState& type, absl::Time now);
  // Jobs of `type` started per second lately, as of `now`.
  static double StartRate(const TypeState& type, absl::Time now);
  void Housekeep(absl::Time now);

  // Placement bookkeeping (scheduler.cc).
  void Place(Job& job, WorkerState* worker, absl::Time now, bool loads_model);
  // Drops the memo's answers that placing `placed` may have changed; `rank_before` is its
  // tenant's rank before the placement.
  void ForgetMovedAnswers(const Job& placed, int rank_before);
  // Counts a job that now holds capacity: caps, conflicts, model; not yet a worker slot.
  void Occupy(Job& job, const std::string& worker_id);
  void Unplace(Job& job);

  // The worker pool (scheduler_workers.cc).
  // Puts a placed job on its worker: slot, VRAM in use, resident model.
  void Attach(Job& job, WorkerState& worker);
  // Takes a placed job off its worker: slot and VRAM in use (the model stays resident).
  void Detach(Job& job, WorkerState& worker);
  void UpdateAvailable(WorkerState& w);
  bool ServesAndMatches(const WorkerState& w, const Group& g) const;
  // True if a worker other than `w`, neither draining nor throttled, has the group's model loaded
  // and serves it.
  bool HeldElsewhere(const WorkerState& w, const Group& g) const;
  bool Fits(const WorkerState& w, const ModelState* model) const;
  bool Resident(const WorkerState& w, const ModelState* model) const;
  void LoadModel(WorkerState& w, ModelState* model);
  // The model joins (leaves) w's resident set and w joins (leaves) the model's holders.
  static void AddResident(WorkerState& w, ModelState* model);
  static void DropResident(WorkerState& w, ModelState* model);
  static void DropAllResident(WorkerState& w);

  // Placement policies (scheduler_policy.cc).
  // The placement policy named `name` ("fifo"; anything else is "fair"). See Policy.
  static const Policy& PolicyNamed(absl::string_view name);
  // The policies' choices: the job worker `w` takes now, or none.
  Choice ChooseFair(WorkerState& w, absl::Time now);
  Choice ChooseFifo(WorkerState& w, absl::Time now);
  // The first job among the groups of `tier` in `groups` (a GroupMask) whose tenant may run it
  // now, in the order (tenant rank, tenant cost, tenant's oldest ready job), then (key cost,
  // arrival) inside the tenant; only tenants below their floor if `floor_only`. Null if none.
  // Answers from best_memo_ when it can.
  Job* BestJob(TierState& tier, const absl::InlinedVector<uint64_t, 2>& groups, absl::Time now,
               bool floor_only = false);
  // BestJob's walk of the tier's order.
  Job* BestJobWalk(TierState& tier, const absl::InlinedVector<uint64_t, 2>& groups, absl::Time now,
                   bool floor_only);
  bool Starved(const Group& g, absl::Time now) const;
  bool GroupOpen(const Group& g, absl::Time now) const;

  // Explanations (scheduler_introspection.cc).
  WaitReason WhyGroupWaits(const Group& g, absl::Time now) const;
  // Why the pending job waits and its place in line.
  WaitInfo WhyWaitingNow(const Job& job, absl::Time now) const;
  // Fills the shares, the conflict holder, the next token and the estimated start of `info`.
  void Explain(const Job& job, absl::Time now, WaitInfo& info) const;

  const Policy* policy_ = nullptr;  // set by ApplyConfig
  double alpha_ = 0.3;
  absl::Duration key_ttl_ = absl::Minutes(10);
  absl::Time last_now_;
  absl::Time next_housekeeping_;

  absl::flat_hash_map<std::string, std::unique_ptr<TypeState>> types_;
  absl::flat_hash_map<int, std::unique_ptr<TierState>> tiers_;  // by value (priority)
  std::vector<TierState*> tiers_desc_;
  absl::flat_hash_map<std::string, std::unique_ptr<ModelState>> models_;
  absl::flat_hash_map<std::string, std::unique_ptr<TokenBucket>> buckets_;  // by rate key
  absl::flat_hash_map<std::string, config::RateLimit> rate_overrides_;
  // Keys by "tenant\x1fname"; the same name in two tenants is two keys.
  absl::flat_hash_map<std::string, std::unique_ptr<KeyState>> keys_;
  absl::flat_hash_map<std::string, std::vector<KeyState*>> keys_by_name_;  // every tenant's
  absl::flat_hash_map<std::string, std::unique_ptr<TenantState>> tenants_;
  absl::flat_hash_map<std::string, config::TenantConfig> tenant_configs_;  // by tenant name
  absl::flat_hash_map<std::string, std::string> tenant_of_principal_;
  absl::flat_hash_map<std::string, double> weight_overrides_;    // SetTenantWeight, by tenant
  absl::flat_hash_map<std::string, std::unique_ptr<Job>> jobs_;  // pending and placed
  absl::flat_hash_map<std::string, std::unique_ptr<WorkerState>> workers_;
  // Placed jobs adopted before their worker connected, by its id: AddWorker attaches them.
  absl::flat_hash_map<std::string, absl::flat_hash_set<Job*>> unattached_;
  absl::flat_hash_map<std::string, int64_t> known_ranks_;  // kept across reconnects
  int64_t next_rank_ = 0;
  std::set<std::pair<int64_t, WorkerState*>> available_;  // free slot, not draining; by rank
  std::set<std::pair<int64_t, WorkerState*>> by_rank_;
  // Running jobs per "group\x1fresource" conflict key.
  absl::flat_hash_map<std::string, int> conflicts_running_;
  // Lanes holding pending jobs of a conflict key, with how many, and the number that stands for
  // the key in those lanes' by_conflict orders while it has pending jobs (so that they compare
  // integers, not strings).
  struct ConflictLanes {
    uint64_t id = 0;
    absl::flat_hash_map<Lane*, int> lanes;
  };
  absl::flat_hash_map<std::string, ConflictLanes> conflicts_pending_;
  uint64_t next_conflict_id_ = 1;
  absl::btree_set<std::pair<absl::Time, Job*>> delayed_;  // by not_before
  absl::btree_multiset<double> start_tags_;               // of jobs in service
  double last_virtual_time_ = 0;
  CostEstimator costs_;
  uint64_t next_seq_ = 0;
  // BestJob's answers in the current Decide, by (tier, floor_only, groups), kept once a worker
  // of the Decide has found nothing or the Decide has placed kMemoAfterPlacements jobs
  // (`memo_on_`). An answer holds while its job's key and tenant keep the `memo_gen` they had
  // when it was given (see ForgetMovedAnswers).
  using BestMemoKey = std::tuple<const TierState*, bool, absl::InlinedVector<uint64_t, 2>>;
  struct BestMemo {
    Job* job = nullptr;
    uint64_t key_gen = 0;
    uint64_t tenant_gen = 0;
  };
  static constexpr size_t kMemoAfterPlacements = 8;
  absl::flat_hash_map<BestMemoKey, BestMemo> best_memo_;
  bool memo_on_ = false;
  bool memo_disabled_ = false;
  size_t next_group_index_ = 0;
  size_t pending_count_ = 0;
  size_t placed_count_ = 0;
};

}  // namespace dispatchd::sched
