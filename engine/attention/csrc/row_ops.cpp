// A decoder layer's row-wise ops, each one dispatch instead of a chain of small torch ops: RMSNorm
// (alone and after the residual add), SiLU(gate) * up, and rope of the q and k heads with the
// k and v rows stored into the paged KV cache (quantized into a quantized pool: kv_quant.h, each
// row once). Each row is computed alone, in float32, in a fixed
// order (16 lanes on AVX-512, then the lanes summed in a fixed tree): a row's bits never depend on
// how many rows share the call (what the deterministic mode needs). Rounding follows the torch
// reference (engine/models/row_ops.py), which rounds to the activations' dtype after each op:
// RMSNorm rounds x * rsqrt(mean(x^2) + eps) before the weight multiply (as transformers does),
// the residual add rounds the sum, SiLU * up rounds SiLU's output, rope rounds x * cos.

#include <ATen/Parallel.h>
#include <torch/library.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#ifdef __AVX512F__
#include <immintrin.h>
#endif

#include "kv_quant.h"
#include "vec_exp.h"

#ifdef __AVX512F__
using radixcache::exp16;
#endif

namespace {

// The least rows a task takes: a call of fewer than ~64K values (decode and verify steps) stays
// on the calling thread, since waking a sleeping worker costs more than the call does.
inline int64_t rows_per_task(int64_t values_per_row) {
  return std::max<int64_t>(16, 65536 / std::max<int64_t>(1, values_per_row));
}

#ifdef __AVX512F__
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const c10::BFloat16* p) {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}
inline void store16(float* p, __m512 v) { _mm512_storeu_ps(p, v); }
// round to nearest even, as c10::BFloat16 does for finite values
inline __m512 round16(__m512 v, const float*) { return v; }
inline __m512 round16(__m512 v, const c10::BFloat16*) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i up = _mm512_add_epi32(bits, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd));
  return _mm512_castsi512_ps(_mm512_and_si512(up, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
}
inline void store16(c10::BFloat16* p, __m512 v) {
  const __m512i top = _mm512_srli_epi32(_mm512_castps_si512(round16(v, p)), 16);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(top));
}
template <typename T>
constexpr bool VECTOR = std::is_same_v<T, float> || std::is_same_v<T, c10::BFloat16>;
#else
template <typename T>
constexpr bool VECTOR = false;
#endif

template <typename T>
float sum_of_squares(const T* x, int64_t n) {
  float ss = 0.f;
  int64_t done = 0;
#ifdef __AVX512F__
  if constexpr (VECTOR<T>) {
    __m512 acc = _mm512_setzero_ps();
    for (; done + 16 <= n; done += 16) {
      const __m512 v = load16(x + done);
      acc = _mm512_fmadd_ps(v, v, acc);
    }
    ss = _mm512_reduce_add_ps(acc);
  }
#endif
  for (int64_t i = done; i < n; ++i) {
    const float v = static_cast<float>(x[i]);
    ss += v * v;
  }
  return ss;
}

// the value a torch op on T hands the next op: float32 math rounded to T
template <typename T>
inline float rounded(float v) {
  return static_cast<float>(static_cast<T>(v));
}

// o = (x * inv rounded to T) * w, x a row of n values
template <typename T>
inline void normalize_row(const T* x, const T* w, T* o, int64_t n, float eps) {
  const float inv = 1.f / std::sqrt(sum_of_squares(x, n) / static_cast<float>(n) + eps);
  int64_t i = 0;
#ifdef __AVX512F__
  if constexpr (VECTOR<T>) {
    const __m512 vinv = _mm512_set1_ps(inv);
    for (; i + 16 <= n; i += 16) {
      const __m512 normed = round16(_mm512_mul_ps(load16(x + i), vinv), o);
      store16(o + i, _mm512_mul_ps(normed, load16(w + i)));
    }
  }
#endif
  for (; i < n; ++i)
    o[i] = static_cast<T>(rounded<T>(static_cast<float>(x[i]) * inv) * static_cast<float>(w[i]));
}

