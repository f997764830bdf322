// WriteGguf (declared in gguf.h).
#include <algorithm>
#include <bit>
#include <map>

#include "lib/model/io/gguf.h"
#include "lib/model/io/gguf_internal.h"
#include "lib/model/io/mapped_file.h"

namespace vtoken::model {

static_assert(std::endian::native == std::endian::little, "GGUF I/O assumes little-endian");

namespace {

using namespace gguf_internal;

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

Status WriteGguf(const std::string& path, const GgufMetadata& metadata,
                 const std::vector<GgufTensorToWrite>& tensors, uint32_t version) {
  if (version != 2 && version != 3) {
    return InvalidArgumentError(path + ": GGUF version " + std::to_string(version) +
                                " cannot be written (only 2 and 3)");
  }
  uint64_t alignment = kDefaultAlignment;
  if (const GgufValue* v = metadata.Find(kAlignmentKey)) {
    std::optional<uint64_t> a = AlignmentOf(*v);
    if (!a) {
      return InvalidArgumentError(path + ": " + kAlignmentKey + " is not an integer power of two");
    }
    alignment = *a;
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

  return WriteFileAtomically(path, [&](FileSink& out) {
    // Zeros up to `n` bytes, in pieces: an alignment may be far larger than the file.
    const std::string zeros(std::min<uint64_t>(alignment, 1 << 16), '\0');
    auto pad = [&](uint64_t n) {
      while (n > 0) {
        const uint64_t piece = std::min<uint64_t>(n, zeros.size());
        VTOKEN_RETURN_IF_ERROR(out.Write(zeros.data(), piece));
        n -= piece;
      }
      return Status::Ok();
    };
    VTOKEN_RETURN_IF_ERROR(out.Write(header.data(), header.size()));
    // Without tensors the data area is empty: the file ends with the tensor infos (as the reader
    // allows), so that a huge alignment does not write a huge file.
    if (!tensors.empty()) VTOKEN_RETURN_IF_ERROR(pad(data_offset - header.size()));
    for (size_t i = 0; i < tensors.size(); ++i) {
      VTOKEN_RETURN_IF_ERROR(out.Write(tensors[i].data.data(), tensors[i].data.size()));
      const uint64_t next = i + 1 < tensors.size() ? offsets[i + 1] : cursor;
      VTOKEN_RETURN_IF_ERROR(pad(next - offsets[i] - tensors[i].data.size()));
    }
    return Status::Ok();
  });
}

}  // namespace vtoken::model
