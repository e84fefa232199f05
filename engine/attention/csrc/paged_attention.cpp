// Paged attention on CPU, read in place through block tables (no gather, no mask); reference:
// engine/attention/torch_backend.py. paged_decode: one new token per sequence attends its whole
// context; paged_prefill: each sequence's new tokens attend their keys causally. Both take an
// optional sliding window W: the token at position p attends keys [max(0, p - W + 1), p] only,
// and keys before every token's window are not read.
//
// q [N, Hq, D], caches [num_blocks, block_size, Hkv, D], block_tables int32 [N, W],
// seq_lens int32 [N] -> out [N, Hq, D]. One task per (sequence, kv head): its G = Hq / Hkv query
// heads share every key and value row it loads. Scores and sums are float32.
//
// The vector code is chosen at compile time (-march=native): AVX-512 (+ AVX512-BF16 for the
// bfloat16 prefill kernel), else AVX2 + FMA + F16C (8-wide, float32 math), else scalar decode.
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include "vec_exp.h"

#ifdef __AVX512F__
using radixcache::exp16;
#endif
#if defined(__AVX2__) && defined(__FMA__)
using radixcache::exp8;
#endif

// The 8-wide path: AVX2 + FMA (+ F16C for float16), for CPUs without AVX-512.
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define RC_AVX2 1
#endif

namespace {

inline float load(const float* p) { return *p; }
inline float load(const c10::Half* p) { return static_cast<float>(*p); }
inline float load(const c10::BFloat16* p) {
  uint32_t bits = static_cast<uint32_t>(reinterpret_cast<const uint16_t*>(p)[0]) << 16;
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

template <typename T>
inline void to_float(const T* src, float* dst, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] = load(src + i);
}

constexpr int64_t CHUNK = 16;  // keys scored together: one 16-float vector per query head

// Scores of one chunk of keys: kt holds the chunk transposed ([D][CHUNK], float32), so each
// query head's 16 scores accumulate in one vector with no horizontal sums.
inline void score_chunk(const float* qf, const float* kt, int64_t group, int64_t D,
                        float* s_out, int64_t stride, int64_t n) {
  for (int64_t g = 0; g < group; ++g) {
    float s[CHUNK] = {0.f};
    for (int64_t i = 0; i < D; ++i) {
      const float qi = qf[g * D + i];
#pragma omp simd
      for (int64_t j = 0; j < CHUNK; ++j) s[j] += qi * kt[i * CHUNK + j];
    }
    for (int64_t j = 0; j < n; ++j) s_out[g * stride + j] = s[j];
  }
}

// lse (when given): each row's log-sum-exp, lse[g] = max + log(sum of exp)
inline void softmax_rows(float* scores, int64_t group, int64_t len, float* lse) {
  for (int64_t g = 0; g < group; ++g) {
    float* s = scores + g * len;
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t t = 0; t < len; ++t) m = std::max(m, s[t]);
    float sum = 0.f;
    for (int64_t t = 0; t < len; ++t) {
      s[t] = std::exp(s[t] - m);
      sum += s[t];
    }
    if (lse != nullptr) lse[g] = m + std::log(sum);
    const float inv = 1.f / sum;
#pragma omp simd
    for (int64_t t = 0; t < len; ++t) s[t] *= inv;
  }
}

// The slots of keys [begin, end) of a block table (key t sits at table[t / bs] * bs + t % bs):
// entry i is key begin + i. Listed once per task: a division per key and head cost more than
// the dot products.
inline const int64_t* list_slots(const int32_t* table, int64_t begin, int64_t end, int64_t bs) {
  thread_local std::vector<int64_t> slots;
  slots.resize(static_cast<size_t>(std::max<int64_t>(0, end - begin)));
  for (int64_t t = begin, i = 0, blk = begin / bs, o = begin % bs; t < end; ++blk, o = 0)
    for (; o < bs && t < end; ++o, ++t, ++i) slots[i] = table[blk] * bs + o;
  return slots.data();
}

#if defined(__AVX512F__) || defined(RC_AVX2)
inline void prefetch_row(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t off = 0; off < bytes; off += 64) _mm_prefetch(c + off, _MM_HINT_T0);
}
#endif

