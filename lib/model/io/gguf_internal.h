// Internal to the GGUF reader and writer (gguf.cc, gguf_writer.cc, gguf_metadata.cc): the
// format's constants and the checks both sides share, so that the writer never produces a file
// the reader refuses.
#pragma once

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lib/model/io/gguf.h"

namespace vtoken::model::gguf_internal {

inline constexpr char kMagic[4] = {'G', 'G', 'U', 'F'};
inline constexpr uint64_t kDefaultAlignment = 32;
inline constexpr const char* kAlignmentKey = "general.alignment";
inline constexpr int kMaxDims = 4;

inline bool IsValueType(uint32_t t) { return t <= static_cast<uint32_t>(GgufType::kFloat64); }

inline bool IsUnsigned(GgufType t) {
  return t == GgufType::kUint8 || t == GgufType::kUint16 || t == GgufType::kUint32 ||
         t == GgufType::kUint64;
}

// Bytes of a scalar type in the file; 0 for string and array.
inline uint64_t ScalarSize(GgufType t) {
  switch (t) {
    case GgufType::kUint8:
    case GgufType::kInt8:
    case GgufType::kBool:
      return 1;
    case GgufType::kUint16:
    case GgufType::kInt16:
      return 2;
    case GgufType::kUint32:
    case GgufType::kInt32:
    case GgufType::kFloat32:
      return 4;
    case GgufType::kUint64:
    case GgufType::kInt64:
    case GgufType::kFloat64:
      return 8;
    case GgufType::kString:
    case GgufType::kArray:
      return 0;
  }
  return 0;
}

// The fewest bytes a value of type `t` takes: a string's length field, an array's type and count.
inline uint64_t MinValueSize(GgufType t) {
  if (t == GgufType::kString) return 8;
  if (t == GgufType::kArray) return 4 + 8;
  return ScalarSize(t);
}

// The value of an unsigned-typed GgufValue, whichever field its builder filled.
inline uint64_t UnsignedOf(const GgufValue& v) {
  return v.uinteger != 0 ? v.uinteger : static_cast<uint64_t>(v.integer);
}

// An integer-typed `v`'s value when it fits in int64, else nullopt.
inline std::optional<int64_t> AsInt(const GgufValue& v) {
  if (!v.is_integer()) return std::nullopt;
  if (IsUnsigned(v.type) && UnsignedOf(v) > static_cast<uint64_t>(INT64_MAX)) return std::nullopt;
  return IsUnsigned(v.type) ? static_cast<int64_t>(UnsignedOf(v)) : v.integer;
}

// `general.alignment`'s value when it is an integer power of two, else nullopt.
inline std::optional<uint64_t> AlignmentOf(const GgufValue& v) {
  std::optional<int64_t> a = AsInt(v);
  if (!a || *a <= 0 || (*a & (*a - 1)) != 0) return std::nullopt;
  return static_cast<uint64_t>(*a);
}

// A key or tensor name as errors show it: control bytes as \xNN, at most 100 bytes, so that an
// error stays one short line whatever the file holds.
inline std::string Printable(std::string_view s) {
  constexpr size_t kMaxShown = 100;
  std::string out;
  for (size_t i = 0; i < s.size() && i < kMaxShown; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f) {
      char hex[5];
      std::snprintf(hex, sizeof(hex), "\\x%02x", c);
      out += hex;
    } else {
      out += static_cast<char>(c);
    }
  }
  if (s.size() > kMaxShown) out += "...";
  return out;
}

inline std::string Quote(std::string_view s) {
  std::string quoted = "'";  // appended, not "'" + ...: GCC 12 warns on that (-Wrestrict)
  quoted += Printable(s);
  quoted += '\'';
  return quoted;
}

// Rounds `n` up to a multiple of `alignment` (a power of two); false on overflow.
inline bool AlignUp(uint64_t n, uint64_t alignment, uint64_t* out) {
  uint64_t sum;
  if (__builtin_add_overflow(n, alignment - 1, &sum)) return false;
  *out = sum & ~(alignment - 1);
  return true;
}

// A tensor's element count and bytes from its dims and type; false on overflow.
inline bool TensorSize(const std::vector<int64_t>& dims, const GgmlTypeTraits& traits,
                       int64_t* num_elements, uint64_t* num_bytes) {
  int64_t n = 1;
  for (int64_t d : dims) {
    if (__builtin_mul_overflow(n, d, &n)) return false;
  }
  *num_elements = n;
  return !__builtin_mul_overflow(static_cast<uint64_t>(n / traits.block_size),
                                 static_cast<uint64_t>(traits.type_size), num_bytes);
}

inline std::string DimsString(const std::vector<int64_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(dims[i]);
  }
  return s + "]";
}

}  // namespace vtoken::model::gguf_internal
