#include "client/cpp/dispatchctl_render.h"

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <map>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include <google/protobuf/util/json_util.h>
#include <unistd.h>

#include "proto/convert/time_proto.h"

namespace dispatchd::client::ctl {
namespace {

bool IsPrintable(absl::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) {
    auto u = static_cast<unsigned char>(c);
    return (u >= 0x20 && u < 0x7f) || c == '\n' || c == '\t' || c == '\r' || u >= 0x80;
  });
}

}  // namespace

std::string ToJson(const google::protobuf::Message& m) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string out;
  if (!google::protobuf::util::MessageToJsonString(m, &out, options).ok()) return "{}";
  return out;
}

std::string FormatUtcTime(absl::Time t) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", t, absl::UTCTimeZone());
}

std::string FormatTimestamp(const google::protobuf::Timestamp& t) {
  if (t.seconds() == 0 && t.nanos() == 0) return "-";
  return FormatUtcTime(proto_convert::FromProto(t));
}

std::string StateName(v1::JobState s) {
  std::string name = v1::JobState_Name(s);
  absl::string_view v(name);
  absl::ConsumePrefix(&v, "JOB_STATE_");
  return name.empty() ? absl::StrCat("STATE_", static_cast<int>(s)) : std::string(v);
}

std::string FormatNumber(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  std::string out = buf;
  if (out.find('.') != std::string::npos) {
    while (out.back() == '0') out.pop_back();
    if (out.back() == '.') out.pop_back();
  }
  return out == "-0" ? "0" : out;
}

std::string FormatRate(double per_second) {
  if (per_second >= 1) return absl::StrCat(FormatNumber(per_second), "/s");
  return absl::StrCat(FormatNumber(per_second * 60), "/min");
}

std::string FormatPercent(double fraction) { return absl::StrFormat("%.0f%%", 100 * fraction); }

std::string WaitCell(const std::string& reason, int64_t queued) {
  return queued == 0 || reason.empty() || reason == "none" ? "-" : reason;
}

void PrintTable(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width;
  for (const auto& row : rows) {
    if (width.size() < row.size()) width.resize(row.size(), 0);
    for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  }
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line += std::string(width[i] - row[i].size() + 2, ' ');
    }
    std::cout << absl::StripTrailingAsciiWhitespace(line) << "\n";
  }
}

void PrintKeyValues(const std::vector<std::pair<std::string, std::string>>& kvs) {
  size_t w = 0;
  for (const auto& [k, v] : kvs) w = std::max(w, k.size());
  for (const auto& [k, v] : kvs) {
    std::cout << k << ":" << std::string(w - k.size() + 1, ' ') << v << "\n";
  }
}

void PrintJob(const v1::Job& job) {
  std::vector<std::pair<std::string, std::string>> kvs = {
      {"id", job.id()},
      {"type", job.spec().type()},
      {"state", StateName(job.state())},
      {"attempt", absl::StrCat(job.attempt(), "/", job.max_attempts())},
      {"worker", job.worker_id().empty() ? "-" : job.worker_id()},
      {"created", FormatTimestamp(job.created_at())},
      {"dispatched", FormatTimestamp(job.dispatched_at())},
      {"started", FormatTimestamp(job.started_at())},
      {"finished", FormatTimestamp(job.finished_at())},
  };
  if (!job.spec().resource_id().empty()) kvs.emplace_back("resource", job.spec().resource_id());
  if (!job.fairness_key().empty()) kvs.emplace_back("fairness key", job.fairness_key());
  if (!job.wait_reason().empty()) {
    kvs.emplace_back("waiting", absl::StrCat(job.wait_reason(), ", position ", job.queue_position(),
                                             " (", job.keys_ahead(),
                                             job.keys_ahead() == 1 ? " key" : " keys", " ahead)"));
    kvs.emplace_back("tenant share",
                     absl::StrCat(job.tenant().empty() ? "(no tenant)" : job.tenant(), ": ",
                                  FormatPercent(job.tenant_share()), " of the running jobs, fair ",
                                  FormatPercent(job.tenant_fair_share())));
    kvs.emplace_back("key share",
                     absl::StrCat(FormatPercent(job.key_share()), " of its tenant's, fair ",
                                  FormatPercent(job.key_fair_share())));
    if (!job.conflict_holder().empty()) kvs.emplace_back("conflicts with", job.conflict_holder());
    if (job.has_next_token_at()) {
      kvs.emplace_back("next token", FormatTimestamp(job.next_token_at()));
    }
    if (job.has_estimated_start_at()) {
      kvs.emplace_back("expected start", FormatTimestamp(job.estimated_start_at()));
    }
  }
  kvs.emplace_back("error", job.error().empty() ? "-" : job.error());
  for (const v1::JobAttempt& a : job.earlier_attempts()) {
    kvs.emplace_back(
        absl::StrCat("attempt ", a.attempt()),
        absl::StrCat(a.worker_id().empty() ? "-" : a.worker_id(), ", ",
                     a.has_started_at() ? "started " : "dispatched ",
                     FormatTimestamp(a.has_started_at() ? a.started_at() : a.dispatched_at()),
                     ", failed ", FormatTimestamp(a.ended_at()), ": ", a.error()));
  }
  kvs.emplace_back("result size", absl::StrCat(job.result().size(), " bytes"));
  if (!job.result().empty() && job.result().size() <= 200 && IsPrintable(job.result())) {
    kvs.emplace_back("result", absl::CEscape(job.result()));
  }
  PrintKeyValues(kvs);
}

