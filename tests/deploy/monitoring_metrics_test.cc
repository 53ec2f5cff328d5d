// The Grafana dashboard and the alert rules of deploy/monitoring name only what a running daemon
// exports: every `dispatchd_*` series they name is a family on its /metrics page, and every label
// they match on or group by is one its samples carry. So the files cannot drift from the daemon.

#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include <httplib.h>

#include "tests/e2e/e2e_test.h"
#include "tests/e2e/harness.h"

namespace dispatchd::e2e {
namespace {

// What /metrics says: the families by name, and the label names each family's samples carry.
struct Exported {
  std::set<std::string> histograms;
  std::set<std::string> families;
  std::map<std::string, std::set<std::string>> labels;
};

std::string Scrape(Daemon& daemon) {
  const std::string address = daemon.MetricsAddress();
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port)) return "";
  httplib::Client client(address.substr(0, colon), port);
  httplib::Result r = client.Get("/metrics");
  return r && r->status == 200 ? r->body : "";
}

// The family a sample or series name belongs to: a histogram's, for its _bucket, _sum and _count.
std::string FamilyOf(absl::string_view name, const Exported& e) {
  for (const char* suffix : {"_bucket", "_sum", "_count"}) {
    absl::string_view base = name;
    if (absl::ConsumeSuffix(&base, suffix) && e.histograms.contains(std::string(base))) {
      return std::string(base);
    }
  }
  return std::string(name);
}

Exported Parse(const std::string& page) {
  Exported e;
  for (absl::string_view line : absl::StrSplit(page, '\n')) {
    if (absl::ConsumePrefix(&line, "# TYPE ")) {
      const std::vector<std::string> fields = absl::StrSplit(line, ' ');
      e.families.insert(fields[0]);
      if (fields.size() > 1 && fields[1] == "histogram") e.histograms.insert(fields[0]);
      continue;
    }
    if (line.empty() || line[0] == '#') continue;
    const size_t brace = line.find('{');
    if (brace == absl::string_view::npos) continue;
    const std::string family = FamilyOf(line.substr(0, brace), e);
    static const std::regex kLabel(R"re(([a-z_]+)=")re");
    const std::string labels(line.substr(brace));
    for (std::sregex_iterator it(labels.begin(), labels.end(), kLabel), end; it != end; ++it) {
      e.labels[family].insert((*it)[1]);
    }
  }
  return e;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Checks one file's metric names, matchers and groupings against what the daemon exports.
void CheckFile(const std::string& path, const Exported& e) {
  SCOPED_TRACE(path);
  const std::string text = ReadAll(path);
  ASSERT_FALSE(text.empty());
  // Labels Prometheus adds to every scraped series, and histogram buckets' own.
  std::set<std::string> any_label = {"job", "instance", "le"};
  for (const auto& [family, labels] : e.labels) any_label.insert(labels.begin(), labels.end());

  static const std::regex kName(R"re(\bdispatchd_[a-z0-9_]+)re");
  int names = 0;
  for (std::sregex_iterator it(text.begin(), text.end(), kName), end; it != end; ++it, ++names) {
    const std::string family = FamilyOf(it->str(), e);
    EXPECT_TRUE(e.families.contains(family)) << it->str() << " is not exported";
  }
  EXPECT_GT(names, 0);

  // name{label="..", ...}: each label must be one the family's samples carry.
  static const std::regex kSelector(R"re(\b(dispatchd_[a-z0-9_]+)\{([^}]*)\})re");
  static const std::regex kMatcher(R"re(([a-z_]+)\s*(=~|!~|!=|=))re");
  for (std::sregex_iterator it(text.begin(), text.end(), kSelector), end; it != end; ++it) {
    const std::string family = FamilyOf((*it)[1].str(), e);
    const std::string matchers = (*it)[2];
    for (std::sregex_iterator m(matchers.begin(), matchers.end(), kMatcher); m != end; ++m) {
      const std::string label = (*m)[1];
      if (label == "job" || label == "instance") continue;
      ASSERT_TRUE(e.labels.contains(family)) << family << " has no samples to check " << label;
      EXPECT_TRUE(e.labels.at(family).contains(label)) << family << " has no label " << label;
    }
  }
  // by (...) and without (...): labels some exported series carries.
  static const std::regex kGrouping(R"re(\b(by|without)\s*\(([^)]*)\))re");
  for (std::sregex_iterator it(text.begin(), text.end(), kGrouping), end; it != end; ++it) {
    for (absl::string_view label : absl::StrSplit((*it)[2].str(), ',', absl::SkipWhitespace())) {
      label = absl::StripAsciiWhitespace(label);
      EXPECT_TRUE(any_label.contains(std::string(label))) << "no series has label " << label;
    }
  }
}

using MonitoringMetricsTest = E2eTest;

TEST_F(MonitoringMetricsTest, DashboardAndAlertsNameOnlyWhatTheDaemonExports) {
  // `idle` has no worker: its dispatchd_type_workers is 0.
  std::unique_ptr<Daemon> daemon = StartDaemon({.types = {{.name = "echo"}, {.name = "idle"}}});
  ASSERT_NE(daemon, nullptr);
  Daemon& d = *daemon;
  // One job run and one refused, so that the families of admission, waits and run times have
  // samples whose labels can be checked. The job is queued before its worker comes, so that it
  // waits in the queue (a job a free worker takes as it is submitted is never queued).
  absl::StatusOr<std::string> id = d.Submit(Spec("echo", "hello"));
  ASSERT_TRUE(id.ok()) << id.status();
  std::unique_ptr<Worker> worker = StartWorker(d, {.id = "w", .types = {"echo"}});
  ASSERT_NE(worker, nullptr);
  ASSERT_TRUE(d.WaitForWorkers(1));
  std::vector<v1::Job> jobs;
  ASSERT_TRUE(d.WaitForTerminal({*id}, &jobs, absl::Seconds(30)));
  EXPECT_EQ(jobs[0].state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_FALSE(d.Submit(Spec("nosuch", "x")).ok());  // unknown type: refused as invalid

  EXPECT_EQ(d.Metric("dispatchd_type_workers{type=\"echo\"}"), 1);
  EXPECT_EQ(d.Metric("dispatchd_type_workers{type=\"idle\"}"), 0);

  const std::string page = Scrape(d);
  ASSERT_FALSE(page.empty());
  const Exported exported = Parse(page);
  ASSERT_TRUE(exported.labels.contains("dispatchd_jobs_refused_total")) << page;
  CheckFile(absl::StrCat(DISPATCHD_SOURCE_DIR, "/deploy/monitoring/dispatchd-dashboard.json"),
            exported);
  CheckFile(absl::StrCat(DISPATCHD_SOURCE_DIR, "/deploy/monitoring/dispatchd-alerts.yml"),
            exported);
}

}  // namespace
}  // namespace dispatchd::e2e
