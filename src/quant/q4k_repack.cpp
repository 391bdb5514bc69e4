// Q4_K 8-row repacking: layout, activation permutation and the process-wide cache (q4k_repack.h).
//
// Layout of RepQ4K8::qs[j][p] (64 bytes, rows 2p and 2p+1, sub-blocks 2j and 2j+1): dword m
// (16 of them; 128-bit lane L = m / 4, position pos = m % 4, k = pos / 2, e = pos % 2) holds row
// 2p + (L >= 2); its 4 bytes c carry, in the low nibble, value 4g + c of sub-block 2j + e with
// g = 4 (L % 2) + k, and in the high nibble the same for g = 4 (L % 2) + 2 + k. The kernel's
// vpdpbusd on the low (high) nibbles gives for each dword the sum of 4 products of one (sub-block,
// group); vpackssdw of the two results puts the (2j, g) and (2j+1, g) sums side by side in one
// dword, in the order dword 4L + q <- group 4 (L % 2) + q, so a vpdpwssd with the (scale 2j,
// scale 2j+1) pair adds exactly the 1-row kernel's lane g of row 2p + (L >= 2).
#include "quant/q4k_repack.h"

#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "common/error.h"
#include "cpu/cpu_features.h"
#include "quant/blocks.h"

namespace strata::q {
namespace {

// Q4_K's 12 packed bytes -> 8 scales then 8 mins (as ggml / the x86 kernel's k4_unpack).
void unpack_scales_mins(const uint8_t* packed, uint8_t out[16]) {
  for (int j = 0; j < 8; ++j) {
    if (j < 4) {
      out[j] = packed[j] & 63;
      out[8 + j] = packed[j + 4] & 63;
    } else {
      out[j] = (packed[j + 4] & 0xF) | ((packed[j - 4] >> 6) << 4);
      out[8 + j] = (packed[j + 4] >> 4) | ((packed[j] >> 6) << 4);
    }
  }
}

struct Cache {
  std::mutex mu;
  size_t budget = 0, bytes = 0;
  // (pointer, rows, cols) -> copy: [rows / 8][cols / 256] blocks
  std::map<std::tuple<const void*, int64_t, int64_t>, std::shared_ptr<const RepQ4K8[]>> copies;
};
Cache& cache() {
  static Cache c;
  return c;
}

bool cpu_can() {
  const CpuFeatures& f = cpu_features();
  return cpu_level() == CpuLevel::Avx512 && f.avx512vbmi;
}

}  // namespace

void q4k_repack_rows8(const uint8_t* w, int64_t row_bytes, int64_t nb, RepQ4K8* out) {
  for (int64_t b = 0; b < nb; ++b) {
    RepQ4K8& o = out[b];
    for (int r = 0; r < 8; ++r) {
      const BlockQ4_K& blk = reinterpret_cast<const BlockQ4_K*>(w + r * row_bytes)[b];
      o.d[r] = fp16_to_fp32(blk.d);
      o.dmin[r] = fp16_to_fp32(blk.dmin);
      uint8_t sm[16];
      unpack_scales_mins(blk.scales, sm);
      for (int s = 0; s < 8; ++s) o.sc[s][r] = sm[s], o.mins[r][s] = sm[8 + s];
      for (int j = 0; j < 4; ++j)
        for (int m = 0; m < 16; ++m) {  // 4 bytes at a time: nibble e of groups g (low) and g + 2 (high)
          const int L = m / 4, k = (m % 4) / 2, e = m % 2;
          if ((L >= 2) != (r % 2 == 1)) continue;
          const int g = 4 * (L % 2) + k;
          uint32_t a, c;
          std::memcpy(&a, blk.qs + 32 * j + 4 * g, 4);
          std::memcpy(&c, blk.qs + 32 * j + 4 * (g + 2), 4);
          const uint32_t v = e ? ((a >> 4) & 0x0F0F0F0Fu) | (c & 0xF0F0F0F0u) : (a & 0x0F0F0F0Fu) | ((c & 0x0F0F0F0Fu) << 4);
          std::memcpy(o.qs[j][r / 2] + 4 * m, &v, 4);
        }
    }
  }
}

void q4k_permute_acts(const uint8_t* xq, int64_t xs, int64_t n_tok, int64_t cols, uint8_t* xperm) {
  const int64_t nb = cols / QK_K;
  for (int64_t t = 0; t < n_tok; ++t)
    for (int64_t b = 0; b < nb; ++b) {
      const BlockQ8_K& x = reinterpret_cast<const BlockQ8_K*>(xq + t * xs)[b];
      uint8_t* o = xperm + (t * nb + b) * QK_K;
      for (int j = 0; j < 4; ++j)
        for (int m = 0; m < 8; ++m) {  // dwords of one row's half (lanes 0 and 1): L = m / 4
          const int Lr = m / 4, k = (m % 4) / 2, e = m % 2;
          std::memcpy(o + 64 * j + 4 * m, &x.qs[32 * (2 * j + e) + 4 * (4 * Lr + k)], 4);
          std::memcpy(o + 64 * j + 32 + 4 * m, &x.qs[32 * (2 * j + e) + 4 * (4 * Lr + 2 + k)], 4);
        }
    }
}

void q4k_repack_set_budget(size_t bytes) {
  Cache& c = cache();
  std::lock_guard lock(c.mu);
  c.budget = bytes;
  if (bytes == 0) c.copies.clear(), c.bytes = 0;
}
size_t q4k_repack_budget() {
  std::lock_guard lock(cache().mu);
  return cache().budget;
}
size_t q4k_repack_default_budget() {
  const char* e = std::getenv("STRATA_Q4K_REPACK_MIB");
  if (e && *e) {
    char* end = nullptr;
    const unsigned long long mib = std::strtoull(e, &end, 10);
    STRATA_REQUIRE(end && *end == '\0' && mib < (1ull << 40), "STRATA_Q4K_REPACK_MIB: not a size in MiB: '{}'", e);
    return static_cast<size_t>(mib) << 20;
  }
  return 0;
}
size_t q4k_repack_bytes() {
  std::lock_guard lock(cache().mu);
  return cache().bytes;
}
void q4k_repack_clear() {
  Cache& c = cache();
  std::lock_guard lock(c.mu);
  c.copies.clear();
  c.bytes = 0;
}

std::shared_ptr<const RepQ4K8[]> q4k_repacked(const void* w, int64_t rows, int64_t cols) {
  if (rows <= 0 || rows % 8 != 0 || cols <= 0 || cols % QK_K != 0) return nullptr;
  Cache& c = cache();
  std::lock_guard lock(c.mu);  // held while repacking: a matrix is repacked once, by one thread
  if (c.budget == 0 || !cpu_can()) return nullptr;
  const auto key = std::make_tuple(w, rows, cols);
  if (auto it = c.copies.find(key); it != c.copies.end()) return it->second;
  const int64_t nb = cols / QK_K, n_blocks = rows / 8 * nb;
  const size_t need = static_cast<size_t>(n_blocks) * sizeof(RepQ4K8);
  if (c.bytes + need > c.budget) return nullptr;  // over budget: this matrix keeps the 1-row kernel
  std::shared_ptr<RepQ4K8[]> copy(new RepQ4K8[n_blocks]);
  const int64_t row_bytes = nb * static_cast<int64_t>(sizeof(BlockQ4_K));
  for (int64_t g = 0; g < rows / 8; ++g)
    q4k_repack_rows8(static_cast<const uint8_t*>(w) + g * 8 * row_bytes, row_bytes, nb, copy.get() + g * nb);
  c.bytes += need;
  return c.copies.emplace(key, std::move(copy)).first->second;
}

}  // namespace strata::q
