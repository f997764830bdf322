#include "lib/model/io/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>

namespace vtoken::model {
namespace {

namespace fs = std::filesystem;

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("vtoken_safetensors_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  // Writes a file by hand: 8-byte header length, header text, data bytes.
  std::string WriteRaw(const std::string& header, size_t data_bytes,
                       const std::string& name = "raw.safetensors") {
    std::string path = Path(name);
    std::ofstream out(path, std::ios::binary);
    uint64_t n = header.size();
    out.write(reinterpret_cast<const char*>(&n), sizeof(n));
    out << header;
    out << std::string(data_bytes, '\x11');
    return path;
  }

  // Opens `path`, expects failure with `code` and a message naming the file and `needle`.
  void ExpectOpenError(const std::string& path, StatusCode code, const std::string& needle) {
    StatusOr<SafetensorsFile> file = SafetensorsFile::Open(path);
    ASSERT_FALSE(file.ok());
    EXPECT_EQ(file.status().code(), code) << file.status().ToString();
    EXPECT_NE(file.status().message().find(path), std::string::npos) << file.status().ToString();
    EXPECT_NE(file.status().message().find(needle), std::string::npos)
        << file.status().ToString() << " lacks " << needle;
  }

  fs::path dir_;
};

template <typename T>
std::span<const std::byte> Bytes(const std::vector<T>& v) {
  return std::as_bytes(std::span<const T>(v));
}

TEST_F(SafetensorsTest, RoundTripIsBitExact) {
  std::vector<float> f32 = {1.0f,
                            -0.0f,
                            std::numeric_limits<float>::denorm_min(),
                            std::numeric_limits<float>::infinity(),
                            std::bit_cast<float>(0x7fc12345u),
                            3.14159f};
  std::vector<uint16_t> f16 = {0x3c00, 0x8001, 0x7bff};  // odd count: the next tensor is unaligned
  std::vector<uint16_t> bf16 = {0x3f80, 0xc000, 0x7f81, 0x0001};
  std::vector<float> scalar = {42.5f};
  std::vector<TensorToWrite> tensors = {
      {"w.f32", DType::kF32, {2, 3}, f32.data()},       {"w.f16", DType::kF16, {3}, f16.data()},
      {"w.bf16", DType::kBF16, {2, 1, 2}, bf16.data()}, {"empty", DType::kF32, {0, 4}, nullptr},
      {"scalar", DType::kF32, {}, scalar.data()},
  };
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"step", "17"}};
  const std::string path = Path("model.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, tensors, metadata).ok());

  StatusOr<SafetensorsFile> file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ(file->metadata(), metadata);
  ASSERT_EQ(file->tensors().size(), tensors.size());
  // tensors() is in data order, which is the write order here.
  for (size_t i = 0; i < tensors.size(); ++i) {
    EXPECT_EQ(file->tensors()[i].name, tensors[i].name);
  }
  const TensorView* t = file->Find("w.f32");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dtype, DType::kF32);
  EXPECT_EQ(t->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(t->num_elements(), 6);
  ASSERT_EQ(t->bytes.size(), 24u);
  EXPECT_EQ(std::memcmp(t->bytes.data(), f32.data(), 24), 0);
  t = file->Find("w.f16");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dtype, DType::kF16);
  EXPECT_TRUE(std::ranges::equal(t->bytes, Bytes(f16)));
  t = file->Find("w.bf16");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dtype, DType::kBF16);
  EXPECT_EQ(t->shape, (std::vector<int64_t>{2, 1, 2}));
  EXPECT_TRUE(std::ranges::equal(t->bytes, Bytes(bf16)));
  t = file->Find("empty");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->bytes.size(), 0u);
  EXPECT_EQ(t->num_elements(), 0);
  t = file->Find("scalar");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->num_elements(), 1);
  std::vector<float> out(1);
  ASSERT_TRUE(ConvertToFloat(*t, out).ok());
  EXPECT_EQ(out[0], 42.5f);
  EXPECT_EQ(file->Find("missing"), nullptr);

  // The data area starts 8-byte aligned and the temporary file is gone.
  std::ifstream raw(path, std::ios::binary);
  uint64_t header_len = 0;
  raw.read(reinterpret_cast<char*>(&header_len), sizeof(header_len));
  EXPECT_EQ(header_len % 8, 0u);
  EXPECT_EQ(fs::file_size(path), 8 + header_len + 24 + 6 + 8 + 0 + 4);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1);
}

