// GgufValue and GgufMetadata (declared in gguf.h).
#include <utility>

#include "lib/model/io/gguf.h"
#include "lib/model/io/gguf_internal.h"

namespace vtoken::model {

using namespace gguf_internal;

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

}  // namespace vtoken::model
