#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <algorithm>
#include <vector>
const int64_t n = 64 * 4096;
static double now() { return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
static double med(std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; }
int main() {
    std::vector<void*> keep;
    float* in = nullptr;
    for (int round = 0; round < 8; ++round) {
        if (round == 0 || round >= 4) {  // rounds 4-7: a new input buffer (new pages), the old one kept
            posix_memalign((void**)&in, 64, n * 4);
            for (int64_t i = 0; i < n; ++i) in[i] = (i % 13) - 6.f;
            keep.push_back(in);
            keep.push_back(malloc(4096 * (1 + round)));  // and the heap shifted
        }
        std::vector<double> ta, tb;
        for (int blk = 0; blk < 8; ++blk)
            for (int r = 0; r < 200; ++r) {
                double a = now();
                float *out, *t1, *t2;
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
        printf("%s round %d: A %.4f B %.4f ratio %.3f\n", round >= 4 ? "new in " : "same in", round, med(ta), med(tb), med(tb) / med(ta));
    }
}
