#include "engine/ir/text.h"

#include <algorithm>
#include <cstdint>

namespace memest {
namespace {

// One character of the text: a valid UTF-8 sequence (`valid`, with its code point) or a single
// byte that does not start one.
struct Unit {
  size_t size = 1;
  uint32_t code_point = 0;
  bool valid = false;
};

// Decodes the unit at `text[i]` strictly (RFC 3629): no overlong forms, no surrogates, nothing
// above U+10FFFF.
Unit NextUnit(std::string_view text, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<uint8_t>(text[i + k]); };
  const uint8_t b0 = byte(0);
  if (b0 < 0x80) return {1, b0, true};
  size_t size = 0;
  uint32_t cp = 0, min = 0;
  if ((b0 & 0xE0) == 0xC0) {
    size = 2, cp = b0 & 0x1F, min = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    size = 3, cp = b0 & 0x0F, min = 0x800;
  } else if ((b0 & 0xF8) == 0xF0) {
    size = 4, cp = b0 & 0x07, min = 0x10000;
  } else {
    return {1, b0, false};
  }
  if (i + size > text.size()) return {1, b0, false};
  for (size_t k = 1; k < size; ++k) {
    if ((byte(k) & 0xC0) != 0x80) return {1, b0, false};
    cp = (cp << 6) | (byte(k) & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return {1, b0, false};
  return {size, cp, true};
}

// Code points that change how text reads without being visible: C1 controls, the line and
// paragraph separators, and the bidirectional embeddings, overrides and isolates.
bool IsInvisibleControl(uint32_t cp) {
  return (cp >= 0x80 && cp <= 0x9F) || cp == 0x2028 || cp == 0x2029 ||
         (cp >= 0x202A && cp <= 0x202E) || (cp >= 0x2066 && cp <= 0x2069);
}

void AppendHex(uint32_t value, int digits, std::string* out) {
  static constexpr char kDigits[] = "0123456789ABCDEF";
  for (int shift = 4 * (digits - 1); shift >= 0; shift -= 4)
    out->push_back(kDigits[(value >> shift) & 0xF]);
}

// Appends `unit` (the bytes text[i, i + unit.size)) escaped; quotes (both kinds) and backslashes
// only when `quotes` is set.
void AppendUnit(std::string_view text, size_t i, const Unit& unit, bool quotes, std::string* out) {
  if (!unit.valid) {
    out->append("\\x");
    AppendHex(static_cast<uint8_t>(text[i]), 2, out);
    return;
  }
  const uint32_t cp = unit.code_point;
  if (cp < 0x80) {
    switch (cp) {
      case '\n':
        out->append("\\n");
        return;
      case '\r':
        out->append("\\r");
        return;
      case '\t':
        out->append("\\t");
        return;
      case '\\':
        out->append(quotes ? "\\\\" : "\\");
        return;
      case '\'':
        out->append(quotes ? "\\'" : "'");
        return;
      case '"':
        out->append(quotes ? "\\\"" : "\"");
        return;
      default:
        break;
    }
    if (cp < 0x20 || cp == 0x7F) {
      out->append("\\x");
      AppendHex(cp, 2, out);
    } else {
      out->push_back(static_cast<char>(cp));
    }
    return;
  }
  if (IsInvisibleControl(cp)) {
    out->append("\\u{");
    AppendHex(cp, 4, out);
    out->push_back('}');
    return;
  }
  out->append(text.substr(i, unit.size));
}

// Escapes the longest prefix of `text` of at most `max_bytes` bytes that ends on a character
// boundary into `out`; returns how many bytes of `text` were left out.
size_t EscapePrefix(std::string_view text, size_t max_bytes, std::string* out) {
  size_t i = 0;
  while (i < text.size()) {
    const Unit unit = NextUnit(text, i);
    if (i + unit.size > max_bytes) break;
    AppendUnit(text, i, unit, /*quotes=*/true, out);
    i += unit.size;
  }
  return text.size() - i;
}

std::string MoreBytes(size_t n) { return "...(" + std::to_string(n) + " more bytes)"; }

}  // namespace

std::string Escape(std::string_view text, size_t max_bytes) {
  std::string out;
  const size_t cut = EscapePrefix(text, max_bytes, &out);
  if (cut > 0) out += MoreBytes(cut);
  return out;
}

std::string Quote(std::string_view text, size_t max_bytes) {
  std::string out = "'";
  const size_t cut = EscapePrefix(text, max_bytes, &out);
  out += "'";
  if (cut > 0) out += MoreBytes(cut);
  return out;
}

std::string BoundMessage(std::string_view message, size_t max_bytes) {
  static constexpr std::string_view kCut = "...(cut)";
  if (max_bytes < kCut.size()) max_bytes = kCut.size();
  std::string out;
  size_t keep = 0;  // the longest escaped prefix, whole characters, that leaves room for kCut
  size_t i = 0;
  while (i < message.size() && out.size() <= max_bytes) {
    const Unit unit = NextUnit(message, i);
    AppendUnit(message, i, unit, /*quotes=*/false, &out);
    i += unit.size;
    if (out.size() + kCut.size() <= max_bytes) keep = out.size();
  }
  if (i == message.size() && out.size() <= max_bytes) return out;
  out.resize(keep);
  return out + std::string(kCut);
}

Status CheckNameSize(std::string_view name, const std::string& field) {
  if (name.size() <= kMaxNameBytes) return Status::Ok();
  return InvalidArgument(field + ": " + std::to_string(name.size()) + " bytes, more than the " +
                         std::to_string(kMaxNameBytes) + " a name may have");
}

size_t Utf8SequenceLength(std::string_view text, size_t i) {
  if (i >= text.size()) return 0;
  const Unit unit = NextUnit(text, i);
  return unit.valid ? unit.size : 0;
}

bool IsValidUtf8(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    const Unit unit = NextUnit(text, i);
    if (!unit.valid) return false;
    i += unit.size;
  }
  return true;
}

}  // namespace memest
