#include "tests/chaos/chaos_harness.h"

#include <algorithm>
#include <exception>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"
#include "pqxx/pqxx"

#include "client/cpp/dispatch_client.h"
#include "tests/e2e/harness.h"

namespace dispatchd::chaos {
namespace {

constexpr char kActiveStates[] = "('QUEUED', 'DISPATCHED', 'RUNNING')";
constexpr size_t kMaxProblems = 10;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::chrono::system_clock::time_point In(absl::Duration d) {
  return std::chrono::system_clock::now() + absl::ToChronoMilliseconds(d);
}

// A channel of its own (no subchannel shared with other clients) that reconnects quickly after
// an outage, so that a restarted daemon gets the load back within a second. (The minimum
// reconnect backoff stays at its default: gRPC also uses it as the connect timeout, and a short
// one fails handshakes on a busy machine.)
std::shared_ptr<grpc::Channel> OwnChannel(const std::string& address) {
  grpc::ChannelArguments args = client::DaemonChannelArguments();
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

v1::SubmitRequest ChaosRequest(const std::string& fairness_key, const std::string& payload) {
  v1::SubmitRequest req;
  req.mutable_spec()->set_type(kChaosType);
  req.mutable_spec()->set_payload(payload);
  req.mutable_spec()->set_fairness_key(fairness_key);
  return req;
}

bool HasRetryAfter(const grpc::ClientContext& ctx) {
  for (const auto& [k, v] : ctx.GetServerTrailingMetadata()) {
    int64_t ms = 0;
    if (absl::string_view(k.data(), k.size()) == "retry-after-ms" &&
        absl::SimpleAtoi(absl::string_view(v.data(), v.size()), &ms) && ms > 0) {
      return true;
    }
  }
  return false;
}

std::string CodeName(int code) {
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

bool IsTerminal(const std::string& state) {
  return state == "SUCCEEDED" || state == "FAILED" || state == "CANCELLED" || state == "EXPIRED";
}

// The value of `key=` in `line` (up to the next space), or "".
std::string Field(absl::string_view line, absl::string_view key) {
  size_t at = line.find(key);
  if (at == absl::string_view::npos) return "";
  absl::string_view rest = line.substr(at + key.size());
  return std::string(rest.substr(0, rest.find_first_of(" \t\r\"")));
}

}  // namespace

absl::StatusOr<std::unique_ptr<PrivatePostgres>> PrivatePostgres::Start(std::string state_dir) {
  // Made before the server starts, so that its destructor cleans up after a failed start too.
  std::unique_ptr<PrivatePostgres> pg(new PrivatePostgres(std::move(state_dir)));
  e2e::CommandResult r = e2e::RunCommand(
      {"/bin/bash", DISPATCHD_PG_FIXTURE, "start", pg->state_dir_}, absl::Seconds(120));
  if (r.exit_code != 0) {
    return absl::UnavailableError(
        absl::StrCat("pg_fixture.sh start failed (exit ", r.exit_code, "): ", r.out, r.err));
  }
  pg->url_ = std::string(absl::StripAsciiWhitespace(ReadFile(pg->state_dir_ + "/url")));
  if (pg->url_.empty()) return absl::InternalError("pg_fixture.sh start wrote no url");
  return pg;
}

PrivatePostgres::~PrivatePostgres() {
  e2e::RunCommand({"/bin/bash", DISPATCHD_PG_FIXTURE, "stop", state_dir_}, absl::Seconds(120));
}

absl::Status PrivatePostgres::Restart() {
  e2e::CommandResult r = e2e::RunCommand({"/bin/bash", DISPATCHD_PG_FIXTURE, "restart", state_dir_},
                                         absl::Seconds(120));
  if (r.exit_code != 0) {
    return absl::UnavailableError(
        absl::StrCat("pg_fixture.sh restart failed (exit ", r.exit_code, "): ", r.out, r.err));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::vector<std::string>>> Query(const std::string& url,
                                                            const std::string& sql) {
  try {
    pqxx::connection conn(url);
    pqxx::nontransaction txn(conn);
    pqxx::result result = txn.exec(sql);
    std::vector<std::vector<std::string>> rows;
    rows.reserve(result.size());
    for (const pqxx::row& row : result) {
      std::vector<std::string>& out = rows.emplace_back();
      for (const pqxx::field& f : row) out.push_back(f.is_null() ? "" : f.c_str());
    }
    return rows;
  } catch (const pqxx::broken_connection& e) {
    return absl::UnavailableError(e.what());
  } catch (const std::exception& e) {
    return absl::InternalError(e.what());
  }
}

absl::StatusOr<std::set<std::string>> ActiveJobs(const std::string& url) {
  absl::StatusOr<std::vector<std::vector<std::string>>> rows =
      Query(url, absl::StrCat("SELECT id FROM jobs WHERE state IN ", kActiveStates));
  if (!rows.ok()) return rows.status();
  std::set<std::string> ids;
  for (const std::vector<std::string>& row : *rows) ids.insert(row[0]);
  return ids;
}

std::optional<std::pair<std::string, int>> BusiestWorker(const std::string& url) {
  absl::StatusOr<std::vector<std::vector<std::string>>> rows =
      Query(url,
            "SELECT worker_id, count(*) FROM jobs WHERE state = 'RUNNING' AND worker_id <> '' "
            "GROUP BY worker_id ORDER BY 2 DESC, 1 LIMIT 1");
  int n = 0;
  if (!rows.ok() || rows->empty() || !absl::SimpleAtoi((*rows)[0][1], &n)) return std::nullopt;
  return std::make_pair((*rows)[0][0], n);
}

bool WaitUntilNoActiveJobs(const std::string& url, absl::Duration timeout) {
  return e2e::WaitFor(
      [&] {
        absl::StatusOr<std::set<std::string>> active = ActiveJobs(url);
        return active.ok() && active->empty();
      },
      timeout);
}

std::vector<std::string> DaemonLogFiles(const std::string& dir) {
  std::vector<std::pair<int, std::string>> found;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    std::string name = entry.path().filename().string();
    absl::string_view n = name;
    int generation = 0;
    if (absl::ConsumePrefix(&n, "dispatchd.") && absl::ConsumeSuffix(&n, ".log") &&
        absl::SimpleAtoi(n, &generation)) {
      found.emplace_back(generation, entry.path().string());
    }
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& [generation, path] : found) out.push_back(std::move(path));
  return out;
}

int64_t DaemonLogCount(const std::string& dir, const std::string& needle) {
  int64_t n = 0;
  for (const std::string& path : DaemonLogFiles(dir)) {
    const std::string log = ReadFile(path);
    for (size_t at = log.find(needle); at != std::string::npos; at = log.find(needle, at + 1)) {
      ++n;
    }
  }
  return n;
}

std::string LatestDaemonLog(const std::string& dir) {
  std::vector<std::string> logs = DaemonLogFiles(dir);
  return logs.empty() ? "" : ReadFile(logs.back());
}

Load::~Load() { Stop(); }

void Load::Start() {
  for (int i = 0; i < options_.clients; ++i) threads_.emplace_back(&Load::RunClient, this, i);
}

void Load::Stop() {
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
  }
  for (std::thread& t : threads_) t.join();
  threads_.clear();
}

void Load::RunClient(int client) {
  const std::string key = absl::StrCat("client-", client);
  std::vector<std::unique_ptr<v1::JobService::Stub>> stubs;
  for (const std::string& address : options_.addresses) {
    stubs.push_back(v1::JobService::NewStub(OwnChannel(address)));
  }
  const absl::Duration period = absl::Seconds(1) / std::max(1, options_.jobs_per_second);
  absl::Time next = absl::Now();
  for (int64_t n = 0;; ++n) {
    // Sleeps until the next submit is due, or returns at once when stopped.
    if (mu_.LockWhenWithDeadline(absl::Condition(&stop_), next)) {
      mu_.Unlock();
      return;
    }
    mu_.Unlock();
    grpc::ClientContext ctx;
    ctx.set_deadline(In(options_.submit_deadline));
    v1::SubmitRequest req = ChaosRequest(key, absl::StrCat(key, " job ", n));
    v1::SubmitResponse resp;
    grpc::Status status = stubs[n % stubs.size()]->Submit(&ctx, req, &resp);
    {
      absl::MutexLock l(&mu_);
      if (status.ok()) {
        accepted_.push_back(resp.job_id());
      } else {
        ++errors_by_code_[status.error_code()];
        if (status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED && !HasRetryAfter(ctx)) {
          ++refused_without_retry_after_;
        }
      }
    }
    // Keep the pace, but never burst to catch up after a slow call.
    next = std::max(next + period, absl::Now());
  }
}

std::vector<std::string> Load::accepted() const {
  absl::MutexLock l(&mu_);
  return accepted_;
}

int64_t Load::errors() const {
  absl::MutexLock l(&mu_);
  int64_t n = 0;
  for (const auto& [code, count] : errors_by_code_) n += count;
  return n;
}

int64_t Load::refused() const {
  absl::MutexLock l(&mu_);
  auto it = errors_by_code_.find(grpc::StatusCode::RESOURCE_EXHAUSTED);
  return it == errors_by_code_.end() ? 0 : it->second;
}

int64_t Load::refused_without_retry_after() const {
  absl::MutexLock l(&mu_);
  return refused_without_retry_after_;
}

std::string Load::ErrorSummary() const {
  absl::MutexLock l(&mu_);
  std::vector<std::string> parts;
  for (const auto& [code, count] : errors_by_code_) {
    parts.push_back(absl::StrCat(CodeName(code), ":", count));
  }
  return parts.empty() ? "none" : absl::StrJoin(parts, " ");
}

FloodResult Flood(const std::string& address, int threads, int total, absl::Duration deadline) {
  struct Call {
    grpc::ClientContext ctx;
    v1::SubmitRequest req;
    v1::SubmitResponse resp;
    grpc::Status status;
  };
  absl::Mutex mu;
  FloodResult result;
  std::vector<std::thread> senders;
  for (int t = 0; t < threads; ++t) {
    const int share = total / threads + (t < total % threads ? 1 : 0);
    senders.emplace_back([&, t, share] {
      auto stub = v1::JobService::NewStub(OwnChannel(address));
      const std::string key = absl::StrCat("flood-", t);
      std::vector<std::unique_ptr<Call>> calls;
      absl::Mutex calls_mu;
      int done = 0;
      for (int i = 0; i < share; ++i) {
        auto call = std::make_unique<Call>();
        call->ctx.set_deadline(In(deadline));
        call->req = ChaosRequest(key, absl::StrCat(key, " job ", i));
        Call* c = call.get();
        calls.push_back(std::move(call));
        stub->async()->Submit(&c->ctx, &c->req, &c->resp, [c, &calls_mu, &done](grpc::Status s) {
          absl::MutexLock l(&calls_mu);
          c->status = std::move(s);
          ++done;
        });
      }
      auto all_done = [&done, share] { return done == share; };
      calls_mu.Lock();
      if (!calls_mu.AwaitWithTimeout(absl::Condition(&all_done), deadline + absl::Seconds(10))) {
        // Past every call's deadline: cancelling makes gRPC finish each one promptly.
        calls_mu.Unlock();
        for (auto& c : calls) c->ctx.TryCancel();
        calls_mu.Lock();
        if (!calls_mu.AwaitWithTimeout(absl::Condition(&all_done), absl::Seconds(30))) {
          // Never free what a late callback would still write to.
          for (auto& c : calls) static_cast<void>(c.release());
        }
      }
      calls_mu.Unlock();
      absl::MutexLock l(&mu);
      for (const std::unique_ptr<Call>& c : calls) {
        if (c == nullptr) {
          ++result.other_errors;
        } else if (c->status.ok()) {
          result.accepted.push_back(c->resp.job_id());
        } else if (c->status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
          ++result.refused;
          if (!HasRetryAfter(c->ctx)) ++result.refused_without_retry_after;
        } else {
          if (result.other_errors++ == 0) {
            result.first_other_error =
                absl::StrCat(CodeName(c->status.error_code()), ": ", c->status.error_message());
          }
        }
      }
    });
  }
  for (std::thread& t : senders) t.join();
  return result;
}

ActiveCountSampler::ActiveCountSampler(std::string url, absl::Duration period)
    : url_(std::move(url)) {
  thread_ = std::thread(&ActiveCountSampler::Run, this, period);
}

ActiveCountSampler::~ActiveCountSampler() { Stop(); }

void ActiveCountSampler::Stop() {
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

int64_t ActiveCountSampler::most() const {
  absl::MutexLock l(&mu_);
  return most_;
}

int64_t ActiveCountSampler::samples() const {
  absl::MutexLock l(&mu_);
  return samples_;
}

void ActiveCountSampler::Run(absl::Duration period) {
  const std::string sql = absl::StrCat("SELECT count(*) FROM jobs WHERE state IN ", kActiveStates);
  absl::MutexLock l(&mu_);
  while (!stop_) {
    mu_.Unlock();
    absl::StatusOr<std::vector<std::vector<std::string>>> rows = Query(url_, sql);
    int64_t n = 0;
    const bool ok = rows.ok() && !rows->empty() && absl::SimpleAtoi((*rows)[0][0], &n);
    mu_.Lock();
    if (ok) {
      ++samples_;
      most_ = std::max(most_, n);
    }
    mu_.AwaitWithTimeout(absl::Condition(&stop_), period);
  }
}

RecoveryClock::RecoveryClock(std::string url, std::set<std::string> active, absl::Time fault_at)
    : url_(std::move(url)), fault_at_(fault_at), pending_(std::move(active)) {
  thread_ = std::thread(&RecoveryClock::Poll, this);
}

RecoveryClock::~RecoveryClock() {
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void RecoveryClock::AddActive(const std::set<std::string>& active) {
  absl::MutexLock l(&mu_);
  pending_.insert(active.begin(), active.end());
  if (!pending_.empty()) seconds_.reset();
}

std::optional<double> RecoveryClock::seconds() const {
  absl::MutexLock l(&mu_);
  return seconds_;
}

void RecoveryClock::Poll() {
  absl::MutexLock l(&mu_);
  while (!stop_) {
    if (!pending_.empty()) {
      // Only the jobs pending before the query may be found ended by it.
      const std::set<std::string> asked = pending_;
      mu_.Unlock();
      // An error (the database or the network down) just means "not yet".
      absl::StatusOr<std::set<std::string>> active = ActiveJobs(url_);
      const absl::Time now = absl::Now();
      mu_.Lock();
      if (active.ok()) {
        for (const std::string& id : asked) {
          if (!active->contains(id)) pending_.erase(id);
        }
        if (pending_.empty()) seconds_ = absl::ToDoubleSeconds(now - fault_at_);
      }
    } else if (!seconds_.has_value()) {
      seconds_ = absl::ToDoubleSeconds(absl::Now() - fault_at_);
    }
    mu_.AwaitWithTimeout(absl::Condition(&stop_), absl::Milliseconds(100));
  }
}

absl::StatusOr<Verdict> Check(const Evidence& evidence) {
  Verdict v;
  auto problem = [&v](std::string line) {
    if (v.problems.size() < kMaxProblems) v.problems.push_back(std::move(line));
  };

  // The database: the record of truth.
  absl::StatusOr<std::vector<std::vector<std::string>>> rows =
      Query(evidence.db_url, "SELECT id, state, attempt FROM jobs");
  if (!rows.ok()) return rows.status();
  std::map<std::string, std::pair<std::string, int>> jobs;  // id -> (state, attempt)
  for (const std::vector<std::string>& row : *rows) {
    int attempt = 0;
    (void)absl::SimpleAtoi(row[2], &attempt);
    jobs[row[0]] = {row[1], attempt};
    if (!IsTerminal(row[1])) {
      ++v.left_active;
      problem(absl::StrCat("job ", row[0], " left ", row[1], " at attempt ", row[2]));
    }
  }
  v.accepted = static_cast<int64_t>(evidence.accepted.size());
  for (const std::string& id : evidence.accepted) {
    auto it = jobs.find(id);
    if (it == jobs.end()) {
      ++v.lost;
      problem(absl::StrCat("accepted job ", id, " has no row"));
    } else if (!IsTerminal(it->second.first)) {
      ++v.lost;
    } else {
      ++v.by_state[it->second.first];
    }
  }

  // The daemons' logs: one `finished job=J state=S` line per committed terminal transition.
  std::map<std::string, int> finished;
  for (const std::string& path : evidence.daemon_logs) {
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);) {
      if (line.find("finished job=") == std::string::npos) continue;
      std::string id = Field(line, "finished job=");
      std::string state = Field(line, " state=");
      ++v.logged_completions;
      if (++finished[id] == 2) {
        ++v.duplicate_completions;
        problem(absl::StrCat("job ", id, " completed twice; again: ", line));
      }
      auto it = jobs.find(id);
      if (it == jobs.end() || it->second.first != state) {
        ++v.log_disagrees_with_db;
        problem(absl::StrCat("log says job ", id, " ended ", state, ", the row says ",
                             it == jobs.end() ? "nothing" : it->second.first, ": ", line));
      }
    }
  }

  // The workers' journals: who started which (job, attempt).
  std::map<std::pair<std::string, int>, std::vector<std::string>> starts;
  std::map<std::string, std::set<int>> attempts;
  std::map<std::string, std::pair<int, std::string>> first_success;  // id -> (attempt, worker)
  for (const auto& [worker, path] : evidence.journals) {
    for (const e2e::JournalEvent& e : e2e::ReadJournal(path, worker)) {
      if (!e.start) {
        auto it = first_success.find(e.job_id);
        if (e.ok && (it == first_success.end() || e.attempt < it->second.first)) {
          first_success[e.job_id] = {e.attempt, worker};
        }
        continue;
      }
      starts[{e.job_id, e.attempt}].push_back(worker);
      attempts[e.job_id].insert(e.attempt);
    }
  }
  for (const auto& [id, success] : first_success) {
    auto started = attempts.find(id);
    if (started == attempts.end()) continue;
    if (int last = *started->second.rbegin(); last > success.first) {
      ++v.reran_after_success;
      problem(absl::StrCat("job ", id, " succeeded at attempt ", success.first, " on ",
                           success.second, " and was started again at attempt ", last));
    }
  }
  for (const auto& [key, workers] : starts) {
    if (workers.size() > 1) {
      ++v.ran_twice_same_attempt;
      problem(absl::StrCat("job ", key.first, " attempt ", key.second, " started on ",
                           absl::StrJoin(workers, ",")));
    }
  }
  for (const auto& [id, set] : attempts) v.reruns += set.size() > 1 ? 1 : 0;
  for (const auto& [id, row] : jobs) {
    if (row.first == "SUCCEEDED" && !starts.contains({id, row.second})) {
      ++v.succeeded_not_run;
      problem(absl::StrCat("job ", id, " SUCCEEDED at attempt ", row.second,
                           " but no worker journal started that attempt"));
    }
  }
  return v;
}

std::string ReportHeader() {
  return "chaos | fault | accepted | lost | duplicate_completions | ran_twice_same_attempt | "
         "recovery_s | submit_errors | ...";
}

std::string ReportRow(const std::string& fault, const Verdict& verdict,
                      std::optional<double> recovery_s, int64_t submit_errors,
                      const std::vector<std::pair<std::string, std::string>>& extra) {
  std::string row = absl::StrCat(
      "chaos | fault=", fault, " | accepted=", verdict.accepted, " | lost=", verdict.lost,
      " | duplicate_completions=", verdict.duplicate_completions,
      " | ran_twice_same_attempt=", verdict.ran_twice_same_attempt, " | recovery_s=",
      recovery_s.has_value() ? absl::StrFormat("%.1f", *recovery_s) : std::string("NA"),
      " | submit_errors=", submit_errors);
  for (const auto& [key, value] : extra) absl::StrAppend(&row, " | ", key, "=", value);
  return row;
}

}  // namespace dispatchd::chaos
