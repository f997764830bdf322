#include "lib/model/io/ggml_quants.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "lib/model/io/safetensors.h"

// ggml's reference rounds each product and sum on its own (d * q, then + m); a fused multiply-add
// would differ in the last bit. GCC does not contract under -std=c++20; clang would, within one
// expression, where the target has FMA.
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

namespace vtoken::model {
namespace {

constexpr int kQK = 32;  // elements per block of the Q4_0 ... Q8_0 family (K-quants: 256)

uint16_t Load16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// Every binary16 as a float, so that F16 tensors convert by lookup.
const std::vector<float>& F16Table() {
  static const std::vector<float> table = [] {
    std::vector<float> t(1 << 16);
    for (uint32_t h = 0; h < t.size(); ++h) t[h] = F16ToFloat(static_cast<uint16_t>(h));
    return t;
  }();
  return table;
}

float Half(const uint8_t* p) { return F16ToFloat(Load16(p)); }

// Block layouts (ggml-common.h), all little-endian, f16 scales unaligned:
//   Q4_0 [d:f16][qs:16]          Q4_1 [d:f16][m:f16][qs:16]
//   Q5_0 [d:f16][qh:u32][qs:16]  Q5_1 [d:f16][m:f16][qh:u32][qs:16]
//   Q8_0 [d:f16][qs:32 x int8]
// qs holds element j in its low nibble and element j + 16 in its high one; qh bit j is the
// fifth bit of element j.
void DequantQ4_0(const uint8_t* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += 18, y += kQK) {
    const float d = Half(x);
    const uint8_t* qs = x + 2;
    for (int j = 0; j < kQK / 2; ++j) {
      y[j] = static_cast<float>((qs[j] & 0x0F) - 8) * d;
      y[j + kQK / 2] = static_cast<float>((qs[j] >> 4) - 8) * d;
    }
  }
}

void DequantQ4_1(const uint8_t* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += 20, y += kQK) {
    const float d = Half(x);
    const float m = Half(x + 2);
    const uint8_t* qs = x + 4;
    for (int j = 0; j < kQK / 2; ++j) {
      y[j] = static_cast<float>(qs[j] & 0x0F) * d + m;
      y[j + kQK / 2] = static_cast<float>(qs[j] >> 4) * d + m;
    }
  }
}

// The five-bit values of a Q5 block: low nibbles from qs, fifth bits from qh.
void Unpack5(const uint8_t* qh_bytes, const uint8_t* qs, int q[kQK]) {
  uint32_t qh;
  std::memcpy(&qh, qh_bytes, sizeof(qh));
  for (int j = 0; j < kQK / 2; ++j) {
    q[j] = (qs[j] & 0x0F) | (((qh >> j) & 1) << 4);
    q[j + kQK / 2] = (qs[j] >> 4) | (((qh >> (j + kQK / 2)) & 1) << 4);
  }
}

void DequantQ5_0(const uint8_t* x, float* y, int64_t nb) {
  int q[kQK];
  for (int64_t i = 0; i < nb; ++i, x += 22, y += kQK) {
    const float d = Half(x);
    Unpack5(x + 2, x + 6, q);
    for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(q[j] - 16) * d;
  }
}

void DequantQ5_1(const uint8_t* x, float* y, int64_t nb) {
  int q[kQK];
  for (int64_t i = 0; i < nb; ++i, x += 24, y += kQK) {
    const float d = Half(x);
    const float m = Half(x + 2);
    Unpack5(x + 4, x + 8, q);
    for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(q[j]) * d + m;
  }
}

void DequantQ8_0(const uint8_t* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += 34, y += kQK) {
    const float d = Half(x);
    const auto* qs = reinterpret_cast<const int8_t*>(x + 2);
    for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(qs[j]) * d;
  }
}

