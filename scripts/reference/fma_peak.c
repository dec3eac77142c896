// fma_peak measures, on one core with AVX2+FMA, what bounds a bf16 matrix
// product there (docs/performance.md, "Tandem against a native llama.cpp
// per format"): the clock (a chain of dependent integer adds, one a cycle),
// hence the nominal FMA peak of two 8-lane FMAs a cycle; what twelve
// independent FMA chains with register operands reach; and the rate of a
// 4x3 register tile (twelve
// accumulators, the shape of llama.cpp's AVX2 tinyBLAS) over data in the
// L1 cache when the weights are f32, when each bf16 weight vector is
// widened to f32 first (exact: f32 activations, as Tandem computes), and
// when the activations are rounded to bf16 and widened too (llama.cpp's
// bf16 path converts the activations to bf16 before its product).
//
//   gcc -O3 -march=native -o /tmp/fma_peak scripts/reference/fma_peak.c && /tmp/fma_peak
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

enum { K = 256, ITERS = 200000 };

static float xa[4][K] __attribute__((aligned(64)));
static float wf[3][K] __attribute__((aligned(64)));
static uint16_t wb[3][K] __attribute__((aligned(64)));
static uint16_t xb[4][K] __attribute__((aligned(64)));
static volatile float sink;

static double now(void) {
	struct timespec t;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

static inline __m256 widen(const uint16_t *p) {
	return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

// clock returns the core's clock in GHz: 100 dependent adds an iteration.
static double clock_ghz(void) {
	long x = 0;
	double t0 = now();
	for (long n = 0; n < 2000000; n++) __asm__ volatile(".rept 100\n\tadd $1, %0\n\t.endr" : "+r"(x));
	double t = now() - t0;
	sink = (float)x;
	return 2e8 / t / 1e9;
}

// peak: twelve independent FMA chains, register operands only.
static double peak(void) {
	__m256 a[12], m = _mm256_set1_ps(0.999f), c = _mm256_set1_ps(1e-3f);
	for (int i = 0; i < 12; i++) a[i] = _mm256_set1_ps((float)i);
	double t0 = now();
	for (long n = 0; n < (long)ITERS * K / 8; n++) {
		for (int i = 0; i < 12; i++) a[i] = _mm256_fmadd_ps(a[i], m, c);
		__asm__ volatile("" : "+x"(a[0]), "+x"(a[1]), "+x"(a[2]), "+x"(a[3]), "+x"(a[4]), "+x"(a[5]),
				 "+x"(a[6]), "+x"(a[7]), "+x"(a[8]), "+x"(a[9]), "+x"(a[10]), "+x"(a[11]));
	}
	double t = now() - t0;
	float s = 0;
	for (int i = 0; i < 12; i++) s += a[i][0];
	sink = s;
	return 12.0 * 16 * ITERS * (K / 8) / t / 1e9;
}

// tile runs the 4x3 tile over K: mode 0 f32 weights, 1 bf16 weights
// widened, 2 bf16 weights and bf16 activations both widened.
static inline __attribute__((always_inline)) double tile(int mode) {
	double t0 = now();
	float s = 0;
	for (long it = 0; it < ITERS; it++) {
		__m256 c[4][3];
		for (int i = 0; i < 4; i++)
			for (int j = 0; j < 3; j++) c[i][j] = _mm256_setzero_ps();
		for (int k = 0; k < K; k += 8) {
			__m256 w[3], x;
			for (int j = 0; j < 3; j++) w[j] = mode == 0 ? _mm256_load_ps(&wf[j][k]) : widen(&wb[j][k]);
			for (int i = 0; i < 4; i++) {
				x = mode == 2 ? widen(&xb[i][k]) : _mm256_load_ps(&xa[i][k]);
				for (int j = 0; j < 3; j++) c[i][j] = _mm256_fmadd_ps(x, w[j], c[i][j]);
			}
		}
		for (int i = 0; i < 4; i++)
			for (int j = 0; j < 3; j++) s += c[i][j][0];
	}
	double t = now() - t0;
	sink = s;
	return 2.0 * 12 * K * ITERS / t / 1e9;
}

int main(void) {
	for (int k = 0; k < K; k++) {
		for (int i = 0; i < 4; i++) xa[i][k] = 1e-3f * (k + i), xb[i][k] = 0x3f80 + (k & 7);
		for (int j = 0; j < 3; j++) wf[j][k] = 1e-3f * (k - j), wb[j][k] = 0x3f80 + (k & 3);
	}
	for (int r = 0; r < 2; r++) {
		double ghz = clock_ghz();
		printf("clock %.2f GHz: nominal FMA peak %.1f GFLOP/s (32 FLOP a cycle)\n", ghz, 32 * ghz);
		printf("12 FMA chains, register operands %.1f GFLOP/s\n", peak());
		printf("4x3 tile, f32 weights          %.1f GFLOP/s\n", tile(0));
		printf("4x3 tile, bf16 weights widened %.1f GFLOP/s\n", tile(1));
		printf("4x3 tile, bf16 weights and activations widened %.1f GFLOP/s\n", tile(2));
	}
	return 0;
}
