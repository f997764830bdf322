#include "lib/model/io/ggml_quants.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "lib/model/io/safetensors.h"

namespace vtoken::model {
namespace {

using Bytes = std::vector<uint8_t>;

std::span<const std::byte> AsBytes(const Bytes& b) { return std::as_bytes(std::span(b)); }

void PutHalf(Bytes& b, size_t at, float v) {
  const uint16_t h = FloatToF16(v);
  std::memcpy(&b[at], &h, 2);
}

float GetHalf(const Bytes& b, size_t at) {
  uint16_t h;
  std::memcpy(&h, &b[at], 2);
  return F16ToFloat(h);
}

std::vector<float> Dequant(GgmlType type, const Bytes& b, size_t n) {
  std::vector<float> out(n, -12345.0f);
  Status s = DequantizeRow(type, AsBytes(b), out);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return out;
}

// Packs eight 6-bit (scale, min) pairs as quantize_row_q4_K_ref does.
Bytes PackScalesK4(const int sc[8], const int m[8]) {
  Bytes s(12, 0);
  for (int j = 0; j < 8; ++j) {
    if (j < 4) {
      s[j] = static_cast<uint8_t>(sc[j]);
      s[j + 4] = static_cast<uint8_t>(m[j]);
    } else {
      s[j + 4] = static_cast<uint8_t>((sc[j] & 0xF) | ((m[j] & 0xF) << 4));
      s[j - 4] |= static_cast<uint8_t>((sc[j] >> 4) << 6);
      s[j] |= static_cast<uint8_t>((m[j] >> 4) << 6);
    }
  }
  return s;
}

// The naive models below compute each element on its own from the layout's description (which
// byte, which bits, which scale), in the float order of ggml's reference; the library walks the
// blocks instead.

// Element e of a 32-element Q4/Q5 block: its low nibble is in qs[e % 16], low half for e < 16.
int Nibble32(const uint8_t* qs, int e) { return e < 16 ? qs[e] & 0xF : qs[e - 16] >> 4; }

float ModelQ4_0(const Bytes& b, int64_t e) {
  const size_t x = static_cast<size_t>(e / 32) * 18;
  return static_cast<float>(Nibble32(&b[x + 2], e % 32) - 8) * GetHalf(b, x);
}
float ModelQ4_1(const Bytes& b, int64_t e) {
  const size_t x = static_cast<size_t>(e / 32) * 20;
  return static_cast<float>(Nibble32(&b[x + 4], e % 32)) * GetHalf(b, x) + GetHalf(b, x + 2);
}
int Q5Value(const Bytes& b, size_t qh_at, size_t qs_at, int e) {
  uint32_t qh;
  std::memcpy(&qh, &b[qh_at], 4);
  return Nibble32(&b[qs_at], e) | static_cast<int>(((qh >> e) & 1) << 4);
}
float ModelQ5_0(const Bytes& b, int64_t e) {
  const size_t x = static_cast<size_t>(e / 32) * 22;
  return static_cast<float>(Q5Value(b, x + 2, x + 6, e % 32) - 16) * GetHalf(b, x);
}
float ModelQ5_1(const Bytes& b, int64_t e) {
  const size_t x = static_cast<size_t>(e / 32) * 24;
  return static_cast<float>(Q5Value(b, x + 4, x + 8, e % 32)) * GetHalf(b, x) + GetHalf(b, x + 2);
}
float ModelQ8_0(const Bytes& b, int64_t e) {
  const size_t x = static_cast<size_t>(e / 32) * 34;
  return static_cast<float>(static_cast<int8_t>(b[x + 2 + e % 32])) * GetHalf(b, x);
}

// Sub-block s's (scale, min) from the 12 packed bytes, read bit by bit.
void ModelScaleMin(const uint8_t* s, int sub, int* sc, int* m) {
  if (sub < 4) {
    *sc = s[sub] & 0x3F;
    *m = s[sub + 4] & 0x3F;
  } else {
    *sc = (s[sub + 4] & 0x0F) + 16 * (s[sub - 4] >> 6);
    *m = (s[sub + 4] >> 4) + 16 * (s[sub] >> 6);
  }
}

float ModelQ4_K(const Bytes& b, int64_t e) {
  const size_t x = static_cast<size_t>(e / 256) * 144;
  const int r = static_cast<int>(e % 256), sub = r / 32, l = r % 32;
  int sc, m;
  ModelScaleMin(&b[x + 4], sub, &sc, &m);
  const uint8_t byte = b[x + 16 + 32 * (sub / 2) + l];
  const int q = sub % 2 == 0 ? byte & 0xF : byte >> 4;
  return GetHalf(b, x) * static_cast<float>(sc) * static_cast<float>(q) -
         GetHalf(b, x + 2) * static_cast<float>(m);
}

float ModelQ5_K(const Bytes& b, int64_t e) {
  const size_t x = static_cast<size_t>(e / 256) * 176;
  const int r = static_cast<int>(e % 256), sub = r / 32, l = r % 32;
  int sc, m;
  ModelScaleMin(&b[x + 4], sub, &sc, &m);
  const uint8_t byte = b[x + 48 + 32 * (sub / 2) + l];
  const int q = (sub % 2 == 0 ? byte & 0xF : byte >> 4) + 16 * ((b[x + 16 + l] >> sub) & 1);
  return GetHalf(b, x) * static_cast<float>(sc) * static_cast<float>(q) -
         GetHalf(b, x + 2) * static_cast<float>(m);
}

float ModelQ6_K(const Bytes& b, int64_t e) {
  const size_t x = static_cast<size_t>(e / 256) * 210;
  const int r = static_cast<int>(e % 256), half = r / 128, k = (r % 128) / 32, l = r % 32;
  const uint8_t low = b[x + 64 * half + l + 32 * (k & 1)];
  const int q =
      ((k < 2 ? low & 0xF : low >> 4) | (((b[x + 128 + 32 * half + l] >> (2 * k)) & 3) << 4)) - 32;
  const int8_t sc = static_cast<int8_t>(b[x + 192 + 8 * half + l / 16 + 2 * k]);
  return GetHalf(b, x + 208) * static_cast<float>(sc) * static_cast<float>(q);
}

// Random blocks whose f16 fields are finite (the dequantized values then are too).
Bytes RandomBlocks(GgmlType type, int64_t num_blocks, std::mt19937& rng,
                   std::initializer_list<size_t> half_fields) {
  const GgmlTypeTraits t = *GgmlTypeInfo(static_cast<uint32_t>(type));
  Bytes b(static_cast<size_t>(num_blocks * t.type_size));
  for (uint8_t& v : b) v = static_cast<uint8_t>(rng());
  std::uniform_real_distribution<float> scale(-2.0f, 2.0f);
  for (int64_t i = 0; i < num_blocks; ++i) {
    for (size_t at : half_fields) PutHalf(b, static_cast<size_t>(i * t.type_size) + at, scale(rng));
  }
  return b;
}

void ExpectBitEqual(const std::vector<float>& got, const std::vector<float>& want,
                    const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i]))
        << what << " element " << i << ": " << got[i] << " vs " << want[i];
  }
}

