// The console's JSON API (/api/v1/ on the metrics port) against a real daemon, worker and
// PostgreSQL, with authentication on: who may see and do what matches the gRPC API, and bad
// input is a 4xx with a JSON error naming the field.

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include <httplib.h>

#include "client/cpp/dispatch_client.h"
#include "tests/e2e/e2e_test.h"
#include "tests/e2e/harness.h"

namespace dispatchd::e2e {
namespace {

using ::testing::HasSubstr;

// An HTTP answer: its status and its JSON body as a Struct (empty if it is not JSON).
struct Answer {
  int status = 0;
  std::string body;
  google::protobuf::Struct json;

  const google::protobuf::Value& Get(const std::string& key) const {
    static const google::protobuf::Value* const kNull = new google::protobuf::Value();
    auto it = json.fields().find(key);
    return it == json.fields().end() ? *kNull : it->second;
  }
  std::string ErrorField(const std::string& key) const {
    const google::protobuf::Value& e = Get("error");
    auto it = e.struct_value().fields().find(key);
    return it == e.struct_value().fields().end() ? "" : it->second.string_value();
  }
};

class ConsoleApiTest : public E2eTest {
 protected:
  void SetUp() override {
    E2eTest::SetUp();
    if (HasFatalFailure()) return;
    WriteTokensFile(dir_, {{"alice", "client", ""},
                           {"bob", "client", ""},
                           {"gpu", "worker", ""},
                           {"ops", "admin", ""}});
    DaemonOptions options;
    // `held` has no worker: its jobs wait, and say why.
    options.types = {{.name = "echo"}, {.name = "held"}};
    options.extra_yaml = absl::StrCat("auth:\n  tokens_file: ", dir_.File("tokens"), "\n");
    daemon_ = StartDaemon(options);
    ASSERT_NE(daemon_, nullptr);
    const std::string address = daemon_->MetricsAddress();
    ASSERT_FALSE(address.empty()) << daemon_->process().Log();
    const size_t colon = address.rfind(':');
    int port = 0;
    ASSERT_TRUE(absl::SimpleAtoi(address.substr(colon + 1), &port)) << address;
    http_ = std::make_unique<httplib::Client>(address.substr(0, colon), port);
    http_->set_read_timeout(30, 0);
  }

  // `method` ("GET" or "POST") of `path` as `who` (a principal of the tokens file; "" for none).
  Answer Call(const std::string& method, const std::string& path, const std::string& who) {
    httplib::Headers headers;
    if (!who.empty()) headers.emplace("Authorization", BearerOf(dir_, who));
    httplib::Result r = method == "POST" ? http_->Post(path.c_str(), headers, "", "text/plain")
                                         : http_->Get(path.c_str(), headers);
    Answer a;
    if (!r) {
      ADD_FAILURE() << method << " " << path << ": no answer (" << httplib::to_string(r.error())
                    << ")";
      return a;
    }
    a.status = r->status;
    a.body = r->body;
    if (r->get_header_value("Content-Type").find("application/json") != std::string::npos) {
      EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(a.body, &a.json).ok()) << a.body;
    }
    return a;
  }

  std::unique_ptr<client::Client> As(const std::string& who) {
    auto channel = grpc::CreateChannel(daemon_->address(), grpc::InsecureChannelCredentials());
    return client::Client::FromChannel(
        channel, {}, std::string(absl::StripAsciiWhitespace(ReadFile(dir_.File(who + ".token")))));
  }

  static v1::JobSpec Spec(const std::string& type, const std::string& payload) {
    v1::JobSpec spec;
    spec.set_type(type);
    spec.set_payload(payload);
    return spec;
  }

  // The ids of the jobs of a GET /api/v1/jobs answer.
  static std::vector<std::string> Ids(const Answer& a) {
    std::vector<std::string> ids;
    for (const google::protobuf::Value& j : a.Get("jobs").list_value().values()) {
      ids.push_back(j.struct_value().fields().at("id").string_value());
    }
    return ids;
  }

