#include "lib/model/io/gguf.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <sstream>

#include "lib/model/io/ggml_quants.h"

namespace vtoken::model {
namespace {

namespace fs = std::filesystem;

// Builds GGUF bytes field by field, independently of WriteGguf, and remembers where each field
// starts so that tests can expect the byte offset in an error.
class RawGguf {
 public:
  RawGguf& Magic(std::string_view m = "GGUF") {
    bytes_.append(m);
    return *this;
  }
  RawGguf& U8(uint8_t v) { return Put(v); }
  RawGguf& U32(uint32_t v) { return Put(v); }
  RawGguf& U64(uint64_t v) { return Put(v); }
  RawGguf& Str(std::string_view s) {
    U64(s.size());
    bytes_.append(s);
    return *this;
  }
  // magic, version, tensor count, metadata count.
  RawGguf& Header(uint64_t num_tensors, uint64_t num_entries, uint32_t version = 3) {
    return Magic().U32(version).U64(num_tensors).U64(num_entries);
  }
  RawGguf& KeyU32(std::string_view key, uint32_t v) {
    return Str(key).U32(static_cast<uint32_t>(GgufType::kUint32)).U32(v);
  }
  RawGguf& TensorInfo(std::string_view name, std::vector<uint64_t> dims, uint32_t type,
                      uint64_t offset) {
    Str(name).U32(static_cast<uint32_t>(dims.size()));
    for (uint64_t d : dims) U64(d);
    return U32(type).U64(offset);
  }
  RawGguf& PadTo(uint64_t alignment) {
    bytes_.resize((bytes_.size() + alignment - 1) / alignment * alignment, '\0');
    return *this;
  }
  RawGguf& Fill(size_t n, char c = '\x11') {
    bytes_.append(n, c);
    return *this;
  }
  // The offset the next field will have.
  size_t at() const { return bytes_.size(); }
  const std::string& bytes() const { return bytes_; }

