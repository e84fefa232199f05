// Quantized KV rows (engine/kv/quant.py, the torch reference), shared by the native kernels: a
// row of one token's one KV head is its D code bytes, then its float32 scale (little endian).
// scale = amax(|x|) / qmax (1 for an all-zero row); an int8 code is x / scale rounded half to even
// and clamped to +-127, an fp8 code is x / scale clamped to +-qmax and converted as torch converts
// to float8_e4m3fn / float8_e5m2 (nearest even, subnormals included). Written codes and scales
// are bit-identical to the reference's. Dequantized value: the code's value * scale, in float32.
#pragma once

#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Float8_e5m2.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#ifdef __AVX512F__
#include <immintrin.h>
#endif

namespace radixcache::kvq {

enum Format : int64_t { INT8 = 0, FP8_E4M3 = 1, FP8_E5M2 = 2 };  // KVFormat.code
constexpr int64_t SCALE_BYTES = 4;

inline bool valid_format(int64_t f) { return f == INT8 || f == FP8_E4M3 || f == FP8_E5M2; }

inline float qmax(int64_t f) { return f == INT8 ? 127.f : f == FP8_E4M3 ? 448.f : 57344.f; }

inline float row_scale(const uint8_t* row, int64_t d) {
  float s;
  std::memcpy(&s, row + d, sizeof(s));
  return s;
}

// One code of a value already divided by its scale and clamped, as torch converts it.
inline uint8_t encode(float v, int64_t f) {
  if (f == INT8) return static_cast<uint8_t>(static_cast<int8_t>(std::nearbyint(v)));
  if (f == FP8_E4M3) return c10::Float8_e4m3fn(v).x;
  return c10::Float8_e5m2(v).x;
}

// A code's value.
inline float decode(uint8_t c, int64_t f) {
  if (f == INT8) return static_cast<float>(static_cast<int8_t>(c));
  if (f == FP8_E4M3) return c10::Float8_e4m3fn(c, c10::Float8_e4m3fn::from_bits());
  return c10::Float8_e5m2(c, c10::Float8_e5m2::from_bits());
}

#ifdef __AVX512F__
inline __m512 load_f16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load_f16(const c10::BFloat16* p) {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}
inline __m512 load_f16(const c10::Half* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

inline __m512i set1(uint32_t x) { return _mm512_set1_epi32(static_cast<int>(x)); }

// c10's fp8e4m3fn_from_fp32_value / fp8e5m2_from_fp32_value, 16 lanes at once: the code of each
// lane (in its low byte). The fp8 bits are the float's, rebiased and rounded to nearest even by
// an added bias; below the smallest normal, a float add of a magic number rounds them. e4m3fn
// (SATURATE): a normal rounded up into 0x7F (NaN) becomes 0x7E, as c10's does.
template <uint32_t MANT_SHIFT, uint32_t BIAS, uint32_t NORMAL_MIN, uint32_t DENORM_MAGIC,
          uint32_t OVERFLOW, uint32_t OVERFLOW_CODE, bool SATURATE>
inline __m512i fp8_codes(__m512 v) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i sign = _mm512_and_si512(bits, set1(0x80000000u));
  const __m512i a = _mm512_xor_si512(bits, sign);
  const __m512i magic = set1(DENORM_MAGIC);
  const __m512i small = _mm512_sub_epi32(
      _mm512_castps_si512(_mm512_add_ps(_mm512_castsi512_ps(a), _mm512_castsi512_ps(magic))),
      magic);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(a, MANT_SHIFT), set1(1));
  __m512i code = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(a, set1(BIAS)), odd),
                                   MANT_SHIFT);
  if constexpr (SATURATE)
    code = _mm512_mask_mov_epi32(code, _mm512_cmpeq_epi32_mask(code, set1(0x7F)), set1(0x7E));
  code = _mm512_mask_mov_epi32(code, _mm512_cmplt_epu32_mask(a, set1(NORMAL_MIN)), small);
  code = _mm512_mask_mov_epi32(code, _mm512_cmpge_epu32_mask(a, set1(OVERFLOW)),
                               set1(OVERFLOW_CODE));
  code = _mm512_mask_mov_epi32(code, _mm512_cmpgt_epu32_mask(a, set1(0x7F800000u)), set1(0x7F));
  return _mm512_or_si512(code, _mm512_srli_epi32(sign, 24));
}

