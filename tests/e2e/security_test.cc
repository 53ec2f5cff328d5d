// A daemon open to a network: TLS (and mutual TLS) on the listener, principals from bearer tokens
// and client certificates, roles per method, jobs visible to their owner only, fairness keys a
// client cannot choose, certificate rotation under load, and the refusal to serve a non-loopback
// address with neither. Certificates are made by the test with `openssl`; every connection is to
// 127.0.0.1.

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include <sys/stat.h>

#include "client/cpp/dispatch_client.h"
#include "dispatchd/v1/worker_service.grpc.pb.h"
#include "server/auth/grpc_auth.h"
#include "tests/e2e/e2e_test.h"
#include "tests/e2e/harness.h"

namespace dispatchd::e2e {
namespace {

using ::testing::HasSubstr;

// Runs `script` with bash in `dir`; fails the test with its output if it fails.
void Shell(const TempDir& dir, const std::string& script) {
  CommandResult r = RunCommand(
      {"/bin/bash", "-c", absl::StrCat("set -euo pipefail; cd ", dir.path(), "; ", script)});
  ASSERT_EQ(r.exit_code, 0) << script << "\n" << r.out << r.err;
}

// A CA, and certificates it signs. Keys are P-256: quick to make.
class Pki {
 public:
  explicit Pki(const TempDir& dir) : dir_(dir) {}

  // Makes CA `name` (name.pem, name.key).
  void MakeCa(const std::string& name) {
    Shell(dir_,
          absl::StrCat("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 "
                       "-nodes -keyout ",
                       name, ".key -out ", name, ".pem -days 2 -subj /CN=", name, " 2>/dev/null"));
  }
  // Makes `name`.pem/.key with common name `cn`, signed by `ca`; a server certificate also names
  // 127.0.0.1 and localhost.
  void MakeCert(const std::string& name, const std::string& cn, const std::string& ca,
                bool server) {
    Shell(dir_,
          absl::StrCat(
              "openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout ", name,
              ".key -out ", name, ".csr -subj /CN=", cn, " 2>/dev/null; ",
              server ? absl::StrCat("printf 'subjectAltName=IP:127.0.0.1,DNS:localhost' > ", name,
                                    ".ext; ")
                     : absl::StrCat("printf 'extendedKeyUsage=clientAuth' > ", name, ".ext; "),
              "openssl x509 -req -in ", name, ".csr -CA ", ca, ".pem -CAkey ", ca,
              ".key -CAcreateserial -out ", name, ".pem -days 2 -extfile ", name,
              ".ext 2>/dev/null"));
  }
  std::string Path(const std::string& file) const { return dir_.File(file); }

 private:
  const TempDir& dir_;
};

constexpr char kEchoType[] = "  - name: echo\n    retry_backoff: 100ms\n";

class SecurityTest : public E2eTest {
 protected:
  void SetUp() override {
    E2eTest::SetUp();
    if (HasFatalFailure()) return;
    pki_.MakeCa("ca");
    pki_.MakeCa("other-ca");
    pki_.MakeCert("server", "server-a", "ca", /*server=*/true);
    pki_.MakeCert("alice-cert", "alice-cert", "ca", /*server=*/false);
    pki_.MakeCert("stranger", "stranger", "ca", /*server=*/false);
    pki_.MakeCert("rogue", "alice-cert", "other-ca", /*server=*/false);
    WriteTokens({{"alice", "client", ""},
                 {"bob", "client", ""},
                 {"front", "gateway", ""},
                 {"gpu", "worker", "types=echo"},
                 {"ops", "admin", ""}});
  }

  void WriteTokens(const std::vector<TokenEntry>& entries) { WriteTokensFile(dir_, entries); }

