// Paged attention over quantized KV blocks (kv_quant.h, engine/kv/quant.py) on CPU, reading the
// pool's uint8 rows in place and dequantizing inside the kernel; reference:
// engine/attention/quant_reference.py. One kernel for prefill and decode: new token i of sequence
// n sits at position p = seq_len - q_len + i and attends keys [0, p] (window W: [max(0, p - W + 1),
// p]), its own and its sequence's earlier new tokens included, as stored (quantized).
//
// Batch invariance (deterministic mode, and "the cache never changes an answer"): a query row's
// bits depend on its q, its position and its keys only. Keys come in chunks of KC at absolute
// positions (chunk c: keys [c * KC, (c + 1) * KC)); each row runs an online softmax over the
// chunks holding its keys, in order, with the same arithmetic whatever the batch, the task its
// row lands in, the chunking of its prompt or the thread count (no sum runs across rows).
//
// A task is a tile of query rows (tokens x query heads) of its kv heads (all of them, or one when
// the threads would be short of tasks): up to TQ tokens of one sequence, or the new tokens of
// several short (decode, verify) sequences whose block tables start with the same blocks. Each
// chunk of keys is dequantized once per task and kv head into a float32 tile on the thread's
// scratch (code values, their scales folded into the scores and probabilities) for all of the
// task's rows of that head; a common prefix's chunks once for all of the sequences sharing it.
// A tile of many rows is scored from the keys transposed, a few rows' from the keys as they are:
// two kernels with the same arithmetic (see scores16). AVX-512 runs them for head dims 16, 32,
// 64, 128 and 256; other head dims and CPUs run a portable kernel (one row at a time).
//
// quantize_store_kv: the KV-write path, each row quantized once (kv_quant.h's quantize_row).

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
#include <vector>

#include "kv_quant.h"
#include "vec_exp.h"

