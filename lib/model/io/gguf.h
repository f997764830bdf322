// GGUF files (llama.cpp's model format): a validating, memory-mapped reader and a writer.
//
// Format (https://github.com/ggml-org/ggml/blob/master/docs/gguf.md), little-endian:
//   magic "GGUF", uint32 version (2 or 3), uint64 tensor count, uint64 metadata count;
//   metadata: per entry a string key, a uint32 value type and the value (arrays: uint32 element
//   type, uint64 count, elements; arrays may nest); strings are a uint64 length and the bytes;
//   tensor infos: per tensor a string name, uint32 n_dims (1..4), uint64 dims[n_dims] (ne[0], the
//   fastest-varying, first), uint32 ggml type, uint64 offset (relative to the data area);
//   then padding to `general.alignment` (default 32) and the data area.
//
// The reader checks every count, string length, dimension and offset against the bytes left in
// the file before using it, so a corrupt file is a one-line error naming the field and the byte
// offset where it was read, never a crash, a hang or an allocation larger than the file.
//
// Thread safety: a GgufFile is immutable after Open; concurrent readers are safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "lib/core/status.h"
#include "lib/model/io/mapped_file.h"

namespace vtoken::model {

// The reader's limits on metadata, against stack exhaustion and huge allocations. A
// 262,144-token vocabulary with scores, token types and merges is about 1.3 million values.
inline constexpr int kGgufMaxArrayDepth = 16;                 // arrays of arrays of ...
inline constexpr uint64_t kGgufMaxMetadataValues = 1u << 24;  // array elements, all arrays

// Metadata value types, with their numbers in the file.
enum class GgufType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

// "uint8", ..., "array"; "unknown" for a number outside the enum.
const char* GgufTypeName(GgufType type);

// One metadata value. Integers: `integer` holds every value that fits in int64 (signed types
// sign-extended); the unsigned types also hold it in `uinteger`, the only place for a uint64 above
// INT64_MAX (whose `integer` is then 0). Floats are in `real`, booleans in `boolean`. The
// factories below fill the fields as the reader does, so values compare equal with ==.
struct GgufValue {
  GgufType type = GgufType::kUint32;
  int64_t integer = 0;
  uint64_t uinteger = 0;
  double real = 0.0;
  bool boolean = false;
  std::string string;
  GgufType element_type = GgufType::kUint8;  // arrays only
  std::vector<GgufValue> elements;           // arrays only

  bool is_integer() const;  // one of the eight integer types
  bool operator==(const GgufValue&) const = default;

  static GgufValue Uint32(uint32_t v);
  static GgufValue Int32(int32_t v);
  static GgufValue Uint64(uint64_t v);
  // Any integer type (uint64 values above INT64_MAX: use Uint64). The writer rejects a value
  // outside the type's range.
  static GgufValue Integer(GgufType type, int64_t v);
  static GgufValue Float32(float v);
  static GgufValue Float64(double v);
  static GgufValue Bool(bool v);
  static GgufValue String(std::string v);
  // An array of `element_type`; every element must have that type.
  static GgufValue Array(GgufType element_type, std::vector<GgufValue> elements);
  static GgufValue StringArray(const std::vector<std::string>& v);
  static GgufValue Int32Array(const std::vector<int32_t>& v);
  static GgufValue Float32Array(const std::vector<float>& v);
};

// The metadata of a file: key -> value, and typed getters whose errors name the key.
class GgufMetadata {
 public:
  // Sets (or replaces) `key`.
  void Set(const std::string& key, GgufValue value);
  // Returns the value of `key`, or nullptr.
  const GgufValue* Find(std::string_view key) const;
  bool Has(std::string_view key) const { return Find(key) != nullptr; }
  // Keys in the order they were read (or first set).
  const std::vector<std::string>& keys() const { return order_; }

  // Typed getters. NotFound naming the key when it is absent; InvalidArgument naming the key and
  // both types when the value has another type. GetInt accepts every integer type and fails
  // (InvalidArgument) for a uint64 above INT64_MAX; GetFloat accepts float32, float64 and integers.
  StatusOr<std::string> GetString(std::string_view key) const;
  StatusOr<int64_t> GetInt(std::string_view key) const;
  StatusOr<double> GetFloat(std::string_view key) const;
  StatusOr<bool> GetBool(std::string_view key) const;
  // Arrays: every element must be of the requested kind (string; integer; float or integer).
  StatusOr<std::vector<std::string>> GetStringArray(std::string_view key) const;
  StatusOr<std::vector<int64_t>> GetIntArray(std::string_view key) const;
  StatusOr<std::vector<double>> GetFloatArray(std::string_view key) const;

