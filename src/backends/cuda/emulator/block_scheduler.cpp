#include "backends/cuda/emulator/block_scheduler.h"

#include <algorithm>
#include <exception>
#include <memory>
#include <vector>

#include "core/error.h"

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

#if defined(__SANITIZE_ADDRESS__)
#define LOOM_EMULATOR_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define LOOM_EMULATOR_ASAN 1
#endif
#endif
#ifdef LOOM_EMULATOR_ASAN
#include <sanitizer/common_interface_defs.h>
#endif

namespace loom::cuda::emulator {
namespace {

// AddressSanitizer must be told when execution moves to another stack (fiber switch
// annotations); elsewhere these are no-ops.
void start_switch(void** fake_stack_save, const void* bottom, std::size_t size) {
#ifdef LOOM_EMULATOR_ASAN
  __sanitizer_start_switch_fiber(fake_stack_save, bottom, size);
#else
  (void)fake_stack_save, (void)bottom, (void)size;
#endif
}
void finish_switch(void* fake_stack_save, const void** bottom_old, std::size_t* size_old) {
#ifdef LOOM_EMULATOR_ASAN
  __sanitizer_finish_switch_fiber(fake_stack_save, bottom_old, size_old);
#else
  (void)fake_stack_save, (void)bottom_old, (void)size_old;
#endif
}

#ifdef LOOM_EMULATOR_ASAN
constexpr std::size_t kStackBytes = 256 * 1024;  // instrumented frames are larger
#else
constexpr std::size_t kStackBytes = 64 * 1024;
#endif

// ---- contexts: a suspended thread of execution and the switch between two ----------------
// On x86-64 a switch saves the callee-saved registers on the old stack and swaps stack
// pointers: no system call, unlike swapcontext, which also saves the signal mask (15x
// slower here). The floating-point control words are not switched: kernels never change
// them, and saving them serialises the pipeline. Elsewhere, ucontext.
#if defined(__x86_64__)
struct Context {
  void* stack_pointer = nullptr;
};
}  // namespace
}  // namespace loom::cuda::emulator

extern "C" void loom_emulator_switch(void** save_stack_pointer, void* next_stack_pointer);
asm(R"(
.text
.globl loom_emulator_switch
.hidden loom_emulator_switch
.type loom_emulator_switch, @function
loom_emulator_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
.size loom_emulator_switch, .-loom_emulator_switch
)");

