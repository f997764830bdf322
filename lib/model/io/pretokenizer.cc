#include "lib/model/io/pretokenizer.h"

#include <algorithm>
#include <array>
#include <iterator>
#include <utility>

namespace vtoken::model {
namespace {

constexpr std::string_view kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr std::string_view kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

struct Range {
  char32_t lo, hi;  // Inclusive.
};

constexpr Range kLetterRanges[] = {
    {0x41, 0x5A},       {0x61, 0x7A},       {0xAA, 0xAA},       {0xB5, 0xB5},
    {0xBA, 0xBA},       {0xC0, 0xD6},       {0xD8, 0xF6},       {0xF8, 0x2C1},
    {0x2C6, 0x2D1},     {0x2E0, 0x2E4},     {0x2EC, 0x2EC},     {0x2EE, 0x2EE},
    {0x370, 0x374},     {0x376, 0x377},     {0x37A, 0x37D},     {0x37F, 0x37F},
    {0x386, 0x386},     {0x388, 0x38A},     {0x38C, 0x38C},     {0x38E, 0x3A1},
    {0x3A3, 0x3F5},     {0x3F7, 0x481},     {0x48A, 0x52F},     {0x531, 0x556},
    {0x560, 0x588},     {0x5D0, 0x5EA},     {0x5EF, 0x5F2},     {0x620, 0x64A},
    {0x66E, 0x66F},     {0x671, 0x6D3},     {0x6D5, 0x6D5},     {0x6E5, 0x6E6},
    {0x6EE, 0x6EF},     {0x6FA, 0x6FC},     {0x6FF, 0x6FF},     {0x904, 0x939},
    {0x93D, 0x93D},     {0x950, 0x950},     {0x958, 0x961},     {0x971, 0x980},
    {0xE01, 0xE30},     {0xE32, 0xE33},     {0xE40, 0xE46},     {0x10A0, 0x10C5},
    {0x10D0, 0x10FA},   {0x10FC, 0x10FF},   {0x1100, 0x11FF},   {0x1E00, 0x1FBC},
    {0x1FC2, 0x1FCC},   {0x1FD0, 0x1FDB},   {0x1FE0, 0x1FEC},   {0x1FF2, 0x1FFC},
    {0x2071, 0x2071},   {0x207F, 0x207F},   {0x2090, 0x209C},   {0x2102, 0x2102},
    {0x2107, 0x2107},   {0x210A, 0x2113},   {0x2115, 0x2115},   {0x2119, 0x211D},
    {0x2124, 0x2124},   {0x2126, 0x2126},   {0x2128, 0x2128},   {0x212A, 0x212D},
    {0x212F, 0x2139},   {0x2183, 0x2184},   {0x3005, 0x3006},   {0x3041, 0x3096},
    {0x309D, 0x309F},   {0x30A1, 0x30FA},   {0x30FC, 0x30FF},   {0x3105, 0x312F},
    {0x3131, 0x318E},   {0x3400, 0x4DBF},   {0x4E00, 0x9FFF},   {0xA000, 0xA48C},
    {0xAC00, 0xD7A3},   {0xF900, 0xFA6D},   {0xFA70, 0xFAD9},   {0xFF21, 0xFF3A},
    {0xFF41, 0xFF5A},   {0xFF66, 0xFFBE},   {0x20000, 0x2A6DF}, {0x2A700, 0x2EBE0},
    {0x2F800, 0x2FA1D}, {0x30000, 0x3134A},
};

constexpr Range kNumberRanges[] = {
    {0x30, 0x39},     {0xB2, 0xB3},     {0xB9, 0xB9},     {0xBC, 0xBE},     {0x660, 0x669},
    {0x6F0, 0x6F9},   {0x966, 0x96F},   {0xE50, 0xE59},   {0x2070, 0x2070}, {0x2074, 0x2079},
    {0x2080, 0x2089}, {0x2150, 0x2182}, {0x2185, 0x2189}, {0x2460, 0x249B}, {0x24EA, 0x24FF},
    {0x2776, 0x2793}, {0x3007, 0x3007}, {0x3021, 0x3029}, {0x3038, 0x303A}, {0x3192, 0x3195},
    {0x3220, 0x3229}, {0x3248, 0x324F}, {0x3251, 0x325F}, {0x3280, 0x3289}, {0x32B1, 0x32BF},
    {0xFF10, 0xFF19},
};

constexpr Range kWhitespaceRanges[] = {
    {0x9, 0xD},       {0x20, 0x20},     {0x85, 0x85},     {0xA0, 0xA0},     {0x1680, 0x1680},
    {0x2000, 0x200A}, {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000},
};

template <size_t N>
bool InRanges(const Range (&ranges)[N], char32_t c) {
  auto it = std::upper_bound(std::begin(ranges), std::end(ranges), c,
                             [](char32_t v, const Range& r) { return v < r.lo; });
  return it != std::begin(ranges) && c <= std::prev(it)->hi;
}

enum class Cls : uint8_t { kLetter, kNumber, kSpace, kOther };

Cls Classify(char32_t c) {
  if (IsLetter(c)) return Cls::kLetter;
  if (IsNumber(c)) return Cls::kNumber;
  if (IsWhitespace(c)) return Cls::kSpace;
  return Cls::kOther;
}

// The text as code points, with their classes and byte offsets (offsets has one extra entry).
struct CodePoints {
  std::vector<char32_t> cp;
  std::vector<Cls> cls;
  std::vector<size_t> offset;

