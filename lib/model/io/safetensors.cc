#include "lib/model/io/safetensors.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

namespace vtoken::model {

// The file format is little-endian; views hand out raw bytes, so the host must match.
static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes little-endian");

namespace {

// The reference implementation's limit; a larger header is almost surely a corrupt length.
constexpr uint64_t kMaxHeaderBytes = 100u << 20;

constexpr const char* kOtherKnownDTypes[] = {"BOOL", "U8",  "I8",  "I16", "U16",     "I32",
                                             "U32",  "I64", "U64", "F64", "F8_E4M3", "F8_E5M2"};

std::string Quote(std::string_view s) {
  std::string quoted(1, '\'');
  quoted.append(s);
  quoted.push_back('\'');
  return quoted;
}

Status FileError(const std::string& path, const std::string& what) {
  return DataLossError(path + ": " + what);
}

Status TensorError(const std::string& path, std::string_view name, const std::string& what) {
  return DataLossError(path + ": tensor " + Quote(name) + ": " + what);
}

// product(shape) * element_size, or nullopt on overflow / negative dimension.
std::optional<uint64_t> ByteSize(const std::vector<int64_t>& shape, size_t element_size) {
  uint64_t n = element_size;
  for (int64_t d : shape) {
    if (d < 0) return std::nullopt;
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) return std::nullopt;
  }
  return n;
}

// Reads a non-negative JSON integer; nullopt for anything else (floats, negatives, strings).
std::optional<uint64_t> AsUnsigned(const nlohmann::json& j) {
  if (j.is_number_unsigned()) return j.get<uint64_t>();
  if (j.is_number_integer() && j.get<int64_t>() >= 0) return j.get<uint64_t>();
  return std::nullopt;
}

}  // namespace

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 4;
    case DType::kF16:
      return 2;
    case DType::kBF16:
      return 2;
  }
  return 0;
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
  }
  return "?";
}

std::optional<DType> DTypeFromName(std::string_view name) {
  if (name == "F32") return DType::kF32;
  if (name == "F16") return DType::kF16;
  if (name == "BF16") return DType::kBF16;
  return std::nullopt;
}

int64_t TensorView::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                        const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string_view> names;
  uint64_t offset = 0;
  for (const TensorToWrite& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__") {
      return InvalidArgumentError(path + ": invalid tensor name " + Quote(t.name));
    }
    if (!names.insert(t.name).second) {
      return InvalidArgumentError(path + ": duplicate tensor name " + Quote(t.name));
    }
    std::optional<uint64_t> size = ByteSize(t.shape, DTypeSize(t.dtype));
    if (!size) {
      return InvalidArgumentError(path + ": tensor " + Quote(t.name) +
                                  ": negative or overflowing shape");
    }
    if (*size > 0 && t.data == nullptr) {
      return InvalidArgumentError(path + ": tensor " + Quote(t.name) + ": null data");
    }
    header[t.name] = {{"dtype", DTypeName(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + *size}}};
    offset += *size;
  }
  std::string text = header.dump();
  // Pad with spaces (valid JSON whitespace) so the data area starts on an 8-byte boundary.
  text.append((8 - text.size() % 8) % 8, ' ');
  uint64_t header_len = text.size();

  return WriteFileAtomically(path, [&](FileSink& out) {
    VTOKEN_RETURN_IF_ERROR(out.Write(&header_len, sizeof(header_len)));
    VTOKEN_RETURN_IF_ERROR(out.Write(text.data(), text.size()));
    for (const TensorToWrite& t : tensors) {
      VTOKEN_RETURN_IF_ERROR(out.Write(t.data, *ByteSize(t.shape, DTypeSize(t.dtype))));
    }
    return Status::Ok();
  });
}

