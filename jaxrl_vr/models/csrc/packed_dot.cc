// A float32 matmul for the decode loop on x86 CPUs with AVX2 and FMA, as an XLA FFI custom
// call: out[M, N] = x[M, K] @ W[K, N], with W packed once per rollout into 16-column panels
// (panels[N / 16][K][16], `jaxrl_vr.models.packed_dot.pack`), so each panel streams from memory
// in one pass and stays in cache while every block of 4 rows of x runs over it. A decode step's
// dots have few rows (the rollout's live rows), where XLA:CPU's dot reaches about 0.6 of this
// kernel's rate (benchmarks/decode_dots.py --sides jax,packed). Work is split over XLA's own
// intra-op thread pool by panel chunks; the calling thread works too and returns once every
// chunk is done, so the call never waits on a pool thread that has not started.
//
// Built at first use by jaxrl_vr/models/packed_dot.py:
//   g++ -O3 -mavx2 -mfma -std=c++17 -shared -fPIC -I<jax.ffi.include_dir()> packed_dot.cc
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int kRows = 4;    // rows per register block: 4 x 16 outputs in 8 ymm accumulators
constexpr int kWidth = 16;  // columns per panel

// Rows [row, row + kRows) of x interleaved as [K][kRows] (zeros past M), so the kernel's
// broadcasts read one contiguous stream.
void PackRowBlock(const float* x, int64_t m, int64_t k, int64_t row, float* out) {
  for (int64_t i = 0; i < k; ++i)
    for (int r = 0; r < kRows; ++r) out[i * kRows + r] = row + r < m ? x[(row + r) * k + i] : 0.0f;
}

// out[rows, 16] (row stride ldc) = block[K][kRows] . panel[K][16]. Every loop over r is
// unrolled so each accumulator is a register.
inline void BlockTimesPanel(const float* __restrict block, const float* __restrict panel, int64_t k,
                            float* out, int64_t ldc, int64_t rows) {
  __m256 acc[kRows][2];
#pragma GCC unroll 4
  for (int r = 0; r < kRows; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int64_t i = 0; i < k; ++i) {
    const __m256 b0 = _mm256_loadu_ps(panel + i * kWidth), b1 = _mm256_loadu_ps(panel + i * kWidth + 8);
#pragma GCC unroll 4
    for (int r = 0; r < kRows; ++r) {
      const __m256 a = _mm256_broadcast_ss(block + i * kRows + r);
      acc[r][0] = _mm256_fmadd_ps(a, b0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(a, b1, acc[r][1]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < kRows; ++r) {
    if (r < rows) {
      _mm256_storeu_ps(out + r * ldc, acc[r][0]);
      _mm256_storeu_ps(out + r * ldc + 8, acc[r][1]);
    }
  }
}

// One call's shared state; pool tasks hold it by shared_ptr, so a task that starts after the
// call returned finds no chunk left and touches nothing else.
struct Work {
  std::vector<float> blocks;  // x as packed row blocks
  const float* panels;
  float* out;
  int64_t m, k, n, num_blocks, num_panels, panels_per_chunk, num_chunks;
  std::atomic<int64_t> next{0}, done{0};
};

void RunChunks(Work& w) {
  for (;;) {
    const int64_t chunk = w.next.fetch_add(1, std::memory_order_relaxed);
    if (chunk >= w.num_chunks) return;
    const int64_t first = chunk * w.panels_per_chunk, last = std::min(first + w.panels_per_chunk, w.num_panels);
    for (int64_t j = first; j < last; ++j) {
      const float* panel = w.panels + j * w.k * kWidth;
      for (int64_t block = 0; block < w.num_blocks; ++block) {
        const int64_t row = block * kRows;
        BlockTimesPanel(w.blocks.data() + block * kRows * w.k, panel, w.k, w.out + row * w.n + j * kWidth, w.n,
                        std::min<int64_t>(kRows, w.m - row));
      }
    }
    w.done.fetch_add(1, std::memory_order_release);
  }
}

ffi::Error PackedDot(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> panels,
                     ffi::ResultBuffer<ffi::F32> out) {
  const auto x_dims = x.dimensions(), p_dims = panels.dimensions();
  if (x_dims.size() < 1 || p_dims.size() != 3 || p_dims[2] != kWidth || x_dims.back() != p_dims[1])
    return ffi::Error::InvalidArgument("packed_dot: want x [..., K] and panels [N / 16, K, 16]");
  auto w = std::make_shared<Work>();
  w->k = p_dims[1];
  w->num_panels = p_dims[0];
  w->n = w->num_panels * kWidth;
  w->m = w->k ? static_cast<int64_t>(x.element_count()) / w->k : 0;
  w->panels = panels.typed_data();
  w->out = out->typed_data();
  if (w->m == 0 || w->n == 0) return ffi::Error::Success();
  if (w->k == 0) {
    std::fill(w->out, w->out + w->m * w->n, 0.0f);
    return ffi::Error::Success();
  }
  w->num_blocks = (w->m + kRows - 1) / kRows;
  w->blocks.resize(w->num_blocks * kRows * w->k);
  for (int64_t block = 0; block < w->num_blocks; ++block)
    PackRowBlock(x.typed_data(), w->m, w->k, block * kRows, w->blocks.data() + block * kRows * w->k);
  // A few chunks per thread evens out a slow thread; each chunk still streams whole panels.
  const int64_t threads = std::max<int64_t>(1, pool.num_threads());
  w->panels_per_chunk = std::max<int64_t>(1, w->num_panels / (4 * threads));
  w->num_chunks = (w->num_panels + w->panels_per_chunk - 1) / w->panels_per_chunk;
  const int64_t helpers = std::min<int64_t>(threads - 1, w->num_chunks - 1);
  for (int64_t t = 0; t < helpers; ++t) pool.Schedule([w] { RunChunks(*w); });
  RunChunks(*w);
  for (int spins = 0; w->done.load(std::memory_order_acquire) < w->num_chunks; ++spins) {
    if (spins < 4096) _mm_pause(); else std::this_thread::yield();
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxrlVrPackedDot, PackedDot,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
