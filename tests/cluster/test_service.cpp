// The fleet service's store and job requests (cluster/service): field-by-field refusals,
// idempotent submits, completions recorded once, the schema version.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "cluster/service/job_spec.h"
#include "cluster/service/pools.h"
#include "cluster/service/store.h"
#include "core/error.h"
#include "core/job_contract.h"
#include "test_util.h"
#include "train/config.h"

namespace loom::service {
namespace {

std::string refusal(const std::string& body) {
  try {
    JobSpec::from_json(nlohmann::json::parse(body), "job");
  } catch (const BadRequest& e) {
    return std::string(std::to_string(e.status)) + " " + e.what();
  }
  return "accepted";
}

TEST(JobSpec, EveryBadFieldIsNamedWithItsValue) {
  EXPECT_EQ(refusal(R"({"config": {}})"), "400 job: field 'name' is missing");
  EXPECT_EQ(refusal(R"({"name": "a", "config": {}, "steps": 1e30})"),
            "400 job: field 'steps' is 1e+30, expected an integer in [1, 100000000]");
  EXPECT_EQ(refusal(R"({"name": "a", "config": {}, "steps": -5})"),
            "400 job: field 'steps' is -5, expected an integer in [1, 100000000]");
  EXPECT_EQ(refusal(R"({"name": "a", "config": [1]})"),
            "400 job: field 'config' is [1], expected a mapping of training keys to values");
  EXPECT_EQ(refusal(R"({"name": "a", "config": {"device": "cuda"}})"),
            "400 job: field 'config.device' is \"cuda\", expected nothing: the fleet service sets "
            "'device' itself");
  EXPECT_EQ(refusal(R"({"name": "a", "config": {"layers": [2]}})"),
            "400 job: field 'config.layers' is [2], expected a string, number or boolean");
  EXPECT_EQ(refusal(R"({"name": "a", "config": {}, "deadline_h": 0})"),
            "400 job: field 'deadline_h' is 0, expected hours after submission, in (0, 1e6]");
  EXPECT_EQ(refusal(R"({"name": "a", "config": {}, "allow_fallback": "no"})"),
            "400 job: field 'allow_fallback' is \"no\", expected true or false");
  EXPECT_EQ(refusal(R"({"name": "a", "config": {}, "pools": ["x", 3]})"),
            "400 job: field 'pools[1]' is 3, expected a pool name");
  EXPECT_EQ(refusal(R"({"name": "a", "config": {"layers": 2}, "steps": 10})"), "accepted");
}

// Every hostile request kept in tests/fixtures/fuzz/job_spec is refused with a message the
// API can send back as JSON (valid UTF-8); every hostile pools file is a named error.
TEST(JobSpec, FuzzFixturesAreRefusedWithMessagesTheApiCanSend) {
  std::vector<std::string> requests = testing::fuzz_inputs("job_spec");
  EXPECT_FALSE(requests.empty());
  for (const std::string& path : requests) {
    SCOPED_TRACE(path);
    std::ifstream in(path, std::ios::binary);
    const nlohmann::json body = nlohmann::json::parse(in, nullptr, false);
    std::string message;
    try {
      JobSpec::from_json(body, "job");
    } catch (const BadRequest& e) {
      message = e.what();
    }
    EXPECT_FALSE(message.empty()) << "accepted";
    EXPECT_NO_THROW(nlohmann::json({{"error", message}}).dump());  // strict: valid UTF-8
  }
  std::vector<std::string> pools = testing::fuzz_inputs("pools");
  EXPECT_FALSE(pools.empty());
  for (const std::string& path : pools) {
    std::string e = testing::error_of([&] { load_pools(path); });
    EXPECT_NE(e.find(path), std::string::npos) << path << ": " << e;
  }
}

TEST(JobSpec, TheModelKeyIgnoresWhatDoesNotChangeTheModel) {
  auto spec = [](const std::string& config) {
    return JobSpec::from_json(nlohmann::json::parse(R"({"name": "a", "config": )" + config + "}"),
                              "job");
  };
  EXPECT_EQ(spec(R"({"layers": 2, "lr": 0.1, "seed": 1})").model_key(),
            spec(R"({"seed": 9, "layers": 2})").model_key());
  EXPECT_NE(spec(R"({"layers": 2})").model_key(), spec(R"({"layers": 3})").model_key());
  EXPECT_EQ(spec(R"({"layers": 2, "steps": 50})").total_steps(), 50);
}

// The job contract (core/job_contract.def): every key `loom train` has (its --help lists
// TrainConfig::keys()) is one the service knows, and the reverse. A key the trainer gained
// outside the contract would be refused here; one the service lists that the trainer lacks
// would fail the second half.
TEST(JobContract, EveryKeyOfLoomTrainIsKnownToTheServiceAndTheReverse) {
  const nlohmann::json defaults = nlohmann::json::parse(train::TrainConfig().to_json());
  std::set<std::string> trainer_keys;
  for (const std::string& key : train::TrainConfig::keys()) {
    SCOPED_TRACE(key);
    trainer_keys.insert(key);
    const contract::TrainKey* known = contract::find_train_key(key);
    ASSERT_NE(known, nullptr) << "loom train has a key the contract lacks";
    nlohmann::json body = {{"name", "a"}, {"config", {{key, defaults.at(key)}}}};
    const std::string answer = refusal(body.dump());
    if (known->has(contract::kService))
      EXPECT_NE(answer.find("the fleet service sets '" + key + "' itself"), std::string::npos)
          << answer;
    else
      EXPECT_EQ(answer, "accepted") << "the service refuses loom train's default of " << key;
  }
  for (const contract::TrainKey& key : contract::kTrainKeys)
    EXPECT_TRUE(trainer_keys.count(std::string(key.name)))
        << "the service knows '" << key.name << "', loom train does not";
  EXPECT_EQ(trainer_keys.size(), std::size(contract::kTrainKeys));
  EXPECT_EQ(refusal(R"({"name": "a", "config": {"lerning_rate": 0.1}})"),
            "400 job: field 'config.lerning_rate' is 0.1, expected a key of loom train ('loom "
            "train --help' lists them)");
  EXPECT_EQ(refusal(R"({"name": "a", "config": {"layers": 5000}})"),
            "400 job: field 'config.layers' is 5000, expected a value loom train accepts (it is "
            "out of range; expected 1 to 1024)");
  EXPECT_EQ(refusal(R"({"name": "a", "config": {"mode": "lazy"}})"),
            "400 job: field 'config.mode' is \"lazy\", expected a value loom train accepts (it "
            "is not one of: eager, graph)");
}

// A job that does not say how many steps it trains runs loom train's default for its model:
// the service's remaining time and its job view use that count, not the GPT's.
TEST(JobContract, AJobsStepsAreTheTrainersDefaultForItsModel) {
  const std::vector<std::pair<std::string, std::int64_t>> cases = {
      {R"({})", 2000},
      {R"({"model": "mlp"})", 3200},
      {R"({"model": "cnn"})", 1600},
      {R"({"model": "onnx", "onnx": "m.onnx"})", 3200},
      {R"({"model": "onnx", "onnx": "m.onnx", "data": "mnist"})", 3200},
      {R"({"model": "onnx", "onnx": "m.onnx", "data": "t.txt"})", 2000},
      {R"({"model": "cnn", "steps": 30})", 30},
      {R"({"model": "cnn", "steps": "40"})", 40}};
  for (const auto& [config, expected] : cases) {
    SCOPED_TRACE(config);
    const JobSpec spec = JobSpec::from_json(
        nlohmann::json::parse(R"({"name": "a", "config": )" + config + "}"), "job");
    EXPECT_EQ(spec.total_steps(), expected);
    // loom train reading the same config (the YAML the service writes) agrees.
    train::TrainConfig trainer;
    for (const auto& [key, value] : spec.config.items())
      trainer.set(key, value.is_string() ? value.get<std::string>() : value.dump(), "job");
    trainer.finalize();
    EXPECT_EQ(trainer.steps, expected);
  }
}

class StoreTest : public ::testing::Test {
 protected:
  void SetUp() override { path_ = testing::temp_dir("fleet_store") + "/fleet.db"; }
  std::string path_;
  static JobSpec spec(const std::string& key = "") {
    JobSpec s = JobSpec::from_json(nlohmann::json::parse(R"({"name": "a", "config": {}})"), "job");
    s.idempotency_key = key;
    return s;
  }
};

TEST_F(StoreTest, ARetriedSubmitWithTheSameKeyMakesNoSecondJob) {
  Store store(path_);
  Store::Submitted first = store.submit(spec("k1"), 0), again = store.submit(spec("k1"), 1);
  EXPECT_TRUE(first.created);
  EXPECT_FALSE(again.created);
  EXPECT_EQ(first.id, again.id);
  EXPECT_TRUE(store.submit(spec("k2"), 2).created);
  EXPECT_TRUE(store.submit(spec(), 3).created);
  EXPECT_EQ(store.jobs().size(), 3u);
}

TEST_F(StoreTest, SubmitsSurviveReopeningAndCompletionsCountOnce) {
  std::int64_t id = 0;
  {
    Store store(path_);
    id = store.submit(spec(), 0).id;
    store.begin_attempt(id, 1, "cpu", "cpu: first", 1);
    store.attempt_running(id, 1, 1234, 2);
  }
  Store store(path_);  // what a restarted daemon sees
  ASSERT_EQ(store.live_attempts().size(), 1u);
  EXPECT_EQ(store.live_attempts()[0].pid, 1234);
  EXPECT_EQ(store.attempt_over(id, 1, 75, 3), "queued");  // preempted: requeued
  EXPECT_EQ(store.attempt_over(id, 1, 0, 4), "queued");   // recorded once: no change
  EXPECT_EQ(store.job(id)->preemptions, 1);
  EXPECT_EQ(store.job(id)->failures, 0);
  store.begin_attempt(id, 2, "cpu", "cpu: again", 5);
  EXPECT_EQ(store.attempt_over(id, 2, 1, 6), "queued");  // a crash, retry 1 of 2
  store.begin_attempt(id, 3, "cpu", "cpu: again", 7);
  EXPECT_EQ(store.attempt_over(id, 3, 0, 8), "succeeded");
  EXPECT_EQ(store.job(id)->failures, 1);
  EXPECT_TRUE(store.live_attempts().empty());
}

TEST_F(StoreTest, ANewerSchemaIsRefusedByName) {
  { Store store(path_); }
  {
    Database db(path_);
    db.execute("PRAGMA user_version = 99");
  }
  try {
    Store store(path_);
    FAIL() << "a store of schema 99 was opened";
  } catch (const loom::Error& e) {
    EXPECT_NE(std::string(e.what()).find("schema version 99 is newer"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace loom::service

// The simulator and the service, given the same jobs and the same measured run times,
// choose the same start order and pools: the service runs in simulated time here, with an
// executor whose attempts end when their run time has passed on the clock.
#include <fstream>
#include <map>

#include "cluster/sched/simulator.h"
#include "cluster/service/executor.h"
#include "cluster/service/service.h"

namespace loom::service {
namespace {

class SimulatedTimeExecutor : public Executor {
 public:
  SimulatedTimeExecutor(const double& clock, std::map<std::string, double> step_s,
                        std::map<std::int64_t, std::int64_t> steps)
      : clock_(clock), step_s_(std::move(step_s)), steps_(std::move(steps)) {}
  struct Run {
    std::int64_t job;
    std::string pool;
    double start, end;
  };
  std::int64_t launch(const PoolSpec& pool, const AttemptFiles& files,
                      const std::vector<std::string>&) override {
    const std::int64_t job = std::stoll(std::filesystem::path(files.dir).filename().string());
    runs.push_back({job, pool.name, clock_,
                    clock_ + static_cast<double>(steps_.at(job)) * step_s_.at(pool.name)});
    return static_cast<std::int64_t>(runs.size());
  }
  AttemptStatus probe(const PoolSpec&, const AttemptFiles&,
                      std::optional<std::int64_t> handle) override {
    AttemptStatus status;
    const Run& run = runs.at(static_cast<std::size_t>(*handle - 1));
    status.state = clock_ >= run.end ? AttemptStatus::State::exited : AttemptStatus::State::alive;
    if (clock_ >= run.end)
      status.exit_code = 0;
    return status;
  }
  void stop(const PoolSpec&, std::int64_t) override {}
  std::vector<Run> runs;

 private:
  const double& clock_;
  std::map<std::string, double> step_s_;
  std::map<std::int64_t, std::int64_t> steps_;
};

TEST(ServiceAndSimulator, ChooseTheSameStartOrderAndPools) {
  const std::vector<std::int64_t> steps{5, 3, 8, 2, 6, 4, 7, 1, 9, 2};
  std::map<std::string, std::vector<std::pair<int, double>>> placements;  // per policy
  for (const char* policy : {"fifo", "backfill", "fastest", "loom"}) {
    SCOPED_TRACE(policy);
    const std::string dir = testing::temp_dir(std::string("sim_vs_service_") + policy);
    {
      std::ofstream pools(dir + "/pools.yaml");
      // Pool b (listed first): two slots, 2 s a step; pool a: two slots, 1 s a step
      // (distinct thread counts give them distinct speeds in the knowledge cache).
      pools << "pools:\n"
               "  - {name: b, backend: cpu, slots: 2, threads: 2}\n"
               "  - {name: a, backend: cpu, slots: 2, threads: 1}\n";
    }
    double clock = 0;
    std::map<std::int64_t, std::int64_t> steps_of;
    for (std::size_t i = 0; i < steps.size(); ++i)
      steps_of[static_cast<std::int64_t>(i) + 1] = steps[i];
    auto executor = std::make_shared<SimulatedTimeExecutor>(
        clock, std::map<std::string, double>{{"a", 1.0}, {"b", 2.0}}, steps_of);
    ServiceOptions options;
    options.state_dir = dir + "/state";
    options.pools_file = dir + "/pools.yaml";
    options.policy = policy;
    options.executor = executor;
    options.clock = [&] { return clock; };
    options.probes = false;
    Service service(options);
    JobSpec spec =
        JobSpec::from_json(nlohmann::json::parse(R"({"name": "j", "config": {}})"), "job");
    for (const auto& [job, n] : steps_of) {
      spec.steps = n;
      ASSERT_EQ(service.store().submit(spec, 0).id, job);
    }
    for (auto [threads, step] : {std::pair{1, 1.0}, std::pair{2, 2.0}}) {
      Knowledge k;
      k.model_key = spec.model_key();
      k.backend = "cpu";
      k.threads = threads;
      k.version = service.version();
      k.probed = true;
      k.step_s = step;
      service.store().put_knowledge(k);
    }
    for (int pass = 0; pass < 100; ++pass) {
      service.pass();
      double next = INFINITY;
      for (const auto& run : executor->runs)
        if (run.end > clock)
          next = std::min(next, run.end);
      if (next == INFINITY)
        break;
      clock = next;
    }
    ASSERT_EQ(executor->runs.size(), steps.size());

    cluster::Fleet fleet{{{"b", 2, 1}, {"a", 2, 1}}};
    std::vector<cluster::Job> jobs;
    for (std::size_t i = 0; i < steps.size(); ++i) {
      cluster::Job j;
      j.id = static_cast<std::int64_t>(i) + 1;
      j.seconds_on = {{"a", static_cast<double>(steps[i])},
                      {"b", 2.0 * static_cast<double>(steps[i])}};
      jobs.push_back(j);
    }
    cluster::SimReport sim = cluster::simulate(fleet, jobs, cluster::parse_policy(policy));
    for (const auto& run : executor->runs) {
      const cluster::Placement& p = sim.placements[static_cast<std::size_t>(run.job - 1)];
      EXPECT_EQ(run.pool, p.pool == 0 ? "b" : "a") << "job " << run.job;
      EXPECT_DOUBLE_EQ(run.start, p.start_s) << "job " << run.job;
    }
    for (const cluster::Placement& p : sim.placements)
      placements[policy].push_back({p.pool, p.start_s});
  }
  // The job list tells the policies apart, so agreeing on it means something.
  EXPECT_NE(placements["fifo"], placements["fastest"]);
}

// A job that does not say how many steps it trains is predicted to take loom train's
// default for its model (the MLP's 3,200 and the CNN's 1,600, not the GPT's 2,000).
TEST(JobContract, TheServicePredictsAnImageJobsTimeFromItsOwnStepCount) {
  const std::string dir = testing::temp_dir("fleet_contract_steps");
  std::ofstream(dir + "/pools.yaml") << "pools:\n  - {name: host, backend: cpu, threads: 1}\n";
  for (const auto& [model, hours] : {std::pair{"mlp", "3.2 h"}, std::pair{"cnn", "1.6 h"}}) {
    SCOPED_TRACE(model);
    ServiceOptions options;
    options.state_dir = dir + "/state-" + model;
    options.pools_file = dir + "/pools.yaml";
    options.policy = "loom";
    options.probes = false;
    const double clock = 0;
    options.clock = [&] { return clock; };
    options.executor =
        std::make_shared<SimulatedTimeExecutor>(clock, std::map<std::string, double>{{"host", 3.6}},
                                                std::map<std::int64_t, std::int64_t>{{1, 1}});
    Service service(options);
    const JobSpec spec =
        JobSpec::from_json(nlohmann::json{{"name", "a"}, {"config", {{"model", model}}}}, "job");
    ASSERT_EQ(service.store().submit(spec, 0).id, 1);
    Knowledge k;
    k.model_key = spec.model_key();
    k.backend = "cpu";
    k.threads = 1;
    k.version = service.version();
    k.probed = true;
    k.step_s = 3.6;  // 1,000 steps an hour
    service.store().put_knowledge(k);
    service.pass();
    const std::string reason = service.store().job(1)->reason;
    EXPECT_NE(reason.find("earliest predicted finish (" + std::string(hours) + ")"),
              std::string::npos)
        << reason;
    EXPECT_EQ(service.store().job(1)->to_json()["steps"],
              model == std::string("mlp") ? 3200 : 1600);
  }
}

}  // namespace
}  // namespace loom::service

// Speed from the performance model: a transformer job on pools that stand for catalog
// chips is priced by the model of each chip, a measured run replaces it, and the reason
// of a placement says which source each pool's speed came from.
#include "cluster/service/model_speed.h"

namespace loom::service {
namespace {

class ModelSpeedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::temp_dir("fleet_model_speed");
    std::ofstream pools(dir_ + "/pools.yaml");
    pools << "pools:\n"
             "  - {name: a100, backend: cpu, chip: a100-80gb}\n"
             "  - {name: h100, backend: cpu, chip: h100-sxm}\n"
             "  - {name: host, backend: cpu}\n";
  }
  // GPT-2 124M's shape with bf16 products, as `loom ops --json` describes it.
  static nlohmann::json gpt2(const std::string& precision = "bf16") {
    return {{"layers", 12},   {"hidden", 768}, {"heads", 12}, {"ffn", 3072},
            {"vocab", 50304}, {"seq", 1024},   {"batch", 8},  {"precision", precision}};
  }
  std::unique_ptr<Service> service(std::shared_ptr<Executor> executor = nullptr) {
    ServiceOptions options;
    options.state_dir = dir_ + "/state";
    options.pools_file = dir_ + "/pools.yaml";
    options.catalog_dir = testing::source_dir() + "/catalog";
    options.probes = false;
    options.executor = std::move(executor);
    clock_ = 0;
    options.clock = [this] { return clock_; };
    return std::make_unique<Service>(options);
  }
  // What a probe of the job's model on the cpu backend would store.
  static void seed(Service& s, const JobSpec& spec, const nlohmann::json& transformer,
                   std::uint64_t launches, double probe_step_s) {
    Knowledge k;
    k.model_key = spec.model_key();
    k.backend = "cpu";
    k.threads = 1;
    k.version = s.version();
    k.probed = true;
    k.step_s = probe_step_s;
    if (!transformer.is_null())
      k.transformer =
          nlohmann::json{{"transformer", transformer}, {"launches_per_step", launches}}.dump();
    s.store().put_knowledge(k);
  }
  static JobSpec job() {
    return JobSpec::from_json(nlohmann::json::parse(R"({"name": "j", "config": {}})"), "job");
  }
  std::string dir_;
  double clock_ = 0;
};

TEST_F(ModelSpeedTest, EachChipIsPricedByItsModelAndTheHostByItsProbe) {
  auto s = service();
  const JobSpec spec = job();
  seed(*s, spec, gpt2(), 500, 3.0);
  const StepTime a100 = s->step_time(spec, s->pools()[0]), h100 = s->step_time(spec, s->pools()[1]),
                 host = s->step_time(spec, s->pools()[2]);
  EXPECT_EQ(a100.basis, "performance model of a100-80gb");
  EXPECT_EQ(h100.basis, "performance model of h100-sxm");
  EXPECT_EQ(host.basis, "probe");
  ASSERT_TRUE(a100.seconds && h100.seconds && host.seconds);
  EXPECT_EQ(*host.seconds, 3.0);
  // The pools' own model, computed here: the service adds nothing of its own.
  const cluster::Catalog catalog = cluster::Catalog::load(testing::source_dir() + "/catalog");
  const ModelSpeed expected = model_step_time(gpt2(), 500, catalog.chip("h100-sxm"));
  EXPECT_EQ(*h100.seconds, *expected.step_s);
  // 8 x 1024 tokens of a 124M model: about 6 x 124M x 8192 = 6.1 TFLOP a step, plus
  // attention; tens of milliseconds on either chip, the H100 faster than the A100.
  EXPECT_GT(*h100.seconds, 0.005);
  EXPECT_LT(*h100.seconds, 0.1);
  EXPECT_LT(*h100.seconds, *a100.seconds);
}

TEST_F(ModelSpeedTest, AMeasuredRunReplacesTheModel) {
  auto s = service();
  const JobSpec spec = job();
  seed(*s, spec, gpt2(), 500, 3.0);
  s->store().record_measured_step(spec.model_key(), "cpu", 1, s->version(), 0.25);
  const StepTime h100 = s->step_time(spec, s->pools()[1]);
  EXPECT_EQ(h100.basis, "measured");
  EXPECT_EQ(*h100.seconds, 0.25);
}

TEST_F(ModelSpeedTest, TheModelDoesNotApplyToF32ProductsOrOtherModels) {
  auto s = service();
  const JobSpec spec = job();
  seed(*s, spec, gpt2("f32"), 500, 3.0);
  StepTime h100 = s->step_time(spec, s->pools()[1]);
  EXPECT_EQ(h100.basis, "probe");  // the probe's time stands, with no chip rate to offer
  EXPECT_EQ(*h100.seconds, 3.0);
  JobSpec mlp = job(), cnn = job();  // (a spec's model key is computed once)
  mlp.config["model"] = "mlp";
  cnn.config["model"] = "cnn";
  seed(*s, mlp, nlohmann::json(), 0, 0.5);
  EXPECT_EQ(s->step_time(mlp, s->pools()[1]).basis, "probe");
  // Nothing probed and nothing measured: unknown, not guessed.
  h100 = s->step_time(cnn, s->pools()[1]);
  EXPECT_FALSE(h100.seconds);
  EXPECT_EQ(h100.basis, "unknown");
}

TEST_F(ModelSpeedTest, ATinyModelIsBoundByItsOpLaunches) {
  const cluster::Catalog catalog = cluster::Catalog::load(testing::source_dir() + "/catalog");
  nlohmann::json tiny = {{"layers", 2}, {"hidden", 64}, {"heads", 2}, {"ffn", 256},
                         {"vocab", 65}, {"seq", 32},    {"batch", 4}, {"precision", "bf16"}};
  const ModelSpeed m = model_step_time(tiny, 181, catalog.chip("h100-sxm"));
  ASSERT_TRUE(m.step_s);
  EXPECT_DOUBLE_EQ(*m.step_s, 181 * kOpLaunchSeconds);
  EXPECT_NE(m.basis.find("launch-bound: 181 op launches"), std::string::npos) << m.basis;
  // A chip whose bf16 rate is not public: the model says which figure it lacks.
  for (const cluster::Chip& chip : catalog.chips())
    if (!chip.bf16_tflops.known()) {
      const ModelSpeed unknown = model_step_time(gpt2(), 500, chip);
      EXPECT_FALSE(unknown.step_s);
      EXPECT_NE(unknown.basis.find("bf16"), std::string::npos) << unknown.basis;
    }
}

TEST_F(ModelSpeedTest, APoolNamingNoCatalogChipIsRefusedByName) {
  std::ofstream(dir_ + "/pools.yaml") << "pools:\n  - {name: gpu, backend: cpu, chip: h1000}\n";
  try {
    service();
    FAIL() << "a pool of an unknown chip was accepted";
  } catch (const loom::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("pools.yaml: pool 'gpu': field 'chip': unknown chip 'h1000'"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("h100-sxm"), std::string::npos) << what;  // lists the known ones
  }
}

TEST_F(ModelSpeedTest, APlacementSaysWhereEachPoolsSpeedCameFrom) {
  std::ofstream(dir_ + "/pools.yaml") << "pools:\n"
                                         "  - {name: a100, backend: cpu, chip: a100-80gb}\n"
                                         "  - {name: h100, backend: cpu, chip: h100-sxm}\n";
  auto executor = std::make_shared<SimulatedTimeExecutor>(
      clock_, std::map<std::string, double>{{"a100", 1.0}, {"h100", 1.0}},
      std::map<std::int64_t, std::int64_t>{{1, 10}});
  auto s = service(executor);
  JobSpec spec = job();
  spec.steps = 10;
  ASSERT_EQ(s->store().submit(spec, 0).id, 1);
  seed(*s, spec, gpt2(), 500, 3.0);
  s->pass();
  ASSERT_EQ(executor->runs.size(), 1u);
  EXPECT_EQ(executor->runs[0].pool, "h100");  // the loom policy: earliest predicted finish
  const std::string reason = s->store().job(1)->reason;
  // Each pool's source, in the order the job considered the pools (its seeded order).
  const std::size_t speed = reason.find("; speed: ");
  ASSERT_NE(speed, std::string::npos) << reason;
  EXPECT_NE(reason.find("a100 performance model of a100-80gb", speed), std::string::npos) << reason;
  EXPECT_NE(reason.find("h100 performance model of h100-sxm", speed), std::string::npos) << reason;
}

}  // namespace
}  // namespace loom::service

// An older store is upgraded in place: jobs kept, the new column usable.
namespace loom::service {
namespace {

TEST_F(StoreTest, AStoreOfSchemaOneIsUpgradedInPlace) {
  std::int64_t id = 0;
  {
    Store store(path_);
    id = store.submit(spec("kept"), 0).id;
  }
  {  // the schema as version 1 wrote it
    Database db(path_);
    db.execute("ALTER TABLE knowledge DROP COLUMN transformer");
    db.execute("PRAGMA user_version = 1");
  }
  Store store(path_);
  EXPECT_EQ(store.job(id)->spec->idempotency_key, "kept");
  Knowledge k;
  k.model_key = "m";
  k.backend = "cpu";
  k.version = "v";
  k.probed = true;
  k.transformer = R"({"transformer": {}})";
  store.put_knowledge(k);
  EXPECT_EQ(store.knowledge("m", "cpu", 1, "v")->transformer, k.transformer);
  Database db(path_);
  Statement version(db, "PRAGMA user_version");
  ASSERT_TRUE(version.step());
  EXPECT_EQ(version.integer(0), Store::kSchemaVersion);
}

}  // namespace
}  // namespace loom::service
