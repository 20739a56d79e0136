// Words a flag takes (`--optimizer adamw`) and the proto enum values they stand for.
#ifndef MEMEST_CLIENT_CLI_WORDS_H_
#define MEMEST_CLIENT_CLI_WORDS_H_

#include <cstddef>
#include <string>

#include "engine/ir/status.h"
#include "engine/ir/text.h"

namespace memest::cli {

// A word the user types and the enum value it stands for.
template <typename Enum>
struct Word {
  const char* word;
  Enum value;
};

// "a, b, c": the words of a table, for messages and help.
template <typename Enum, size_t N>
std::string WordList(const Word<Enum> (&words)[N]) {
  std::string out;
  for (size_t i = 0; i < N; ++i) {
    if (i > 0) out += ", ";
    out += words[i].word;
  }
  return out;
}

// The value of `text` in `words`, or INVALID_ARGUMENT naming `flag` and the words it takes.
template <typename Enum, size_t N>
StatusOr<Enum> ParseWord(const std::string& flag, const std::string& text,
                         const Word<Enum> (&words)[N]) {
  for (const Word<Enum>& w : words) {
    if (text == w.word) return w.value;
  }
  return InvalidArgument(flag + ": unknown value \"" + Escape(text) + "\"; expected one of " +
                         WordList(words));
}

}  // namespace memest::cli

#endif  // MEMEST_CLIENT_CLI_WORDS_H_
