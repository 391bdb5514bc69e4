// Bit-for-bit parity of our fast dot kernels with the ggml build that made the fixtures' llama.cpp
// logits: loads node-llama-cpp's prebuilt CPU library (dlopen), quantizes random activations with
// ggml's own from_float, and compares ggml's vec_dot with ours (same activation bytes) at every CPU
// level. Why bitwise: the tiny qwen3moe fixtures are chaotic (a last-bit difference flips an int8
// rounding and later the routing), so fast mode tracks llama.cpp's KL only where the float order is
// the same. The scalar level is a reference with its own order (mismatches expected there).
// Not built by CMake (needs node-llama-cpp@3.21.1 installed, as bench/llama does):
//   g++ -std=c++20 -O2 -mavx2 -mf16c -mfma -Isrc tools/ggml_parity.cpp build/libstrata_core.a -ldl \
//       -lpthread -o /tmp/ggml_parity && /tmp/ggml_parity NODE_LLAMA_CPP_BINS_DIR [libggml-cpu-zen4.so]
// (the bins dir: node_modules/@node-llama-cpp/linux-x64/bins/linux-x64/).
#include <dlfcn.h>
#include <immintrin.h>
#include <cmath>
#include <string>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>
#include "quant/vec_dot.h"
#include "quant/types.h"
#include "cpu/cpu_features.h"
using namespace strata;
typedef void (*from_float_t)(const float*, void*, int64_t);
typedef void (*vec_dot_t)(int, float*, size_t, const void*, size_t, const void*, size_t, int);
struct tt_cpu { from_float_t from_float; vec_dot_t vec_dot; int vec_dot_type; int64_t nrows; };
uint16_t f2h(float f) { return _cvtss_sh(f, 0); }
int main(int argc, char** argv) {
  if (argc < 2) { printf("usage: %s BINS_DIR [libggml-cpu-VARIANT.so]\n", argv[0]); return 2; }
  const std::string dir = std::string(argv[1]) + "/";
  std::string b = dir + "libggml-base.so", c = dir + (argc > 2 ? argv[2] : "libggml-cpu-zen4.so");
  if (!dlopen(b.c_str(), RTLD_NOW | RTLD_GLOBAL)) { printf("%s\n", dlerror()); return 1; }
  void* h = dlopen(c.c_str(), RTLD_NOW | RTLD_GLOBAL);
  if (!h) { printf("%s\n", dlerror()); return 1; }
  ((void (*)())dlsym(h, "ggml_cpu_init"))();
  auto gtt = (const tt_cpu* (*)(int))dlsym(h, "ggml_get_type_traits_cpu");
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0, 1);
  struct T { GgmlType t; int id; int bs; int bb; std::vector<int> dofs; };
  std::vector<T> types = {{GgmlType::Q8_0, 8, 32, 34, {0}}, {GgmlType::Q5_K, 13, 256, 176, {0, 2}},
                          {GgmlType::Q6_K, 14, 256, 210, {208}}, {GgmlType::IQ4_XS, 23, 256, 136, {0}},
                          {GgmlType::Q4_K, 12, 256, 144, {0, 2}}, {GgmlType::IQ3_S, 21, 256, 110, {0}},
                          {GgmlType::Q2_K, 10, 256, 84, {80, 82}}};
  for (int n : {256, 512, 2048}) for (auto& ty : types) {
    const tt_cpu* g = gtt(ty.id);
    int nb = n / ty.bs; std::vector<uint8_t> w(nb * ty.bb);
    int diff[3] = {0, 0, 0}, qdiff = 0; const int R = 2000;
    for (int r = 0; r < R; ++r) {
      for (auto& x : w) x = rng();
      for (int i = 0; i < nb; ++i) for (int o : ty.dofs) { uint16_t hh = f2h(0.001f * (1 + (rng() % 100))); memcpy(&w[i * ty.bb + o], &hh, 2); }
      std::vector<float> x(n); float sc = std::exp(nd(rng)); for (auto& v : x) v = nd(rng) * sc * (rng() % 8 == 0 ? 5 : 1);
      const tt_cpu* gq = gtt(g->vec_dot_type);
      std::vector<uint8_t> gx(n * 2 + 1024), ox(n * 2 + 1024);
      gq->from_float(x.data(), gx.data(), n);
      float gs; g->vec_dot(n, &gs, 0, w.data(), 0, gx.data(), 0, 1);
      for (int lv = 0; lv < 3; ++lv) {
        q::DotKernel k = q::dot_kernel(ty.t, CpuLevel(lv));
        q::quantize_act_row(k.act, x.data(), ox.data(), n);
        if (lv == 0 && memcmp(gx.data(), ox.data(), q::act_row_bytes(k.act, n)) != 0) ++qdiff;
        const uint8_t* xin = gx.data();
        std::vector<uint8_t> conv;
        if (k.act == q::ActType::Q8_32) {  // ggml block_q8_0 (f16 d, 32 qs) -> ours (f32 d, sum, 32 qs)
          conv.resize(n / 32 * sizeof(q::BlockQ8A));
          auto* cb = reinterpret_cast<q::BlockQ8A*>(conv.data());
          for (int i = 0; i < n / 32; ++i) {
            uint16_t hd; memcpy(&hd, gx.data() + 34 * i, 2); cb[i].d = _cvtsh_ss(hd);
            memcpy(cb[i].qs, gx.data() + 34 * i + 2, 32); int sm = 0; for (int j = 0; j < 32; ++j) sm += cb[i].qs[j]; cb[i].sum = sm;
          }
          if (lv == 0 && memcmp(conv.data(), ox.data(), conv.size()) == 0) --qdiff;
          xin = conv.data();
        }
        float os = k.fn(n, w.data(), xin);
        if (memcmp(&os, &gs, 4) != 0) ++diff[lv];
      }
    }
    printf("n=%d %-7s act-quant mismatches %d/%d; dot mismatches scalar %d avx2 %d avx512 %d\n", n,
           std::string(type_name(ty.t)).c_str(), qdiff, R, diff[0], diff[1], diff[2]);
  }
}
