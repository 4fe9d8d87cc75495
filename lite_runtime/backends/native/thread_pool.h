// The kernels' threads (lite_kernels.cc): one pool for the process, shared by every kind of kernel.
#pragma once
#include <immintrin.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace lk {

// Worker threads made once for the process, sharing a call's work in chunks taken from a counter: the
// calling thread takes chunks too and never waits for a worker that has not started (on a machine whose
// cores are busy, a descheduled worker costs its chunk in flight at most, not its whole share).
// Between calls workers spin briefly (a decode step calls a linear layer every few tens of
// microseconds), then sleep. One call at a time: a caller finding the pool busy runs its work alone.
class Pool {
 public:
  // Longer idle spins would take the core from Lite's own threads, which run the ops in between.
  static constexpr int kSpinMicroseconds = 100;

  static Pool &Get() {
    static Pool *pool = new Pool();   // never destroyed: workers may outlive static destruction
    return *pool;
  }

  // Runs task(c) for every c in [0, chunks) on up to `threads` threads.
  void Run(int threads, int64_t chunks, const std::function<void(int64_t)> &task) {
    std::unique_lock<std::mutex> busy(run_mutex_, std::try_to_lock);
    if (threads <= 1 || chunks <= 1 || !busy.owns_lock()) {
      for (int64_t c = 0; c < chunks; ++c) task(c);
      return;
    }
    Grow(threads - 1);
    Job job{&task, chunks};
    job_.store(&job, std::memory_order_seq_cst);
    generation_.fetch_add(1, std::memory_order_seq_cst);
    if (sleeping_.load(std::memory_order_seq_cst) > 0) {
      std::lock_guard<std::mutex> lock(mutex_);
      wake_.notify_all();
    }
    job.Take();
    for (int spin = 0; job.done.load(std::memory_order_acquire) < chunks; ++spin) {
      if (spin < 64) _mm_pause(); else std::this_thread::yield();   // a chunk in flight on a preempted worker
    }
    job_.store(nullptr, std::memory_order_seq_cst);
    while (inside_.load(std::memory_order_seq_cst) > 0) _mm_pause();   // a worker still looking at `job`
  }

 private:
  struct Job {
    const std::function<void(int64_t)> *task;
    int64_t chunks;
    std::atomic<int64_t> next{0}, done{0};
    void Take() {
      for (int64_t c; (c = next.fetch_add(1, std::memory_order_relaxed)) < chunks;) {
        (*task)(c);
        done.fetch_add(1, std::memory_order_release);
      }
    }
  };

  void Grow(int workers) {
    while (static_cast<int>(threads_.size()) < workers) {
      uint64_t seen = generation_.load();
      threads_.emplace_back([this, seen] { Work(seen); });
      threads_.back().detach();
    }
  }

  void Work(uint64_t seen) {
    for (;;) {
      uint64_t now = generation_.load(std::memory_order_acquire);
      const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(kSpinMicroseconds);
      for (int spin = 1; now == seen; ++spin) {
        _mm_pause();
        now = generation_.load(std::memory_order_acquire);
        if (spin % 64 == 0 && std::chrono::steady_clock::now() > until) break;
      }
      if (now == seen) {
        std::unique_lock<std::mutex> lock(mutex_);
        sleeping_.fetch_add(1, std::memory_order_seq_cst);
        wake_.wait(lock, [&] { return (now = generation_.load(std::memory_order_seq_cst)) != seen; });
        sleeping_.fetch_sub(1, std::memory_order_relaxed);
      }
      seen = now;
      inside_.fetch_add(1, std::memory_order_seq_cst);
      if (Job *job = job_.load(std::memory_order_seq_cst)) job->Take();
      inside_.fetch_sub(1, std::memory_order_seq_cst);
    }
  }

  std::mutex run_mutex_, mutex_;
  std::condition_variable wake_;
  std::vector<std::thread> threads_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> sleeping_{0}, inside_{0};
  std::atomic<Job *> job_{nullptr};
};

}  // namespace lk
