// Matmuls for the decode loop on x86 CPUs, as XLA FFI custom calls: out[M, N] = x[M, K] @ W[K, N]
// in float32, with W packed once per rollout (`jaxrl_vr.models.packed_dot.pack`), so each panel
// of W streams from memory in one pass and stays in cache while every block of rows of x runs
// over it. A decode step's dots have few rows (the rollout's live rows), where XLA:CPU's dot
// reaches about 0.6 of the float32 kernel's rate on AVX2 and 0.45 of the AMX kernel's
// (benchmarks/decode_dots.py --sides jax,packed).
//  - JaxrlVrPackedDot (AVX2 + FMA): float32 x and W, W as 16-column panels [N / 16][K][16],
//    4 x 16 register blocks.
//  - JaxrlVrPackedDotAmx (AMX-TILE + AMX-BF16, compiled for that target only; the caller checks
//    the CPU and calls JaxrlVrAmxInit first): bfloat16 x and W, products summed in float32 (as a
//    bf16 dot with f32 accumulation), W as 32-column panels of K-pairs [N / 32][K / 2][32][2]
//    (AMX's VNNI layout), 32 x 32 output blocks.
// Work is split over XLA's own intra-op thread pool by panel chunks; the calling thread works
// too and returns once every chunk is done, so the call never waits on a pool thread that has
// not started.
//
// Built at first use by jaxrl_vr/models/packed_dot.py:
//   g++ -O3 -mavx2 -mfma -std=c++17 -shared -fPIC -I<jax.ffi.include_dir()> packed_dot.cc
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
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

// AMX (Intel's tile matrix unit; x86 with AMX-TILE and AMX-BF16): out[32 rows, 32 columns] of
// one row group and one panel as four 16 x 16 float32 tiles (tmm0-3), summed over K in chunks of
// 32: two 16-row tiles of x (tmm4-5, straight from x's rows), two 16-pair tiles of the panel
// (tmm6-7: its 32 columns as two VNNI halves, 128-byte rows) and four TDPBF16PS.
constexpr int kRowsAmx = 32;    // rows per group: two 16-row tiles
constexpr int kWidthAmx = 32;   // columns per bf16 panel: two 16-column tiles
constexpr int kChunkAmx = 32;   // K per tile step (16 pairs)
constexpr int kPrefetchChunks = 4;  // how far ahead the panel is prefetched (measured: 2-16 alike)

