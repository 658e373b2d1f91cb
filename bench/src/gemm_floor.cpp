// gemm_floor: the GEMM floor of a GPT training step on the CPU — every GEMM one step runs
// (recorded from the CPU kernels, attention's per-head products included), each shape
// timed alone on warm 64-byte-aligned buffers (as the CPU backend allocates) with
// dnnl_sgemm and a oneDNN matmul primitive as called, and with dnnl_sgemm in the plain
// layout (no transposes), dense and with rows padded apart; the fastest summed over the
// step's calls (the floor) — beside the step itself.
//
// A step here is what `loom train` runs: forward, cross entropy, backward, AdamW; no
// clipping, the CPU backend's GEMM setting as `loom train` would find it (LOOM_CPU_GEMM;
// auto relays out a large product's operands first, a transposed A into place and a B
// with rows a multiple of 2 KiB apart padded, only below AVX-512). The step time is the
// median of --steps timed steps after --warmup, alternating with as many steps run the
// other way (relayout against as called); a shape's time in the step is the median over
// --recorded steps,
// and alone the median of --reps runs of the step's calls of it. The report lists the
// shapes by time in the step, then the totals: the step, its GEMMs as run in it, and the
// floor. Products run inside a parallel region (attention's per-head ones) are timed on
// one thread and counted as sharing the threads.
//
// Usage: gemm_floor [--layers 4] [--width 256] [--heads 4] [--context 128] [--batch 8]
//                   [--vocab 65] [--steps 15] [--warmup 3] [--reps 30] [--threads 2]
//                   [--recorded 5] [--cold-reps 7]
//
// Cold: each shape's calls are also timed as called with the caches evicted before each
// call (a read of a buffer of twice the last-level cache, 32 MiB at least), so that the
// operands come from memory as the saved activations of a step larger than the cache do
// in its backward pass; calls made inside a parallel region are not timed cold (their
// operands are one head's, which the step has just written). A shape's cold floor is
// capped at its time in the step. The report gives the floor and the step's ratio both
// ways.
#include <dnnl.h>
#include <omp.h>

#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dnnl.hpp>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "autograd/functions.h"
#include "backends/cpu/cpu_backend.h"
#include "core/error.h"
#include "nn/gpt.h"
#include "optim/adamw.h"

namespace {

using namespace loom;
namespace ag = loom::autograd;
using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

struct Options {
  std::int64_t layers = 4, width = 256, heads = 4, context = 128, batch = 8, vocab = 65;
  int steps = 15, warmup = 3, reps = 30, threads = 2, recorded = 5;
  int cold_reps = 7;  // runs of a shape's calls with the caches evicted before each call
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    check(i + 1 < argc, "gemm_floor: " + flag + " needs a value");
    const long long v = std::atoll(argv[++i]);
    check(v > 0, "gemm_floor: " + flag + " = '" + argv[i] + "', expected a positive integer");
    if (flag == "--layers")
      o.layers = v;
    else if (flag == "--width")
      o.width = v;
    else if (flag == "--heads")
      o.heads = v;
    else if (flag == "--context")
      o.context = v;
    else if (flag == "--batch")
      o.batch = v;
    else if (flag == "--vocab")
      o.vocab = v;
    else if (flag == "--steps")
      o.steps = static_cast<int>(v);
    else if (flag == "--warmup")
      o.warmup = static_cast<int>(v);
    else if (flag == "--reps")
      o.reps = static_cast<int>(v);
    else if (flag == "--threads")
      o.threads = static_cast<int>(v);
    else if (flag == "--recorded")
      o.recorded = static_cast<int>(v);
    else if (flag == "--cold-reps")
      o.cold_reps = static_cast<int>(v);
    else
      throw Error("gemm_floor: unknown flag " + flag);
  }
  return o;
}

// The shape of a call, without how it ran: the key of the table.
using Key = std::tuple<bool, bool, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                       std::int64_t, std::int64_t, float, float, bool>;
Key key_of(const cpu::GemmRecord& r) {
  return {r.trans_a, r.trans_b, r.m, r.n, r.k, r.lda, r.ldb, r.ldc, r.alpha, r.beta, r.in_parallel};
}