 private:
  std::map<std::string, GgufValue, std::less<>> values_;
  std::vector<std::string> order_;
};

// ggml tensor types, with their numbers in the file. Every type gguf-py 0.19 lists is here, so
// that the reader can size any tensor; DequantizeRow supports the ones marked (ggml_quants.h).
enum class GgmlType : uint32_t {
  kF32 = 0,   // supported
  kF16 = 1,   // supported
  kQ4_0 = 2,  // supported
  kQ4_1 = 3,  // supported
  kQ5_0 = 6,  // supported
  kQ5_1 = 7,  // supported
  kQ8_0 = 8,  // supported
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,  // supported
  kQ5_K = 13,  // supported
  kQ6_K = 14,  // supported
  kQ8_K = 15,
  kIQ2_XXS = 16,
  kIQ2_XS = 17,
  kIQ3_XXS = 18,
  kIQ1_S = 19,
  kIQ4_NL = 20,
  kIQ3_S = 21,
  kIQ2_S = 22,
  kIQ4_XS = 23,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kIQ1_M = 29,
  kBF16 = 30,  // supported
  kTQ1_0 = 34,
  kTQ2_0 = 35,
  kMXFP4 = 39,
  kNVFP4 = 40,
  kQ1_0 = 41,
};

// Layout of a ggml type: elements per block and bytes per block (1 and the element size for the
// plain types), as gguf-py's GGML_QUANT_SIZES has them. nullopt for a number ggml does not define
// (4, 5 and 31-33, 36-38: types since removed; above 41).
struct GgmlTypeTraits {
  const char* name;    // "F32", "Q4_K", ... as gguf-py spells them
  int64_t block_size;  // elements per block
  int64_t type_size;   // bytes per block
};
std::optional<GgmlTypeTraits> GgmlTypeInfo(uint32_t type);

// One tensor of an open GgufFile.
struct GgufTensor {
  std::string name;
  GgmlType type;
  std::vector<int64_t> dims;         // ne[0] first, as in the file (ne[0] is the fastest-varying)
  std::vector<int64_t> shape;        // dims reversed: the row-major (torch / Hugging Face) shape
  uint64_t offset = 0;               // absolute offset of the data in the file
  std::span<const std::byte> bytes;  // the data, inside the mapping

  int64_t num_elements() const;  // product of dims
};

class GgufFile {
 public:
  // Maps and validates `path`. Errors, each one line naming the file, the field and the byte
  // offset where it was read ("m.gguf: tensor 3 (blk.0.attn_q.weight) dims[1] at byte 1234: ..."):
  //   NotFound         the file does not exist;
  //   DataLoss         truncated anywhere, wrong magic, a count, string length or array length
  //                    that cannot fit in the bytes left (each element at its smallest size),
  //                    arrays nested deeper than kGgufMaxArrayDepth or more than
  //                    kGgufMaxMetadataValues metadata values in all, an unknown metadata value
  //                    type, a bool other than 0 or 1, n_dims outside 1..4, a dimension below 1 or
  //                    above INT64_MAX, an element count or byte size that overflows int64, an
  //                    unknown ggml type, a row length (dims[0]) not a multiple of the type's
  //                    block size, tensor data past the end of the file, a tensor offset not a
  //                    multiple of the alignment, overlapping tensors, a duplicate key or tensor
  //                    name, `general.alignment` not an integer power of two;
  //   InvalidArgument  version other than 2 or 3 (v1 files used 32-bit counts), other I/O errors.
  // Unused bytes between tensors are allowed (llama.cpp's writer leaves none but padding).
  static StatusOr<GgufFile> Open(const std::string& path);

  GgufFile(GgufFile&& other) noexcept;
  GgufFile& operator=(GgufFile&& other) noexcept;
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;
  ~GgufFile();

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  // Where the data area starts: the end of the tensor infos, padded to alignment(). Past the
  // end of the file only when there are no tensors.
  uint64_t data_offset() const { return data_offset_; }
  uint64_t file_size() const { return file_.size(); }
  const GgufMetadata& metadata() const { return metadata_; }
  // All tensors, in file order.
  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  // Returns the tensor called `name`, or nullptr.
  const GgufTensor* Find(std::string_view name) const;

 private:
  GgufFile() = default;

  std::string path_;
  MappedFile file_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  GgufMetadata metadata_;
  std::vector<GgufTensor> tensors_;
  std::map<std::string, size_t, std::less<>> index_;
};

// One tensor to write: `data` holds the tensor's bytes in `type`'s layout (for quantized types,
// the blocks), `dims` ne[0] first.
struct GgufTensorToWrite {
  std::string name;
  GgmlType type;
  std::vector<int64_t> dims;
  std::span<const std::byte> data;
};

// Writes a GGUF v3 file (`version` 2 also accepted) with `metadata` in keys() order and the
// tensors in the given order, each aligned to `general.alignment` (default 32) and padded to it
// (a file without tensors ends after the tensor infos, unpadded). Writes a temporary file beside
// `path` and renames it. InvalidArgument (naming the path and the
// key or tensor) for a version other than 2 or 3, a value whose type is not a GgufType, an array
// element of another type than the array's, an integer outside its type's range,
// `general.alignment` not an integer power of two, an unknown ggml type, n_dims outside 1..4, a
// dimension below 1, a row not a multiple of the block size, a data size that disagrees with the
// type and dims, a duplicate tensor name, or an I/O failure.
Status WriteGguf(const std::string& path, const GgufMetadata& metadata,
                 const std::vector<GgufTensorToWrite>& tensors, uint32_t version = 3);

}  // namespace vtoken::model
