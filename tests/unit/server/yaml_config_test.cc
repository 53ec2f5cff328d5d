#include "server/config/yaml_config.h"

#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "lib/config/config.h"
#include "tests/testing/status_matchers.h"

namespace dispatchd::server {
namespace {

using ::dispatchd::testing::IsOk;
using ::dispatchd::testing::StatusIs;
using ::testing::DoubleEq;
using ::testing::HasSubstr;

// Every key added with tiers, models and rate limits, each set away from its default.
constexpr char kFull[] = R"(
max_active: 5000
idempotency_window: 2h
scheduler:
  policy: fifo
  cost_alpha: 0.5
  key_ttl: 20m
tiers:
  - {name: background, value: 10}
  - {name: foreground, value: 40}
types:
  - name: llm.generate
    model: llama
    tier: foreground
    conflict_group: gpu-writer
    default_cost: 2.5
    vram_gb: 16
    rpm: 20
    burst: 5
    max_queue_depth: 100
    max_affinity_wait: 45s
  - name: embed.text
    tier: background
    rps: 50
  - name: echo
)";

absl::StatusOr<config::Config> Parse(const std::string& yaml) {
  return ParseConfig(yaml, "test.yaml");
}

TEST(YamlConfigTest, ParsesEveryNewKey) {
  absl::StatusOr<config::Config> c = Parse(kFull);
  ASSERT_THAT(c, IsOk());
  EXPECT_EQ(c->max_active, 5000);
  EXPECT_EQ(c->idempotency_window, absl::Hours(2));
  EXPECT_EQ(c->scheduler.policy, "fifo");
  EXPECT_THAT(c->scheduler.cost_alpha, DoubleEq(0.5));
  EXPECT_EQ(c->scheduler.key_ttl, absl::Minutes(20));
  ASSERT_EQ(c->tiers.size(), 2u);
  EXPECT_EQ(c->tiers[0].name, "background");
  EXPECT_EQ(c->tiers[0].value, 10);
  EXPECT_EQ(c->tiers[1].name, "foreground");
  EXPECT_EQ(c->tiers[1].value, 40);

  ASSERT_EQ(c->types.size(), 3u);
  const config::JobTypeConfig& llm = c->types[0];
  EXPECT_EQ(llm.model, "llama");
  EXPECT_EQ(llm.tier, "foreground");
  EXPECT_EQ(llm.conflict_group, "gpu-writer");
  EXPECT_THAT(llm.default_cost, DoubleEq(2.5));
  EXPECT_THAT(llm.vram_gb, DoubleEq(16));
  EXPECT_THAT(llm.rate.per_second, DoubleEq(1.0 / 3));  // 20 per minute
  EXPECT_EQ(llm.rate.burst, 5);
  EXPECT_EQ(llm.max_queue_depth, 100);
  EXPECT_EQ(llm.max_affinity_wait, absl::Seconds(45));

  const config::JobTypeConfig& embed = c->types[1];
  EXPECT_EQ(embed.tier, "background");
  EXPECT_THAT(embed.rate.per_second, DoubleEq(50));
  EXPECT_EQ(embed.rate.burst, 1);  // default

  // Left out: the defaults.
  const config::JobTypeConfig& echo = c->types[2];
  EXPECT_EQ(echo.tier, "");
  EXPECT_EQ(echo.conflict_group, "");
  EXPECT_THAT(echo.default_cost, DoubleEq(1.0));
  EXPECT_LT(echo.vram_gb, 0);
  EXPECT_FALSE(echo.rate.limited());
  EXPECT_EQ(echo.max_queue_depth, config::kUnlimited);
  EXPECT_EQ(echo.max_affinity_wait, absl::Seconds(30));
}

TEST(YamlConfigTest, DefaultsWhenNewKeysAreLeftOut) {
  absl::StatusOr<config::Config> c = Parse("types:\n  - name: echo\n");
  ASSERT_THAT(c, IsOk());
  config::Config defaults;
  EXPECT_EQ(c->max_active, defaults.max_active);
  EXPECT_EQ(c->idempotency_window, defaults.idempotency_window);
  EXPECT_EQ(c->scheduler.policy, "fair");
  EXPECT_TRUE(c->tiers.empty());
}

TEST(YamlConfigTest, RefusesRpmAndRpsTogether) {
  EXPECT_THAT(Parse("types:\n"
                    "  - name: llm\n"
                    "    rpm: 20\n"
                    "    rps: 1\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "test.yaml:4:10: types[0].rps: set rpm or rps, not both"));
}

TEST(YamlConfigTest, RefusesBurstWithoutRate) {
  EXPECT_THAT(Parse("types:\n"
                    "  - name: llm\n"
                    "    burst: 5\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "test.yaml:3:12: types[0].burst: needs rpm or rps"));
}

TEST(YamlConfigTest, RateMustBePositive) {
  EXPECT_THAT(Parse("types:\n"
                    "  - name: llm\n"
                    "    rpm: 0\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "test.yaml:3:10: types[0].rpm: must be > 0, got 0"));
  EXPECT_THAT(Parse("types:\n"
                    "  - name: llm\n"
                    "    rps: -2\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, "types[0].rps: must be > 0, got -2"));
}

TEST(YamlConfigTest, RefusesNonNumberVram) {
  EXPECT_THAT(Parse("types:\n"
                    "  - name: llm\n"
                    "    model: llama\n"
                    "    vram_gb: lots\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "test.yaml:4:14: types[0].vram_gb: want a number"));
  EXPECT_THAT(Parse("types:\n"
                    "  - name: llm\n"
                    "    model: llama\n"
                    "    vram_gb: -1\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, "types[0].vram_gb: must be >= 0"));
}

TEST(YamlConfigTest, RefusesUnknownKeyUnderScheduler) {
  absl::StatusOr<config::Config> c = Parse(
      "scheduler:\n"
      "  policy: fair\n"
      "  cost_alfa: 0.5\n"
      "types:\n"
      "  - name: echo\n");
  EXPECT_THAT(c, StatusIs(absl::StatusCode::kInvalidArgument,
                          "test.yaml:3:3: scheduler.cost_alfa: unknown key"));
  EXPECT_THAT(c.status().message(), HasSubstr("policy, cost_alpha, key_ttl"));
}

TEST(YamlConfigTest, TierNeedsNameAndValue) {
  EXPECT_THAT(Parse("tiers:\n"
                    "  - {name: background}\n"
                    "types:\n"
                    "  - name: echo\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, "tiers[0].value: required"));
  EXPECT_THAT(Parse("tiers:\n"
                    "  - {name: background, value: 10, cap: 3}\n"
                    "types:\n"
                    "  - name: echo\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, "tiers[0].cap: unknown key"));
}

TEST(YamlConfigTest, ParsesLimitsAndDefaultsTheBurstToOneSecondOfRate) {
  absl::StatusOr<config::Config> c = Parse(R"(
limits:
  max_message_bytes: 2097152
  max_labels: 8
  max_label_bytes: 64
  max_key_bytes: 100
  max_id_bytes: 48
  worker_streams_per_principal: 20
  watches_per_principal: 30
  submit_rate: 250
types:
  - name: echo
)");
  ASSERT_THAT(c, IsOk());
  EXPECT_EQ(c->limits.max_message_bytes, 2097152);
  EXPECT_EQ(c->MaxMessageBytes(), 2097152);
  EXPECT_EQ(c->limits.max_labels, 8);
  EXPECT_EQ(c->limits.max_label_bytes, 64);
  EXPECT_EQ(c->limits.max_key_bytes, 100);
  EXPECT_EQ(c->limits.max_id_bytes, 48);
  EXPECT_EQ(c->limits.worker_streams_per_principal, 20);
  EXPECT_EQ(c->limits.watches_per_principal, 30);
  EXPECT_THAT(c->limits.submit.per_second, DoubleEq(250));
  EXPECT_EQ(c->limits.submit.burst, 250);

  absl::StatusOr<config::Config> burst =
      Parse("limits: {submit_rate: 0.5, submit_burst: 3}\ntypes:\n  - name: echo\n");
  ASSERT_THAT(burst, IsOk());
  EXPECT_EQ(burst->limits.submit.burst, 3);
}

TEST(YamlConfigTest, LimitsDefaultsAndTheAutomaticMessageLimit) {
  absl::StatusOr<config::Config> c = Parse("types:\n  - name: echo\n");
  ASSERT_THAT(c, IsOk());
  EXPECT_EQ(c->limits, config::LimitsConfig{});
  EXPECT_FALSE(c->limits.submit.limited());
  EXPECT_EQ(c->MaxMessageBytes(), 5 << 20);  // 4 MiB for results, plus 1 MiB
  absl::StatusOr<config::Config> big =
      Parse("max_payload_bytes: 16777216\ntypes:\n  - name: echo\n");
  ASSERT_THAT(big, IsOk());
  EXPECT_EQ(big->MaxMessageBytes(), (16 << 20) + (1 << 20));
}

TEST(YamlConfigTest, ParsesThePoolAndTurnsInFlight) {
  absl::StatusOr<config::Config> c =
      Parse("postgres:\n  pool_size: 12\n  turns_in_flight: 6\ntypes:\n  - name: echo\n");
  ASSERT_THAT(c, IsOk());
  EXPECT_EQ(c->postgres.pool_size, 12);
  EXPECT_EQ(c->postgres.turns_in_flight, 6);
  EXPECT_EQ(c->postgres.TurnsInFlight(2), 6);

  c = Parse("types:\n  - name: echo\n");
  ASSERT_THAT(c, IsOk());
  EXPECT_EQ(c->postgres.pool_size, 8);
  EXPECT_EQ(c->postgres.turns_in_flight, 0);  // by the cores

  for (const char* bad : {"turns_in_flight: 65", "turns_in_flight: -1", "turns_in_flight: many"}) {
    SCOPED_TRACE(bad);
    EXPECT_THAT(Parse(absl::StrCat("postgres:\n  ", bad, "\ntypes:\n  - name: echo\n")),
                StatusIs(absl::StatusCode::kInvalidArgument, "postgres.turns_in_flight"));
  }
}

TEST(YamlConfigTest, RefusesLimitsOutOfRangeNamingTheKey) {
  const std::pair<std::string, std::string> cases[] = {
      {"max_message_bytes: 100000", "limits.max_message_bytes"},  // under payload + 64 KiB
      {"max_labels: -1", "limits.max_labels"},
      {"max_label_bytes: 0", "limits.max_label_bytes"},
      {"max_key_bytes: 5000", "limits.max_key_bytes"},
      {"max_id_bytes: 16", "limits.max_id_bytes"},  // under the daemon's own 30-byte ids
      {"worker_streams_per_principal: 0", "limits.worker_streams_per_principal"},
      {"watches_per_principal: 0", "limits.watches_per_principal"},
      {"submit_rate: -1", "limits.submit_rate"},
      {"submit_burst: 0", "limits.submit_burst"},
      {"max_watches: 3", "limits.max_watches"},  // unknown key
  };
  for (const auto& [line, key] : cases) {
    SCOPED_TRACE(line);
    EXPECT_THAT(Parse(absl::StrCat("limits:\n  ", line, "\ntypes:\n  - name: echo\n")),
                StatusIs(absl::StatusCode::kInvalidArgument, key));
  }
}

TEST(YamlConfigTest, ParsesTenantsWithWeightsQuotasAndRates) {
  absl::StatusOr<config::Config> c = Parse(R"(
types:
  - {name: chat, model: llama}
  - {name: echo}
tenants:
  - name: research
    principals: [alice, bob]
    weight: 3
    max_active: 500
    max_running: 8
    min_running: 2
    rates:
      - {model: llama, rpm: 120, burst: 4}
      - {model: echo, rps: 50}
  - {name: batch, principals: [nightly]}
)");
  ASSERT_THAT(c, IsOk());
  ASSERT_EQ(c->tenants.size(), 2u);
  const config::TenantConfig& t = c->tenants[0];
  EXPECT_EQ(t.name, "research");
  EXPECT_THAT(t.principals, ::testing::ElementsAre("alice", "bob"));
  EXPECT_EQ(t.weight, 3);
  EXPECT_EQ(t.max_active, 500);
  EXPECT_EQ(t.max_running, 8);
  EXPECT_EQ(t.min_running, 2);
  ASSERT_EQ(t.rates.size(), 2u);
  EXPECT_EQ(t.rates[0].model, "llama");
  EXPECT_THAT(t.rates[0].rate.per_second, DoubleEq(2));
  EXPECT_EQ(t.rates[0].rate.burst, 4);
  EXPECT_EQ(t.rates[1].rate.burst, 1);
  // Defaults, and the principal-to-tenant mapping.
  EXPECT_EQ(c->tenants[1].weight, 1);
  EXPECT_EQ(c->tenants[1].max_running, config::kUnlimited);
  EXPECT_EQ(c->tenants[1].min_running, 0);
  EXPECT_EQ(c->TenantNameOf("bob"), "research");
  EXPECT_EQ(c->TenantNameOf("carol"), "carol");
  EXPECT_EQ(c->TenantNameOf(""), "");
}

TEST(YamlConfigTest, RefusesBadTenantsNamingTheKey) {
  const std::pair<std::string, std::string> cases[] = {
      {"- {principals: [a]}", "tenants[0].name"},
      {"- {name: t}", "tenants[0].principals"},
      {"- {name: t, principals: [a]}\n  - {name: t, principals: [b]}", "tenants[1].name"},
      {"- {name: t, principals: [a]}\n  - {name: u, principals: [b, a]}",
       "tenants[1].principals[1]: principal \"a\" is already in tenants[0]"},
      {"- {name: t, principals: [a], weight: 0}", "tenants[0].weight"},
      {"- {name: t, principals: [a], max_running: 0}", "tenants[0].max_running"},
      {"- {name: t, principals: [a], max_running: 2, min_running: 3}", "tenants[0].min_running"},
      {"- {name: t, principals: [a], max_active: 0}", "tenants[0].max_active"},
      {"- {name: t, principals: [a], rates: [{model: nope, rps: 1}]}", "tenants[0].rates[0].model"},
      {"- {name: t, principals: [a], rates: [{model: echo}]}", "tenants[0].rates[0].rps"},
      {"- {name: t, principals: [a], rates: [{model: echo, rps: 1, rpm: 1}]}",
       "tenants[0].rates[0].rps"},
      {"- {name: t, principals: [a], rates: [{model: echo, rps: 1, burst: 0}]}",
       "tenants[0].rates[0].burst"},
      {"- {name: t, principals: [a], shares: 3}", "tenants[0].shares"},  // unknown key
  };
  for (const auto& [tenants, key] : cases) {
    SCOPED_TRACE(tenants);
    EXPECT_THAT(Parse(absl::StrCat("types:\n  - name: echo\ntenants:\n  ", tenants, "\n")),
                StatusIs(absl::StatusCode::kInvalidArgument, key));
  }
}

TEST(YamlConfigTest, ValidationErrorPointsAtTheKey) {
  // Validate() finds the unknown tier; the position is that of the `tier` value.
  EXPECT_THAT(Parse("types:\n"
                    "  - name: echo\n"
                    "    tier: foreground\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "test.yaml:3:11: types[0].tier: unknown tier \"foreground\""));
}

}  // namespace
}  // namespace dispatchd::server