TEST(GgmlQuantsTest, PlainTypes) {
  const std::vector<float> f32 = {1.5f, -0.0f, std::numeric_limits<float>::denorm_min(),
                                  std::numeric_limits<float>::infinity()};
  Bytes b(16);
  std::memcpy(b.data(), f32.data(), 16);
  ExpectBitEqual(Dequant(GgmlType::kF32, b, 4), f32, "F32");

  const uint16_t f16[] = {0x3c00, 0xc000, 0x7bff, 0x0001, 0x7c00, 0x7e01};
  b.assign(12, 0);
  std::memcpy(b.data(), f16, 12);
  std::vector<float> out = Dequant(GgmlType::kF16, b, 6);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -2.0f);
  EXPECT_EQ(out[2], 65504.0f);
  EXPECT_EQ(out[3], std::ldexp(1.0f, -24));
  EXPECT_EQ(out[4], std::numeric_limits<float>::infinity());
  EXPECT_EQ(std::bit_cast<uint32_t>(out[5]), 0x7fc02000u);  // payload kept

  const uint16_t bf16[] = {0x3f80, 0xc040, 0x0001};
  b.assign(6, 0);
  std::memcpy(b.data(), bf16, 6);
  out = Dequant(GgmlType::kBF16, b, 3);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -3.0f);
  EXPECT_EQ(std::bit_cast<uint32_t>(out[2]), 0x00010000u);
}