  explicit CodePoints(std::string_view text) {
    cp.reserve(text.size());
    cls.reserve(text.size());
    offset.reserve(text.size() + 1);
    size_t i = 0;
    while (i < text.size()) {
      auto [c, len] = DecodeUtf8(text.substr(i));
      cp.push_back(c);
      // An invalid byte decodes as U+FFFD, which is class "other" like the replacement char.
      cls.push_back(Classify(c));
      offset.push_back(i);
      i += len;
    }
    offset.push_back(text.size());
  }
  size_t size() const { return cp.size(); }
};

// Length of the run of code points starting at i satisfying pred.
template <typename Pred>
size_t RunLength(const CodePoints& t, size_t i, Pred pred) {
  size_t j = i;
  while (j < t.size() && pred(j)) ++j;
  return j - i;
}

char32_t AsciiLower(char32_t c) { return (c >= 'A' && c <= 'Z') ? c + 32 : c; }

// Length of a contraction ('s 't 're 've 'm 'll 'd) at i, or 0.
size_t MatchContraction(const CodePoints& t, size_t i, bool case_insensitive) {
  if (t.cp[i] != '\'' || i + 1 >= t.size()) return 0;
  auto at = [&](size_t k) {
    if (k >= t.size()) return char32_t{0};
    return case_insensitive ? AsciiLower(t.cp[k]) : t.cp[k];
  };
  char32_t c1 = at(i + 1);
  if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return 2;
  char32_t c2 = at(i + 2);
  if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return 3;
  return 0;
}

// \s+(?!\S) followed by \s+: a whitespace run, minus its last character when a non-space follows
// (the lookahead backtracks one step), unless the run is a single character.
size_t MatchTrailingWhitespace(const CodePoints& t, size_t i) {
  size_t k = RunLength(t, i, [&](size_t j) { return t.cls[j] == Cls::kSpace; });
  if (i + k < t.size() && k >= 2) return k - 1;
  return k;
}

// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
size_t MatchGpt2(const CodePoints& t, size_t i) {
  if (size_t n = MatchContraction(t, i, /*case_insensitive=*/false)) return n;
  size_t s = (t.cp[i] == ' ' && i + 1 < t.size()) ? i + 1 : i;
  for (Cls c : {Cls::kLetter, Cls::kNumber, Cls::kOther}) {
    // The optional space is greedy; without it the space itself cannot start these classes.
    if (t.cls[s] == c) return s - i + RunLength(t, s, [&](size_t j) { return t.cls[j] == c; });
  }
  return MatchTrailingWhitespace(t, i);
}

// Llama 3 (max_digits 3) and Qwen2 (max_digits 1):
// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max_digits}|
//  ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
size_t MatchLlama3(const CodePoints& t, size_t i, size_t max_digits) {
  if (size_t n = MatchContraction(t, i, /*case_insensitive=*/true)) return n;
  auto is_letter = [&](size_t j) { return t.cls[j] == Cls::kLetter; };
  auto is_newline = [&](size_t j) { return t.cp[j] == '\r' || t.cp[j] == '\n'; };
  if (t.cls[i] == Cls::kLetter) return RunLength(t, i, is_letter);
  if (t.cls[i] != Cls::kNumber && !is_newline(i) && i + 1 < t.size() && is_letter(i + 1)) {
    return 1 + RunLength(t, i + 1, is_letter);
  }
  if (t.cls[i] == Cls::kNumber) {
    return std::min(max_digits,
                    RunLength(t, i, [&](size_t j) { return t.cls[j] == Cls::kNumber; }));
  }
  size_t s = (t.cp[i] == ' ' && i + 1 < t.size() && t.cls[i + 1] == Cls::kOther) ? i + 1 : i;
  if (t.cls[s] == Cls::kOther) {
    size_t e = s + RunLength(t, s, [&](size_t j) { return t.cls[j] == Cls::kOther; });
    return e - i + RunLength(t, e, is_newline);
  }
  // Only whitespace is left. \s*[\r\n]+ ends right after the run's last newline, if it has one.
  size_t k = RunLength(t, i, [&](size_t j) { return t.cls[j] == Cls::kSpace; });
  for (size_t j = i + k; j > i; --j) {
    if (is_newline(j - 1)) return j - i;
  }
  return MatchTrailingWhitespace(t, i);
}

// The find-all of one regex, given its matcher: the match length at code point i (always >= 1:
// every code point starts a match of some alternative, so the pieces tile the text).
template <typename Matcher>
std::vector<std::string_view> SplitByMatcher(std::string_view text, Matcher match) {
  CodePoints t(text);
  std::vector<std::string_view> pieces;
  for (size_t i = 0; i < t.size();) {
    size_t n = match(t, i);
    pieces.push_back(text.substr(t.offset[i], t.offset[i + n] - t.offset[i]));
    i += n;
  }
  return pieces;
}

// kSmolLm: each number code point alone, and GPT-2's regex on each stretch between them. The
// stretches are split separately: a lookahead never sees past a digit (" 1" is " ", "1").
std::vector<std::string_view> PreTokenizeDigitsThenGpt2(std::string_view text) {
  std::vector<std::string_view> pieces;
  size_t stretch_start = 0;
  auto flush = [&](size_t end) {
    std::string_view stretch = text.substr(stretch_start, end - stretch_start);
    for (std::string_view piece : SplitByMatcher(stretch, MatchGpt2)) pieces.push_back(piece);
  };
  for (size_t i = 0; i < text.size();) {
    auto [c, len] = DecodeUtf8(text.substr(i));
    if (IsNumber(c)) {
      flush(i);
      pieces.push_back(text.substr(i, len));
      stretch_start = i + len;
    }
    i += len;
  }
  flush(text.size());
  return pieces;
}

std::array<std::string, 256> BuildByteToUnicode() {
  std::array<std::string, 256> table;
  int next = 0;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    char32_t c = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + next++);
    AppendUtf8(c, table[b]);
  }
  return table;
}