template <typename T>
void rms_norm_rows(const T* x, int64_t x_stride, const T* w, T* out, int64_t rows, int64_t n,
                   float eps) {
  at::parallel_for(0, rows, rows_per_task(n), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) normalize_row(x + r * x_stride, w, out + r * n, n, eps);
  });
}

// residual[r] = residual[r] + x[r] (rounded to T, in place), then out[r] = its RMSNorm
template <typename T>
void add_rms_norm_rows(const T* x, int64_t x_stride, T* residual, int64_t res_stride, const T* w,
                       T* out, int64_t rows, int64_t n, float eps) {
  at::parallel_for(0, rows, rows_per_task(n), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* xr = x + r * x_stride;
      T* h = residual + r * res_stride;
      int64_t i = 0;
#ifdef __AVX512F__
      if constexpr (VECTOR<T>) {
        for (; i + 16 <= n; i += 16) store16(h + i, _mm512_add_ps(load16(h + i), load16(xr + i)));
      }
#endif
      for (; i < n; ++i) h[i] = static_cast<T>(static_cast<float>(h[i]) + static_cast<float>(xr[i]));
      normalize_row(h, w, out + r * n, n, eps);
    }
  });
}

// out[r] = silu(gate) * up of gate_up[r] = [gate (inter), up (inter)]; silu rounded to T first
template <typename T>
void silu_mul_rows(const T* gate_up, int64_t stride, T* out, int64_t rows, int64_t inter) {
  at::parallel_for(0, rows, rows_per_task(2 * inter), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* g = gate_up + r * stride;
      const T* u = g + inter;
      T* o = out + r * inter;
      int64_t i = 0;
#ifdef __AVX512F__
      if constexpr (VECTOR<T>) {
        const __m512 one = _mm512_set1_ps(1.f);
        for (; i + 16 <= inter; i += 16) {
          const __m512 x = load16(g + i);
          const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), x));
          const __m512 silu = round16(_mm512_div_ps(x, _mm512_add_ps(one, e)), o);
          store16(o + i, _mm512_mul_ps(silu, load16(u + i)));
        }
      }
#endif
      for (; i < inter; ++i) {
        const float x = static_cast<float>(g[i]);
        o[i] = static_cast<T>(rounded<T>(x / (1.f + std::exp(-x))) * static_cast<float>(u[i]));
      }
    }
  });
}

// Rotate-half rope of one head x[0, d) into o: with c = cos[0, d) ([cos, cos, 1...]) and
// s = sin[0, half), o1 = (x1 * c1) - x2 * s, o2 = (x2 * c2) + x1 * s on the rotary dims and
// o = x * c beyond them; each x * c rounded to T first (as the reference's x * cos).
template <typename T>
inline void rope_head(const T* x, const T* c, const T* s, T* o, int64_t half, int64_t d) {
  int64_t i = 0;
#ifdef __AVX512F__
  if constexpr (VECTOR<T>) {
    if (half % 16 == 0) {
      for (; i < half; i += 16) {
        const __m512 x1 = load16(x + i), x2 = load16(x + half + i), sv = load16(s + i);
        const __m512 a1 = round16(_mm512_mul_ps(x1, load16(c + i)), o);
        const __m512 a2 = round16(_mm512_mul_ps(x2, load16(c + half + i)), o);
        store16(o + i, _mm512_sub_ps(a1, _mm512_mul_ps(x2, sv)));
        store16(o + half + i, _mm512_add_ps(a2, _mm512_mul_ps(x1, sv)));
      }
    }
  }
#endif
  for (; i < half; ++i) {
    const float x1 = static_cast<float>(x[i]), x2 = static_cast<float>(x[half + i]);
    const float sv = static_cast<float>(s[i]);
    o[i] = static_cast<T>(rounded<T>(x1 * static_cast<float>(c[i])) - x2 * sv);
    o[half + i] = static_cast<T>(rounded<T>(x2 * static_cast<float>(c[half + i])) + x1 * sv);
  }
  for (i = 2 * half; i < d; ++i) o[i] = static_cast<T>(static_cast<float>(x[i]) * static_cast<float>(c[i]));
}