// Q4_K and Q5_K pack eight 6-bit (scale, min) pairs into 12 bytes: pairs 0-3 in the low six bits
// of bytes 0-3 (scales) and 4-7 (mins); pairs 4-7 keep their low four bits in the nibbles of bytes
// 8-11 (scale low, min high) and their top two bits in the top bits of bytes 0-3 (scales) and
// 4-7 (mins).
void ScaleMinK4(int j, const uint8_t* s, int* scale, int* min) {
  if (j < 4) {
    *scale = s[j] & 63;
    *min = s[j + 4] & 63;
  } else {
    *scale = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
    *min = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// Q4_K [d:f16][dmin:f16][scales:12][qs:128]: 64 elements per 32 bytes of qs, the first 32 in the
// low nibbles (sub-block 2k), the next 32 in the high ones (sub-block 2k+1).
void DequantQ4_K(const uint8_t* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += 144) {
    const float d = Half(x);
    const float dmin = Half(x + 2);
    const uint8_t* scales = x + 4;
    const uint8_t* q = x + 16;
    for (int sub = 0; sub < 8; sub += 2, q += 32) {
      int sc, m;
      ScaleMinK4(sub, scales, &sc, &m);
      const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
      ScaleMinK4(sub + 1, scales, &sc, &m);
      const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(m);
      for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(q[l] & 0x0F) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>(q[l] >> 4) - m2;
    }
  }
}

// Q5_K [d:f16][dmin:f16][scales:12][qh:32][qs:128]: Q4_K's nibbles plus a fifth bit, for
// sub-block s in bit s of qh[l].
void DequantQ5_K(const uint8_t* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += 176) {
    const float d = Half(x);
    const float dmin = Half(x + 2);
    const uint8_t* scales = x + 4;
    const uint8_t* qh = x + 16;
    const uint8_t* ql = x + 48;
    for (int sub = 0; sub < 8; sub += 2, ql += 32) {
      int sc, m;
      ScaleMinK4(sub, scales, &sc, &m);
      const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
      ScaleMinK4(sub + 1, scales, &sc, &m);
      const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(m);
      for (int l = 0; l < 32; ++l) {
        const int v = (ql[l] & 0x0F) | (((qh[l] >> sub) & 1) << 4);
        *y++ = d1 * static_cast<float>(v) - m1;
      }
      for (int l = 0; l < 32; ++l) {
        const int v = (ql[l] >> 4) | (((qh[l] >> (sub + 1)) & 1) << 4);
        *y++ = d2 * static_cast<float>(v) - m2;
      }
    }
  }
}

// Q6_K [ql:128][qh:64][scales:16 x int8][d:f16]: per 128 elements, 64 bytes of ql and 32 of qh.
// Element l + 32k (k = 0..3, l < 32) takes the low (k even) or high (k odd) nibble of
// ql[l + 32 (k & 1)] and bits 2k, 2k+1 of qh[l]; its scale is scales[l / 16 + 2k].
void DequantQ6_K(const uint8_t* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += 210) {
    const uint8_t* ql = x;
    const uint8_t* qh = x + 128;
    const auto* sc = reinterpret_cast<const int8_t*>(x + 192);
    const float d = Half(x + 208);
    for (int half = 0; half < 2; ++half, y += 128, ql += 64, qh += 32, sc += 8) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0x0F) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = d * static_cast<float>(sc[is]) * static_cast<float>(q1);
        y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
        y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
        y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
      }
    }
  }
}

void DequantF16(const uint8_t* x, float* y, int64_t n) {
  const float* table = F16Table().data();
  for (int64_t i = 0; i < n; ++i) y[i] = table[Load16(x + 2 * i)];
}

void DequantBF16(const uint8_t* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = BF16ToFloat(Load16(x + 2 * i));
}

// float -> int8_t as ggml's `(int8_t)(v)` compiles on x86-64 (cvttss2si, then the low byte), so
// that NaN and out-of-range values, undefined behaviour in C, give what ggml gives there.
int8_t TruncToInt8(float v) {
  const int32_t i = (v > -2147483648.0f && v < 2147483648.0f) ? static_cast<int32_t>(v) : INT32_MIN;
  return static_cast<int8_t>(i);
}