// A float buffer aligned as the CPU backend aligns its tensors (64 bytes): oneDNN's speed
// on some shapes depends on where B's rows fall in the cache sets, so timing a shape on
// buffers placed differently from the step's would time a different product.
class AlignedFloats {
 public:
  explicit AlignedFloats(std::size_t n) : storage_(n + 16) {
    const auto address = reinterpret_cast<std::uintptr_t>(storage_.data());
    data_ = storage_.data() + (64 - address % 64) % 64 / sizeof(float);
  }
  float* data() { return data_; }

 private:
  std::vector<float> storage_;
  float* data_;
};

// How a shape is laid out when timed alone: as the step called it; with both operands
// as op() reads them (no transpose); and that with every row padded by 16 floats (one
// cache line), so that no two rows are a multiple of 2 KiB apart.
enum class Layout { as_called, plain, plain_padded };

// The step's `calls` calls of the shape alone, `reps` times on warm buffers: the median
// seconds of all of them, by dnnl_sgemm (primitive = false) or a matmul primitive created
// once. Calls the step made inside a parallel region (attention's per-head products) run
// as there: spread over the threads, each thread on buffers of its own.
double time_alone(const Key& key, int calls, bool primitive, Layout layout, int reps, int threads) {
  auto [ta, tb, m, n, k, lda, ldb, ldc, alpha, beta, in_parallel] = key;
  if (layout != Layout::as_called) {  // the same product with both operands as op() reads them
    const std::int64_t pad = layout == Layout::plain_padded ? 16 : 0;
    ta = tb = false;
    lda = k + pad;
    ldb = n + pad;
    ldc = n + pad;
  }
  const int copies = in_parallel ? threads : 1;
  std::vector<AlignedFloats> as, bs, cs;
  for (int t = 0; t < copies; ++t) {
    const std::size_t a_size = static_cast<std::size_t>((ta ? k : m) * lda),
                      b_size = static_cast<std::size_t>((tb ? n : k) * ldb);
    as.emplace_back(a_size);
    bs.emplace_back(b_size);
    cs.emplace_back(static_cast<std::size_t>(m * ldc));
    for (std::size_t i = 0; i < a_size; ++i)
      as[t].data()[i] = static_cast<float>(i % 13) * 0.01f;
    for (std::size_t i = 0; i < b_size; ++i)
      bs[t].data()[i] = static_cast<float>(i % 7) * 0.02f;
    std::fill(cs[t].data(), cs[t].data() + m * ldc, 0.0f);
  }
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  using dt = dnnl::memory::data_type;
  using dims = dnnl::memory::dims;
  dnnl::memory::desc a_md({m, k}, dt::f32, ta ? dims{1, lda} : dims{lda, 1});
  dnnl::memory::desc b_md({k, n}, dt::f32, tb ? dims{1, ldb} : dims{ldb, 1});
  dnnl::memory::desc c_md({m, n}, dt::f32, {ldc, 1});
  dnnl::primitive_attr attr;
  if (alpha != 1.0f)
    attr.set_output_scales(0, {alpha});
  if (beta != 0.0f) {
    dnnl::post_ops ops;
    ops.append_sum(beta);
    attr.set_post_ops(ops);
  }
  dnnl::matmul product(
      dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, c_md), attr, engine));
  std::vector<dnnl::stream> streams;
  for (int t = 0; t < copies; ++t)
    streams.emplace_back(engine);
  auto once = [&](int t) {
    float *a = as[t].data(), *b = bs[t].data(), *c = cs[t].data();
    if (primitive) {
      dnnl::memory am(a_md, engine, a), bm(b_md, engine, b), cm(c_md, engine, c);
      product.execute(streams[t], {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
      streams[t].wait();
    } else {
      dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    }
  };
  std::vector<double> times;
  for (int r = 0; r < reps + 2; ++r) {
    auto start = Clock::now();
    if (in_parallel) {
#pragma omp parallel for schedule(static) num_threads(threads)
      for (int i = 0; i < calls; ++i)
        once(omp_get_thread_num());
    } else {
      for (int i = 0; i < calls; ++i)
        once(0);
    }
    if (r >= 2)
      times.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  return median(times);
}

// Reads a buffer of twice the last-level cache (32 MiB at least), so that whatever was
// cached before comes from memory next. A read, not a write: evicting with stores would
// leave dirty lines whose write-back the timed call would pay.
void evict_caches() {
  static const std::vector<std::uint64_t> buffer = [] {
    const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
    const std::size_t bytes =
        std::max<std::size_t>(32u << 20, l3 > 0 ? 2 * static_cast<std::size_t>(l3) : 0);
    std::vector<std::uint64_t> words(bytes / sizeof(std::uint64_t));
    for (std::size_t i = 0; i < words.size(); ++i)
      words[i] = i;
    return words;
  }();
  static volatile std::uint64_t sink = 0;
  std::uint64_t sum = 0;
  for (std::size_t i = 0; i < buffer.size(); i += 8)  // one word per 64-byte line
    sum += buffer[i];
  sink = sink + sum;
}

// The step's `calls` calls of the shape as called (dnnl_sgemm), each after evicting the
// caches: the median over `reps` runs of the summed call times (eviction not timed).
double time_cold(const Key& key, int calls, int reps) {
  const auto [ta, tb, m, n, k, lda, ldb, ldc, alpha, beta, in_parallel] = key;
  const std::size_t a_size = static_cast<std::size_t>((ta ? k : m) * lda),
                    b_size = static_cast<std::size_t>((tb ? n : k) * ldb),
                    c_size = static_cast<std::size_t>(m * ldc);
  // One set of operands per call, as the step's calls each read operands of their own.
  std::vector<AlignedFloats> as, bs, cs;
  for (int i = 0; i < calls; ++i) {
    as.emplace_back(a_size);
    bs.emplace_back(b_size);
    cs.emplace_back(c_size);
    std::fill(as.back().data(), as.back().data() + a_size, 0.01f);
    std::fill(bs.back().data(), bs.back().data() + b_size, 0.02f);
    std::fill(cs.back().data(), cs.back().data() + c_size, 0.0f);
  }
  std::vector<double> times;
  for (int r = 0; r < reps; ++r) {
    double total = 0;
    for (int i = 0; i < calls; ++i) {
      evict_caches();
      const auto start = Clock::now();
      dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, alpha, as[i].data(), lda, bs[i].data(),
                 ldb, beta, cs[i].data(), ldc);
      total += std::chrono::duration<double>(Clock::now() - start).count();
    }
    times.push_back(total);
  }
  return median(times);
}

// What the CPU backend did to a shape's operands before its calls in the step.
std::string relayout_label(int transposed, int padded, int calls) {
  auto part = [calls](int count, const char* what) -> std::string {
    if (count == 0)
      return "";
    return count == calls ? what : std::string(what) + " (" + std::to_string(count) + " calls)";
  };
  std::string a = part(transposed, "A transposed"), b = part(padded, "B padded");
  if (a.empty() && b.empty())
    return "as called";
  return (a.empty() ? b : b.empty() ? a : a + ", " + b) + " first";
}

}  // namespace

