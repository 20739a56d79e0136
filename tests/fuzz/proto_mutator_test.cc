// The structure-aware mutator (fuzz/proto_mutator.h) on memest's EstimateRequest: reproducible,
// well-formed, reaching every field of the schema, with the interesting values it promises.
#include "fuzz/proto_mutator.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/stubs/logging.h>
#include <google/protobuf/util/field_comparator.h>
#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <set>
#include <string>

#include "fuzz/estimate_target.h"
#include "memest/v1/memest.pb.h"

namespace memest::fuzz {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;
using google::protobuf::util::DefaultFieldComparator;
using google::protobuf::util::MessageDifferencer;

MutatorOptions WellFormed() {
  MutatorOptions options;
  options.dictionary = EstimateDictionary();
  options.invalid_utf8 = false;
  return options;
}

// What a message holds: the full names of its set fields, its int64 values and strings.
struct Seen {
  std::set<std::string> fields;
  std::set<int64_t> ints;
  std::set<std::string> strings;
};

void Record(const Message& m, Seen* seen) {
  const Reflection* r = m.GetReflection();
  std::vector<const FieldDescriptor*> fields;
  r->ListFields(m, &fields);
  for (const FieldDescriptor* f : fields) {
    seen->fields.insert(f->full_name());
    const int n = f->is_repeated() ? r->FieldSize(m, f) : 1;
    for (int i = 0; i < n; ++i) {
      switch (f->cpp_type()) {
        case FieldDescriptor::CPPTYPE_MESSAGE:
          Record(f->is_repeated() ? r->GetRepeatedMessage(m, f, i) : r->GetMessage(m, f), seen);
          break;
        case FieldDescriptor::CPPTYPE_INT64:
          seen->ints.insert(f->is_repeated() ? r->GetRepeatedInt64(m, f, i) : r->GetInt64(m, f));
          break;
        case FieldDescriptor::CPPTYPE_STRING:
          seen->strings.insert(f->is_repeated() ? r->GetRepeatedString(m, f, i)
                                                : r->GetString(m, f));
          break;
        default:
          break;
      }
    }
  }
}

// Every field of `d` and of the messages it contains, by full name.
void SchemaFields(const Descriptor* d, std::set<std::string>* names) {
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    if (!names->insert(f->full_name()).second) continue;
    if (f->message_type() != nullptr) SchemaFields(f->message_type(), names);
  }
}

// Mutates one request `steps` times, starting over from empty whenever it grows past 8 KiB.
Seen MutateMany(uint64_t seed, int steps, MutatorOptions options) {
  ProtoMutator mutator(seed, std::move(options));
  v1::EstimateRequest request;
  Seen seen;
  for (int i = 0; i < steps; ++i) {
    mutator.Mutate(&request);
    Record(request, &seen);
    if (request.ByteSizeLong() > 8192) request.Clear();
  }
  return seen;
}

TEST(ProtoMutatorTest, TheSameSeedMakesTheSameMutations) {
  v1::EstimateRequest a;
  v1::EstimateRequest b;
  ProtoMutator first(42, WellFormed());
  ProtoMutator second(42, WellFormed());
  for (int i = 0; i < 300; ++i) {
    first.Mutate(&a);
    second.Mutate(&b);
  }
  // The same NaN in both (a float the mutator made) is the same mutation.
  DefaultFieldComparator nan_is_nan;
  nan_is_nan.set_treat_nan_as_equal(true);
  MessageDifferencer same;
  same.set_field_comparator(&nan_is_nan);
  EXPECT_TRUE(same.Compare(a, b));
  EXPECT_GT(a.ByteSizeLong(), 0u);
  v1::EstimateRequest c;
  ProtoMutator third(43, WellFormed());
  for (int i = 0; i < 300; ++i) third.Mutate(&c);
  EXPECT_FALSE(MessageDifferencer::Equals(a, c));
}