void StoreHalf(uint8_t* p, float v) {
  const uint16_t h = FloatToF16(v);
  std::memcpy(p, &h, sizeof(h));
}

void QuantizeQ8_0(const float* x, uint8_t* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK, y += 34) {
    float amax = 0.0f;
    for (int j = 0; j < kQK; ++j) {
      const float a = std::fabs(x[j]);
      amax = amax > a ? amax : a;  // ggml's MAX(): a NaN is kept only as the last element
    }
    const float d = amax / 127;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    StoreHalf(y, d);
    for (int j = 0; j < kQK; ++j) {
      y[2 + j] = static_cast<uint8_t>(TruncToInt8(std::round(x[j] * id)));
    }
  }
}

void QuantizeQ4_0(const float* x, uint8_t* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK, y += 18) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < kQK; ++j) {
      if (amax < std::fabs(x[j])) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    }
    const float d = max / -8;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    StoreHalf(y, d);
    for (int j = 0; j < kQK / 2; ++j) {
      const int lo = std::min<int>(15, TruncToInt8(x[j] * id + 8.5f));
      const int hi = std::min<int>(15, TruncToInt8(x[j + kQK / 2] * id + 8.5f));
      y[2 + j] = static_cast<uint8_t>(static_cast<uint8_t>(lo) | (static_cast<uint8_t>(hi) << 4));
    }
  }
}

void QuantizeQ4_1(const float* x, uint8_t* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK, y += 20) {
    float min = std::numeric_limits<float>::max(), max = -std::numeric_limits<float>::max();
    for (int j = 0; j < kQK; ++j) {
      if (x[j] < min) min = x[j];
      if (x[j] > max) max = x[j];
    }
    const float d = (max - min) / 15;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    StoreHalf(y, d);
    StoreHalf(y + 2, min);
    for (int j = 0; j < kQK / 2; ++j) {
      const int lo = std::min<int>(15, TruncToInt8((x[j] - min) * id + 0.5f));
      const int hi = std::min<int>(15, TruncToInt8((x[j + kQK / 2] - min) * id + 0.5f));
      y[4 + j] = static_cast<uint8_t>(static_cast<uint8_t>(lo) | (static_cast<uint8_t>(hi) << 4));
    }
  }
}

const char* TypeName(GgmlType type) {
  std::optional<GgmlTypeTraits> traits = GgmlTypeInfo(static_cast<uint32_t>(type));
  return traits ? traits->name : "unknown";
}

}  // namespace

bool CanDequantize(GgmlType type) {
  switch (type) {
    case GgmlType::kF32:
    case GgmlType::kF16:
    case GgmlType::kBF16:
    case GgmlType::kQ4_0:
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_0:
    case GgmlType::kQ5_1:
    case GgmlType::kQ8_0:
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K:
      return true;
    default:
      return false;
  }
}