inline __m512i e4m3_codes(__m512 v) {
  return fp8_codes<20, (static_cast<uint32_t>(7 - 127) << 23) + 0x7FFFF, 121u << 23, 141u << 23,
                   1087u << 20, 0x7E, true>(v);
}

inline __m512i e5m2_codes(__m512 v) {
  return fp8_codes<21, (static_cast<uint32_t>(15 - 127) << 23) + 0xFFFFF, 113u << 23, 134u << 23,
                   143u << 23, 0x7C, false>(v);
}

// The values of 16 codes (their scale not applied; e4m3: value / 256, see dequantize_row).
template <int64_t F>
inline __m512 code_values(const uint8_t* c) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(c));
  if constexpr (F == INT8) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(raw));
  } else if constexpr (F == FP8_E5M2) {  // the high byte of a half
    return _mm512_cvtph_ps(_mm256_slli_epi16(_mm256_cvtepu8_epi16(raw), 8));
  } else {  // e4m3fn's sign, exponent and mantissa in a half's places: value / 256, subnormals too
    // code << 7 puts exponent and mantissa in place and the sign at bit 14; adding bit 14 to
    // itself moves it to bit 15
    const __m256i a = _mm256_slli_epi16(_mm256_cvtepu8_epi16(raw), 7);
    return _mm512_cvtph_ps(_mm256_add_epi16(a, _mm256_and_si256(a, _mm256_set1_epi16(0x4000))));
  }
}
#endif

// x [d] -> dst: d codes, then the scale (the reference's quantize of one row).
template <typename T>
inline void quantize_row(const T* x, int64_t d, int64_t f, uint8_t* dst) {
  const float top = qmax(f);
  float amax = 0.f;
  int64_t i = 0;
#ifdef __AVX512F__
  const bool vec = d % 16 == 0;
  if (vec) {
    __m512 m = _mm512_setzero_ps();
    for (; i < d; i += 16) m = _mm512_max_ps(m, _mm512_abs_ps(load_f16(x + i)));
    amax = _mm512_reduce_max_ps(m);
  }
#endif
  for (; i < d; ++i) amax = std::max(amax, std::fabs(static_cast<float>(x[i])));
  const float scale = amax > 0.f ? amax / top : 1.f;
  i = 0;
#ifdef __AVX512F__
  if (vec) {
    const __m512 s = _mm512_set1_ps(scale), hi = _mm512_set1_ps(top), lo = _mm512_set1_ps(-top);
    for (; i < d; i += 16) {
      const __m512 q = _mm512_min_ps(_mm512_max_ps(_mm512_div_ps(load_f16(x + i), s), lo), hi);
      __m512i code;
      if (f == INT8) {
        code = _mm512_cvtps_epi32(
            _mm512_roundscale_ps(q, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      } else {
        code = f == FP8_E4M3 ? e4m3_codes(q) : e5m2_codes(q);
      }
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm512_cvtepi32_epi8(code));
    }
  }
#endif
  for (; i < d; ++i)
    dst[i] = encode(std::clamp(static_cast<float>(x[i]) / scale, -top, top), f);
  std::memcpy(dst + d, &scale, sizeof(scale));
}

// A row (d codes, then the scale) -> out [d]: each code's value / unit (exact: e4m3 codes read
// as halves are value / 256, the others' unit is 1); returns scale * unit, what out's values are
// multiplied by to dequantize them (the kernels fold it into their scores and probabilities).
template <int64_t F>
inline float code_row(const uint8_t* row, int64_t d, float* out) {
  constexpr float unit = F == FP8_E4M3 ? 256.f : 1.f;
  int64_t i = 0;
#ifdef __AVX512F__
  for (; i + 16 <= d; i += 16) _mm512_storeu_ps(out + i, code_values<F>(row + i));
#endif
  for (; i < d; ++i) out[i] = decode(row[i], F) / unit;
  return row_scale(row, d) * unit;
}

}  // namespace radixcache::kvq