struct RopeShape {
  int64_t tokens, heads, kv_heads, d, half;
  int64_t qk_token, qk_head, v_token, v_head, cos_token, sin_token;
};

// out [T, heads, d] = rope of qk's heads; store(t, its roped k heads [kv_heads, d], its v rows)
// writes token t's keys and values to the caches
template <typename T, typename Store>
void rope_rows(const T* qk, const T* v, const T* cos, const T* sin, T* out, const RopeShape& sh,
               const Store& store) {
  const int64_t first_k = sh.heads - sh.kv_heads;
  at::parallel_for(0, sh.tokens, rows_per_task(sh.heads * sh.d), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const T* c = cos + t * sh.cos_token;
      const T* s = sin + t * sh.sin_token;
      T* o = out + t * sh.heads * sh.d;
      for (int64_t h = 0; h < sh.heads; ++h)
        rope_head(qk + t * sh.qk_token + h * sh.qk_head, c, s, o + h * sh.d, sh.half, sh.d);
      store(t, o + first_k * sh.d, v + t * sh.v_token);
    }
  });
}

// the k heads and v rows as they are, into caches [num_blocks, bs, kv_heads, d] of T
template <typename T>
void rope_store_kv_rows(const T* qk, const T* v, const T* cos, const T* sin, T* out, T* k_cache,
                        T* v_cache, const int64_t* slots, const RopeShape& sh) {
  const int64_t row = sh.kv_heads * sh.d;
  rope_rows(qk, v, cos, sin, out, sh, [&](int64_t t, const T* k, const T* vt) {
    std::memcpy(k_cache + slots[t] * row, k, row * sizeof(T));
    for (int64_t h = 0; h < sh.kv_heads; ++h)
      std::memcpy(v_cache + slots[t] * row + h * sh.d, vt + h * sh.v_head, sh.d * sizeof(T));
  });
}

// the k heads and v rows quantized (kv_quant.h), into uint8 caches [num_blocks, bs, kv_heads,
// d + 4]
template <typename T>
void rope_store_kv_q_rows(const T* qk, const T* v, const T* cos, const T* sin, T* out,
                          uint8_t* k_cache, uint8_t* v_cache, const int64_t* slots,
                          const RopeShape& sh, int64_t format) {
  const int64_t packed = sh.d + radixcache::kvq::SCALE_BYTES;
  rope_rows(qk, v, cos, sin, out, sh, [&](int64_t t, const T* k, const T* vt) {
    for (int64_t h = 0; h < sh.kv_heads; ++h) {
      const int64_t at = (slots[t] * sh.kv_heads + h) * packed;
      radixcache::kvq::quantize_row(k + h * sh.d, sh.d, format, k_cache + at);
      radixcache::kvq::quantize_row(vt + h * sh.v_head, sh.d, format, v_cache + at);
    }
  });
}

template <typename F>
void by_dtype(const torch::Tensor& t, const char* op, const F& fn) {
  switch (t.scalar_type()) {
    case torch::kFloat: fn(float{}); break;
    case torch::kBFloat16: fn(c10::BFloat16{}); break;
    case torch::kHalf: fn(c10::Half{}); break;
    default: TORCH_CHECK(false, op, ": float32, bfloat16 or float16 only, got ", t.scalar_type());
  }
}

void check_rows(const torch::Tensor& x, const torch::Tensor& weight, const char* op) {
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1, op, ": x must be [rows, n], rows contiguous");
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == x.size(1) && weight.is_contiguous() &&
                  weight.scalar_type() == x.scalar_type(),
              op, ": weight must be a contiguous [n] of x's dtype");
}

// x [rows, n] (rows may be strided, elements contiguous), weight [n] -> [rows, n]
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  check_rows(x, weight, "rms_norm");
  auto out = torch::empty({x.size(0), x.size(1)}, x.options());
  by_dtype(x, "rms_norm", [&](auto tag) {
    using T = decltype(tag);
    rms_norm_rows<T>(x.data_ptr<T>(), x.stride(0), weight.data_ptr<T>(), out.data_ptr<T>(),
                     x.size(0), x.size(1), static_cast<float>(eps));
  });
  return out;
}

