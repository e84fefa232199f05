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

#if defined(__AVX512F__) && defined(__AVX512BF16__)
// Paged prefill attention, bfloat16 with AVX512-BF16 (flash-style, online softmax): the new
// tokens [q_start, q_start + q_len) of a sequence attend its keys [0, seq_len) causally (token i
// sits at position seq_len - q_len + i), read in place through its block table. A task is one
// sequence, one kv head and a tile of up to TILE tokens (x G query heads); each block of 16 keys
// is repacked once per task into pair-interleaved layout so that one vdpbf16ps computes 16
// scores' worth of two head dims: scores [16 keys] += q[2p, 2p+1] . k[:, 2p, 2p+1].
constexpr int64_t TILE = 32;
constexpr int64_t R = 4;  // query vectors scored together

template <int64_t D>
void prefill_task(const c10::BFloat16* q, int64_t q_stride, const c10::BFloat16* k_cache,
                  const c10::BFloat16* v_cache, c10::BFloat16* out, int64_t o_stride,
                  const int32_t* table, int64_t bs, int64_t hkv, int64_t group, int64_t kvh,
                  int64_t first_pos, int64_t ntok, float scale) {
  constexpr int64_t P = D / 2;   // head-dim pairs
  constexpr int64_t V = D / 16;  // float vectors per output row
  constexpr int64_t KB = 64;     // keys per block: one softmax update per row per block
  constexpr int64_t KV = KB / 16;
  const int64_t rows = ntok * group;  // query vectors: token i, head g -> row i * group + g
  const int64_t row = hkv * D;
  const int64_t last_pos = first_pos + ntok - 1;  // keys [0, last_pos] are needed
  std::vector<__m512> acc(static_cast<size_t>(rows * V), _mm512_setzero_ps());
  std::vector<float> mx(static_cast<size_t>(rows), -INFINITY), l(static_cast<size_t>(rows), 0.f);
  alignas(64) uint32_t kp[P][KB];        // key pairs: kp[p][j] = k[j][2p], k[j][2p+1]
  alignas(64) uint32_t vp[KB / 2][D];    // value pairs: vp[jp][d] = v[2jp][d], v[2jp+1][d]
  alignas(64) uint32_t pairs[R][KB / 2];  // probabilities of R rows as bf16 pairs
  auto slot_of = [&](int64_t t) { return static_cast<int64_t>(table[t / bs]) * bs + t % bs; };
  for (int64_t k0 = 0; k0 <= last_pos; k0 += KB) {
    const int64_t n = std::min(KB, last_pos + 1 - k0);
    for (int64_t j = 0; j < KB; ++j) {
      const uint32_t* kr =
          j < n ? reinterpret_cast<const uint32_t*>(k_cache + slot_of(k0 + j) * row + kvh * D)
                : nullptr;
      for (int64_t p = 0; p < P; ++p) kp[p][j] = kr ? kr[p] : 0u;
    }
    for (int64_t jp = 0; jp < KB / 2; ++jp) {
      const int64_t j0 = 2 * jp, j1 = 2 * jp + 1;
      const uint16_t* v0 =
          j0 < n ? reinterpret_cast<const uint16_t*>(v_cache + slot_of(k0 + j0) * row + kvh * D)
                 : nullptr;
      const uint16_t* v1 =
          j1 < n ? reinterpret_cast<const uint16_t*>(v_cache + slot_of(k0 + j1) * row + kvh * D)
                 : nullptr;
      for (int64_t d = 0; d < D; ++d)
        vp[jp][d] = (v0 ? v0[d] : 0u) | (static_cast<uint32_t>(v1 ? v1[d] : 0u) << 16);
    }
    // rows whose token sees any key of this block, R at a time: R x KV independent dot chains
    const int64_t first_row = std::max<int64_t>(0, k0 - first_pos) * group;
    for (int64_t r0 = first_row; r0 < rows; r0 += R) {
      const int64_t nr = std::min(R, rows - r0);
      const uint32_t* qr[R];
      for (int64_t x = 0; x < R; ++x) {
        const int64_t r = r0 + std::min(x, nr - 1);
        qr[x] = reinterpret_cast<const uint32_t*>(q + (r / group) * q_stride +
                                                  (kvh * group + r % group) * D);
      }
      __m512 sv[R][KV];
      for (int64_t x = 0; x < R; ++x)
        for (int64_t c = 0; c < KV; ++c) sv[x][c] = _mm512_setzero_ps();
      for (int64_t p = 0; p < P; ++p) {
        __m512i kb[KV];
        for (int64_t c = 0; c < KV; ++c) kb[c] = _mm512_load_si512(kp[p] + c * 16);
        for (int64_t x = 0; x < R; ++x) {
          const __m512i qb = _mm512_set1_epi32(static_cast<int>(qr[x][p]));
          for (int64_t c = 0; c < KV; ++c)
            sv[x][c] = _mm512_dpbf16_ps(sv[x][c], reinterpret_cast<const __m512bh&>(qb),
                                        reinterpret_cast<const __m512bh&>(kb[c]));
        }
      }
      int64_t visible_max = 0;
      __m512 corr[R];
      for (int64_t x = 0; x < R; ++x) {
        const int64_t r = r0 + x;
        const int64_t visible = x < nr ? std::min(n, first_pos + r / group - k0 + 1) : 0;
        visible_max = std::max(visible_max, visible);
        if (visible <= 0) {  // no key of this block for this row: contributes nothing
          std::memset(pairs[x], 0, sizeof(pairs[x]));
          corr[x] = _mm512_set1_ps(1.f);
          continue;
        }
        __m512 m = _mm512_set1_ps(-INFINITY);
        __mmask16 masks[KV];
        for (int64_t c = 0; c < KV; ++c) {
          const int64_t left = std::clamp<int64_t>(visible - c * 16, 0, 16);
          masks[c] = static_cast<__mmask16>((1u << left) - 1);
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
      for (int64_t x = 0; x < nr; ++x)
        for (int64_t c = 0; c < V; ++c)
          acc[(r0 + x) * V + c] = _mm512_mul_ps(acc[(r0 + x) * V + c], corr[x]);
      for (int64_t jp = 0; jp < (visible_max + 1) / 2; ++jp) {
        __m512i vb[V];
        for (int64_t c = 0; c < V; ++c) vb[c] = _mm512_load_si512(vp[jp] + c * 16);
        for (int64_t x = 0; x < nr; ++x) {
          const __m512i pb = _mm512_set1_epi32(static_cast<int>(pairs[x][jp]));
          __m512* a = acc.data() + (r0 + x) * V;
          for (int64_t c = 0; c < V; ++c)
            a[c] = _mm512_dpbf16_ps(a[c], reinterpret_cast<const __m512bh&>(pb),
                                    reinterpret_cast<const __m512bh&>(vb[c]));
        }
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
             const int32_t* tables, int64_t n, int64_t width, double scale) {
  const int64_t hq = q.size(1), bs = k_cache.size(1), hkv = k_cache.size(2);
  const int64_t group = hq / hkv, q_stride = q.stride(0), o_stride = out.stride(0);
  std::vector<int64_t> task_seq, task_tok;  // (sequence, first token of the tile)
  for (int64_t b = 0; b < n; ++b)
    for (int64_t i = 0; i < qlens[b]; i += TILE) {
      task_seq.push_back(b);
      task_tok.push_back(i);
    }
  const int64_t tiles = static_cast<int64_t>(task_seq.size());
  const auto* qp = q.data_ptr<c10::BFloat16>();
  const auto* kp = k_cache.data_ptr<c10::BFloat16>();
  const auto* vp = v_cache.data_ptr<c10::BFloat16>();
  auto* op = out.data_ptr<c10::BFloat16>();
  at::parallel_for(0, tiles * hkv, 1, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t t = task / hkv, kvh = task % hkv, b = task_seq[t], i0 = task_tok[t];
      const int64_t ntok = std::min(TILE, static_cast<int64_t>(qlens[b]) - i0);
      const int64_t row0 = starts[b] + i0;
      prefill_task<D>(qp + row0 * q_stride, q_stride, kp, vp, op + row0 * o_stride, o_stride,
                      tables + b * width, bs, hkv, group, kvh, lens[b] - qlens[b] + i0, ntok,
                      static_cast<float>(scale));
    }
  });
}
#endif

// q / out [T, Hq, D] bfloat16 (rows contiguous); q_starts / q_lens / seq_lens int32 [N];
// block_tables int32 [N, W]. Writes the attention of each sequence's new tokens into out.
void paged_prefill(const torch::Tensor& q, const torch::Tensor& k_cache,
                   const torch::Tensor& v_cache, torch::Tensor out, const torch::Tensor& q_starts,
                   const torch::Tensor& q_lens, const torch::Tensor& seq_lens,
                   const torch::Tensor& block_tables, double scale) {
#if defined(__AVX512F__) && defined(__AVX512BF16__)
  TORCH_CHECK(q.scalar_type() == torch::kBFloat16 && k_cache.scalar_type() == torch::kBFloat16 &&
                  out.scalar_type() == torch::kBFloat16,
              "paged_prefill: bfloat16 only");
  TORCH_CHECK(q.stride(2) == 1 && q.stride(1) == q.size(2) && out.stride(2) == 1 &&
                  out.stride(1) == out.size(2) && out.sizes() == q.sizes(),
              "paged_prefill: q and out must be [T, Hq, D] with each token's heads contiguous");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "caches must be contiguous");
  auto starts = q_starts.contiguous(), qlens = q_lens.contiguous(), lens = seq_lens.contiguous();
  auto tables = block_tables.contiguous();
  const int64_t n = starts.size(0), width = tables.size(1);
  const auto* sp = starts.data_ptr<int32_t>();
  const auto* qp = qlens.data_ptr<int32_t>();
  const auto* lp = lens.data_ptr<int32_t>();
  const auto* tp = tables.data_ptr<int32_t>();
  switch (q.size(2)) {
    case 64: prefill<64>(q, k_cache, v_cache, out, sp, qp, lp, tp, n, width, scale); break;
    case 128: prefill<128>(q, k_cache, v_cache, out, sp, qp, lp, tp, n, width, scale); break;
    case 32: prefill<32>(q, k_cache, v_cache, out, sp, qp, lp, tp, n, width, scale); break;
    default: TORCH_CHECK(false, "paged_prefill: head_dim 32, 64 or 128 only");
  }
#else
  TORCH_CHECK(false, "paged_prefill needs AVX512-BF16");
#endif
}

bool has_bf16_prefill() {
#if defined(__AVX512F__) && defined(__AVX512BF16__)
  return true;
#else
  return false;
#endif
}

}  // namespace

// A dispatcher op (torch.ops.radixcache.paged_decode): visible to the profiler and to
// torch.compile as one opaque call.
TORCH_LIBRARY(radixcache, m) {
  m.def("paged_decode(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
        "Tensor seq_lens, float scale) -> Tensor");
  m.def("paged_prefill(Tensor q, Tensor k_cache, Tensor v_cache, Tensor(a!) out, "
        "Tensor q_starts, Tensor q_lens, Tensor seq_lens, Tensor block_tables, float scale) -> ()");
  m.def("has_bf16_prefill() -> bool", &has_bf16_prefill);
}

TORCH_LIBRARY_IMPL(radixcache, CPU, m) {
  m.impl("paged_decode", &paged_decode);
  m.impl("paged_prefill", &paged_prefill);
}