struct alignas(64) TileConfig {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

// Rows [0, 32 * groups) of `x` (bf16 [rows, K], zero rows past M) times panel [K / 2][64]
// into `out` (row stride n), its first M rows. Configures and releases the tiles itself, so it
// runs on whichever thread calls it. The first group prefetches the panel a few chunks ahead
// (into the next panel, which follows in memory, where there is one).
__attribute__((target("amx-tile,amx-bf16,sse")))
void GroupsTimesPanelAmx(const uint16_t* x, int64_t groups, int64_t k, const uint16_t* panel, float* out,
                         int64_t n, int64_t m, bool next_panel_follows) {
  TileConfig config{};
  config.palette = 1;
  for (int t = 0; t < 8; ++t) {
    config.colsb[t] = 64;
    config.rows[t] = 16;
  }
  _tile_loadconfig(&config);
  const int64_t chunks = k / kChunkAmx, prefetchable = next_panel_follows ? 2 * chunks : chunks;
  alignas(64) float tail[kRowsAmx * kWidthAmx];
  for (int64_t g = 0; g < groups; ++g) {
    const uint16_t* xg = x + g * kRowsAmx * k;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t c = 0; c < chunks; ++c) {
      if (g == 0 && c + kPrefetchChunks < prefetchable) {
        const char* ahead = reinterpret_cast<const char*>(panel + (c + kPrefetchChunks) * kChunkAmx * kWidthAmx);
        for (int line = 0; line < 32; ++line) _mm_prefetch(ahead + 64 * line, _MM_HINT_T0);
      }
      const uint16_t* chunk = panel + c * kChunkAmx * kWidthAmx;  // 16 pairs x 64 values
      _tile_loadd(4, xg + c * kChunkAmx, 2 * k);
      _tile_loadd(5, xg + 16 * k + c * kChunkAmx, 2 * k);
      _tile_loadd(6, chunk, 2 * 2 * kWidthAmx);
      _tile_loadd(7, chunk + kWidthAmx, 2 * 2 * kWidthAmx);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
    const int64_t rows = std::min<int64_t>(kRowsAmx, m - g * kRowsAmx);
    float* o = out + g * kRowsAmx * n;
    if (rows == kRowsAmx) {
      _tile_stored(0, o, 4 * n);
      _tile_stored(1, o + 16, 4 * n);
      _tile_stored(2, o + 16 * n, 4 * n);
      _tile_stored(3, o + 16 * n + 16, 4 * n);
    } else {  // the last, partial group: through a buffer, its real rows only
      _tile_stored(0, tail, 4 * kWidthAmx);
      _tile_stored(1, tail + 16, 4 * kWidthAmx);
      _tile_stored(2, tail + 16 * kWidthAmx, 4 * kWidthAmx);
      _tile_stored(3, tail + 16 * kWidthAmx + 16, 4 * kWidthAmx);
      for (int64_t r = 0; r < rows; ++r) std::memcpy(o + r * n, tail + r * kWidthAmx, sizeof(float) * kWidthAmx);
    }
  }
  _tile_release();
}

// One call's shared state; pool tasks hold it by shared_ptr, so a task that starts after the
// call returned finds no chunk left and touches nothing else. `run_panel(j)` multiplies every
// row block by panel j.
struct Work {
  std::function<void(int64_t)> run_panel;
  int64_t num_panels, panels_per_chunk, num_chunks;
  std::atomic<int64_t> next{0}, done{0};
};

void RunChunks(Work& w) {
  for (;;) {
    const int64_t chunk = w.next.fetch_add(1, std::memory_order_relaxed);
    if (chunk >= w.num_chunks) return;
    const int64_t first = chunk * w.panels_per_chunk, last = std::min(first + w.panels_per_chunk, w.num_panels);
    for (int64_t j = first; j < last; ++j) w.run_panel(j);
    w.done.fetch_add(1, std::memory_order_release);
  }
}

// Runs `w` over the pool's threads and the caller's; returns when every chunk is done.
void RunOnPool(ffi::ThreadPool& pool, const std::shared_ptr<Work>& w) {
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
}

// x's rows (the product of its leading axes), or 0 where there is nothing to multiply: no
// rows, no columns, or K = 0 (then `out` [rows, n] is filled with zeros).
template <typename Dims>
int64_t RowsToMultiply(const Dims& x_dims, int64_t k, int64_t n, float* out) {
  int64_t m = 1;
  for (size_t i = 0; i + 1 < x_dims.size(); ++i) m *= x_dims[i];
  if (m == 0 || n == 0) return 0;
  if (k == 0) {
    std::fill(out, out + m * n, 0.0f);
    return 0;
  }
  return m;
}

ffi::Error PackedDot(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> panels,
                     ffi::ResultBuffer<ffi::F32> out) {
  const auto x_dims = x.dimensions(), p_dims = panels.dimensions();
  if (x_dims.size() < 1 || p_dims.size() != 3 || p_dims[2] != kWidth || x_dims.back() != p_dims[1])
    return ffi::Error::InvalidArgument("packed_dot: want x [..., K] and panels [N / 16, K, 16]");
  const int64_t k = p_dims[1], num_panels = p_dims[0], n = num_panels * kWidth;
  float* y = out->typed_data();
  const int64_t m = RowsToMultiply(x_dims, k, n, y);
  if (m == 0) return ffi::Error::Success();
  const int64_t num_blocks = (m + kRows - 1) / kRows;
  auto blocks = std::make_shared<std::vector<float>>(num_blocks * kRows * k);  // x as packed row blocks
  for (int64_t block = 0; block < num_blocks; ++block)
    PackRowBlock(x.typed_data(), m, k, block * kRows, blocks->data() + block * kRows * k);
  const float* w_panels = panels.typed_data();
  auto w = std::make_shared<Work>();
  w->num_panels = num_panels;
  w->run_panel = [blocks, w_panels, y, m, k, n, num_blocks](int64_t j) {
    const float* panel = w_panels + j * k * kWidth;
    for (int64_t block = 0; block < num_blocks; ++block) {
      const int64_t row = block * kRows;
      BlockTimesPanel(blocks->data() + block * kRows * k, panel, k, y + row * n + j * kWidth, n,
                      std::min<int64_t>(kRows, m - row));
    }
  };
  RunOnPool(pool, w);
  return ffi::Error::Success();
}

ffi::Error PackedDotAmx(ffi::ThreadPool pool, ffi::Buffer<ffi::BF16> x, ffi::Buffer<ffi::BF16> panels,
                        ffi::ResultBuffer<ffi::F32> out) {
  const auto x_dims = x.dimensions(), p_dims = panels.dimensions();
  if (x_dims.size() < 1 || p_dims.size() != 3 || p_dims[2] != 2 * kWidthAmx || x_dims.back() != 2 * p_dims[1] ||
      x_dims.back() % kChunkAmx)
    return ffi::Error::InvalidArgument("packed_dot_amx: want x [..., K] (K a multiple of 32) and panels [N / 32, K / 2, 64]");
  const int64_t k = 2 * p_dims[1], num_panels = p_dims[0], n = num_panels * kWidthAmx;
  float* y = out->typed_data();
  const int64_t m = RowsToMultiply(x_dims, k, n, y);
  if (m == 0) return ffi::Error::Success();
  // x's rows zero-padded to whole groups of 32 (a decode step's few rows: a small copy).
  const int64_t groups = (m + kRowsAmx - 1) / kRowsAmx;
  auto rows = std::make_shared<std::vector<uint16_t>>(groups * kRowsAmx * k, uint16_t{0});
  std::memcpy(rows->data(), x.typed_data(), sizeof(uint16_t) * m * k);
  const uint16_t* w_panels = panels.typed_data();
  auto w = std::make_shared<Work>();
  w->num_panels = num_panels;
  w->run_panel = [rows, w_panels, y, m, k, n, groups, num_panels](int64_t j) {
    GroupsTimesPanelAmx(rows->data(), groups, k, w_panels + j * k * kWidthAmx, y + j * kWidthAmx, n, m,
                        j + 1 < num_panels);
  };
  RunOnPool(pool, w);
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxrlVrPackedDot, PackedDot,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxrlVrPackedDotAmx, PackedDotAmx,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::BF16>>()
                                  .Arg<ffi::Buffer<ffi::BF16>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

// Asks Linux for the AMX tile state (once per process, before any tile instruction; without
// it the first one faults). 0 on success, else errno.
extern "C" int JaxrlVrAmxInit() {
  constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) ? errno : 0;
}
