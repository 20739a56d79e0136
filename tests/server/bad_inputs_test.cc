// Runs the catalogue of bad inputs (tests/server/bad_inputs.h) through memest::HandleEstimate:
// every row must be refused with its code, and the message must name its field.
#include "tests/server/bad_inputs.h"

#include <gmock/gmock.h>
#include <google/protobuf/text_format.h>
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "server/estimator_service.h"
#include "server/status_conversion.h"

namespace memest::testing {

const char* const kGpt2 = R"pb(
  model {
    preset {
      name: "gpt2-small"
      params { key: "seq" value: 32 }
      params { key: "layers" value: 2 }
    }
  }
)pb";

const char* const kMlp = R"pb(
  model {
    preset {
      name: "mlp"
      params { key: "layers" value: 2 }
      params { key: "width" value: 16 }
      params { key: "input" value: 8 }
      params { key: "classes" value: 4 }
    }
  }
)pb";

const char* const kLinearLayers = R"pb(
  model {
    layers {
      input_shape: [ 8 ]
      layers {
        kind: "linear"
        attrs {
          key: "out_features"
          value { i: 4 }
        }
      }
    }
  }
)pb";

const char* const kLinearOps = R"pb(
  model {
    ops {
      tensors {
        name: "x"
        shape: [ 2, 8 ]
      }
      tensors {
        name: "w"
        shape: [ 4, 8 ]
        role: TENSOR_ROLE_PARAMETER
      }
      ops {
        kind: "linear"
        inputs: [ "x", "w" ]
        outputs: [ "y" ]
        scope: "fc"
      }
      ops {
        kind: "sum"
        inputs: [ "y" ]
        outputs: [ "loss" ]
      }
      loss: "loss"
    }
  }
)pb";

const char* const kConfig = "config { batch_size: 2 }";

namespace {

using ::testing::HasSubstr;

StatusOr<v1::EstimateRequest> Parse(const std::string& text) {
  v1::EstimateRequest request;
  if (!google::protobuf::TextFormat::ParseFromString(text, &request)) {
    return InvalidArgument("not a text-format EstimateRequest: " + text);
  }
  return request;
}

grpc::Status Estimate(const v1::EstimateRequest& request) {
  v1::EstimateRequest copy = request;
  copy.set_skip_advice(true);
  v1::EstimateResponse response;
  return ToGrpcStatus(HandleEstimate(copy, ServiceOptions{}, &response));
}

// The base models are fine, in training and in inference: a row fails for its own reason.
TEST(BadInputsTest, BaseModelsAreAccepted) {
  for (const char* model : {kGpt2, kMlp, kLinearLayers, kLinearOps}) {
    for (const char* mode : {"", "mode: MODE_INFERENCE"}) {
      StatusOr<v1::EstimateRequest> request =
          Parse(std::string(model) + "config { batch_size: 2 " + mode + " }");
      ASSERT_TRUE(request.ok()) << request.status().message();
      const grpc::Status status = Estimate(*request);
      EXPECT_TRUE(status.ok()) << model << mode << ": " << status.error_message();
    }
  }
}

std::vector<BadInput> AllRows() {
  std::vector<BadInput> rows = BadModelInputs();
  for (BadInput& row : BadConfigInputs()) rows.push_back(std::move(row));
  for (BadInput& row : BadSizeInputs()) rows.push_back(std::move(row));
  for (BadInput& row : BadHfConfigInputs()) rows.push_back(std::move(row));
  for (BadInput& row : BadServingInputs()) rows.push_back(std::move(row));
  for (BadInput& row : BadPrecisionInputs()) rows.push_back(std::move(row));
  return rows;
}

TEST(BadInputsTest, TheCatalogueHasAtLeastAHundredDistinctRows) {
  const std::vector<BadInput> rows = AllRows();
  EXPECT_GE(rows.size(), 100u);
  std::set<std::string> names;
  for (const BadInput& row : rows) EXPECT_TRUE(names.insert(row.name).second) << row.name;
}

class BadInputTest : public ::testing::TestWithParam<BadInput> {};

TEST_P(BadInputTest, IsRefusedNamingTheField) {
  const BadInput& row = GetParam();
  StatusOr<v1::EstimateRequest> request = Parse(row.request);
  ASSERT_TRUE(request.ok()) << request.status().message();
  if (row.edit) row.edit(&*request);
  const grpc::Status status = Estimate(*request);
  EXPECT_EQ(status.error_code(), row.code)
      << "message: " << status.error_message() << "\nrequest: " << request->ShortDebugString();
  EXPECT_THAT(status.error_message(), HasSubstr(row.field));
}

INSTANTIATE_TEST_SUITE_P(Catalogue, BadInputTest, ::testing::ValuesIn(AllRows()),
                         [](const ::testing::TestParamInfo<BadInput>& info) {
                           return info.param.name;
                         });

}  // namespace
}  // namespace memest::testing