TEST_F(SafetensorsTest, WriteReplacesExistingFile) {
  const std::string path = Path("x.safetensors");
  std::vector<float> a = {1, 2, 3}, b = {4};
  ASSERT_TRUE(WriteSafetensors(path, {{"a", DType::kF32, {3}, a.data()}}).ok());
  ASSERT_TRUE(WriteSafetensors(path, {{"b", DType::kF32, {1}, b.data()}}).ok());
  StatusOr<SafetensorsFile> file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ(file->Find("a"), nullptr);
  ASSERT_NE(file->Find("b"), nullptr);
  EXPECT_TRUE(file->metadata().empty());
}

TEST_F(SafetensorsTest, WriterRejectsBadTensors) {
  const std::string path = Path("bad.safetensors");
  float x = 0;
  struct Case {
    std::vector<TensorToWrite> tensors;
    std::string needle;
  };
  const Case cases[] = {
      {{{"a", DType::kF32, {1}, &x}, {"a", DType::kF32, {1}, &x}}, "duplicate tensor name 'a'"},
      {{{"__metadata__", DType::kF32, {1}, &x}}, "invalid tensor name '__metadata__'"},
      {{{"", DType::kF32, {1}, &x}}, "invalid tensor name ''"},
      {{{"neg", DType::kF32, {2, -1}, &x}}, "tensor 'neg': negative"},
      {{{"null", DType::kF16, {2}, nullptr}}, "tensor 'null': null data"},
  };
  for (const Case& c : cases) {
    Status s = WriteSafetensors(path, c.tensors);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
    EXPECT_NE(s.message().find(c.needle), std::string::npos) << s.ToString();
    EXPECT_FALSE(fs::exists(path));
  }
  Status s = WriteSafetensors(Path("no/such/dir/x.safetensors"), {});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("no/such/dir/x.safetensors"), std::string::npos);
}

TEST_F(SafetensorsTest, MoveKeepsViewsValid) {
  std::vector<float> a = {1, 2, 3, 4};
  const std::string path = Path("m.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"a", DType::kF32, {4}, a.data()}}).ok());
  StatusOr<SafetensorsFile> opened = SafetensorsFile::Open(path);
  ASSERT_TRUE(opened.ok());
  const TensorView* view = opened->Find("a");
  SafetensorsFile moved = std::move(*opened);
  SafetensorsFile assigned = std::move(moved);
  EXPECT_EQ(assigned.Find("a"), view);
  std::vector<float> out(4);
  ASSERT_TRUE(ConvertToFloat(*view, out).ok());
  EXPECT_EQ(out, a);
  EXPECT_EQ(assigned.path(), path);
}

TEST_F(SafetensorsTest, MissingFileIsNotFound) {
  ExpectOpenError(Path("nope.safetensors"), StatusCode::kNotFound, "no such file");
}

TEST_F(SafetensorsTest, FileShorterThanHeaderLength) {
  std::string path = Path("short.safetensors");
  std::ofstream(path, std::ios::binary) << "abcde";
  ExpectOpenError(path, StatusCode::kDataLoss, "shorter than the 8-byte header length");
}

TEST_F(SafetensorsTest, HeaderLengthBeyondFile) {
  std::string path = Path("long.safetensors");
  {
    std::ofstream out(path, std::ios::binary);
    uint64_t n = 1000;
    out.write(reinterpret_cast<const char*>(&n), sizeof(n));
    out << "{}";
  }
  ExpectOpenError(path, StatusCode::kDataLoss, "header length 1000 runs past the end");
}

TEST_F(SafetensorsTest, HugeHeaderLength) {
  std::string path = Path("huge.safetensors");
  {
    std::ofstream out(path, std::ios::binary);
    uint64_t n = uint64_t{1} << 40;
    out.write(reinterpret_cast<const char*>(&n), sizeof(n));
    out << "{}";
  }
  ExpectOpenError(path, StatusCode::kDataLoss, "exceeds the 100 MB limit");
}

TEST_F(SafetensorsTest, HeaderNotJson) {
  ExpectOpenError(WriteRaw("{\"a\": [", 0), StatusCode::kDataLoss, "header is not valid JSON");
}

TEST_F(SafetensorsTest, HeaderNotObject) {
  ExpectOpenError(WriteRaw("[1, 2]  ", 0), StatusCode::kDataLoss, "header is not a JSON object");
}

TEST_F(SafetensorsTest, EmptyHeaderObjectIsAValidEmptyFile) {
  StatusOr<SafetensorsFile> file = SafetensorsFile::Open(WriteRaw("{}      ", 0));
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_TRUE(file->tensors().empty());
}

TEST_F(SafetensorsTest, UnknownDtype) {
  ExpectOpenError(WriteRaw(R"({"w": {"dtype": "F33", "shape": [2], "data_offsets": [0, 8]}})", 8),
                  StatusCode::kDataLoss, "tensor 'w': unknown dtype 'F33'");
}

TEST_F(SafetensorsTest, KnownButUnsupportedDtype) {
  ExpectOpenError(WriteRaw(R"({"ids": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]}})", 8),
                  StatusCode::kInvalidArgument, "tensor 'ids': dtype 'I64' is not supported");
}

TEST_F(SafetensorsTest, BadShapes) {
  const char* shapes[] = {"3", "[2, -1]", "[2.0]", "[\"2\"]", "null"};
  for (const char* shape : shapes) {
    SCOPED_TRACE(shape);
    std::string header = std::string(R"({"w": {"dtype": "F32", "shape": )") + shape +
                         R"(, "data_offsets": [0, 8]}})";
    ExpectOpenError(WriteRaw(header, 8), StatusCode::kDataLoss, "tensor 'w': shape");
  }
}

TEST_F(SafetensorsTest, BadOffsets) {
  const char* offsets[] = {"[0]", "[0, 8, 16]", "[8, 4]", "[-1, 8]", "\"0-8\"", "[0.0, 8]"};
  for (const char* o : offsets) {
    SCOPED_TRACE(o);
    std::string header =
        std::string(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": )") + o + "}}";
    ExpectOpenError(WriteRaw(header, 8), StatusCode::kDataLoss, "tensor 'w': data_offsets");
  }
}

TEST_F(SafetensorsTest, OffsetsBeyondDataArea) {
  ExpectOpenError(WriteRaw(R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})", 12),
                  StatusCode::kDataLoss,
                  "tensor 'w': data_offsets [0,16] run past the data area (12 bytes)");
}