namespace {

namespace kvq = radixcache::kvq;

constexpr int64_t KC = 32;       // keys per chunk
constexpr int64_t TQ = 32;       // tokens per tile of a long sequence
constexpr int64_t SMALL_Q = 16;  // a sequence with at most this many new tokens may share a task
constexpr int64_t MIN_SHARED = 2 * KC;  // the shortest common prefix worth a shared task
constexpr int64_t RV = 6;        // rows per value micro tile

// New tokens [first, first + count) of sequence seq, token first at position pos0.
struct Member {
  int64_t seq, first, count, pos0;
};

// Members [m0, m1) of the member list, kv heads [h0, h1); keys [0, shared) sit in the same
// slots for all of the members.
struct Task {
  int64_t m0, m1, h0, h1, shared, cost;
};

struct Call {
  const uint8_t* k;
  const uint8_t* v;
  const int32_t* tables;
  const int32_t* starts;
  int64_t width, bs, hkv, group, d, row_bytes, q_stride, o_stride, window, fmt;
  float scale;
};

struct Scratch {
  std::vector<float> qf, acc, m, l, kf, vf, corr;  // qf / acc: [rows][D]; kf / vf: [KC][D]
  std::vector<float> kt, s, p;  // [D][KC]: kf transposed; [RV][KC]: scores, then e_j * vs_j
  float ks[KC], vs[KC];                             // the chunk's multipliers (ChunkTile)
  std::vector<int64_t> pos, base;                   // per row: its position; per member: 1st row
};

inline int64_t window_start(int64_t pos, int64_t window) {
  return window > 0 ? std::max<int64_t>(0, pos - window + 1) : 0;
}

// The tokens [i_lo, i_hi) of a member with keys in the chunk at k0, and the keys [lo, hi) of
// the chunk they read (none: i_lo >= i_hi).
struct Span {
  int64_t i_lo, i_hi, lo, hi;
};

inline Span span_of(const Member& m, int64_t k0, int64_t window) {
  Span s{std::max<int64_t>(0, k0 - m.pos0), m.count, 0, 0};
  if (window > 0) s.i_hi = std::min(m.count, k0 + KC + window - 1 - m.pos0);
  if (s.i_lo < s.i_hi) {
    s.lo = std::max(k0, window_start(m.pos0 + s.i_lo, window));
    s.hi = std::min(k0 + KC, m.pos0 + s.i_hi);
  }
  return s;
}

// Keys [lo, hi) of the chunk at k0 (kv head h, read through table) -> rows k - k0 of kf and vf
// (float32 code values, code_row) and their multipliers ks (scale * unit * the softmax scale)
// and vs (scale * unit); rows before lo are zeros, so are their multipliers (rows past hi are
// never read).
struct ChunkTile {
  float* kf;
  float* vf;
  float* ks;
  float* vs;
};

template <int64_t F, int64_t DD>
void dequant_chunk_f(const Call& c, const int32_t* table, int64_t h, int64_t k0, int64_t lo,
                     int64_t hi, const ChunkTile& t) {
  const int64_t d = DD > 0 ? DD : c.d;
  std::memset(t.kf, 0, static_cast<size_t>((lo - k0) * d) * sizeof(float));
  std::memset(t.vf, 0, static_cast<size_t>((lo - k0) * d) * sizeof(float));
  std::fill(t.ks, t.ks + KC, 0.f);
  std::fill(t.vs, t.vs + KC, 0.f);
  for (int64_t k = lo; k < hi; ++k) {
    const int64_t slot = static_cast<int64_t>(table[k / c.bs]) * c.bs + k % c.bs;
    const int64_t off = (slot * c.hkv + h) * c.row_bytes;
    t.ks[k - k0] = kvq::code_row<F>(c.k + off, d, t.kf + (k - k0) * d) * c.scale;
    t.vs[k - k0] = kvq::code_row<F>(c.v + off, d, t.vf + (k - k0) * d);
  }
}

// Asks for the rows of keys [lo, hi) of kv heads [h0, h1) ahead of their use (blocks are
// scattered: the hardware prefetcher does not cross from one to the next). The heads of a slot
// sit side by side, so a run of keys in one block is one run of bytes.
inline void prefetch_keys(const Call& c, const int32_t* table, int64_t lo, int64_t hi, int64_t h0,
                          int64_t h1) {
  for (int64_t k = lo, end; k < hi; k = end) {
    end = std::min(hi, (k / c.bs + 1) * c.bs);
    const int64_t slot = static_cast<int64_t>(table[k / c.bs]) * c.bs + k % c.bs;
    const int64_t first = (slot * c.hkv + h0) * c.row_bytes;
    const int64_t last = ((slot + end - k - 1) * c.hkv + h1) * c.row_bytes;  // one past
    for (int64_t off = first & ~int64_t{63}; off < last; off += 64) {
      __builtin_prefetch(c.k + off, 0, 3);
      __builtin_prefetch(c.v + off, 0, 3);
    }
  }
}

template <int64_t DD>
void dequant_chunk(const Call& c, const int32_t* table, int64_t h, int64_t k0, int64_t lo,
                   int64_t hi, const ChunkTile& t) {
  switch (c.fmt) {
    case kvq::INT8: return dequant_chunk_f<kvq::INT8, DD>(c, table, h, k0, lo, hi, t);
    case kvq::FP8_E4M3: return dequant_chunk_f<kvq::FP8_E4M3, DD>(c, table, h, k0, lo, hi, t);
    default: return dequant_chunk_f<kvq::FP8_E5M2, DD>(c, table, h, k0, lo, hi, t);
  }
}

// The arithmetic of one row and one chunk, whatever kernel runs it (a row's bits must not depend
// on its neighbours): score_j = (q . code values of k_j, a fixed order of products and sums) *
// ks_j, masked to the row's keys [lo, hi); m_new = max(m, max_j score_j); e_j = exp(score_j -
// m_new) (0 off the row's keys); corr = exp(m - m_new) (1 when m_new = m); l = l * corr + (sum
// of e, a fixed order); acc = acc * corr + sum_j (e_j * vs_j) v_j, the code values v_j in key
// order. Output: acc / l.
//
// These scalar and portable functions are noinline: a single compiled copy serves every row (the
// compiler's contraction of a * b + c into an fma may differ between inlined copies).

// The portable kernel (any head dim, any CPU), one row at a time in float32, its loops over
// keys and dims left to the compiler's vectorizer: kt [d][KC] holds the chunk's keys transposed,
// so a row's KC dot products (each a chain of fmas over d in order) run side by side.
void transpose_keys_portable(const float* kf, float* kt, int64_t d, int64_t nk) {
  for (int64_t j = 0; j < nk; ++j)
    for (int64_t i = 0; i < d; ++i) kt[i * KC + j] = kf[j * d + i];
}

// A row's scores and online-softmax update over the chunk's keys [lo, hi): p gets e_j * vs_j;
// returns corr.
__attribute__((noinline)) float row_softmax_portable(const float* q, const float* kt,
                                                     const float* ks, const float* vs, int64_t d,
                                                     int64_t lo, int64_t hi, float& m, float& l,
                                                     float* p) {
  float s[KC] = {};
  for (int64_t i = 0; i < d; ++i) {
    const float qi = q[i];
    for (int64_t j = 0; j < hi; ++j) s[j] = std::fma(qi, kt[i * KC + j], s[j]);
  }
  float top = -std::numeric_limits<float>::infinity();
  for (int64_t j = lo; j < hi; ++j) {
    s[j] *= ks[j];
    top = std::max(top, s[j]);
  }
  const float m_new = std::max(m, top);
  float sum = 0.f;
  for (int64_t j = 0; j < KC; ++j) {
    const float e = j >= lo && j < hi ? std::exp(s[j] - m_new) : 0.f;
    sum += e;
    p[j] = e * vs[j];
  }
  const float corr = m_new == m ? 1.f : std::exp(m - m_new);
  l = std::fma(l, corr, sum);
  m = m_new;
  return corr;
}

__attribute__((noinline)) void row_values_portable(float* acc, float corr, const float* p,
                                                   const float* vf, int64_t d, int64_t hi) {
  for (int64_t i = 0; i < d; ++i) acc[i] *= corr;
  for (int64_t j = 0; j < hi; ++j)
    for (int64_t i = 0; i < d; ++i) acc[i] = std::fma(p[j], vf[j * d + i], acc[i]);
}

#ifdef __AVX512F__
using radixcache::exp16;
constexpr int RNE = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
constexpr int64_t VERTICAL_ROWS = 16;  // rows of a chunk and head worth transposing its keys for
constexpr int64_t VR = 3;              // rows per vertical scoring pass

// Scores come from one of two kernels with the same arithmetic: score = the 16 partial sums
// P_i = sum over c in order of q[16c + i] k[16c + i] (i < 16, fmas from 0), summed in the tree
// A_i = P_i + P_{i+8}, B_i = A_i + A_{i+4}, C_i = B_i + B_{i+2}, C_0 + C_1.

// Few rows: one row's scores of keys [0, 16) of a block (kf rows of D floats), P_i as the lanes
// of a vector per key, the tree as four levels of transposing adds; key slots are fed in the
// order that leaves key j in lane j.
template <int64_t D>
inline __m512 scores16(const float* qrow, const float* k) {
  constexpr int64_t V = D / 16;
  __m512 q[V];
#pragma GCC unroll 16
  for (int64_t c = 0; c < V; ++c) q[c] = _mm512_loadu_ps(qrow + 16 * c);
  auto key = [&](int64_t slot) { return k + ((slot & 3) * 4 + (slot >> 2)) * D; };
  __m512 z[8];
#pragma GCC unroll 8
  for (int64_t i = 0; i < 8; ++i) {  // lanes i, i + 8 of two keys: their 8 A's side by side
    const float* kx = key(2 * i);
    const float* ky = key(2 * i + 1);
    __m512 x = _mm512_fmadd_ps(q[0], _mm512_loadu_ps(kx), _mm512_setzero_ps());
    __m512 y = _mm512_fmadd_ps(q[0], _mm512_loadu_ps(ky), _mm512_setzero_ps());
#pragma GCC unroll 16
    for (int64_t c = 1; c < V; ++c) {
      x = _mm512_fmadd_ps(q[c], _mm512_loadu_ps(kx + 16 * c), x);
      y = _mm512_fmadd_ps(q[c], _mm512_loadu_ps(ky + 16 * c), y);
    }
    z[i] = _mm512_add_ps(_mm512_shuffle_f32x4(x, y, 0x44), _mm512_shuffle_f32x4(x, y, 0xEE));
  }
  __m512 w[4];
  for (int64_t i = 0; i < 4; ++i)  // B: one 128-bit lane per key
    w[i] = _mm512_add_ps(_mm512_shuffle_f32x4(z[2 * i], z[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(z[2 * i], z[2 * i + 1], 0xDD));
  __m512 u[2];
  for (int64_t i = 0; i < 2; ++i)  // C
    u[i] = _mm512_add_ps(_mm512_shuffle_ps(w[2 * i], w[2 * i + 1], 0x44),
                         _mm512_shuffle_ps(w[2 * i], w[2 * i + 1], 0xEE));
  return _mm512_add_ps(_mm512_shuffle_ps(u[0], u[1], 0x88), _mm512_shuffle_ps(u[0], u[1], 0xDD));
}

// r[j] lane i -> r[i] lane j (16 x 16 floats)
inline void transpose16(__m512* r) {
  __m512 t[16];
  for (int64_t i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  __m512 u[16];  // u[4i + k], 128-bit lane L: element 4L + k of rows 4i .. 4i + 3
  for (int64_t i = 0; i < 4; ++i) {
    const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
    const __m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
    u[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    u[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    u[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    u[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
  for (int64_t k = 0; k < 4; ++k) {
    const __m512 a0 = _mm512_shuffle_f32x4(u[k], u[4 + k], 0x88);
    const __m512 a1 = _mm512_shuffle_f32x4(u[k], u[4 + k], 0xDD);
    const __m512 b0 = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0x88);
    const __m512 b1 = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0xDD);
    r[k] = _mm512_shuffle_f32x4(a0, b0, 0x88);
    r[8 + k] = _mm512_shuffle_f32x4(a0, b0, 0xDD);
    r[4 + k] = _mm512_shuffle_f32x4(a1, b1, 0x88);
    r[12 + k] = _mm512_shuffle_f32x4(a1, b1, 0xDD);
  }
}

// kf [KC][D] -> kt [D][KC], key blocks [0, nb)
template <int64_t D>
void transpose_keys(const float* kf, float* kt, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b)
    for (int64_t c = 0; c < D / 16; ++c) {
      __m512 r[16];
      for (int64_t j = 0; j < 16; ++j) r[j] = _mm512_loadu_ps(kf + (16 * b + j) * D + 16 * c);
      transpose16(r);
      for (int64_t i = 0; i < 16; ++i) _mm512_storeu_ps(kt + (16 * c + i) * KC + 16 * b, r[i]);
    }
}

// Many rows: R rows' scores of key block b from the transposed keys kt [D][KC]: P_i of a row is
// a vector over the block's 16 keys, the tree vertical adds.
template <int64_t D, int64_t R>
void scores_vertical(const float* q, const float* kt, int64_t b, float* s) {
  constexpr int64_t V = D / 16;
  const float* k = kt + 16 * b;
  auto chain = [&](int64_t i, __m512 (&out)[R]) {  // P_i of the R rows
    __m512 kv = _mm512_loadu_ps(k + i * KC);
    for (int64_t x = 0; x < R; ++x)
      out[x] = _mm512_fmadd_ps(_mm512_set1_ps(q[x * D + i]), kv, _mm512_setzero_ps());
    for (int64_t c = 1; c < V; ++c) {
      kv = _mm512_loadu_ps(k + (16 * c + i) * KC);
      for (int64_t x = 0; x < R; ++x)
        out[x] = _mm512_fmadd_ps(_mm512_set1_ps(q[x * D + 16 * c + i]), kv, out[x]);
    }
  };
  auto level_a = [&](int64_t i, __m512 (&out)[R]) {
    __m512 t[R];
    chain(i, out), chain(i + 8, t);
    for (int64_t x = 0; x < R; ++x) out[x] = _mm512_add_ps(out[x], t[x]);
  };
  auto level_b = [&](int64_t i, __m512 (&out)[R]) {
    __m512 t[R];
    level_a(i, out), level_a(i + 4, t);
    for (int64_t x = 0; x < R; ++x) out[x] = _mm512_add_ps(out[x], t[x]);
  };
  auto level_c = [&](int64_t i, __m512 (&out)[R]) {
    __m512 t[R];
    level_b(i, out), level_b(i + 2, t);
    for (int64_t x = 0; x < R; ++x) out[x] = _mm512_add_ps(out[x], t[x]);
  };
  __m512 c0[R], c1[R];
  level_c(0, c0), level_c(1, c1);
  for (int64_t x = 0; x < R; ++x)
    _mm512_storeu_ps(s + x * KC + 16 * b, _mm512_add_ps(c0[x], c1[x]));
}

// The online-softmax update of R rows from their raw scores s [R][KC] over their keys
// [lo[x], hi[x]) of the chunk: p [R][KC] gets e_j * vs_j (0 off the row's keys), corr [R].
template <int64_t R>
__attribute__((noinline)) void tile_softmax(const float* s, const float* ks, const float* vs,
                                            const int64_t* lo, const int64_t* hi, float* m,
                                            float* l, float* p, float* corr) {
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __mmask16 mask[R][2];
  __m512 sv[R][2];
  float m_new[R];
  for (int64_t x = 0; x < R; ++x) {
    const uint32_t valid = static_cast<uint32_t>((uint64_t{1} << hi[x]) - 1) &
                           ~static_cast<uint32_t>((uint64_t{1} << lo[x]) - 1);
    mask[x][0] = static_cast<__mmask16>(valid), mask[x][1] = static_cast<__mmask16>(valid >> 16);
    for (int64_t b = 0; b < 2; ++b)
      sv[x][b] = mask[x][b] ? _mm512_mask_blend_ps(
                                  mask[x][b], neg_inf,
                                  _mm512_mul_round_ps(_mm512_loadu_ps(s + x * KC + 16 * b),
                                                      _mm512_loadu_ps(ks + 16 * b), RNE))
                            : neg_inf;
    m_new[x] = std::max(m[x], _mm512_reduce_max_ps(_mm512_max_ps(sv[x][0], sv[x][1])));
  }
  for (int64_t x = 0; x < R; ++x) {
    const __m512 vm = _mm512_set1_ps(m_new[x]);
    __m512 e[2];
    for (int64_t b = 0; b < 2; ++b) {
      e[b] = _mm512_maskz_mov_ps(mask[x][b], exp16(_mm512_sub_round_ps(sv[x][b], vm, RNE)));
      _mm512_storeu_ps(p + x * KC + 16 * b,
                       _mm512_mul_round_ps(e[b], _mm512_loadu_ps(vs + 16 * b), RNE));
    }
    const float sum = _mm512_reduce_add_ps(_mm512_add_ps(e[0], e[1]));
    // exp16(0) is 1 exactly: skipping it changes no bit
    corr[x] = m_new[x] == m[x] ? 1.f : _mm512_cvtss_f32(exp16(_mm512_set1_ps(m[x] - m_new[x])));
    l[x] = std::fma(l[x], corr[x], sum);
    m[x] = m_new[x];
  }
}

// acc[x] = acc[x] * corr[x] + sum_{j < nk} p[x][j] v_j for R rows (acc rows D apart), 64 dims
// at a time in registers.
template <int64_t D, int64_t R>
void value_tile(float* acc, const float* corr, const float* p, const float* vf, int64_t nk) {
  constexpr int64_t V = D / 16, VC = V < 4 ? V : 4;
  for (int64_t c0 = 0; c0 < V; c0 += VC) {
    __m512 a[R][VC];
    for (int64_t x = 0; x < R; ++x)
      for (int64_t c = 0; c < VC; ++c)
        a[x][c] = _mm512_mul_round_ps(_mm512_loadu_ps(acc + x * D + (c0 + c) * 16),
                                      _mm512_set1_ps(corr[x]), RNE);
    for (int64_t j = 0; j < nk; ++j) {
      __m512 v[VC];
      for (int64_t c = 0; c < VC; ++c) v[c] = _mm512_loadu_ps(vf + j * D + (c0 + c) * 16);
      for (int64_t x = 0; x < R; ++x) {
        const __m512 b = _mm512_set1_ps(p[x * KC + j]);
        for (int64_t c = 0; c < VC; ++c) a[x][c] = _mm512_fmadd_ps(b, v[c], a[x][c]);
      }
    }
    for (int64_t x = 0; x < R; ++x)
      for (int64_t c = 0; c < VC; ++c) _mm512_storeu_ps(acc + x * D + (c0 + c) * 16, a[x][c]);
  }
}

// R rows from r: scores (vertical: from ws.kt), softmax, values over keys [0, nk).
template <int64_t D, int64_t R>
void attend_tile(Scratch& ws, int64_t r, const int64_t* lo, const int64_t* hi, int64_t nk,
                 bool vertical) {
  const float* q = ws.qf.data() + r * D;
  for (int64_t b = 0; b * 16 < nk; ++b) {
    if (vertical) {  // at most VR rows at a time: their trees' partial sums stay in registers
      constexpr int64_t R1 = R < VR ? R : VR;
      scores_vertical<D, R1>(q, ws.kt.data(), b, ws.s.data());
      if constexpr (R > R1)
        scores_vertical<D, R - R1>(q + R1 * D, ws.kt.data(), b, ws.s.data() + R1 * KC);
      continue;
    }
    for (int64_t x = 0; x < R; ++x)
      _mm512_storeu_ps(ws.s.data() + x * KC + 16 * b,
                       scores16<D>(q + x * D, ws.kf.data() + 16 * b * D));
  }
  tile_softmax<R>(ws.s.data(), ws.ks, ws.vs, lo, hi, ws.m.data() + r, ws.l.data() + r,
                  ws.p.data(), ws.corr.data());
  // a row's p is 0 past its own keys: summing to the tile's nk changes none of its bits (but
  // the sign of a zero, made +0 on output)
  value_tile<D, R>(ws.acc.data() + r * D, ws.corr.data(), ws.p.data(), ws.vf.data(), nk);
}
#endif

// Rows [r0, r1) of a task attend the chunk at k0 (in ws.kf / ws.vf); each has keys there.
template <int64_t DD>
void attend_rows(const Call& c, Scratch& ws, int64_t r0, int64_t r1, int64_t k0) {
  const int64_t d = DD > 0 ? DD : c.d;
  int64_t lo[RV], hi[RV];
  auto keys = [&](int64_t r, int64_t x) {  // row r + x's keys in the chunk: [lo[x], hi[x])
    const int64_t pos = ws.pos[r + x];
    lo[x] = std::max<int64_t>(0, window_start(pos, c.window) - k0);
    hi[x] = std::min(KC, pos - k0 + 1);
    return hi[x];
  };
#ifdef __AVX512F__
  if constexpr (DD > 0) {
    const bool vertical = r1 - r0 >= VERTICAL_ROWS;
    if (vertical) {
      int64_t top = 0;
      for (int64_t r = r0; r < r1; ++r) top = std::max(top, ws.pos[r]);
      transpose_keys<DD>(ws.kf.data(), ws.kt.data(), (std::min(KC, top - k0 + 1) + 15) / 16);
    }
    for (int64_t r = r0; r < r1; r += RV) {
      const int64_t nr = std::min(RV, r1 - r);
      int64_t nk = 0;  // the keys any of the tile's rows sees: [0, nk)
      for (int64_t x = 0; x < nr; ++x) nk = std::max(nk, keys(r, x));
      switch (nr) {
#define RC_TILE(R) \
  case R: attend_tile<DD, R>(ws, r, lo, hi, nk, vertical); break;
        RC_TILE(1) RC_TILE(2) RC_TILE(3) RC_TILE(4) RC_TILE(5) RC_TILE(6)
#undef RC_TILE
      }
    }
    return;
  }
#endif
  int64_t top = 0;
  for (int64_t r = r0; r < r1; ++r) top = std::max(top, ws.pos[r]);
  transpose_keys_portable(ws.kf.data(), ws.kt.data(), d, std::min(KC, top - k0 + 1));
  for (int64_t r = r0; r < r1; ++r) {
    keys(r, 0);
    const float corr =
        row_softmax_portable(ws.qf.data() + r * d, ws.kt.data(), ws.ks, ws.vs, d, lo[0], hi[0],
                             ws.m[r], ws.l[r], ws.p.data());
    row_values_portable(ws.acc.data() + r * d, corr, ws.p.data(), ws.vf.data(), d, hi[0]);
  }
}

template <typename T>
inline float to_float(T x) {
  return static_cast<float>(x);
}

// One task: its members' rows of kv heads [h0, h1), head-major (then member, token, and the
// head's G query heads: one head's rows of consecutive members are consecutive). q / out [T, Hq,
// D] (token strides q_stride / o_stride). Chunks in order; per chunk, each head's keys in turn
// (a slot's heads sit side by side: the chunk's rows stream in once for all of them).
template <typename T, int64_t DD>
void run_task(const Call& c, const T* q, T* out, const Member* ms, const Task& task, Scratch& ws) {
  const int64_t d = DD > 0 ? DD : c.d, g = c.group, nm = task.m1 - task.m0;
  const int64_t nh = task.h1 - task.h0;
  ms += task.m0;
  ws.base.resize(static_cast<size_t>(nm + 1));
  ws.base[0] = 0;
  for (int64_t m = 0; m < nm; ++m) ws.base[m + 1] = ws.base[m] + ms[m].count * g;
  const int64_t per_head = ws.base[nm], rows = nh * per_head;
  // the first row of member m's token i, kv head h0 + hh
  auto row = [&](int64_t m, int64_t hh, int64_t i) { return hh * per_head + ws.base[m] + i * g; };
  ws.qf.resize(static_cast<size_t>(rows * d));
  ws.acc.assign(static_cast<size_t>(rows * d), 0.f);
  ws.m.assign(static_cast<size_t>(rows), -std::numeric_limits<float>::infinity());
  ws.l.assign(static_cast<size_t>(rows), 0.f);
  ws.pos.resize(static_cast<size_t>(rows));
  ws.kf.resize(static_cast<size_t>(KC * d));
  ws.vf.resize(static_cast<size_t>(KC * d));
  ws.kt.resize(static_cast<size_t>(KC * d));
  ws.s.resize(static_cast<size_t>(RV * KC));
  ws.p.resize(static_cast<size_t>(RV * KC));
  ws.corr.resize(static_cast<size_t>(RV));
  const ChunkTile tile{ws.kf.data(), ws.vf.data(), ws.ks, ws.vs};
  int64_t c_first = std::numeric_limits<int64_t>::max(), c_last = 0;
  for (int64_t m = 0; m < nm; ++m) {
    const Member& mb = ms[m];
    for (int64_t hh = 0; hh < nh; ++hh)
      for (int64_t i = 0; i < mb.count; ++i) {
        const T* src =
            q + (c.starts[mb.seq] + mb.first + i) * c.q_stride + (task.h0 + hh) * g * d;
        for (int64_t j = 0; j < g; ++j) {
          const int64_t r = row(m, hh, i) + j;
          ws.pos[r] = mb.pos0 + i;
          for (int64_t x = 0; x < d; ++x) ws.qf[r * d + x] = to_float(src[j * d + x]);
        }
      }
    c_first = std::min(c_first, window_start(mb.pos0, c.window) / KC);
    c_last = std::max(c_last, (mb.pos0 + mb.count - 1) / KC);
  }
  auto table = [&](int64_t m) { return c.tables + ms[m].seq * c.width; };
  for (int64_t chunk = c_first; chunk <= c_last; ++chunk) {
    const int64_t k0 = chunk * KC;
    if (k0 + KC <= task.shared) {  // one dequantized chunk per head for every member's rows
      int64_t lo = k0 + KC, hi = k0;
      for (int64_t m = 0; m < nm; ++m) {
        const Span s = span_of(ms[m], k0, c.window);
        if (s.i_lo < s.i_hi) lo = std::min(lo, s.lo), hi = std::max(hi, s.hi);
      }
      if (lo >= hi) continue;
      const int64_t next = std::min(task.shared, k0 + 2 * KC);
      prefetch_keys(c, table(0), k0 + KC, std::min(next, hi + KC), task.h0, task.h1);
      for (int64_t hh = 0; hh < nh; ++hh) {
        dequant_chunk<DD>(c, table(0), task.h0 + hh, k0, lo, hi, tile);
        int64_t run0 = 0, run1 = 0;  // members' rows that follow each other: one call
        for (int64_t m = 0; m < nm; ++m) {
          const Span s = span_of(ms[m], k0, c.window);
          if (s.i_lo >= s.i_hi) continue;
          if (row(m, hh, s.i_lo) != run1) {
            if (run0 < run1) attend_rows<DD>(c, ws, run0, run1, k0);
            run0 = row(m, hh, s.i_lo);
          }
          run1 = row(m, hh, s.i_hi);
        }
        if (run0 < run1) attend_rows<DD>(c, ws, run0, run1, k0);
      }
      continue;
    }
    for (int64_t m = 0; m < nm; ++m) {
      const Span s = span_of(ms[m], k0, c.window);
      if (s.i_lo >= s.i_hi) continue;
      const Span ahead = span_of(ms[m], k0 + KC, c.window);
      if (ahead.i_lo < ahead.i_hi) prefetch_keys(c, table(m), ahead.lo, ahead.hi, task.h0, task.h1);
      for (int64_t hh = 0; hh < nh; ++hh) {
        dequant_chunk<DD>(c, table(m), task.h0 + hh, k0, s.lo, s.hi, tile);
        attend_rows<DD>(c, ws, row(m, hh, s.i_lo), row(m, hh, s.i_hi), k0);
      }
    }
  }
  for (int64_t m = 0; m < nm; ++m)
    for (int64_t hh = 0; hh < nh; ++hh)
      for (int64_t i = 0; i < ms[m].count; ++i) {
        T* dst = out + (c.starts[ms[m].seq] + ms[m].first + i) * c.o_stride +
                 (task.h0 + hh) * g * d;
        for (int64_t j = 0; j < g; ++j) {
          const int64_t r = row(m, hh, i) + j;
          const float inv = 1.f / ws.l[r];
          // + 0.f: a zero's sign may depend on the tile (see attend_tile), never its value
          for (int64_t x = 0; x < d; ++x) {
            const float o = ws.acc[r * d + x] * inv;
            dst[j * d + x] = static_cast<T>(o + 0.f);
          }
        }
      }
}

// The call's tasks: tiles of long sequences; short ones with a common prefix grouped (then split
// until the threads have work); costliest first.
struct Plan {
  std::vector<Member> members;
  std::vector<Task> tasks;
};

Plan plan_tasks(const Call& c, int64_t n, const int32_t* qlens, const int32_t* lens) {
  Plan plan;
  auto add = [&](int64_t seq, int64_t first, int64_t count, int64_t shared) {
    const int64_t pos0 = lens[seq] - qlens[seq] + first;
    plan.members.push_back({seq, first, count, pos0});
    const int64_t m = static_cast<int64_t>(plan.members.size());
    plan.tasks.push_back({m - 1, m, 0, c.hkv, shared, 0});
  };
  std::vector<int64_t> small;
  for (int64_t b = 0; b < n; ++b) {
    if (qlens[b] <= 0) continue;
    if (qlens[b] <= SMALL_Q) {
      small.push_back(b);
      continue;
    }
    for (int64_t i = 0; i < qlens[b]; i += TQ) add(b, i, std::min<int64_t>(TQ, qlens[b] - i), 0);
  }
  auto first_block = [&](int64_t b) { return c.tables[b * c.width]; };
  std::stable_sort(small.begin(), small.end(),
                   [&](int64_t a, int64_t b) { return first_block(a) < first_block(b); });
  for (size_t i = 0, j; i < small.size(); i = j) {
    for (j = i + 1; j < small.size() && first_block(small[j]) == first_block(small[i]);) ++j;
    const int64_t lead = small[i];
    std::vector<int64_t> joined;
    int64_t shared = std::numeric_limits<int64_t>::max();
    for (size_t x = i; x < j; ++x) {
      const int64_t b = small[x], len = std::min(lens[b], lens[lead]);
      int64_t blk = 0;
      while (blk * c.bs < len && c.tables[b * c.width + blk] == c.tables[lead * c.width + blk])
        ++blk;
      const int64_t common = std::min(blk * c.bs, len);
      if (common >= MIN_SHARED) {
        joined.push_back(b);
        shared = std::min(shared, common);
      } else {
        add(b, 0, qlens[b], 0);
      }
    }
    if (joined.size() == 1) add(joined[0], 0, qlens[joined[0]], 0);
    if (joined.size() < 2) continue;
    const int64_t m0 = static_cast<int64_t>(plan.members.size());
    for (int64_t b : joined) plan.members.push_back({b, 0, qlens[b], lens[b] - qlens[b]});
    plan.tasks.push_back({m0, static_cast<int64_t>(plan.members.size()), 0, c.hkv, shared, 0});
  }
  // too few tasks for the threads: one task per kv head, then halve the largest groups (each
  // half dequantizes the common prefix again)
  const int64_t want = 2 * static_cast<int64_t>(at::get_num_threads());
  if (static_cast<int64_t>(plan.tasks.size()) < want && c.hkv > 1) {
    std::vector<Task> per_head;
    for (const Task& t : plan.tasks)
      for (int64_t h = 0; h < c.hkv; ++h) per_head.push_back({t.m0, t.m1, h, h + 1, t.shared, 0});
    plan.tasks.swap(per_head);
  }
  while (static_cast<int64_t>(plan.tasks.size()) < want) {
    auto big = std::max_element(
        plan.tasks.begin(), plan.tasks.end(),
        [](const Task& a, const Task& b) { return a.m1 - a.m0 < b.m1 - b.m0; });
    if (big == plan.tasks.end() || big->m1 - big->m0 < 2) break;
    const int64_t mid = (big->m0 + big->m1) / 2;
    const Task second{mid, big->m1, big->h0, big->h1, big->shared, 0};
    big->m1 = mid;
    plan.tasks.push_back(second);
  }
  for (Task& t : plan.tasks) {
    int64_t keys = 0, rows = 0;
    for (int64_t m = t.m0; m < t.m1; ++m) {
      const Member& mb = plan.members[m];
      const int64_t own = mb.pos0 + mb.count - window_start(mb.pos0, c.window);
      keys += std::max<int64_t>(0, own - t.shared);
      rows += mb.count;
      t.cost += mb.count * own;
    }
    t.cost = (t.cost * c.group + (keys + t.shared) * c.d / 4) * (t.h1 - t.h0);
  }
  std::stable_sort(plan.tasks.begin(), plan.tasks.end(),
                   [](const Task& a, const Task& b) { return a.cost > b.cost; });
  return plan;
}

// fn(item) for items [0, n) on torch's threads, each taking the next item when it is done.
template <typename F>
void run_in_order(int64_t n, const F& fn) {
  std::atomic<int64_t> next{0};
  const int64_t workers = std::max<int64_t>(1, std::min<int64_t>(n, at::get_num_threads()));
  at::parallel_for(0, workers, 1, [&](int64_t, int64_t) {
    for (int64_t item; (item = next.fetch_add(1)) < n;) fn(item);
  });
}

template <typename T, int64_t DD>
void attend_all(const Call& c, const torch::Tensor& q, torch::Tensor& out, const Plan& plan) {
  const T* qp = q.data_ptr<T>();
  T* op = out.data_ptr<T>();
  const int64_t nt = static_cast<int64_t>(plan.tasks.size());
  run_in_order(nt, [&](int64_t item) {
    thread_local Scratch ws;
    run_task<T, DD>(c, qp, op, plan.members.data(), plan.tasks[item], ws);
  });
}

template <typename T>
void dispatch_dim(const Call& c, const torch::Tensor& q, torch::Tensor& out, const Plan& plan) {
#ifdef __AVX512F__
  switch (c.d) {
    case 16: return attend_all<T, 16>(c, q, out, plan);
    case 32: return attend_all<T, 32>(c, q, out, plan);
    case 64: return attend_all<T, 64>(c, q, out, plan);
    case 128: return attend_all<T, 128>(c, q, out, plan);
    case 256: return attend_all<T, 256>(c, q, out, plan);
    default: break;
  }
#endif
  attend_all<T, 0>(c, q, out, plan);
}

void check_cache(const torch::Tensor& cache, int64_t d, const char* op) {
  TORCH_CHECK(cache.scalar_type() == torch::kUInt8 && cache.dim() == 4 && cache.is_contiguous() &&
                  cache.size(3) == d + kvq::SCALE_BYTES,
              op, ": caches must be contiguous uint8 [num_blocks, block_size, Hkv, D + 4]");
}

// q / out [T, Hq, D] (float32, bfloat16 or float16; each token's heads contiguous); caches uint8
// [num_blocks, bs, Hkv, D + 4]; q_starts / q_lens / seq_lens int32 [N]; block_tables int32
// [N, W]. Writes the attention of each listed sequence's new tokens into out (q's dtype).
void paged_attention_q(const torch::Tensor& q, const torch::Tensor& k_cache,
                       const torch::Tensor& v_cache, torch::Tensor out,
                       const torch::Tensor& q_starts, const torch::Tensor& q_lens,
                       const torch::Tensor& seq_lens, const torch::Tensor& block_tables,
                       double scale, std::optional<int64_t> window, int64_t format) {
  TORCH_CHECK(kvq::valid_format(format), "paged_attention_q: format 0 (int8), 1 or 2 (fp8)");
  TORCH_CHECK(!window.has_value() || *window >= 1, "paged_attention_q: window must be at least 1");
  TORCH_CHECK(q.dim() == 3 && out.sizes() == q.sizes() && out.scalar_type() == q.scalar_type(),
              "paged_attention_q: q and out [T, Hq, D] of one dtype");
  const int64_t hq = q.size(1), d = q.size(2);
  TORCH_CHECK(q.stride(2) == 1 && q.stride(1) == d && out.stride(2) == 1 && out.stride(1) == d,
              "paged_attention_q: each token's heads must be contiguous");
  check_cache(k_cache, d, "paged_attention_q");
  TORCH_CHECK(v_cache.sizes() == k_cache.sizes(), "paged_attention_q: k and v caches differ");
  check_cache(v_cache, d, "paged_attention_q");
  const int64_t hkv = k_cache.size(2);
  TORCH_CHECK(hq % hkv == 0, "paged_attention_q: Hq must be a multiple of Hkv");
  for (const auto* t : {&q_starts, &q_lens, &seq_lens, &block_tables})
    TORCH_CHECK(t->scalar_type() == torch::kInt32, "paged_attention_q: int32 metadata only");
  auto starts = q_starts.contiguous(), qlens = q_lens.contiguous(), lens = seq_lens.contiguous();
  auto tables = block_tables.contiguous();
  const int64_t n = starts.numel(), width = tables.size(1);
  TORCH_CHECK(qlens.numel() == n && lens.numel() == n && tables.dim() == 2 && tables.size(0) == n,
              "paged_attention_q: one start, length, context length and table per sequence");
  const int32_t* sp = starts.data_ptr<int32_t>();
  const int32_t* qp = qlens.data_ptr<int32_t>();
  const int32_t* lp = lens.data_ptr<int32_t>();
  const int32_t* tp = tables.data_ptr<int32_t>();
  const int64_t bs = k_cache.size(1), num_blocks = k_cache.size(0);
  for (int64_t b = 0; b < n; ++b) {
    TORCH_CHECK(qp[b] >= 0 && qp[b] <= lp[b] && sp[b] >= 0 && sp[b] + qp[b] <= q.size(0),
                "paged_attention_q: bad q_starts / q_lens / seq_lens");
    TORCH_CHECK((lp[b] + bs - 1) / bs <= width, "paged_attention_q: block table too short");
    for (int64_t blk = 0; blk < (lp[b] + bs - 1) / bs; ++blk)
      TORCH_CHECK(tp[b * width + blk] >= 0 && tp[b * width + blk] < num_blocks,
                  "paged_attention_q: block id out of range");
  }
  const Call c{k_cache.data_ptr<uint8_t>(), v_cache.data_ptr<uint8_t>(), tp, sp, width, bs, hkv,
               hq / hkv, d, d + kvq::SCALE_BYTES, q.stride(0), out.stride(0), window.value_or(0),
               format, static_cast<float>(scale)};
  const Plan plan = plan_tasks(c, n, qp, lp);
  switch (q.scalar_type()) {
    case torch::kFloat: return dispatch_dim<float>(c, q, out, plan);
    case torch::kBFloat16: return dispatch_dim<c10::BFloat16>(c, q, out, plan);
    case torch::kHalf: return dispatch_dim<c10::Half>(c, q, out, plan);
    default: TORCH_CHECK(false, "paged_attention_q: q must be float32, bfloat16 or float16");
  }
}

// k / v [T, Hkv, D] (any float dtype; each head's D values contiguous, any token and head
// strides) -> their quantized rows at the flat slots [T] of the caches.
void quantize_store_kv(const torch::Tensor& k, const torch::Tensor& v, torch::Tensor k_cache,
                       torch::Tensor v_cache, const torch::Tensor& slots, int64_t format) {
  TORCH_CHECK(kvq::valid_format(format), "quantize_store_kv: format 0 (int8), 1 or 2 (fp8)");
  TORCH_CHECK(k.dim() == 3 && v.sizes() == k.sizes() && v.scalar_type() == k.scalar_type(),
              "quantize_store_kv: k and v [T, Hkv, D] of one dtype");
  const int64_t t = k.size(0), hkv = k.size(1), d = k.size(2);
  check_cache(k_cache, d, "quantize_store_kv");
  check_cache(v_cache, d, "quantize_store_kv");
  TORCH_CHECK(k_cache.sizes() == v_cache.sizes() && k_cache.size(2) == hkv,
              "quantize_store_kv: caches of k's heads");
  TORCH_CHECK(slots.dim() == 1 && slots.size(0) == t && slots.scalar_type() == torch::kLong,
              "quantize_store_kv: slots int64 [T]");
  auto ks = k.stride(2) == 1 ? k : k.contiguous();
  auto vs = v.stride(2) == 1 ? v : v.contiguous();
  auto sl = slots.contiguous();
  const int64_t* sp = sl.data_ptr<int64_t>();
  const int64_t num_slots = k_cache.size(0) * k_cache.size(1), row = d + kvq::SCALE_BYTES;
  for (int64_t i = 0; i < t; ++i)
    TORCH_CHECK(sp[i] >= 0 && sp[i] < num_slots, "quantize_store_kv: slot out of range");
  uint8_t* kc = k_cache.data_ptr<uint8_t>();
  uint8_t* vc = v_cache.data_ptr<uint8_t>();
  auto run = [&](auto tag) {
    using T = decltype(tag);
    const T* kp = ks.data_ptr<T>();
    const T* vp = vs.data_ptr<T>();
    const int64_t grain = std::max<int64_t>(16, 16384 / std::max<int64_t>(1, hkv * d));
    at::parallel_for(0, t, grain, [&](int64_t t0, int64_t t1) {
      for (int64_t i = t0; i < t1; ++i)
        for (int64_t h = 0; h < hkv; ++h) {
          const int64_t at = (sp[i] * hkv + h) * row;
          kvq::quantize_row(kp + i * ks.stride(0) + h * ks.stride(1), d, format, kc + at);
          kvq::quantize_row(vp + i * vs.stride(0) + h * vs.stride(1), d, format, vc + at);
        }
    });
  };
  switch (k.scalar_type()) {
    case torch::kFloat: return run(float{});
    case torch::kBFloat16: return run(c10::BFloat16{});
    case torch::kHalf: return run(c10::Half{});
    default: TORCH_CHECK(false, "quantize_store_kv: k and v must be float32, bfloat16 or float16");
  }
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(radixcache, m) {
  m.def("paged_attention_q(Tensor q, Tensor k_cache, Tensor v_cache, Tensor(a!) out, "
        "Tensor q_starts, Tensor q_lens, Tensor seq_lens, Tensor block_tables, float scale, "
        "int? window, int format) -> ()");
  m.def("quantize_store_kv(Tensor k, Tensor v, Tensor(a!) k_cache, Tensor(b!) v_cache, "
        "Tensor slots, int format) -> ()");
}

TORCH_LIBRARY_IMPL(radixcache, CPU, m) {
  m.impl("paged_attention_q", &paged_attention_q);
  m.impl("quantize_store_kv", &quantize_store_kv);
}
