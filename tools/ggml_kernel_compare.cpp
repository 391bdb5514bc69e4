// Our fast kernels vs ggml's x86 vec_dot on identical, cache-resident data (32 rows of 4096, best of
// 800 runs: compute throughput, robust to other load on the machine). Also prints both dot products:
// for the K/IQ formats ggml gets the same Q8_K activations and must agree (it does: identical values).
// Not built by CMake (it needs llama.cpp's source). How to run it:
//   npm pack node-llama-cpp@3.21.1; tar xzf node-llama-cpp-3.21.1.tgz package/llama/gitRelease.bundle
//   git clone package/llama/gitRelease.bundle llsrc; L=llsrc/ggml       # llama.cpp 80fb11a
//   gcc -O3 -march=native -I$L/include -I$L/src -I$L/src/ggml-cpu -c $L/src/ggml-cpu/arch/x86/quants.c
//   gcc -O3 -march=native -I$L/include -I$L/src -I$L/src/ggml-cpu -c $L/src/ggml-cpu/quants.c -o generic.o
//   gcc -O2 -I$L/include -I$L/src -c $L/src/ggml-quants.c -o core.o
//   (plus a stub file defining ggml_abort, ggml_row_size, ggml_type_size, ggml_type_name, ggml_blck_size)
//   g++ -std=c++20 -O2 -Isrc -Itests tools/ggml_kernel_compare.cpp quants.o generic.o core.o stubs.o \
//       build/libstrata_core.a -lfmt -lpthread -lm -o compare && ./compare
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>
#include <random>
#include "quant_test_util.h"
#include "quant/vec_dot.h"
using namespace strata;
extern "C" {
float ggml_table_f32_f16[1 << 16];
float ggml_table_f32_e8m0_half[256];
float ggml_table_f32_ue4m3[256];
typedef void (*vd_t)(int, float*, size_t, const void*, size_t, const void*, size_t, int);
void ggml_vec_dot_q8_0_q8_0(int, float*, size_t, const void*, size_t, const void*, size_t, int);
void ggml_vec_dot_q4_0_q8_0(int, float*, size_t, const void*, size_t, const void*, size_t, int);
void ggml_vec_dot_q4_K_q8_K(int, float*, size_t, const void*, size_t, const void*, size_t, int);
void ggml_vec_dot_q5_K_q8_K(int, float*, size_t, const void*, size_t, const void*, size_t, int);
void ggml_vec_dot_q6_K_q8_K(int, float*, size_t, const void*, size_t, const void*, size_t, int);
void ggml_vec_dot_q2_K_q8_K(int, float*, size_t, const void*, size_t, const void*, size_t, int);
void ggml_vec_dot_q3_K_q8_K(int, float*, size_t, const void*, size_t, const void*, size_t, int);
void ggml_vec_dot_iq4_xs_q8_K(int, float*, size_t, const void*, size_t, const void*, size_t, int);
void ggml_vec_dot_iq2_xs_q8_K(int, float*, size_t, const void*, size_t, const void*, size_t, int);
void ggml_vec_dot_iq2_xxs_q8_K(int, float*, size_t, const void*, size_t, const void*, size_t, int);
void ggml_vec_dot_iq3_s_q8_K(int, float*, size_t, const void*, size_t, const void*, size_t, int);
void ggml_vec_dot_iq1_m_q8_K(int, float*, size_t, const void*, size_t, const void*, size_t, int);
void quantize_row_q8_0(const float*, void*, int64_t);
void quantize_row_q8_K(const float*, void*, int64_t);
}
int main() {
  for (int i = 0; i < 65536; ++i) ggml_table_f32_f16[i] = q::fp16_to_fp32((uint16_t)i);
  std::mt19937 rng(1);
  struct C { GgmlType t; vd_t g; bool k; };
  C cs[] = {{GgmlType::Q8_0, ggml_vec_dot_q8_0_q8_0, false}, {GgmlType::Q4_0, ggml_vec_dot_q4_0_q8_0, false},
            {GgmlType::Q4_K, ggml_vec_dot_q4_K_q8_K, true}, {GgmlType::Q5_K, ggml_vec_dot_q5_K_q8_K, true},
            {GgmlType::Q6_K, ggml_vec_dot_q6_K_q8_K, true}, {GgmlType::Q2_K, ggml_vec_dot_q2_K_q8_K, true},
            {GgmlType::Q3_K, ggml_vec_dot_q3_K_q8_K, true}, {GgmlType::IQ4_XS, ggml_vec_dot_iq4_xs_q8_K, true},
            {GgmlType::IQ2_XXS, ggml_vec_dot_iq2_xxs_q8_K, true}, {GgmlType::IQ2_XS, ggml_vec_dot_iq2_xs_q8_K, true},
            {GgmlType::IQ3_S, ggml_vec_dot_iq3_s_q8_K, true}, {GgmlType::IQ1_M, ggml_vec_dot_iq1_m_q8_K, true}};
  const int64_t n = 4096, rows = 32;
  for (auto& c : cs) {
    auto k = q::dot_kernel(c.t, CpuLevel::Avx512);
    std::vector<uint8_t> w;
    for (int r = 0; r < rows; ++r) { auto row = test::random_row(c.t, n, rng); w.insert(w.end(), row.begin(), row.end()); }
    const int64_t rb = row_bytes(c.t, n), xb = q::act_row_bytes(k.act, n);
    auto x = test::random_acts(4 * n, rng);
    std::vector<uint8_t> xq(4 * xb), gq(4 * n * 2);
    for (int i = 0; i < 4; ++i) q::quantize_act_row(k.act, x.data() + i * n, xq.data() + i * xb, n);
    const int64_t gxb = c.k ? n / 256 * 292 : n / 32 * 34;
    for (int i = 0; i < 4; ++i) { if (c.k) quantize_row_q8_K(x.data() + i * n, gq.data() + i * gxb, n); else quantize_row_q8_0(x.data() + i * n, gq.data() + i * gxb, n); }
    double ours1 = 1e9, ours4 = 1e9, g1 = 1e9; float sink = 0, out[4], gs = 0, os_ = 0;
    for (int rep = 0; rep < 800; ++rep) {
      auto t0 = std::chrono::steady_clock::now();
      for (int r = 0; r < rows; ++r) sink += k.fn(n, w.data() + r * rb, xq.data());
      auto t1 = std::chrono::steady_clock::now();
      for (int r = 0; r < rows; ++r) { k.fn4(n, w.data() + r * rb, xq.data(), xb, out, 1); sink += out[0]; }
      auto t2 = std::chrono::steady_clock::now();
      for (int r = 0; r < rows; ++r) { float s; c.g(n, &s, 0, w.data() + r * rb, 0, gq.data(), 0, 1); sink += s; }
      auto t3 = std::chrono::steady_clock::now();
      ours1 = std::min(ours1, std::chrono::duration<double>(t1 - t0).count());
      ours4 = std::min(ours4, std::chrono::duration<double>(t2 - t1).count() / 4);
      g1 = std::min(g1, std::chrono::duration<double>(t3 - t2).count());
    }
    { float s; c.g(n, &s, 0, w.data(), 0, gq.data(), 0, 1); gs = s; os_ = k.fn(n, w.data(), xq.data()); }
    printf("%-8s ours 1tok %6.1f us  ours 4tok %6.1f us/tok  ggml %6.1f us   ggml/ours(1tok) %.2f  ggml/ours(4tok) %.2f   (dot ours %.4f ggml %.4f)%s\n",
           std::string(type_name(c.t)).c_str(), ours1 * 1e6, ours4 * 1e6, g1 * 1e6, g1 / ours1, g1 / ours4, os_, gs, sink == 1234.f ? " " : "");
  }
}