TEST_F(SafetensorsTest, SizeMismatch) {
  ExpectOpenError(WriteRaw(R"({"w": {"dtype": "BF16", "shape": [3], "data_offsets": [0, 8]}})", 8),
                  StatusCode::kDataLoss, "tensor 'w': holds 8 bytes but shape [3] x BF16 needs 6");
}

TEST_F(SafetensorsTest, MissingField) {
  ExpectOpenError(WriteRaw(R"({"w": {"dtype": "F32", "shape": [2]}})", 8), StatusCode::kDataLoss,
                  "tensor 'w': missing \"data_offsets\"");
}

TEST_F(SafetensorsTest, OverlappingTensors) {
  ExpectOpenError(WriteRaw(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                              "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                           12),
                  StatusCode::kDataLoss, "tensor 'b': overlaps tensor 'a'");
}

TEST_F(SafetensorsTest, GapBetweenTensors) {
  ExpectOpenError(WriteRaw(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                              "b": {"dtype": "F32", "shape": [2], "data_offsets": [12, 20]}})",
                           20),
                  StatusCode::kDataLoss, "tensor 'b': leaves a gap of 4 bytes");
}

TEST_F(SafetensorsTest, ToleratedGapsAreKeptAsTheLayoutError) {
  const std::string path = WriteRaw(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                   "b": {"dtype": "F32", "shape": [2], "data_offsets": [12, 20]}})",
                                    23);
  StatusOr<SafetensorsFile> f = SafetensorsFile::Open(path, /*tolerate_gaps=*/true);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->tensors().size(), 2u);
  EXPECT_EQ(f->layout_error().code(), StatusCode::kDataLoss);
  EXPECT_NE(f->layout_error().message().find("tensor 'b': leaves a gap of 4 bytes"),
            std::string::npos);
  StatusOr<SafetensorsFile> moved = std::move(*f);
  EXPECT_EQ(moved->layout_error().code(), StatusCode::kDataLoss);
}

