// TableWriter (apps/vtoken-cli/commands/table_writer.h): `export`'s CSV (RFC 4180 quoting, shortest
// round-trip numbers, empty fields for no value) and JSON lines (typed values, null for no value,
// invalid UTF-8 replaced), and ConfigCell's typing of config values.
#include "apps/vtoken-cli/commands/table_writer.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace vtoken::cli {
namespace {

std::string Written(bool csv, const std::vector<std::string>& columns,
                    const std::vector<std::vector<Cell>>& rows) {
  char* buf = nullptr;
  size_t size = 0;
  std::FILE* f = open_memstream(&buf, &size);
  {
    TableWriter w(f, csv, columns);
    for (const auto& row : rows) w.Write(row);
  }
  std::fclose(f);
  std::string out(buf, size);
  std::free(buf);
  return out;
}

TEST(TableWriterTest, CsvQuotesWhatNeedsItAndLeavesNoValueEmpty) {
  EXPECT_EQ(Written(true, {"a", "b,c", "d", "e"},
                    {{int64_t{3}, std::string("x,\"y\""), Number(0.1), Cell()},
                     {true, std::string("two\nlines"), Number(NAN), std::string("plain")}}),
            "a,\"b,c\",d,e\n"
            "3,\"x,\"\"y\"\"\",0.1,\n"
            "true,\"two\nlines\",,plain\n");
}

TEST(TableWriterTest, JsonLinesKeepTypesInColumnOrderAndReplaceInvalidUtf8) {
  EXPECT_EQ(Written(false, {"z", "a", "n"}, {{int64_t{1}, std::string("\xff"), Cell()}}),
            "{\"z\":1,\"a\":\"\xef\xbf\xbd\",\"n\":null}\n");
}

TEST(ConfigCellTest, NumbersAndBooleansBecomeTypedTheRestStaysText) {
  EXPECT_EQ(ConfigCell("8"), Cell(int64_t{8}));
  EXPECT_EQ(ConfigCell("0.25"), Cell(0.25));
  EXPECT_EQ(ConfigCell("true"), Cell(true));
  EXPECT_EQ(ConfigCell("h2o"), Cell(std::string("h2o")));
  EXPECT_EQ(ConfigCell("[ 'naive' ]"), Cell(std::string("[ 'naive' ]")));
  EXPECT_EQ(ConfigCell("nan"), Cell());  // a float that is no number: no value
}

}  // namespace
}  // namespace vtoken::cli