StatusOr<SafetensorsFile> SafetensorsFile::Open(const std::string& path, bool tolerate_gaps) {
  SafetensorsFile file;
  file.path_ = path;
  VTOKEN_ASSIGN_OR_RETURN(file.file_, MappedFile::Open(path));
  const uint64_t file_size = file.file_.size();
  if (file_size < 8) {
    return FileError(path, "file is " + std::to_string(file_size) +
                               " bytes, shorter than the 8-byte header length");
  }
  const std::byte* base = file.file_.data();

  uint64_t header_len;
  std::memcpy(&header_len, base, sizeof(header_len));
  if (header_len > kMaxHeaderBytes) {
    return FileError(path,
                     "header length " + std::to_string(header_len) + " exceeds the 100 MB limit");
  }
  if (header_len > file_size - 8) {
    return FileError(path, "header length " + std::to_string(header_len) +
                               " runs past the end of the file (" + std::to_string(file_size) +
                               " bytes)");
  }
  const uint64_t data_size = file_size - 8 - header_len;
  const std::byte* data = base + 8 + header_len;
  std::string_view text(reinterpret_cast<const char*>(base + 8), header_len);

  // nlohmann keeps the last of duplicate keys silently; the callback sees every top-level key.
  std::string duplicate;
  std::set<std::string> seen;
  auto on_event = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    if (event == nlohmann::json::parse_event_t::key && depth == 1 && duplicate.empty() &&
        !seen.insert(parsed.get<std::string>()).second) {
      duplicate = parsed.get<std::string>();
    }
    return true;
  };
  nlohmann::json header = nlohmann::json::parse(text, on_event, /*allow_exceptions=*/false);
  if (header.is_discarded()) return FileError(path, "header is not valid JSON");
  if (!header.is_object()) return FileError(path, "header is not a JSON object");
  if (!duplicate.empty()) return TensorError(path, duplicate, "duplicate tensor name");

  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& entry = it.value();
    if (name == "__metadata__") {
      if (!entry.is_object()) return FileError(path, "__metadata__ is not an object");
      for (auto m = entry.begin(); m != entry.end(); ++m) {
        if (!m.value().is_string()) {
          return FileError(path, "__metadata__ value of " + Quote(m.key()) + " is not a string");
        }
        file.metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    if (!entry.is_object()) return TensorError(path, name, "entry is not an object");
    for (const char* field : {"dtype", "shape", "data_offsets"}) {
      if (!entry.contains(field)) {
        return TensorError(path, name, std::string("missing \"") + field + "\"");
      }
    }
    TensorView view;
    view.name = name;
    const nlohmann::json& dtype = entry["dtype"];
    if (!dtype.is_string()) return TensorError(path, name, "dtype is not a string");
    const std::string dtype_name = dtype.get<std::string>();
    std::optional<DType> parsed_dtype = DTypeFromName(dtype_name);
    if (!parsed_dtype) {
      for (const char* known : kOtherKnownDTypes) {
        if (dtype_name == known) {
          return InvalidArgumentError(path + ": tensor " + Quote(name) + ": dtype " +
                                      Quote(dtype_name) +
                                      " is not supported (supported: F32, F16, BF16)");
        }
      }
      return TensorError(path, name, "unknown dtype " + Quote(dtype_name));
    }
    view.dtype = *parsed_dtype;

    const nlohmann::json& shape = entry["shape"];
    if (!shape.is_array()) return TensorError(path, name, "shape is not a list");
    for (const nlohmann::json& d : shape) {
      std::optional<uint64_t> dim = AsUnsigned(d);
      if (!dim || *dim > static_cast<uint64_t>(INT64_MAX)) {
        return TensorError(path, name,
                           "shape " + shape.dump() + " is not a list of non-negative integers");
      }
      view.shape.push_back(static_cast<int64_t>(*dim));
    }

    const nlohmann::json& offsets = entry["data_offsets"];
    std::optional<uint64_t> begin, end;
    if (offsets.is_array() && offsets.size() == 2) {
      begin = AsUnsigned(offsets[0]);
      end = AsUnsigned(offsets[1]);
    }
    if (!begin || !end || *begin > *end) {
      return TensorError(
          path, name, "data_offsets " + offsets.dump() + " is not [begin, end] with begin <= end");
    }
    if (*end > data_size) {
      return TensorError(path, name,
                         "data_offsets " + offsets.dump() + " run past the data area (" +
                             std::to_string(data_size) + " bytes)");
    }
    std::optional<uint64_t> expected = ByteSize(view.shape, DTypeSize(view.dtype));
    if (!expected || *expected != *end - *begin) {
      return TensorError(path, name,
                         "holds " + std::to_string(*end - *begin) + " bytes but shape " +
                             shape.dump() + " x " + dtype_name + " needs " +
                             (expected ? std::to_string(*expected) : std::string("too many")));
    }
    view.bytes = std::span<const std::byte>(data + *begin, *end - *begin);
    file.tensors_.push_back(std::move(view));
  }

  // Tensors must tile the data area: sorted by offset, each begins where the previous ended.
  std::sort(file.tensors_.begin(), file.tensors_.end(),
            [](const TensorView& a, const TensorView& b) {
              if (a.bytes.data() != b.bytes.data()) return a.bytes.data() < b.bytes.data();
              return a.bytes.size() < b.bytes.size();
            });
  const std::byte* cursor = data;
  const TensorView* previous = nullptr;
  for (const TensorView& t : file.tensors_) {
    if (t.bytes.data() < cursor) {
      return TensorError(path, t.name, "overlaps tensor " + Quote(previous->name));
    }
    if (t.bytes.data() > cursor) {
      Status gap = TensorError(path, t.name,
                               "leaves a gap of " + std::to_string(t.bytes.data() - cursor) +
                                   " bytes before it in the data area");
      if (!tolerate_gaps) return gap;
      if (file.layout_error_.ok()) file.layout_error_ = gap;
    }
    cursor = t.bytes.data() + t.bytes.size();
    previous = &t;
  }
  if (cursor != data + data_size) {
    Status trailing = FileError(
        path, std::to_string(data + data_size - cursor) + " trailing bytes after the last tensor");
    if (!tolerate_gaps) return trailing;
    if (file.layout_error_.ok()) file.layout_error_ = trailing;
  }
  for (size_t i = 0; i < file.tensors_.size(); ++i) file.index_[file.tensors_[i].name] = i;
  return file;
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& other) noexcept = default;
SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& other) noexcept = default;
SafetensorsFile::~SafetensorsFile() = default;