TEST_F(SafetensorsTest, TrailingBytes) {
  ExpectOpenError(WriteRaw(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", 11),
                  StatusCode::kDataLoss, "3 trailing bytes after the last tensor");
}

TEST_F(SafetensorsTest, DuplicateNames) {
  ExpectOpenError(WriteRaw(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                              "a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
                           8),
                  StatusCode::kDataLoss, "tensor 'a': duplicate tensor name");
}

TEST_F(SafetensorsTest, BadMetadata) {
  ExpectOpenError(WriteRaw(R"({"__metadata__": {"step": 3}})", 0), StatusCode::kDataLoss,
                  "__metadata__ value of 'step' is not a string");
  ExpectOpenError(WriteRaw(R"({"__metadata__": [1]})", 0), StatusCode::kDataLoss,
                  "__metadata__ is not an object");
}

TEST_F(SafetensorsTest, TensorsAreOrderedByOffset) {
  StatusOr<SafetensorsFile> file = SafetensorsFile::Open(
      WriteRaw(R"({"z": {"dtype": "F16", "shape": [1], "data_offsets": [0, 2]},
                              "a": {"dtype": "F16", "shape": [3], "data_offsets": [2, 8]}})",
               8));
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  ASSERT_EQ(file->tensors().size(), 2u);
  EXPECT_EQ(file->tensors()[0].name, "z");
  EXPECT_EQ(file->tensors()[1].name, "a");
}

// Random byte flips and truncations of a valid file must give an error value or a file whose
// views all lie inside it, never a crash (run under ASan to see out-of-bounds reads).
TEST_F(SafetensorsTest, RandomCorruptionNeverCrashes) {
  std::vector<float> a = {1, 2, 3};
  std::vector<uint16_t> b = {4, 5};
  const std::string good = Path("good.safetensors");
  ASSERT_TRUE(WriteSafetensors(
                  good, {{"a", DType::kF32, {3}, a.data()}, {"b", DType::kBF16, {1, 2}, b.data()}},
                  {{"k", "v"}})
                  .ok());
  std::string bytes;
  {
    std::ifstream in(good, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  const std::string path = Path("mutant.safetensors");
  for (int iter = 0; iter < 200; ++iter) {
    std::string mutant = bytes;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) {
      mutant[rng() % mutant.size()] = static_cast<char>(rng() % 256);
    }
    if (rng() % 4 == 0) mutant.resize(rng() % mutant.size());
    std::ofstream(path, std::ios::binary | std::ios::trunc) << mutant;
    StatusOr<SafetensorsFile> file = SafetensorsFile::Open(path);
    if (!file.ok()) {
      ASSERT_TRUE(file.status().code() == StatusCode::kDataLoss ||
                  file.status().code() == StatusCode::kInvalidArgument)
          << file.status().ToString();
      continue;
    }
    for (const TensorView& t : file->tensors()) {
      ASSERT_EQ(static_cast<int64_t>(t.bytes.size()),
                t.num_elements() * static_cast<int64_t>(DTypeSize(t.dtype)));
      std::vector<float> out(t.num_elements());
      ASSERT_TRUE(ConvertToFloat(t, out).ok());
    }
  }
}

// Reference value of a binary16 bit pattern, built with ldexp (independent of the bit tricks).
double F16Reference(uint16_t h) {
  const int exp = (h >> 10) & 0x1f;
  const int mant = h & 0x3ff;
  const double sign = (h & 0x8000) ? -1.0 : 1.0;
  if (exp == 0) return sign * std::ldexp(mant, -24);
  if (exp == 31) return mant == 0 ? sign * INFINITY : NAN;
  return sign * std::ldexp(1024 + mant, exp - 25);
}

TEST(HalfConversionTest, F16KnownValues) {
  EXPECT_EQ(F16ToFloat(0x3c00), 1.0f);
  EXPECT_EQ(F16ToFloat(0xc000), -2.0f);
  EXPECT_EQ(F16ToFloat(0x7bff), 65504.0f);
  EXPECT_EQ(F16ToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(F16ToFloat(0x0400), std::ldexp(1.0f, -14));
  EXPECT_EQ(F16ToFloat(0x3555), 0.333251953125f);
  EXPECT_EQ(std::bit_cast<uint32_t>(F16ToFloat(0x8000)), 0x80000000u);
  EXPECT_EQ(F16ToFloat(0x7c00), INFINITY);
  EXPECT_EQ(F16ToFloat(0xfc00), -INFINITY);
  EXPECT_EQ(std::bit_cast<uint32_t>(F16ToFloat(0x7e01)), 0x7fc02000u);  // payload kept
}

TEST(HalfConversionTest, F16AllPatternsExactAndRoundTrip) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const uint16_t h = static_cast<uint16_t>(b);
    const float f = F16ToFloat(h);
    const double ref = F16Reference(h);
    if (std::isnan(ref)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << b;
      ASSERT_TRUE(std::isnan(F16ToFloat(FloatToF16(f)))) << std::hex << b;
      continue;
    }
    ASSERT_EQ(static_cast<double>(f), ref) << std::hex << b;
    ASSERT_EQ(FloatToF16(f), h) << std::hex << b;
  }
}