const std::array<std::string, 256>& ByteToUnicodeTable() {
  static const std::array<std::string, 256> table = BuildByteToUnicode();
  return table;
}

}  // namespace

std::string_view SplitPatternRegex(SplitPattern pattern) {
  switch (pattern) {
    case SplitPattern::kGpt2:
    case SplitPattern::kSmolLm:
      return kGpt2Regex;
    case SplitPattern::kLlama3:
      return kLlama3Regex;
    case SplitPattern::kQwen2:
      return kQwen2Regex;
  }
  return {};
}

std::optional<SplitPattern> SplitPatternFromRegex(std::string_view regex) {
  for (SplitPattern p : {SplitPattern::kGpt2, SplitPattern::kLlama3, SplitPattern::kQwen2}) {
    if (regex == SplitPatternRegex(p)) return p;
  }
  return std::nullopt;
}

const char* SplitPatternName(SplitPattern pattern) {
  switch (pattern) {
    case SplitPattern::kGpt2:
      return "gpt2";
    case SplitPattern::kLlama3:
      return "llama3";
    case SplitPattern::kQwen2:
      return "qwen2";
    case SplitPattern::kSmolLm:
      return "smollm";
  }
  return "?";
}

std::vector<std::string_view> PreTokenize(SplitPattern pattern, std::string_view text) {
  switch (pattern) {
    case SplitPattern::kGpt2:
      return SplitByMatcher(text, MatchGpt2);
    case SplitPattern::kLlama3:
      return SplitByMatcher(text,
                            [](const CodePoints& t, size_t i) { return MatchLlama3(t, i, 3); });
    case SplitPattern::kQwen2:
      return SplitByMatcher(text,
                            [](const CodePoints& t, size_t i) { return MatchLlama3(t, i, 1); });
    case SplitPattern::kSmolLm:
      return PreTokenizeDigitsThenGpt2(text);
  }
  return {};
}

