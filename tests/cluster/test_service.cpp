// The fleet service's store and job requests (cluster/service): field-by-field refusals,
// idempotent submits, completions recorded once, the schema version.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "cluster/service/job_spec.h"
#include "cluster/service/store.h"
#include "core/error.h"
#include "test_util.h"

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
