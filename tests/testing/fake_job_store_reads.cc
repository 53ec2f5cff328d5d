// FakeJobStore: the reads and counts.

#include <algorithm>
#include <map>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"

#include "tests/testing/fake_job_store.h"

namespace dispatchd::testing {
namespace {

using job::JobState;

bool IsPlaced(JobState state) {
  return state == JobState::kDispatched || state == JobState::kRunning;
}

// The dispatcher's loads leave payloads and earlier attempts in the database, as PgJobStore's.
job::Job WithoutPayload(const job::Job& job) {
  job::Job out = job;
  out.spec.payload.clear();
  out.earlier_attempts.clear();
  return out;
}

store::JobRef RefOf(const job::Job& job) {
  return store::JobRef{.job_id = job.id,
                       .state = job.state,
                       .attempt = job.attempt,
                       .worker_id = job.worker_id,
                       .updated_at = job.updated_at};
}

// Counts by (type, state), ordered by type, then state as its name sorts (the statement orders
// the text column).
// With `by_owner`, per (type, state, owner) as CountActiveByTypeAndState counts.
std::vector<store::TypeStateCount> CountByTypeState(const std::vector<const job::Job*>& jobs,
                                                    bool by_owner = false) {
  std::map<std::tuple<std::string, std::string, std::string>, store::TypeStateCount> counts;
  for (const job::Job* job : jobs) {
    const std::string owner = by_owner ? job->owner : "";
    store::TypeStateCount& c =
        counts[{job->spec.type, std::string(job::ToString(job->state)), owner}];
    c.type = job->spec.type;
    c.state = job->state;
    c.owner = owner;
    ++c.count;
  }
  std::vector<store::TypeStateCount> out;
  for (auto& [key, c] : counts) out.push_back(std::move(c));
  return out;
}

}  // namespace

std::vector<const job::Job*> FakeJobStore::BySeq(bool active_only) const {
  std::vector<const job::Job*> out;
  for (const auto& [id, job] : jobs_) {
    if (!active_only || !job::IsTerminal(job.state)) out.push_back(&job);
  }
  std::sort(out.begin(), out.end(),
            [](const job::Job* a, const job::Job* b) { return a->seq < b->seq; });
  return out;
}

std::vector<job::Job> FakeJobStore::AllJobs() const {
  absl::MutexLock l(&mu_);
  std::vector<job::Job> out;
  for (const job::Job* job : BySeq(false)) out.push_back(*job);
  return out;
}

absl::StatusOr<job::Job> FakeJobStore::Get(const std::string& job_id) {
  absl::MutexLock l(&mu_);
  if (absl::Status s = BeginCall(__func__); !s.ok()) return s;
  const job::Job* job = Find(job_id);
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));
  return *job;
}

absl::StatusOr<std::vector<job::Job>> FakeJobStore::GetMany(
    const std::vector<std::string>& job_ids) {
  absl::MutexLock l(&mu_);
  if (absl::Status s = BeginCall(__func__); !s.ok()) return s;
  // Each id once, as `id = ANY(...)` reads each row once however often it is named.
  std::vector<job::Job> out;
  for (const auto& [id, job] : jobs_) {
    if (std::find(job_ids.begin(), job_ids.end(), id) != job_ids.end()) out.push_back(job);
  }
  return out;
}

absl::StatusOr<std::vector<job::Job>> FakeJobStore::SearchJobs(const store::JobSearch& search) {
  absl::MutexLock l(&mu_);
  if (absl::Status s = BeginCall(__func__); !s.ok()) return s;
  std::vector<const job::Job*> rows = BySeq(false);
  std::stable_sort(rows.begin(), rows.end(), [](const job::Job* a, const job::Job* b) {
    return a->created_at != b->created_at ? a->created_at > b->created_at : a->seq > b->seq;
  });
  std::vector<job::Job> out;
  for (const job::Job* job : rows) {
    if (static_cast<int64_t>(out.size()) >= search.limit) break;
    if ((search.state.has_value() && job->state != *search.state) ||
        (!search.type.empty() && job->spec.type != search.type) ||
        (!search.fairness_key.empty() && job->spec.fairness_key != search.fairness_key) ||
        (search.owner.has_value() && job->owner != *search.owner) ||
        job->created_at < search.created_after || job->created_at >= search.created_before) {
      continue;
    }
    job::Job listed = *job;
    listed.spec.payload.clear();
    listed.result.clear();
    listed.earlier_attempts.clear();
    out.push_back(std::move(listed));
  }
  return out;
}

absl::StatusOr<std::vector<job::Job>> FakeJobStore::LoadActive() {
  absl::MutexLock l(&mu_);
  if (absl::Status s = BeginCall(__func__); !s.ok()) return s;
  std::vector<job::Job> out;
  for (const job::Job* job : BySeq(true)) out.push_back(*job);
  return out;
}

absl::StatusOr<std::vector<job::Job>> FakeJobStore::LoadPlaced() {
  absl::MutexLock l(&mu_);
  if (absl::Status s = BeginCall(__func__); !s.ok()) return s;
  std::vector<job::Job> out;
  for (const job::Job* job : BySeq(true)) {
    if (IsPlaced(job->state)) out.push_back(WithoutPayload(*job));
  }
  return out;
}