  std::unique_ptr<Daemon> daemon_;
  std::unique_ptr<httplib::Client> http_;
};

TEST_F(ConsoleApiTest, CallersNeedATokenAndTheAdminRoleForQueuesWorkersAndDrain) {
  Answer none = Call("GET", "/api/v1/queues", "");
  EXPECT_EQ(none.status, 401) << none.body;
  EXPECT_EQ(none.ErrorField("code"), "UNAUTHENTICATED") << none.body;
  Answer client = Call("GET", "/api/v1/workers", "alice");
  EXPECT_EQ(client.status, 403) << client.body;
  EXPECT_EQ(client.ErrorField("code"), "PERMISSION_DENIED") << client.body;
  EXPECT_EQ(Call("POST", "/api/v1/workers/w1/drain", "alice").status, 403);
  EXPECT_EQ(Call("GET", "/api/v1/jobs", "").status, 401);
  EXPECT_EQ(Call("GET", "/api/v1/queues", "ops").status, 200);
  // The page itself is public: it holds no data, and asks for the token.
  Answer page = Call("GET", "/console/", "");
  EXPECT_EQ(page.status, 200);
  EXPECT_THAT(page.body, HasSubstr("console.js"));
  EXPECT_EQ(Call("GET", "/console/console.js", "").status, 200);
  EXPECT_EQ(Call("GET", "/api/v1/nothing", "ops").status, 404);
}

TEST_F(ConsoleApiTest, QueuesSayWhyTheFirstJobWaitsAndWorkersShowTheirSlots) {
  std::unique_ptr<Worker> worker =
      StartWorker(*daemon_, {.id = "w1",
                             .types = {"echo"},
                             .slots = 2,
                             .mode = {"--token-file", dir_.File("gpu.token"), "--echo"}});
  ASSERT_TRUE(WaitFor(
      [&] {
        Answer w = Call("GET", "/api/v1/workers", "ops");
        return w.status == 200 && w.Get("workers").list_value().values_size() == 1;
      },
      absl::Seconds(30)));
  Answer workers = Call("GET", "/api/v1/workers", "ops");
  const auto& w = workers.Get("workers").list_value().values(0).struct_value().fields();
  // An authenticated worker's id is qualified by its principal.
  EXPECT_EQ(w.at("worker_id").string_value(), "gpu/w1");
  EXPECT_EQ(w.at("slots").number_value(), 2);
  EXPECT_TRUE(w.contains("vram_in_use_gb") && w.contains("models_resident") &&
              w.contains("model_loads"))
      << workers.body;

  ASSERT_TRUE(As("alice")->Submit(Spec("held", "x")).ok());
  std::string reason;
  ASSERT_TRUE(WaitFor(
      [&] {
        Answer q = Call("GET", "/api/v1/queues", "ops");
        for (const google::protobuf::Value& t : q.Get("types").list_value().values()) {
          const auto& f = t.struct_value().fields();
          if (f.at("type").string_value() == "held" && f.at("queued").string_value() == "1") {
            reason = f.at("head_wait_reason").string_value();
            return reason == "no_worker";
          }
        }
        return false;
      },
      absl::Seconds(30)))
      << "head_wait_reason of held: " << reason;

  Answer drained = Call("POST", "/api/v1/workers/gpu%2Fw1/drain", "ops");
  ASSERT_EQ(drained.status, 200) << drained.body;
  EXPECT_EQ(drained.Get("worker").struct_value().fields().at("draining").bool_value(), true)
      << drained.body;
  Answer unknown = Call("POST", "/api/v1/workers/nobody/drain", "ops");
  EXPECT_EQ(unknown.status, 404) << unknown.body;
  EXPECT_EQ(unknown.ErrorField("field"), "worker_id") << unknown.body;
}

TEST_F(ConsoleApiTest, ClientsFindOnlyTheirOwnJobsAndSeeTheirTimeline) {
  std::unique_ptr<Worker> worker = StartWorker(
      *daemon_, {.id = "w1", .mode = {"--token-file", dir_.File("gpu.token"), "--echo"}});
  absl::StatusOr<v1::Job> mine = As("alice")->RunSync(Spec("echo", "hello"), absl::Seconds(30));
  ASSERT_TRUE(mine.ok()) << mine.status();
  ASSERT_EQ(mine->state(), v1::JOB_STATE_SUCCEEDED);
  absl::StatusOr<v1::SubmitResponse> theirs = As("bob")->Submit(Spec("held", "y"));
  ASSERT_TRUE(theirs.ok()) << theirs.status();

  EXPECT_THAT(Ids(Call("GET", "/api/v1/jobs", "alice")), ::testing::ElementsAre(mine->id()));
  EXPECT_THAT(Ids(Call("GET", "/api/v1/jobs", "ops")),
              ::testing::ElementsAre(theirs->job_id(), mine->id()));  // newest first
  EXPECT_THAT(Ids(Call("GET", "/api/v1/jobs?state=queued", "ops")),
              ::testing::ElementsAre(theirs->job_id()));
  EXPECT_THAT(Ids(Call("GET", "/api/v1/jobs?type=echo&state=SUCCEEDED", "ops")),
              ::testing::ElementsAre(mine->id()));
  EXPECT_THAT(Ids(Call("GET", "/api/v1/jobs?key=bob", "ops")),
              ::testing::ElementsAre(theirs->job_id()));
  EXPECT_THAT(Ids(Call("GET", "/api/v1/jobs?since=2999-01-01T00:00:00Z", "ops")),
              ::testing::IsEmpty());
  EXPECT_THAT(Ids(Call("GET", "/api/v1/jobs?until=2000-01-01T00:00:00Z", "ops")),
              ::testing::IsEmpty());
  EXPECT_THAT(Ids(Call("GET", "/api/v1/jobs?since=2000-01-01T00:00:00Z&limit=1", "ops")),
              ::testing::ElementsAre(theirs->job_id()));

  Answer page = Call("GET", absl::StrCat("/api/v1/jobs/", mine->id()), "alice");
  ASSERT_EQ(page.status, 200) << page.body;
  EXPECT_EQ(page.Get("result_bytes").number_value(), 5) << page.body;  // "hello", echoed
  EXPECT_EQ(page.Get("payload_bytes").number_value(), 5) << page.body;
  std::vector<std::string> events;
  for (const google::protobuf::Value& e : page.Get("timeline").list_value().values()) {
    events.push_back(e.struct_value().fields().at("event").string_value());
    EXPECT_FALSE(e.struct_value().fields().at("at").string_value().empty()) << page.body;
  }
  EXPECT_THAT(events, ::testing::ElementsAre("created", "dispatched", "started", "finished"));
  EXPECT_EQ(page.Get("job").struct_value().fields().at("state").string_value(),
            "JOB_STATE_SUCCEEDED");

  // Another's job is not found, as over gRPC; so is its cancellation.
  Answer hidden = Call("GET", absl::StrCat("/api/v1/jobs/", theirs->job_id()), "alice");
  EXPECT_EQ(hidden.status, 404) << hidden.body;
  EXPECT_EQ(
      Call("POST", absl::StrCat("/api/v1/jobs/", theirs->job_id(), "/cancel"), "alice").status,
      404);
  Answer cancelled =
      Call("POST", absl::StrCat("/api/v1/jobs/", theirs->job_id(), "/cancel"), "bob");
  ASSERT_EQ(cancelled.status, 200) << cancelled.body;
  EXPECT_EQ(cancelled.Get("job").struct_value().fields().at("state").string_value(),
            "JOB_STATE_CANCELLED");
  Answer again = Call("POST", absl::StrCat("/api/v1/jobs/", theirs->job_id(), "/cancel"), "bob");
  EXPECT_EQ(again.status, 409) << again.body;
  absl::StatusOr<v1::Job> after = As("bob")->Status(theirs->job_id());
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->state(), v1::JOB_STATE_CANCELLED);
}

