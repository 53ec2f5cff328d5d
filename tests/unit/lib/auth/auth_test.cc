#include <string>

#include "absl/strings/escaping.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "lib/auth/principal.h"
#include "lib/auth/token_file.h"

namespace dispatchd::auth {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Two digests, as `printf %s TOKEN | sha256sum` prints them; which tokens they hash does not
// matter.
constexpr char kAliceDigest[] = "2c5f2d5c1bd7ec9bc0e5d0ab3ef1a36c3b0e2f3bd8c1c9fd42eee1b4ad9e1e6c";
constexpr char kGpuDigest[] = "9a7b1a1b3c2d4e5f60718293a4b5c6d7e8f90112233445566778899aabbccdde";

TokenDigest Digest(const std::string& hex) {
  const std::string bytes = absl::HexStringToBytes(hex);
  TokenDigest d{};
  std::copy(bytes.begin(), bytes.end(), d.begin());
  return d;
}

Principal Named(std::string name, Role role) {
  return Principal{.name = std::move(name), .role = role, .types = {}, .authenticated = true};
}

TEST(AuthorizeTest, EachRoleReachesItsServicesOnly) {
  const Principal client = Named("alice", Role::kClient);
  const Principal gateway = Named("front", Role::kGateway);
  const Principal worker = Named("gpu", Role::kWorker);
  const Principal admin = Named("ops", Role::kAdmin);
  for (Method m : {Method::kSubmit, Method::kSubmitBatch, Method::kRunSync, Method::kStatus,
                   Method::kCancel, Method::kWatch, Method::kListJobs}) {
    EXPECT_TRUE(Authorize(client, m).ok()) << ToString(m);
    EXPECT_TRUE(Authorize(gateway, m).ok()) << ToString(m);
    EXPECT_TRUE(Authorize(admin, m).ok()) << ToString(m);
    EXPECT_EQ(Authorize(worker, m).code(), absl::StatusCode::kPermissionDenied) << ToString(m);
  }
  EXPECT_TRUE(Authorize(worker, Method::kConnect).ok());
  EXPECT_TRUE(Authorize(admin, Method::kConnect).ok());
  EXPECT_EQ(Authorize(client, Method::kConnect).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Authorize(gateway, Method::kConnect).code(), absl::StatusCode::kPermissionDenied);
  for (Method m : {Method::kStats, Method::kListWorkers, Method::kSetRateLimit,
                   Method::kDrainWorker, Method::kReload, Method::kSetTenantWeight}) {
    EXPECT_TRUE(Authorize(admin, m).ok()) << ToString(m);
    EXPECT_TRUE(Authorize(Principal::Local(), m).ok()) << ToString(m);
    for (const Principal* p : {&client, &gateway, &worker}) {
      EXPECT_EQ(Authorize(*p, m).code(), absl::StatusCode::kPermissionDenied) << ToString(m);
    }
  }
}

TEST(AuthorizeTest, RefusalNamesTheMethodAndTheRole) {
  const absl::Status s = Authorize(Named("gpu", Role::kWorker), Method::kSubmit);
  EXPECT_THAT(s.message(), HasSubstr("dispatchd.v1.JobService/Submit"));
  EXPECT_THAT(s.message(), HasSubstr("role worker"));
}

TEST(MaySeeTest, OwnJobsOnlyExceptForAnAdmin) {
  EXPECT_TRUE(MaySee(Named("alice", Role::kClient), "alice"));
  EXPECT_FALSE(MaySee(Named("bob", Role::kClient), "alice"));
  EXPECT_FALSE(MaySee(Named("front", Role::kGateway), "alice"));
  EXPECT_TRUE(MaySee(Named("ops", Role::kAdmin), "alice"));
  EXPECT_TRUE(MaySee(Principal::Local(), "alice"));
}

TEST(FairnessKeyForTest, AClientIsQueuedUnderItsOwnNameWhateverItAsks) {
  const Principal alice = Named("alice", Role::kClient);
  EXPECT_EQ(FairnessKeyFor(alice, ""), "alice");
  EXPECT_EQ(FairnessKeyFor(alice, "alice"), "alice");
  EXPECT_EQ(FairnessKeyFor(alice, "user-17"), "alice");
}

TEST(FairnessKeyForTest, AGatewayNamesTheEndUser) {
  const Principal front = Named("front", Role::kGateway);
  EXPECT_EQ(FairnessKeyFor(front, "user-17"), "user-17");
  EXPECT_EQ(FairnessKeyFor(front, ""), "front");
  EXPECT_EQ(FairnessKeyFor(Named("ops", Role::kAdmin), "user-3"), "user-3");
  EXPECT_EQ(FairnessKeyFor(Principal::Local(), "k"), "k");
  EXPECT_EQ(FairnessKeyFor(Principal::Local(), ""), "");
}

TEST(MayServeTest, AWorkerEntryLimitsTypes) {
  Principal gpu = Named("gpu", Role::kWorker);
  EXPECT_TRUE(MayServe(gpu, {"embed", "chat"}).ok());
  gpu.types = {"embed"};
  EXPECT_TRUE(MayServe(gpu, {"embed"}).ok());
  const absl::Status s = MayServe(gpu, {"embed", "chat"});
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(s.message(), HasSubstr("\"chat\""));
}

TEST(TokenTableTest, FindsThePrincipalOfADigest) {
  const std::string text = std::string("# comment\n\nalice client sha256:") + kAliceDigest +
                           "   # trailing comment\n" + "gpu\tworker\tsha256:" + kGpuDigest +
                           " types=embed,chat\r\n";
  absl::StatusOr<TokenTable> table = TokenTable::Parse(text, "tokens");
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(table->size(), 2u);
  const Principal* alice = table->Find(Digest(kAliceDigest));
  ASSERT_NE(alice, nullptr);
  EXPECT_EQ(alice->name, "alice");
  EXPECT_EQ(alice->role, Role::kClient);
  const Principal* gpu = table->Find(Digest(kGpuDigest));
  ASSERT_NE(gpu, nullptr);
  EXPECT_EQ(gpu->role, Role::kWorker);
  EXPECT_EQ(gpu->types, (std::vector<std::string>{"embed", "chat"}));
  TokenDigest unknown = Digest(kAliceDigest);
  unknown[31] ^= 1;
  EXPECT_EQ(table->Find(unknown), nullptr);
}

TEST(TokenTableTest, ANameMayHoldTwoTokensWhileItRotates) {
  const std::string text = std::string("alice client sha256:") + kAliceDigest + "\n" +
                           "alice client sha256:" + kGpuDigest + "\n";
  absl::StatusOr<TokenTable> table = TokenTable::Parse(text, "tokens");
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(table->principals(), 1u);
  EXPECT_EQ(table->Find(Digest(kAliceDigest)), table->Find(Digest(kGpuDigest)));
}

TEST(TokenTableTest, ErrorsNameTheLineAndTheFieldButNeverEchoTheSecret) {
  const std::string digest = std::string("sha256:") + kAliceDigest;
  struct Case {
    std::string text;
    std::string want;
  };
  const Case cases[] = {
      {"alice client", "tokens:1: want `name role"},
      {"\nal/ice client " + digest, "tokens:2: name:"},
      {"alice root " + digest, "tokens:1: role: unknown role \"root\""},
      {"alice client sha256:abc", "tokens:1: digest:"},
      {"alice client md5:" + std::string(kAliceDigest), "tokens:1: digest:"},
      {"alice client " + digest + " types=a", "only a worker's entry"},
      {"gpu worker " + digest + " types=a,,b", "empty type name"},
      {"gpu worker " + digest + " colour=red", "only types= is known"},
      {"a client " + digest + "\nb client " + digest, "tokens:2: digest: the same token"},
      {"a client " + digest + "\na admin sha256:" + kGpuDigest, "tokens:2: name: \"a\""},
  };
  for (const Case& c : cases) {
    absl::StatusOr<TokenTable> table = TokenTable::Parse(c.text, "tokens");
    ASSERT_FALSE(table.ok()) << c.text;
    EXPECT_EQ(table.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(table.status().message(), HasSubstr(c.want)) << c.text;
  }
  // A token pasted where its digest belongs is not repeated in the error.
  absl::StatusOr<TokenTable> pasted = TokenTable::Parse("alice client s3cr3t-token-value", "t");
  ASSERT_FALSE(pasted.ok());
  EXPECT_THAT(pasted.status().message(), Not(HasSubstr("s3cr3t")));
}

TEST(ConstantTimeEqualsTest, ComparesBytes) {
  EXPECT_TRUE(ConstantTimeEquals("abc", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abd"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "ab"));
  EXPECT_TRUE(ConstantTimeEquals("", ""));
}

}  // namespace
}  // namespace dispatchd::auth
