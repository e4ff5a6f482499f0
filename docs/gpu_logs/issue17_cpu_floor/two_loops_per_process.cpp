#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <algorithm>
#include <vector>
const int64_t n = 64 * 4096;
static double now() { return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
int main(int argc, char** argv) {
    int pad = argc > 1 ? atoi(argv[1]) : 0;
    void* junk = malloc(pad);  // shifts the heap
    float *in, *out, *t1, *t2;
    posix_memalign((void**)&in, 64, n * 4);
    for (int64_t i = 0; i < n; ++i) in[i] = (i % 13) - 6.f;
    std::vector<double> ta, tb;
    for (int blk = 0; blk < 8; ++blk) {
        for (int r = 0; r < 200; ++r) {
            double a = now();
            if (blk % 2 == 0) {
                posix_memalign((void**)&out, 64, n * 4);
                for (int64_t i = 0; i < n; ++i) { float v = in[i]; out[i] = (v > 0.f ? v : 0.f) * 1.5f + v; }
                free(out);
                ta.push_back(now() - a);
            } else {
                posix_memalign((void**)&t1, 64, n * 4);
                for (int64_t i = 0; i < n; ++i) t1[i] = in[i] > 0.f ? in[i] : 0.f;
                posix_memalign((void**)&t2, 64, n * 4);
                for (int64_t i = 0; i < n; ++i) t2[i] = t1[i] * 1.5f;
                posix_memalign((void**)&out, 64, n * 4);
                for (int64_t i = 0; i < n; ++i) out[i] = t2[i] + in[i];
                free(t1); free(t2); free(out);
                tb.push_back(now() - a);
            }
        }
    }
    std::sort(ta.begin(), ta.end()); std::sort(tb.begin(), tb.end());
    printf("pad %6d in %% 4096 = %4ld: A %.4f B %.4f ratio %.3f\n", pad, (long)((uintptr_t)in % 4096), ta[ta.size()/2], tb[tb.size()/2], tb[tb.size()/2] / ta[ta.size()/2]);
    (void)junk;
}