void PrintRunResult(const v1::Job& job) {
  const std::string& out = job.result();
  std::fwrite(out.data(), 1, out.size(), stdout);
  if (isatty(STDOUT_FILENO) && (out.empty() || out.back() != '\n')) std::fputc('\n', stdout);
  std::fflush(stdout);
}

void PrintWorkers(const v1::ListWorkersResponse& r) {
  std::vector<std::vector<std::string>> rows = {{"ID", "PEER", "TYPES", "BUSY/SLOTS", "MODELS",
                                                 "VRAM GB", "GPU MEM GB", "LOADS", "LABELS",
                                                 "CONNECTED", "LAST SEEN"}};
  for (const v1::WorkerInfo& w : r.workers()) {
    std::map<std::string, std::string> labels(w.labels().begin(), w.labels().end());
    // VRAM: in use / total; "-" for a worker that reported no GPU.
    std::string vram = w.vram_gb() < 0 ? "-"
                                       : absl::StrCat(FormatNumber(w.vram_in_use_gb(), 1), "/",
                                                      FormatNumber(w.vram_gb(), 1));
    // GPU memory as the worker reported it, per GPU: used/total, and "(own N)" for what the
    // worker holds itself when it says; "-" for a worker that reported no GPU.
    std::vector<std::string> gpus;
    for (const v1::Gpu& g : w.gpus()) {
      std::string cell =
          absl::StrCat(FormatNumber(static_cast<double>(g.memory_used_bytes()) / 1e9, 1), "/",
                       FormatNumber(static_cast<double>(g.memory_total_bytes()) / 1e9, 1));
      if (g.has_memory_used_by_worker_bytes()) {
        absl::StrAppend(&cell, " (own ",
                        FormatNumber(static_cast<double>(g.memory_used_by_worker_bytes()) / 1e9, 1),
                        ")");
      }
      gpus.push_back(std::move(cell));
    }
    rows.push_back({w.worker_id() + (w.draining() ? " (draining)" : "") +
                        (w.memory_throttled() ? " (throttled)" : ""),
                    w.peer(), absl::StrJoin(w.types(), ","), absl::StrCat(w.busy(), "/", w.slots()),
                    w.models_resident().empty() ? "-" : absl::StrJoin(w.models_resident(), ","),
                    vram, gpus.empty() ? "-" : absl::StrJoin(gpus, ", "),
                    absl::StrCat(w.model_loads()),
                    labels.empty() ? "-" : absl::StrJoin(labels, ",", absl::PairFormatter("=")),
                    FormatTimestamp(w.connected_at()), FormatTimestamp(w.last_seen())});
  }
  PrintTable(rows);
}

