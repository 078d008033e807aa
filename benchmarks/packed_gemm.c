/* A small-M float32 matmul for x86 with AVX2 and FMA: C[M, N] = A[M, K] @ B[K, N], with B
 * packed once into 16-column panels ([N / 16][K][16], `pack_b`) so that each panel streams
 * from memory in one pass and stays in L2 while every block of RB rows of A runs over it.
 * Threads (OpenMP) split the panels. It measures how fast a decode step's dots (M = the
 * rollout's rows) could run on this CPU beside XLA's and torch's (benchmarks/decode_dots.py
 * --sides packed); it is not used by the library.
 *
 * gcc -O3 -mavx2 -mfma -fopenmp -shared -fPIC packed_gemm.c -o packed_gemm.so
 */
#include <immintrin.h>
#include <string.h>

#ifndef RB
#define RB 4 /* rows per register block: RB x 16 outputs in 2 * RB ymm accumulators */
#endif

void pack_b(const float *b, int k, int n, float *packed) {
  for (int j = 0; j < n / 16; j++)
    for (int i = 0; i < k; i++)
      memcpy(packed + ((size_t)j * k + i) * 16, b + (size_t)i * n + (size_t)j * 16, 16 * sizeof(float));
}

/* A's rows [row, row + RB) interleaved as [K][RB] (zeros past M), so the kernel's broadcasts
 * read one contiguous stream. */
static void pack_a_block(const float *a, int m, int k, int row, float *out) {
  for (int i = 0; i < k; i++)
    for (int r = 0; r < RB; r++)
      out[(size_t)i * RB + r] = row + r < m ? a[(size_t)(row + r) * k + i] : 0.0f;
}

static inline void kernel(const float *restrict ap, const float *restrict bp, int k, float *c, int ldc,
                          int rows) {
  /* Every loop over r is unrolled, so each accumulator is a register (an index known only
   * at run time, as in a loop to `rows`, would keep them in memory: half the speed). */
  __m256 acc[RB][2];
#pragma GCC unroll 16
  for (int r = 0; r < RB; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int i = 0; i < k; i++) {
    const __m256 b0 = _mm256_load_ps(bp + (size_t)i * 16), b1 = _mm256_load_ps(bp + (size_t)i * 16 + 8);
#pragma GCC unroll 16
    for (int r = 0; r < RB; r++) {
      const __m256 x = _mm256_broadcast_ss(ap + (size_t)i * RB + r);
      acc[r][0] = _mm256_fmadd_ps(x, b0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(x, b1, acc[r][1]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < RB; r++) {
    if (r < rows) {
      _mm256_storeu_ps(c + (size_t)r * ldc, acc[r][0]);
      _mm256_storeu_ps(c + (size_t)r * ldc + 8, acc[r][1]);
    }
  }
}

/* c = a @ B for B packed by `pack_b`; n must be a multiple of 16, packed 32-byte aligned;
 * a_work holds ceil(m / RB) * RB * k floats. */
void gemm_packed(const float *a, int m, int k, const float *packed, int n, float *c, float *a_work) {
  const int blocks = (m + RB - 1) / RB;
  for (int block = 0; block < blocks; block++) pack_a_block(a, m, k, block * RB, a_work + (size_t)block * RB * k);
#pragma omp parallel for schedule(static)
  for (int j = 0; j < n / 16; j++) {
    const float *bp = packed + (size_t)j * k * 16;
    for (int block = 0; block < blocks; block++) {
      const int row = block * RB, rows = m - row < RB ? m - row : RB;
      kernel(a_work + (size_t)block * RB * k, bp, k, c + (size_t)row * n + (size_t)j * 16, n, rows);
    }
  }
}

int rows_per_block(void) { return RB; }
