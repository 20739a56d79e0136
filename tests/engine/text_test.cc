// Quote, Escape and BoundMessage: request text made safe for messages and log lines.
#include "engine/ir/text.h"

#include <gtest/gtest.h>

#include <string>

namespace memest {
namespace {

TEST(EscapeTest, PlainTextIsUnchanged) {
  EXPECT_EQ(Escape("gpt2-small"), "gpt2-small");
  EXPECT_EQ(Escape("blocks.3.attn"), "blocks.3.attn");
  EXPECT_EQ(Escape(""), "");
  EXPECT_EQ(Quote("relu"), "'relu'");
}

TEST(EscapeTest, ControlCharactersQuotesAndBackslashesAreEscaped) {
  EXPECT_EQ(Escape("a\nb"), "a\\nb");
  EXPECT_EQ(Escape("a\r\tb"), "a\\r\\tb");
  EXPECT_EQ(Escape(std::string("a\0b", 3)), "a\\x00b");
  EXPECT_EQ(Escape("\x1b[31mred"), "\\x1B[31mred");
  EXPECT_EQ(Escape("\x7f"), "\\x7F");
  EXPECT_EQ(Escape("it's"), "it\\'s");
  EXPECT_EQ(Escape("a\\nb"), "a\\\\nb") << "a literal backslash-n must not read as a newline";
  EXPECT_EQ(Quote("x' error=\"forged"), "'x\\' error=\\\"forged'");
}

TEST(EscapeTest, ValidUtf8IsKeptAndInvalidBytesAreHexEscaped) {
  EXPECT_EQ(Escape("caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac"), "caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac");
  EXPECT_EQ(Escape("\xf0\x9f\x98\x80"), "\xf0\x9f\x98\x80");
  EXPECT_EQ(Escape("a\xff" "b"), "a\\xFFb");
  EXPECT_EQ(Escape("\xc3"), "\\xC3") << "a truncated sequence";
  EXPECT_EQ(Escape("\xc0\xaf"), "\\xC0\\xAF") << "an overlong '/'";
  EXPECT_EQ(Escape("\xed\xa0\x80"), "\\xED\\xA0\\x80") << "a surrogate";
  EXPECT_EQ(Escape("\xf4\x90\x80\x80"), "\\xF4\\x90\\x80\\x80") << "above U+10FFFF";
}

TEST(EscapeTest, InvisibleControlsAreEscaped) {
  EXPECT_EQ(Escape("a\xc2\x85" "b"), "a\\u{0085}b") << "NEL, a C1 line break";
  EXPECT_EQ(Escape("a\xe2\x80\xa8" "b"), "a\\u{2028}b") << "LINE SEPARATOR";
  EXPECT_EQ(Escape("\xe2\x80\xae" "abc"), "\\u{202E}abc") << "RIGHT-TO-LEFT OVERRIDE";
}

TEST(EscapeTest, LongTextIsCutWithTheCountOfBytesCut) {
  const std::string name(8192, 'a');
  EXPECT_EQ(Escape(name), std::string(kQuotedBytes, 'a') + "...(8128 more bytes)");
  EXPECT_EQ(Quote(name), "'" + std::string(kQuotedBytes, 'a') + "'...(8128 more bytes)");
  EXPECT_EQ(Quote("abcdef", 3), "'abc'...(3 more bytes)");
  EXPECT_EQ(Quote("abc", 3), "'abc'") << "exactly the bound: nothing cut";
}

TEST(EscapeTest, CutNeverSplitsACharacter) {
  // "é" is two bytes: a bound of 4 keeps "ab" and one "é", never half of the second.
  EXPECT_EQ(Escape("ab\xc3\xa9\xc3\xa9", 5), "ab\xc3\xa9...(2 more bytes)");
  EXPECT_EQ(Escape("ab\xc3\xa9\xc3\xa9", 4), "ab\xc3\xa9...(2 more bytes)");
  EXPECT_EQ(Escape("ab\xc3\xa9\xc3\xa9", 3), "ab...(4 more bytes)");
}

TEST(BoundMessageTest, ShortSafeMessagesAreUnchanged) {
  const std::string message = "model.layers[0].kind: unknown layer kind 'x\\n'; known kinds: relu";
  EXPECT_EQ(BoundMessage(message, 1024), message);
  EXPECT_EQ(BoundMessage(std::string(1024, 'x'), 1024), std::string(1024, 'x')) << "just fits";
  EXPECT_EQ(BoundMessage(std::string(1025, 'x'), 1024), std::string(1016, 'x') + "...(cut)");
}

TEST(BoundMessageTest, ControlCharactersAndInvalidUtf8AreEscaped) {
  EXPECT_EQ(BoundMessage("line one\nline two", 1024), "line one\\nline two");
  EXPECT_EQ(BoundMessage("bad \xff byte", 1024), "bad \\xFF byte");
  EXPECT_EQ(BoundMessage("caf\xc3\xa9", 1024), "caf\xc3\xa9");
}

TEST(BoundMessageTest, LongMessagesAreCutAtACharacterBoundary) {
  const std::string cut = BoundMessage(std::string(5000, 'x'), 1024);
  EXPECT_EQ(cut.size(), 1024u);
  EXPECT_EQ(cut.substr(1016), "...(cut)");

  std::string accents;
  for (int i = 0; i < 600; ++i) accents += "\xc3\xa9";
  const std::string bounded = BoundMessage(accents, 1024);
  EXPECT_LE(bounded.size(), 1024u);
  EXPECT_EQ(Escape(bounded, 4096), bounded) << "still valid UTF-8, no half character";
  EXPECT_EQ(bounded.substr(bounded.size() - 8), "...(cut)");

  // An escape is never split either.
  const std::string controls = BoundMessage(std::string(400, '\x01'), 100);
  EXPECT_LE(controls.size(), 100u);
  EXPECT_EQ(controls, [] {
    std::string s;
    for (int i = 0; i < 23; ++i) s += "\\x01";
    return s + "...(cut)";
  }());
}

TEST(CheckNameSizeTest, RefusesNamesBeyondTheBoundNamingTheFieldAndTheBound) {
  EXPECT_TRUE(CheckNameSize(std::string(kMaxNameBytes, 'n'), "model.layers[0].name").ok());
  const Status status = CheckNameSize(std::string(kMaxNameBytes + 1, 'n'), "model.layers[0].name");
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "model.layers[0].name: 1025 bytes, more than the 1024 a name may have");
}

TEST(IsValidUtf8Test, AcceptsUtf8AndRefusesEverythingElse) {
  EXPECT_TRUE(IsValidUtf8(""));
  EXPECT_TRUE(IsValidUtf8("gpt2-small"));
  EXPECT_TRUE(IsValidUtf8("caf\xc3\xa9 \xf0\x9f\x98\x80"));
  EXPECT_FALSE(IsValidUtf8("gpt2\xff"));
  EXPECT_FALSE(IsValidUtf8("\xc3"));
  EXPECT_FALSE(IsValidUtf8("\xc0\xaf"));
  EXPECT_FALSE(IsValidUtf8("\xed\xa0\x80"));
}

}  // namespace
}  // namespace memest
