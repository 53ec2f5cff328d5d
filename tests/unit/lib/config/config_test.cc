#include "lib/config/config.h"

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "tests/testing/status_matchers.h"

namespace dispatchd::config {
namespace {

using ::dispatchd::testing::IsOk;
using ::dispatchd::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

Config ValidConfig() {
  Config c;
  c.types.push_back(JobTypeConfig{.name = "echo"});
  c.types.push_back(JobTypeConfig{.name = "llm.cover_letter", .max_concurrency = 4});
  return c;
}

// A valid config with `set(config, v)` applied passes Validate for each of `good` and is refused
// with a message containing `error` (which names the key) for each of `bad`. A failure names the
// value.
template <typename T, typename Set>
void ExpectBounded(Set set, std::initializer_list<T> good, std::initializer_list<T> bad,
                   const std::string& error) {
  for (T v : good) {
    Config c = ValidConfig();
    set(c, v);
    EXPECT_THAT(c.Validate(), IsOk()) << v;
  }
  for (T v : bad) {
    Config c = ValidConfig();
    set(c, v);
    EXPECT_THAT(c.Validate(), StatusIs(absl::StatusCode::kInvalidArgument, error)) << v;
  }
}

TEST(ConfigTest, DefaultsWithOneTypeAreValid) { EXPECT_THAT(ValidConfig().Validate(), IsOk()); }

TEST(ConfigTest, RequiresAType) {
  Config c;
  EXPECT_THAT(c.Validate(), StatusIs(absl::StatusCode::kInvalidArgument, "types:"));
}

TEST(ConfigTest, NamesTheTypeIndexAndKey) {
  Config c = ValidConfig();
  c.types[1].max_concurrency = 0;
  EXPECT_THAT(c.Validate(), StatusIs(absl::StatusCode::kInvalidArgument,
                                     "types[1].max_concurrency: must be >= 1, got 0"));
}

TEST(ConfigTest, RefusesDuplicateTypes) {
  Config c = ValidConfig();
  c.types[1].name = "echo";
  EXPECT_THAT(c.Validate(), StatusIs(absl::StatusCode::kInvalidArgument, "types[1].name"));
}

TEST(ConfigTest, RefusesBadTypeName) {
  Config c = ValidConfig();
  c.types[0].name = "has space";
  EXPECT_THAT(c.Validate(), StatusIs(absl::StatusCode::kInvalidArgument, "types[0].name"));
}

TEST(ConfigTest, StaleThresholdMustExceedTwoHeartbeats) {
  Config c = ValidConfig();
  c.heartbeat_interval = absl::Seconds(5);
  c.worker_stale_after = absl::Seconds(10);
  EXPECT_THAT(c.Validate(), StatusIs(absl::StatusCode::kInvalidArgument, "worker_stale_after"));
  c.worker_stale_after = absl::Seconds(11);
  EXPECT_THAT(c.Validate(), IsOk());
}

TEST(ConfigTest, LeaseMustBeAtLeastHalfASecondAndAdvertisedAddressHostPort) {
  Config c = ValidConfig();
  c.ha.lease = absl::Milliseconds(400);
  EXPECT_THAT(c.Validate(), StatusIs(absl::StatusCode::kInvalidArgument, "ha.lease"));
  c.ha.lease = absl::Seconds(2);
  EXPECT_THAT(c.Validate(), IsOk());
  c.ha.advertise_address = "no-port";
  EXPECT_THAT(c.Validate(), StatusIs(absl::StatusCode::kInvalidArgument, "ha.advertise_address"));
  c.ha.advertise_address = "10.0.0.5:7411";
  EXPECT_THAT(c.Validate(), IsOk());
}

TEST(ConfigTest, RefusesBadListenAddress) {
  Config c = ValidConfig();
  c.listen = "localhost";
  EXPECT_THAT(c.Validate(), StatusIs(absl::StatusCode::kInvalidArgument, "listen"));
  c.listen = "127.0.0.1:99999";
  EXPECT_THAT(c.Validate(), StatusIs(absl::StatusCode::kInvalidArgument, "listen"));
}

TEST(ConfigTest, RefusesUnknownLogLevel) {
  Config c = ValidConfig();
  c.log_level = "verbose";
  EXPECT_THAT(c.Validate(), StatusIs(absl::StatusCode::kInvalidArgument, "log_level"));
}

TEST(ConfigTest, FindTypeByName) {
  Config c = ValidConfig();
  ASSERT_NE(c.FindType("llm.cover_letter"), nullptr);
  EXPECT_EQ(c.FindType("llm.cover_letter")->max_concurrency, 4);
  EXPECT_EQ(c.FindType("nope"), nullptr);
}

TEST(ConfigTest, FindTierByName) {
  Config c = ValidConfig();
  c.tiers = {{.name = "background", .value = 10}, {.name = "foreground", .value = 40}};
  ASSERT_NE(c.FindTier("foreground"), nullptr);
  EXPECT_EQ(c.FindTier("foreground")->value, 40);
  EXPECT_EQ(c.FindTier("nope"), nullptr);
  // The empty name is the implicit default tier, which has no TierConfig.
  EXPECT_EQ(c.FindTier(""), nullptr);
}

TEST(ConfigTest, TypeTierMustExist) {
  Config c = ValidConfig();
  c.tiers = {{.name = "background", .value = 10}};
  c.types[1].tier = "background";
  EXPECT_THAT(c.Validate(), IsOk());
  c.types[1].tier = "foreground";
  EXPECT_THAT(c.Validate(), StatusIs(absl::StatusCode::kInvalidArgument,
                                     "types[1].tier: unknown tier \"foreground\""));
}

TEST(ConfigTest, TierValueMustBePositive) {
  Config c = ValidConfig();
  c.tiers = {{.name = "background", .value = 10}, {.name = "foreground", .value = 0}};
  EXPECT_THAT(c.Validate(),
              StatusIs(absl::StatusCode::kInvalidArgument, "tiers[1].value: must be >= 1, got 0"));
}

TEST(ConfigTest, RefusesDuplicateTiers) {
  Config c = ValidConfig();
  c.tiers = {{.name = "background", .value = 10}, {.name = "background", .value = 20}};
  EXPECT_THAT(c.Validate(), StatusIs(absl::StatusCode::kInvalidArgument,
                                     "tiers[1].name: duplicate tier \"background\""));
}

TEST(ConfigTest, DefaultCostMustBePositive) {
  Config c = ValidConfig();
  c.types[0].default_cost = 0;
  EXPECT_THAT(c.Validate(),
              StatusIs(absl::StatusCode::kInvalidArgument, "types[0].default_cost: must be > 0"));
  c.types[0].default_cost = -2;
  EXPECT_THAT(c.Validate(), StatusIs(absl::StatusCode::kInvalidArgument, "types[0].default_cost"));
  c.types[0].default_cost = 0.25;
  EXPECT_THAT(c.Validate(), IsOk());
}

TEST(ConfigTest, VramNeedsAModel) {
  Config c = ValidConfig();
  c.types[1].vram_gb = 16;
  EXPECT_THAT(c.Validate(),
              StatusIs(absl::StatusCode::kInvalidArgument, "types[1].vram_gb: needs a model"));
  c.types[1].model = "llama";
  EXPECT_THAT(c.Validate(), IsOk());
}

TEST(ConfigTest, BurstMustBePositive) {
  Config c = ValidConfig();
  c.types[1].rate = {.per_second = 2, .burst = 0};
  EXPECT_THAT(c.Validate(),
              StatusIs(absl::StatusCode::kInvalidArgument, "types[1].burst: must be >= 1, got 0"));
}

TEST(ConfigTest, QueueDepthMustBePositive) {
  Config c = ValidConfig();
  c.types[0].max_queue_depth = 0;
  EXPECT_THAT(c.Validate(), StatusIs(absl::StatusCode::kInvalidArgument,
                                     "types[0].max_queue_depth: must be >= 1, got 0"));
}

TEST(ConfigTest, AffinityWaitMustNotBeNegative) {
  Config c = ValidConfig();
  c.types[0].max_affinity_wait = absl::ZeroDuration();
  EXPECT_THAT(c.Validate(), IsOk());
  c.types[0].max_affinity_wait = -absl::Seconds(1);
  EXPECT_THAT(c.Validate(), StatusIs(absl::StatusCode::kInvalidArgument,
                                     "types[0].max_affinity_wait: must not be negative"));
}

TEST(ConfigTest, PolicyIsFairOrFifo) {
  Config c = ValidConfig();
  c.scheduler.policy = "fifo";
  EXPECT_THAT(c.Validate(), IsOk());
  c.scheduler.policy = "lifo";
  EXPECT_THAT(c.Validate(), StatusIs(absl::StatusCode::kInvalidArgument,
                                     "scheduler.policy: want fair or fifo, got \"lifo\""));
}

TEST(ConfigTest, CostAlphaIsInZeroOne) {
  ExpectBounded<double>([](Config& c, double v) { c.scheduler.cost_alpha = v; }, {1, 0.5},
                        {0.0, -0.1, 1.5}, "scheduler.cost_alpha: must be in (0, 1]");
}

TEST(ConfigTest, QueueWindowIsBounded) {
  ExpectBounded<int64_t>([](Config& c, int64_t v) { c.scheduler.queue_window = v; },
                         {16, 2048, 1'000'000}, {0, 15, 1'000'001},
                         "scheduler.queue_window: must be in [16, 1000000]");
}

TEST(ConfigTest, TurnsInFlightIsBoundedAndZeroFollowsTheCores) {
  ExpectBounded<int>([](Config& c, int v) { c.postgres.turns_in_flight = v; }, {0, 1, 3, 64},
                     {-1, 65}, "postgres.turns_in_flight: must be in [0, 64]");
  Config c = ValidConfig();
  EXPECT_EQ(c.postgres.turns_in_flight, 0);
  EXPECT_EQ(c.postgres.TurnsInFlight(2), 2);
  EXPECT_EQ(c.postgres.TurnsInFlight(7), 2);
  EXPECT_EQ(c.postgres.TurnsInFlight(8), 4);
  EXPECT_EQ(c.postgres.TurnsInFlight(64), 4);
  // By the cores, the pool keeps two connections for calls.
  c.postgres.pool_size = 4;
  EXPECT_EQ(c.postgres.TurnsInFlight(16), 2);
  c.postgres.pool_size = 1;
  EXPECT_EQ(c.postgres.TurnsInFlight(16), 1);
  c.postgres.pool_size = 8;
  c.postgres.turns_in_flight = 3;
  EXPECT_EQ(c.postgres.TurnsInFlight(2), 3);  // a number set is taken as it is
  EXPECT_EQ(c.postgres.TurnsInFlight(16), 3);
}

TEST(ConfigTest, TurnsInFlightThatTakeTheWholePoolWarn) {
  Config c = ValidConfig();
  c.postgres.turns_in_flight = 7;
  EXPECT_THAT(c.Warnings(), IsEmpty());
  c.postgres.turns_in_flight = 8;
  ASSERT_EQ(c.Warnings().size(), 1u);
  EXPECT_THAT(c.Warnings()[0], HasSubstr("postgres.turns_in_flight: 8 turns need as many of "
                                         "pool_size's 8 connections"));
}

TEST(ConfigTest, MaxActiveMustBePositive) {
  Config c = ValidConfig();
  c.max_active = 0;
  EXPECT_THAT(c.Validate(),
              StatusIs(absl::StatusCode::kInvalidArgument, "max_active: must be >= 1, got 0"));
}

TEST(ConfigTest, TypesSharingAModelMustAgreeOnVram) {
  Config c = ValidConfig();
  c.types.push_back(JobTypeConfig{.name = "llm.summary", .model = "llama", .vram_gb = 16});
  c.types.push_back(JobTypeConfig{.name = "llm.chat", .model = "llama"});
  // One type may carry the model's budget for all of them.
  EXPECT_THAT(c.Validate(), IsOk());
  c.types[3].vram_gb = 16;
  EXPECT_THAT(c.Validate(), IsOk());
  c.types[3].vram_gb = 24;
  EXPECT_THAT(c.Validate(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "types[3].vram_gb: model \"llama\" already has vram_gb 16 from types[2]"));
}

TEST(ConfigTest, TypesSharingAModelMustAgreeOnRate) {
  Config c = ValidConfig();
  c.types.push_back(JobTypeConfig{
      .name = "llm.summary", .model = "llama", .rate = {.per_second = 2, .burst = 4}});
  c.types.push_back(JobTypeConfig{.name = "llm.chat", .model = "llama"});
  EXPECT_THAT(c.Validate(), IsOk());
  c.types[3].rate = {.per_second = 2, .burst = 4};
  EXPECT_THAT(c.Validate(), IsOk());
  c.types[3].rate = {.per_second = 2, .burst = 8};
  EXPECT_THAT(c.Validate(), StatusIs(absl::StatusCode::kInvalidArgument,
                                     "types[3].rps: model \"llama\" already has a different rate"));
  c.types[3].rate = {.per_second = 3, .burst = 4};
  EXPECT_THAT(c.Validate(), StatusIs(absl::StatusCode::kInvalidArgument, "types[3].rps"));
}

TEST(ConfigTest, NoWarningsWithoutModels) { EXPECT_THAT(ValidConfig().Warnings(), IsEmpty()); }

TEST(ConfigTest, MissingVramWarnsOncePerModel) {
  Config c = ValidConfig();
  c.types.push_back(JobTypeConfig{.name = "llm.summary", .model = "llama"});
  c.types.push_back(JobTypeConfig{.name = "llm.chat", .model = "llama"});
  c.types.push_back(JobTypeConfig{.name = "image.generate", .model = "sdxl"});
  std::vector<std::string> w = c.Warnings();
  ASSERT_EQ(w.size(), 2u);
  EXPECT_THAT(w[0], HasSubstr("types[2].vram_gb"));
  EXPECT_THAT(w[0], HasSubstr("\"llm.summary\""));
  EXPECT_THAT(w[0], HasSubstr("model \"llama\""));
  EXPECT_THAT(w[0], HasSubstr("0 GB"));
  EXPECT_THAT(w[1], HasSubstr("types[4].vram_gb"));
  EXPECT_THAT(w[1], HasSubstr("model \"sdxl\""));
}

TEST(ConfigTest, NoVramWarningWhenAnyTypeOfTheModelSetsIt) {
  Config c = ValidConfig();
  c.types.push_back(JobTypeConfig{.name = "llm.summary", .model = "llama"});
  c.types.push_back(JobTypeConfig{.name = "llm.chat", .model = "llama", .vram_gb = 16});
  EXPECT_THAT(c.Warnings(), IsEmpty());
  // 0 GB said out loud is a budget, not a missing one.
  c.types[3].vram_gb = 0;
  EXPECT_THAT(c.Warnings(), IsEmpty());
}

}  // namespace
TEST(ConfigTest, MemoryThrottleResumeMustBeBelowThrottle) {
  Config c = ValidConfig();
  c.memory_throttle.ram_resume_percent = 90;  // equal to ram_percent: it would never resume
  EXPECT_THAT(c.Validate(), StatusIs(absl::StatusCode::kInvalidArgument,
                                     "memory_throttle.ram_resume_percent: must be >= 0 and below "
                                     "ram_percent (90)"));
  c = ValidConfig();
  c.memory_throttle.gpu_percent = 120;
  EXPECT_THAT(c.Validate(), StatusIs(absl::StatusCode::kInvalidArgument,
                                     "memory_throttle.gpu_percent: must be in (0, 100]"));
}

TEST(ConfigTest, OverflowHookNeedsAPositiveIntervalAndTimeout) {
  Config c = ValidConfig();
  c.overflow_hook.command = "scale-up";
  c.overflow_hook.interval = absl::ZeroDuration();
  EXPECT_THAT(c.Validate(), StatusIs(absl::StatusCode::kInvalidArgument,
                                     "overflow_hook.interval: must be positive"));
  c = ValidConfig();
  c.overflow_hook.timeout = absl::Seconds(-1);
  EXPECT_THAT(c.Validate(), StatusIs(absl::StatusCode::kInvalidArgument,
                                     "overflow_hook.timeout: must be positive"));
}

TEST(MergeReloadTest, TakesTheReloadableKeysAndNamesTheRestartOnlyOnes) {
  Config running;
  running.types = {JobTypeConfig{.name = "echo"}};
  Config loaded = running;
  loaded.types.push_back(JobTypeConfig{.name = "fresh", .rate = RateLimit{.per_second = 2}});
  loaded.tiers = {TierConfig{.name = "interactive", .value = 4}};
  loaded.scheduler.policy = "fifo";
  loaded.max_active = 10;
  loaded.log_level = "debug";
  loaded.listen = "0.0.0.0:7411";
  loaded.postgres.url = "postgresql://elsewhere/db";
  loaded.postgres.turns_in_flight = 6;
  loaded.metrics.listen = "";
  loaded.limits.submit = RateLimit{.per_second = 5, .burst = 5};
  loaded.limits.watches_per_principal = 7;
  loaded.limits.max_message_bytes = 8 << 20;
  loaded.tenants = {TenantConfig{.name = "t", .principals = {"alice"}, .weight = 2}};

  std::vector<std::string> restart_only;
  const Config merged = MergeReload(running, loaded, &restart_only);
  EXPECT_THAT(restart_only, ::testing::UnorderedElementsAre(
                                "listen", "postgres.url", "metrics.listen",
                                "limits.max_message_bytes", "postgres.turns_in_flight"));
  EXPECT_EQ(merged.limits.submit, loaded.limits.submit);
  EXPECT_EQ(merged.limits.watches_per_principal, 7);
  EXPECT_EQ(merged.limits.max_message_bytes, 0);  // gRPC's limit is set at start
  ASSERT_EQ(merged.types.size(), 2u);
  EXPECT_EQ(merged.types[1].rate.per_second, 2);
  ASSERT_EQ(merged.tiers.size(), 1u);
  EXPECT_EQ(merged.scheduler.policy, "fifo");
  EXPECT_EQ(merged.max_active, 10);
  EXPECT_EQ(merged.tenants, loaded.tenants);
  EXPECT_EQ(merged.log_level, "debug");
  // The restart-only keys keep their running values.
  EXPECT_EQ(merged.listen, running.listen);
  EXPECT_EQ(merged.postgres.url, running.postgres.url);
  EXPECT_EQ(merged.postgres.turns_in_flight, running.postgres.turns_in_flight);
  EXPECT_EQ(merged.metrics.listen, running.metrics.listen);
}

TEST(MergeReloadTest, AnIdenticalFileChangesNothing) {
  Config running;
  running.types = {JobTypeConfig{.name = "echo"}};
  std::vector<std::string> restart_only;
  const Config merged = MergeReload(running, running, &restart_only);
  EXPECT_TRUE(restart_only.empty());
  EXPECT_EQ(merged.types.size(), 1u);
}

}  // namespace dispatchd::config