namespace loom::cuda::emulator {
namespace {

// A context that starts `entry` on `stack`: the frame loom_emulator_switch pops, whose
// return address is `entry` (entered with the stack aligned as after a call; it never
// returns, it switches away for the last time).
void make_context(Context& context, std::byte* stack, std::size_t bytes, void (*entry)()) {
  auto top = (reinterpret_cast<std::uintptr_t>(stack) + bytes) & ~std::uintptr_t{15};
  auto* slots = reinterpret_cast<std::uint64_t*>(top);
  slots[-1] = 0;                                       // entry's own return address: none
  slots[-2] = reinterpret_cast<std::uint64_t>(entry);  // where the first switch returns
  for (int r = 3; r <= 8; ++r)
    slots[-r] = 0;  // rbp, rbx, r12-r15
  context.stack_pointer = &slots[-8];
}
void switch_context(Context& from, Context& to) {
  loom_emulator_switch(&from.stack_pointer, to.stack_pointer);
}
#else
struct Context {
  ucontext_t state{};
};
void make_context(Context& context, std::byte* stack, std::size_t bytes, void (*entry)()) {
  getcontext(&context.state);
  context.state.uc_stack.ss_sp = stack;
  context.state.uc_stack.ss_size = bytes;
  context.state.uc_link = nullptr;
  makecontext(&context.state, entry, 0);
}
void switch_context(Context& from, Context& to) {
  swapcontext(&from.state, &to.state);
}
#endif

enum class Wait { not_started, running, barrier, shuffle, done };

struct Fiber {
  Context context;
  ThreadState state;
  Wait wait = Wait::not_started;
  std::uint64_t barriers = 0, shuffles = 0;  // synchronisation points passed so far
  std::exception_ptr error;
};

// One block in flight on this OS thread. Fiber stacks are kept and reused across blocks
// and launches.
struct BlockRun {
  std::vector<Fiber> fibers;
  std::vector<std::unique_ptr<std::byte[]>> stacks;
  std::vector<std::uint64_t> exchange[2];  // shuffle values, double-buffered by parity
  std::vector<unsigned> queue;             // threads to resume, in order
  std::vector<unsigned> warp_arrivals;     // per warp: lanes waiting in the current shuffle
  Context scheduler;
  const void* scheduler_stack = nullptr;  // learnt from ASan's switch annotations
  std::size_t scheduler_stack_size = 0;
  const std::function<void()>* body = nullptr;
  Fiber* running = nullptr;
};

thread_local BlockRun* active_block = nullptr;
thread_local const ThreadState* active_state = nullptr;
thread_local bool direct_mode = false;  // threads run as plain calls, without fibers
thread_local const std::string* active_kernel = nullptr;

// Raised when a kernel launched without fibers reaches a synchronisation point.
[[noreturn]] void needs_fibers() {
  throw Error("cuda emulator: kernel '" + *active_kernel +
              "' synchronised its threads in a launch run without fibers (its first launch "
              "never did); the emulator cannot give this launch a correct result");
}

void yield_to_scheduler(Fiber& fiber) {
  BlockRun& block = *active_block;
  void* fake_stack = nullptr;
  start_switch(&fake_stack, block.scheduler_stack, block.scheduler_stack_size);
  switch_context(fiber.context, block.scheduler);
  finish_switch(fake_stack, &block.scheduler_stack, &block.scheduler_stack_size);
  active_state = &fiber.state;
}

void fiber_entry() {
  BlockRun& block = *active_block;
  finish_switch(nullptr, &block.scheduler_stack, &block.scheduler_stack_size);
  Fiber& fiber = *block.running;
  try {
    (*block.body)();
  } catch (...) {
    fiber.error = std::current_exception();
  }
  fiber.wait = Wait::done;
  start_switch(nullptr, block.scheduler_stack, block.scheduler_stack_size);  // this fiber ends
  switch_context(fiber.context, block.scheduler);
}

std::string where(const std::string& kernel, const ThreadState& s) {
  return "cuda emulator: kernel '" + kernel + "', block (" + std::to_string(s.block_idx.x) + "," +
         std::to_string(s.block_idx.y) + "," + std::to_string(s.block_idx.z) + ")";
}

void resume(BlockRun& block, Fiber& fiber, std::size_t index) {
  block.running = &fiber;
  active_state = &fiber.state;
  if (fiber.wait == Wait::not_started)
    make_context(fiber.context, block.stacks[index].get(), kStackBytes, fiber_entry);
  fiber.wait = Wait::running;
  void* fake_stack = nullptr;
  start_switch(&fake_stack, block.stacks[index].get(), kStackBytes);
  switch_context(block.scheduler, fiber.context);
  finish_switch(fake_stack, nullptr, nullptr);
}

// Runs one block's threads to completion; returns whether any of them synchronised.
// Threads run from a queue, each until its next synchronisation point. A barrier releases
// its waiters once every live thread has arrived; a warp shuffle releases its 32 lanes
// once all of them have arrived. An empty queue with live threads is a deadlock.
bool run_block_with_fibers(const std::string& kernel, BlockRun& block, unsigned threads) {
  bool synchronised = false;
  std::size_t alive = threads, at_barrier = 0;
  std::vector<unsigned>& queue = block.queue;
  queue.clear();
  for (unsigned t = 0; t < threads; ++t)
    queue.push_back(t);
  std::vector<unsigned>& at_shuffle = block.warp_arrivals;  // lanes of each warp arrived
  at_shuffle.assign((threads + 31) / 32, 0);
  auto release_barrier = [&] {
    const Fiber* first = nullptr;
    for (unsigned t = 0; t < threads; ++t) {
      const Fiber& f = block.fibers[t];
      if (f.wait != Wait::barrier)
        continue;
      if (first != nullptr && f.barriers != first->barriers)
        throw Error(where(kernel, f.state) + ": threads meet at different __syncthreads calls");
      first = first ? first : &f;
      queue.push_back(t);
    }
    at_barrier = 0;
  };
  for (std::size_t next = 0; alive > 0; ++next) {
    if (next == queue.size())
      throw Error(where(kernel, block.fibers[0].state) +
                  ": deadlock (threads wait at __syncthreads while others wait in a warp "
                  "shuffle, or a shuffle's lanes wait at different shuffles)");
    const unsigned t = queue[next];
    Fiber& f = block.fibers[t];
    resume(block, f, t);
    if (f.error)
      std::rethrow_exception(f.error);
    const unsigned warp = t / 32, first_lane = warp * 32;
    switch (f.wait) {
      case Wait::done:
        --alive;
        if (at_shuffle[warp] > 0)
          throw Error(where(kernel, f.state) + ": lane " + std::to_string(t - first_lane) +
                      " exited while its warp waits in a full-warp shuffle");
        if (at_barrier > 0 && at_barrier == alive)
          release_barrier();
        break;
      case Wait::barrier:
        synchronised = true;
        if (++at_barrier == alive)
          release_barrier();
        break;
      case Wait::shuffle: {
        synchronised = true;
        if (first_lane + 32 > threads)
          throw Error(where(kernel, f.state) + ": a warp shuffle in a partial warp (" +
                      std::to_string(threads) + " threads per block)");
        if (++at_shuffle[warp] < 32)
          break;
        for (unsigned lane = first_lane; lane < first_lane + 32; ++lane) {
          const Fiber& other = block.fibers[lane];
          if (other.wait != Wait::shuffle || other.shuffles != f.shuffles)
            throw Error(where(kernel, other.state) +
                        ": the lanes of a warp meet at different "
                        "shuffles, or one exited");
          queue.push_back(lane);
        }
        at_shuffle[warp] = 0;
        break;
      }
      default:
        throw Error(where(kernel, f.state) + ": a thread stopped outside a synchronisation point");
    }
  }
  return synchronised;
}

}  // namespace

const ThreadState& current_thread() {
  return *active_state;
}

void sync_threads() {
  if (direct_mode)
    needs_fibers();
  Fiber& fiber = *active_block->running;
  fiber.wait = Wait::barrier;
  ++fiber.barriers;
  yield_to_scheduler(fiber);
}

std::uint64_t shuffle_xor(unsigned mask, std::uint64_t bits, int lane_mask) {
  if (direct_mode)
    needs_fibers();
  BlockRun& block = *active_block;
  Fiber& fiber = *block.running;
  if (mask != 0xffffffffu)
    throw Error(where(*active_kernel, fiber.state) +
                ": the emulator supports full-warp shuffles only (mask 0xffffffff)");
  const unsigned self = fiber.state.linear;
  const unsigned partner = (self & ~31u) | ((self & 31u) ^ static_cast<unsigned>(lane_mask & 31));
  auto& slots = block.exchange[fiber.shuffles & 1];
  slots[self] = bits;
  fiber.wait = Wait::shuffle;
  ++fiber.shuffles;
  yield_to_scheduler(fiber);
  return slots[partner];
}

void run_grid(const std::string& kernel, Dim3 grid, Dim3 block_dim,
              const std::function<void()>& body, KernelProfile& profile) {
  const unsigned threads = block_dim.count();
  active_kernel = &kernel;
  auto state_of = [&](unsigned bx, unsigned by, unsigned bz, unsigned t) {
    ThreadState s;
    s.grid_dim = grid;
    s.block_dim = block_dim;
    s.block_idx = {bx, by, bz};
    s.thread_idx = {t % block_dim.x, t / block_dim.x % block_dim.y,
                    t / (block_dim.x * block_dim.y)};
    s.linear = t;
    return s;
  };
  if (profile.launched && !profile.synchronises) {
    direct_mode = true;
    try {
      for (unsigned bz = 0; bz < grid.z; ++bz)
        for (unsigned by = 0; by < grid.y; ++by)
          for (unsigned bx = 0; bx < grid.x; ++bx)
            for (unsigned t = 0; t < threads; ++t) {
              ThreadState s = state_of(bx, by, bz, t);
              active_state = &s;
              body();
            }
    } catch (...) {
      direct_mode = false;
      throw;
    }
    direct_mode = false;
    return;
  }
  thread_local BlockRun block;  // this OS thread's fibers, kept between launches
  if (active_block != nullptr)
    throw Error("cuda emulator: kernel '" + kernel + "' launched from inside a kernel");
  while (block.stacks.size() < threads)
    block.stacks.push_back(std::make_unique<std::byte[]>(kStackBytes));
  block.fibers.assign(threads, Fiber{});
  block.exchange[0].assign(threads, 0);
  block.exchange[1].assign(threads, 0);
  block.body = &body;
  active_block = &block;
  bool synchronised = false;
  try {
    for (unsigned bz = 0; bz < grid.z; ++bz)
      for (unsigned by = 0; by < grid.y; ++by)
        for (unsigned bx = 0; bx < grid.x; ++bx) {
          for (unsigned t = 0; t < threads; ++t) {
            block.fibers[t] = Fiber{};
            block.fibers[t].state = state_of(bx, by, bz, t);
          }
          synchronised = run_block_with_fibers(kernel, block, threads) || synchronised;
        }
  } catch (...) {
    active_block = nullptr;
    throw;
  }
  active_block = nullptr;
  profile.launched = true;
  profile.synchronises = profile.synchronises || synchronised;
}

}  // namespace loom::cuda::emulator
