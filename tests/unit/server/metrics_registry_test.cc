// metrics::Registry's text exposition: HELP and TYPE lines, label escaping, cumulative histogram
// buckets with +Inf, _sum and _count, collectors run on each render, families sorted by name.
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "server/metrics/registry.h"

namespace dispatchd::metrics {
namespace {

using ::testing::HasSubstr;

TEST(MetricsRegistryTest, CountersAndGaugesWithLabels) {
  Registry r;
  Family<Counter>& c = r.AddCounter("x_total", "Things done.", {"kind"});
  c.With({"a"}).Inc();
  c.With({"a"}).Inc(2);
  c.With({"b\"q\\\n"}).Inc(0.5);
  r.AddGauge("y", "A level.").With({}).Set(-3);
  EXPECT_EQ(r.Render(),
            "# HELP x_total Things done.\n"
            "# TYPE x_total counter\n"
            "x_total{kind=\"a\"} 3\n"
            "x_total{kind=\"b\\\"q\\\\\\n\"} 0.5\n"
            "# HELP y A level.\n"
            "# TYPE y gauge\n"
            "y -3\n");
}

TEST(MetricsRegistryTest, UnlabelledFamilyWithNoChildRendersZero) {
  Registry r;
  r.AddCounter("z_total", "Never incremented.");
  r.AddGauge("w", "Labelled, never set.", {"k"});
  EXPECT_EQ(r.Render(),
            "# HELP w Labelled, never set.\n# TYPE w gauge\n"
            "# HELP z_total Never incremented.\n# TYPE z_total counter\nz_total 0\n");
}

TEST(MetricsRegistryTest, HistogramBucketsAreCumulativeWithInf) {
  static const std::vector<double> bounds = {0.1, 1, 10};
  Registry r;
  Histogram& h = r.AddHistogram("lat_seconds", "Latency.", {"op"}, bounds).With({"get"});
  h.Observe(0.05);
  h.Observe(0.1);  // on a bound: counted in that bucket (le)
  h.Observe(5);
  h.Observe(50);
  const std::string page = r.Render();
  EXPECT_THAT(page, HasSubstr("# TYPE lat_seconds histogram\n"));
  EXPECT_THAT(page, HasSubstr("lat_seconds_bucket{op=\"get\",le=\"0.10000000000000001\"} 2\n"));
  EXPECT_THAT(page, HasSubstr("lat_seconds_bucket{op=\"get\",le=\"1\"} 2\n"));
  EXPECT_THAT(page, HasSubstr("lat_seconds_bucket{op=\"get\",le=\"10\"} 3\n"));
  EXPECT_THAT(page, HasSubstr("lat_seconds_bucket{op=\"get\",le=\"+Inf\"} 4\n"));
  EXPECT_THAT(page, HasSubstr("lat_seconds_sum{op=\"get\"} 55.149999999999999\n"));
  EXPECT_THAT(page, HasSubstr("lat_seconds_count{op=\"get\"} 4\n"));
}

TEST(MetricsRegistryTest, CollectorsRefillGaugesOnEachRender) {
  Registry r;
  Family<Gauge>& g = r.AddGauge("depth", "Queue depth.", {"queue"});
  int renders = 0;
  r.AddCollector([&] {
    g.Clear();
    ++renders;
    if (renders == 1) g.With({"gone-later"}).Set(1);
    g.With({"q"}).Set(renders * 10);
  });
  EXPECT_THAT(r.Render(), HasSubstr("depth{queue=\"gone-later\"} 1\n"));
  const std::string second = r.Render();
  EXPECT_THAT(second, HasSubstr("depth{queue=\"q\"} 20\n"));
  EXPECT_THAT(second, ::testing::Not(HasSubstr("gone-later")));
}

}  // namespace
}  // namespace dispatchd::metrics
