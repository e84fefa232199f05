// Paged decode attention on CPU: one new token per sequence attends its whole context, read in
// place through its block table (no gather, no mask). Reference: engine/attention/torch_backend.py.
//
// q [N, Hq, D], caches [num_blocks, block_size, Hkv, D], block_tables int32 [N, W],
// seq_lens int32 [N] -> out [N, Hq, D]. One task per (sequence, kv head): its G = Hq / Hkv query
// heads share every key and value row it loads. Scores and sums are float32.
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#ifdef __AVX512F__
#include <immintrin.h>
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

inline void softmax_rows(float* scores, int64_t group, int64_t len) {
  for (int64_t g = 0; g < group; ++g) {
    float* s = scores + g * len;
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t t = 0; t < len; ++t) m = std::max(m, s[t]);
    float sum = 0.f;
    for (int64_t t = 0; t < len; ++t) {
      s[t] = std::exp(s[t] - m);
      sum += s[t];
    }
    const float inv = 1.f / sum;
#pragma omp simd
    for (int64_t t = 0; t < len; ++t) s[t] *= inv;
  }
}

#ifdef __AVX512F__
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const c10::BFloat16* p) {
  const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(x), 16));
}
inline __m512 load16(const c10::Half* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// exp(x) for x <= 0 (shifted scores): 2^n * p(r), r in [-ln2/2, ln2/2], degree-6 polynomial.
inline __m512 exp16(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
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

inline void prefetch_row(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t off = 0; off < bytes; off += 64) _mm_prefetch(c + off, _MM_HINT_T0);
}

// One sequence, kv heads [h0, h1), with 16-float vectors: each slot's rows of those heads are
// contiguous, so a task streams through whole blocks; every key row is loaded once and dotted
// with its G query heads. The row one block ahead is prefetched (blocks are scattered).
template <typename T, int64_t D>
void decode_task_avx512(const T* q, const T* k_cache, const T* v_cache, const int32_t* table,
                        int64_t len, int64_t bs, int64_t hkv, int64_t group, int64_t h0,
                        int64_t h1, float scale, T* out, std::vector<float>& scores) {
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
  auto slot_of = [&](int64_t t) { return static_cast<int64_t>(table[t / bs]) * bs + t % bs; };
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
      if (t + bs < len) prefetch_row(k_cache + slot_of(t + bs) * row + h0 * D, span_bytes);
      for (int64_t h = h0; h < h1; ++h) {
        for (int64_t g = 0; g < group; ++g) {
          const int64_t j = (h - h0) * group + g;
          parts[j * CHUNK + i] =
              i < n ? dot_parts<T, D>(qv.data() + j * V, q + (h0 * group + j) * D,
                                      k_cache + slot_of(t) * row + h * D)
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
    maxes[j] = 1.f / _mm512_reduce_add_ps(sum);  // now the normaliser
  }
  for (int64_t t = 0; t < len; ++t) {
    const int64_t slot = slot_of(t);
    if (t + bs < len) prefetch_row(v_cache + slot_of(t + bs) * row + h0 * D, span_bytes);
    for (int64_t h = h0; h < h1; ++h) {
      const T* vr = v_cache + slot * row + h * D;
      __m512 v[V];
      for (int64_t c = 0; c < V; ++c) v[c] = load16(vr + c * 16);
      for (int64_t g = 0; g < group; ++g) {
        const int64_t j = (h - h0) * group + g;
        const __m512 p = _mm512_set1_ps(scores[j * len + t]);
        for (int64_t c = 0; c < V; ++c) acc[j * V + c] = _mm512_fmadd_ps(p, v[c], acc[j * V + c]);
      }
    }
  }
  alignas(64) float tmp[16];
  for (int64_t j = 0; j < heads; ++j) {
    T* o = out + (h0 * group + j) * D;
    const __m512 inv = _mm512_set1_ps(maxes[j]);
    for (int64_t c = 0; c < V; ++c) {
      _mm512_store_ps(tmp, _mm512_mul_ps(acc[j * V + c], inv));
      for (int64_t i = 0; i < 16; ++i) o[c * 16 + i] = static_cast<T>(tmp[i]);
    }
  }
}
#endif

// One (sequence, kv head): q / out are the sequence's [Hq, D] rows; the task's query heads are
// kvh * group .. (kvh + 1) * group. scores is scratch of group * len floats.
template <typename T>
void decode_task(const T* q, const T* k_cache, const T* v_cache, const int32_t* table,
                 int64_t len, int64_t bs, int64_t hkv, int64_t group, int64_t D, int64_t kvh,
                 float scale, T* out, std::vector<float>& scores) {
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
        const T* kr = k_cache + (static_cast<int64_t>(table[t / bs]) * bs + t % bs) * row + kvh * D;
        for (int64_t i = 0; i < D; ++i) kt[i * CHUNK + j] = load(kr + i);
      } else {
        for (int64_t i = 0; i < D; ++i) kt[i * CHUNK + j] = 0.f;
      }
    }
    score_chunk(qf.data(), kt, group, D, scores.data() + t0, len, n);
  }
  softmax_rows(scores.data(), group, len);
  for (int64_t t = 0; t < len; ++t) {
    const T* vr = v_cache + (static_cast<int64_t>(table[t / bs]) * bs + t % bs) * row + kvh * D;
    to_float(vr, vf, D);
    for (int64_t g = 0; g < group; ++g) {
      const float p = scores[g * len + t];
      float* o = acc.data() + g * D;
#pragma omp simd
      for (int64_t i = 0; i < D; ++i) o[i] += p * vf[i];
    }
  }
  for (int64_t g = 0; g < group; ++g) {
    T* o = out + (kvh * group + g) * D;
    for (int64_t i = 0; i < D; ++i) o[i] = static_cast<T>(acc[g * D + i]);
  }
}

