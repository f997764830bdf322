// Safetensors files: a writer and a validating, memory-mapped reader.
//
// Format (https://github.com/huggingface/safetensors): an 8-byte little-endian header length N,
// N bytes of JSON header, then the data area. The header is an object mapping each tensor name to
// {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to the data area, half-open),
// plus an optional "__metadata__" object of string -> string.
//
// The reader validates the whole header before handing out any view, and rejects what the
// reference Rust implementation rejects: besides malformed headers and out-of-range offsets, the
// tensors must tile the data area exactly — no overlaps, no gaps, no trailing bytes. Accepting
// gaps would let a file pass here that Hugging Face refuses to load.
//
// dtypes: the model needs F32, F16 and BF16, and only these are supported. The other dtypes the
// format defines (BOOL, U8, I8, I16, U16, I32, U32, I64, U64, F64, F8_E4M3, F8_E5M2) are reported
// as unsupported (InvalidArgument); any other dtype string is corruption (DataLoss).
//
// Thread safety: a SafetensorsFile is immutable after Open; concurrent readers are safe.
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

enum class DType { kF32, kF16, kBF16 };  // safetensors "F32", "F16", "BF16"

// Bytes per element: 4 for kF32, 2 for kF16 and kBF16.
size_t DTypeSize(DType dtype);
// The safetensors spelling: "F32", "F16", "BF16".
const char* DTypeName(DType dtype);
// Inverse of DTypeName; nullopt for any other string.
std::optional<DType> DTypeFromName(std::string_view name);

// One tensor to write. `data` points at product(shape) * DTypeSize(dtype) bytes in the file's
// (little-endian) layout; it may be null only when that size is 0.
struct TensorToWrite {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  const void* data;
};

// Writes a valid .safetensors file holding `tensors` in the given order, contiguously, with
// `metadata` as "__metadata__" (omitted when empty). The header is padded with spaces so the data
// area starts 8-byte aligned. Writes a temporary file beside `path` and renames it over `path`, so
// readers never see a partial file.
// Errors: InvalidArgument for an empty, duplicate or "__metadata__" name, a negative dimension,
// or null data with a non-zero size; InvalidArgument naming the path for I/O failures.
Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                        const std::map<std::string, std::string>& metadata = {});

// A tensor inside an open SafetensorsFile. `bytes` points into the file's mapping and is valid
// while that file (or whatever it was moved into) is alive. Elements are little-endian and not
// necessarily aligned to their size (a preceding F16 tensor may have an odd element count).
struct TensorView {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::span<const std::byte> bytes;

  // product(shape); 1 for a scalar (empty shape).
  int64_t num_elements() const;
};

// A read-only memory-mapped safetensors file. Movable, not copyable; moving keeps every
// TensorView (and pointers to them) valid.
class SafetensorsFile {
 public:
  // Maps and validates `path`. Errors (each message names the file, and the tensor if any):
  //   NotFound         the file does not exist;
  //   DataLoss         shorter than 8 bytes, header length beyond the file or above 100 MB,
  //                    header not JSON or not an object, a tensor entry that is not an object or
  //                    lacks dtype/shape/data_offsets, unknown dtype string, shape not a list of
  //                    non-negative integers, data_offsets not [begin, end] inside the data area,
  //                    byte size != product(shape) x dtype size, overlapping tensors, a gap or
  //                    trailing bytes in the data area, duplicate names, "__metadata__" not a
  //                    string -> string object;
  //   InvalidArgument  a dtype the format defines but this reader does not support;
  //                    other I/O failures.
  // With `tolerate_gaps`, a gap or trailing bytes open anyway and are kept as layout_error()
  // (LoadCheckpoint first names a required tensor that is missing, the likely cause).
  static StatusOr<SafetensorsFile> Open(const std::string& path, bool tolerate_gaps = false);

  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  const std::string& path() const { return path_; }
  // All tensors, in the order of their offsets in the data area.
  const std::vector<TensorView>& tensors() const { return tensors_; }
  // Returns the tensor called `name`, or nullptr.
  const TensorView* Find(std::string_view name) const;
  // The "__metadata__" map (empty when absent).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The first gap or trailing-bytes error Open tolerated; OK when the tensors tile the data.
  const Status& layout_error() const { return layout_error_; }

 private:
  SafetensorsFile() = default;

  std::string path_;
  MappedFile file_;
  std::vector<TensorView> tensors_;
  std::map<std::string, size_t, std::less<>> index_;  // name -> position in tensors_
  std::map<std::string, std::string> metadata_;
  Status layout_error_;
};

// Bit-exact IEEE binary16 -> binary32 (subnormals, infinities and NaN payloads preserved).
float F16ToFloat(uint16_t bits);
// bfloat16 -> binary32: the 16 bits become the high half of the float. Exact.
float BF16ToFloat(uint16_t bits);
// binary32 -> binary16, round to nearest even; overflow gives infinity, NaN stays NaN.
uint16_t FloatToF16(float value);
// binary32 -> bfloat16, round to nearest even; NaN stays NaN (quiet).
uint16_t FloatToBF16(float value);

// Converts `view` to floats in `out`. Returns InvalidArgument (naming the tensor) when
// out.size() != view.num_elements().
Status ConvertToFloat(const TensorView& view, std::span<float> out);

}  // namespace vtoken::model
