// Pre-tokenization for byte-level BPE tokenizers (GPT-2, Llama 3, Qwen2, SmolLM2): the regex split
// that cuts text into pre-tokens before BPE, and GPT-2's byte <-> unicode mapping.
//
// std::regex has no \p{L} / \p{N}, so each known split regex is implemented by a hand-written
// matcher that follows the regex's leftmost-first alternation and backtracking exactly. Unicode
// classes are approximated by range tables (see IsLetter / IsNumber / IsWhitespace).
//
// All functions are pure and thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace vtoken::model {

// The splits we can match. Any other split in a tokenizer.json is rejected.
enum class SplitPattern {
  kGpt2,    // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  kLlama3,  // case-insensitive contractions, letters with one leading non-letter, \p{N}{1,3}, ...
  kQwen2,   // Llama 3's pattern with single digits (\p{N} instead of \p{N}{1,3}).
  // SmolLM2 and StarCoder: every \p{N} code point is a pre-token of its own, then GPT-2's regex
  // splits each stretch between them (Hugging Face's Sequence[Digits(individual_digits),
  // ByteLevel(use_regex)]; llama.cpp's pre-tokenizer "smollm").
  kSmolLm,
};

// Returns the exact regex string tokenizer.json uses for `pattern`; for kSmolLm, the GPT-2 regex
// its ByteLevel step runs after the digits are split off.
std::string_view SplitPatternRegex(SplitPattern pattern);

// Returns the pattern that is exactly one Split with `regex` (kGpt2, kLlama3 or kQwen2), or
// nullopt.
std::optional<SplitPattern> SplitPatternFromRegex(std::string_view regex);

// "gpt2", "llama3", "qwen2" or "smollm".
const char* SplitPatternName(SplitPattern pattern);

// Splits `text` into pre-tokens as the regex's find-all with Isolated behavior would. The pieces
// are non-empty, in order, and concatenate to `text`. Invalid UTF-8 bytes are treated one byte at
// a time as code points that are neither letter, number nor whitespace, so any byte string works.
std::vector<std::string_view> PreTokenize(SplitPattern pattern, std::string_view text);

// Unicode class approximations. Covered exactly: ASCII and Latin-1. Covered by block ranges (which
// may include a few unassigned or non-letter code points): Latin Extended A/B/Additional, IPA,
// Greek, Cyrillic, Armenian, Hebrew, Arabic, Devanagari, Thai, Georgian, Hangul, Hiragana,
// Katakana, CJK ideographs (BMP and planes 2-3), fullwidth Latin. Combining marks are not letters.
bool IsLetter(char32_t c);
// Decimal digits of the scripts above, superscripts/subscripts, vulgar fractions, Roman numerals,
// circled numbers, fullwidth digits.
bool IsNumber(char32_t c);
// The Unicode White_Space property (exact).
bool IsWhitespace(char32_t c);

// GPT-2's bytes_to_unicode: printable bytes map to themselves, the other 68 bytes to U+0100 + k.
// Returns the UTF-8 encoding of the code point that byte `b` maps to.
const std::string& ByteToUnicode(uint8_t b);

// Maps every byte of `bytes` through ByteToUnicode and concatenates the UTF-8 results.
std::string ByteLevelEncode(std::string_view bytes);

// Inverse of ByteLevelEncode for one code point: the byte that maps to `c`, or nullopt if `c` is
// not in the image of the mapping.
std::optional<uint8_t> UnicodeToByte(char32_t c);

// Decodes the UTF-8 sequence at the start of `s` (REQUIRES: non-empty). Returns the code point and
// its length in bytes; an invalid or truncated sequence yields {U+FFFD, 1}.
std::pair<char32_t, int> DecodeUtf8(std::string_view s);

// Appends the UTF-8 encoding of `c` to `out`.
void AppendUtf8(char32_t c, std::string& out);

}  // namespace vtoken::model