 private:
  template <typename T>
  RawGguf& Put(T v) {
    bytes_.append(reinterpret_cast<const char*>(&v), sizeof(v));
    return *this;
  }
  std::string bytes_;
};

constexpr uint32_t kF32 = 0, kQ4_0 = 2, kQ8_0 = 8;

class GgufTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("vtoken_gguf_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  // Writes a new file (truncating an old one in place is ~3 ms on ext4 with discard).
  std::string WriteBytes(const std::string& bytes, const std::string& name = "raw.gguf") {
    const std::string path = Path(name);
    fs::remove(path);
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }

  // Opens `path`, expects `code` and a message naming the file and containing `needle`.
  void ExpectOpenError(const std::string& path, StatusCode code, const std::string& needle) {
    StatusOr<GgufFile> file = GgufFile::Open(path);
    ASSERT_FALSE(file.ok()) << "opened, expected " << needle;
    EXPECT_EQ(file.status().code(), code) << file.status().ToString();
    EXPECT_EQ(file.status().message().rfind(path + ": ", 0), 0u) << file.status().ToString();
    EXPECT_NE(file.status().message().find(needle), std::string::npos)
        << file.status().ToString() << "\n  lacks: " << needle;
    EXPECT_EQ(file.status().message().find('\n'), std::string::npos) << "not one line";
  }

  fs::path dir_;
};

template <typename T>
std::span<const std::byte> AsBytes(const std::vector<T>& v) {
  return std::as_bytes(std::span<const T>(v));
}

// Metadata holding every value type, arrays of each, nested arrays and the edge values.
GgufMetadata AllTypesMetadata() {
  GgufMetadata m;
  m.Set("general.name", GgufValue::String("tiny \xE2\x9C\x93 model"));
  m.Set("u8", GgufValue::Integer(GgufType::kUint8, 255));
  m.Set("i8", GgufValue::Integer(GgufType::kInt8, -128));
  m.Set("u16", GgufValue::Integer(GgufType::kUint16, 65535));
  m.Set("i16", GgufValue::Integer(GgufType::kInt16, -32768));
  m.Set("u32", GgufValue::Uint32(4294967295u));
  m.Set("i32", GgufValue::Int32(-2147483647 - 1));
  m.Set("u64.small", GgufValue::Uint64(7));
  m.Set("u64.big", GgufValue::Uint64(std::numeric_limits<uint64_t>::max()));
  m.Set("i64", GgufValue::Integer(GgufType::kInt64, std::numeric_limits<int64_t>::min()));
  m.Set("f32", GgufValue::Float32(-1.5e-3f));
  m.Set("f64", GgufValue::Float64(3.141592653589793));
  m.Set("bool.true", GgufValue::Bool(true));
  m.Set("bool.false", GgufValue::Bool(false));
  m.Set("empty.string", GgufValue::String(""));
  m.Set("tokens", GgufValue::StringArray({"<s>", "", "hello", std::string("\0x", 2)}));
  m.Set("scores", GgufValue::Float32Array({0.0f, -1.25f, 1e30f}));
  m.Set("types", GgufValue::Int32Array({1, -2, 3}));
  m.Set("empty.array", GgufValue::Array(GgufType::kUint16, {}));
  m.Set("bools",
        GgufValue::Array(GgufType::kBool, {GgufValue::Bool(true), GgufValue::Bool(false)}));
  m.Set("f64s", GgufValue::Array(GgufType::kFloat64, {GgufValue::Float64(-0.0)}));
  m.Set("u64s", GgufValue::Array(GgufType::kUint64, {GgufValue::Uint64(1ull << 63)}));
  m.Set("nested", GgufValue::Array(GgufType::kArray, {GgufValue::Int32Array({1, 2}),
                                                      GgufValue::Array(GgufType::kInt32, {}),
                                                      GgufValue::Int32Array({-3})}));
  m.Set("nested.strings",
        GgufValue::Array(GgufType::kArray,
                         {GgufValue::Array(GgufType::kArray, {GgufValue::StringArray({"a", "bc"})}),
                          GgufValue::Array(GgufType::kArray, {})}));
  return m;
}

struct TestTensor {
  std::string name;
  GgmlType type;
  std::vector<int64_t> dims;
  std::vector<uint8_t> data;
};

std::vector<TestTensor> SomeTensors() {
  std::vector<TestTensor> tensors = {
      {"token_embd.weight", GgmlType::kF32, {3, 2}, {}},
      {"blk.0.attn_q.weight", GgmlType::kQ8_0, {64, 1, 1}, {}},
      {"blk.0.ffn_down.weight", GgmlType::kQ4_K, {256, 2}, {}},
      {"odd.f16", GgmlType::kF16, {5, 1, 1, 1}, {}},  // 10 bytes: the next one needs padding
      {"blk.0.ffn_up.weight", GgmlType::kQ6_K, {256}, {}},
  };
  uint8_t fill = 1;
  for (TestTensor& t : tensors) {
    const GgmlTypeTraits traits = *GgmlTypeInfo(static_cast<uint32_t>(t.type));
    int64_t n = 1;
    for (int64_t d : t.dims) n *= d;
    t.data.resize(static_cast<size_t>(n / traits.block_size * traits.type_size));
    for (uint8_t& b : t.data) b = fill++;
  }
  return tensors;
}

std::vector<GgufTensorToWrite> ToWrite(const std::vector<TestTensor>& tensors) {
  std::vector<GgufTensorToWrite> out;
  for (const TestTensor& t : tensors) out.push_back({t.name, t.type, t.dims, AsBytes(t.data)});
  return out;
}

TEST_F(GgufTest, RoundTripEveryValueTypeVersionAndAlignment) {
  const std::vector<TestTensor> tensors = SomeTensors();
  for (uint32_t version : {2u, 3u}) {
    for (int64_t alignment : {0, 1, 8, 64, 4096}) {  // 0: no general.alignment key
      SCOPED_TRACE("version " + std::to_string(version) + ", alignment " +
                   std::to_string(alignment));
      GgufMetadata metadata = AllTypesMetadata();
      if (alignment > 0) metadata.Set("general.alignment", GgufValue::Uint32(alignment));
      const std::string path = Path("rt.gguf");
      Status s = WriteGguf(path, metadata, ToWrite(tensors), version);
      ASSERT_TRUE(s.ok()) << s.ToString();

      StatusOr<GgufFile> file = GgufFile::Open(path);
      ASSERT_TRUE(file.ok()) << file.status().ToString();
      const uint64_t want_alignment = alignment > 0 ? alignment : 32;
      EXPECT_EQ(file->version(), version);
      EXPECT_EQ(file->alignment(), want_alignment);
      EXPECT_EQ(file->data_offset() % want_alignment, 0u);
      EXPECT_EQ(file->file_size(), fs::file_size(path));
      EXPECT_EQ(file->file_size() % want_alignment, 0u) << "the last tensor is padded too";
      EXPECT_EQ(file->metadata().keys(), metadata.keys());
      for (const std::string& key : metadata.keys()) {
        EXPECT_EQ(*file->metadata().Find(key), *metadata.Find(key)) << key;
      }
      ASSERT_EQ(file->tensors().size(), tensors.size());
      for (size_t i = 0; i < tensors.size(); ++i) {
        const GgufTensor& t = file->tensors()[i];
        EXPECT_EQ(t.name, tensors[i].name);
        EXPECT_EQ(file->Find(t.name), &t);
        EXPECT_EQ(t.type, tensors[i].type);
        EXPECT_EQ(t.dims, tensors[i].dims);
        EXPECT_EQ(t.shape, std::vector<int64_t>(tensors[i].dims.rbegin(), tensors[i].dims.rend()));
        EXPECT_EQ((t.offset - file->data_offset()) % want_alignment, 0u) << t.name;
        EXPECT_TRUE(std::ranges::equal(t.bytes, AsBytes(tensors[i].data))) << t.name;
      }
      EXPECT_EQ(file->Find("missing"), nullptr);
      // Moving keeps the views valid.
      GgufFile moved = std::move(*file);
      EXPECT_TRUE(std::ranges::equal(moved.Find("odd.f16")->bytes, AsBytes(tensors[3].data)));
    }
  }
}

TEST_F(GgufTest, ValueFactoriesMatchTheReader) {
  EXPECT_EQ(GgufValue::Uint64(5).integer, 5);
  EXPECT_EQ(GgufValue::Uint64(5).uinteger, 5u);
  EXPECT_EQ(GgufValue::Uint64(1ull << 63).integer, 0);
  EXPECT_EQ(GgufValue::Integer(GgufType::kUint16, 9).uinteger, 9u);
  EXPECT_EQ(GgufValue::Int32(-4).uinteger, 0u);
  EXPECT_TRUE(GgufValue::Int32(1).is_integer());
  EXPECT_TRUE(GgufValue::Uint64(1).is_integer());
  EXPECT_FALSE(GgufValue::Bool(true).is_integer());
  EXPECT_FALSE(GgufValue::Float32(1).is_integer());
  EXPECT_STREQ(GgufTypeName(GgufType::kFloat64), "float64");
  EXPECT_STREQ(GgufTypeName(static_cast<GgufType>(13)), "unknown");
}

TEST_F(GgufTest, TypedGetters) {
  GgufMetadata m = AllTypesMetadata();
  EXPECT_EQ(*m.GetString("general.name"), "tiny \xE2\x9C\x93 model");
  EXPECT_EQ(*m.GetInt("u8"), 255);
  EXPECT_EQ(*m.GetInt("i16"), -32768);
  EXPECT_EQ(*m.GetInt("u64.small"), 7);
  EXPECT_EQ(*m.GetFloat("f32"), static_cast<double>(-1.5e-3f));
  EXPECT_EQ(*m.GetFloat("u32"), 4294967295.0);
  EXPECT_EQ(*m.GetBool("bool.true"), true);
  EXPECT_EQ(*m.GetStringArray("tokens"),
            (std::vector<std::string>{"<s>", "", "hello", std::string("\0x", 2)}));
  EXPECT_EQ(*m.GetIntArray("types"), (std::vector<int64_t>{1, -2, 3}));
  EXPECT_EQ(*m.GetFloatArray("scores"),
            (std::vector<double>{0.0, -1.25, static_cast<double>(1e30f)}));
  EXPECT_EQ(*m.GetFloatArray("types"), (std::vector<double>{1, -2, 3}));
  EXPECT_TRUE(m.GetIntArray("empty.array")->empty());

  auto expect = [](const Status& s, StatusCode code, const std::string& needle) {
    EXPECT_EQ(s.code(), code) << s.ToString();
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.ToString() << " lacks " << needle;
  };
  expect(m.GetString("absent").status(), StatusCode::kNotFound, "'absent'");
  expect(m.GetInt("general.name").status(), StatusCode::kInvalidArgument,
         "'general.name' is string, not an integer");
  expect(m.GetInt("u64.big").status(), StatusCode::kInvalidArgument, "above INT64_MAX");
  expect(m.GetBool("u8").status(), StatusCode::kInvalidArgument, "'u8' is uint8, not bool");
  expect(m.GetFloat("tokens").status(), StatusCode::kInvalidArgument, "array of string");
  expect(m.GetStringArray("types").status(), StatusCode::kInvalidArgument,
         "'types' is array of int32, not an array of string");
  expect(m.GetIntArray("scores").status(), StatusCode::kInvalidArgument, "'scores'[0]");
  expect(m.GetIntArray("u64s").status(), StatusCode::kInvalidArgument, "'u64s'[0]");
  expect(m.GetFloatArray("tokens").status(), StatusCode::kInvalidArgument, "'tokens'");
  expect(m.GetIntArray("nested").status(), StatusCode::kInvalidArgument, "'nested'[0]");

  m.Set("u8", GgufValue::Bool(false));  // replacing keeps the key's place
  EXPECT_EQ(m.keys()[1], "u8");
  EXPECT_EQ(*m.GetBool("u8"), false);
}

TEST_F(GgufTest, WriterRejectsInvalidInput) {
  const std::vector<TestTensor> tensors = SomeTensors();
  const std::string path = Path("w.gguf");
  auto expect = [&](const Status& s, const std::string& needle) {
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
    EXPECT_NE(s.message().find(path), std::string::npos) << s.ToString();
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.ToString() << " lacks " << needle;
    EXPECT_FALSE(fs::exists(path));
  };
  expect(WriteGguf(path, {}, {}, 1), "version 1");
  expect(WriteGguf(path, {}, {}, 4), "version 4");

  GgufMetadata m;
  m.Set("mixed", GgufValue::Array(GgufType::kInt32, {GgufValue::Int32(1), GgufValue::Uint32(2)}));
  expect(WriteGguf(path, m, {}), "metadata 'mixed'[1]: uint32 in an array of int32");
  m = {};
  m.Set("small", GgufValue::Integer(GgufType::kInt8, 128));
  expect(WriteGguf(path, m, {}), "'small': 128 is outside int8's range");
  m = {};
  m.Set("neg", GgufValue::Integer(GgufType::kUint32, -1));
  expect(WriteGguf(path, m, {}), "'neg': -1 is outside uint32's range");
  m = {};
  m.Set("big", GgufValue::Integer(GgufType::kUint16, 65536));
  expect(WriteGguf(path, m, {}), "'big': 65536 is outside uint16's range");
  m = {};
  GgufValue bad = GgufValue::Int32(1);
  bad.type = static_cast<GgufType>(13);
  m.Set("bad", bad);
  expect(WriteGguf(path, m, {}), "unknown value type 13");
  m = {};
  GgufValue deep = GgufValue::Int32Array({1});
  for (int i = 1; i <= kGgufMaxArrayDepth; ++i) deep = GgufValue::Array(GgufType::kArray, {deep});
  m.Set("deep", deep);
  expect(WriteGguf(path, m, {}), "nested deeper than 16");
  for (int64_t alignment : {0, 3, 48}) {
    m = {};
    m.Set("general.alignment", GgufValue::Uint32(alignment));
    expect(WriteGguf(path, m, {}), "general.alignment is not an integer power of two");
  }
  m = {};
  m.Set("general.alignment", GgufValue::String("32"));
  expect(WriteGguf(path, m, {}), "general.alignment");

  std::vector<GgufTensorToWrite> w = ToWrite(tensors);
  w[2].name = w[0].name;
  expect(WriteGguf(path, {}, w), "tensor 'token_embd.weight': duplicate name");
  w = ToWrite(tensors);
  w[1].data = w[1].data.first(10);
  expect(WriteGguf(path, {}, w),
         "tensor 'blk.0.attn_q.weight': 10 bytes, but [64, 1, 1] x Q8_0 takes 68");
  w = ToWrite(tensors);
  w[1].dims = {48, 2};
  expect(WriteGguf(path, {}, w), "row of 48 elements is not a multiple of Q8_0's block size 32");
  w = ToWrite(tensors);
  w[0].dims = {};
  expect(WriteGguf(path, {}, w), "0 dims, outside 1..4");
  w[0].dims = {1, 1, 1, 1, 6};
  expect(WriteGguf(path, {}, w), "5 dims, outside 1..4");
  w[0].dims = {6, 0};
  expect(WriteGguf(path, {}, w), "dims [6, 0] hold one below 1");
  w = ToWrite(tensors);
  w[0].type = static_cast<GgmlType>(31);
  expect(WriteGguf(path, {}, w), "unknown ggml type 31");
  const Status s = WriteGguf(Path("no/such/dir/x.gguf"), {}, {});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("no/such/dir/x.gguf.tmp."), std::string::npos) << s.ToString();
}

TEST_F(GgufTest, TypeTableMatchesGgufPy) {
  // gguf-py 0.19's GGML_QUANT_SIZES; scripts/check-gguf-dequant.py compares the live table too.
  const std::map<uint32_t, std::pair<int64_t, int64_t>> want = {
      {0, {1, 4}},      {1, {1, 2}},      {2, {32, 18}},    {3, {32, 20}},    {6, {32, 22}},
      {7, {32, 24}},    {8, {32, 34}},    {9, {32, 40}},    {10, {256, 84}},  {11, {256, 110}},
      {12, {256, 144}}, {13, {256, 176}}, {14, {256, 210}}, {15, {256, 292}}, {16, {256, 66}},
      {17, {256, 74}},  {18, {256, 98}},  {19, {256, 50}},  {20, {32, 18}},   {21, {256, 110}},
      {22, {256, 82}},  {23, {256, 136}}, {24, {1, 1}},     {25, {1, 2}},     {26, {1, 4}},
      {27, {1, 8}},     {28, {1, 8}},     {29, {256, 56}},  {30, {1, 2}},     {34, {256, 54}},
      {35, {256, 66}},  {39, {32, 17}},   {40, {64, 36}},   {41, {128, 18}},
  };
  for (uint32_t id = 0; id < 64; ++id) {
    std::optional<GgmlTypeTraits> t = GgmlTypeInfo(id);
    auto it = want.find(id);
    ASSERT_EQ(t.has_value(), it != want.end()) << id;
    if (t) EXPECT_EQ(std::pair(t->block_size, t->type_size), it->second) << id << " " << t->name;
  }
  EXPECT_STREQ(GgmlTypeInfo(12)->name, "Q4_K");
  EXPECT_STREQ(GgmlTypeInfo(30)->name, "BF16");
}

// A small valid file whose last tensor ends the file: every shorter prefix must fail.
TEST_F(GgufTest, EveryTruncationIsDataLoss) {
  GgufMetadata m = AllTypesMetadata();
  std::vector<uint8_t> last(32 * 4, 7);  // 8 x F32 ... 128 bytes, a multiple of 32
  std::vector<TestTensor> tensors = SomeTensors();
  tensors.push_back({"last", GgmlType::kF32, {32}, last});
  const std::string full_path = Path("full.gguf");
  ASSERT_TRUE(WriteGguf(full_path, m, ToWrite(tensors)).ok());
  std::ifstream in(full_path, std::ios::binary);
  const std::string full((std::istreambuf_iterator<char>(in)), {});
  ASSERT_TRUE(GgufFile::Open(full_path).ok());
  for (size_t n = 0; n < full.size(); ++n) {
    const std::string path = WriteBytes(full.substr(0, n), "prefix.gguf");
    StatusOr<GgufFile> file = GgufFile::Open(path);
    ASSERT_FALSE(file.ok()) << "prefix of " << n << " of " << full.size() << " bytes opened";
    ASSERT_EQ(file.status().code(), StatusCode::kDataLoss) << n << ": " << file.status().ToString();
    ASSERT_NE(file.status().message().find(" at byte "), std::string::npos)
        << file.status().ToString();
  }
}

struct CorruptCase {
  std::string name;
  StatusCode code;
  std::string needle;  // the field, its byte offset and the reason
  std::string bytes;
};

std::vector<CorruptCase> CorruptCases() {
  std::vector<CorruptCase> cases;
  auto add = [&](std::string name, StatusCode code, std::string needle, const RawGguf& raw) {
    cases.push_back({std::move(name), code, std::move(needle), raw.bytes()});
  };
  const auto kData = StatusCode::kDataLoss;
  {
    RawGguf r;
    add("empty file", kData, "magic at byte 0: needs 4 bytes, the file ends 0 bytes later", r);
  }
  {
    RawGguf r;
    r.Magic("GGML").U32(3).U64(0).U64(0);
    add("wrong magic", kData, "magic at byte 0: \\x47\\x47\\x4d\\x4c is not \"GGUF\"", r);
  }
  for (uint32_t v : {0u, 1u, 4u}) {
    RawGguf r;
    r.Header(0, 0, v);
    add("version " + std::to_string(v), StatusCode::kInvalidArgument,
        "version at byte 4: GGUF version " + std::to_string(v) + " is not supported", r);
  }
  {
    RawGguf r;
    r.Header(0, 0, 0x03000000);
    add("big-endian version", StatusCode::kInvalidArgument, "(a big-endian file?)", r);
  }
  {
    RawGguf r;
    r.Magic().U32(3).U64(0);
    add("truncated metadata count", kData, "metadata count at byte 16: needs 8 bytes", r);
  }
  {
    RawGguf r;
    r.Header(1ull << 40, 0).Fill(100);
    add("tensor count beyond the file", kData,
        "tensor count at byte 8: 1099511627776 tensors need at least 32 bytes each, only 100", r);
  }
  {
    RawGguf r;
    r.Header(1, 6).Fill(100);
    add("metadata count beyond the file", kData,
        "metadata count at byte 16: 6 entries need at least 13 bytes each", r);
  }
  {
    RawGguf r;
    r.Header(0, 1).U64(1000).Fill(20);
    add("key length past the end", kData,
        "metadata 0 key at byte 24: string length 1000 runs past the end of the file (20 bytes", r);
  }
  {
    RawGguf r;
    r.Header(0, 1).Str("k").U32(static_cast<uint32_t>(GgufType::kString));
    const size_t at = r.at();
    r.U64(1ull << 62).Fill(4);
    add("string value past the end", kData,
        "metadata 0 (k) at byte " + std::to_string(at) + ": string length 4611686018427387904", r);
  }
  {
    RawGguf r;
    r.Header(0, 1).Str("k");
    const size_t at = r.at();
    r.U32(13).U32(0);
    add("unknown value type", kData,
        "metadata 0 (k) type at byte " + std::to_string(at) + ": unknown value type 13", r);
  }
  {
    RawGguf r;
    r.Header(0, 1).Str("arr").U32(static_cast<uint32_t>(GgufType::kArray));
    const size_t at = r.at();
    r.U32(99).U64(0);
    add("unknown array element type", kData,
        "metadata 0 (arr) element type at byte " + std::to_string(at) + ": unknown value type 99",
        r);
  }
  {
    RawGguf r;
    r.Header(0, 1).Str("arr").U32(static_cast<uint32_t>(GgufType::kArray)).U32(0);
    const size_t at = r.at();
    r.U64(1ull << 60).Fill(64);
    add("array count huge", kData,
        "metadata 0 (arr) array count at byte " + std::to_string(at) +
            ": 1152921504606846976 uint8 elements need at least 1 bytes each, only 64 bytes left",
        r);
  }
  {
    RawGguf r;
    r.Header(0, 1).Str("arr").U32(static_cast<uint32_t>(GgufType::kArray)).U32(8);
    const size_t at = r.at();
    r.U64(3).Str("a");
    add("string array shorter than its count", kData,
        "metadata 0 (arr) array count at byte " + std::to_string(at) +
            ": 3 string elements need at least 8 bytes each",
        r);
  }
  {
    // An array of 2 arrays: the first holds one int32, the second claims 2^60 int64s.
    RawGguf r;
    r.Header(0, 1).Str("nest").U32(static_cast<uint32_t>(GgufType::kArray));
    r.U32(static_cast<uint32_t>(GgufType::kArray)).U64(2);
    r.U32(static_cast<uint32_t>(GgufType::kInt32)).U64(1).U32(5);
    r.U32(static_cast<uint32_t>(GgufType::kInt64));
    const size_t at = r.at();
    r.U64(1ull << 60).Fill(16);
    add("nested array count huge", kData,
        "metadata 0 (nest)[1] array count at byte " + std::to_string(at) +
            ": 1152921504606846976 int64 elements",
        r);
  }
  {
    RawGguf r;
    r.Header(0, 1).Str("deep").U32(static_cast<uint32_t>(GgufType::kArray));
    for (int i = 0; i < 40; ++i) r.U32(static_cast<uint32_t>(GgufType::kArray)).U64(1);
    // The 16th array may hold scalars but not arrays: its count (at 40 + 15 * 12 + 4) fails.
    std::string indices;
    for (int i = 0; i < 15; ++i) indices += "[0]";
    add("arrays nested too deep", kData,
        "metadata 0 (deep)" + indices + " array count at byte 224: arrays nested deeper than 16",
        r);
  }
  {
    RawGguf r;
    r.Header(0, 1).Str("b").U32(static_cast<uint32_t>(GgufType::kBool));
    const size_t at = r.at();
    r.U8(2);
    add("bool not 0 or 1", kData,
        "metadata 0 (b) at byte " + std::to_string(at) + ": bool 2 is neither 0 nor 1", r);
  }
  {
    RawGguf r;
    r.Header(0, 2).KeyU32("k", 1);
    const size_t at = r.at();
    r.KeyU32("k", 2);
    add("duplicate key", kData, "metadata 1 (k) at byte " + std::to_string(at) + ": duplicate key",
        r);
  }
  {
    RawGguf r;
    r.Header(0, 2).KeyU32("a\nb", 1);
    const size_t at = r.at();
    r.KeyU32("a\nb", 2);
    add("names in errors are escaped", kData,
        "metadata 1 (a\\x0ab) at byte " + std::to_string(at) + ": duplicate key", r);
  }
  {
    RawGguf r;
    r.Header(1, 0).TensorInfo(std::string(300, 'w'), {8}, 99, 0);
    add("long names in errors are cut", kData,
        "tensor 0 (" + std::string(100, 'w') + "...) type at byte 344: unknown ggml type 99", r);
  }
  for (uint32_t alignment : {0u, 48u}) {
    RawGguf r;
    r.Header(0, 1).Str("general.alignment").U32(static_cast<uint32_t>(GgufType::kUint32));
    const size_t at = r.at();
    r.U32(alignment);
    add("alignment " + std::to_string(alignment), kData,
        "general.alignment at byte " + std::to_string(at) + ": " + std::to_string(alignment) +
            " is not an integer power of two",
        r);
  }
  {
    RawGguf r;
    r.Header(0, 1).Str("general.alignment").U32(static_cast<uint32_t>(GgufType::kString));
    const size_t at = r.at();
    r.Str("64");
    add("alignment a string", kData,
        "general.alignment at byte " + std::to_string(at) + ": a string is not", r);
  }
  {
    RawGguf r;
    r.Header(1, 0).Str("w");
    const size_t at = r.at();
    r.U32(0).U64(1).U32(kF32).U64(0).PadTo(32).Fill(32);
    add("n_dims 0", kData,
        "tensor 0 (w) n_dims at byte " + std::to_string(at) + ": 0 is outside 1..4", r);
  }
  {
    RawGguf r;
    r.Header(1, 0).Str("w");
    const size_t at = r.at();
    r.U32(5).U64(1).U64(1).U64(1).U64(1).U64(1).U32(kF32).U64(0).PadTo(32).Fill(32);
    add("n_dims 5", kData,
        "tensor 0 (w) n_dims at byte " + std::to_string(at) + ": 5 is outside 1..4", r);
  }
  {
    RawGguf r;
    r.Header(1, 0).Str("w").U32(2).U64(4);
    const size_t at = r.at();
    r.U64(0).U32(kF32).U64(0).PadTo(32).Fill(32);
    add("dimension 0", kData,
        "tensor 0 (w) dims[1] at byte " + std::to_string(at) +
            ": dimension 0 is outside 1..INT64_MAX",
        r);
  }
  {
    RawGguf r;
    r.Header(1, 0).Str("w").U32(1);
    const size_t at = r.at();
    r.U64(1ull << 63).U32(kF32).U64(0).PadTo(32).Fill(32);
    add("dimension above INT64_MAX", kData,
        "tensor 0 (w) dims[0] at byte " + std::to_string(at) + ": dimension 9223372036854775808",
        r);
  }
  {
    RawGguf r;
    r.Header(1, 0).Str("w").U32(3).U64(1ull << 32).U64(1ull << 30);
    const size_t at = r.at();
    r.U64(4).U32(kF32).U64(0).PadTo(32).Fill(32);
    add("element count overflow", kData,
        "tensor 0 (w) dims[2] at byte " + std::to_string(at) +
            ": dims [4294967296, 1073741824, 4] hold more than INT64_MAX elements",
        r);
  }
  {
    RawGguf r;
    r.Header(1, 0).Str("w").U32(2).U64(1ull << 31).U64(1ull << 31);
    const size_t at = r.at();
    r.U32(28).U64(0).PadTo(32).Fill(32);  // F64: 2^62 elements x 8 bytes
    add("byte size overflow", kData,
        "tensor 0 (w) offset at byte " + std::to_string(at + 4) + ": the byte size of", r);
  }
  for (uint32_t type : {4u, 31u, 36u, 42u, 1000u}) {
    RawGguf r;
    r.Header(1, 0).Str("w").U32(1).U64(32);
    const size_t at = r.at();
    r.U32(type).U64(0).PadTo(32).Fill(128);
    add("unknown ggml type " + std::to_string(type), kData,
        "tensor 0 (w) type at byte " + std::to_string(at) + ": unknown ggml type " +
            std::to_string(type),
        r);
  }
  {
    RawGguf r;
    r.Header(1, 0).Str("blk.0.attn_q.weight").U32(2);
    const size_t at = r.at();
    r.U64(33).U64(2).U32(kQ4_0).U64(0).PadTo(32).Fill(18 * 3);
    add("row not a multiple of the block size", kData,
        "tensor 0 (blk.0.attn_q.weight) dims[0] at byte " + std::to_string(at) +
            ": row of 33 elements is not a multiple of Q4_0's block size 32",
        r);
  }
  {
    RawGguf r;
    r.Header(2, 0).TensorInfo("a", {8}, kF32, 0).Str("b").U32(1).U64(32).U32(kQ8_0);
    const size_t at = r.at();
    r.U64(32).PadTo(32).Fill(32 + 33);  // b needs [32, 66): one byte short
    add("tensor data past the end", kData,
        "tensor 1 (b) offset at byte " + std::to_string(at) +
            ": data [32, 66) of the data area at byte 96 runs past the end of the file (161 bytes)",
        r);
  }
  {
    RawGguf r;
    r.Header(1, 0).Str("w").U32(1).U64(8).U32(kF32);
    const size_t at = r.at();
    r.U64(16).PadTo(32).Fill(64);
    add("misaligned offset", kData,
        "tensor 0 (w) offset at byte " + std::to_string(at) +
            ": 16 is not a multiple of the alignment 32",
        r);
  }
  {
    RawGguf r;
    r.Header(1, 1).KeyU32("general.alignment", 64).Str("w").U32(1).U64(8).U32(kF32);
    const size_t at = r.at();
    r.U64(32).PadTo(64).Fill(64);
    add("offset aligned to 32 but not to general.alignment 64", kData,
        "tensor 0 (w) offset at byte " + std::to_string(at) +
            ": 32 is not a multiple of the alignment 64",
        r);
  }
  {
    RawGguf r;
    r.Header(3, 0).TensorInfo("a", {16}, kF32, 0).TensorInfo("b", {8}, kF32, 96);
    r.Str("c").U32(1).U64(16).U32(kF32);
    const size_t at = r.at();
    r.U64(32).PadTo(32).Fill(128);  // c [32, 96) overlaps a [0, 64)
    add("overlapping tensors", kData,
        "tensor 2 (c) offset at byte " + std::to_string(at) +
            ": data [32, 96) overlaps tensor 0 (a) [0, 64)",
        r);
  }
  {
    RawGguf r;
    r.Header(2, 0).TensorInfo("a", {8}, kF32, 0);
    const size_t at = r.at();
    r.TensorInfo("a", {8}, kF32, 32).PadTo(32).Fill(64);
    add("duplicate tensor name", kData,
        "tensor 1 (a) at byte " + std::to_string(at) + ": duplicate tensor name", r);
  }
  {
    RawGguf r;
    r.Header(1, 0);
    const size_t at = r.at();
    r.U64(300).Fill(40);
    add("tensor name past the end", kData,
        "tensor 0 name at byte " + std::to_string(at) + ": string length 300 runs past", r);
  }
  return cases;
}

TEST_F(GgufTest, CorruptInputsNameTheFieldAndOffset) {
  for (const CorruptCase& c : CorruptCases()) {
    SCOPED_TRACE(c.name);
    ExpectOpenError(WriteBytes(c.bytes), c.code, c.needle);
  }
  ExpectOpenError(Path("absent.gguf"), StatusCode::kNotFound, "no such file");
}

TEST_F(GgufTest, AcceptsWhatLlamaCppAccepts) {
  // Empty arrays, no tensors, a gap between tensors and tensors out of file order.
  RawGguf r;
  r.Header(2, 1).Str("e").U32(static_cast<uint32_t>(GgufType::kArray)).U32(4).U64(0);
  r.TensorInfo("late", {8}, kF32, 64).TensorInfo("early", {8}, kF32, 0).PadTo(32).Fill(96);
  StatusOr<GgufFile> file = GgufFile::Open(WriteBytes(r.bytes()));
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ(file->tensors()[0].name, "late");
  EXPECT_EQ(file->tensors()[0].offset, file->data_offset() + 64);
  EXPECT_EQ(file->tensors()[1].bytes.size(), 32u);
  EXPECT_TRUE(file->metadata().Find("e")->elements.empty());

  RawGguf none;
  none.Header(0, 1).KeyU32("general.alignment", 1u << 20);
  file = GgufFile::Open(WriteBytes(none.bytes(), "none.gguf"));
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ(file->alignment(), 1u << 20);
  EXPECT_TRUE(file->tensors().empty());
}

TEST_F(GgufTest, DequantizesATensorReadBack) {
  std::vector<float> x(64);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i) * 0.25f - 8.0f;
  StatusOr<std::string> q = QuantizeRow(GgmlType::kQ8_0, x);
  ASSERT_TRUE(q.ok());
  const std::string path = Path("q.gguf");
  ASSERT_TRUE(
      WriteGguf(path, {}, {{"w", GgmlType::kQ8_0, {32, 2}, std::as_bytes(std::span(*q))}}).ok());
  StatusOr<GgufFile> file = GgufFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  std::vector<float> out(64);
  ASSERT_TRUE(DequantizeTensor(file->tensors()[0], out).ok());
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(out[i], x[i], 8.0f / 127) << i;
}

}  // namespace
}  // namespace vtoken::model
