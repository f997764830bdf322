#include "lib/model/io/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <utility>

namespace vtoken::model {

// The reader copies little-endian fields with memcpy and hands out raw tensor bytes.
static_assert(std::endian::native == std::endian::little, "GGUF I/O assumes little-endian");

namespace {

constexpr char kMagic[4] = {'G', 'G', 'U', 'F'};
constexpr uint64_t kDefaultAlignment = 32;
constexpr const char* kAlignmentKey = "general.alignment";
constexpr int kMaxDims = 4;
// The smallest encodings, for checking a count against the bytes left before reading it:
// a metadata entry is a key (length only), a type and a one-byte value; a tensor info is a name
// (length only), n_dims, one dimension, a type and an offset.
constexpr uint64_t kMinMetadataEntryBytes = 8 + 4 + 1;
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;

struct GgmlTypeRow {
  uint32_t id;
  GgmlTypeTraits traits;
};
// gguf-py 0.19's GGML_QUANT_SIZES (scripts/check-gguf-dequant.py compares them).
constexpr GgmlTypeRow kGgmlTypes[] = {
    {0, {"F32", 1, 4}},         {1, {"F16", 1, 2}},         {2, {"Q4_0", 32, 18}},
    {3, {"Q4_1", 32, 20}},      {6, {"Q5_0", 32, 22}},      {7, {"Q5_1", 32, 24}},
    {8, {"Q8_0", 32, 34}},      {9, {"Q8_1", 32, 40}},      {10, {"Q2_K", 256, 84}},
    {11, {"Q3_K", 256, 110}},   {12, {"Q4_K", 256, 144}},   {13, {"Q5_K", 256, 176}},
    {14, {"Q6_K", 256, 210}},   {15, {"Q8_K", 256, 292}},   {16, {"IQ2_XXS", 256, 66}},
    {17, {"IQ2_XS", 256, 74}},  {18, {"IQ3_XXS", 256, 98}}, {19, {"IQ1_S", 256, 50}},
    {20, {"IQ4_NL", 32, 18}},   {21, {"IQ3_S", 256, 110}},  {22, {"IQ2_S", 256, 82}},
    {23, {"IQ4_XS", 256, 136}}, {24, {"I8", 1, 1}},         {25, {"I16", 1, 2}},
    {26, {"I32", 1, 4}},        {27, {"I64", 1, 8}},        {28, {"F64", 1, 8}},
    {29, {"IQ1_M", 256, 56}},   {30, {"BF16", 1, 2}},       {34, {"TQ1_0", 256, 54}},
    {35, {"TQ2_0", 256, 66}},   {39, {"MXFP4", 32, 17}},    {40, {"NVFP4", 64, 36}},
    {41, {"Q1_0", 128, 18}},
};

bool IsValueType(uint32_t t) { return t <= static_cast<uint32_t>(GgufType::kFloat64); }

bool IsUnsigned(GgufType t) {
  return t == GgufType::kUint8 || t == GgufType::kUint16 || t == GgufType::kUint32 ||
         t == GgufType::kUint64;
}

// Bytes of a scalar type in the file; 0 for string and array.
uint64_t ScalarSize(GgufType t) {
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
uint64_t MinValueSize(GgufType t) {
  if (t == GgufType::kString) return 8;
  if (t == GgufType::kArray) return 4 + 8;
  return ScalarSize(t);
}

// A key or tensor name as errors show it: control bytes as \xNN, at most 100 bytes, so that an
// error stays one short line whatever the file holds.
std::string Printable(std::string_view s) {
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

std::string Quote(std::string_view s) { return "'" + Printable(s) + "'"; }

// Field names for errors: "metadata 3 (general.name)", "tensor 3 (blk.0.attn_q.weight)".
std::string Entry(const char* kind, uint64_t index, std::string_view name) {
  std::string s = std::string(kind) + " " + std::to_string(index);
  if (!name.empty()) s += " (" + Printable(name) + ")";
  return s;
}

// Rounds `n` up to a multiple of `alignment` (a power of two); false on overflow.
bool AlignUp(uint64_t n, uint64_t alignment, uint64_t* out) {
  uint64_t sum;
  if (__builtin_add_overflow(n, alignment - 1, &sum)) return false;
  *out = sum & ~(alignment - 1);
  return true;
}

// Names a field in an error: `base` ("metadata 3 (key)", "tensor 0 (x) dims[1]"), then the
// indices of an array element ("[2][5]") and `suffix` (" array count"). Built only for an error,
// so that reading a 200,000-token vocabulary formats no names.
struct Field {
  Field(const char* base) : base(base) {}         // NOLINT(google-explicit-constructor)
  Field(const std::string& base) : base(base) {}  // NOLINT(google-explicit-constructor)
  Field(std::string_view base, std::span<const uint64_t> index, const char* suffix = "")
      : base(base), index(index), suffix(suffix) {}

  std::string str() const {
    std::string s(base);
    for (uint64_t i : index) {
      s += '[';
      s += std::to_string(i);
      s += ']';
    }
    return s + suffix;
  }

  std::string_view base;  // may point into a temporary: a Field lives for one call
  std::span<const uint64_t> index;
  const char* suffix = "";
};

// Reads the header, metadata and tensor infos of a mapped file, checking each field against the
// bytes left before using it.
class Parser {
 public:
  Parser(const std::string& path, const std::byte* base, uint64_t size)
      : path_(path), base_(base), size_(size) {}

  uint64_t pos() const { return pos_; }
  uint64_t left() const { return size_ - pos_; }

  Status Error(uint64_t at, const Field& field, const std::string& what) const {
    return DataLossError(path_ + ": " + field.str() + " at byte " + std::to_string(at) + ": " +
                         what);
  }

  // Advances past `n` bytes and points `*p` at them, or fails naming `field`.
  Status Take(uint64_t n, const Field& field, const std::byte** p) {
    if (n > left()) {
      return Error(pos_, field,
                   "needs " + std::to_string(n) + " bytes, the file ends " +
                       std::to_string(left()) + " bytes later");
    }
    *p = base_ + pos_;
    pos_ += n;
    return Status::Ok();
  }

  template <typename T>
  Status Read(const Field& field, T* out) {
    const std::byte* p;
    VTOKEN_RETURN_IF_ERROR(Take(sizeof(T), field, &p));
    std::memcpy(out, p, sizeof(T));
    return Status::Ok();
  }

  Status ReadString(const Field& field, std::string* out) {
    const uint64_t at = pos_;
    uint64_t length;
    VTOKEN_RETURN_IF_ERROR(Read(field, &length));
    if (length > left()) {
      return Error(at, field,
                   "string length " + std::to_string(length) + " runs past the end of the file (" +
                       std::to_string(left()) + " bytes left)");
    }
    const std::byte* p;
    VTOKEN_RETURN_IF_ERROR(Take(length, field, &p));
    out->assign(reinterpret_cast<const char*>(p), length);
    return Status::Ok();
  }

  // Reads a value type, which must be one of GgufType.
  Status ReadType(const Field& field, GgufType* out) {
    const uint64_t at = pos_;
    uint32_t t;
    VTOKEN_RETURN_IF_ERROR(Read(field, &t));
    if (!IsValueType(t)) return Error(at, field, "unknown value type " + std::to_string(t));
    *out = static_cast<GgufType>(t);
    return Status::Ok();
  }

  // Reads a metadata value of `type` into `out`; `base` names the entry ("metadata 3 (key)").
  Status ReadValue(GgufType type, const std::string& base, GgufValue* out) {
    index_.clear();
    return ReadNested(type, base, out);
  }

 private:
  Status ReadNested(GgufType type, const std::string& base, GgufValue* out) {
    const Field field{base, index_};
    out->type = type;
    const uint64_t at = pos_;
    switch (type) {
      case GgufType::kUint8:
        return ReadUnsigned<uint8_t>(field, out);
      case GgufType::kUint16:
        return ReadUnsigned<uint16_t>(field, out);
      case GgufType::kUint32:
        return ReadUnsigned<uint32_t>(field, out);
      case GgufType::kUint64:
        return ReadUnsigned<uint64_t>(field, out);
      case GgufType::kInt8:
        return ReadSigned<int8_t>(field, out);
      case GgufType::kInt16:
        return ReadSigned<int16_t>(field, out);
      case GgufType::kInt32:
        return ReadSigned<int32_t>(field, out);
      case GgufType::kInt64:
        return ReadSigned<int64_t>(field, out);
      case GgufType::kFloat32: {
        float v;
        VTOKEN_RETURN_IF_ERROR(Read(field, &v));
        out->real = v;
        return Status::Ok();
      }
      case GgufType::kFloat64:
        return Read(field, &out->real);
      case GgufType::kBool: {
        uint8_t v;
        VTOKEN_RETURN_IF_ERROR(Read(field, &v));
        if (v > 1) return Error(at, field, "bool " + std::to_string(v) + " is neither 0 nor 1");
        out->boolean = v == 1;
        return Status::Ok();
      }
      case GgufType::kString:
        return ReadString(field, &out->string);
      case GgufType::kArray:
        return ReadArray(base, out);
    }
    return Error(at, field, "unknown value type");
  }

  template <typename T>
  Status ReadUnsigned(const Field& field, GgufValue* out) {
    T v = 0;
    VTOKEN_RETURN_IF_ERROR(Read(field, &v));
    out->uinteger = v;
    out->integer =
        static_cast<uint64_t>(v) <= static_cast<uint64_t>(INT64_MAX) ? static_cast<int64_t>(v) : 0;
    return Status::Ok();
  }

  template <typename T>
  Status ReadSigned(const Field& field, GgufValue* out) {
    T v = 0;
    VTOKEN_RETURN_IF_ERROR(Read(field, &v));
    out->integer = v;
    return Status::Ok();
  }

  Status ReadArray(const std::string& base, GgufValue* out) {
    VTOKEN_RETURN_IF_ERROR(ReadType(Field{base, index_, " element type"}, &out->element_type));
    const Field count_field{base, index_, " array count"};
    const uint64_t count_at = pos_;
    uint64_t count;
    VTOKEN_RETURN_IF_ERROR(Read(count_field, &count));
    const GgufType element = out->element_type;
    const uint64_t min_size = MinValueSize(element);
    if (count > left() / min_size) {
      return Error(count_at, count_field,
                   std::to_string(count) + " " + GgufTypeName(element) +
                       " elements need at least " + std::to_string(min_size) +
                       " bytes each, only " + std::to_string(left()) + " bytes left");
    }
    if (count > kGgufMaxMetadataValues - num_values_) {
      return Error(count_at, count_field,
                   std::to_string(count) + " more elements exceed the limit of " +
                       std::to_string(kGgufMaxMetadataValues) + " metadata values");
    }
    num_values_ += count;
    if (count > 0 && element == GgufType::kArray &&
        index_.size() + 2 > static_cast<size_t>(kGgufMaxArrayDepth)) {
      return Error(count_at, count_field,
                   "arrays nested deeper than " + std::to_string(kGgufMaxArrayDepth));
    }
    // The count fits the file, but a GgufValue is ~100 bytes: let a corrupt count that the
    // elements do not back fail before the vector grows to it.
    out->elements.reserve(std::min<uint64_t>(count, 1024));
    index_.push_back(0);
    for (uint64_t i = 0; i < count; ++i) {
      index_.back() = i;
      VTOKEN_RETURN_IF_ERROR(ReadNested(element, base, &out->elements.emplace_back()));
    }
    index_.pop_back();
    return Status::Ok();
  }

  const std::string& path_;
  const std::byte* base_;
  uint64_t size_;
  uint64_t pos_ = 0;
  uint64_t num_values_ = 0;      // array elements read so far
  std::vector<uint64_t> index_;  // the array element being read: [i][j]...
};

// A tensor's element count and bytes from its dims and type; false on overflow.
bool TensorSize(const std::vector<int64_t>& dims, const GgmlTypeTraits& traits,
                int64_t* num_elements, uint64_t* num_bytes) {
  int64_t n = 1;
  for (int64_t d : dims) {
    if (__builtin_mul_overflow(n, d, &n)) return false;
  }
  *num_elements = n;
  return !__builtin_mul_overflow(static_cast<uint64_t>(n / traits.block_size),
                                 static_cast<uint64_t>(traits.type_size), num_bytes);
}

std::string DimsString(const std::vector<int64_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

Status WriteAll(int fd, const void* data, size_t size, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::write(fd, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return InvalidArgumentError(path + ": write failed: " + std::strerror(errno));
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  return Status::Ok();
}

// The value of an unsigned-typed GgufValue, whichever field its builder filled.
uint64_t UnsignedOf(const GgufValue& v) {
  return v.uinteger != 0 ? v.uinteger : static_cast<uint64_t>(v.integer);
}

template <typename T>
void Append(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(v));
}

void AppendString(std::string* out, std::string_view s) {
  Append<uint64_t>(out, s.size());
  out->append(s);
}

// Appends `v` (without its type) to `out`, or fails naming `field`. `depth` counts the arrays
// around `v`, `num_values` the array elements so far: the reader's limits apply.
Status EncodeValue(const GgufValue& v, const std::string& field, int depth, uint64_t* num_values,
                   std::string* out) {
  auto range_error = [&] {
    return InvalidArgumentError(field + ": " + std::to_string(v.integer) + " is outside " +
                                GgufTypeName(v.type) + "'s range");
  };
  auto check_unsigned = [&](uint64_t max) -> StatusOr<uint64_t> {
    if (v.uinteger == 0 && v.integer < 0) return range_error();
    const uint64_t u = UnsignedOf(v);
    if (u > max) {
      return InvalidArgumentError(field + ": " + std::to_string(u) + " is outside " +
                                  GgufTypeName(v.type) + "'s range");
    }
    return u;
  };
  auto check_signed = [&](int64_t min, int64_t max) -> Status {
    if (v.integer < min || v.integer > max) return range_error();
    return Status::Ok();
  };
  switch (v.type) {
    case GgufType::kUint8:
    case GgufType::kUint16:
    case GgufType::kUint32:
    case GgufType::kUint64: {
      const uint64_t size = ScalarSize(v.type);
      const uint64_t max = size == 8 ? UINT64_MAX : (uint64_t{1} << (8 * size)) - 1;
      StatusOr<uint64_t> u = check_unsigned(max);
      if (!u.ok()) return u.status();
      out->append(reinterpret_cast<const char*>(&*u), size);
      return Status::Ok();
    }
    case GgufType::kInt8:
      VTOKEN_RETURN_IF_ERROR(check_signed(INT8_MIN, INT8_MAX));
      Append(out, static_cast<int8_t>(v.integer));
      return Status::Ok();
    case GgufType::kInt16:
      VTOKEN_RETURN_IF_ERROR(check_signed(INT16_MIN, INT16_MAX));
      Append(out, static_cast<int16_t>(v.integer));
      return Status::Ok();
    case GgufType::kInt32:
      VTOKEN_RETURN_IF_ERROR(check_signed(INT32_MIN, INT32_MAX));
      Append(out, static_cast<int32_t>(v.integer));
      return Status::Ok();
    case GgufType::kInt64:
      Append(out, v.integer);
      return Status::Ok();
    case GgufType::kFloat32:
      Append(out, static_cast<float>(v.real));
      return Status::Ok();
    case GgufType::kFloat64:
      Append(out, v.real);
      return Status::Ok();
    case GgufType::kBool:
      Append<uint8_t>(out, v.boolean ? 1 : 0);
      return Status::Ok();
    case GgufType::kString:
      AppendString(out, v.string);
      return Status::Ok();
    case GgufType::kArray:
      if (!IsValueType(static_cast<uint32_t>(v.element_type))) {
        return InvalidArgumentError(field + ": unknown element type " +
                                    std::to_string(static_cast<uint32_t>(v.element_type)));
      }
      if (depth + 1 > kGgufMaxArrayDepth) {
        return InvalidArgumentError(field + ": arrays nested deeper than " +
                                    std::to_string(kGgufMaxArrayDepth));
      }
      *num_values += v.elements.size();
      if (*num_values > kGgufMaxMetadataValues) {
        return InvalidArgumentError(field + ": more than " +
                                    std::to_string(kGgufMaxMetadataValues) + " metadata values");
      }
      Append(out, static_cast<uint32_t>(v.element_type));
      Append<uint64_t>(out, v.elements.size());
      for (size_t i = 0; i < v.elements.size(); ++i) {
        const std::string element_field = field + "[" + std::to_string(i) + "]";
        if (v.elements[i].type != v.element_type) {
          return InvalidArgumentError(element_field + ": " + GgufTypeName(v.elements[i].type) +
                                      " in an array of " + GgufTypeName(v.element_type));
        }
        VTOKEN_RETURN_IF_ERROR(
            EncodeValue(v.elements[i], element_field, depth + 1, num_values, out));
      }
      return Status::Ok();
  }
  return InvalidArgumentError(field + ": unknown value type " +
                              std::to_string(static_cast<uint32_t>(v.type)));
}

}  // namespace

const char* GgufTypeName(GgufType type) {
  switch (type) {
    case GgufType::kUint8:
      return "uint8";
    case GgufType::kInt8:
      return "int8";
    case GgufType::kUint16:
      return "uint16";
    case GgufType::kInt16:
      return "int16";
    case GgufType::kUint32:
      return "uint32";
    case GgufType::kInt32:
      return "int32";
    case GgufType::kFloat32:
      return "float32";
    case GgufType::kBool:
      return "bool";
    case GgufType::kString:
      return "string";
    case GgufType::kArray:
      return "array";
    case GgufType::kUint64:
      return "uint64";
    case GgufType::kInt64:
      return "int64";
    case GgufType::kFloat64:
      return "float64";
  }
  return "unknown";
}

bool GgufValue::is_integer() const {
  return ScalarSize(type) > 0 && type != GgufType::kFloat32 && type != GgufType::kFloat64 &&
         type != GgufType::kBool;
}

GgufValue GgufValue::Uint32(uint32_t v) { return Integer(GgufType::kUint32, v); }
GgufValue GgufValue::Int32(int32_t v) { return Integer(GgufType::kInt32, v); }

GgufValue GgufValue::Uint64(uint64_t v) {
  GgufValue value;
  value.type = GgufType::kUint64;
  value.uinteger = v;
  value.integer = v <= static_cast<uint64_t>(INT64_MAX) ? static_cast<int64_t>(v) : 0;
  return value;
}

GgufValue GgufValue::Integer(GgufType type, int64_t v) {
  GgufValue value;
  value.type = type;
  value.integer = v;
  if (IsUnsigned(type) && v >= 0) value.uinteger = static_cast<uint64_t>(v);
  return value;
}

GgufValue GgufValue::Float32(float v) {
  GgufValue value;
  value.type = GgufType::kFloat32;
  value.real = v;
  return value;
}

GgufValue GgufValue::Float64(double v) {
  GgufValue value;
  value.type = GgufType::kFloat64;
  value.real = v;
  return value;
}

GgufValue GgufValue::Bool(bool v) {
  GgufValue value;
  value.type = GgufType::kBool;
  value.boolean = v;
  return value;
}

GgufValue GgufValue::String(std::string v) {
  GgufValue value;
  value.type = GgufType::kString;
  value.string = std::move(v);
  return value;
}

GgufValue GgufValue::Array(GgufType element_type, std::vector<GgufValue> elements) {
  GgufValue value;
  value.type = GgufType::kArray;
  value.element_type = element_type;
  value.elements = std::move(elements);
  return value;
}

GgufValue GgufValue::StringArray(const std::vector<std::string>& v) {
  std::vector<GgufValue> elements;
  elements.reserve(v.size());
  for (const std::string& s : v) elements.push_back(String(s));
  return Array(GgufType::kString, std::move(elements));
}

GgufValue GgufValue::Int32Array(const std::vector<int32_t>& v) {
  std::vector<GgufValue> elements;
  elements.reserve(v.size());
  for (int32_t x : v) elements.push_back(Int32(x));
  return Array(GgufType::kInt32, std::move(elements));
}

GgufValue GgufValue::Float32Array(const std::vector<float>& v) {
  std::vector<GgufValue> elements;
  elements.reserve(v.size());
  for (float x : v) elements.push_back(Float32(x));
  return Array(GgufType::kFloat32, std::move(elements));
}

void GgufMetadata::Set(const std::string& key, GgufValue value) {
  auto [it, inserted] = values_.insert_or_assign(key, std::move(value));
  if (inserted) order_.push_back(key);
}

const GgufValue* GgufMetadata::Find(std::string_view key) const {
  auto it = values_.find(key);
  return it == values_.end() ? nullptr : &it->second;
}

namespace {

// Why `v` is not of the requested kind: "metadata 'k' is string, not an integer".
Status WrongType(std::string_view key, const GgufValue& v, const char* wanted) {
  std::string have = GgufTypeName(v.type);
  if (v.type == GgufType::kArray) have += std::string(" of ") + GgufTypeName(v.element_type);
  return InvalidArgumentError("metadata " + Quote(key) + " is " + have + ", not " + wanted);
}

std::optional<int64_t> AsInt(const GgufValue& v) {
  if (!v.is_integer()) return std::nullopt;
  if (IsUnsigned(v.type) && UnsignedOf(v) > static_cast<uint64_t>(INT64_MAX)) return std::nullopt;
  return IsUnsigned(v.type) ? static_cast<int64_t>(UnsignedOf(v)) : v.integer;
}

std::optional<double> AsFloat(const GgufValue& v) {
  if (v.type == GgufType::kFloat32 || v.type == GgufType::kFloat64) return v.real;
  if (!v.is_integer()) return std::nullopt;
  return IsUnsigned(v.type) ? static_cast<double>(UnsignedOf(v)) : static_cast<double>(v.integer);
}

}  // namespace

StatusOr<std::string> GgufMetadata::GetString(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return NotFoundError("metadata key " + Quote(key) + " not found");
  if (v->type != GgufType::kString) return WrongType(key, *v, "string");
  return v->string;
}

StatusOr<int64_t> GgufMetadata::GetInt(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return NotFoundError("metadata key " + Quote(key) + " not found");
  if (!v->is_integer()) return WrongType(key, *v, "an integer");
  std::optional<int64_t> n = AsInt(*v);
  if (!n) {
    return InvalidArgumentError("metadata " + Quote(key) + " is uint64 " +
                                std::to_string(v->uinteger) + ", above INT64_MAX");
  }
  return *n;
}

StatusOr<double> GgufMetadata::GetFloat(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return NotFoundError("metadata key " + Quote(key) + " not found");
  std::optional<double> x = AsFloat(*v);
  if (!x) return WrongType(key, *v, "a float or integer");
  return *x;
}

StatusOr<bool> GgufMetadata::GetBool(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return NotFoundError("metadata key " + Quote(key) + " not found");
  if (v->type != GgufType::kBool) return WrongType(key, *v, "bool");
  return v->boolean;
}

StatusOr<std::vector<std::string>> GgufMetadata::GetStringArray(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return NotFoundError("metadata key " + Quote(key) + " not found");
  if (v->type != GgufType::kArray || v->element_type != GgufType::kString) {
    return WrongType(key, *v, "an array of string");
  }
  std::vector<std::string> out;
  out.reserve(v->elements.size());
  for (const GgufValue& e : v->elements) out.push_back(e.string);
  return out;
}

StatusOr<std::vector<int64_t>> GgufMetadata::GetIntArray(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return NotFoundError("metadata key " + Quote(key) + " not found");
  if (v->type != GgufType::kArray) return WrongType(key, *v, "an array of integers");
  std::vector<int64_t> out;
  out.reserve(v->elements.size());
  for (size_t i = 0; i < v->elements.size(); ++i) {
    std::optional<int64_t> n = AsInt(v->elements[i]);
    if (!n) {
      return InvalidArgumentError("metadata " + Quote(key) + "[" + std::to_string(i) +
                                  "] is not an integer that fits in int64 (array of " +
                                  GgufTypeName(v->element_type) + ")");
    }
    out.push_back(*n);
  }
  return out;
}

StatusOr<std::vector<double>> GgufMetadata::GetFloatArray(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return NotFoundError("metadata key " + Quote(key) + " not found");
  if (v->type != GgufType::kArray) return WrongType(key, *v, "an array of floats");
  std::vector<double> out;
  out.reserve(v->elements.size());
  for (const GgufValue& e : v->elements) {
    std::optional<double> x = AsFloat(e);
    if (!x) return WrongType(key, *v, "an array of floats or integers");
    out.push_back(*x);
  }
  return out;
}

std::optional<GgmlTypeTraits> GgmlTypeInfo(uint32_t type) {
  for (const GgmlTypeRow& row : kGgmlTypes) {
    if (row.id == type) return row.traits;
  }
  return std::nullopt;
}

int64_t GgufTensor::num_elements() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

StatusOr<GgufFile> GgufFile::Open(const std::string& path) {
  GgufFile file;
  file.path_ = path;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return NotFoundError(path + ": no such file");
    return InvalidArgumentError(path + ": cannot open: " + std::strerror(errno));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return InvalidArgumentError(path + ": cannot stat: " + std::strerror(err));
  }
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (file_size > 0) {  // mmap refuses an empty mapping; the parser reports the empty file.
    void* map = ::mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int map_errno = errno;
    ::close(fd);  // The mapping keeps the file alive.
    if (map == MAP_FAILED) {
      return InvalidArgumentError(path + ": mmap failed: " + std::strerror(map_errno));
    }
    file.map_ = map;
    file.map_size_ = file_size;
  } else {
    ::close(fd);
  }
  const auto* base = static_cast<const std::byte*>(file.map_);
  Parser p(path, base, file_size);

  const std::byte* magic;
  VTOKEN_RETURN_IF_ERROR(p.Take(4, "magic", &magic));
  if (std::memcmp(magic, kMagic, 4) != 0) {
    char shown[4 * 4 + 1] = {};
    for (int i = 0; i < 4; ++i) {
      std::snprintf(shown + 4 * i, 5, "\\x%02x", static_cast<unsigned>(magic[i]));
    }
    return p.Error(0, "magic", std::string(shown) + " is not \"GGUF\"");
  }
  VTOKEN_RETURN_IF_ERROR(p.Read("version", &file.version_));
  if (file.version_ != 2 && file.version_ != 3) {
    std::string hint;
    if (file.version_ == 1) hint = " (version 1 used 32-bit counts)";
    if (__builtin_bswap32(file.version_) == 2 || __builtin_bswap32(file.version_) == 3) {
      hint = " (a big-endian file?)";
    }
    return InvalidArgumentError(path + ": version at byte 4: GGUF version " +
                                std::to_string(file.version_) + " is not supported (only 2 and 3)" +
                                hint);
  }
  uint64_t num_tensors, num_entries;
  VTOKEN_RETURN_IF_ERROR(p.Read("tensor count", &num_tensors));
  VTOKEN_RETURN_IF_ERROR(p.Read("metadata count", &num_entries));
  if (num_tensors > p.left() / kMinTensorInfoBytes) {
    return p.Error(8, "tensor count",
                   std::to_string(num_tensors) + " tensors need at least " +
                       std::to_string(kMinTensorInfoBytes) + " bytes each, only " +
                       std::to_string(p.left()) + " bytes left");
  }
  if (num_entries > (p.left() - num_tensors * kMinTensorInfoBytes) / kMinMetadataEntryBytes) {
    return p.Error(16, "metadata count",
                   std::to_string(num_entries) + " entries need at least " +
                       std::to_string(kMinMetadataEntryBytes) + " bytes each, only " +
                       std::to_string(p.left()) + " bytes left (less the " +
                       std::to_string(num_tensors) + " tensor infos)");
  }

  uint64_t alignment_at = 0;
  for (uint64_t i = 0; i < num_entries; ++i) {
    const uint64_t key_at = p.pos();
    std::string key;
    VTOKEN_RETURN_IF_ERROR(p.ReadString(Entry("metadata", i, "") + " key", &key));
    const std::string field = Entry("metadata", i, key);
    if (file.metadata_.Has(key)) return p.Error(key_at, field, "duplicate key");
    GgufValue value;
    VTOKEN_RETURN_IF_ERROR(p.ReadType(field + " type", &value.type));
    if (key == kAlignmentKey) alignment_at = p.pos();
    VTOKEN_RETURN_IF_ERROR(p.ReadValue(value.type, field, &value));
    file.metadata_.Set(key, std::move(value));
  }
  if (const GgufValue* v = file.metadata_.Find(kAlignmentKey)) {
    std::optional<int64_t> a = AsInt(*v);
    if (!a || *a <= 0 || !std::has_single_bit(static_cast<uint64_t>(*a))) {
      const std::string shown = !v->is_integer()      ? std::string("a ") + GgufTypeName(v->type)
                                : IsUnsigned(v->type) ? std::to_string(UnsignedOf(*v))
                                                      : std::to_string(v->integer);
      return p.Error(alignment_at, kAlignmentKey, shown + " is not an integer power of two");
    }
    file.alignment_ = static_cast<uint64_t>(*a);
  }

  struct Layout {
    uint64_t offset_at;   // where the offset field was read
    uint64_t begin, end;  // relative to the data area
  };
  std::vector<Layout> layouts;
  layouts.reserve(num_tensors);
  file.tensors_.reserve(num_tensors);
  for (uint64_t i = 0; i < num_tensors; ++i) {
    GgufTensor t;
    const uint64_t name_at = p.pos();
    VTOKEN_RETURN_IF_ERROR(p.ReadString(Entry("tensor", i, "") + " name", &t.name));
    const std::string field = Entry("tensor", i, t.name);
    if (file.index_.count(t.name) != 0) return p.Error(name_at, field, "duplicate tensor name");
    const uint64_t n_dims_at = p.pos();
    uint32_t n_dims;
    VTOKEN_RETURN_IF_ERROR(p.Read(field + " n_dims", &n_dims));
    if (n_dims < 1 || n_dims > kMaxDims) {
      return p.Error(n_dims_at, field + " n_dims",
                     std::to_string(n_dims) + " is outside 1.." + std::to_string(kMaxDims));
    }
    uint64_t dims_at[kMaxDims];
    int64_t num_elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const std::string dim_field = field + " dims[" + std::to_string(d) + "]";
      dims_at[d] = p.pos();
      uint64_t dim;
      VTOKEN_RETURN_IF_ERROR(p.Read(dim_field, &dim));
      if (dim < 1 || dim > static_cast<uint64_t>(INT64_MAX)) {
        return p.Error(dims_at[d], dim_field,
                       "dimension " + std::to_string(dim) + " is outside 1..INT64_MAX");
      }
      t.dims.push_back(static_cast<int64_t>(dim));
      if (__builtin_mul_overflow(num_elements, t.dims.back(), &num_elements)) {
        return p.Error(dims_at[d], dim_field,
                       "dims " + DimsString(t.dims) + " hold more than INT64_MAX elements");
      }
    }
    const uint64_t type_at = p.pos();
    uint32_t type;
    VTOKEN_RETURN_IF_ERROR(p.Read(field + " type", &type));
    std::optional<GgmlTypeTraits> traits = GgmlTypeInfo(type);
    if (!traits)
      return p.Error(type_at, field + " type", "unknown ggml type " + std::to_string(type));
    t.type = static_cast<GgmlType>(type);
    if (t.dims[0] % traits->block_size != 0) {
      return p.Error(dims_at[0], field + " dims[0]",
                     "row of " + std::to_string(t.dims[0]) + " elements is not a multiple of " +
                         traits->name + "'s block size " + std::to_string(traits->block_size));
    }
    Layout layout;
    layout.offset_at = p.pos();
    VTOKEN_RETURN_IF_ERROR(p.Read(field + " offset", &layout.begin));
    if (layout.begin % file.alignment_ != 0) {
      return p.Error(layout.offset_at, field + " offset",
                     std::to_string(layout.begin) + " is not a multiple of the alignment " +
                         std::to_string(file.alignment_));
    }
    uint64_t num_bytes;
    if (!TensorSize(t.dims, *traits, &num_elements, &num_bytes) ||
        __builtin_add_overflow(layout.begin, num_bytes, &layout.end)) {
      return p.Error(layout.offset_at, field + " offset",
                     "the byte size of " + DimsString(t.dims) + " x " + traits->name +
                         " at offset " + std::to_string(layout.begin) + " overflows");
    }
    t.shape.assign(t.dims.rbegin(), t.dims.rend());
    file.index_[t.name] = file.tensors_.size();
    file.tensors_.push_back(std::move(t));
    layouts.push_back(layout);
  }

  if (!AlignUp(p.pos(), file.alignment_, &file.data_offset_)) {
    return p.Error(p.pos(), "data area",
                   "padding to alignment " + std::to_string(file.alignment_) + " overflows");
  }
  const uint64_t data_size = file.data_offset_ <= file_size ? file_size - file.data_offset_ : 0;
  for (size_t i = 0; i < file.tensors_.size(); ++i) {
    GgufTensor& t = file.tensors_[i];
    const Layout& layout = layouts[i];
    if (layout.end > data_size) {
      return p.Error(layout.offset_at, Entry("tensor", i, t.name) + " offset",
                     "data [" + std::to_string(layout.begin) + ", " + std::to_string(layout.end) +
                         ") of the data area at byte " + std::to_string(file.data_offset_) +
                         " runs past the end of the file (" + std::to_string(file_size) +
                         " bytes)");
    }
    t.offset = file.data_offset_ + layout.begin;
    t.bytes = std::span<const std::byte>(base + t.offset, layout.end - layout.begin);
  }
  std::vector<size_t> by_offset(file.tensors_.size());
  for (size_t i = 0; i < by_offset.size(); ++i) by_offset[i] = i;
  std::sort(by_offset.begin(), by_offset.end(), [&](size_t a, size_t b) {
    return std::pair(layouts[a].begin, a) < std::pair(layouts[b].begin, b);
  });
  for (size_t k = 1; k < by_offset.size(); ++k) {
    const size_t prev = by_offset[k - 1], cur = by_offset[k];
    if (layouts[cur].begin < layouts[prev].end) {
      const size_t later = std::max(prev, cur), earlier = std::min(prev, cur);
      return p.Error(layouts[later].offset_at,
                     Entry("tensor", later, file.tensors_[later].name) + " offset",
                     "data [" + std::to_string(layouts[later].begin) + ", " +
                         std::to_string(layouts[later].end) + ") overlaps " +
                         Entry("tensor", earlier, file.tensors_[earlier].name) + " [" +
                         std::to_string(layouts[earlier].begin) + ", " +
                         std::to_string(layouts[earlier].end) + ")");
    }
  }
  return file;
}

GgufFile::GgufFile(GgufFile&& other) noexcept { *this = std::move(other); }

GgufFile& GgufFile::operator=(GgufFile&& other) noexcept {
  if (this != &other) {
    Unmap();
    path_ = std::move(other.path_);
    map_ = std::exchange(other.map_, nullptr);
    map_size_ = std::exchange(other.map_size_, 0);
    version_ = other.version_;
    alignment_ = other.alignment_;
    data_offset_ = other.data_offset_;
    metadata_ = std::move(other.metadata_);
    tensors_ = std::move(other.tensors_);
    index_ = std::move(other.index_);
  }
  return *this;
}

GgufFile::~GgufFile() { Unmap(); }

void GgufFile::Unmap() {
  if (map_ != nullptr) ::munmap(map_, map_size_);
  map_ = nullptr;
  map_size_ = 0;
}

const GgufTensor* GgufFile::Find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

Status WriteGguf(const std::string& path, const GgufMetadata& metadata,
                 const std::vector<GgufTensorToWrite>& tensors, uint32_t version) {
  if (version != 2 && version != 3) {
    return InvalidArgumentError(path + ": GGUF version " + std::to_string(version) +
                                " cannot be written (only 2 and 3)");
  }
  uint64_t alignment = kDefaultAlignment;
  if (const GgufValue* v = metadata.Find(kAlignmentKey)) {
    std::optional<int64_t> a = AsInt(*v);
    if (!a || *a <= 0 || !std::has_single_bit(static_cast<uint64_t>(*a))) {
      return InvalidArgumentError(path + ": " + kAlignmentKey + " is not an integer power of two");
    }
    alignment = static_cast<uint64_t>(*a);
  }

  std::string header(kMagic, 4);
  Append(&header, version);
  Append<uint64_t>(&header, tensors.size());
  Append<uint64_t>(&header, metadata.keys().size());
  uint64_t num_values = 0;
  for (const std::string& key : metadata.keys()) {
    const GgufValue& v = *metadata.Find(key);
    AppendString(&header, key);
    Append(&header, static_cast<uint32_t>(v.type));
    VTOKEN_RETURN_IF_ERROR(
        EncodeValue(v, path + ": metadata " + Quote(key), 0, &num_values, &header));
  }

  std::map<std::string_view, size_t> names;
  std::vector<uint64_t> offsets;
  uint64_t cursor = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const GgufTensorToWrite& t = tensors[i];
    const std::string field = path + ": tensor " + Quote(t.name);
    if (!names.emplace(t.name, i).second) return InvalidArgumentError(field + ": duplicate name");
    std::optional<GgmlTypeTraits> traits = GgmlTypeInfo(static_cast<uint32_t>(t.type));
    if (!traits) {
      return InvalidArgumentError(field + ": unknown ggml type " +
                                  std::to_string(static_cast<uint32_t>(t.type)));
    }
    if (t.dims.empty() || t.dims.size() > kMaxDims) {
      return InvalidArgumentError(field + ": " + std::to_string(t.dims.size()) +
                                  " dims, outside 1..4");
    }
    for (int64_t d : t.dims) {
      if (d < 1)
        return InvalidArgumentError(field + ": dims " + DimsString(t.dims) + " hold one below 1");
    }
    if (t.dims[0] % traits->block_size != 0) {
      return InvalidArgumentError(field + ": row of " + std::to_string(t.dims[0]) +
                                  " elements is not a multiple of " + traits->name +
                                  "'s block size " + std::to_string(traits->block_size));
    }
    int64_t num_elements;
    uint64_t num_bytes;
    if (!TensorSize(t.dims, *traits, &num_elements, &num_bytes)) {
      return InvalidArgumentError(field + ": dims " + DimsString(t.dims) + " overflow");
    }
    if (num_bytes != t.data.size()) {
      return InvalidArgumentError(field + ": " + std::to_string(t.data.size()) + " bytes, but " +
                                  DimsString(t.dims) + " x " + traits->name + " takes " +
                                  std::to_string(num_bytes));
    }
    offsets.push_back(cursor);
    uint64_t end;
    if (__builtin_add_overflow(cursor, num_bytes, &end) || !AlignUp(end, alignment, &cursor)) {
      return InvalidArgumentError(field + ": the data area overflows");
    }
    AppendString(&header, t.name);
    Append<uint32_t>(&header, static_cast<uint32_t>(t.dims.size()));
    for (int64_t d : t.dims) Append<uint64_t>(&header, static_cast<uint64_t>(d));
    Append(&header, static_cast<uint32_t>(t.type));
    Append<uint64_t>(&header, offsets.back());
  }
  uint64_t data_offset;
  if (!AlignUp(header.size(), alignment, &data_offset)) {
    return InvalidArgumentError(path + ": padding to alignment " + std::to_string(alignment) +
                                " overflows");
  }

  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return InvalidArgumentError(tmp + ": cannot create: " + std::strerror(errno));
  Status s = WriteAll(fd, header.data(), header.size(), tmp);
  // Zeros up to `n` bytes, in pieces: an alignment may be far larger than the file.
  const std::string zeros(std::min<uint64_t>(alignment, 1 << 16), '\0');
  auto pad = [&](uint64_t n) {
    while (s.ok() && n > 0) {
      const uint64_t piece = std::min<uint64_t>(n, zeros.size());
      s = WriteAll(fd, zeros.data(), piece, tmp);
      n -= piece;
    }
  };
  // Without tensors the data area is empty: the file ends with the tensor infos (as the reader
  // allows), so that a huge alignment does not write a huge file.
  if (!tensors.empty()) pad(data_offset - header.size());
  for (size_t i = 0; s.ok() && i < tensors.size(); ++i) {
    s = WriteAll(fd, tensors[i].data.data(), tensors[i].data.size(), tmp);
    const uint64_t next = i + 1 < tensors.size() ? offsets[i + 1] : cursor;
    pad(next - offsets[i] - tensors[i].data.size());
  }
  // fsync before rename: otherwise a crash can leave the new name pointing at an empty file.
  if (s.ok() && ::fsync(fd) != 0) {
    s = InvalidArgumentError(tmp + ": fsync failed: " + std::strerror(errno));
  }
  if (::close(fd) != 0 && s.ok()) {
    s = InvalidArgumentError(tmp + ": close failed: " + std::strerror(errno));
  }
  if (s.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    s = InvalidArgumentError(path + ": rename from " + tmp + " failed: " + std::strerror(errno));
  }
  if (!s.ok()) ::unlink(tmp.c_str());
  return s;
}

}  // namespace vtoken::model
