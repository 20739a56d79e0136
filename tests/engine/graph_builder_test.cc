// GraphBuilder's error context: set as a string or made only when an error names it.
#include <gtest/gtest.h>

#include <string>

#include "engine/ir/graph.h"

namespace memest {
namespace {

// A rule's error, under an eager and under a lazy context: the same message, and the lazy one
// made only for the error.
TEST(GraphBuilderTest, ALazyContextIsMadeOnlyForAnError) {
  int made = 0;
  auto context = [&made] {
    ++made;
    return std::string("model.ops[7]");
  };
  GraphBuilder lazy;
  const int x = lazy.Input("x", {2, 8}, DType::kFloat32);
  lazy.SetLazyErrorContext(context);
  EXPECT_GE(lazy.Add1("gelu", {x}), 0);
  EXPECT_GE(lazy.Add1("softmax", {x}, {{"dim", int64_t{1}}}), 0);
  EXPECT_EQ(made, 0);
  EXPECT_EQ(lazy.Add1("softmax", {x}, {{"dim", int64_t{5}}}), -1);
  EXPECT_GT(made, 0);

  GraphBuilder eager;
  const int y = eager.Input("x", {2, 8}, DType::kFloat32);
  eager.SetErrorContext("model.ops[7]");
  EXPECT_EQ(eager.Add1("softmax", {y}, {{"dim", int64_t{5}}}), -1);
  EXPECT_EQ(lazy.status().message(), eager.status().message());
  EXPECT_EQ(lazy.status().message().rfind("model.ops[7]", 0), 0) << lazy.status().message();
}

// Without a context an error names the op's kind and its scope, as before.
TEST(GraphBuilderTest, WithoutAContextAnErrorNamesTheKindAndScope) {
  GraphBuilder b;
  const int x = b.Input("x", {2, 8}, DType::kFloat32);
  ScopeGuard s(b, "h.3.attn");
  EXPECT_EQ(b.Add1("softmax", {x}, {{"dim", int64_t{5}}}), -1);
  EXPECT_EQ(b.status().message().rfind("h.3.attn: softmax.attrs.dim: ", 0), 0)
      << b.status().message();
  // A lazy context that makes "" is no context, as an empty one is not.
  GraphBuilder d;
  const int z = d.Input("x", {2, 8}, DType::kFloat32);
  ScopeGuard t(d, "h.3.attn");
  d.SetLazyErrorContext([] { return std::string(); });
  EXPECT_EQ(d.Add1("softmax", {z}, {{"dim", int64_t{5}}}), -1);
  EXPECT_EQ(d.status().message(), b.status().message());
  // A lazy context that was cleared is no context.
  GraphBuilder c;
  const int y = c.Input("x", {2, 8}, DType::kFloat32);
  c.SetLazyErrorContext([] { return std::string("never"); });
  c.SetErrorContext("");
  EXPECT_EQ(c.Add1("nonsense_op", {y}), -1);
  EXPECT_EQ(c.status().message().find("never"), std::string::npos) << c.status().message();
}

}  // namespace
}  // namespace memest