#ifdef __AVX512F__
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const c10::BFloat16* p) {
  const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(x), 16));
}
inline __m512 load16(const c10::Half* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// 16 vectors -> one vector whose lane i is the sum of v[i]'s 16 lanes.
inline __m512 reduce16(const __m512* v) {
  __m512 b[8], c[4];
  for (int i = 0; i < 8; ++i)  // per 128-bit lane: [x0+x2, y0+y2, x1+x3, y1+y3]
    b[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                         _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; ++i) {  // per 128-bit lane: the lane sums of 4 vectors
    const __m512d x = _mm512_castps_pd(b[2 * i]), y = _mm512_castps_pd(b[2 * i + 1]);
    c[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)),
                         _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
  // c[i] lane L holds vectors 4i..4i+3's sums over lane L: add the four lanes up
  const __m512 f0 = _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                  _mm512_shuffle_f32x4(c[0], c[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512 f1 = _mm512_add_ps(_mm512_shuffle_f32x4(c[2], c[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                  _mm512_shuffle_f32x4(c[2], c[3], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_add_ps(_mm512_shuffle_f32x4(f0, f1, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(f0, f1, _MM_SHUFFLE(3, 1, 3, 1)));
}

// q . k as 16 partial sums (reduced later): qv holds q as float vectors, qraw the raw row. With
// AVX512-BF16, bfloat16 rows are multiplied pairwise in place (exact products, float sums).
template <typename T, int64_t D>
inline __m512 dot_parts(const __m512* qv, const T* qraw, const T* kr) {
#ifdef __AVX512BF16__
  if constexpr (std::is_same_v<T, c10::BFloat16> && D % 32 == 0) {
    __m512 a = _mm512_setzero_ps();
    for (int64_t c = 0; c < D / 32; ++c) {
      const __m512i qb = _mm512_loadu_si512(qraw + c * 32);
      const __m512i kb = _mm512_loadu_si512(kr + c * 32);
      a = _mm512_dpbf16_ps(a, reinterpret_cast<const __m512bh&>(qb),
                           reinterpret_cast<const __m512bh&>(kb));
    }
    return a;
  }
#endif
  (void)qraw;
  __m512 a = _mm512_mul_ps(qv[0], load16(kr));
  for (int64_t c = 1; c < D / 16; ++c) a = _mm512_fmadd_ps(qv[c], load16(kr + c * 16), a);
  return a;
}

// acc [K heads][D / 16] += p[k][t] * v[t] over keys [0, len): K query heads of one kv head
// (their probability rows `len` apart), the sums held in registers; v rows one block ahead are
// prefetched.
template <typename T, int64_t D, int64_t K>
inline void decode_values(__m512* acc, const float* p, int64_t len, const T* v_head,
                          const int64_t* slots, int64_t row, int64_t bs) {
  constexpr int64_t V = D / 16;
  __m512 a[K][V];
  for (int64_t x = 0; x < K; ++x)
    for (int64_t c = 0; c < V; ++c) a[x][c] = acc[x * V + c];
  for (int64_t t = 0; t < len; ++t) {
    if (t + bs < len) prefetch_row(v_head + slots[t + bs] * row, D * sizeof(T));
    const T* vr = v_head + slots[t] * row;
    __m512 v[V];
    for (int64_t c = 0; c < V; ++c) v[c] = load16(vr + c * 16);
    for (int64_t x = 0; x < K; ++x) {
      const __m512 px = _mm512_set1_ps(p[x * len + t]);
      for (int64_t c = 0; c < V; ++c) a[x][c] = _mm512_fmadd_ps(px, v[c], a[x][c]);
    }
  }
  for (int64_t x = 0; x < K; ++x)
    for (int64_t c = 0; c < V; ++c) acc[x * V + c] = a[x][c];
}

// One sequence, kv heads [h0, h1), keys at slots[0, len), with 16-float vectors: each slot's
// rows of those heads are contiguous, so a task streams through whole blocks; every key row is
// loaded once and dotted with its G query heads. The row one block ahead is prefetched (blocks
// are scattered).
template <typename T, int64_t D, typename O>
void decode_task_avx512(const T* q, const T* k_cache, const T* v_cache, const int64_t* slots,
                        int64_t len, int64_t bs, int64_t hkv, int64_t group, int64_t h0,
                        int64_t h1, float scale, O* out, float* lse,
                        std::vector<float>& scores) {
  constexpr int64_t V = D / 16;  // vectors per row
  const int64_t row = hkv * D;
  const int64_t heads = (h1 - h0) * group;  // query heads of this task
  const int64_t span_bytes = (h1 - h0) * D * static_cast<int64_t>(sizeof(T));
  scores.resize(static_cast<size_t>(heads * len));
  std::vector<__m512> qv(static_cast<size_t>(heads * V)), acc(static_cast<size_t>(heads * V));
  for (int64_t j = 0; j < heads; ++j)
    for (int64_t c = 0; c < V; ++c) {
      qv[j * V + c] = load16(q + (h0 * group + j) * D + c * 16);
      acc[j * V + c] = _mm512_setzero_ps();
    }
  std::vector<float> maxes(static_cast<size_t>(heads), -std::numeric_limits<float>::infinity());
  // scores of 16 keys at a time: one partial-sum vector per (key, query head), then one
  // transposing reduction gives the 16 scores of a head as one vector
  std::vector<__m512> parts(static_cast<size_t>(heads * CHUNK));
  std::vector<__m512> top(static_cast<size_t>(heads), _mm512_set1_ps(-INFINITY));
  const __m512 vscale = _mm512_set1_ps(scale);
  for (int64_t t0 = 0; t0 < len; t0 += CHUNK) {
    const int64_t n = std::min(CHUNK, len - t0);
    const __mmask16 valid = static_cast<__mmask16>((1u << n) - 1);
    for (int64_t i = 0; i < CHUNK; ++i) {
      const int64_t t = t0 + i;
      if (t + bs < len) prefetch_row(k_cache + slots[t + bs] * row + h0 * D, span_bytes);
      for (int64_t h = h0; h < h1; ++h) {
        for (int64_t g = 0; g < group; ++g) {
          const int64_t j = (h - h0) * group + g;
          parts[j * CHUNK + i] =
              i < n ? dot_parts<T, D>(qv.data() + j * V, q + (h0 * group + j) * D,
                                      k_cache + slots[t] * row + h * D)
                    : _mm512_setzero_ps();
        }
      }
    }
    for (int64_t j = 0; j < heads; ++j) {
      const __m512 sc = _mm512_mul_ps(reduce16(parts.data() + j * CHUNK), vscale);
      _mm512_mask_storeu_ps(scores.data() + j * len + t0, valid, sc);
      top[j] = _mm512_mask_max_ps(top[j], valid, top[j], sc);
    }
  }
  for (int64_t j = 0; j < heads; ++j) maxes[j] = _mm512_reduce_max_ps(top[j]);
  for (int64_t j = 0; j < heads; ++j) {
    float* sg = scores.data() + j * len;
    const __m512 m = _mm512_set1_ps(maxes[j]);
    __m512 sum = _mm512_setzero_ps();
    int64_t t = 0;
    for (; t + 16 <= len; t += 16) {
      const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(sg + t), m));
      _mm512_storeu_ps(sg + t, e);
      sum = _mm512_add_ps(sum, e);
    }
    if (t < len) {
      const __mmask16 mask = static_cast<__mmask16>((1u << (len - t)) - 1);
      const __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(mask, sg + t), m));
      _mm512_mask_storeu_ps(sg + t, mask, e);
      sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(mask, e));
    }
    const float total = _mm512_reduce_add_ps(sum);
    if (lse != nullptr) lse[h0 * group + j] = maxes[j] + std::log(total);
    maxes[j] = 1.f / total;  // now the normaliser
  }
  // per kv head, its query heads NG at a time: their sums stay in registers over all keys
  constexpr int64_t NG = std::max<int64_t>(1, std::min<int64_t>(8, 24 / V));
  for (int64_t h = h0; h < h1; ++h)
    for (int64_t g0 = 0; g0 < group; g0 += NG) {
      const int64_t j = (h - h0) * group + g0;
      const float* p = scores.data() + j * len;
      __m512* a = acc.data() + j * V;
      const T* vh = v_cache + h * D;
      switch (std::min(NG, group - g0)) {
#define RC_VALUES(K) \
  case K:            \
    if constexpr (K <= NG) decode_values<T, D, K>(a, p, len, vh, slots, row, bs); \
    break;
        RC_VALUES(1) RC_VALUES(2) RC_VALUES(3) RC_VALUES(4)
        RC_VALUES(5) RC_VALUES(6) RC_VALUES(7) RC_VALUES(8)
#undef RC_VALUES
      }
    }
  alignas(64) float tmp[16];
  for (int64_t j = 0; j < heads; ++j) {
    O* o = out + (h0 * group + j) * D;
    const __m512 inv = _mm512_set1_ps(maxes[j]);
    for (int64_t c = 0; c < V; ++c) {
      _mm512_store_ps(tmp, _mm512_mul_ps(acc[j * V + c], inv));
      for (int64_t i = 0; i < 16; ++i) o[c * 16 + i] = static_cast<O>(tmp[i]);
    }
  }
}
#endif

#ifdef RC_AVX2
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const c10::BFloat16* p) {
  const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(x), 16));
}
inline __m256 load8(const c10::Half* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

template <typename T>
inline void store8(T* p, __m256 v) {
  if constexpr (std::is_same_v<T, float>) {
    _mm256_storeu_ps(p, v);
  } else {  // round to nearest even, as torch does
    alignas(32) float tmp[8];
    _mm256_store_ps(tmp, v);
    for (int i = 0; i < 8; ++i) p[i] = static_cast<T>(tmp[i]);
  }
}

inline float hmax8(__m256 v) {
  __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_max_ps(x, _mm_movehl_ps(x, x));
  return _mm_cvtss_f32(_mm_max_ss(x, _mm_movehdup_ps(x)));
}

inline float hsum8(__m256 v) {
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  return _mm_cvtss_f32(_mm_add_ss(x, _mm_movehdup_ps(x)));
}

// lanes [0, n) set: a blend mask for the first n of 8 values
inline __m256 first_lanes(int64_t n) {
  const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  n = std::clamp<int64_t>(n, 0, 8);
  return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), iota));
}

// lanes [lo, hi) set
inline __m256 lanes_in(int64_t lo, int64_t hi) {
  return _mm256_andnot_ps(first_lanes(lo), first_lanes(hi));
}


// 8 vectors -> one vector whose lane i is the sum of v[i]'s 8 lanes.
inline __m256 reduce8(const __m256* v) {
  const __m256 a0 = _mm256_hadd_ps(v[0], v[1]), a1 = _mm256_hadd_ps(v[2], v[3]);
  const __m256 a2 = _mm256_hadd_ps(v[4], v[5]), a3 = _mm256_hadd_ps(v[6], v[7]);
  // per 128-bit half: the half-sums of v0..v3 (b0) and v4..v7 (b1)
  const __m256 b0 = _mm256_hadd_ps(a0, a1), b1 = _mm256_hadd_ps(a2, a3);
  return _mm256_add_ps(_mm256_permute2f128_ps(b0, b1, 0x20), _mm256_permute2f128_ps(b0, b1, 0x31));
}

// q . k as 8 partial sums (reduced later): qv and kv hold the rows as float vectors.
template <int64_t D>
inline __m256 dot_parts8(const __m256* qv, const __m256* kv) {
  __m256 a = _mm256_mul_ps(qv[0], kv[0]);
  for (int64_t c = 1; c < D / 8; ++c) a = _mm256_fmadd_ps(qv[c], kv[c], a);
  return a;
}

// acc[g][0, 2) += sum_i p[g][i] v_i[0, 2) over the keys i < nt of one block (rows `row` apart):
// NG query heads x 16 dims of one kv head, the accumulators in registers.
template <typename T, int64_t NG>
inline void value_chunk(__m256* const* acc, const float* const* p, const T* v, int64_t row,
                        int64_t nt) {
  __m256 a[NG][2];
  for (int64_t g = 0; g < NG; ++g) a[g][0] = acc[g][0], a[g][1] = acc[g][1];
  for (int64_t i = 0; i < nt; ++i) {
    const __m256 x0 = load8(v + i * row), x1 = load8(v + i * row + 8);
    for (int64_t g = 0; g < NG; ++g) {
      const __m256 b = _mm256_broadcast_ss(p[g] + i);
      a[g][0] = _mm256_fmadd_ps(b, x0, a[g][0]);
      a[g][1] = _mm256_fmadd_ps(b, x1, a[g][1]);
    }
  }
  for (int64_t g = 0; g < NG; ++g) acc[g][0] = a[g][0], acc[g][1] = a[g][1];
}

