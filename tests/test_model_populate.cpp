// load_model(path) maps every page of the weights before the first forward pass (MADV_POPULATE_READ,
// model.cpp): with STRATA_POPULATE=1 the process's resident set grows by the tensor data at load, with
// =0 it does not; a bad value is a clear error.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "common/error.h"
#include "gguf/gguf.h"
#include "model/model.h"

using namespace strata;

namespace {

const std::string kModel = std::string(STRATA_SOURCE_DIR) + "/models/strata-demo-moe.gguf";

int64_t resident_bytes() {  // /proc/self/statm: size resident ... (pages)
  std::ifstream f("/proc/self/statm");
  int64_t size = 0, resident = 0;
  f >> size >> resident;
  return resident * 4096;
}

// Resident-set growth while the model loaded with STRATA_POPULATE=value is alive.
int64_t growth_with(const char* value) {
  setenv("STRATA_POPULATE", value, 1);
  const int64_t before = resident_bytes();
  std::unique_ptr<Model> m = load_model(kModel);
  const int64_t after = resident_bytes();
  unsetenv("STRATA_POPULATE");
  return after - before;
}

}  // namespace

TEST(ModelPopulate, WeightsMappedAtLoadUnlessTurnedOff) {
  ASSERT_TRUE(std::filesystem::exists(kModel));
  const gguf::File f = gguf::File::open(kModel);
  const int64_t data = static_cast<int64_t>(f.file_size() - f.data_offset());
  const int64_t on = growth_with("1"), off = growth_with("0");
  EXPECT_GE(on - off, data * 9 / 10) << "populated " << on << " vs not " << off << " bytes; tensor data " << data;
}

TEST(ModelPopulate, BadValueIsAnError) {
  setenv("STRATA_POPULATE", "yes", 1);
  try {
    load_model(kModel);
    unsetenv("STRATA_POPULATE");
    FAIL() << "STRATA_POPULATE=yes must be an error";
  } catch (const Error& e) {
    unsetenv("STRATA_POPULATE");
    EXPECT_NE(std::string(e.what()).find("STRATA_POPULATE must be 0 or 1"), std::string::npos) << e.what();
  }
}
