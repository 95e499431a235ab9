// Probe (not a plugrad benchmark): is packing B inside the product kernel, one panel at a time, faster than the
// separate packing kernel plugrad runs per chunk of the reduce axis (issue 40, skinny matmuls)?
//
// C[16][4096] = A[16][4096] @ B[4096][4096], f32, 2 threads splitting the columns, AVX2 + FMA, 4 x 2-vector tiles:
//   separate: per chunk of KC reduce rows, every thread packs its share of the chunk's rows into 16-column panels,
//             reading each row in order as plugrad's pack kernel does (a barrier), then computes its panels' row tiles
//             (plugrad's product kernel). Until the fifteenth session it packed its own panels, reading B 64 bytes a
//             row, 16 KiB apart: a slower pack than plugrad's, which made the fused forms look 1.2-1.9x faster;
//   fused:    per chunk, per panel: the thread copies the KC x 16 panel into a stack buffer and computes the
//             panel's row tiles from it at once (what BLAS libraries do; plugrad's IR can't say it yet);
//   stashed:  the same, the copy done by the first row tile's reduce loop (it reads B and stores what it read into
//             the buffer; the other row tiles read the buffer): no loop nest of its own.
// Both accumulate the chunks into C (the first chunk from zero), alternate in one process (the VM's phases move
// single timings by up to 2x) and check C against a float64 reference.
//
//   clang-19 -O3 -mavx2 -mfma -pthread bench/probe_fused_pack.c -o /tmp/probe_fused_pack && /tmp/probe_fused_pack
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

enum { M = 16, K = 4096, N = 4096, KC = 128, PANEL = 16, THREADS = 2 };
static float *A, *B, *C, *Bp;
static pthread_barrier_t step;
static int fused;

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }

static void copy_panel(float *dst, int kc, int p) {  // rows kc..kc+KC of B's columns p*16..p*16+15, row after row
  for (int k = 0; k < KC; k++) {
    const float *src = B + (size_t)(kc + k) * N + p * PANEL;
    _mm256_storeu_ps(dst + k * PANEL, _mm256_loadu_ps(src));
    _mm256_storeu_ps(dst + k * PANEL + 8, _mm256_loadu_ps(src + 8));
  }
}

// the panel's four 4-row tiles, added to C (zero first). With `stash`, the first row tile reads the panel's values
// from B and stores them into `panel` as it goes, and the later tiles read `panel`: the fused copy as plugrad's IR
// could say it, inside the first row tile's reduce loop, without a loop nest of its own
static void tiles(float *panel, int kc, int p, int stash) {
  for (int rb = 0; rb < M / 4; rb++) {
    __m256 acc[4][2];
    for (int r = 0; r < 4; r++)
      for (int v = 0; v < 2; v++) acc[r][v] = kc ? _mm256_loadu_ps(C + (rb * 4 + r) * N + p * PANEL + 8 * v) : _mm256_setzero_ps();
    int from_b = stash && rb == 0;
    for (int k = 0; k < KC; k++) {
      const float *src = from_b ? B + (size_t)(kc + k) * N + p * PANEL : panel + k * PANEL;
      __m256 b0 = _mm256_loadu_ps(src), b1 = _mm256_loadu_ps(src + 8);
      if (from_b) { _mm256_storeu_ps(panel + k * PANEL, b0); _mm256_storeu_ps(panel + k * PANEL + 8, b1); }
      for (int r = 0; r < 4; r++) {
        __m256 a = _mm256_broadcast_ss(A + (rb * 4 + r) * K + kc + k);
        acc[r][0] = _mm256_fmadd_ps(a, b0, acc[r][0]);
        acc[r][1] = _mm256_fmadd_ps(a, b1, acc[r][1]);
      }
    }
    for (int r = 0; r < 4; r++)
      for (int v = 0; v < 2; v++) _mm256_storeu_ps(C + (rb * 4 + r) * N + p * PANEL + 8 * v, acc[r][v]);
  }
}

static void *worker(void *arg) {
  int t = (int)(long)arg, p0 = t * (N / PANEL / THREADS), p1 = p0 + N / PANEL / THREADS;
  static _Thread_local float panel[KC * PANEL] __attribute__((aligned(64)));
  for (int kc = 0; kc < K; kc += KC) {
    if (fused == 1) {
      for (int p = p0; p < p1; p++) { copy_panel(panel, kc, p); tiles(panel, kc, p, 0); }
    } else if (fused == 2) {
      for (int p = p0; p < p1; p++) tiles(panel, kc, p, 1);
    } else {
      for (int k = t * KC / THREADS; k < (t + 1) * KC / THREADS; k++)   // its rows of every panel, each row read in order
        for (int p = 0; p < N / PANEL; p++) {
          const float *src = B + (size_t)(kc + k) * N + p * PANEL;
          float *dst = Bp + ((size_t)p * KC + k) * PANEL;
          _mm256_storeu_ps(dst, _mm256_loadu_ps(src));
          _mm256_storeu_ps(dst + 8, _mm256_loadu_ps(src + 8));
        }
      pthread_barrier_wait(&step);
      for (int p = p0; p < p1; p++) tiles(Bp + (size_t)p * KC * PANEL, kc, p, 0);
      pthread_barrier_wait(&step);
    }
  }
  return 0;
}

static double run(void) {
  pthread_t th[THREADS];
  double t0 = now();
  for (long i = 1; i < THREADS; i++) pthread_create(&th[i], 0, worker, (void *)i);
  worker(0);
  for (int i = 1; i < THREADS; i++) pthread_join(th[i], 0);
  return now() - t0;
}

static double max_error(void) {
  double err = 0;
  for (int r = 0; r < M; r += 5)
    for (int c = 0; c < N; c += 97) {
      double s = 0;
      for (int k = 0; k < K; k++) s += (double)A[r * K + k] * B[(size_t)k * N + c];
      double d = s > C[r * N + c] ? s - C[r * N + c] : C[r * N + c] - s;
      if (d > err) err = d;
    }
  return err;
}

int main(void) {
  A = aligned_alloc(64, sizeof(float) * M * K); B = aligned_alloc(64, sizeof(float) * K * N);
  C = aligned_alloc(64, sizeof(float) * M * N); Bp = aligned_alloc(64, sizeof(float) * KC * N);
  pthread_barrier_init(&step, 0, THREADS);
  srand(1);
  for (int i = 0; i < M * K; i++) A[i] = (float)(rand() % 1000) / 1000.0f - 0.5f;
  for (size_t i = 0; i < (size_t)K * N; i++) B[i] = (float)(rand() % 1000) / 1000.0f - 0.5f;
  double best[3] = {1e9, 1e9, 1e9}, err[3];
  for (int round = 0; round < 6; round++)
    for (fused = 0; fused < 3; fused++) {
      for (int i = 0; i < 5; i++) { double t = run(); if (t < best[fused]) best[fused] = t; }
      err[fused] = max_error();
    }
  printf("16x4096x4096 f32, 2 threads, KC=%d: separate pack %.2f ms, fused pack %.2f ms (%.2fx), stashed in the first "
         "row tile %.2f ms (%.2fx); max error %.1e / %.1e / %.1e\n", KC, best[0] * 1e3, best[1] * 1e3, best[0] / best[1],
         best[2] * 1e3, best[0] / best[2], err[0], err[1], err[2]);
  return 0;
}