// decode_task_avx512 with 8-float vectors: chunks of 8 keys, one transposing reduction per
// chunk and query head gives its 8 scores as one vector; values are summed one block at a time,
// up to 3 query heads x 16 dims in registers. The block ahead is prefetched.
template <typename T, int64_t D, typename O>
void decode_task_avx2(const T* q, const T* k_cache, const T* v_cache, const int64_t* slots,
                      int64_t len, int64_t bs, int64_t hkv, int64_t group, int64_t h0, int64_t h1,
                      float scale, O* out, float* lse, std::vector<float>& scores) {
  constexpr int64_t V = D / 8;  // vectors per row
  const int64_t row = hkv * D;
  const int64_t heads = (h1 - h0) * group;  // query heads of this task
  const int64_t stride = (len + 7) / 8 * 8;  // a score row, padded to whole vectors
  const int64_t span_bytes = (h1 - h0) * D * static_cast<int64_t>(sizeof(T));
  scores.resize(static_cast<size_t>(heads * stride));
  std::vector<__m256> qv(static_cast<size_t>(heads * V)), acc(static_cast<size_t>(heads * V));
  for (int64_t j = 0; j < heads; ++j)
    for (int64_t c = 0; c < V; ++c) {
      qv[j * V + c] = load8(q + (h0 * group + j) * D + c * 8);
      acc[j * V + c] = _mm256_setzero_ps();
    }
  std::vector<__m256> parts(static_cast<size_t>(heads * 8));
  std::vector<__m256> top(static_cast<size_t>(heads), _mm256_set1_ps(-INFINITY));
  const __m256 vscale = _mm256_set1_ps(scale), neg_inf = _mm256_set1_ps(-INFINITY);
  for (int64_t t0 = 0; t0 < len; t0 += 8) {
    const int64_t n = std::min<int64_t>(8, len - t0);
    for (int64_t i = 0; i < 8; ++i) {
      const int64_t t = t0 + i;
      if (t + bs < len) prefetch_row(k_cache + slots[t + bs] * row + h0 * D, span_bytes);
      for (int64_t h = h0; h < h1; ++h) {
        __m256 kv[V];
        for (int64_t c = 0; c < V; ++c)
          kv[c] = i < n ? load8(k_cache + slots[t] * row + h * D + c * 8) : _mm256_setzero_ps();
        for (int64_t j = (h - h0) * group; j < (h - h0 + 1) * group; ++j)
          parts[j * 8 + i] = dot_parts8<D>(qv.data() + j * V, kv);
      }
    }
    const __m256 valid = first_lanes(n);
    for (int64_t j = 0; j < heads; ++j) {
      const __m256 sc = _mm256_blendv_ps(
          neg_inf, _mm256_mul_ps(reduce8(parts.data() + j * 8), vscale), valid);
      _mm256_storeu_ps(scores.data() + j * stride + t0, sc);
      top[j] = _mm256_max_ps(top[j], sc);
    }
  }
  std::vector<float> inv(static_cast<size_t>(heads));
  for (int64_t j = 0; j < heads; ++j) {
    float* sg = scores.data() + j * stride;
    const float mx = hmax8(top[j]);
    const __m256 m = _mm256_set1_ps(mx);
    __m256 sum = _mm256_setzero_ps();
    for (int64_t t = 0; t < stride; t += 8) {
      __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(sg + t), m));
      if (t + 8 > len) e = _mm256_and_ps(e, first_lanes(len - t));
      _mm256_storeu_ps(sg + t, e);
      sum = _mm256_add_ps(sum, e);
    }
    const float total = hsum8(sum);
    if (lse != nullptr) lse[h0 * group + j] = mx + std::log(total);
    inv[j] = 1.f / total;
  }
  // a run of keys [t0, t0 + nt) in one block (the first may start mid-block: a window)
  for (int64_t t0 = 0, nt = 0; t0 < len; t0 += nt) {
    nt = std::min(bs - slots[t0] % bs, len - t0);
    for (int64_t i = t0 + bs; i < std::min(t0 + 2 * bs, len); ++i)
      prefetch_row(v_cache + slots[i] * row + h0 * D, span_bytes);
    for (int64_t h = h0; h < h1; ++h)
      for (int64_t g0 = 0; g0 < group; g0 += 3)
        for (int64_t c = 0; c < V; c += 2) {
          __m256* a[3];
          const float* p[3];
          for (int64_t g = 0; g < 3; ++g) {
            const int64_t j = (h - h0) * group + std::min(g0 + g, group - 1);
            a[g] = acc.data() + j * V + c;
            p[g] = scores.data() + j * stride + t0;
          }
          const T* v = v_cache + slots[t0] * row + h * D + c * 8;
          switch (std::min<int64_t>(3, group - g0)) {
            case 3: value_chunk<T, 3>(a, p, v, row, nt); break;
            case 2: value_chunk<T, 2>(a, p, v, row, nt); break;
            default: value_chunk<T, 1>(a, p, v, row, nt); break;
          }
        }
  }
  for (int64_t j = 0; j < heads; ++j) {
    O* o = out + (h0 * group + j) * D;
    const __m256 s = _mm256_set1_ps(inv[j]);
    for (int64_t c = 0; c < V; ++c) store8(o + c * 8, _mm256_mul_ps(acc[j * V + c], s));
  }
}
#endif

// One (sequence, kv head), keys at slots[0, len): q / out are the sequence's [Hq, D] rows; the
// task's query heads are kvh * group .. (kvh + 1) * group. scores is scratch of group * len.
template <typename T, typename O>
void decode_task(const T* q, const T* k_cache, const T* v_cache, const int64_t* slots,
                 int64_t len, int64_t hkv, int64_t group, int64_t D, int64_t kvh, float scale,
                 O* out, float* lse, std::vector<float>& scores) {
  const int64_t row = hkv * D;  // one slot of a cache: Hkv * D values
  scores.resize(static_cast<size_t>(group * len));
  std::vector<float> qf(static_cast<size_t>(group * D)), acc(static_cast<size_t>(group * D), 0.f);
  std::vector<float> kt_buf(static_cast<size_t>(D * CHUNK)), vf_buf(static_cast<size_t>(D));
  float* kt = kt_buf.data();
  float* vf = vf_buf.data();
  for (int64_t g = 0; g < group; ++g) {
    to_float(q + (kvh * group + g) * D, qf.data() + g * D, D);
    for (int64_t i = 0; i < D; ++i) qf[g * D + i] *= scale;
  }
  for (int64_t t0 = 0; t0 < len; t0 += CHUNK) {
    const int64_t n = std::min(CHUNK, len - t0);
    for (int64_t j = 0; j < CHUNK; ++j) {
      if (j < n) {
        const int64_t t = t0 + j;
        const T* kr = k_cache + slots[t] * row + kvh * D;
        for (int64_t i = 0; i < D; ++i) kt[i * CHUNK + j] = load(kr + i);
      } else {
        for (int64_t i = 0; i < D; ++i) kt[i * CHUNK + j] = 0.f;
      }
    }
    score_chunk(qf.data(), kt, group, D, scores.data() + t0, len, n);
  }
  softmax_rows(scores.data(), group, len, lse == nullptr ? nullptr : lse + kvh * group);
  for (int64_t t = 0; t < len; ++t) {
    const T* vr = v_cache + slots[t] * row + kvh * D;
    to_float(vr, vf, D);
    for (int64_t g = 0; g < group; ++g) {
      const float p = scores[g * len + t];
      float* o = acc.data() + g * D;
#pragma omp simd
      for (int64_t i = 0; i < D; ++i) o[i] += p * vf[i];
    }
  }
  for (int64_t g = 0; g < group; ++g) {
    O* o = out + (kvh * group + g) * D;
    for (int64_t i = 0; i < D; ++i) o[i] = static_cast<O>(acc[g * D + i]);
  }
}

// fn(task) for tasks [0, n) on torch's threads, each taking the next task when it is done.
template <typename F>
void run_in_order(int64_t n, const F& fn) {
  std::atomic<int64_t> next{0};
  const int64_t workers = std::max<int64_t>(1, std::min<int64_t>(n, at::get_num_threads()));
  at::parallel_for(0, workers, 1, [&](int64_t, int64_t) {
    for (int64_t task; (task = next.fetch_add(1)) < n;) fn(task);
  });
}

// Kv heads [h0, h1) of one query row set: q / out hold its heads [Hkv * group, D], attending keys
// [begin, end) of `table`; lse (when given) gets each query head's log-sum-exp.
template <typename T, int64_t D, typename O>
void decode_heads(const T* q, const T* k_cache, const T* v_cache, const int32_t* table,
                  int64_t begin, int64_t end, int64_t bs, int64_t hkv, int64_t group, int64_t d,
                  int64_t h0, int64_t h1, float scale, O* out, float* lse,
                  std::vector<float>& scores) {
  const int64_t* slots = list_slots(table, begin, end, bs);
  const int64_t len = end - begin;
#ifdef __AVX512F__
  if constexpr (D > 0) {
    decode_task_avx512<T, D, O>(q, k_cache, v_cache, slots, len, bs, hkv, group, h0, h1, scale, out,
                             lse, scores);
    return;
  }
#elif defined(RC_AVX2)
  if constexpr (D > 0 && D % 16 == 0) {
    decode_task_avx2<T, D, O>(q, k_cache, v_cache, slots, len, bs, hkv, group, h0, h1, scale, out,
                           lse, scores);
    return;
  }
#endif
  for (int64_t kvh = h0; kvh < h1; ++kvh)
    decode_task<T, O>(q, k_cache, v_cache, slots, len, hkv, group, d, kvh, scale, out, lse,
                      scores);
}

// Sequences that share their first blocks (a cached prefix): the prefix's keys are read once for
// all members, their query heads stacked as one row set of group * members heads per kv head.
struct SharedGroups {
  const int32_t* offsets = nullptr;  // [G + 1]: members of group g are members[offsets[g]...]
  const int32_t* members = nullptr;  // sequence indices
  const int32_t* blocks = nullptr;   // [G]: leading blocks every member shares
  int64_t count = 0;
};