absl::StatusOr<store::QueuedHeads> FakeJobStore::LoadQueuedHeads(int64_t per_queue) {
  absl::MutexLock l(&mu_);
  if (absl::Status s = BeginCall(__func__); !s.ok()) return s;
  // Queues in the order of their first row by seq, as PgJobStore builds them from the rows.
  std::map<std::pair<std::string, std::string>, size_t> index;  // into out.queues
  std::vector<int64_t> taken;
  store::QueuedHeads out;
  for (const job::Job* job : BySeq(true)) {
    if (job->state != JobState::kQueued) continue;
    auto [it, added] =
        index.emplace(std::pair(job->spec.type, job->spec.fairness_key), out.queues.size());
    if (added) {
      out.queues.push_back(
          store::QueueCount{.type = job->spec.type, .fairness_key = job->spec.fairness_key});
      taken.push_back(0);
    }
    ++out.queues[it->second].queued;
    if (taken[it->second] < per_queue) {
      ++taken[it->second];
      out.jobs.push_back(WithoutPayload(*job));
    }
  }
  return out;
}

absl::StatusOr<std::vector<job::Job>> FakeJobStore::LoadQueuedPage(const std::string& type,
                                                                   const std::string& fairness_key,
                                                                   int64_t after_seq,
                                                                   int64_t limit) {
  absl::MutexLock l(&mu_);
  if (absl::Status s = BeginCall(__func__); !s.ok()) return s;
  std::vector<job::Job> out;
  for (const job::Job* job : BySeq(true)) {
    if (static_cast<int64_t>(out.size()) >= limit) break;
    if (job->state == JobState::kQueued && job->spec.type == type &&
        job->spec.fairness_key == fairness_key && job->seq > after_seq) {
      out.push_back(WithoutPayload(*job));
    }
  }
  return out;
}

absl::StatusOr<int64_t> FakeJobStore::CountQueuedBefore(const std::string& type,
                                                        const std::string& fairness_key,
                                                        int64_t seq) {
  absl::MutexLock l(&mu_);
  if (absl::Status s = BeginCall(__func__); !s.ok()) return s;
  int64_t n = 0;
  for (const auto& [id, job] : jobs_) {
    n += job.state == JobState::kQueued && job.spec.type == type &&
         job.spec.fairness_key == fairness_key && job.seq < seq;
  }
  return n;
}

absl::StatusOr<std::vector<store::QueueCount>> FakeJobStore::CountQueued(
    const std::vector<store::QueueBound>& bounds) {
  absl::MutexLock l(&mu_);
  if (absl::Status s = BeginCall(__func__); !s.ok()) return s;
  // A queue named twice: the statement's join counts its rows once per bound; the plain meaning
  // (the last bound given) is taken here.
  std::map<std::pair<std::string, std::string>, int64_t> bound_of;
  for (const store::QueueBound& b : bounds) bound_of[{b.type, b.fairness_key}] = b.bound;
  std::map<std::pair<std::string, std::string>, store::QueueCount> counts;
  for (const auto& [id, job] : jobs_) {
    if (job.state != JobState::kQueued) continue;
    const std::pair<std::string, std::string> queue(job.spec.type, job.spec.fairness_key);
    store::QueueCount& c = counts[queue];
    c.type = job.spec.type;
    c.fairness_key = job.spec.fairness_key;
    ++c.queued;
    auto b = bound_of.find(queue);
    c.up_to_bound += b == bound_of.end() || job.seq <= b->second;
  }
  std::vector<store::QueueCount> out;
  for (auto& [queue, c] : counts) out.push_back(std::move(c));
  return out;
}

absl::StatusOr<std::vector<store::TypeStateCount>> FakeJobStore::CountByTypeAndState() {
  absl::MutexLock l(&mu_);
  if (absl::Status s = BeginCall(__func__); !s.ok()) return s;
  return CountByTypeState(BySeq(false));
}

absl::StatusOr<int64_t> FakeJobStore::CountActive() {
  absl::MutexLock l(&mu_);
  if (absl::Status s = BeginCall(__func__); !s.ok()) return s;
  return static_cast<int64_t>(BySeq(true).size());
}

absl::StatusOr<std::vector<store::TypeStateCount>> FakeJobStore::CountActiveByTypeAndState() {
  absl::MutexLock l(&mu_);
  if (absl::Status s = BeginCall(__func__); !s.ok()) return s;
  return CountByTypeState(BySeq(true), /*by_owner=*/true);
}

absl::StatusOr<std::vector<store::JobRef>> FakeJobStore::GetRefs(
    const std::vector<std::string>& job_ids) {
  absl::MutexLock l(&mu_);
  if (absl::Status s = BeginCall(__func__); !s.ok()) return s;
  std::vector<store::JobRef> out;
  for (const auto& [id, job] : jobs_) {
    if (std::find(job_ids.begin(), job_ids.end(), id) != job_ids.end()) out.push_back(RefOf(job));
  }
  return out;
}

absl::StatusOr<std::vector<store::JobRef>> FakeJobStore::LoadPlacedRefs() {
  absl::MutexLock l(&mu_);
  if (absl::Status s = BeginCall(__func__); !s.ok()) return s;
  std::vector<store::JobRef> out;
  for (const job::Job* job : BySeq(true)) {
    if (IsPlaced(job->state)) out.push_back(RefOf(*job));
  }
  return out;
}

}  // namespace dispatchd::testing
