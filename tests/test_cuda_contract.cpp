// Static contract of issue 8: raw copies, fills and stream creation appear in src/ only inside the
// transfer module (src/cuda/transfer.cu) and the stream owner (src/cuda/device.cu). Scans the real
// sources (STRATA_SOURCE_DIR), ignoring comments and string literals, and proves on temporary files
// that the scanner does fail when the pattern is there.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace fs = std::filesystem;

namespace {

struct Violation {
  std::string file;  // relative to the scanned src/ root, '/'-separated
  int line = 0;
  std::string token;
};

// Blanks out comments and string/char literals (raw strings too), keeping newlines so lines still count.
std::string strip_comments_and_strings(std::string_view s) {
  std::string out(s);
  size_t i = 0, n = s.size();
  auto blank = [&](size_t from, size_t to) {
    for (size_t k = from; k < to && k < n; ++k)
      if (out[k] != '\n') out[k] = ' ';
  };
  while (i < n) {
    if (s.compare(i, 2, "//") == 0) {
      size_t e = s.find('\n', i);
      if (e == std::string_view::npos) e = n;
      blank(i, e);
      i = e;
    } else if (s.compare(i, 2, "/*") == 0) {
      size_t e = s.find("*/", i + 2);
      e = e == std::string_view::npos ? n : e + 2;
      blank(i, e);
      i = e;
    } else if (s[i] == 'R' && i + 1 < n && s[i + 1] == '"' &&
               (i == 0 || !(std::isalnum(static_cast<unsigned char>(s[i - 1])) || s[i - 1] == '_'))) {
      size_t open = s.find('(', i + 2);
      if (open == std::string_view::npos) break;
      std::string close = ")" + std::string(s.substr(i + 2, open - i - 2)) + "\"";
      size_t e = s.find(close, open);
      e = e == std::string_view::npos ? n : e + close.size();
      blank(i, e);
      i = e;
    } else if (s[i] == '"' || s[i] == '\'') {
      char q = s[i];
      size_t k = i + 1;
      while (k < n && s[k] != q && s[k] != '\n') k += s[k] == '\\' ? 2 : 1;
      blank(i, k + 1);
      i = k + 1;
    } else {
      ++i;
    }
  }
  return out;
}

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

// Which file may use a token; nullptr = not restricted.
const char* owner_of(std::string_view tok) {
  // Enum constants name a direction, not a copy.
  for (std::string_view ok : {"cudaMemcpyKind", "cudaMemcpyHostToDevice", "cudaMemcpyDeviceToHost",
                              "cudaMemcpyDeviceToDevice", "cudaMemcpyHostToHost", "cudaMemcpyDefault"})
    if (tok == ok) return nullptr;
  for (std::string_view p : {"cudaMemcpy", "cudaMemset", "cuMemcpy", "cuMemset"})
    if (starts_with(tok, p)) return "cuda/transfer.cu";
  for (std::string_view p : {"cudaStreamCreate", "cuStreamCreate"})
    if (starts_with(tok, p)) return "cuda/device.cu";
  return nullptr;
}

std::vector<Violation> scan_text(std::string_view text, const std::string& rel, bool honor_owners = true) {
  std::vector<Violation> v;
  std::string code = strip_comments_and_strings(text);
  int line = 1;
  for (size_t i = 0; i < code.size();) {
    char c = code[i];
    if (c == '\n') {
      ++line;
      ++i;
    } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t k = i;
      while (k < code.size() && (std::isalnum(static_cast<unsigned char>(code[k])) || code[k] == '_')) ++k;
      std::string_view tok(code.data() + i, k - i);
      const char* owner = owner_of(tok);
      if (owner != nullptr && (!honor_owners || rel != owner)) v.push_back({rel, line, std::string(tok)});
      i = k;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      while (i < code.size() && (std::isalnum(static_cast<unsigned char>(code[i])) || code[i] == '_')) ++i;
    } else {
      ++i;
    }
  }
  return v;
}