// residual [rows, n] += x [rows, n] in place; -> RMSNorm(residual) * weight
torch::Tensor add_rms_norm(const torch::Tensor& x, torch::Tensor& residual,
                           const torch::Tensor& weight, double eps) {
  check_rows(x, weight, "add_rms_norm");
  check_rows(residual, weight, "add_rms_norm");
  TORCH_CHECK(residual.size(0) == x.size(0), "add_rms_norm: x and residual differ in rows");
  auto out = torch::empty({x.size(0), x.size(1)}, x.options());
  by_dtype(x, "add_rms_norm", [&](auto tag) {
    using T = decltype(tag);
    add_rms_norm_rows<T>(x.data_ptr<T>(), x.stride(0), residual.data_ptr<T>(), residual.stride(0),
                         weight.data_ptr<T>(), out.data_ptr<T>(), x.size(0), x.size(1),
                         static_cast<float>(eps));
  });
  return out;
}

// gate_up [rows, 2 * inter] (rows may be strided) -> silu(gate) * up [rows, inter]
torch::Tensor silu_mul(const torch::Tensor& gate_up) {
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.stride(1) == 1 && gate_up.size(1) % 2 == 0,
              "silu_mul: gate_up must be [rows, 2 * inter], rows contiguous");
  const int64_t inter = gate_up.size(1) / 2;
  auto out = torch::empty({gate_up.size(0), inter}, gate_up.options());
  by_dtype(gate_up, "silu_mul", [&](auto tag) {
    using T = decltype(tag);
    silu_mul_rows<T>(gate_up.data_ptr<T>(), gate_up.stride(0), out.data_ptr<T>(),
                     gate_up.size(0), inter);
  });
  return out;
}

// qk [T, Hq + Hkv, D] and v [T, Hkv, D] (any token and head strides, D contiguous), cos [T, 1, D]
// ([cos, cos, 1...]), sin [T, 1, half], slots int64 [T] -> the rope's shape; row: a cache row's
// last dimension (D, or D + 4 for quantized rows)
RopeShape rope_shape(const torch::Tensor& qk, const torch::Tensor& v, const torch::Tensor& cos,
                     const torch::Tensor& sin, const torch::Tensor& k_cache,
                     const torch::Tensor& v_cache, const torch::Tensor& slots, int64_t row,
                     const char* op) {
  TORCH_CHECK(qk.dim() == 3 && v.dim() == 3 && qk.stride(2) == 1 && v.stride(2) == 1, op,
              ": qk [T, H, D] and v [T, Hkv, D] with contiguous heads");
  const int64_t t = qk.size(0), heads = qk.size(1), d = qk.size(2), hkv = v.size(1);
  TORCH_CHECK(v.size(0) == t && v.size(2) == d && hkv < heads, op, ": v's shape");
  TORCH_CHECK(cos.numel() == t * d && sin.dim() == 3 && sin.size(0) == t && 2 * sin.size(2) <= d &&
                  cos.stride(2) == 1 && sin.stride(2) == 1,
              op, ": cos [T, 1, D] and sin [T, 1, half]");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous() && k_cache.dim() == 4 &&
                  k_cache.sizes() == v_cache.sizes() && k_cache.size(2) == hkv &&
                  k_cache.size(3) == row,
              op, ": caches [num_blocks, bs, Hkv, ", row == d ? "D" : "D + 4", "], contiguous");
  TORCH_CHECK(slots.dim() == 1 && slots.size(0) == t && slots.scalar_type() == torch::kLong &&
                  slots.is_contiguous(),
              op, ": slots int64 [T]");
  for (auto x : {v, cos, sin})
    TORCH_CHECK(x.scalar_type() == qk.scalar_type(), op, ": qk, v, cos and sin of one dtype");
  const int64_t* sp = slots.data_ptr<int64_t>();
  const int64_t num_slots = k_cache.size(0) * k_cache.size(1);
  for (int64_t i = 0; i < t; ++i)
    TORCH_CHECK(sp[i] >= 0 && sp[i] < num_slots, op, ": slot out of range");
  return RopeShape{t, heads, hkv, d, sin.size(2), qk.stride(0), qk.stride(1),
                   v.stride(0), v.stride(1), cos.stride(0), sin.stride(0)};
}

