// A backend's kernel table: supports() is derived from it, the first accepting entry
// runs, and an op without an entry (or whose entries all decline) is an error naming it.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "backends/kernel_table.h"
#include "backends/partial/partial_backend.h"
#include "core/error.h"
#include "core/op_catalog.h"
#include "dispatch/devices.h"

namespace loom {
namespace {

// A stand-in device that records which launcher ran.
struct RecordingDevice {
  std::vector<std::string> ran;
  void general(const OpCall&) { ran.push_back("general"); }
  void narrow(const OpCall&) { ran.push_back("narrow"); }
};

bool scale_by_two(const OpCall& call) {
  return call.attrs.alpha == 2.0;
}
bool never(const OpCall&) {
  return false;
}

OpCall call_of(OpId op, const Attrs& attrs) {
  return OpCall{op, {}, {}, attrs};
}

TEST(KernelTable, FirstAcceptingEntryRunsAndSupportsFollowsTheConditions) {
  KernelTable<RecordingDevice> table("test", {{OpId::scale, scale_by_two, &RecordingDevice::narrow},
                                              {OpId::scale, nullptr, &RecordingDevice::general},
                                              {OpId::exp, never, &RecordingDevice::general}});
  RecordingDevice device;
  Attrs two, three;
  two.alpha = 2.0;
  three.alpha = 3.0;
  EXPECT_TRUE(table.supports(call_of(OpId::scale, two)));
  EXPECT_TRUE(table.supports(call_of(OpId::scale, three)));
  table.launch(device, call_of(OpId::scale, two));
  table.launch(device, call_of(OpId::scale, three));
  EXPECT_EQ(device.ran, (std::vector<std::string>{"narrow", "general"}));
  EXPECT_TRUE(table.lists(OpId::exp));
  EXPECT_FALSE(table.supports(call_of(OpId::exp, two)));
  std::vector<OpId> listed{OpId::exp, OpId::scale};  // in catalog order
  if (listed[0] > listed[1])
    std::swap(listed[0], listed[1]);
  EXPECT_EQ(table.ops(), listed);
}

TEST(KernelTable, AnOpWithoutAnEntryIsAnErrorNamingIt) {
  KernelTable<RecordingDevice> table("test", {{OpId::exp, never, &RecordingDevice::general}});
  RecordingDevice device;
  Attrs attrs;
  try {
    table.launch(device, call_of(OpId::log, attrs));
    FAIL() << "launch of an op with no entry did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("test: no kernel for op log (not in the backend's kernel "
                                         "table)"),
              std::string::npos)
        << e.what();
  }
  try {
    table.launch(device, call_of(OpId::exp, attrs));
    FAIL() << "launch of a declined call did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("entries decline the call"), std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(device.ran.empty());
}

// The device backends' tables refuse what they do not list, instead of running a default
// kernel (the old unary_code returned "scale" for any op it did not know).
TEST(KernelTable, DeviceBackendsRefuseOpsTheyDoNotList) {
  for (const std::string& name : dispatch::device_names()) {
    if (name == "cpu")  // the CPU runs every catalog op
      continue;
    SCOPED_TRACE(name);
    Backend& device = dispatch::device(name);
    std::vector<float> values{1, 2, 3, 4};
    Tensor x = Tensor::from_floats({4}, values, device);
    Tensor y = Tensor::empty({4}, DType::f32, device);
    std::vector<Tensor> inputs{x}, outputs{y};
    Attrs attrs;
    OpCall softplus_like{OpId::softmax, inputs, outputs, attrs};  // native nowhere but the CPU
    EXPECT_FALSE(device.supports(softplus_like));
    EXPECT_THROW(device.launch(softplus_like, device.default_stream()), Error);
  }
}

}  // namespace
}  // namespace loom