int main(int argc, char** argv) try {
  const Options o = parse(argc, argv);
  cpu::set_num_threads(o.threads);
  Backend& device = cpu::backend();
  nn::Gpt gpt({o.vocab, o.context, o.layers, o.heads, o.width, 0.0}, 1, device);
  optim::AdamW optimizer(gpt.parameters(), {0.9, 0.999, 1e-8, 0.01});
  nn::Rng rng(3);
  auto batch = [&] {
    std::vector<std::int32_t> ids(static_cast<std::size_t>(o.batch * o.context)), next(ids.size());
    for (std::size_t i = 0; i < ids.size(); ++i) {
      ids[i] = static_cast<std::int32_t>(rng.next() % static_cast<std::uint64_t>(o.vocab));
      next[i] = static_cast<std::int32_t>(rng.next() % static_cast<std::uint64_t>(o.vocab));
    }
    return std::pair{Tensor::from_ints({o.batch, o.context}, ids, device),
                     Tensor::from_ints({o.batch * o.context}, next, device)};
  };
  auto step = [&] {
    auto [x, y] = batch();
    ag::Tape tape;
    ag::Var loss = ag::cross_entropy(tape, gpt.forward(tape, x, nn::ForwardOptions{true, 0}), y);
    tape.backward(loss);
    optimizer.step(1e-4);
    optimizer.zero_grad();
    return loss.value().item();
  };
  // Steps alternate between the backend's setting (what `loom train` runs) and the other
  // way (operands laid out first against every product as called), so that the comparison
  // shares the machine's drift.
  const bool relayout = cpu::gemm_transpose();
  std::vector<double> step_times, other_times;
  for (int s = 0; s < 2 * (o.warmup + o.steps); ++s) {
    const bool other = s % 2 == 1;
    cpu::set_gemm_transpose(other ? !relayout : relayout);
    auto start = Clock::now();
    step();
    if (s >= 2 * o.warmup)
      (other ? other_times : step_times)
          .push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  // The GEMMs of --recorded steps, each shape's time in the step the median over them: one
  // step's timings of a shape move by 30% or more from step to step on a shared machine.
  cpu::set_gemm_transpose(relayout);
  struct Row {
    int calls = 0;  // per step
    std::vector<double> step_seconds;
    int transposed = 0;  // calls that transposed A into place first, per step
    int padded = 0;      // calls that padded B's rows first, per step
    double in_step = 0;  // median over the recorded steps
  };
  std::map<Key, Row> rows;
  std::size_t calls_per_step = 0;
  for (int s = 0; s < o.recorded; ++s) {
    std::vector<cpu::GemmRecord> records;
    cpu::record_gemms(&records);
    step();
    cpu::record_gemms(nullptr);
    calls_per_step = records.size();
    std::map<Key, double> seconds;
    for (const cpu::GemmRecord& r : records) {
      seconds[key_of(r)] += r.seconds;
      if (s == 0) {
        Row& row = rows[key_of(r)];
        ++row.calls;
        row.transposed += r.a_transposed ? 1 : 0;
        row.padded += r.b_padded ? 1 : 0;
      }
    }
    for (auto& [key, row] : rows)
      row.step_seconds.push_back(seconds[key]);
  }
  for (auto& [key, row] : rows)
    row.in_step = median(row.step_seconds);
  std::vector<std::pair<Key, Row>> ordered(rows.begin(), rows.end());
  std::sort(ordered.begin(), ordered.end(),
            [](const auto& a, const auto& b) { return a.second.in_step > b.second.in_step; });

  std::printf(
      "gemm_floor: GPT L%lld d%lld h%lld T%lld B%lld V%lld, %d threads, %zu GEMM calls per "
      "step\n\n",
      static_cast<long long>(o.layers), static_cast<long long>(o.width),
      static_cast<long long>(o.heads), static_cast<long long>(o.context),
      static_cast<long long>(o.batch), static_cast<long long>(o.vocab), o.threads, calls_per_step);
  std::printf(
      "| op(A) x op(B) | M | N | K | beta | calls | in the step | in step ms | sgemm ms | "
      "primitive ms | plain layout ms | plain padded ms | sgemm cold ms | in step GFLOP/s | best "
      "alone GFLOP/s |\n");
  std::printf(
      "| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: "
      "| ---: | ---: |\n");
  double gemm_in_step = 0, floor = 0, as_called = 0, cold_floor = 0;
  for (const auto& [key, row] : ordered) {
    const auto [ta, tb, m, n, k, lda, ldb, ldc, alpha, beta, in_parallel] = key;
    // Seconds for all of the step's calls of the shape. Calls made inside a parallel region
    // ran `threads` at a time: their wall time in the step is their thread time shared.
    const double in_step = row.in_step * (in_parallel ? 1.0 / o.threads : 1.0);
    // Alone: dnnl_sgemm and a oneDNN matmul primitive as called, and dnnl_sgemm on the
    // same product with both operands laid out as op() reads them (no transpose), rows
    // as dense as possible and padded.
    const double sg = time_alone(key, row.calls, false, Layout::as_called, o.reps, o.threads),
                 pr = time_alone(key, row.calls, true, Layout::as_called, o.reps, o.threads),
                 plain = ta || tb || lda != k || ldb != n || ldc != n
                             ? time_alone(key, row.calls, false, Layout::plain, o.reps, o.threads)
                             : sg,  // already laid out plainly: the same call as sg's
        padded = time_alone(key, row.calls, false, Layout::plain_padded, o.reps, o.threads);
    const double flops =
        2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) * row.calls;
    gemm_in_step += in_step;
    as_called += sg;
    // A shape's floor: the fastest way seen to run its calls, in any layout, the step's own
    // included (tiny products run alone pay overheads that the step amortises).
    const double best = std::min({sg, pr, plain, padded});
    floor += std::min(best, in_step);
    // Cold: the calls as called with operands from memory. A shape's cold floor is the
    // slower of that and its warm floor (faster cold than warm is noise), but never above
    // its time in the step, which the step has shown to be reachable (small products run
    // on operands the step has just written, which are warm); per-head calls, not timed
    // cold, count at their warm floor.
    const double cold = in_parallel ? -1.0 : time_cold(key, row.calls, o.cold_reps);
    const double warm_floor = std::min(best, in_step);
    cold_floor += in_parallel ? warm_floor : std::min(in_step, std::max(cold, warm_floor));
    char cold_text[32];
    std::snprintf(cold_text, sizeof cold_text, in_parallel ? "-" : "%.3f", cold * 1e3);
    std::printf(
        "| %s x %s%s | %lld | %lld | %lld | %g | %d | %s | %.3f | %.3f | %.3f | %.3f | %.3f | %s | "
        "%.0f | %.0f |\n",
        ta ? "A^T" : "A", tb ? "B^T" : "B", in_parallel ? " (per head, threads in parallel)" : "",
        static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(k),
        static_cast<double>(beta), row.calls,
        relayout_label(row.transposed, row.padded, row.calls).c_str(), in_step * 1e3, sg * 1e3,
        pr * 1e3, plain * 1e3, padded * 1e3, cold_text, flops / in_step * 1e-9,
        flops / best * 1e-9);
  }
  const double step_ms = median(step_times) * 1e3;
  std::printf(
      "\nstep (median of %d, %s) %.2f ms; its GEMMs as run in the step %.2f ms (%.0f%% of "
      "it); %s, steps in between: %.2f ms\n",
      o.steps,
      relayout ? "large products' operands laid out first (LOOM_CPU_GEMM: the backend's setting)"
               : "every product as called (LOOM_CPU_GEMM: the backend's setting)",
      step_ms, gemm_in_step * 1e3, 100 * gemm_in_step * 1e3 / step_ms,
      relayout ? "with every product as called" : "with large products' operands laid out first",
      median(other_times) * 1e3);
  std::printf(
      "the same GEMMs alone: dnnl_sgemm as called %.2f ms; the fastest per shape in any layout, "
      "the step's own included (the GEMM floor) %.2f ms\n",
      as_called * 1e3, floor * 1e3);
  std::printf("step / GEMM floor: %.3fx\n", step_ms / (floor * 1e3));
  std::printf(
      "the floor with operands from memory (each call timed after evicting the caches, per-head "
      "calls warm) %.2f ms; step / that floor: %.3fx; the step's GEMMs as run in it / that floor: "
      "%.3fx\n",
      cold_floor * 1e3, step_ms / (cold_floor * 1e3), gemm_in_step / cold_floor);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "gemm_floor: %s\n", e.what());
  return 1;
}