// -> roped qk as a new [T, Hq + Hkv, D]; its k heads and v stored at each token's slot of the
// caches [num_blocks, bs, Hkv, D] (contiguous, qk's dtype)
torch::Tensor rope_store_kv(const torch::Tensor& qk, const torch::Tensor& v,
                            const torch::Tensor& cos, const torch::Tensor& sin,
                            torch::Tensor& k_cache, torch::Tensor& v_cache,
                            const torch::Tensor& slots) {
  const RopeShape shape =
      rope_shape(qk, v, cos, sin, k_cache, v_cache, slots, qk.size(2), "rope_store_kv");
  TORCH_CHECK(
      k_cache.scalar_type() == qk.scalar_type() && v_cache.scalar_type() == qk.scalar_type(),
      "rope_store_kv: every tensor in qk's dtype");
  auto out = torch::empty({shape.tokens, shape.heads, shape.d}, qk.options());
  by_dtype(qk, "rope_store_kv", [&](auto tag) {
    using T = decltype(tag);
    rope_store_kv_rows<T>(qk.data_ptr<T>(), v.data_ptr<T>(), cos.data_ptr<T>(), sin.data_ptr<T>(),
                          out.data_ptr<T>(), k_cache.data_ptr<T>(), v_cache.data_ptr<T>(),
                          slots.data_ptr<int64_t>(), shape);
  });
  return out;
}

// rope_store_kv into quantized caches: uint8 [num_blocks, bs, Hkv, D + 4] rows of `format`
// (KVFormat.code), each row quantized once, as engine/kv/quant.py's quantize
torch::Tensor rope_store_kv_q(const torch::Tensor& qk, const torch::Tensor& v,
                              const torch::Tensor& cos, const torch::Tensor& sin,
                              torch::Tensor& k_cache, torch::Tensor& v_cache,
                              const torch::Tensor& slots, int64_t format) {
  TORCH_CHECK(radixcache::kvq::valid_format(format), "rope_store_kv_q: format 0, 1 or 2");
  const RopeShape shape = rope_shape(qk, v, cos, sin, k_cache, v_cache, slots,
                                     qk.size(2) + radixcache::kvq::SCALE_BYTES, "rope_store_kv_q");
  TORCH_CHECK(k_cache.scalar_type() == torch::kUInt8 && v_cache.scalar_type() == torch::kUInt8,
              "rope_store_kv_q: uint8 caches");
  auto out = torch::empty({shape.tokens, shape.heads, shape.d}, qk.options());
  by_dtype(qk, "rope_store_kv_q", [&](auto tag) {
    using T = decltype(tag);
    rope_store_kv_q_rows<T>(qk.data_ptr<T>(), v.data_ptr<T>(), cos.data_ptr<T>(),
                            sin.data_ptr<T>(), out.data_ptr<T>(), k_cache.data_ptr<uint8_t>(),
                            v_cache.data_ptr<uint8_t>(), slots.data_ptr<int64_t>(), shape, format);
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(radixcache, m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("add_rms_norm(Tensor x, Tensor(a!) residual, Tensor weight, float eps) -> Tensor");
  m.def("silu_mul(Tensor gate_up) -> Tensor");
  m.def(
      "rope_store_kv(Tensor qk, Tensor v, Tensor cos, Tensor sin, Tensor(a!) k_cache, "
      "Tensor(b!) v_cache, Tensor slots) -> Tensor");
  m.def(
      "rope_store_kv_q(Tensor qk, Tensor v, Tensor cos, Tensor sin, Tensor(a!) k_cache, "
      "Tensor(b!) v_cache, Tensor slots, int format) -> Tensor");
}

TORCH_LIBRARY_IMPL(radixcache, CPU, m) {
  m.impl("rms_norm", &rms_norm);
  m.impl("add_rms_norm", &add_rms_norm);
  m.impl("silu_mul", &silu_mul);
  m.impl("rope_store_kv", &rope_store_kv);
  m.impl("rope_store_kv_q", &rope_store_kv_q);
}
