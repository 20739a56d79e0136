// Tests of server/explicit_settings.h through RunConfigFromProto, which runs it: settings a
// request makes where they do not apply are refused; present but empty sub-messages are not
// settings.
#include "server/explicit_settings.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

#include "server/convert.h"

namespace memest {
namespace {

using ::testing::HasSubstr;

// Clients build requests with sub-messages present but empty (Python's
// `config.checkpoint.non_reentrant = False` marks `checkpoint` present); that sets nothing.
TEST(ExplicitSettingsTest, EmptySubMessagesAreNotSettings) {
  v1::RunConfig proto;
  proto.set_mode(v1::MODE_INFERENCE);
  proto.mutable_optimizer()->set_weight_decay(0.0);
  proto.mutable_checkpoint()->set_policy(v1::CHECKPOINT_POLICY_NONE);
  proto.mutable_checkpoint()->set_non_reentrant(false);
  ASSERT_TRUE(proto.has_optimizer() && proto.has_checkpoint());
  StatusOr<RunConfig> config = RunConfigFromProto(proto);
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->mode, Mode::kInference);
}

// What the request sets explicitly where it does not apply: refused, not ignored.
TEST(ExplicitSettingsTest, RefusesExplicitSettingsThatDoNotApply) {
  struct Case {
    const char* field;
    v1::RunConfig config;
  };
  std::vector<Case> cases;
  auto add = [&cases](const char* field, v1::Mode mode, auto mutate) {
    v1::RunConfig config;
    config.set_batch_size(1);
    config.set_mode(mode);
    mutate(config);
    cases.push_back({field, config});
  };
  const v1::Mode inference = v1::MODE_INFERENCE;
  add("config.optimizer.kind", inference,
      [](v1::RunConfig& c) { c.mutable_optimizer()->set_kind(v1::OPTIMIZER_KIND_ADAMW); });
  add("config.optimizer.impl", inference,
      [](v1::RunConfig& c) { c.mutable_optimizer()->set_impl(v1::OPTIMIZER_IMPL_FOREACH); });
  add("config.optimizer.weight_decay", inference,
      [](v1::RunConfig& c) { c.mutable_optimizer()->set_weight_decay(0.1); });
  add("config.checkpoint.policy", inference, [](v1::RunConfig& c) {
    c.mutable_checkpoint()->set_policy(v1::CHECKPOINT_POLICY_SQRT_BLOCKS);
  });
  add("config.checkpoint.every_k", inference,
      [](v1::RunConfig& c) { c.mutable_checkpoint()->set_every_k(1); });
  add("config.checkpoint.scopes", inference,
      [](v1::RunConfig& c) { c.mutable_checkpoint()->add_scopes("h.0"); });
  add("config.checkpoint.non_reentrant", inference,
      [](v1::RunConfig& c) { c.mutable_checkpoint()->set_non_reentrant(true); });
  add("config.checkpoint.every_k", v1::MODE_TRAINING, [](v1::RunConfig& c) {
    c.mutable_checkpoint()->set_policy(v1::CHECKPOINT_POLICY_EVERY_BLOCK);
    c.mutable_checkpoint()->set_every_k(2);
  });
  add("config.checkpoint.every_k", v1::MODE_UNSPECIFIED,
      [](v1::RunConfig& c) { c.mutable_checkpoint()->set_every_k(2); });
  add("config.device_name", v1::MODE_TRAINING, [](v1::RunConfig& c) { c.set_device_name(""); });

  for (const Case& c : cases) {
    SCOPED_TRACE(c.config.ShortDebugString());
    StatusOr<RunConfig> config = RunConfigFromProto(c.config);
    ASSERT_FALSE(config.ok());
    EXPECT_EQ(config.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(config.status().message(), HasSubstr(c.field));
  }
}

}  // namespace
}  // namespace memest