Status DequantizeRow(GgmlType type, std::span<const std::byte> src, std::span<float> out) {
  if (!CanDequantize(type)) {
    return InvalidArgumentError(std::string("cannot dequantize ggml type ") + TypeName(type) +
                                " (" + std::to_string(static_cast<uint32_t>(type)) + ")");
  }
  const GgmlTypeTraits traits = *GgmlTypeInfo(static_cast<uint32_t>(type));
  const int64_t n = static_cast<int64_t>(out.size());
  if (n % traits.block_size != 0) {
    return InvalidArgumentError(std::to_string(n) + " elements are not a multiple of " +
                                traits.name + "'s block size " + std::to_string(traits.block_size));
  }
  const int64_t nb = n / traits.block_size;
  if (src.size() != static_cast<uint64_t>(nb) * static_cast<uint64_t>(traits.type_size)) {
    return InvalidArgumentError(std::to_string(n) + " " + traits.name + " elements take " +
                                std::to_string(nb * traits.type_size) + " bytes, not " +
                                std::to_string(src.size()));
  }
  const auto* x = reinterpret_cast<const uint8_t*>(src.data());
  float* y = out.data();
  switch (type) {
    case GgmlType::kF32:
      if (n > 0) std::memcpy(y, x, src.size());
      break;
    case GgmlType::kF16:
      DequantF16(x, y, n);
      break;
    case GgmlType::kBF16:
      DequantBF16(x, y, n);
      break;
    case GgmlType::kQ4_0:
      DequantQ4_0(x, y, nb);
      break;
    case GgmlType::kQ4_1:
      DequantQ4_1(x, y, nb);
      break;
    case GgmlType::kQ5_0:
      DequantQ5_0(x, y, nb);
      break;
    case GgmlType::kQ5_1:
      DequantQ5_1(x, y, nb);
      break;
    case GgmlType::kQ8_0:
      DequantQ8_0(x, y, nb);
      break;
    case GgmlType::kQ4_K:
      DequantQ4_K(x, y, nb);
      break;
    case GgmlType::kQ5_K:
      DequantQ5_K(x, y, nb);
      break;
    case GgmlType::kQ6_K:
      DequantQ6_K(x, y, nb);
      break;
    default:
      break;  // excluded by CanDequantize
  }
  return Status::Ok();
}

Status DequantizeTensor(const GgufTensor& tensor, std::span<float> out) {
  if (!CanDequantize(tensor.type)) {
    return InvalidArgumentError("tensor '" + tensor.name + "': cannot dequantize ggml type " +
                                TypeName(tensor.type));
  }
  if (static_cast<int64_t>(out.size()) != tensor.num_elements()) {
    return InvalidArgumentError("tensor '" + tensor.name + "' (" + TypeName(tensor.type) +
                                "): output holds " + std::to_string(out.size()) +
                                " floats, tensor has " + std::to_string(tensor.num_elements()));
  }
  Status s = DequantizeRow(tensor.type, tensor.bytes, out);
  if (!s.ok()) return InvalidArgumentError("tensor '" + tensor.name + "': " + s.message());
  return s;
}

StatusOr<std::string> QuantizeRow(GgmlType type, std::span<const float> in) {
  std::optional<GgmlTypeTraits> traits = GgmlTypeInfo(static_cast<uint32_t>(type));
  const bool supported = type == GgmlType::kF32 || type == GgmlType::kF16 ||
                         type == GgmlType::kBF16 || type == GgmlType::kQ8_0 ||
                         type == GgmlType::kQ4_0 || type == GgmlType::kQ4_1;
  if (!supported) {
    return InvalidArgumentError(std::string("cannot quantize to ggml type ") + TypeName(type) +
                                " (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1)");
  }
  const int64_t n = static_cast<int64_t>(in.size());
  if (n % traits->block_size != 0) {
    return InvalidArgumentError(std::to_string(n) + " elements are not a multiple of " +
                                traits->name + "'s block size " +
                                std::to_string(traits->block_size));
  }
  const int64_t nb = n / traits->block_size;
  std::string bytes(static_cast<size_t>(nb * traits->type_size), '\0');
  auto* y = reinterpret_cast<uint8_t*>(bytes.data());
  const float* x = in.data();
  switch (type) {
    case GgmlType::kF32:
      if (n > 0) std::memcpy(y, x, bytes.size());
      break;
    case GgmlType::kF16:
      for (int64_t i = 0; i < n; ++i) StoreHalf(y + 2 * i, x[i]);
      break;
    case GgmlType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = FloatToBF16(x[i]);
        std::memcpy(y + 2 * i, &h, sizeof(h));
      }
      break;
    case GgmlType::kQ8_0:
      QuantizeQ8_0(x, y, nb);
      break;
    case GgmlType::kQ4_0:
      QuantizeQ4_0(x, y, nb);
      break;
    case GgmlType::kQ4_1:
      QuantizeQ4_1(x, y, nb);
      break;
    default:
      break;  // excluded above
  }
  return bytes;
}

}  // namespace vtoken::model
