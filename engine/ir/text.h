// Request text: how long a name may be, and quoting it into error messages and log lines.
//
// Anything a request carries (a preset name, a tensor name, a scope, an attribute's string
// value) may hold newlines, quotes, terminal escapes or bytes that are not UTF-8, and may be
// megabytes long. Such text reaches a message or a log line only through Quote() or Escape(),
// so that a name can neither forge a log line nor make a reply too large to deliver: control
// characters, the quote, the backslash and bytes that are not valid UTF-8 are written as
// escapes, and text beyond a bound is cut with a marker saying how much was cut.
#ifndef MEMEST_ENGINE_IR_TEXT_H_
#define MEMEST_ENGINE_IR_TEXT_H_

#include <cstddef>
#include <string>
#include <string_view>

#include "engine/ir/status.h"

namespace memest {

// The most bytes of one name in a request: a layer, tensor or parameter name, an op's inputs,
// outputs and scope, a block or checkpoint scope, an attribute's name or string value. Module
// paths of real models are a few dozen bytes (Hugging Face's longest are under 100); 1 KiB is
// ten times that, and keeps what a reply repeats of each name (a layer table row per scope, the
// peak's op and scope) and what a message or log line holds from growing with the request: a
// 4 MiB layer name would otherwise come back four times, beyond a client's 4 MiB reply limit.
inline constexpr size_t kMaxNameBytes = 1024;

// OK, or INVALID_ARGUMENT "<field>: 4194304 bytes, more than the 1024 a name may have" for a
// `name` longer than kMaxNameBytes.
Status CheckNameSize(std::string_view name, const std::string& field);

// The most bytes of one piece of request text a message repeats. 64 keeps every name a user
// would recognise (the longest module paths of real models are about 60 bytes) while a message
// naming a few of them stays far below gRPC's 8 KiB limit on a reply's metadata.
inline constexpr size_t kQuotedBytes = 64;

// `text` escaped: `\\` for a backslash, `\'` and `\"` for quotes, `\n`, `\r`, `\t`, and `\xNN` for
// every other ASCII control byte, DEL and every byte that is not part of valid UTF-8; the C1
// controls, U+2028/U+2029 (line breaks to some readers) and the bidirectional overrides are
// written `\u{XXXX}`. Other valid UTF-8 is kept. When `text` is longer than `max_bytes`, only its
// first `max_bytes` bytes (fewer, to end on a character boundary) are escaped, followed by
// "...(N more bytes)". Printable ASCII without quotes or backslashes comes back unchanged, so a
// plain identifier can go into a field path ("model.layers[0].attrs.<name>") as it is.
std::string Escape(std::string_view text, size_t max_bytes = kQuotedBytes);

// Escape(text) between single quotes: 'gpt2\nsmall'. Beyond `max_bytes` the marker follows the
// closing quote: 'aaaa'...(8128 more bytes).
std::string Quote(std::string_view text, size_t max_bytes = kQuotedBytes);

// A whole message (which already quotes its request text) made safe as a last line of defence:
// control characters escaped as Escape() does, and the result cut to at most `max_bytes` bytes
// at a UTF-8 boundary, ending in "...(cut)" when it was cut (`max_bytes` below the marker's 8
// bytes counts as 8). Quotes and backslashes are kept as they are, so a message that is already
// safe comes back unchanged when it fits.
std::string BoundMessage(std::string_view message, size_t max_bytes);

// Whether `text` is valid UTF-8 (RFC 3629: no overlong forms, surrogates or code points above
// U+10FFFF), as protobuf requires of a proto3 string.
bool IsValidUtf8(std::string_view text);

// The length of the valid UTF-8 sequence (RFC 3629, as IsValidUtf8) that starts at text[i], 1 to
// 4; 0 when none does.
size_t Utf8SequenceLength(std::string_view text, size_t i);

}  // namespace memest

#endif  // MEMEST_ENGINE_IR_TEXT_H_