TEST(GgmlQuantsTest, Q4_0KnownBlock) {
  Bytes b(18, 0);
  PutHalf(b, 0, 0.5f);
  for (int j = 0; j < 16; ++j) b[2 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  std::vector<float> out = Dequant(GgmlType::kQ4_0, b, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(out[j], (j - 8) * 0.5f) << j;
    EXPECT_EQ(out[16 + j], (7 - j) * 0.5f) << j;
  }
}

TEST(GgmlQuantsTest, Q4_1KnownBlock) {
  Bytes b(20, 0);
  PutHalf(b, 0, 0.25f);
  PutHalf(b, 2, -1.0f);
  for (int j = 0; j < 16; ++j) b[4 + j] = static_cast<uint8_t>(j | (3 << 4));
  std::vector<float> out = Dequant(GgmlType::kQ4_1, b, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(out[j], j * 0.25f - 1.0f) << j;
    EXPECT_EQ(out[16 + j], -0.25f) << j;
  }
}

TEST(GgmlQuantsTest, Q5KnownBlocks) {
  // qh bit e is element e's fifth bit: bits 0 and 17 set, the rest clear.
  Bytes b(22, 0);
  PutHalf(b, 0, 2.0f);
  const uint32_t qh = (1u << 0) | (1u << 17);
  std::memcpy(&b[2], &qh, 4);
  for (int j = 0; j < 16; ++j) b[6 + j] = static_cast<uint8_t>(0x0F | (0x01 << 4));
  std::vector<float> out = Dequant(GgmlType::kQ5_0, b, 32);
  EXPECT_EQ(out[0], (31 - 16) * 2.0f);   // 0x0F | 0x10
  EXPECT_EQ(out[1], (15 - 16) * 2.0f);   // 0x0F
  EXPECT_EQ(out[16], (1 - 16) * 2.0f);   // 0x01
  EXPECT_EQ(out[17], (17 - 16) * 2.0f);  // 0x01 | 0x10

  Bytes b1(24, 0);
  PutHalf(b1, 0, 0.5f);
  PutHalf(b1, 2, 3.0f);
  const uint32_t qh1 = 0x80000000u;  // element 31 only
  std::memcpy(&b1[4], &qh1, 4);
  for (int j = 0; j < 16; ++j) b1[8 + j] = static_cast<uint8_t>(0xF0 | j);
  out = Dequant(GgmlType::kQ5_1, b1, 32);
  EXPECT_EQ(out[2], 2 * 0.5f + 3.0f);
  EXPECT_EQ(out[30], 15 * 0.5f + 3.0f);
  EXPECT_EQ(out[31], 31 * 0.5f + 3.0f);
}

TEST(GgmlQuantsTest, Q8_0KnownBlock) {
  Bytes b(34, 0);
  PutHalf(b, 0, 0.125f);
  for (int j = 0; j < 32; ++j) b[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(j * 8 - 128));
  std::vector<float> out = Dequant(GgmlType::kQ8_0, b, 32);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(out[j], (j * 8 - 128) * 0.125f) << j;
}

TEST(GgmlQuantsTest, Q4_KScalesFromHighBits) {
  // Sub-blocks 4-7 take their scales' and mins' top two bits from bytes 0-7: sub-block 5's scale
  // 43 = 0b10'1011 and min 53 = 0b11'0101.
  const int sc[8] = {1, 2, 3, 63, 4, 43, 17, 32};
  const int m[8] = {5, 0, 63, 7, 16, 53, 1, 48};
  const Bytes scales = PackScalesK4(sc, m);
  EXPECT_EQ(scales[9], 0x5B);      // sub-block 5: scale low nibble 0xB, min low nibble 0x5
  EXPECT_EQ(scales[1] >> 6, 2);    // scale 43's top bits
  EXPECT_EQ(scales[5] >> 6, 3);    // min 53's top bits
  EXPECT_EQ(scales[1] & 0x3F, 2);  // sub-block 1's own scale beneath them
  Bytes b(144, 0);
  PutHalf(b, 0, 0.5f);
  PutHalf(b, 2, 0.25f);
  std::copy(scales.begin(), scales.end(), b.begin() + 4);
  for (int l = 0; l < 32; ++l) {
    for (int pair = 0; pair < 4; ++pair) {
      b[16 + 32 * pair + l] = static_cast<uint8_t>((l % 16) | ((15 - l % 16) << 4));
    }
  }
  std::vector<float> out = Dequant(GgmlType::kQ4_K, b, 256);
  for (int sub = 0; sub < 8; ++sub) {
    for (int l = 0; l < 32; ++l) {
      const int q = sub % 2 == 0 ? l % 16 : 15 - l % 16;
      const float want = 0.5f * static_cast<float>(sc[sub]) * static_cast<float>(q) -
                         0.25f * static_cast<float>(m[sub]);
      ASSERT_EQ(out[32 * sub + l], want) << "sub-block " << sub << " element " << l;
    }
  }
  EXPECT_EQ(out[5 * 32 + 3], 0.5f * 43 * 12 - 0.25f * 53);
}

TEST(GgmlQuantsTest, Q5_KKnownBlock) {
  const int sc[8] = {10, 20, 30, 40, 50, 60, 33, 1};
  const int m[8] = {0, 1, 2, 3, 62, 35, 19, 63};
  const Bytes scales = PackScalesK4(sc, m);
  Bytes b(176, 0);
  PutHalf(b, 0, 0.125f);
  PutHalf(b, 2, 1.0f);
  std::copy(scales.begin(), scales.end(), b.begin() + 4);
  for (int l = 0; l < 32; ++l) b[16 + l] = static_cast<uint8_t>(l % 2 == 0 ? 0xAA : 0x55);
  for (int i = 0; i < 128; ++i) b[48 + i] = 0x97;  // low nibble 7, high nibble 9
  std::vector<float> out = Dequant(GgmlType::kQ5_K, b, 256);
  for (int sub = 0; sub < 8; ++sub) {
    for (int l = 0; l < 32; ++l) {
      const int high = ((l % 2 == 0 ? 0xAA : 0x55) >> sub) & 1;
      const int q = (sub % 2 == 0 ? 7 : 9) + 16 * high;
      const float want = 0.125f * static_cast<float>(sc[sub]) * static_cast<float>(q) -
                         1.0f * static_cast<float>(m[sub]);
      ASSERT_EQ(out[32 * sub + l], want) << "sub-block " << sub << " element " << l;
    }
  }
}

TEST(GgmlQuantsTest, Q6_KKnownBlock) {
  Bytes b(210, 0);
  for (int i = 0; i < 128; ++i) b[i] = static_cast<uint8_t>((i % 16) | ((15 - i % 16) << 4));
  for (int i = 0; i < 64; ++i) b[128 + i] = 0b11'10'01'00;  // qh pairs 0, 1, 2, 3 for k = 0..3
  for (int i = 0; i < 16; ++i) b[192 + i] = static_cast<uint8_t>(static_cast<int8_t>(i - 8));
  PutHalf(b, 208, 0.5f);
  std::vector<float> out = Dequant(GgmlType::kQ6_K, b, 256);
  for (int e = 0; e < 256; ++e) {
    const int half = e / 128, k = (e % 128) / 32, l = e % 32;
    const int ql_index = 64 * half + l + 32 * (k & 1);
    const int low = k < 2 ? ql_index % 16 : 15 - ql_index % 16;
    const int q = (low | (k << 4)) - 32;
    const int scale = 8 * half + l / 16 + 2 * k - 8;
    ASSERT_EQ(out[e], 0.5f * static_cast<float>(scale) * static_cast<float>(q)) << e;
  }
  EXPECT_EQ(out[0], 0.5f * -8 * -32);
  EXPECT_EQ(out[255], 0.5f * 7 * ((0 | (3 << 4)) - 32));
}

// Random blocks against the element-by-element models, bit for bit.
TEST(GgmlQuantsTest, RandomBlocksMatchModels) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  struct Case {
    GgmlType type;
    float (*model)(const Bytes&, int64_t);
    std::initializer_list<size_t> halves;
  };
  const Case cases[] = {
      {GgmlType::kQ4_0, ModelQ4_0, {0}},    {GgmlType::kQ4_1, ModelQ4_1, {0, 2}},
      {GgmlType::kQ5_0, ModelQ5_0, {0}},    {GgmlType::kQ5_1, ModelQ5_1, {0, 2}},
      {GgmlType::kQ8_0, ModelQ8_0, {0}},    {GgmlType::kQ4_K, ModelQ4_K, {0, 2}},
      {GgmlType::kQ5_K, ModelQ5_K, {0, 2}}, {GgmlType::kQ6_K, ModelQ6_K, {208}},
  };
  for (const Case& c : cases) {
    const GgmlTypeTraits t = *GgmlTypeInfo(static_cast<uint32_t>(c.type));
    const int64_t num_blocks = 7;
    const Bytes b = RandomBlocks(c.type, num_blocks, rng, c.halves);
    const size_t n = static_cast<size_t>(num_blocks * t.block_size);
    std::vector<float> want(n);
    for (size_t e = 0; e < n; ++e) want[e] = c.model(b, static_cast<int64_t>(e));
    ExpectBitEqual(Dequant(c.type, b, n), want, t.name);
  }
}