void PrintStats(const v1::StatsResponse& r) {
  // Tiers, types, models and keys, each a table; WAITING-ON is why the first job in line waits.
  if (!r.tiers().empty()) {
    std::vector<std::vector<std::string>> rows = {
        {"TIER", "PRIORITY", "CAP", "QUEUED", "RUNNING", "WAITING-ON"}};
    for (const v1::TierStats& t : r.tiers()) {
      rows.push_back({t.tier(), absl::StrCat(t.priority()),
                      t.cap() == 0 ? "-" : absl::StrCat(t.cap()), absl::StrCat(t.queued()),
                      absl::StrCat(t.running()), WaitCell(t.head_wait_reason(), t.queued())});
    }
    PrintTable(rows);
    std::cout << "\n";
  }
  {
    std::vector<std::vector<std::string>> rows = {{"TYPE", "QUEUED", "DISPATCHED", "RUNNING",
                                                   "SUCCEEDED", "FAILED", "CANCELLED", "EXPIRED",
                                                   "WAITING-ON"}};
    for (const v1::TypeStats& t : r.types()) {
      rows.push_back({t.type(), absl::StrCat(t.queued()), absl::StrCat(t.dispatched()),
                      absl::StrCat(t.running()), absl::StrCat(t.succeeded()),
                      absl::StrCat(t.failed()), absl::StrCat(t.cancelled()),
                      absl::StrCat(t.expired()), WaitCell(t.head_wait_reason(), t.queued())});
    }
    PrintTable(rows);
    std::cout << "\n";
  }
  if (!r.models().empty()) {
    std::vector<std::vector<std::string>> rows = {
        {"MODEL", "QUEUED", "RUNNING", "TOKENS", "RATE", "BURST", "RESIDENT", "WAITING-ON"}};
    for (const v1::ModelStats& m : r.models()) {
      const bool limited = m.tokens() >= 0;
      rows.push_back({m.model(), absl::StrCat(m.queued()), absl::StrCat(m.running()),
                      limited ? FormatNumber(m.tokens()) : "-",
                      limited ? FormatRate(m.rate_per_second()) : "-",
                      limited ? absl::StrCat(m.burst()) : "-", absl::StrCat(m.resident_on()),
                      WaitCell(m.head_wait_reason(), m.queued())});
    }
    PrintTable(rows);
    std::cout << "\n";
  }
  if (!r.tenants().empty()) {
    std::vector<std::vector<std::string>> rows = {
        {"TENANT", "WEIGHT", "QUEUED", "RUNNING", "SHARE", "FAIR", "COST", "FLOOR", "CEILING"}};
    for (const v1::TenantStats& t : r.tenants()) {
      rows.push_back({t.tenant().empty() ? "-" : t.tenant(), FormatNumber(t.weight()),
                      absl::StrCat(t.queued()), absl::StrCat(t.running()), FormatPercent(t.share()),
                      FormatPercent(t.fair_share()), FormatNumber(t.cost()),
                      t.min_running() == 0 ? "-" : absl::StrCat(t.min_running()),
                      t.max_running() == 0 ? "-" : absl::StrCat(t.max_running())});
    }
    PrintTable(rows);
    std::cout << "\n";
  }
  if (!r.keys().empty()) {
    std::vector<std::vector<std::string>> rows = {
        {"KEY", "QUEUED", "RUNNING", "COST", "WAITING-ON"}};
    for (const v1::KeyStats& k : r.keys()) {
      rows.push_back({k.fairness_key(), absl::StrCat(k.queued()), absl::StrCat(k.running()),
                      FormatNumber(k.cost()), WaitCell(k.head_wait_reason(), k.queued())});
    }
    PrintTable(rows);
    if (r.keys_total() > r.keys_size()) {
      std::cout << "(the " << r.keys_size() << " lowest-cost of " << r.keys_total()
                << " fairness keys)\n";
    }
    std::cout << "\n";
  }
  const v1::LeaderInfo& leader = r.leader();
  std::string leader_line = leader.address().empty()
                                ? std::string("none known yet")
                                : absl::StrCat(leader.address(), " (epoch ", leader.epoch(), ")");
  if (!leader.is_leader()) {
    // A standby has no workers or scheduler: only the leader does.
    PrintKeyValues({{"leader", leader_line}, {"this daemon", "standby (ask the leader for more)"}});
    return;
  }
  PrintKeyValues({{"leader", absl::StrCat(leader_line, ", this daemon")},
                  {"workers", absl::StrCat(r.workers())},
                  {"slots busy/total", absl::StrCat(r.slots_busy(), "/", r.slots_total())},
                  {"fairness keys", absl::StrCat(r.keys_total())},
                  {"accounting repairs", absl::StrCat(r.accounting_repairs())}});
}

ProgressLine::ProgressLine() : thread_([this] { Run(); }) {}

ProgressLine::~ProgressLine() {
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
  }
  thread_.join();
  std::cout << "\r\033[K" << std::flush;
}

void ProgressLine::Event(const std::string& line, const std::string& state, absl::Time since) {
  absl::MutexLock l(&mu_);
  std::cout << "\r\033[K" << line << "\n";
  state_ = state;
  since_ = since;
  DrawLocked();
}

void ProgressLine::Run() {
  absl::MutexLock l(&mu_);
  while (!mu_.AwaitWithTimeout(absl::Condition(&stopping_), absl::Milliseconds(250))) {
    DrawLocked();
  }
}

void ProgressLine::DrawLocked() {
  if (state_.empty()) return;
  const int64_t seconds = std::max<int64_t>(0, absl::ToInt64Seconds(absl::Now() - since_));
  std::cout << "\r\033[K  " << state_ << " for " << absl::FormatDuration(absl::Seconds(seconds))
            << " ..." << std::flush;
}

}  // namespace dispatchd::client::ctl
