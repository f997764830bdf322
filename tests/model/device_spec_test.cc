// Device and dtype names (lib/model/io/device_spec.h): every accepted spelling and the errors.
#include "lib/model/io/device_spec.h"

#include <gtest/gtest.h>

namespace vtoken::model {
namespace {

TEST(DeviceSpecTest, ParsesCpuCudaAndCudaN) {
  StatusOr<DeviceSpec> cpu = ParseDeviceSpec("cpu");
  ASSERT_TRUE(cpu.ok());
  EXPECT_FALSE(cpu->cuda);
  StatusOr<DeviceSpec> cuda = ParseDeviceSpec("cuda");
  ASSERT_TRUE(cuda.ok());
  EXPECT_TRUE(cuda->cuda);
  EXPECT_EQ(cuda->index, -1);
  StatusOr<DeviceSpec> cuda3 = ParseDeviceSpec("cuda:3");
  ASSERT_TRUE(cuda3.ok());
  EXPECT_TRUE(cuda3->cuda);
  EXPECT_EQ(cuda3->index, 3);
  EXPECT_EQ(ParseDeviceSpec("cuda:999")->index, 999);
}

TEST(DeviceSpecTest, RejectsOtherNames) {
  for (const char* bad :
       {"", "tpu", "CPU", "cuda:", "cuda:x", "cuda:-1", "cuda:1000", "cuda:1 ", "cuda0", "mps"}) {
    StatusOr<DeviceSpec> d = ParseDeviceSpec(bad);
    ASSERT_FALSE(d.ok()) << bad;
    EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(d.status().message(),
              "device \"" + std::string(bad) + "\": must be \"cpu\", \"cuda\" or \"cuda:N\"");
  }
}

TEST(DeviceSpecTest, DtypeNamesRoundTrip) {
  for (ComputeDtype d : {ComputeDtype::kFloat32, ComputeDtype::kBFloat16, ComputeDtype::kFloat16}) {
    StatusOr<ComputeDtype> parsed = ParseComputeDtype(ComputeDtypeName(d));
    ASSERT_TRUE(parsed.ok()) << ComputeDtypeName(d);
    EXPECT_EQ(*parsed, d);
  }
  EXPECT_EQ(ComputeDtypeBytes(ComputeDtype::kFloat32), 4);
  EXPECT_EQ(ComputeDtypeBytes(ComputeDtype::kBFloat16), 2);
  EXPECT_EQ(ComputeDtypeBytes(ComputeDtype::kFloat16), 2);
}

TEST(DeviceSpecTest, RejectsOtherDtypes) {
  for (const char* bad : {"", "fp32", "bf16", "half", "int8", "Float32"}) {
    StatusOr<ComputeDtype> d = ParseComputeDtype(bad);
    ASSERT_FALSE(d.ok()) << bad;
    EXPECT_EQ(d.status().message(), "dtype \"" + std::string(bad) +
                                        "\": must be \"float32\", \"bfloat16\" or \"float16\"");
  }
}

}  // namespace
}  // namespace vtoken::model