// A sequence's keys are attended in parts of PART_BLOCKS blocks at fixed positions (multiples of
// PART_BLOCKS * block_size), each part's softmax kept in float32 with its log-sum-exp, and the
// parts merged in order: a group's shared pass computes whole parts of its prefix for all members
// with the same arithmetic a member alone would use, so a row's bits do not depend on whether it
// shared its prefix, with whom, or how long the shared run was (speculation on and off batch
// sequences differently). One part (a context up to 256 keys at block size 16) is today's pass.
constexpr int64_t PART_BLOCKS = 16;

// D: the head dim as a compile-time constant for the vector path, or 0 (any head dim).
// window > 0: each sequence attends its last `window` keys only (no shared groups then).
template <typename T, int64_t D>
void decode(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
            const torch::Tensor& block_tables, const torch::Tensor& seq_lens, double scale,
            const SharedGroups& shared, int64_t window, torch::Tensor& out) {
  const int64_t n = q.size(0), hq = q.size(1), d = q.size(2);
  const int64_t bs = k_cache.size(1), hkv = k_cache.size(2), width = block_tables.size(1);
  const int64_t group = hq / hkv, part = PART_BLOCKS * bs;
  const T* qp = q.data_ptr<T>();
  const T* kp = k_cache.data_ptr<T>();
  const T* vp = v_cache.data_ptr<T>();
  const int32_t* tables = block_tables.data_ptr<int32_t>();
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  T* op = out.data_ptr<T>();
  const float sc = static_cast<float>(scale);
  // per sequence: keys [begin, len), parts first_part.. of which the first `from_group` come from
  // its group's pass; its own parts' results at rows (offset + k) * hq of `own`
  std::vector<int64_t> begin(n), first_part(n), num_parts(n), offset(n + 1, 0);
  std::vector<int64_t> from_group(n, 0), group_of(n, -1), member(n, 0);
  for (int64_t b = 0; b < n; ++b) {
    begin[b] = window > 0 ? std::max<int64_t>(0, lens[b] - window) : 0;
    first_part[b] = begin[b] / part;
    num_parts[b] = (lens[b] - 1) / part - first_part[b] + 1;
    offset[b + 1] = offset[b] + num_parts[b];
  }
  // per group: the whole parts every member holds; its stacked rows (members x heads) per part
  // at sbase[g] + c * m * hq, its stacked queries at qbase[g] (groups without a whole part: none)
  std::vector<int64_t> gparts(shared.count, 0), sbase(shared.count + 1, 0), qbase(shared.count + 1, 0);
  for (int64_t g = 0; g < shared.count; ++g) {
    const int64_t m = shared.offsets[g + 1] - shared.offsets[g];
    gparts[g] = shared.blocks[g] / PART_BLOCKS;
    for (int64_t i = 0; i < m; ++i) {
      const int32_t b = shared.members[shared.offsets[g] + i];
      TORCH_CHECK(b >= 0 && b < n && shared.blocks[g] * bs < lens[b], "bad shared group");
      from_group[b] = gparts[g], group_of[b] = g, member[b] = i;
    }
    sbase[g + 1] = sbase[g] + gparts[g] * m * hq;
    qbase[g + 1] = qbase[g] + (gparts[g] > 0 ? m * hq : 0);
  }
  // stacked row of member i (of m) of a group, kv head h, its query head j
  auto stacked_row = [&](int64_t m, int64_t i, int64_t h, int64_t j) {
    return (h * m + i) * group + j;
  };
  std::vector<T> sq(static_cast<size_t>(qbase[shared.count] * d));
  std::vector<float> sout(static_cast<size_t>(sbase[shared.count] * d));
  std::vector<float> slse(static_cast<size_t>(sbase[shared.count]));
  std::vector<float> own(static_cast<size_t>(offset[n] * hq * d));
  std::vector<float> olse(static_cast<size_t>(offset[n] * hq));
  for (int64_t g = 0; g < shared.count; ++g) {
    if (gparts[g] == 0) continue;
    const int64_t m = shared.offsets[g + 1] - shared.offsets[g];
    for (int64_t i = 0; i < m; ++i)
      for (int64_t h = 0; h < hkv; ++h)
        std::memcpy(sq.data() + (qbase[g] + stacked_row(m, i, h, 0)) * d,
                    qp + (shared.members[shared.offsets[g] + i] * hq + h * group) * d,
                    static_cast<size_t>(group * d) * sizeof(T));
  }
  // tasks: each shared part per kv head (the costliest, first), then per sequence its own parts
  // (all kv heads: whole slots stream in; with few sequences, one kv head each)
  struct Task {
    int64_t owner, part, h0;  // group or sequence, part index (absolute), first kv head
  };
  std::vector<Task> tasks;
  for (int64_t g = 0; g < shared.count; ++g)
    for (int64_t c = 0; c < gparts[g]; ++c)
      for (int64_t h = 0; h < hkv; ++h) tasks.push_back({g, c, h});
  const int64_t num_shared = static_cast<int64_t>(tasks.size());
  const int64_t split = offset[n] >= 2 * at::get_num_threads() ? 1 : hkv;
  const int64_t per_task = hkv / split;
  for (int64_t b = 0; b < n; ++b)
    for (int64_t k = from_group[b]; k < num_parts[b]; ++k)
      for (int64_t s = 0; s < split; ++s) tasks.push_back({b, first_part[b] + k, s * per_task});
  run_in_order(static_cast<int64_t>(tasks.size()), [&](int64_t t) {
    thread_local std::vector<float> scores;
    const Task task = tasks[static_cast<size_t>(t)];
    const int64_t c = task.part;
    if (t < num_shared) {
      const int64_t g = task.owner, m = shared.offsets[g + 1] - shared.offsets[g];
      const int32_t* table = tables + shared.members[shared.offsets[g]] * width;
      const int64_t rows = sbase[g] + c * m * hq;
      decode_heads<T, D, float>(sq.data() + qbase[g] * d, kp, vp, table, c * part, (c + 1) * part,
                                bs, hkv, m * group, d, task.h0, task.h0 + 1, sc,
                                sout.data() + rows * d, slse.data() + rows, scores);
      return;
    }
    const int64_t b = task.owner, rows = (offset[b] + c - first_part[b]) * hq;
    decode_heads<T, D, float>(qp + b * hq * d, kp, vp, tables + b * width,
                              std::max(begin[b], c * part), std::min<int64_t>(lens[b], (c + 1) * part),
                              bs, hkv, group, d, task.h0, task.h0 + per_task, sc,
                              own.data() + rows * d, olse.data() + rows, scores);
  });
  // each row's parts, in order, weighted by their log-sum-exps (one part: its result as it is)
  at::parallel_for(0, n, 1, [&](int64_t b0, int64_t b1) {
    std::vector<const float*> outs;
    std::vector<float> weights;
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t g = group_of[b];
      const int64_t m = g >= 0 ? shared.offsets[g + 1] - shared.offsets[g] : 0;
      for (int64_t h = 0; h < hkv; ++h)
        for (int64_t j = 0; j < group; ++j) {
          const int64_t r = h * group + j;
          outs.clear(), weights.clear();
          float top = -std::numeric_limits<float>::infinity();
          for (int64_t k = 0; k < num_parts[b]; ++k) {
            int64_t row = (offset[b] + k) * hq + r;
            const float* o = own.data();
            const float* l = olse.data();
            if (k < from_group[b]) {
              row = sbase[g] + k * m * hq + stacked_row(m, member[b], h, j);
              o = sout.data(), l = slse.data();
            }
            outs.push_back(o + row * d);
            weights.push_back(l[row]);
            top = std::max(top, l[row]);
          }
          float total = 0.f;
          for (float& w : weights) total += (w = std::exp(w - top));
          const float norm = 1.f / total;
          for (float& w : weights) w *= norm;
          T* dst = op + (b * hq + r) * d;
          for (int64_t x = 0; x < d; ++x) {
            float acc = 0.f;
            for (size_t k = 0; k < outs.size(); ++k) acc += weights[k] * outs[k][x];
            dst[x] = static_cast<T>(acc);
          }
        }
    }
  });
}

template <int64_t D>
void dispatch_dtype(const torch::Tensor& q, const torch::Tensor& k_cache,
                    const torch::Tensor& v_cache, const torch::Tensor& tables,
                    const torch::Tensor& lens, double scale, const SharedGroups& shared,
                    int64_t window, torch::Tensor& out) {
  switch (q.scalar_type()) {
    case torch::kFloat:
      decode<float, D>(q, k_cache, v_cache, tables, lens, scale, shared, window, out);
      break;
    case torch::kBFloat16:
      decode<c10::BFloat16, D>(q, k_cache, v_cache, tables, lens, scale, shared, window, out);
      break;
    case torch::kHalf:
      decode<c10::Half, D>(q, k_cache, v_cache, tables, lens, scale, shared, window, out);
      break;
    default: TORCH_CHECK(false, "paged_decode: float32, bfloat16 or float16 only");
  }
}