  // Starts the daemon with TLS (client certificates `client_auth`) and the tokens file.
  void StartDaemon(const std::string& client_auth = "request", const std::string& refresh = "1m") {
    DaemonOptions options;
    options.types = {};
    options.extra_yaml = absl::StrCat(
        kEchoType, "tls:\n  cert_file: ", pki_.Path("server.pem"),
        "\n  key_file: ", pki_.Path("server.key"), "\n  client_ca_file: ", pki_.Path("ca.pem"),
        "\n  client_auth: ", client_auth, "\n  refresh_interval: ", refresh,
        "\nauth:\n  tokens_file: ", dir_.File("tokens"),
        "\n  certificates:\n    - name: alice-cert\n"
        "      principal: alice\n      role: client\n");
    daemon_ = E2eTest::StartDaemon(options);
    ASSERT_NE(daemon_, nullptr);
  }

  // A client with the test CA and `who`'s token ("" for none), and optionally a certificate.
  std::unique_ptr<client::Client> As(const std::string& who, const std::string& cert = "") {
    client::ClientOptions options;
    options.default_deadline = absl::Seconds(10);
    options.security.tls_ca = pki_.Path("ca.pem");
    if (!who.empty()) options.security.token_file = dir_.File(who + ".token");
    if (!cert.empty()) {
      options.security.tls_cert = pki_.Path(cert + ".pem");
      options.security.tls_key = pki_.Path(cert + ".key");
    }
    absl::StatusOr<std::unique_ptr<client::Client>> c =
        client::Client::Connect(daemon_->address(), options);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *std::move(c) : nullptr;
  }

  // The flags of a dispatch-worker or dispatchctl acting as `who`.
  std::vector<std::string> Flags(const std::string& who) {
    return {"--tls-ca", pki_.Path("ca.pem"), "--token-file", dir_.File(who + ".token")};
  }

  // Starts a worker acting as `who` with `mode` (e.g. {"--echo"}).
  std::unique_ptr<Worker> StartWorker(const std::string& id, const std::string& who, int slots,
                                      std::vector<std::string> mode) {
    std::vector<std::string> args = {"--token-file", dir_.File(who + ".token")};
    if (daemon_config_has_tls()) {
      args.push_back("--tls-ca");
      args.push_back(pki_.Path("ca.pem"));
    }
    args.insert(args.end(), mode.begin(), mode.end());
    return E2eTest::StartWorker(*daemon_, {.id = id, .slots = slots, .mode = args});
  }

  bool daemon_config_has_tls() const {
    return ReadFile(daemon_->config_path()).find("tls:") != std::string::npos;
  }

  bool WaitForWorkers(client::Client& admin, int n) {
    return WaitFor(
        [&] {
          absl::StatusOr<v1::ListWorkersResponse> w = admin.ListWorkers();
          return w.ok() && w->workers_size() == n;
        },
        absl::Seconds(30));
  }