TEST(GgmlQuantsTest, DequantizeRowChecksSizesAndType) {
  Bytes b(34, 0);
  std::vector<float> out(33);
  Status s = DequantizeRow(GgmlType::kQ8_0, AsBytes(b), out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("block size 32"), std::string::npos) << s.ToString();

  out.resize(64);
  s = DequantizeRow(GgmlType::kQ8_0, AsBytes(b), out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("take 68 bytes, not 34"), std::string::npos) << s.ToString();

  Bytes q2(84, 0);
  out.resize(256);
  s = DequantizeRow(GgmlType::kQ2_K, AsBytes(q2), out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("Q2_K"), std::string::npos) << s.ToString();
  EXPECT_FALSE(CanDequantize(GgmlType::kQ2_K));
  EXPECT_TRUE(CanDequantize(GgmlType::kQ6_K));

  out.clear();
  EXPECT_TRUE(DequantizeRow(GgmlType::kQ4_K, {}, out).ok());
}

TEST(GgmlQuantsTest, DequantizeTensorNamesTheTensor) {
  Bytes b(18, 0);
  GgufTensor t;
  t.name = "blk.0.ffn_up.weight";
  t.type = GgmlType::kQ4_0;
  t.dims = {32};
  t.bytes = AsBytes(b);
  std::vector<float> out(16);
  Status s = DequantizeTensor(t, out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("blk.0.ffn_up.weight"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("Q4_0"), std::string::npos) << s.ToString();
  out.resize(32);
  EXPECT_TRUE(DequantizeTensor(t, out).ok());
  EXPECT_EQ(out[0], -0.0f);

  t.type = GgmlType::kIQ2_XXS;
  s = DequantizeTensor(t, out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("IQ2_XXS"), std::string::npos) << s.ToString();
}

TEST(GgmlQuantsTest, QuantizeQ8_0RoundsHalfAwayFromZero) {
  std::vector<float> x(32, 0.0f);
  x[0] = 127.0f;
  x[1] = -127.0f;
  x[2] = 63.5f;
  x[3] = -0.5f;
  x[4] = 0.49f;
  x[5] = 2.5f;
  StatusOr<std::string> q = QuantizeRow(GgmlType::kQ8_0, x);
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  ASSERT_EQ(q->size(), 34u);
  const auto* p = reinterpret_cast<const uint8_t*>(q->data());
  uint16_t d;
  std::memcpy(&d, p, 2);
  EXPECT_EQ(d, 0x3c00);  // amax / 127 = 1
  const int8_t want[] = {127, -127, 64, -1, 0, 3};
  for (int j = 0; j < 6; ++j) EXPECT_EQ(static_cast<int8_t>(p[2 + j]), want[j]) << j;
}

TEST(GgmlQuantsTest, QuantizeQ4_0AndQ4_1KnownBlocks) {
  std::vector<float> x(32, 0.0f);
  x[0] = -8.0f;  // the largest magnitude: d = -8 / -8 = 1
  x[1] = 7.0f;
  x[2] = 7.6f;   // 16.1 -> clamped to 15
  x[3] = -0.6f;  // 7.9 -> 7
  x[16] = 1.0f;  // element 16 is the high nibble of byte 0
  StatusOr<std::string> q = QuantizeRow(GgmlType::kQ4_0, x);
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  const auto* p = reinterpret_cast<const uint8_t*>(q->data());
  EXPECT_EQ(p[0] | (p[1] << 8), 0x3c00);
  EXPECT_EQ(p[2], 0 | (9 << 4));
  EXPECT_EQ(p[3], 15 | (8 << 4));
  EXPECT_EQ(p[4], 15 | (8 << 4));
  EXPECT_EQ(p[5], 7 | (8 << 4));

  std::vector<float> y(32, 0.0f);
  y[0] = -1.0f;  // min
  y[1] = 14.0f;  // max: d = 15 / 15 = 1
  y[2] = 2.4f;   // 3.4 + 0.5 -> 3
  q = QuantizeRow(GgmlType::kQ4_1, y);
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  p = reinterpret_cast<const uint8_t*>(q->data());
  EXPECT_EQ(p[0] | (p[1] << 8), 0x3c00);  // d = 1
  EXPECT_EQ(p[2] | (p[3] << 8), 0xbc00);  // m = -1
  EXPECT_EQ(p[4], 0 | (1 << 4));          // -1 -> 0; element 16 (0) -> 1
  EXPECT_EQ(p[5], 15 | (1 << 4));
  EXPECT_EQ(p[6], 3 | (1 << 4));
}

// Quantizing and dequantizing stays within half a step (Q8_0) or one step (Q4_0, Q4_1) of the
// input, plus the f16 scale's rounding, and an all-zero block is exact.
TEST(GgmlQuantsTest, QuantizeRoundTripBounds) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> x(32 * 9);
  for (float& v : x) v = normal(rng);
  std::fill(x.begin() + 32 * 8, x.end(), 0.0f);
  for (GgmlType type : {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kF16,
                        GgmlType::kBF16, GgmlType::kF32}) {
    const GgmlTypeTraits t = *GgmlTypeInfo(static_cast<uint32_t>(type));
    StatusOr<std::string> q = QuantizeRow(type, x);
    ASSERT_TRUE(q.ok()) << q.status().ToString();
    std::vector<float> back(x.size());
    ASSERT_TRUE(DequantizeRow(type, std::as_bytes(std::span(*q)), back).ok());
    for (size_t b = 0; b < x.size() / 32; ++b) {
      float amax = 0, lo = x[32 * b], hi = x[32 * b];
      for (size_t j = 32 * b; j < 32 * b + 32; ++j) {
        amax = std::max(amax, std::fabs(x[j]));
        lo = std::min(lo, x[j]);
        hi = std::max(hi, x[j]);
      }
      const float step = type == GgmlType::kQ8_0   ? amax / 127 / 2
                         : type == GgmlType::kQ4_0 ? amax / 8
                         : type == GgmlType::kQ4_1 ? (hi - lo) / 15
                                                   : amax / 128;
      for (size_t j = 32 * b; j < 32 * b + 32; ++j) {
        // The scale is stored as f16: up to 2^-11 relative, times up to 127 steps.
        ASSERT_LE(std::fabs(back[j] - x[j]), step + amax / 512) << t.name << " element " << j;
      }
    }
    for (size_t j = 32 * 8; j < x.size(); ++j) ASSERT_EQ(back[j], 0.0f) << t.name;
  }
}

TEST(GgmlQuantsTest, QuantizeNonFiniteIsDeterministic) {
  std::vector<float> x(32, 1.0f);
  x[3] = std::numeric_limits<float>::quiet_NaN();
  StatusOr<std::string> q = QuantizeRow(GgmlType::kQ8_0, x);
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(static_cast<uint8_t>((*q)[2 + 3]), 0);  // (int8_t)NaN on x86-64
  EXPECT_EQ(static_cast<int8_t>((*q)[2 + 4]), 127);
}

TEST(GgmlQuantsTest, QuantizeRejectsUnsupportedTypesAndPartialBlocks) {
  std::vector<float> x(256, 0.0f);
  StatusOr<std::string> q = QuantizeRow(GgmlType::kQ4_K, x);
  EXPECT_EQ(q.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(q.status().message().find("Q4_K"), std::string::npos);
  x.resize(40);
  q = QuantizeRow(GgmlType::kQ4_1, x);
  EXPECT_EQ(q.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(q.status().message().find("block size 32"), std::string::npos);
  q = QuantizeRow(GgmlType::kF16, x);
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->size(), 80u);
}

}  // namespace
}  // namespace vtoken::model
