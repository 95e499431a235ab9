"""The CPU thread pool: a small C library (compiled once per compiler, cached like kernels) that runs a kernel on N cores.

A threaded kernel has the uniform entry `void name(void **bufs, const int *vals, int core_id, int core_n)`, where
core `core_id` runs its share of the outermost global loop, and `long long name_work(const int *vals, long long
*split)` returning the estimated work (ops) and the outer loop's trip count. `plugrad_pool_launch` picks the core
count from these (one core when the work is small), wakes that many persistent workers, runs share 0 on the
calling thread and waits for the rest. Workers spin after a job (`CPU_SPIN_US`, default 1 ms: back-to-back launches
with a short single-core kernel or some Python between them find them awake), then sleep on a condition variable.
One launch at a time (a mutex); after fork() the child starts with no workers.
`plugrad_pool_set_ftz(1)` makes every kernel run with float32 subnormals flushed to zero (x86 MXCSR FTZ|DAZ, arm64
FPCR.FZ), each thread's own mode restored after the kernel, so code outside the kernels (numpy) is unaffected.
`plugrad_batch_run` runs an array of such kernels in order (a TinyJit replay without a Python call per kernel), and
optionally records each one's time in place (the profile of a replay).
"""
from __future__ import annotations

POOL_SRC = r"""
#include <pthread.h>
#include <stdatomic.h>
#include <sched.h>
#include <time.h>
typedef void (*kern_t)(void **, const int *, int, int);
typedef long long (*work_t)(const int *, long long *);
#define MAXT 256
#if defined(__x86_64__) || defined(__i386__)
#define PAUSE() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define PAUSE() __asm__ volatile("yield")
#else
#define PAUSE() ((void)0)
#endif
static struct { kern_t fn; void **bufs; const int *vals; int n; } job;
static _Atomic int todo[MAXT], sleeping[MAXT], pending;
static pthread_mutex_t mu[MAXT];
static pthread_cond_t cv[MAXT];
static pthread_mutex_t launch_mu = PTHREAD_MUTEX_INITIALIZER;
static int nworkers = 0, gen = 0, atfork_done = 0;
static long long spin_ns = 100000;

static int ftz = 0;
/* fp_flush(): switch this thread to flushing subnormals, returning its mode; fp_restore(mode) puts it back */
#if defined(__x86_64__) || defined(__i386__)
typedef unsigned fpmode_t;
static fpmode_t fp_flush(void) { fpmode_t m = __builtin_ia32_stmxcsr(); __builtin_ia32_ldmxcsr(m | 0x8040); return m; }
static void fp_restore(fpmode_t m) { __builtin_ia32_ldmxcsr(m); }
#elif defined(__aarch64__)
typedef unsigned long fpmode_t;
static fpmode_t fp_flush(void) {
  fpmode_t m;
  __asm__ volatile("mrs %0, fpcr" : "=r"(m));
  __asm__ volatile("msr fpcr, %0" :: "r"(m | (1UL << 24)));
  return m;
}
static void fp_restore(fpmode_t m) { __asm__ volatile("msr fpcr, %0" :: "r"(m)); }
#else
typedef int fpmode_t;
static fpmode_t fp_flush(void) { return 0; }
static void fp_restore(fpmode_t m) { (void)m; }
#endif
void plugrad_pool_set_ftz(int on) { ftz = on; }
/* the flag is read once: a switch from another thread mid-kernel can't leave this thread's mode changed */
static void run_share(kern_t fn, void **bufs, const int *vals, int id, int n) {
  int flush = ftz;
  fpmode_t m = flush ? fp_flush() : 0;
  fn(bufs, vals, id, n);
  if (flush) fp_restore(m);
}

static long long now_ns(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1000000000LL + t.tv_nsec; }

static void *worker(void *arg) {
  int id = (int)(long)arg, seen = 0, t;
  for (;;) {
    long long until = now_ns() + spin_ns;
    for (long i = 1; (t = atomic_load_explicit(&todo[id], memory_order_acquire)) == seen; i++) {
      PAUSE();
      if ((i & 63) == 0 && now_ns() > until) break;
    }
    if (t == seen) {
      pthread_mutex_lock(&mu[id]);
      atomic_store(&sleeping[id], 1);
      while ((t = atomic_load(&todo[id])) == seen) pthread_cond_wait(&cv[id], &mu[id]);
      atomic_store(&sleeping[id], 0);
      pthread_mutex_unlock(&mu[id]);
    }
    seen = t;
    run_share(job.fn, job.bufs, job.vals, id, job.n);
    atomic_fetch_sub_explicit(&pending, 1, memory_order_release);
  }
  return 0;
}

static void after_fork_child(void) {
  nworkers = 0; gen = 0;
  pthread_mutex_init(&launch_mu, 0);
  for (int i = 0; i < MAXT; i++) { atomic_store(&todo[i], 0); atomic_store(&sleeping[i], 0); }
}

static int start_workers(int want) {
  if (!atfork_done) { pthread_atfork(0, 0, after_fork_child); atfork_done = 1; }
  while (nworkers < want) {
    int id = nworkers + 1;
    pthread_t th;
    pthread_mutex_init(&mu[id], 0); pthread_cond_init(&cv[id], 0);
    if (pthread_create(&th, 0, worker, (void *)(long)id) != 0) break;
    pthread_detach(th);
    nworkers = id;
  }
  return nworkers;
}

void plugrad_pool_set_spin_ns(long long ns) { spin_ns = ns < 0 ? 0 : ns; }
long long plugrad_pool_spin_ns(void) { return spin_ns; }

static long long threads_for(long long w, long long split, int max_threads, long long min_work) {
  long long n = min_work > 0 ? w / min_work : max_threads;
  if (n > max_threads) n = max_threads;
  if (n > split) n = split;
  return n > MAXT ? MAXT : n;
}

static int run_on(kern_t fn, void **bufs, const int *vals, long long n) {
  if (n <= 1) { run_share(fn, bufs, vals, 0, 1); return 1; }
  pthread_mutex_lock(&launch_mu);
  if (start_workers((int)n - 1) < n - 1) n = nworkers + 1;
  job.fn = fn; job.bufs = bufs; job.vals = vals; job.n = (int)n;
  atomic_store(&pending, (int)n - 1);
  gen++;
  for (int i = 1; i < n; i++) {
    atomic_store(&todo[i], gen);
    if (atomic_load(&sleeping[i])) { pthread_mutex_lock(&mu[i]); pthread_cond_signal(&cv[i]); pthread_mutex_unlock(&mu[i]); }
  }
  run_share(fn, bufs, vals, 0, (int)n);
  for (long i = 1; atomic_load_explicit(&pending, memory_order_acquire) != 0; i++) { PAUSE(); if ((i & 1023) == 0) sched_yield(); }
  pthread_mutex_unlock(&launch_mu);
  return (int)n;
}

int plugrad_pool_launch(kern_t fn, work_t work, void **bufs, const int *vals, int max_threads, long long min_work) {
  long long split = 1, w = work(vals, &split);
  return run_on(fn, bufs, vals, threads_for(w, split, max_threads, min_work));
}

/* One kernel of a batch: its entry points, buffer pointers, value array (filled from the batch's values through
   var_idx), and its (work, outer trips) when they don't depend on variables (work < 0: ask `work`). */
typedef struct { kern_t fn; work_t work; void **bufs; int *vals; const int *var_idx; long long nvars, work_c, split_c; } pg_entry;

/* Run n kernels in order, each on one core or the pool exactly as plugrad_pool_launch would. With `prof` (else
   NULL): prof[2i] = kernel i's nanoseconds from the end of the previous one (its launch included), prof[2i+1] = the
   cores it ran on. */
void plugrad_batch_run(pg_entry *e, int n, const int *gvals, int max_threads, long long min_work, long long *prof) {
  long long t0 = prof ? now_ns() : 0;
  for (int i = 0; i < n; i++, e++) {
    for (long long j = 0; j < e->nvars; j++) e->vals[j] = gvals[e->var_idx[j]];
    long long split = e->split_c, w = e->work_c;
    if (w < 0) w = e->work(e->vals, &split);
    int used = run_on(e->fn, e->bufs, e->vals, threads_for(w, split, max_threads, min_work));
    if (prof) { long long t = now_ns(); prof[2 * i] = t - t0; prof[2 * i + 1] = used; t0 = t; }
  }
}
"""