const TensorView* SafetensorsFile::Find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

float F16ToFloat(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {
      // Subnormal half: normalize into a float exponent.
      uint32_t e = 127 - 15 + 1;
      while ((mant & 0x400) == 0) {
        mant <<= 1;
        --e;
      }
      bits = sign | (e << 23) | ((mant & 0x3ff) << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  return std::bit_cast<float>(bits);
}

float BF16ToFloat(uint16_t bits) { return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16); }

uint16_t FloatToF16(float value) {
  uint32_t x = std::bit_cast<uint32_t>(value);
  uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  uint32_t exp = (x >> 23) & 0xff;
  uint32_t mant = x & 0x7fffff;
  if (exp == 0xff) {
    return static_cast<uint16_t>(sign | 0x7c00 | (mant != 0 ? 0x200 | (mant >> 13) : 0));
  }
  int e = static_cast<int>(exp) - 127 + 15;
  if (e >= 0x1f) return sign | 0x7c00;
  if (e <= 0) {
    if (e < -10) return sign;  // Below half the smallest subnormal: rounds to zero.
    uint32_t m = mant | 0x800000;
    int shift = 14 - e;
    uint32_t half = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1);
    uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half & 1))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = (static_cast<uint32_t>(e) << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fff;
  // A carry out of the mantissa correctly bumps the exponent (up to infinity).
  if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) ++half;
  return static_cast<uint16_t>(sign | half);
}

uint16_t FloatToBF16(float value) {
  uint32_t x = std::bit_cast<uint32_t>(value);
  if ((x & 0x7fffffff) > 0x7f800000) return static_cast<uint16_t>((x >> 16) | 0x40);
  uint32_t rounding_bias = 0x7fff + ((x >> 16) & 1);
  return static_cast<uint16_t>((x + rounding_bias) >> 16);
}

Status ConvertToFloat(const TensorView& view, std::span<float> out) {
  if (static_cast<int64_t>(out.size()) != view.num_elements()) {
    return InvalidArgumentError("tensor " + Quote(view.name) + ": output holds " +
                                std::to_string(out.size()) + " floats, tensor has " +
                                std::to_string(view.num_elements()));
  }
  const std::byte* src = view.bytes.data();
  switch (view.dtype) {
    case DType::kF32:
      std::memcpy(out.data(), src, out.size() * sizeof(float));
      break;
    case DType::kF16:
    case DType::kBF16: {
      const bool is_f16 = view.dtype == DType::kF16;
      for (size_t i = 0; i < out.size(); ++i) {
        uint16_t bits;
        std::memcpy(&bits, src + 2 * i, sizeof(bits));  // May be unaligned.
        out[i] = is_f16 ? F16ToFloat(bits) : BF16ToFloat(bits);
      }
      break;
    }
  }
  return Status::Ok();
}

}  // namespace vtoken::model