// group_offsets / group_members / group_blocks (all or none): sequences sharing cached leading
// blocks, attended once per group for those blocks (SharedGroups). window: a sliding window.
torch::Tensor paged_decode(const torch::Tensor& q, const torch::Tensor& k_cache,
                           const torch::Tensor& v_cache, const torch::Tensor& block_tables,
                           const torch::Tensor& seq_lens, double scale,
                           const std::optional<torch::Tensor>& group_offsets,
                           const std::optional<torch::Tensor>& group_members,
                           const std::optional<torch::Tensor>& group_blocks,
                           std::optional<int64_t> window) {
  TORCH_CHECK(!window.has_value() || *window >= 1, "paged_decode: window must be at least 1");
  TORCH_CHECK(!window.has_value() || !group_offsets.has_value(),
              "paged_decode: shared groups attend whole prefixes, not a window");
  const int64_t w = window.value_or(0);
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 4 && v_cache.dim() == 4, "bad ranks");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "caches must be contiguous");
  TORCH_CHECK(block_tables.scalar_type() == torch::kInt32 && seq_lens.scalar_type() == torch::kInt32,
              "block_tables and seq_lens must be int32");
  TORCH_CHECK(q.scalar_type() == k_cache.scalar_type() && q.scalar_type() == v_cache.scalar_type(),
              "q and caches must share a dtype");
  TORCH_CHECK(q.size(1) % k_cache.size(2) == 0 && q.size(2) == k_cache.size(3), "bad head shapes");
  auto qc = q.contiguous();
  auto tables = block_tables.contiguous();
  auto lens = seq_lens.contiguous();
  auto out = torch::empty_like(qc);
  SharedGroups shared;
  torch::Tensor offsets, members, blocks;  // contiguous int32 copies, alive through the call
  if (group_offsets.has_value()) {
    TORCH_CHECK(group_members.has_value() && group_blocks.has_value(),
                "group_offsets, group_members and group_blocks go together");
    offsets = group_offsets->contiguous(), members = group_members->contiguous();
    blocks = group_blocks->contiguous();
    TORCH_CHECK(offsets.scalar_type() == torch::kInt32 && members.scalar_type() == torch::kInt32 &&
                    blocks.scalar_type() == torch::kInt32,
                "shared groups must be int32");
    shared.count = blocks.numel();
    TORCH_CHECK(offsets.numel() == shared.count + 1, "group_offsets must have groups + 1 entries");
    shared.offsets = offsets.data_ptr<int32_t>(), shared.members = members.data_ptr<int32_t>();
    shared.blocks = blocks.data_ptr<int32_t>();
    TORCH_CHECK(shared.offsets[0] == 0 && shared.offsets[shared.count] == members.numel(),
                "group_offsets must cover group_members");
  }
  auto go = [&](auto kernel) {
    kernel(qc, k_cache, v_cache, tables, lens, scale, shared, w, out);
  };
  switch (q.size(2)) {
    case 64: go(dispatch_dtype<64>); break;
    case 128: go(dispatch_dtype<128>); break;
    case 32: go(dispatch_dtype<32>); break;
    case 256: go(dispatch_dtype<256>); break;
    case 16: go(dispatch_dtype<16>); break;
    default: go(dispatch_dtype<0>); break;
  }
  return out;
}

// A prefill task is one tile of up to `tile` new tokens of a sequence, for one kv head. Its cost
// grows with the keys its tokens see, so tiles are listed costliest first and handed out one at a
// time (a static split gives one thread all the late, long tiles of a causal prompt).
struct PrefillTile {
  int64_t seq, first;  // sequence, its first new token in the tile
};

inline std::vector<PrefillTile> prefill_tiles(int64_t n, const int32_t* qlens, const int32_t* lens,
                                              int64_t tile, int64_t window) {
  std::vector<PrefillTile> tiles;
  std::vector<int64_t> keys;  // keys a tile reads: up to its last token, from its window start
  for (int64_t b = 0; b < n; ++b)
    for (int64_t i = 0; i < qlens[b]; i += tile) {
      tiles.push_back({b, i});
      const int64_t last = lens[b] - qlens[b] + std::min<int64_t>(i + tile, qlens[b]);
      keys.push_back(window > 0 ? std::min(last, window + tile) : last);
    }
  std::vector<size_t> order(tiles.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return keys[a] > keys[b]; });
  std::vector<PrefillTile> sorted;
  for (size_t i : order) sorted.push_back(tiles[i]);
  return sorted;
}

// How many of a tile's ntok tokens (at first_pos, first_pos + 1, ...) have keys in the block
// [k0, k0 + n) within their window (a token at p reaches back to p - window + 1); all of them
// without a window (window 0). The causal start is the caller's.
inline int64_t window_rows(int64_t k0, int64_t n, int64_t first_pos, int64_t ntok, int64_t window) {
  if (window <= 0) return ntok;
  return std::clamp<int64_t>(k0 + n + window - 1 - first_pos, 0, ntok);
}

#if defined(__AVX512F__) && defined(__AVX512BF16__)
// Paged prefill attention, bfloat16 with AVX512-BF16 (flash-style, online softmax): the new
// tokens [q_start, q_start + q_len) of a sequence attend its keys [0, seq_len) causally (token i
// sits at position seq_len - q_len + i), read in place through its block table. A task is one
// sequence, one kv head and a tile of up to 64 tokens (x G query heads; 32 when that leaves a
// thread short of tasks: each key block is repacked once per tile); each block of 16 keys
// is repacked once per task into pair-interleaved layout so that one vdpbf16ps computes 16
// scores' worth of two head dims: scores [16 keys] += q[2p, 2p+1] . k[:, 2p, 2p+1].
constexpr int64_t TILE = 64, SMALL_TILE = 32;
constexpr int64_t R = 4;  // query vectors scored together

// sums[x][c] += sum over p < n of the bf16 pair a[x][p] . the 16 pairs b[p * b_stride + 16c ...]
// (one vdpbf16ps each): NR rows by NC vectors of sums, held in registers through the n pairs.
template <int64_t NR, int64_t NC>
inline void pair_dots(__m512 (&sums)[NR][NC], const uint32_t* const* a, const uint32_t* b,
                      int64_t b_stride, int64_t n) {
  for (int64_t p = 0; p < n; ++p) {
    __m512i bv[NC];
    for (int64_t c = 0; c < NC; ++c) bv[c] = _mm512_load_si512(b + p * b_stride + c * 16);
    for (int64_t x = 0; x < NR; ++x) {
      const __m512i av = _mm512_set1_epi32(static_cast<int>(a[x][p]));
      for (int64_t c = 0; c < NC; ++c)
        sums[x][c] = _mm512_dpbf16_ps(sums[x][c], reinterpret_cast<const __m512bh&>(av),
                                      reinterpret_cast<const __m512bh&>(bv[c]));
    }
  }
}

// acc [NR rows][V] = acc * corr + probabilities (bf16 pairs, a row apart) . values
// (pair-interleaved, D pairs a row), over the first `n` key pairs of a block.
template <int64_t NR, int64_t V, int64_t KB2, int64_t D>
inline void accumulate_values(__m512* acc, const __m512* corr, const uint32_t (*pairs)[KB2],
                              const uint32_t (*vp)[D], int64_t n) {
  constexpr int64_t VC = V < 8 ? V : 8;  // output vectors per pass: NR x VC sums in registers
  const uint32_t* rows[NR];
  for (int64_t x = 0; x < NR; ++x) rows[x] = pairs[x];
  for (int64_t c0 = 0; c0 < V; c0 += VC) {  // head dim 256: two passes over the block's pairs
    __m512 a[NR][VC];
    for (int64_t x = 0; x < NR; ++x)
      for (int64_t c = 0; c < VC; ++c) a[x][c] = _mm512_mul_ps(acc[x * V + c0 + c], corr[x]);
    pair_dots<NR, VC>(a, rows, vp[0] + c0 * 16, D, n);
    for (int64_t x = 0; x < NR; ++x)
      for (int64_t c = 0; c < VC; ++c) acc[x * V + c0 + c] = a[x][c];
  }
}

