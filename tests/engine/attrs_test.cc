// Attrs (engine/ir/graph.h): copies share one map until one of them is written.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/ir/graph.h"

namespace memest {
namespace {

TEST(AttrsTest, ACopyIsIndependentOnceEitherIsWritten) {
  Attrs a{{"dim", int64_t{1}}, {"shape", std::vector<int64_t>{2, 3}}};
  Attrs b = a;
  EXPECT_EQ(a, b);
  b["dim"] = int64_t{2};
  EXPECT_EQ(std::get<int64_t>(a.at("dim")), 1);
  EXPECT_EQ(std::get<int64_t>(b.at("dim")), 2);
  EXPECT_NE(a, b);

  Attrs c = a;
  a.erase("shape");
  EXPECT_EQ(a.count("shape"), 0u);
  EXPECT_EQ(c.count("shape"), 1u);
  c.emplace("mode", std::string("x"));
  EXPECT_EQ(a.size(), 1u);
  EXPECT_EQ(c.size(), 3u);

  Attrs d = c;
  d.insert_or_assign("dim", int64_t{7});
  EXPECT_FALSE(d.emplace("dim", int64_t{8}));  // there already
  EXPECT_EQ(std::get<int64_t>(c.at("dim")), 1);
  EXPECT_EQ(std::get<int64_t>(d.at("dim")), 7);
  d.clear();
  EXPECT_TRUE(d.empty());
  EXPECT_EQ(c.size(), 3u);
}

TEST(AttrsTest, EqualMapsCompareEqualWhetherSharedOrNot) {
  const Attrs a{{"p", 0.5}};
  const Attrs b{{"p", 0.5}};
  EXPECT_EQ(a, b);
  EXPECT_EQ(Attrs(), Attrs{});
  EXPECT_NE(a, Attrs());
  EXPECT_TRUE(Attrs().empty());
  const Attrs none;
  EXPECT_EQ(none.find("p"), none.end());
  EXPECT_THROW(a.at("q"), std::out_of_range);
}

TEST(AttrsTest, StampedCopiesShareTheirOriginalsAttributesAndChangingOneLeavesTheOther) {
  Graph g;
  g.ops.push_back(Op{"transpose", {}, {}, Attrs{{"dim0", int64_t{0}}, {"dim1", int64_t{1}}}, ""});
  g.ops.push_back(g.ops[0]);
  g.ops[1].attrs["dim1"] = int64_t{2};
  EXPECT_EQ(std::get<int64_t>(g.ops[0].attrs.at("dim1")), 1);
  EXPECT_EQ(std::get<int64_t>(g.ops[1].attrs.at("dim1")), 2);
}

}  // namespace
}  // namespace memest
