#include "engine/request.h"

namespace ss::engine {

void EventQueue::push(TokenEvent e) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    q_.push_back(std::move(e));
  }
  cv_.notify_one();
}

bool EventQueue::try_pop(TokenEvent& e) {
  std::lock_guard<std::mutex> lk(mu_);
  if (q_.empty()) return false;
  e = std::move(q_.front());
  q_.pop_front();
  return true;
}

bool EventQueue::pop(TokenEvent& e, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lk(mu_);
  if (!cv_.wait_for(lk, timeout, [&] { return !q_.empty(); })) return false;
  e = std::move(q_.front());
  q_.pop_front();
  return true;
}

EventCallback EventQueue::sink(std::shared_ptr<EventQueue> q) {
  return [q = std::move(q)](const TokenEvent& e) { q->push(e); };
}

}  // namespace ss::engine
