#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace dispatchd::metrics {

// Prometheus metrics in the text exposition format (version 0.0.4), with no dependency beyond
// Abseil. A Registry holds families of one kind each (counter, gauge, histogram); a family holds
// one child per set of label values. Children live as long as the registry, so callers keep
// references to them:
//
//   Registry registry;
//   auto& admitted = registry.AddCounter("dispatchd_jobs_admitted_total", "Jobs admitted.",
//   {"type"}); admitted.With({"embed"}).Inc(); std::string page = registry.Render();
//
// Values that are cheaper to read than to track (queue depths, connected workers) come from
// collectors, run on every Render, which fill gauge families afresh. Thread-safe.

// Label values, in the order of the family's label names.
using Labels = std::vector<std::string>;

class Counter {
 public:
  void Inc(double by = 1) { value_.fetch_add(by, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

class Gauge {
 public:
  void Set(double v) { value_.store(v, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

class Histogram {
 public:
  // `bounds`: the buckets' upper bounds, increasing; +Inf is implied.
  explicit Histogram(const std::vector<double>* bounds);
  void Observe(double v);
  // Cumulative counts per bound, then the total (the +Inf bucket).
  std::vector<uint64_t> Cumulative() const;
  double sum() const { return sum_.load(std::memory_order_relaxed); }
  double bound(size_t i) const { return (*bounds_)[i]; }

 private:
  const std::vector<double>* bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;  // per bucket, +Inf last
  std::atomic<double> sum_{0};
};

// Buckets of durations in seconds, from 0.5 ms to 5 min.
const std::vector<double>& SecondsBuckets();
// Buckets of short durations in seconds, 1 us to 10 s, for work on the dispatcher loop.
const std::vector<double>& FineSecondsBuckets();
// Buckets of sizes (rows per statement, jobs per batch), 1 to 10000.
const std::vector<double>& SizeBuckets();

template <typename T>
class Family {
 public:
  Family(std::string name, std::string help, std::vector<std::string> label_names,
         std::function<std::unique_ptr<T>()> make)
      : name_(std::move(name)),
        help_(std::move(help)),
        label_names_(std::move(label_names)),
        make_(std::move(make)) {}

  // The child for `values` (as many as the family has label names), created on first use.
  T& With(const Labels& values) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock l(&mu_);
    std::unique_ptr<T>& child = children_[values];
    if (child == nullptr) child = make_();
    return *child;
  }
  // Drops every child (collectors refill their families on each scrape).
  void Clear() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock l(&mu_);
    children_.clear();
  }

  const std::string& name() const { return name_; }
  const std::string& help() const { return help_; }
  const std::vector<std::string>& label_names() const { return label_names_; }
  // Calls `f(values, child)` for each child, ordered by label values.
  void ForEach(const std::function<void(const Labels&, const T&)>& f) const
      ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock l(&mu_);
    for (const auto& [values, child] : children_) f(values, *child);
  }

 private:
  const std::string name_;
  const std::string help_;
  const std::vector<std::string> label_names_;
  const std::function<std::unique_ptr<T>()> make_;
  mutable absl::Mutex mu_;
  std::map<Labels, std::unique_ptr<T>> children_ ABSL_GUARDED_BY(mu_);
};

class Registry {
 public:
  Family<Counter>& AddCounter(std::string name, std::string help,
                              std::vector<std::string> labels = {}) ABSL_LOCKS_EXCLUDED(mu_);
  Family<Gauge>& AddGauge(std::string name, std::string help, std::vector<std::string> labels = {})
      ABSL_LOCKS_EXCLUDED(mu_);
  Family<Histogram>& AddHistogram(std::string name, std::string help,
                                  std::vector<std::string> labels,
                                  const std::vector<double>& bounds) ABSL_LOCKS_EXCLUDED(mu_);
  // Runs before every Render, in the order added.
  void AddCollector(std::function<void()> collect) ABSL_LOCKS_EXCLUDED(mu_);

  // Runs the collectors, then writes every family, sorted by name, with its HELP and TYPE lines.
  // A family with no child and no labels is written as 0; one with labels and no child is
  // written as its HELP and TYPE lines alone.
  std::string Render() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<Family<Counter>>> counters_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::unique_ptr<Family<Gauge>>> gauges_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::unique_ptr<Family<Histogram>>> histograms_ ABSL_GUARDED_BY(mu_);
  std::vector<std::function<void()>> collectors_ ABSL_GUARDED_BY(mu_);
};

// Escapes a label value for the exposition format: backslash, double quote and newline.
std::string EscapeLabelValue(const std::string& v);

}  // namespace dispatchd::metrics
