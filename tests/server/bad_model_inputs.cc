// Rows of the bad-input catalogue for EstimateRequest.model: presets with bad parameters, layer
// lists with bad shapes, kinds and attributes, op graphs with bad declarations and references.
#include <string>
#include <vector>

#include "tests/server/bad_inputs.h"

namespace memest::testing {
namespace {

constexpr grpc::StatusCode kInvalid = grpc::StatusCode::INVALID_ARGUMENT;
constexpr grpc::StatusCode kNotFound = grpc::StatusCode::NOT_FOUND;
constexpr grpc::StatusCode kPrecondition = grpc::StatusCode::FAILED_PRECONDITION;

const std::string kTwo62 = "4611686018427387904";  // 2^62
const std::string kInt64Max = "9223372036854775807";
const std::string kInt64Min = "-9223372036854775808";

std::string Config() { return kConfig; }

// A preset request: `name` with params "key: value" pairs already in text format.
std::string Preset(const std::string& name, const std::string& params = "") {
  return "model { preset { name: \"" + name + "\" " + params + " } } " + Config();
}
std::string Param(const std::string& key, const std::string& value) {
  return "params { key: \"" + key + "\" value: " + value + " } ";
}

// A layer-list request: `layers` (text of Layer messages) after `head` (input_shape, dtype,
// loss).
std::string Layers(const std::string& layers, const std::string& head = "input_shape: [8]") {
  return "model { layers { " + head + " " + layers + " } } " + Config();
}
std::string Layer(const std::string& kind, const std::string& attrs = "",
                  const std::string& name = "") {
  return "layers { kind: \"" + kind + "\" " + (name.empty() ? "" : "name: \"" + name + "\" ") +
         attrs + " } ";
}
// One attribute; `value` is the AttrValue's text, e.g. "i: 4" or "f: 0.5".
std::string Attr(const std::string& key, const std::string& value) {
  return "attrs { key: \"" + key + "\" value { " + value + " } } ";
}
std::string Linear(int64_t out) {
  return Layer("linear", Attr("out_features", "i: " + std::to_string(out)));
}

// An op-graph request with `body` inside model.ops.
std::string Ops(const std::string& body) { return "model { ops { " + body + " } } " + Config(); }
const std::string kX = "tensors { name: \"x\" shape: [2, 8] } ";
const std::string kW = "tensors { name: \"w\" shape: [4, 8] role: TENSOR_ROLE_PARAMETER } ";
const std::string kLinearOp =
    "ops { kind: \"linear\" inputs: [\"x\", \"w\"] outputs: [\"y\"] scope: \"fc\" } ";
const std::string kSumOp = "ops { kind: \"sum\" inputs: [\"y\"] outputs: [\"loss\"] } ";
const std::string kLoss = "loss: \"loss\" ";

std::vector<BadInput> PresetRows() {
  return {
      {"NoModelSource", Config(), kInvalid, "model: no model source set"},
      {"PresetNameEmpty", Preset(""), kNotFound, "model.preset.name"},
      {"PresetNameUnknown", Preset("gpt5-huge"), kNotFound, "model.preset.name"},
      {"PresetNameWrongCase", Preset("GPT2-SMALL"), kNotFound, "model.preset.name"},
      {"PresetParamUnknown", Preset("gpt2-small", Param("depth", "2")), kInvalid,
       "model.preset.params.depth"},
      {"PresetParamEmptyName", Preset("mlp", Param("", "2")), kInvalid, "model.preset.params."},
      {"PresetParamNegative", Preset("gpt2-small", Param("seq", "-1")), kInvalid,
       "model.preset.params.seq"},
      {"PresetParamZero", Preset("mlp", Param("width", "0")), kInvalid,
       "model.preset.params.width"},
      {"PresetParamTwo62", Preset("mlp", Param("layers", kTwo62)), kInvalid,
       "model.preset.params.layers"},
      {"PresetParamInt64Max", Preset("gpt2-small", Param("vocab", kInt64Max)), kInvalid,
       "model.preset.params.vocab"},
      {"PresetParamInt64Min", Preset("resnet18", Param("classes", kInt64Min)), kInvalid,
       "model.preset.params.classes"},
      {"PresetParamOfAnotherPreset", Preset("resnet18", Param("seq", "128")), kInvalid,
       "model.preset.params.seq"},
      {"Gpt2HeadsDoNotDivide", Preset("gpt2-small", Param("heads", "7")), kInvalid,
       "model.preset.params.heads"},
      {"LlamaKvHeadsDoNotDivide",
       Preset("llama-7b", Param("layers", "1") + Param("seq", "16") + Param("kv_heads", "5")),
       kInvalid, "model.preset.params.kv_heads"},
      {"LlamaOddHeadDim",
       Preset("llama-7b", Param("layers", "1") + Param("seq", "16") + Param("d_model", "96") +
                              Param("heads", "32")),
       kInvalid, "model.preset.params.heads"},
      {"BertSeqBeyondPositions", Preset("bert-base", Param("seq", "513")), kInvalid,
       "model.preset.params.seq"},
      {"VitPatchDoesNotDivideImage", Preset("vit-b16", Param("patch", "15")), kInvalid,
       "model.preset.params.patch"},
      {"ResnetImageTooSmall", Preset("resnet18", Param("image", "16")), kInvalid,
       "model.preset.params.image"},
      {"UnetImageNotDivisible", Preset("unet-down", Param("image", "60")), kInvalid,
       "model.preset.params.image"},
  };
}

std::vector<BadInput> LayerRows() {
  return {
      {"LayersEmpty", Layers(""), kInvalid, "model.layers"},
      {"LayersInputShapeNegative", Layers(Linear(4), "input_shape: [-8]"), kInvalid,
       "model.input_shape[0]"},
      {"LayersInputShapeZero", Layers(Linear(4), "input_shape: [8, 0]"), kInvalid,
       "model.input_shape[1]"},
      {"LayersInputShapeOverflows", Layers(Linear(4), "input_shape: [" + kTwo62 + ", 4]"), kInvalid,
       "model.input_shape"},
      {"LayersInputShapeInt64Max", Layers(Linear(4), "input_shape: [" + kInt64Max + "]"), kInvalid,
       "model.input_shape"},
      {"LayersInputDtypeUnknown", Layers(Linear(4), "input_shape: [8] input_dtype: \"float8\""),
       kInvalid, "model.input_dtype"},
      {"LayersLossUnknown", Layers(Linear(4), "input_shape: [8] loss: \"hinge\""), kInvalid,
       "model.loss"},
      {"LayersCrossEntropyOnAVector",
       Layers(Layer("flatten", Attr("start_dim", "i: 0")),
              "input_shape: [8] loss: \"cross_entropy\""),
       kInvalid, "model.loss"},
      {"LayerKindEmpty", Layers(Layer("")), kInvalid, "model.layers[0].kind"},
      {"LayerKindUnknown", Layers(Linear(4) + Layer("lstm")), kInvalid, "model.layers[1].kind"},
      {"LayerKindWrongCase", Layers(Layer("Linear", Attr("out_features", "i: 4"))), kInvalid,
       "model.layers[0].kind"},
      {"LayerAttrUnknown", Layers(Layer("linear", Attr("outfeatures", "i: 4"))), kInvalid,
       "model.layers[0].attrs.outfeatures"},
      {"LayerAttrOnKindWithNone", Layers(Layer("sigmoid", Attr("inplace", "i: 1"))), kInvalid,
       "model.layers[0].attrs.inplace"},
      {"LayerAttrNoValue", Layers(Layer("linear", Attr("out_features", "i: 4") + Attr("bias", ""))),
       kInvalid, "model.layers[0].attrs.bias"},
      {"LinearOutFeaturesMissing", Layers(Layer("linear")), kInvalid,
       "model.layers[0].attrs.out_features"},
      {"LinearOutFeaturesNegative", Layers(Linear(-4)), kInvalid,
       "model.layers[0].attrs.out_features"},
      {"LinearOutFeaturesZero", Layers(Linear(0)), kInvalid, "model.layers[0].attrs.out_features"},
      {"LinearOutFeaturesFloat", Layers(Layer("linear", Attr("out_features", "f: 4.5"))), kInvalid,
       "model.layers[0].attrs.out_features"},
      {"LinearOutFeaturesString", Layers(Layer("linear", Attr("out_features", "s: \"4\""))),
       kInvalid, "model.layers[0].attrs.out_features"},
      {"LinearInFeaturesMismatch",
       Layers(Layer("linear", Attr("out_features", "i: 4") + Attr("in_features", "i: 9"))),
       kInvalid, "model.layers[0].attrs.in_features"},
      {"LinearBiasNotAFlag",
       Layers(Layer("linear", Attr("out_features", "i: 4") + Attr("bias", "i: 2"))), kInvalid,
       "model.layers[0].attrs.bias"},
      {"DropoutPOne", Layers(Layer("dropout", Attr("p", "f: 1.0"))), kInvalid,
       "model.layers[0].attrs.p"},
      {"DropoutPNegative", Layers(Layer("dropout", Attr("p", "f: -0.1"))), kInvalid,
       "model.layers[0].attrs.p"},
      {"DropoutPNan", Layers(Layer("dropout", Attr("p", "f: nan"))), kInvalid,
       "model.layers[0].attrs.p"},
      {"DropoutPInfinite", Layers(Layer("dropout", Attr("p", "f: inf"))), kInvalid,
       "model.layers[0].attrs.p"},
      {"Conv2dOnAVector",
       Layers(Layer("conv2d", Attr("out_channels", "i: 4") + Attr("kernel_size", "i: 3"))),
       kInvalid, "model.layers[0]"},
      {"Conv2dKernelLargerThanInput",
       Layers(Layer("conv2d", Attr("out_channels", "i: 4") + Attr("kernel_size", "i: 9")),
              "input_shape: [3, 4, 4]"),
       kInvalid, "model.layers[0].attrs.kernel_size"},
      {"Conv2dGroupsDoNotDivide",
       Layers(Layer("conv2d", Attr("out_channels", "i: 4") + Attr("kernel_size", "i: 1") +
                                  Attr("groups", "i: 2")),
              "input_shape: [3, 4, 4]"),
       kInvalid, "model.layers[0].attrs.groups"},
      {"Conv2dPaddingNegative",
       Layers(Layer("conv2d", Attr("out_channels", "i: 4") + Attr("kernel_size", "i: 1") +
                                  Attr("padding", "i: -1")),
              "input_shape: [3, 4, 4]"),
       kInvalid, "model.layers[0].attrs.padding"},
      {"Conv2dStrideZero",
       Layers(Layer("conv2d", Attr("out_channels", "i: 4") + Attr("kernel_size", "i: 1") +
                                  Attr("stride", "i: 0")),
              "input_shape: [3, 4, 4]"),
       kInvalid, "model.layers[0].attrs.stride"},
      {"Conv2dInChannelsMismatch",
       Layers(Layer("conv2d", Attr("out_channels", "i: 4") + Attr("kernel_size", "i: 1") +
                                  Attr("in_channels", "i: 5")),
              "input_shape: [3, 4, 4]"),
       kInvalid, "model.layers[0].attrs.in_channels"},
      {"MaxPoolPaddingBeyondHalfKernel",
       Layers(Layer("max_pool2d", Attr("kernel_size", "i: 2") + Attr("padding", "i: 2")),
              "input_shape: [3, 4, 4]"),
       kInvalid, "model.layers[0].attrs.padding"},
      {"SoftmaxDimOutOfRange", Layers(Layer("softmax", Attr("dim", "i: 5"))), kInvalid,
       "model.layers[0].attrs.dim"},
      {"FlattenStartAfterEnd",
       Layers(Layer("flatten", Attr("start_dim", "i: 2") + Attr("end_dim", "i: 1")),
              "input_shape: [3, 4, 4]"),
       kInvalid, "model.layers[0].attrs.start_dim"},
      {"EmbeddingOnFloatInput",
       Layers(Layer("embedding", Attr("num_embeddings", "i: 10") + Attr("embedding_dim", "i: 4"))),
       kInvalid, "model.layers[0]"},
      {"AttentionHeadsDoNotDivide",
       Layers(Layer("attention", Attr("heads", "i: 3")), "input_shape: [4, 8]"), kInvalid,
       "model.layers[0].attrs.heads"},
      {"AttentionOnAVector", Layers(Layer("attention", Attr("heads", "i: 2"))), kInvalid,
       "model.layers[0]"},
      {"BlockStyleUnknown",
       Layers(Layer("transformer_block", Attr("heads", "i: 2") + Attr("style", "s: \"bert\"")),
              "input_shape: [4, 8]"),
       kInvalid, "model.layers[0].attrs.style"},
      {"Gpt2BlockWithGroupedKv",
       Layers(Layer("transformer_block", Attr("heads", "i: 2") + Attr("kv_heads", "i: 1")),
              "input_shape: [4, 8]"),
       kInvalid, "model.layers[0].attrs.kv_heads"},
      {"GeluApproximateUnknown", Layers(Layer("gelu", Attr("approximate", "s: \"fast\""))),
       kInvalid, "model.layers[0].attrs.approximate"},
      {"MlpActivationUnknown",
       Layers(Layer("mlp", Attr("hidden", "i: 8") + Attr("activation", "s: \"elu\""))), kInvalid,
       "model.layers[0].attrs.activation"},
      {"GroupNormGroupsDoNotDivide",
       Layers(Layer("group_norm", Attr("num_groups", "i: 3")), "input_shape: [4, 2, 2]"), kInvalid,
       "model.layers[0].attrs.num_groups"},
      {"BatchNormOnAVector",
       Layers(Layer("flatten", Attr("start_dim", "i: 0")) + Layer("batch_norm")), kInvalid,
       "model.layers[1]"},
      {"AdaptivePoolOnThreeDims", Layers(Layer("adaptive_avg_pool2d"), "input_shape: [3, 4]"),
       kInvalid, "model.layers[0]"},
      {"ReluInplaceAsAList", Layers(Layer("relu", Attr("inplace", "ints { values: [1] }"))),
       kInvalid, "model.layers[0].attrs.inplace"},
      {"LayerNamesDuplicate", Layers(Layer("relu", "", "act") + Layer("tanh", "", "act")), kInvalid,
       "model.layers[1].name"},
      {"LayerNameDuplicatesAnIndex", Layers(Layer("relu") + Layer("tanh", "", "0")), kInvalid,
       "model.layers[1].name"},
  };
}

std::vector<BadInput> OpRows() {
  return {
      {"OpsTensorNameEmpty", Ops("tensors { shape: [2] } " + kX + kW + kLinearOp + kSumOp + kLoss),
       kInvalid, "model.tensors[0].name"},
      {"OpsTensorNameDuplicate", Ops(kX + kX + kW + kLinearOp + kSumOp + kLoss), kInvalid,
       "model.tensors[1].name"},
      {"OpsTensorShapeNegative",
       Ops("tensors { name: \"x\" shape: [2, -8] } " + kW + kLinearOp + kSumOp + kLoss), kInvalid,
       "model.tensors[0].shape[1]"},
      {"OpsTensorShapeOverflows",
       Ops("tensors { name: \"x\" shape: [" + kTwo62 + ", " + kTwo62 + "] } " + kW + kLinearOp +
           kSumOp + kLoss),
       kInvalid, "model.tensors[0].shape"},
      {"OpsTensorDtypeUnknown",
       Ops("tensors { name: \"x\" shape: [2, 8] dtype: \"complex32\" } " + kW + kLinearOp + kSumOp +
           kLoss),
       kInvalid, "model.tensors[0].dtype"},
      {"OpsTensorRoleUnknown", Ops(kX + kW + kLinearOp + kSumOp + kLoss), kInvalid,
       "model.tensors[1].role",
       [](v1::EstimateRequest* r) {
         r->mutable_model()->mutable_ops()->mutable_tensors(1)->set_role(
             static_cast<v1::TensorRole>(42));
       }},
      {"OpsBatchDimBeyondRank",
       Ops("tensors { name: \"x\" shape: [2, 8] batch_dim: 2 } " + kW + kLinearOp + kSumOp + kLoss),
       kInvalid, "model.tensors[0].batch_dim"},
      {"OpsBatchDimBelowMinusOne",
       Ops("tensors { name: \"x\" shape: [2, 8] batch_dim: -2 } " + kW + kLinearOp + kSumOp +
           kLoss),
       kInvalid, "model.tensors[0].batch_dim"},
      {"OpsBatchDimInt32Max",
       Ops("tensors { name: \"x\" shape: [2, 8] batch_dim: 2147483647 } " + kW + kLinearOp +
           kSumOp + kLoss),
       kInvalid, "model.tensors[0].batch_dim"},
      {"OpsBatchDimOnAParameter",
       Ops(kX + "tensors { name: \"w\" shape: [4, 8] role: TENSOR_ROLE_PARAMETER batch_dim: 1 } " +
           kLinearOp + kSumOp + kLoss),
       kInvalid, "model.tensors[1].batch_dim"},
      {"OpsBatchDimOnABuffer",
       Ops(kX + kW + "tensors { name: \"b\" shape: [4] role: TENSOR_ROLE_BUFFER batch_dim: 0 } " +
           "tensors { name: \"m\" shape: [2, 4] role: TENSOR_ROLE_BUFFER batch_dim: 1 } " +
           kLinearOp + kSumOp + kLoss),
       kInvalid, "model.tensors[3].batch_dim"},
      {"OpsBatchDimOnAnActivation",
       Ops(kX + kW +
           "tensors { name: \"y\" shape: [2, 4] role: TENSOR_ROLE_ACTIVATION batch_dim: 1 } " +
           kLinearOp + kSumOp + kLoss),
       kInvalid, "model.tensors[2].batch_dim"},
      {"OpsTracedBatchNegative", Ops(kX + kW + kLinearOp + kSumOp + kLoss + "traced_batch: -2"),
       kInvalid, "model.traced_batch"},
      {"OpsTracedBatchDisagreesWithShape",
       Ops(kX + kW + kLinearOp + kSumOp + kLoss + "traced_batch: 3"), kInvalid,
       "model.tensors[0].shape[0]"},
      {"OpKindUnknown",
       Ops(kX + kW + "ops { kind: \"linearr\" inputs: [\"x\", \"w\"] outputs: [\"y\"] } " + kSumOp +
           kLoss),
       kInvalid, "model.ops[0].kind"},
      {"OpKindEmpty",
       Ops(kX + kW + "ops { inputs: [\"x\", \"w\"] outputs: [\"y\"] } " + kSumOp + kLoss), kInvalid,
       "model.ops[0].kind"},
      {"OpInputDangling",
       Ops(kX + kW + "ops { kind: \"linear\" inputs: [\"x\", \"v\"] outputs: [\"y\"] } " + kSumOp +
           kLoss),
       kInvalid, "model.ops[0].inputs[1]"},
      {"OpInputEmptyName",
       Ops(kX + kW + "ops { kind: \"linear\" inputs: [\"x\", \"\"] outputs: [\"y\"] } " + kSumOp +
           kLoss),
       kInvalid, "model.ops[0].inputs[1]"},
      {"OpInputFromALaterOp",
       Ops(kX + kW + "tensors { name: \"y\" shape: [2, 4] role: TENSOR_ROLE_ACTIVATION } " +
           kSumOp + kLinearOp + kLoss),
       kInvalid, "model.ops[0].inputs[0]"},
      {"OpsCycle",
       Ops(kX +
           "ops { kind: \"relu\" inputs: [\"b\"] outputs: [\"a\"] } "
           "ops { kind: \"relu\" inputs: [\"a\"] outputs: [\"b\"] } "
           "ops { kind: \"sum\" inputs: [\"b\"] outputs: [\"loss\"] } " +
           kLoss),
       kInvalid, "model.ops[0].inputs[0]"},
      {"OpReadsItsOwnOutput",
       Ops(kX + "ops { kind: \"relu\" inputs: [\"a\"] outputs: [\"a\"] } " +
           "ops { kind: \"sum\" inputs: [\"a\"] outputs: [\"loss\"] } " + kLoss),
       kInvalid, "model.ops[0].inputs[0]"},
      {"OpTooFewInputs",
       Ops(kX + kW + "ops { kind: \"linear\" inputs: [\"x\"] outputs: [\"y\"] } " + kSumOp + kLoss),
       kInvalid, "model.ops[0]"},
      {"OpTooManyInputs",
       Ops(kX + kW + "ops { kind: \"relu\" inputs: [\"x\", \"w\"] outputs: [\"y\"] } " + kSumOp +
           kLoss),
       kInvalid, "model.ops[0]"},
      {"OpOutputNamesALeaf",
       Ops(kX + kW + "ops { kind: \"linear\" inputs: [\"x\", \"w\"] outputs: [\"w\"] } " +
           "ops { kind: \"sum\" inputs: [\"w\"] outputs: [\"loss\"] } " + kLoss),
       kInvalid, "model.ops[0].outputs[0]"},
      {"OpOutputNamedTwiceByOneOp",
       Ops(kX + "ops { kind: \"split\" inputs: [\"x\"] outputs: [\"v\", \"v\"] " +
           Attr("dim", "i: 1") + Attr("sizes", "ints { values: [4, 4] }") + "} " +
           "ops { kind: \"sum\" inputs: [\"v\"] outputs: [\"loss\"] } " + kLoss),
       kInvalid, "model.ops[0].outputs[1]"},
      {"OpOutputNamedByTwoOps",
       Ops(kX + kW + kLinearOp + "ops { kind: \"relu\" inputs: [\"x\"] outputs: [\"y\"] } " +
           kSumOp + kLoss),
       kInvalid, "model.ops[1].outputs[0]"},
      {"OpMoreOutputNamesThanOutputs",
       Ops(kX + kW + "ops { kind: \"linear\" inputs: [\"x\", \"w\"] outputs: [\"y\", \"z\"] } " +
           kSumOp + kLoss),
       kInvalid, "model.ops[0].outputs"},
      {"OpsDeclaredShapeDisagrees",
       Ops(kX + kW + "tensors { name: \"y\" shape: [2, 5] role: TENSOR_ROLE_ACTIVATION } " +
           kLinearOp + kSumOp + kLoss),
       kInvalid, "model.tensors[2].shape"},
      {"OpsDeclaredDtypeDisagrees",
       Ops(kX + kW +
           "tensors { name: \"y\" shape: [2, 4] dtype: \"int64\" role: TENSOR_ROLE_ACTIVATION } " +
           kLinearOp + kSumOp + kLoss),
       kInvalid, "model.tensors[2].dtype"},
      {"OpsDeclaredActivationNeverProduced",
       Ops(kX + kW + "tensors { name: \"z\" shape: [2, 4] role: TENSOR_ROLE_ACTIVATION } " +
           kLinearOp + kSumOp + kLoss),
       kInvalid, "model.tensors[2]"},
      {"OpAttrNan",
       Ops(kX + "ops { kind: \"dropout\" inputs: [\"x\"] outputs: [\"y\"] " + Attr("p", "f: nan") +
           "} " + kSumOp + kLoss),
       kInvalid, "model.ops[0].attrs.p"},
      {"OpAttrNoValue",
       Ops(kX + "ops { kind: \"softmax\" inputs: [\"x\"] outputs: [\"y\"] " + Attr("dim", "") +
           "} " + kSumOp + kLoss),
       kInvalid, "model.ops[0].attrs.dim"},
      {"OpAttrWrongType",
       Ops(kX + "ops { kind: \"softmax\" inputs: [\"x\"] outputs: [\"y\"] " +
           Attr("dim", "s: \"last\"") + "} " + kSumOp + kLoss),
       kInvalid, "model.ops[0].attrs.dim"},
      {"OpAttrDimOutOfRange",
       Ops(kX + "ops { kind: \"softmax\" inputs: [\"x\"] outputs: [\"y\"] " + Attr("dim", "i: 7") +
           "} " + kSumOp + kLoss),
       kInvalid, "model.ops[0]"},
      {"OpShapesDoNotMatch",
       Ops(kX + "tensors { name: \"w\" shape: [4, 9] role: TENSOR_ROLE_PARAMETER } " + kLinearOp +
           kSumOp + kLoss),
       kInvalid, "model.ops[0]"},
      {"OpsLossMissingInTraining", Ops(kX + kW + kLinearOp + kSumOp), kInvalid, "model.loss"},
      {"OpsLossUnknown", Ops(kX + kW + kLinearOp + kSumOp + "loss: \"l\""), kInvalid, "model.loss"},
      {"OpsLossNotAScalar", Ops(kX + kW + kLinearOp + "loss: \"y\""), kInvalid, "model.loss"},
      {"OpsLossNotFloating",
       Ops("tensors { name: \"x\" shape: [2, 8] dtype: \"int64\" } "
           "ops { kind: \"sum\" inputs: [\"x\"] outputs: [\"loss\"] } " +
           kLoss),
       kInvalid, "model.loss"},
      {"OpsNoOpsInTraining", Ops(kX + kLoss), kInvalid, "model.loss"},
      {"OpsBlockWithoutOps", Ops(kX + kW + kLinearOp + kSumOp + kLoss + "blocks: [\"h.0\"]"),
       kInvalid, "model.blocks[0]"},
      {"OpsBlockEmptyName", Ops(kX + kW + kLinearOp + kSumOp + kLoss + "blocks: [\"\"]"), kInvalid,
       "model.blocks[0]"},
      {"OpsCheckpointReversed",
       Ops(kX + kW + kLinearOp + "ops { kind: \"relu\" inputs: [\"y\"] outputs: [\"r\"] } " +
           "ops { kind: \"sum\" inputs: [\"r\"] outputs: [\"loss\"] } " + kLoss +
           "checkpoints { first_op: 1 last_op: 0 }"),
       kInvalid, "model.checkpoints[0]"},
      {"OpsCheckpointNegative",
       Ops(kX + kW + kLinearOp + kSumOp + kLoss + "checkpoints { first_op: -1 last_op: 0 }"),
       kInvalid, "model.checkpoints[0]"},
      {"OpsCheckpointBeyondTheOps",
       Ops(kX + kW + kLinearOp + kSumOp + kLoss + "checkpoints { first_op: 0 last_op: 9 }"),
       kInvalid, "model.checkpoints[0]"},
      {"OpsCheckpointAtInt32Max",
       Ops(kX + kW + kLinearOp + kSumOp + kLoss +
           "checkpoints { first_op: 2147483647 last_op: 2147483647 }"),
       kInvalid, "model.checkpoints[0]"},
      {"OpsCheckpointsOverlap",
       Ops(kX + kW + kLinearOp + "ops { kind: \"relu\" inputs: [\"y\"] outputs: [\"r\"] } " +
           "ops { kind: \"sum\" inputs: [\"r\"] outputs: [\"loss\"] } " + kLoss +
           "checkpoints { first_op: 0 last_op: 1 } checkpoints { first_op: 1 last_op: 1 }"),
       kInvalid, "model.checkpoints[1]"},
      {"OpsCheckpointReachesTheLoss",
       Ops(kX + kW + kLinearOp + kSumOp + kLoss + "checkpoints { first_op: 0 last_op: 1 }"),
       kInvalid, "model.checkpoints[0]"},
      {"OpsHeldUnknownTensor",
       Ops(kX + kW + kLinearOp + kSumOp + kLoss + "held { tensor: \"z\" until_op: 0 }"), kInvalid,
       "model.held[0].tensor"},
      {"OpsHeldBeyondTheOps",
       Ops(kX + kW + kLinearOp + kSumOp + kLoss + "held { tensor: \"y\" until_op: 9 }"), kInvalid,
       "model.held[0].until_op"},
      {"OpsHeldNegativeOp",
       Ops(kX + kW + kLinearOp + kSumOp + kLoss + "held { tensor: \"y\" until_op: -1 }"), kInvalid,
       "model.held[0].until_op"},
      {"OpsHeldBeforeItIsMade",
       Ops(kX + kW + kLinearOp + kSumOp + kLoss + "held { tensor: \"loss\" until_op: 0 }"),
       kInvalid, "model.held[0].until_op"},
      {"OpsOutputUnknown", Ops(kX + kW + kLinearOp + kSumOp + kLoss + "outputs: [\"z\"]"), kInvalid,
       "model.outputs[0]"},
      {"OpsOwnCheckpointsAndAPolicy",
       "model { ops { " + kX + kW + kLinearOp + kSumOp + kLoss +
           "checkpoints { first_op: 0 last_op: 0 } } } "
           "config { batch_size: 2 checkpoint { policy: CHECKPOINT_POLICY_SCOPES scopes: [\"fc\"] "
           "} }",
       kPrecondition, "config.checkpoint.policy"},
  };
}

}  // namespace

std::vector<BadInput> BadModelInputs() {
  std::vector<BadInput> rows = PresetRows();
  for (std::vector<BadInput> part : {LayerRows(), OpRows()}) {
    for (BadInput& row : part) rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace memest::testing