bool IsLetter(char32_t c) {
  if (c < 0x80) return (c | 0x20) >= 'a' && (c | 0x20) <= 'z';
  return InRanges(kLetterRanges, c);
}

bool IsNumber(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  return InRanges(kNumberRanges, c);
}

bool IsWhitespace(char32_t c) {
  if (c < 0x80) return c == ' ' || (c >= 0x9 && c <= 0xD);
  return InRanges(kWhitespaceRanges, c);
}

const std::string& ByteToUnicode(uint8_t b) { return ByteToUnicodeTable()[b]; }

std::string ByteLevelEncode(std::string_view bytes) {
  const auto& table = ByteToUnicodeTable();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char ch : bytes) out += table[static_cast<uint8_t>(ch)];
  return out;
}

std::optional<uint8_t> UnicodeToByte(char32_t c) {
  static const std::array<int, 324> inverse = [] {
    std::array<int, 324> inv;
    inv.fill(-1);
    for (int b = 0; b < 256; ++b) inv[DecodeUtf8(ByteToUnicodeTable()[b]).first] = b;
    return inv;
  }();
  if (c >= inverse.size() || inverse[c] < 0) return std::nullopt;
  return static_cast<uint8_t>(inverse[c]);
}

std::pair<char32_t, int> DecodeUtf8(std::string_view s) {
  constexpr std::pair<char32_t, int> kInvalid{0xFFFD, 1};
  auto byte = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  uint8_t b0 = byte(0);
  if (b0 < 0x80) return {b0, 1};
  int len;
  char32_t c;
  char32_t min;
  if ((b0 & 0xE0) == 0xC0) {
    len = 2, c = b0 & 0x1F, min = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    len = 3, c = b0 & 0x0F, min = 0x800;
  } else if ((b0 & 0xF8) == 0xF0) {
    len = 4, c = b0 & 0x07, min = 0x10000;
  } else {
    return kInvalid;
  }
  if (s.size() < static_cast<size_t>(len)) return kInvalid;
  for (int k = 1; k < len; ++k) {
    if ((byte(k) & 0xC0) != 0x80) return kInvalid;
    c = (c << 6) | (byte(k) & 0x3F);
  }
  // Overlong forms, surrogates and values past U+10FFFF are not valid UTF-8.
  if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return kInvalid;
  return {c, len};
}

void AppendUtf8(char32_t c, std::string& out) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

}  // namespace vtoken::model