// D: the head dim as a compile-time constant for the vector path, or 0 (any head dim).
template <typename T, int64_t D>
void decode(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
            const torch::Tensor& block_tables, const torch::Tensor& seq_lens, double scale,
            torch::Tensor& out) {
  const int64_t n = q.size(0), hq = q.size(1), d = q.size(2);
  const int64_t bs = k_cache.size(1), hkv = k_cache.size(2), width = block_tables.size(1);
  const int64_t group = hq / hkv;
  const T* qp = q.data_ptr<T>();
  const T* kp = k_cache.data_ptr<T>();
  const T* vp = v_cache.data_ptr<T>();
  const int32_t* tables = block_tables.data_ptr<int32_t>();
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  T* op = out.data_ptr<T>();
  // a task is one sequence (all kv heads: whole slots stream in); with few sequences, one kv
  // head of one sequence, so every thread has work
  const int64_t split = n >= 2 * at::get_num_threads() ? 1 : hkv;
  const int64_t per_task = hkv / split;
  at::parallel_for(0, n * split, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / split, h0 = (task % split) * per_task;
      const T* qb = qp + b * hq * d;
      T* ob = op + b * hq * d;
      const float sc = static_cast<float>(scale);
#ifdef __AVX512F__
      if constexpr (D > 0) {
        decode_task_avx512<T, D>(qb, kp, vp, tables + b * width, lens[b], bs, hkv, group, h0,
                                 h0 + per_task, sc, ob, scores);
        continue;
      }
#endif
      for (int64_t kvh = h0; kvh < h0 + per_task; ++kvh)
        decode_task<T>(qb, kp, vp, tables + b * width, lens[b], bs, hkv, group, d, kvh, sc, ob,
                       scores);
    }
  });
}

template <int64_t D>
void dispatch_dtype(const torch::Tensor& q, const torch::Tensor& k_cache,
                    const torch::Tensor& v_cache, const torch::Tensor& tables,
                    const torch::Tensor& lens, double scale, torch::Tensor& out) {
  switch (q.scalar_type()) {
    case torch::kFloat: decode<float, D>(q, k_cache, v_cache, tables, lens, scale, out); break;
    case torch::kBFloat16:
      decode<c10::BFloat16, D>(q, k_cache, v_cache, tables, lens, scale, out);
      break;
    case torch::kHalf: decode<c10::Half, D>(q, k_cache, v_cache, tables, lens, scale, out); break;
    default: TORCH_CHECK(false, "paged_decode: float32, bfloat16 or float16 only");
  }
}

torch::Tensor paged_decode(const torch::Tensor& q, const torch::Tensor& k_cache,
                           const torch::Tensor& v_cache, const torch::Tensor& block_tables,
                           const torch::Tensor& seq_lens, double scale) {
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
  switch (q.size(2)) {
    case 64: dispatch_dtype<64>(qc, k_cache, v_cache, tables, lens, scale, out); break;
    case 128: dispatch_dtype<128>(qc, k_cache, v_cache, tables, lens, scale, out); break;
    case 32: dispatch_dtype<32>(qc, k_cache, v_cache, tables, lens, scale, out); break;
    case 256: dispatch_dtype<256>(qc, k_cache, v_cache, tables, lens, scale, out); break;
    case 16: dispatch_dtype<16>(qc, k_cache, v_cache, tables, lens, scale, out); break;
    default: dispatch_dtype<0>(qc, k_cache, v_cache, tables, lens, scale, out); break;
  }
  return out;
}

}  // namespace

// A dispatcher op (torch.ops.radixcache.paged_decode): visible to the profiler and to
// torch.compile as one opaque call.
TORCH_LIBRARY(radixcache, m) {
  m.def("paged_decode(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
        "Tensor seq_lens, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(radixcache, CPU, m) { m.impl("paged_decode", &paged_decode); }