  Pki pki_{dir_};
  std::unique_ptr<Daemon> daemon_;
};

absl::StatusCode Code(const absl::Status& s) { return s.code(); }

TEST_F(SecurityTest, TransportRefusesPlaintextAStrangeCaAndMissingClientCertificates) {
  StartDaemon("require");
  // Plaintext against the TLS listener.
  {
    auto channel = grpc::CreateChannel(daemon_->address(), grpc::InsecureChannelCredentials());
    std::unique_ptr<client::Client> c = client::Client::FromChannel(channel);
    EXPECT_EQ(Code(c->Stats().status()), absl::StatusCode::kUnavailable);
  }
  // A client that trusts another CA cannot verify the daemon.
  {
    client::ClientOptions options;
    options.security.tls_ca = pki_.Path("other-ca.pem");
    options.security.tls_cert = pki_.Path("alice-cert.pem");
    options.security.tls_key = pki_.Path("alice-cert.key");
    auto c = client::Client::Connect(daemon_->address(), options);
    ASSERT_TRUE(c.ok());
    EXPECT_EQ(Code((*c)->Stats().status()), absl::StatusCode::kUnavailable);
  }
  // client_auth: require, and no client certificate: the handshake fails, a token or not.
  EXPECT_EQ(Code(As("ops")->Stats().status()), absl::StatusCode::kUnavailable);
  // A certificate of another CA with a known name does not verify either.
  EXPECT_EQ(Code(As("", "rogue")->Submit(Spec("echo", "x")).status()),
            absl::StatusCode::kUnavailable);
  // A verified certificate that names a principal works with no token at all.
  absl::StatusOr<v1::SubmitResponse> ok = As("", "alice-cert")->Submit(Spec("echo", "x"));
  ASSERT_TRUE(ok.ok()) << ok.status();
  // A verified certificate that names no principal is unauthenticated.
  absl::Status stranger = As("", "stranger")->Submit(Spec("echo", "x")).status();
  EXPECT_EQ(Code(stranger), absl::StatusCode::kUnauthenticated) << stranger;
  EXPECT_THAT(stranger.message(), HasSubstr("certificate"));
}

TEST_F(SecurityTest, TokensAndRolesDecideWhoMayCallWhat) {
  StartDaemon();
  // No credentials at all, and an unknown token.
  absl::Status none = As("")->Submit(Spec("echo", "x")).status();
  EXPECT_EQ(Code(none), absl::StatusCode::kUnauthenticated) << none;
  std::ofstream(dir_.File("forged.token")) << "tok-not-issued\n";
  EXPECT_EQ(Code(As("forged")->Submit(Spec("echo", "x")).status()),
            absl::StatusCode::kUnauthenticated);
  // A worker may not submit; a client may not read the daemon's stats or act as a worker.
  absl::Status worker_submit = As("gpu")->Submit(Spec("echo", "x")).status();
  EXPECT_EQ(Code(worker_submit), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(worker_submit.message(), HasSubstr("dispatchd.v1.JobService/Submit"));
  absl::Status client_stats = As("alice")->Stats().status();
  EXPECT_EQ(Code(client_stats), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(client_stats.message(), HasSubstr("dispatchd.v1.AdminService/Stats"));
  {
    // Connect as a client: refused before any Hello is read.
    grpc::SslCredentialsOptions ssl{.pem_root_certs = ReadFile(pki_.Path("ca.pem"))};
    auto channel = grpc::CreateChannel(daemon_->address(), grpc::SslCredentials(ssl));
    auto stub = v1::WorkerService::NewStub(channel);
    grpc::ClientContext ctx;
    ctx.AddMetadata(
        "authorization",
        absl::StrCat("Bearer ", absl::StripAsciiWhitespace(ReadFile(dir_.File("alice.token")))));
    auto stream = stub->Connect(&ctx);
    v1::DaemonMessage msg;
    EXPECT_FALSE(stream->Read(&msg));
    grpc::Status s = stream->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr("WorkerService/Connect"));
  }
  // A worker whose entry allows only echo may not serve another type: it stops, refused.
  {
    std::vector<std::string> argv = {WorkerBin(), "--server", daemon_->address(), "--id",
                                     "w2",        "--types",  "echo,other",       "--echo"};
    for (const std::string& f : Flags("gpu")) argv.push_back(f);
    CommandResult r = RunCommand(argv, absl::Seconds(30));
    EXPECT_NE(r.exit_code, 0);
    EXPECT_THAT(r.out + r.err, HasSubstr("may not serve type \"other\""));
  }
  // The admin reads stats; dispatchctl takes the same flags.
  EXPECT_TRUE(As("ops")->Stats().ok());
  std::vector<std::string> ctl = {DispatchctlBin(), "--server", daemon_->address()};
  for (const std::string& f : Flags("ops")) ctl.push_back(f);
  ctl.push_back("stats");
  CommandResult stats = RunCommand(ctl);
  EXPECT_EQ(stats.exit_code, 0) << stats.out << stats.err;

  // Revoking bob: remove his line, reload; his next call is refused, alice's is not.
  std::unique_ptr<client::Client> bob = As("bob");
  ASSERT_TRUE(bob->Submit(Spec("echo", "x")).ok());
  WriteTokens({{"alice", "client", ""},
               {"front", "gateway", ""},
               {"gpu", "worker", "types=echo"},
               {"ops", "admin", ""}});
  absl::StatusOr<v1::ReloadResponse> reloaded = As("ops")->Reload();
  ASSERT_TRUE(reloaded.ok()) << reloaded.status();
  absl::Status revoked = bob->Submit(Spec("echo", "x")).status();
  EXPECT_EQ(Code(revoked), absl::StatusCode::kUnauthenticated) << revoked;
  EXPECT_TRUE(As("alice")->Submit(Spec("echo", "x")).ok());

  // Each refusal was counted by reason, and no token reached the log.
  const std::string log = daemon_->process().Log();
  EXPECT_THAT(log, HasSubstr("reason=bad_token"));
  EXPECT_THAT(log, HasSubstr("reason=role"));
  EXPECT_THAT(log, ::testing::Not(HasSubstr("tok-")));
  EXPECT_THAT(log, HasSubstr("action=reload principal=ops"));
}

TEST_F(SecurityTest, AClientSeesWatchesAndCancelsOnlyItsOwnJobs) {
  StartDaemon();
  std::unique_ptr<client::Client> alice = As("alice");
  std::unique_ptr<client::Client> bob = As("bob");
  absl::StatusOr<v1::SubmitResponse> job = alice->Submit(Spec("echo", "mine"));
  ASSERT_TRUE(job.ok()) << job.status();
  const std::string id = job->job_id();

  absl::Status status = bob->Status(id).status();
  EXPECT_EQ(Code(status), absl::StatusCode::kNotFound) << status;
  // The same answer as for a job that does not exist: the id tells bob nothing.
  EXPECT_EQ(status.message(), absl::StrCat("job ", id, " not found"));
  EXPECT_EQ(Code(bob->Cancel(id).status()), absl::StatusCode::kNotFound);
  EXPECT_EQ(Code(bob->Watch(
                id, [](const v1::Job&) {}, absl::Seconds(10))),
            absl::StatusCode::kNotFound);
  // A gateway is a caller like any other here.
  EXPECT_EQ(Code(As("front")->Status(id).status()), absl::StatusCode::kNotFound);

  absl::StatusOr<v1::Job> untouched = alice->Status(id);
  ASSERT_TRUE(untouched.ok()) << untouched.status();
  EXPECT_EQ(untouched->state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(untouched->spec().fairness_key(), "alice");

  // An admin may cancel it, and the audit line names both principals.
  absl::StatusOr<v1::Job> cancelled = As("ops")->Cancel(id);
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->state(), v1::JOB_STATE_CANCELLED);
  EXPECT_TRUE(WaitFor(
      [&] {
        return daemon_->process().Log().find(absl::StrCat("action=cancel principal=ops role=admin "
                                                          "job=",
                                                          id, " owner=alice")) != std::string::npos;
      },
      absl::Seconds(10)))
      << daemon_->process().Log();

  // Idempotency keys are the caller's own: the same key from bob makes bob's own job.
  v1::JobSpec keyed = Spec("echo", "k");
  keyed.set_idempotency_key("same-key");
  absl::StatusOr<v1::SubmitResponse> a1 = alice->Submit(keyed);
  absl::StatusOr<v1::SubmitResponse> a2 = alice->Submit(keyed);
  absl::StatusOr<v1::SubmitResponse> b1 = bob->Submit(keyed);
  ASSERT_TRUE(a1.ok() && a2.ok() && b1.ok());
  EXPECT_EQ(a2->job_id(), a1->job_id());
  EXPECT_TRUE(a2->deduplicated());
  EXPECT_NE(b1->job_id(), a1->job_id());
  EXPECT_FALSE(b1->deduplicated());
}

// Waits until `n` jobs have succeeded, as the admin's Stats counts them (the harness's own stubs
// have no credentials).
bool WaitForSucceeded(client::Client& admin, int64_t n) {
  return WaitFor(
      [&] {
        absl::StatusOr<v1::StatsResponse> s = admin.Stats();
        if (!s.ok()) return false;
        int64_t succeeded = 0;
        for (const v1::TypeStats& t : s->types()) succeeded += t.succeeded();
        return succeeded >= n;
      },
      absl::Seconds(120));
}

// The jobs of `ids` in the order they were dispatched, each shown by its payload (`field`
// "payload") or its fairness key ("key").
std::vector<std::string> ServedOrder(client::Client& admin, const std::vector<std::string>& ids,
                                     const std::string& field) {
  std::vector<std::pair<int64_t, std::string>> served;
  for (const std::string& id : ids) {
    absl::StatusOr<v1::Job> job = admin.Status(id);
    EXPECT_TRUE(job.ok()) << job.status();
    if (!job.ok()) continue;
    const int64_t at =
        job->dispatched_at().seconds() * 1'000'000'000 + job->dispatched_at().nanos();
    served.emplace_back(at, field == "key" ? job->spec().fairness_key() : job->spec().payload());
  }
  std::sort(served.begin(), served.end());
  std::vector<std::string> out;
  for (auto& [at, who] : served) out.push_back(who);
  return out;
}

TEST_F(SecurityTest, AClientCannotBuySharesWithFairnessKeysButAGatewayNamesEndUsers) {
  StartDaemon();
  constexpr int kJobs = 300;
  // Both backlogged before any worker comes: alice plainly, bob with a new key on every job.
  std::vector<v1::JobSpec> alice_specs, bob_specs, gateway_specs;
  for (int i = 0; i < kJobs; ++i) {
    alice_specs.push_back(Spec("echo", "alice"));
    v1::JobSpec b = Spec("echo", "bob");
    b.set_fairness_key(absl::StrCat("bob-key-", i));
    bob_specs.push_back(b);
  }
  // The gateway: end user u1 sends twice as many jobs as u2.
  for (int i = 0; i < kJobs; ++i) {
    v1::JobSpec g = Spec("echo", "gw");
    g.set_fairness_key(i % 3 == 2 ? "u2" : "u1");
    gateway_specs.push_back(g);
  }
  std::vector<std::string> ids, gateway_ids;
  for (auto& [who, specs] : std::vector<std::pair<std::string, std::vector<v1::JobSpec>>>{
           {"alice", alice_specs}, {"bob", bob_specs}}) {
    absl::StatusOr<v1::SubmitBatchResponse> r = As(who)->SubmitBatch(specs);
    ASSERT_TRUE(r.ok()) << r.status();
    for (const v1::SubmitResponse& s : r->results()) ids.push_back(s.job_id());
  }
  std::unique_ptr<client::Client> admin = As("ops");
  // Shares are of worker time (each job is charged what it ran): jobs of a steady 5 ms make them
  // shares of jobs too, where echo jobs' microseconds would be mostly noise.
  std::unique_ptr<Worker> worker = StartWorker("w1", "gpu", 1, {"--simulate", "100%:5ms"});
  ASSERT_TRUE(WaitForSucceeded(*admin, 2 * kJobs));
  // While both were backlogged (the first half of the run), each got half.
  std::vector<std::string> order = ServedOrder(*admin, ids, "payload");
  ASSERT_EQ(order.size(), 2u * kJobs);
  const int window = kJobs;  // both still have work throughout the first kJobs dispatches
  const int alice_served =
      static_cast<int>(std::count(order.begin(), order.begin() + window, std::string("alice")));
  EXPECT_NEAR(alice_served, window / 2, window / 10)
      << "alice got " << alice_served << " of the first " << window;
  // bob's keys were not his to choose: his jobs all queued under his name.
  absl::StatusOr<v1::Job> bob_job = admin->Status(ids.back());
  ASSERT_TRUE(bob_job.ok());
  EXPECT_EQ(bob_job->spec().fairness_key(), "bob");

  // A gateway's end users are served fairly between themselves: while both wait, u2 gets half
  // although it sent half as many jobs.
  absl::StatusOr<v1::SubmitBatchResponse> g = As("front")->SubmitBatch(gateway_specs);
  ASSERT_TRUE(g.ok()) << g.status();
  for (const v1::SubmitResponse& s : g->results()) gateway_ids.push_back(s.job_id());
  ASSERT_TRUE(WaitForSucceeded(*admin, 3 * kJobs));
  std::vector<std::string> keys = ServedOrder(*admin, gateway_ids, "key");
  const int u2_jobs = kJobs / 3;
  const int both = 2 * u2_jobs;  // u2 runs out after about this many dispatches
  const int u2_served =
      static_cast<int>(std::count(keys.begin(), keys.begin() + both * 9 / 10, std::string("u2")));
  EXPECT_NEAR(u2_served, both * 9 / 20, both / 10) << "u2 got " << u2_served;
}

TEST_F(SecurityTest, CertificateRotationUnderLoadLosesNothing) {
  StartDaemon("request", "1s");
  std::unique_ptr<client::Client> admin = As("ops");
  std::unique_ptr<Worker> worker = StartWorker("w1", "gpu", 4, {"--simulate", "100%:300ms"});
  ASSERT_TRUE(WaitForWorkers(*admin, 1));
  // A worker principal's workers are named under it.
  absl::StatusOr<v1::ListWorkersResponse> workers = admin->ListWorkers();
  ASSERT_TRUE(workers.ok() && workers->workers_size() == 1);
  EXPECT_EQ(workers->workers(0).worker_id(), "gpu/w1");
  // The common name of the certificate a new connection sees.
  auto served_name = [&] {
    grpc::SslCredentialsOptions ssl{.pem_root_certs = ReadFile(pki_.Path("ca.pem"))};
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a new connection each time
    auto channel = grpc::CreateCustomChannel(daemon_->address(), grpc::SslCredentials(ssl), args);
    auto stub = v1::JobService::NewStub(channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::StatusRequest req;
    req.set_job_id("j_none");
    v1::StatusResponse resp;
    stub->Status(&ctx, req, &resp);  // UNAUTHENTICATED: only the handshake matters
    std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
    if (auth == nullptr) return std::string();
    std::vector<grpc::string_ref> cn = auth->FindPropertyValues(GRPC_X509_CN_PROPERTY_NAME);
    return cn.empty() ? std::string() : std::string(cn[0].data(), cn[0].size());
  };
  ASSERT_EQ(served_name(), "server-a");

  std::unique_ptr<client::Client> alice = As("alice");
  std::vector<std::string> ids;
  for (int i = 0; i < 40; ++i) {
    absl::StatusOr<v1::SubmitResponse> r = alice->Submit(Spec("echo", absl::StrCat(i)));
    ASSERT_TRUE(r.ok()) << r.status();
    ids.push_back(r->job_id());
  }
  // Replace key and certificate (each by a rename), and reload, while jobs run.
  pki_.MakeCert("server-next", "server-b", "ca", /*server=*/true);
  std::filesystem::rename(pki_.Path("server-next.key"), pki_.Path("server.key"));
  std::filesystem::rename(pki_.Path("server-next.pem"), pki_.Path("server.pem"));
  ASSERT_TRUE(admin->Reload().ok());
  EXPECT_TRUE(WaitFor([&] { return served_name() == "server-b"; }, absl::Seconds(20)));
  // Jobs submitted over the old connection and the new one all finish; the worker's stream,
  // opened under the old certificate, was never cut.
  for (int i = 0; i < 20; ++i) {
    absl::StatusOr<v1::SubmitResponse> r = As("alice")->Submit(Spec("echo", absl::StrCat(i)));
    ASSERT_TRUE(r.ok()) << r.status();
    ids.push_back(r->job_id());
  }
  ASSERT_TRUE(WaitFor(
      [&] {
        for (const std::string& id : ids) {
          absl::StatusOr<v1::Job> job = admin->Status(id);
          if (!job.ok() || job->state() != v1::JOB_STATE_SUCCEEDED) return false;
        }
        return true;
      },
      absl::Seconds(60)));
  EXPECT_THAT(worker->process().Log(), ::testing::Not(HasSubstr("stream lost")));
  EXPECT_THAT(worker->process().Log(), ::testing::Not(HasSubstr("reconnecting")));
}

TEST_F(SecurityTest, TokensWorkOnLoopbackWithoutTlsAndEachCallIsCheckedAlone) {
  DaemonOptions options;
  options.types = {};
  options.extra_yaml = absl::StrCat(kEchoType, "auth:\n  tokens_file: ", dir_.File("tokens"), "\n");
  daemon_ = E2eTest::StartDaemon(options);
  ASSERT_NE(daemon_, nullptr);
  // One plaintext connection, calls with and without a token: each is judged by its own.
  auto channel = grpc::CreateChannel(daemon_->address(), grpc::InsecureChannelCredentials());
  const std::string token(absl::StripAsciiWhitespace(ReadFile(dir_.File("alice.token"))));
  std::unique_ptr<client::Client> alice = client::Client::FromChannel(channel, {}, token);
  std::unique_ptr<client::Client> anonymous = client::Client::FromChannel(channel);
  absl::StatusOr<v1::SubmitResponse> job = alice->Submit(Spec("echo", "x"));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(Code(anonymous->Status(job->job_id()).status()), absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(alice->Status(job->job_id()).ok());
  EXPECT_EQ(Code(anonymous->Submit(Spec("echo", "y")).status()),
            absl::StatusCode::kUnauthenticated);
  // dispatch-worker and dispatchctl need only the token.
  std::unique_ptr<Worker> worker = StartWorker("w1", "gpu", 1, {"--echo"});
  (void)worker;
  CommandResult run =
      RunCommand({DispatchctlBin(), "--server", daemon_->address(), "--token-file",
                  dir_.File("alice.token"), "run", "--type", "echo", "--payload", "hi"});
  EXPECT_EQ(run.exit_code, 0) << run.out << run.err;
  EXPECT_THAT(run.out, HasSubstr("hi"));  // the echoed result
}

TEST(SecureDefaultsTest, ANonLoopbackAddressNeedsTlsAndAuthOrInsecure) {
  TempDir dir;
  const std::string base = absl::StrCat("state_dir: ", dir.File("state"),
                                        "\npostgres:\n  url: postgresql://127.0.0.1:1/none\n"
                                        "  connect_wait: 0s\n"
                                        "types:\n  - name: echo\n");
  auto start = [&](const std::string& yaml) {
    std::ofstream(dir.File("d.yaml")) << yaml << base;
    return RunCommand({DispatchdBin(), "--config", dir.File("d.yaml")}, absl::Seconds(30));
  };
  CommandResult open = start("listen: 0.0.0.0:0\n");
  EXPECT_EQ(open.exit_code, 2);
  EXPECT_THAT(open.err, HasSubstr("listen: \"0.0.0.0:0\" is not a loopback address"));
  EXPECT_THAT(open.err, HasSubstr("insecure: true"));
  CommandResult metrics = start("metrics:\n  listen: 0.0.0.0:0\n");
  EXPECT_EQ(metrics.exit_code, 2);
  EXPECT_THAT(metrics.err, HasSubstr("metrics.listen"));
  // Told so in so many words, it starts (and, with no database here, fails later: exit 1), and
  // says so in the log.
  CommandResult insecure = start("listen: 0.0.0.0:0\ninsecure: true\n");
  EXPECT_EQ(insecure.exit_code, 1) << insecure.err;
  EXPECT_THAT(insecure.err, HasSubstr("insecure: true"));
}

}  // namespace
}  // namespace dispatchd::e2e