template <int64_t D>
void prefill_task(const c10::BFloat16* q, int64_t q_stride, const c10::BFloat16* k_cache,
                  const c10::BFloat16* v_cache, c10::BFloat16* out, int64_t o_stride,
                  const int32_t* table, int64_t bs, int64_t hkv, int64_t group, int64_t kvh,
                  int64_t first_pos, int64_t ntok, float scale, int64_t window) {
  constexpr int64_t P = D / 2;   // head-dim pairs
  constexpr int64_t V = D / 16;  // float vectors per output row
  constexpr int64_t KB = 64;     // keys per block: one softmax update per row per block
  constexpr int64_t KV = KB / 16;
  const int64_t rows = ntok * group;  // query vectors: token i, head g -> row i * group + g
  const int64_t row = hkv * D;
  const int64_t last_pos = first_pos + ntok - 1;  // keys [k_first, last_pos] are needed
  // whole key blocks at absolute positions from the one holding the first token's window start
  // k_first (a block no key of a row's window is in leaves that row untouched: chunking-
  // invariant); keys before k_first are not read (zeros)
  const int64_t k_first = window > 0 ? std::max<int64_t>(0, first_pos - window + 1) : 0;
  const int64_t k_begin = k_first / KB * KB;
  std::vector<__m512> acc(static_cast<size_t>(rows * V), _mm512_setzero_ps());
  std::vector<float> mx(static_cast<size_t>(rows), -INFINITY), l(static_cast<size_t>(rows), 0.f);
  alignas(64) uint32_t kp[P][KB];        // key pairs: kp[p][j] = k[j][2p], k[j][2p+1]
  alignas(64) uint32_t vp[KB / 2][D];    // value pairs: vp[jp][d] = v[2jp][d], v[2jp+1][d]
  alignas(64) uint32_t pairs[R][KB / 2];  // probabilities of R rows as bf16 pairs
  const int64_t* slots = list_slots(table, k_first, last_pos + 1, bs);  // key k: k - k_first
  for (int64_t k0 = k_begin; k0 <= last_pos; k0 += KB) {
    const int64_t n = std::min(KB, last_pos + 1 - k0), lo = std::max<int64_t>(0, k_first - k0);
    // key k0 + j (lo <= j < n) at row offset key(j) of a cache; the others are zeros
    auto key = [&](int64_t j) { return slots[k0 + j - k_first] * row + kvh * D; };
    for (int64_t j = 0; j < KB; ++j) {
      const uint32_t* kr =
          j >= lo && j < n ? reinterpret_cast<const uint32_t*>(k_cache + key(j)) : nullptr;
      for (int64_t p = 0; p < P; ++p) kp[p][j] = kr ? kr[p] : 0u;
    }
    for (int64_t jp = 0; jp < KB / 2; ++jp) {
      const int64_t j0 = 2 * jp, j1 = 2 * jp + 1;
      const uint16_t* v0 =
          j0 >= lo && j0 < n ? reinterpret_cast<const uint16_t*>(v_cache + key(j0)) : nullptr;
      const uint16_t* v1 =
          j1 >= lo && j1 < n ? reinterpret_cast<const uint16_t*>(v_cache + key(j1)) : nullptr;
      for (int64_t d = 0; d < D; ++d)
        vp[jp][d] = (v0 ? v0[d] : 0u) | (static_cast<uint32_t>(v1 ? v1[d] : 0u) << 16);
    }
    // rows whose token sees any key of this block, R at a time: R x KV independent dot chains
    const int64_t first_row = std::max<int64_t>(0, k0 - first_pos) * group;
    const int64_t end_row = window_rows(k0, n, first_pos, ntok, window) * group;
    for (int64_t r0 = first_row; r0 < end_row; r0 += R) {
      const int64_t nr = std::min(R, end_row - r0);
      const uint32_t* qr[R];
      for (int64_t x = 0; x < R; ++x) {
        const int64_t r = r0 + std::min(x, nr - 1);
        qr[x] = reinterpret_cast<const uint32_t*>(q + (r / group) * q_stride +
                                                  (kvh * group + r % group) * D);
      }
      __m512 sv[R][KV];
      for (int64_t x = 0; x < R; ++x)
        for (int64_t c = 0; c < KV; ++c) sv[x][c] = _mm512_setzero_ps();
      pair_dots<R, KV>(sv, qr, kp[0], KB, P);
      int64_t visible_max = 0;
      __m512 corr[R];
      for (int64_t x = 0; x < R; ++x) {
        const int64_t r = r0 + x;
        // this row's keys in the block: [lo, hi) (causal end; window start)
        const int64_t pos = first_pos + r / group;
        const int64_t hi = x < nr ? std::min(n, pos - k0 + 1) : 0;
        const int64_t lo = window > 0 ? std::max<int64_t>(0, pos - window + 1 - k0) : 0;
        if (hi <= lo) {  // no key of this block for this row: contributes nothing
          std::memset(pairs[x], 0, sizeof(pairs[x]));
          corr[x] = _mm512_set1_ps(1.f);
          continue;
        }
        visible_max = std::max(visible_max, hi);
        __m512 m = _mm512_set1_ps(-INFINITY);
        __mmask16 masks[KV];
        for (int64_t c = 0; c < KV; ++c) {
          const int64_t left = std::clamp<int64_t>(hi - c * 16, 0, 16);
          const int64_t skip = std::clamp<int64_t>(lo - c * 16, 0, 16);
          masks[c] = static_cast<__mmask16>(((1u << left) - 1) & ~((1u << skip) - 1));
          sv[x][c] = _mm512_maskz_mov_ps(masks[c], _mm512_mul_ps(sv[x][c], _mm512_set1_ps(scale)));
          m = _mm512_mask_max_ps(m, masks[c], m, sv[x][c]);
        }
        const float m_new = std::max(mx[r], _mm512_reduce_max_ps(m));
        const __m512 vm = _mm512_set1_ps(m_new);
        __m512 sum = _mm512_setzero_ps();
        for (int64_t c = 0; c < KV; ++c) {
          const __m512 e = _mm512_maskz_mov_ps(masks[c], exp16(_mm512_sub_ps(sv[x][c], vm)));
          sum = _mm512_add_ps(sum, e);
          const __m256bh eb = _mm512_cvtneps_pbh(e);
          std::memcpy(pairs[x] + c * 8, &eb, 32);
        }
        const float cf = std::exp(mx[r] - m_new);
        l[r] = l[r] * cf + _mm512_reduce_add_ps(sum);
        mx[r] = m_new;
        corr[x] = _mm512_set1_ps(cf);
      }
      if (nr == R) {  // the R rows' outputs stay in registers through the block's values
        accumulate_values<R, V>(acc.data() + r0 * V, corr, pairs, vp, (visible_max + 1) / 2);
      } else {
        for (int64_t x = 0; x < nr; ++x)
          accumulate_values<1, V>(acc.data() + (r0 + x) * V, corr + x, pairs + x, vp,
                                  (visible_max + 1) / 2);
      }
    }
  }
  alignas(64) float tmp[16];
  for (int64_t i = 0; i < ntok; ++i)
    for (int64_t g = 0; g < group; ++g) {
      const int64_t r = i * group + g;
      c10::BFloat16* o = out + i * o_stride + (kvh * group + g) * D;
      const __m512 inv = _mm512_set1_ps(1.f / l[r]);
      for (int64_t c = 0; c < V; ++c) {
        _mm512_store_ps(tmp, _mm512_mul_ps(acc[r * V + c], inv));
        for (int64_t x = 0; x < 16; ++x) o[c * 16 + x] = static_cast<c10::BFloat16>(tmp[x]);
      }
    }
}

template <int64_t D>
void prefill(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
             torch::Tensor& out, const int32_t* starts, const int32_t* qlens, const int32_t* lens,
             const int32_t* tables, int64_t n, int64_t width, double scale, int64_t window) {
  const int64_t hq = q.size(1), bs = k_cache.size(1), hkv = k_cache.size(2);
  const int64_t group = hq / hkv, q_stride = q.stride(0), o_stride = out.stride(0);
  std::vector<PrefillTile> tiles = prefill_tiles(n, qlens, lens, TILE, window);
  int64_t tile = TILE;
  if (static_cast<int64_t>(tiles.size()) * hkv < 4 * at::get_num_threads())
    tiles = prefill_tiles(n, qlens, lens, tile = SMALL_TILE, window);
  const auto* qp = q.data_ptr<c10::BFloat16>();
  const auto* kp = k_cache.data_ptr<c10::BFloat16>();
  const auto* vp = v_cache.data_ptr<c10::BFloat16>();
  auto* op = out.data_ptr<c10::BFloat16>();
  run_in_order(static_cast<int64_t>(tiles.size()) * hkv, [&](int64_t task) {
    const int64_t kvh = task % hkv, b = tiles[task / hkv].seq, i0 = tiles[task / hkv].first;
    const int64_t ntok = std::min(tile, static_cast<int64_t>(qlens[b]) - i0);
    const int64_t row0 = starts[b] + i0;
    prefill_task<D>(qp + row0 * q_stride, q_stride, kp, vp, op + row0 * o_stride, o_stride,
                    tables + b * width, bs, hkv, group, kvh, lens[b] - qlens[b] + i0, ntok,
                    static_cast<float>(scale), window);
  });
}
#endif

