// Request text in the engine's and the conversion's refusals, before the status conversion
// bounds them once more: every place that quotes a name, a kind, a scope or a value escapes it
// and cuts it (engine/ir/text.h).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "memest/v1/memest.pb.h"
#include "server/estimator_service.h"

namespace memest {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

v1::EstimateRequest PresetRequest(const std::string& name) {
  v1::EstimateRequest request;
  request.mutable_model()->mutable_preset()->set_name(name);
  request.mutable_config()->set_batch_size(2);
  request.set_skip_advice(true);
  return request;
}

v1::AttrValue Int(int64_t i) {
  v1::AttrValue value;
  value.set_i(i);
  return value;
}

// A newline stays the two characters \n and 8 KiB of text are cut, wherever the request put
// them. The requests go through the whole of Estimate without the RPC (HandleEstimate).
TEST(RequestTextInRefusalsTest, IsEscapedAndCutWhereverItIsQuoted) {
  const std::string text = "a\nforged" + std::string(8192, 'z');
  const std::string escaped = "a\\nforged";
  std::vector<std::pair<std::string, v1::EstimateRequest>> cases;
  auto layers = [](const std::string& kind) {
    v1::EstimateRequest r;
    r.mutable_model()->mutable_layers()->add_input_shape(8);
    r.mutable_model()->mutable_layers()->add_layers()->set_kind(kind);
    r.mutable_config()->set_batch_size(2);
    return r;
  };
  auto ops = [](const std::string& kind, const std::string& input) {
    v1::EstimateRequest r;
    v1::OpGraph* graph = r.mutable_model()->mutable_ops();
    v1::TensorDecl* x = graph->add_tensors();
    x->set_name("x");
    x->add_shape(4);
    x->add_shape(8);
    v1::OpDecl* op = graph->add_ops();
    op->set_kind(kind);
    op->add_inputs(input);
    op->add_outputs("y");
    graph->set_loss("y");
    r.mutable_config()->set_batch_size(4);
    r.mutable_config()->set_mode(v1::MODE_INFERENCE);
    return r;
  };
  cases.emplace_back("preset name", PresetRequest(text));
  {
    v1::EstimateRequest r = PresetRequest("mlp");
    (*r.mutable_model()->mutable_preset()->mutable_params())[text] = 1;
    cases.emplace_back("preset parameter", r);
  }
  cases.emplace_back("layer kind", layers(text));
  {
    v1::EstimateRequest r = layers("linear");
    (*r.mutable_model()->mutable_layers()->mutable_layers(0)->mutable_attrs())[text.substr(
        0, 1000)] = Int(4);
    cases.emplace_back("layer attribute name", r);
  }
  {
    v1::EstimateRequest r = layers("gelu");
    v1::AttrValue value;
    value.set_s(text.substr(0, 1000));  // within the bound on names, beyond the quoted 64 bytes
    (*r.mutable_model()->mutable_layers()->mutable_layers(0)->mutable_attrs())["approximate"] =
        value;
    cases.emplace_back("layer attribute value", r);
  }
  {
    v1::EstimateRequest r = layers("relu");
    *r.mutable_model()->mutable_layers()->add_layers() = r.model().layers().layers(0);
    for (v1::Layer& layer : *r.mutable_model()->mutable_layers()->mutable_layers()) {
      layer.set_name(text.substr(0, 1000));
    }
    cases.emplace_back("duplicate layer name", r);
  }
  {
    v1::EstimateRequest r = layers("relu");
    r.mutable_model()->mutable_layers()->set_input_dtype(text);
    cases.emplace_back("input dtype", r);
  }
  {
    v1::EstimateRequest r = layers("relu");
    r.mutable_model()->mutable_layers()->set_loss(text);
    cases.emplace_back("layer model loss", r);
  }
  cases.emplace_back("op kind", ops(text, "x"));
  cases.emplace_back("op input", ops("relu", text.substr(0, 1000)));
  {
    v1::EstimateRequest r = ops("relu", "x");
    r.mutable_model()->mutable_ops()->mutable_tensors(0)->set_dtype(text);
    cases.emplace_back("tensor dtype", r);
  }
  {
    v1::EstimateRequest r = ops("relu", "x");
    *r.mutable_model()->mutable_ops()->add_tensors() = r.model().ops().tensors(0);
    for (v1::TensorDecl& t : *r.mutable_model()->mutable_ops()->mutable_tensors()) {
      t.set_name(text.substr(0, 1000));
    }
    cases.emplace_back("duplicate tensor name", r);
  }
  {
    v1::EstimateRequest r = ops("relu", "x");
    r.mutable_config()->set_mode(v1::MODE_TRAINING);
    r.mutable_model()->mutable_ops()->set_loss(text.substr(0, 1000));
    cases.emplace_back("op graph loss", r);
  }
  {
    v1::EstimateRequest r = ops("relu", "x");
    r.mutable_model()->mutable_ops()->add_blocks(text.substr(0, 1000));
    cases.emplace_back("block scope", r);
  }
  {
    v1::EstimateRequest r = ops("relu", "x");
    v1::AttrValue nan;
    nan.set_f(std::numeric_limits<double>::quiet_NaN());
    (*r.mutable_model()->mutable_ops()->mutable_ops(0)->mutable_attrs())[text.substr(0, 1000)] =
        nan;
    cases.emplace_back("op attribute name", r);
  }
  {
    v1::EstimateRequest r = ops("einsum", "x");
    r.mutable_model()->mutable_ops()->mutable_ops(0)->add_inputs("x");
    v1::AttrValue equation;
    equation.set_s(text.substr(0, 1000));
    (*r.mutable_model()->mutable_ops()->mutable_ops(0)->mutable_attrs())["equation"] = equation;
    cases.emplace_back("einsum equation", r);
  }
  {
    v1::EstimateRequest r = PresetRequest("mlp");
    r.mutable_config()->set_device_name(text);
    cases.emplace_back("device name", r);
  }
  {
    v1::EstimateRequest r = PresetRequest("mlp");
    r.mutable_config()->mutable_checkpoint()->set_policy(v1::CHECKPOINT_POLICY_SCOPES);
    r.mutable_config()->mutable_checkpoint()->add_scopes(text.substr(0, 1000));
    cases.emplace_back("checkpoint scope", r);
  }
  for (const auto& [name, request] : cases) {
    SCOPED_TRACE(name);
    v1::EstimateResponse response;
    const Status status = HandleEstimate(request, ServiceOptions(), &response);
    ASSERT_FALSE(status.ok());
    EXPECT_THAT(status.message(), Not(HasSubstr("\n"))) << status.message();
    EXPECT_THAT(status.message(), HasSubstr(escaped)) << status.message();
    EXPECT_THAT(status.message(), Not(HasSubstr(std::string(65, 'z')))) << status.message();
  }
}

}  // namespace
}  // namespace memest