// Map fields are mutated through their repeated view, which may hold one key twice; on the wire
// the last one wins. So the check is that the parsed message is a fixed point: it serializes and
// parses back to itself.
TEST(ProtoMutatorTest, EveryMutationSerializesAndParsesBack) {
  ProtoMutator mutator(7, WellFormed());
  v1::EstimateRequest request;
  DefaultFieldComparator nan_is_nan;
  nan_is_nan.set_treat_nan_as_equal(true);
  for (int i = 0; i < 3000; ++i) {
    mutator.Mutate(&request);
    v1::EstimateRequest parsed;
    ASSERT_TRUE(parsed.ParseFromString(request.SerializeAsString())) << "step " << i;
    v1::EstimateRequest again;
    ASSERT_TRUE(again.ParseFromString(parsed.SerializeAsString())) << "step " << i;
    std::string diff;
    MessageDifferencer differencer;
    differencer.set_field_comparator(&nan_is_nan);
    differencer.ReportDifferencesToString(&diff);
    ASSERT_TRUE(differencer.Compare(again, parsed)) << "step " << i << ": " << diff;
    if (request.ByteSizeLong() > 8192) request.Clear();
  }
}

TEST(ProtoMutatorTest, ReachesEveryFieldOfTheRequest) {
  std::set<std::string> schema;
  SchemaFields(v1::EstimateRequest::descriptor(), &schema);
  const Seen seen = MutateMany(1, 30000, WellFormed());
  for (const std::string& field : schema) {
    EXPECT_TRUE(seen.fields.count(field)) << field << " was never set";
  }
}

TEST(ProtoMutatorTest, TriesTheEdgesOfIntegersAndStrings) {
  const Seen seen = MutateMany(2, 20000, WellFormed());
  for (int64_t edge : {int64_t{0}, int64_t{-1}, int64_t{1} << 31, int64_t{1} << 62,
                       std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min()}) {
    EXPECT_TRUE(seen.ints.count(edge)) << edge;
  }
  bool newline = false;
  bool long_string = false;
  bool dictionary_word = false;
  for (const std::string& s : seen.strings) {
    newline |= s.find('\n') != std::string::npos;
    long_string |= s.size() >= 4096;
    dictionary_word |= s == "transformer_block";
  }
  EXPECT_TRUE(newline);
  EXPECT_TRUE(long_string);
  EXPECT_TRUE(dictionary_word);
}

TEST(ProtoMutatorTest, MakesInvalidUtf8OnlyWhenAllowed) {
  google::protobuf::LogSilencer quiet;  // protobuf logs each string that is not UTF-8
  MutatorOptions options = WellFormed();
  options.invalid_utf8 = true;
  ProtoMutator mutator(3, options);
  v1::EstimateRequest request;
  int unparsable = 0;
  for (int i = 0; i < 3000; ++i) {
    mutator.Mutate(&request);
    v1::EstimateRequest parsed;
    if (!parsed.ParseFromString(request.SerializeAsString())) {
      ++unparsable;
      request.Clear();
    }
  }
  EXPECT_GT(unparsable, 0);
}

TEST(ProtoMutatorTest, GrowsAndShrinksRepeatedFields) {
  v1::EstimateRequest start;
  for (int i = 0; i < 4; ++i)
    start.mutable_model()->mutable_layers()->add_layers()->set_kind("relu");
  ProtoMutator mutator(5, WellFormed());
  std::set<int> sizes;
  for (int i = 0; i < 3000; ++i) {
    v1::EstimateRequest request = start;
    mutator.Mutate(&request);
    sizes.insert(request.model().layers().layers_size());
  }
  EXPECT_TRUE(sizes.count(3));
  EXPECT_TRUE(sizes.count(4));
  EXPECT_TRUE(sizes.count(5));
}

TEST(ProtoMutatorTest, CrossOverBringsInTheOthersFields) {
  v1::EstimateRequest donor;
  donor.mutable_model()->mutable_preset()->set_name("llama-7b");
  donor.mutable_config()->set_batch_size(99);
  donor.mutable_config()->set_device_name("h100-80gb");
  int took_batch = 0;
  int took_preset = 0;
  for (uint64_t seed = 0; seed < 200; ++seed) {
    v1::EstimateRequest into;
    into.mutable_model()->mutable_layers()->add_input_shape(16);
    into.mutable_config()->set_batch_size(8);
    ProtoMutator mutator(seed, WellFormed());
    mutator.CrossOver(donor, &into);
    took_batch += into.config().batch_size() == 99;
    took_preset += into.model().preset().name() == "llama-7b";
  }
  EXPECT_GT(took_batch, 0);
  EXPECT_GT(took_preset, 0);
}

}  // namespace
}  // namespace memest::fuzz