#ifdef RC_AVX2
// Paged prefill attention with 8-float vectors, float32 math (float32 caches, or bfloat16 ones
// widened on load): the same tasks and causal layout as the AVX512-BF16 kernel above. Keys come
// in blocks of PB at absolute positions 0, PB, 2 PB, ... in order, so a token's result does not
// depend on how its prompt was chunked. Each block is repacked once per task: keys transposed
// (kt [D][PB]: 16 keys' scores of one query vector are two vectors) and values widened (vf
// [PB][D]); micro tiles of PR query vectors x 16 keys (scores) or x 16 dims (values) keep their
// 12 accumulators in registers.
constexpr int64_t PTILE = 32;  // query tokens per task
constexpr int64_t PB = 64;     // keys per block: one online-softmax update per row per block
constexpr int64_t PR = 6;      // query vectors per micro tile

struct PrefillScratch {
  std::vector<float> qf, acc, mx, l;  // per query vector (acc: PR spare rows for padding)
  alignas(32) float kt[256 * PB];     // head dims up to 256
  alignas(32) float vf[PB * 256];
  alignas(32) float s[PR][PB];  // scores, then probabilities
};

inline void transpose8(__m256* r) {
  const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
  const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
  const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
  const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
  const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
  const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
  const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  r[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
  r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
  r[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
  r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
  r[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
  r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
  r[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
  r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

// keys [k0 + lo, k0 + n) of one kv head -> kt (transposed) and vf, float32; the rows before lo
// (before every token's window: not read) and past n are zeros
template <typename T, int64_t D>
void repack_block(const T* k_cache, const T* v_cache, const int32_t* table, int64_t bs,
                  int64_t row, int64_t kvh, int64_t k0, int64_t lo, int64_t n,
                  PrefillScratch& ws) {
  const T* kr[PB];
  const T* vr[PB];
  for (int64_t j = 0; j < PB; ++j) {
    const bool read = j >= lo && j < n;
    const int64_t off = read ? (table[(k0 + j) / bs] * bs + (k0 + j) % bs) * row + kvh * D : 0;
    kr[j] = read ? k_cache + off : nullptr;
    vr[j] = read ? v_cache + off : nullptr;
  }
  for (int64_t j0 = 0; j0 < PB; j0 += 8)
    for (int64_t d0 = 0; d0 < D; d0 += 8) {
      __m256 x[8];
      for (int64_t i = 0; i < 8; ++i)
        x[i] = kr[j0 + i] ? load8(kr[j0 + i] + d0) : _mm256_setzero_ps();
      transpose8(x);
      for (int64_t i = 0; i < 8; ++i) _mm256_store_ps(ws.kt + (d0 + i) * PB + j0, x[i]);
    }
  for (int64_t j = 0; j < PB; ++j)
    for (int64_t d0 = 0; d0 < D; d0 += 8)
      _mm256_store_ps(ws.vf + j * D + d0, vr[j] ? load8(vr[j] + d0) : _mm256_setzero_ps());
}

// s[x][0, 16 * nj) = q[x] . k for PR query vectors qr[x] (float32 rows of D)
// (noinline: compiled on their own, the 12 accumulators keep their registers)
template <int64_t D>
__attribute__((noinline)) void score_tile(const float* const* qr, const float* kt, int64_t nj,
                                          float (*s)[PB]) {
  for (int64_t jc = 0; jc < nj; ++jc) {
    __m256 a[PR][2];
    for (int64_t x = 0; x < PR; ++x) a[x][0] = a[x][1] = _mm256_setzero_ps();
    for (int64_t d = 0; d < D; ++d) {
      const __m256 k0 = _mm256_load_ps(kt + d * PB + jc * 16);
      const __m256 k1 = _mm256_load_ps(kt + d * PB + jc * 16 + 8);
      for (int64_t x = 0; x < PR; ++x) {
        const __m256 b = _mm256_broadcast_ss(qr[x] + d);
        a[x][0] = _mm256_fmadd_ps(b, k0, a[x][0]);
        a[x][1] = _mm256_fmadd_ps(b, k1, a[x][1]);
      }
    }
    for (int64_t x = 0; x < PR; ++x) {
      _mm256_store_ps(s[x] + jc * 16, a[x][0]);
      _mm256_store_ps(s[x] + jc * 16 + 8, a[x][1]);
    }
  }
}

// acc[x] = acc[x] * corr[x] + sum_j p[x][j] v[j] over keys [0, nk), 16 dims at a time
template <int64_t D>
__attribute__((noinline)) void value_tile(float* const* acc, const float* corr, const float* vf,
                                          int64_t nk, const float (*p)[PB]) {
  for (int64_t d0 = 0; d0 < D; d0 += 16) {
    __m256 a[PR][2];
    for (int64_t x = 0; x < PR; ++x) {
      const __m256 c = _mm256_set1_ps(corr[x]);
      a[x][0] = _mm256_mul_ps(_mm256_loadu_ps(acc[x] + d0), c);
      a[x][1] = _mm256_mul_ps(_mm256_loadu_ps(acc[x] + d0 + 8), c);
    }
    for (int64_t j = 0; j < nk; ++j) {
      const __m256 v0 = _mm256_load_ps(vf + j * D + d0);
      const __m256 v1 = _mm256_load_ps(vf + j * D + d0 + 8);
      for (int64_t x = 0; x < PR; ++x) {
        const __m256 b = _mm256_broadcast_ss(p[x] + j);
        a[x][0] = _mm256_fmadd_ps(b, v0, a[x][0]);
        a[x][1] = _mm256_fmadd_ps(b, v1, a[x][1]);
      }
    }
    for (int64_t x = 0; x < PR; ++x) {
      _mm256_storeu_ps(acc[x] + d0, a[x][0]);
      _mm256_storeu_ps(acc[x] + d0 + 8, a[x][1]);
    }
  }
}

// Online softmax of one query vector's scores s[lo, hi) of a block: they become probabilities
// (zeros elsewhere up to nk), mx / l are updated; returns the factor for its accumulator.
inline float softmax_update(float* s, int64_t lo, int64_t hi, int64_t nk, float scale, float& mx,
                            float& l) {
  if (hi <= lo) {  // no key of the block for this row (before its window): leave it as it is
    std::memset(s, 0, static_cast<size_t>(nk) * sizeof(float));
    return 1.f;
  }
  const __m256 vscale = _mm256_set1_ps(scale), neg_inf = _mm256_set1_ps(-INFINITY);
  __m256 top = neg_inf;
  for (int64_t j = 0; j < nk; j += 8) {
    __m256 x = _mm256_mul_ps(_mm256_load_ps(s + j), vscale);
    if (j < lo || j + 8 > hi) x = _mm256_blendv_ps(neg_inf, x, lanes_in(lo - j, hi - j));
    _mm256_store_ps(s + j, x);
    top = _mm256_max_ps(top, x);
  }
  const float m_new = std::max(mx, hmax8(top));
  const __m256 vm = _mm256_set1_ps(m_new);
  __m256 sum = _mm256_setzero_ps();
  for (int64_t j = 0; j < nk; j += 8) {
    __m256 e = exp8(_mm256_sub_ps(_mm256_load_ps(s + j), vm));
    if (j < lo || j + 8 > hi) e = _mm256_and_ps(e, lanes_in(lo - j, hi - j));
    _mm256_store_ps(s + j, e);
    sum = _mm256_add_ps(sum, e);
  }
  const float corr = std::exp(mx - m_new);
  l = l * corr + hsum8(sum);
  mx = m_new;
  return corr;
}

// One sequence, one kv head, tokens [0, ntok) of a tile at positions first_pos + i: query
// vector r is token r / group, head kvh * group + r % group.
template <typename T, int64_t D>
void prefill_task_avx2(const T* q, int64_t q_stride, const T* k_cache, const T* v_cache, T* out,
                       int64_t o_stride, const int32_t* table, int64_t bs, int64_t hkv,
                       int64_t group, int64_t kvh, int64_t first_pos, int64_t ntok, float scale,
                       int64_t window, PrefillScratch& ws) {
  const int64_t rows = ntok * group, row = hkv * D;
  const int64_t last_pos = first_pos + ntok - 1;  // keys [k_begin, last_pos] are needed
  // whole key blocks at absolute positions, as the AVX512-BF16 kernel (chunking-invariant);
  // keys before the first token's window start k_first are not read
  const int64_t k_first = window > 0 ? std::max<int64_t>(0, first_pos - window + 1) : 0;
  const int64_t k_begin = k_first / PB * PB;
  ws.qf.resize(static_cast<size_t>(rows * D));
  ws.acc.assign(static_cast<size_t>((rows + PR) * D), 0.f);
  ws.mx.assign(static_cast<size_t>(rows), -INFINITY);
  ws.l.assign(static_cast<size_t>(rows), 0.f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t d0 = 0; d0 < D; d0 += 8)
      _mm256_storeu_ps(ws.qf.data() + r * D + d0,
                       load8(q + (r / group) * q_stride + (kvh * group + r % group) * D + d0));
  for (int64_t k0 = k_begin; k0 <= last_pos; k0 += PB) {
    const int64_t n = std::min(PB, last_pos + 1 - k0);
    const int64_t lo = std::max<int64_t>(0, k_first - k0);  // keys before it: not read
    repack_block<T, D>(k_cache, v_cache, table, bs, row, kvh, k0, lo, n, ws);
    // rows whose token sees a key of this block, PR at a time (the last tile padded with
    // copies of its last row, written to spare accumulator rows)
    const int64_t end_row = window_rows(k0, n, first_pos, ntok, window) * group;
    for (int64_t r0 = std::max<int64_t>(0, k0 - first_pos) * group; r0 < end_row; r0 += PR) {
      const int64_t nr = std::min(PR, end_row - r0);
      const int64_t nk = std::min(n, first_pos + (r0 + nr - 1) / group - k0 + 1);
      const float* qr[PR];
      float* acc[PR];
      float corr[PR];
      for (int64_t x = 0; x < PR; ++x) {
        qr[x] = ws.qf.data() + (r0 + std::min(x, nr - 1)) * D;
        acc[x] = ws.acc.data() + (x < nr ? r0 + x : rows + x) * D;
        corr[x] = 1.f;
      }
      score_tile<D>(qr, ws.kt, (nk + 15) / 16, ws.s);
      const int64_t nk8 = (nk + 7) / 8 * 8;
      for (int64_t x = 0; x < PR; ++x) {
        const int64_t r = r0 + std::min(x, nr - 1);
        if (x < nr) {
          const int64_t pos = first_pos + r / group;
          const int64_t lo = window > 0 ? std::max<int64_t>(0, pos - window + 1 - k0) : 0;
          const int64_t hi = std::min(n, pos - k0 + 1);
          corr[x] = softmax_update(ws.s[x], lo, hi, nk8, scale, ws.mx[r], ws.l[r]);
        } else {
          std::memset(ws.s[x], 0, sizeof(ws.s[x]));
        }
      }
      value_tile<D>(acc, corr, ws.vf, nk, ws.s);
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    T* o = out + (r / group) * o_stride + (kvh * group + r % group) * D;
    const __m256 inv = _mm256_set1_ps(1.f / ws.l[r]);
    for (int64_t d0 = 0; d0 < D; d0 += 8)
      store8(o + d0, _mm256_mul_ps(_mm256_loadu_ps(ws.acc.data() + r * D + d0), inv));
  }
}

template <typename T, int64_t D>
void prefill_avx2(const torch::Tensor& q, const torch::Tensor& k_cache,
                  const torch::Tensor& v_cache, torch::Tensor& out, const int32_t* starts,
                  const int32_t* qlens, const int32_t* lens, const int32_t* tables, int64_t n,
                  int64_t width, double scale, int64_t window) {
  const int64_t hq = q.size(1), bs = k_cache.size(1), hkv = k_cache.size(2);
  const int64_t group = hq / hkv, q_stride = q.stride(0), o_stride = out.stride(0);
  const std::vector<PrefillTile> tiles = prefill_tiles(n, qlens, lens, PTILE, window);
  const T* qp = q.data_ptr<T>();
  const T* kp = k_cache.data_ptr<T>();
  const T* vp = v_cache.data_ptr<T>();
  T* op = out.data_ptr<T>();
  run_in_order(static_cast<int64_t>(tiles.size()) * hkv, [&](int64_t task) {
    thread_local PrefillScratch ws;
    const int64_t kvh = task % hkv, b = tiles[task / hkv].seq, i0 = tiles[task / hkv].first;
    const int64_t ntok = std::min(PTILE, static_cast<int64_t>(qlens[b]) - i0);
    const int64_t row0 = starts[b] + i0;
    prefill_task_avx2<T, D>(qp + row0 * q_stride, q_stride, kp, vp, op + row0 * o_stride,
                            o_stride, tables + b * width, bs, hkv, group, kvh,
                            lens[b] - qlens[b] + i0, ntok, static_cast<float>(scale), window,
                            ws);
  });
}
#endif

// q / out [T, Hq, D] (rows contiguous; bfloat16, or float32 on the 8-wide path); q_starts /
// q_lens / seq_lens int32 [N]; block_tables int32 [N, W]. Writes the attention of each
// sequence's new tokens into out.
void paged_prefill(const torch::Tensor& q, const torch::Tensor& k_cache,
                   const torch::Tensor& v_cache, torch::Tensor out, const torch::Tensor& q_starts,
                   const torch::Tensor& q_lens, const torch::Tensor& seq_lens,
                   const torch::Tensor& block_tables, double scale,
                   std::optional<int64_t> window) {
  TORCH_CHECK(!window.has_value() || *window >= 1, "paged_prefill: window must be at least 1");
  const int64_t w = window.value_or(0);
  const auto dtype = q.scalar_type();
  TORCH_CHECK(k_cache.scalar_type() == dtype && v_cache.scalar_type() == dtype &&
                  out.scalar_type() == dtype,
              "paged_prefill: q, caches and out must share a dtype");
  TORCH_CHECK(q.stride(2) == 1 && q.stride(1) == q.size(2) && out.stride(2) == 1 &&
                  out.stride(1) == out.size(2) && out.sizes() == q.sizes(),
              "paged_prefill: q and out must be [T, Hq, D] with each token's heads contiguous");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "caches must be contiguous");
  TORCH_CHECK(q.size(1) % k_cache.size(2) == 0 && q.size(2) == k_cache.size(3), "bad head shapes");
  for (const auto* t : {&q_starts, &q_lens, &seq_lens, &block_tables})
    TORCH_CHECK(t->scalar_type() == torch::kInt32, "paged_prefill: int32 metadata only");
  auto starts = q_starts.contiguous(), qlens = q_lens.contiguous(), lens = seq_lens.contiguous();
  auto tables = block_tables.contiguous();
  const int64_t n = starts.size(0), width = tables.size(1);
  const auto* sp = starts.data_ptr<int32_t>();
  const auto* qp = qlens.data_ptr<int32_t>();
  const auto* lp = lens.data_ptr<int32_t>();
  const auto* tp = tables.data_ptr<int32_t>();
  const int64_t d = q.size(2);
  TORCH_CHECK(d == 16 || d == 32 || d == 64 || d == 128 || d == 256,
              "paged_prefill: head_dim 16, 32, 64, 128 or 256 only");
  auto go = [&](auto kernel) {
    kernel(q, k_cache, v_cache, out, sp, qp, lp, tp, n, width, scale, w);
  };
#if defined(__AVX512F__) && defined(__AVX512BF16__)
  if (dtype == torch::kBFloat16 && d != 16) {
    switch (d) {
      case 64: return go(prefill<64>);
      case 128: return go(prefill<128>);
      case 256: return go(prefill<256>);
      default: return go(prefill<32>);
    }
  }
#endif
#ifdef RC_AVX2
  auto run = [&](auto tag) {
    using T = decltype(tag);
    switch (d) {
      case 64: go(prefill_avx2<T, 64>); break;
      case 128: go(prefill_avx2<T, 128>); break;
      case 256: go(prefill_avx2<T, 256>); break;
      case 32: go(prefill_avx2<T, 32>); break;
      default: go(prefill_avx2<T, 16>); break;
    }
  };
  if (dtype == torch::kFloat) return run(float{});
  if (dtype == torch::kBFloat16) return run(c10::BFloat16{});
#endif
  TORCH_CHECK(false, "paged_prefill: no kernel for ", dtype, " on this CPU (has_native_prefill)");
}

// Which dtypes paged_prefill serves on the CPU this was compiled for (-march=native).
bool has_native_prefill(c10::ScalarType dtype) {
#if defined(__AVX512F__) && defined(__AVX512BF16__)
  if (dtype == torch::kBFloat16) return true;
#endif
#ifdef RC_AVX2
  if (dtype == torch::kFloat || dtype == torch::kBFloat16) return true;
#endif
  (void)dtype;
  return false;
}

// The vector code this build runs: avx512bf16, avx512, avx2 or scalar.
std::string vector_isa() {
#if defined(__AVX512F__) && defined(__AVX512BF16__)
  return "avx512bf16";
#elif defined(__AVX512F__)
  return "avx512";
#elif defined(RC_AVX2)
  return "avx2";
#else
  return "scalar";
#endif
}

}  // namespace

// A dispatcher op (torch.ops.radixcache.paged_decode): visible to the profiler and to
// torch.compile as one opaque call.
TORCH_LIBRARY(radixcache, m) {
  m.def("paged_decode(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
        "Tensor seq_lens, float scale, Tensor? group_offsets=None, Tensor? group_members=None, "
        "Tensor? group_blocks=None, int? window=None) -> Tensor");
  m.def("paged_prefill(Tensor q, Tensor k_cache, Tensor v_cache, Tensor(a!) out, "
        "Tensor q_starts, Tensor q_lens, Tensor seq_lens, Tensor block_tables, float scale, "
        "int? window=None) -> ()");
  m.def("has_native_prefill(ScalarType dtype) -> bool", &has_native_prefill);
  m.def("vector_isa() -> str", &vector_isa);
}

TORCH_LIBRARY_IMPL(radixcache, CPU, m) {
  m.impl("paged_decode", &paged_decode);
  m.impl("paged_prefill", &paged_prefill);
}