std::vector<Violation> scan_tree(const fs::path& src_root, bool honor_owners = true, int* files = nullptr) {
  std::vector<Violation> all;
  int count = 0;
  for (const auto& e : fs::recursive_directory_iterator(src_root)) {
    if (!e.is_regular_file()) continue;
    std::string ext = e.path().extension().string();
    if (ext != ".cu" && ext != ".cuh" && ext != ".cpp" && ext != ".cc" && ext != ".h" && ext != ".hpp") continue;
    std::ifstream f(e.path(), std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    std::string rel = fs::relative(e.path(), src_root).generic_string();
    auto v = scan_text(ss.str(), rel, honor_owners);
    all.insert(all.end(), v.begin(), v.end());
    ++count;
  }
  if (files) *files = count;
  return all;
}

std::string describe(const std::vector<Violation>& v) {
  std::string s;
  for (const auto& x : v) s += "  src/" + x.file + ":" + std::to_string(x.line) + ": " + x.token + "\n";
  return s;
}

TEST(CudaContract, NoRawCopiesOrStreamCreationOutsideTheirModules) {
  fs::path src = fs::path(STRATA_SOURCE_DIR) / "src";
  ASSERT_TRUE(fs::is_directory(src)) << src;
  int files = 0;
  auto v = scan_tree(src, true, &files);
  EXPECT_GT(files, 5);
  EXPECT_TRUE(v.empty()) << "raw cudaMemcpy*/cudaMemset*/cudaStreamCreate* outside src/cuda/transfer.cu "
                            "and src/cuda/device.cu (use strata::cuda::Transfer / Device):\n"
                         << describe(v);
}

TEST(CudaContract, ScannerSeesTheRealUsesInTheOwningModules) {
  // Without the owners' exemption the real modules are flagged: the scanner reads the real files.
  fs::path src = fs::path(STRATA_SOURCE_DIR) / "src";
  auto v = scan_tree(src, false);
  bool transfer = false, device = false;
  for (const auto& x : v) {
    transfer |= x.file == "cuda/transfer.cu" && starts_with(x.token, "cudaMemcpyAsync");
    device |= x.file == "cuda/device.cu" && starts_with(x.token, "cudaStreamCreate");
  }
  EXPECT_TRUE(transfer) << describe(v);
  EXPECT_TRUE(device) << describe(v);
}

TEST(CudaContract, ScannerFailsOnAPlantedCopy) {
  fs::path root = fs::temp_directory_path() / ("strata_contract_" + std::to_string(::getpid()));
  fs::remove_all(root);
  fs::create_directories(root / "engine");
  fs::create_directories(root / "cuda");
  {
    std::ofstream f(root / "engine" / "bad.cu");
    f << "// cudaMemcpy in a comment is fine\n"
         "void upload(int* d, const int* h, int n, cudaStream_t s) {\n"
         "  const char* msg = \"cudaMemset in a string is fine\";\n"
         "  cudaMemcpyAsync(d, h, n * 4, cudaMemcpyHostToDevice, s);\n"
         "  /* cudaStreamCreate\n in a block comment */ cudaMemset2DAsync(d, 4, 0, 1, 1, s);\n"
         "}\n";
  }
  {
    std::ofstream f(root / "cuda" / "kernels.cuh");
    f << "inline void mk(cudaStream_t* s) { cudaStreamCreateWithFlags(s, 1); }\n";
  }
  {
    std::ofstream f(root / "cuda" / "device.cu");  // the owner of streams may not copy
    f << "void f(void* p) { cudaMemcpy(p, p, 0, cudaMemcpyDefault); }\n";
  }
  {
    std::ofstream f(root / "cuda" / "transfer.cu");  // the owner of copies may
    f << "void g(void* p) { cudaMemcpy(p, p, 0, cudaMemcpyDefault); }\n";
  }
  auto v = scan_tree(root);
  fs::remove_all(root);
  ASSERT_EQ(v.size(), 4u) << describe(v);
  std::sort(v.begin(), v.end(), [](const Violation& a, const Violation& b) {
    return a.file != b.file ? a.file < b.file : a.line < b.line;
  });
  EXPECT_EQ(v[0].file, "cuda/device.cu");
  EXPECT_EQ(v[0].token, "cudaMemcpy");
  EXPECT_EQ(v[1].file, "cuda/kernels.cuh");
  EXPECT_EQ(v[1].token, "cudaStreamCreateWithFlags");
  EXPECT_EQ(v[2].file, "engine/bad.cu");
  EXPECT_EQ(v[2].line, 4);
  EXPECT_EQ(v[2].token, "cudaMemcpyAsync");
  EXPECT_EQ(v[3].line, 6);  // after the two-line block comment
  EXPECT_EQ(v[3].token, "cudaMemset2DAsync");
}

TEST(CudaContract, StripKeepsLinesAndCode) {
  std::string s = "a // x\nR\"d(cudaMemcpy)d\" b '\\'' c /* y\n z */ d";
  std::string t = strip_comments_and_strings(s);
  EXPECT_EQ(t.size(), s.size());
  EXPECT_EQ(std::count(t.begin(), t.end(), '\n'), 2);
  EXPECT_EQ(t.find("cudaMemcpy"), std::string::npos);
  EXPECT_NE(t.find('b'), std::string::npos);
  EXPECT_NE(t.find('c'), std::string::npos);
  EXPECT_NE(t.find('d'), std::string::npos);
}

}  // namespace