TEST(HalfConversionTest, FloatToF16RoundsToNearestEven) {
  EXPECT_EQ(FloatToF16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);      // tie, to even (down)
  EXPECT_EQ(FloatToF16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // tie, to even (up)
  EXPECT_EQ(FloatToF16(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)), 0x3c01);
  EXPECT_EQ(FloatToF16(65519.0f), 0x7bff);
  EXPECT_EQ(FloatToF16(65520.0f), 0x7c00);  // tie between 65504 and 2^16: overflows to inf
  EXPECT_EQ(FloatToF16(1e10f), 0x7c00);
  EXPECT_EQ(FloatToF16(-1e10f), 0xfc00);
  EXPECT_EQ(FloatToF16(std::ldexp(1.0f, -25)), 0x0000);         // tie with 0: to even
  EXPECT_EQ(FloatToF16(1.5f * std::ldexp(1.0f, -25)), 0x0001);  // above the tie
  EXPECT_EQ(FloatToF16(3 * std::ldexp(1.0f, -25)), 0x0002);     // 1.5 ulp: to even
  EXPECT_EQ(FloatToF16(std::ldexp(1.0f, -30)), 0x0000);
  EXPECT_EQ(FloatToF16(-0.0f), 0x8000);
  EXPECT_EQ(FloatToF16(std::ldexp(1023.75f, -24)), 0x0400);  // subnormal carries into normal
  EXPECT_EQ(FloatToF16(NAN) & 0x7e00, 0x7e00);
}

TEST(HalfConversionTest, BF16KnownValuesAndRounding) {
  EXPECT_EQ(BF16ToFloat(0x3f80), 1.0f);
  EXPECT_EQ(BF16ToFloat(0xc040), -3.0f);
  EXPECT_EQ(BF16ToFloat(0x7f80), INFINITY);
  EXPECT_EQ(BF16ToFloat(0x0001), std::bit_cast<float>(0x00010000u));
  EXPECT_EQ(FloatToBF16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);      // tie, to even (down)
  EXPECT_EQ(FloatToBF16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);  // tie, to even (up)
  EXPECT_EQ(FloatToBF16(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(FloatToBF16(std::bit_cast<float>(0x7f800001u)), 0x7fc0);  // NaN stays NaN
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const uint16_t h = static_cast<uint16_t>(b);
    const float f = BF16ToFloat(h);
    ASSERT_EQ(std::bit_cast<uint32_t>(f), b << 16);
    if (!std::isnan(f)) {
      ASSERT_EQ(FloatToBF16(f), h) << std::hex << b;
    }
  }
}

TEST_F(SafetensorsTest, ConvertToFloatAllDtypes) {
  std::vector<uint16_t> f16 = {0x3c00, 0xc000, 0x3555};
  std::vector<uint16_t> bf16 = {0x3f80, 0xc040};
  std::vector<float> f32 = {0.5f, -7.25f};
  const std::string path = Path("c.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"h", DType::kF16, {3}, f16.data()},
                                      {"f", DType::kF32, {2}, f32.data()},
                                      {"b", DType::kBF16, {2}, bf16.data()}})
                  .ok());
  StatusOr<SafetensorsFile> file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok());
  std::vector<float> out(3);
  ASSERT_TRUE(ConvertToFloat(*file->Find("h"), out).ok());
  EXPECT_EQ(out, (std::vector<float>{1.0f, -2.0f, 0.333251953125f}));
  out.resize(2);
  ASSERT_TRUE(ConvertToFloat(*file->Find("f"), out).ok());  // unaligned source (after 6 bytes)
  EXPECT_EQ(out, f32);
  ASSERT_TRUE(ConvertToFloat(*file->Find("b"), out).ok());
  EXPECT_EQ(out, (std::vector<float>{1.0f, -3.0f}));
  Status s = ConvertToFloat(*file->Find("h"), out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("tensor 'h'"), std::string::npos) << s.ToString();
}

TEST(DTypeTest, NamesAndSizes) {
  for (DType d : {DType::kF32, DType::kF16, DType::kBF16}) {
    EXPECT_EQ(DTypeFromName(DTypeName(d)), d);
  }
  EXPECT_EQ(DTypeSize(DType::kF32), 4u);
  EXPECT_EQ(DTypeSize(DType::kF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  EXPECT_EQ(DTypeFromName("f32"), std::nullopt);
}

}  // namespace
}  // namespace vtoken::model
