#include "server/metrics/registry.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace dispatchd::metrics {

Histogram::Histogram(const std::vector<double>* bounds)
    : bounds_(bounds), counts_(new std::atomic<uint64_t>[bounds->size() + 1]) {
  for (size_t i = 0; i <= bounds_->size(); ++i) counts_[i].store(0, std::memory_order_relaxed);
}

void Histogram::Observe(double v) {
  const size_t bucket =
      static_cast<size_t>(std::lower_bound(bounds_->begin(), bounds_->end(), v) - bounds_->begin());
  counts_[bucket].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(v, std::memory_order_relaxed);
}

std::vector<uint64_t> Histogram::Cumulative() const {
  std::vector<uint64_t> out(bounds_->size() + 1);
  uint64_t running = 0;
  for (size_t i = 0; i <= bounds_->size(); ++i) {
    running += counts_[i].load(std::memory_order_relaxed);
    out[i] = running;
  }
  return out;
}

const std::vector<double>& SecondsBuckets() {
  static const std::vector<double> b = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                        0.5,    1,     2.5,    5,     10,   30,    60,   120, 300};
  return b;
}

const std::vector<double>& FineSecondsBuckets() {
  static const std::vector<double> b = {1e-6,   2.5e-6, 5e-6,  1e-5,   2.5e-5, 5e-5, 1e-4,
                                        2.5e-4, 5e-4,   0.001, 0.0025, 0.005,  0.01, 0.025,
                                        0.05,   0.1,    0.25,  0.5,    1,      2.5,  10};
  return b;
}

const std::vector<double>& SizeBuckets() {
  static const std::vector<double> b = {1,   2,   5,    10,   20,   50,   100,
                                        200, 500, 1000, 2000, 5000, 10000};
  return b;
}

std::string EscapeLabelValue(const std::string& v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

namespace {

// A sample value: integers without a fraction, others with enough digits to read back.
std::string FormatValue(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (std::isnan(v)) return "NaN";
  if (v == std::floor(v) && std::fabs(v) < 1e15) return absl::StrCat(static_cast<int64_t>(v));
  return absl::StrFormat("%.17g", v);
}

// `{a="x",b="y"}` for the given names and values plus an optional extra pair; "" when empty.
std::string LabelSet(const std::vector<std::string>& names, const Labels& values,
                     const std::string& extra_name = "", const std::string& extra_value = "") {
  std::string out;
  for (size_t i = 0; i < names.size() && i < values.size(); ++i) {
    absl::StrAppend(&out, out.empty() ? "" : ",", names[i], "=\"", EscapeLabelValue(values[i]),
                    "\"");
  }
  if (!extra_name.empty()) {
    absl::StrAppend(&out, out.empty() ? "" : ",", extra_name, "=\"", extra_value, "\"");
  }
  return out.empty() ? "" : absl::StrCat("{", out, "}");
}

template <typename T>
void Header(std::string* out, const Family<T>& f, const char* type) {
  absl::StrAppend(out, "# HELP ", f.name(), " ", f.help(), "\n# TYPE ", f.name(), " ", type, "\n");
}

template <typename T>
void Scalars(std::string* out, const Family<T>& f, const char* type) {
  Header(out, f, type);
  bool any = false;
  f.ForEach([&](const Labels& values, const T& child) {
    any = true;
    absl::StrAppend(out, f.name(), LabelSet(f.label_names(), values), " ",
                    FormatValue(child.value()), "\n");
  });
  if (!any && f.label_names().empty()) absl::StrAppend(out, f.name(), " 0\n");
}

}  // namespace

Family<Counter>& Registry::AddCounter(std::string name, std::string help,
                                      std::vector<std::string> labels) {
  absl::MutexLock l(&mu_);
  auto& slot = counters_[name];
  slot = std::make_unique<Family<Counter>>(std::move(name), std::move(help), std::move(labels),
                                           [] { return std::make_unique<Counter>(); });
  return *slot;
}

Family<Gauge>& Registry::AddGauge(std::string name, std::string help,
                                  std::vector<std::string> labels) {
  absl::MutexLock l(&mu_);
  auto& slot = gauges_[name];
  slot = std::make_unique<Family<Gauge>>(std::move(name), std::move(help), std::move(labels),
                                         [] { return std::make_unique<Gauge>(); });
  return *slot;
}

Family<Histogram>& Registry::AddHistogram(std::string name, std::string help,
                                          std::vector<std::string> labels,
                                          const std::vector<double>& bounds) {
  absl::MutexLock l(&mu_);
  auto& slot = histograms_[name];
  const std::vector<double>* b = &bounds;
  slot = std::make_unique<Family<Histogram>>(std::move(name), std::move(help), std::move(labels),
                                             [b] { return std::make_unique<Histogram>(b); });
  return *slot;
}

void Registry::AddCollector(std::function<void()> collect) {
  absl::MutexLock l(&mu_);
  collectors_.push_back(std::move(collect));
}

std::string Registry::Render() {
  // One scrape at a time: collectors clear and refill their families.
  absl::MutexLock l(&mu_);
  for (const std::function<void()>& collect : collectors_) collect();
  // Every family by name, whatever its kind.
  std::map<std::string, std::string> pages;
  for (const auto& [name, f] : counters_) Scalars(&pages[name], *f, "counter");
  for (const auto& [name, f] : gauges_) Scalars(&pages[name], *f, "gauge");
  for (const auto& [name, family] : histograms_) {
    // A plain reference: clang does not let a lambda capture a structured binding.
    const Family<Histogram>& f = *family;
    std::string* out = &pages[name];
    Header(out, f, "histogram");
    f.ForEach([&](const Labels& values, const Histogram& h) {
      const std::vector<uint64_t> counts = h.Cumulative();
      for (size_t i = 0; i < counts.size(); ++i) {
        const std::string le = i + 1 < counts.size() ? FormatValue(h.bound(i)) : "+Inf";
        absl::StrAppend(out, f.name(), "_bucket", LabelSet(f.label_names(), values, "le", le), " ",
                        counts[i], "\n");
      }
      absl::StrAppend(out, f.name(), "_sum", LabelSet(f.label_names(), values), " ",
                      FormatValue(h.sum()), "\n");
      absl::StrAppend(out, f.name(), "_count", LabelSet(f.label_names(), values), " ",
                      counts.back(), "\n");
    });
  }
  std::string page;
  for (const auto& [name, text] : pages) page += text;
  return page;
}

}  // namespace dispatchd::metrics