TEST_F(ConsoleApiTest, BadSearchParametersAreRefusedNamingTheField) {
  struct Case {
    std::string query;
    std::string field;
  };
  for (const Case& c : std::vector<Case>{{"state=sleeping", "state"},
                                         {"since=yesterday", "since"},
                                         {"until=12:00", "until"},
                                         {"limit=many", "limit"},
                                         {"limit=5000", "limit"},
                                         {"owner=bob", "owner"}}) {
    Answer a = Call("GET", absl::StrCat("/api/v1/jobs?", c.query), "ops");
    EXPECT_EQ(a.status, 400) << c.query << ": " << a.body;
    EXPECT_EQ(a.ErrorField("code"), "INVALID_ARGUMENT") << c.query << ": " << a.body;
    EXPECT_EQ(a.ErrorField("field"), c.field) << c.query << ": " << a.body;
  }
  Answer unknown = Call("GET", "/api/v1/jobs/no-such-job", "ops");
  EXPECT_EQ(unknown.status, 404) << unknown.body;
  EXPECT_EQ(unknown.ErrorField("code"), "NOT_FOUND") << unknown.body;
}

}  // namespace
}  // namespace dispatchd::e2e

namespace dispatchd::e2e {
namespace {

// With no authentication configured (the loopback quickstart), the console is open as the gRPC
// API is: no token, and the caller may do what an admin may.
class ConsoleOpenTest : public E2eTest {
 protected:
  static v1::JobSpec Spec(const std::string& type, const std::string& payload) {
    v1::JobSpec spec;
    spec.set_type(type);
    spec.set_payload(payload);
    return spec;
  }
};

TEST_F(ConsoleOpenTest, WithoutAuthenticationNoTokenIsNeeded) {
  DaemonOptions options;
  options.types = {{.name = "held"}};
  std::unique_ptr<Daemon> daemon = StartDaemon(options);
  ASSERT_NE(daemon, nullptr);
  absl::StatusOr<std::string> id = daemon->Submit(Spec("held", "x"));
  ASSERT_TRUE(id.ok()) << id.status();
  const std::string address = daemon->MetricsAddress();
  const size_t colon = address.rfind(':');
  httplib::Client http(address.substr(0, colon), std::stoi(address.substr(colon + 1)));
  httplib::Result queues = http.Get("/api/v1/queues");
  ASSERT_TRUE(queues);
  EXPECT_EQ(queues->status, 200) << queues->body;
  httplib::Result jobs = http.Get("/api/v1/jobs");
  ASSERT_TRUE(jobs);
  EXPECT_THAT(jobs->body, HasSubstr(*id));
  httplib::Result cancel =
      http.Post(absl::StrCat("/api/v1/jobs/", *id, "/cancel").c_str(), "", "text/plain");
  ASSERT_TRUE(cancel);
  EXPECT_EQ(cancel->status, 200) << cancel->body;
  absl::StatusOr<v1::Job> after = daemon->Status(*id);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->state(), v1::JOB_STATE_CANCELLED);
  httplib::Result root = http.Get("/");
  ASSERT_TRUE(root);
  EXPECT_EQ(root->status, 302);
  EXPECT_EQ(root->get_header_value("Location"), "/console/");
}

}  // namespace
}  // namespace dispatchd::e2e
