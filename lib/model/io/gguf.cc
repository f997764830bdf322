#include "lib/model/io/gguf.h"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstring>
#include <span>
#include <utility>

#include "lib/model/io/gguf_internal.h"

namespace vtoken::model {

// The reader copies little-endian fields with memcpy and hands out raw tensor bytes.
static_assert(std::endian::native == std::endian::little, "GGUF I/O assumes little-endian");

namespace {

using namespace gguf_internal;

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

// Field names for errors: "metadata 3 (general.name)", "tensor 3 (blk.0.attn_q.weight)".
std::string Entry(const char* kind, uint64_t index, std::string_view name) {
  std::string s = std::string(kind) + " " + std::to_string(index);
  if (!name.empty()) s += " (" + Printable(name) + ")";
  return s;
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
    *out = T{};  // set on every path, so -O1's maybe-uninitialized sees no unset use
    const std::byte* p = nullptr;
    VTOKEN_RETURN_IF_ERROR(Take(sizeof(T), field, &p));
    std::memcpy(out, p, sizeof(T));
    return Status::Ok();
  }

  Status ReadString(const Field& field, std::string* out) {
    const uint64_t at = pos_;
    uint64_t length = 0;
    VTOKEN_RETURN_IF_ERROR(Read(field, &length));
    if (length > left()) {
      return Error(at, field,
                   "string length " + std::to_string(length) + " runs past the end of the file (" +
                       std::to_string(left()) + " bytes left)");
    }
    const std::byte* p = nullptr;
    VTOKEN_RETURN_IF_ERROR(Take(length, field, &p));
    out->assign(reinterpret_cast<const char*>(p), length);
    return Status::Ok();
  }

  // Reads a value type, which must be one of GgufType.
  Status ReadType(const Field& field, GgufType* out) {
    const uint64_t at = pos_;
    uint32_t t = 0;
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
        float v = 0;
        VTOKEN_RETURN_IF_ERROR(Read(field, &v));
        out->real = v;
        return Status::Ok();
      }
      case GgufType::kFloat64:
        return Read(field, &out->real);
      case GgufType::kBool: {
        uint8_t v = 0;
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
    uint64_t count = 0;
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

}  // namespace

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
  VTOKEN_ASSIGN_OR_RETURN(file.file_, MappedFile::Open(path));
  // An empty file maps to no bytes; the parser reports it.
  const uint64_t file_size = file.file_.size();
  const std::byte* base = file.file_.data();
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
  uint64_t num_tensors = 0, num_entries = 0;
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
    std::optional<uint64_t> alignment = AlignmentOf(*v);
    if (!alignment) {
      const std::string shown = !v->is_integer()      ? std::string("a ") + GgufTypeName(v->type)
                                : IsUnsigned(v->type) ? std::to_string(UnsignedOf(*v))
                                                      : std::to_string(v->integer);
      return p.Error(alignment_at, kAlignmentKey, shown + " is not an integer power of two");
    }
    file.alignment_ = *alignment;
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
    uint32_t n_dims = 0;
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
      uint64_t dim = 0;
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
    uint32_t type = 0;
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
    uint64_t num_bytes = 0;
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

GgufFile::GgufFile(GgufFile&& other) noexcept = default;
GgufFile& GgufFile::operator=(GgufFile&& other) noexcept = default;
GgufFile::~GgufFile() = default;

const GgufTensor* GgufFile::Find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace vtoken::model
