// EngineRouter (engine.h): level 3's action, a CPU engine below the primary for new requests.
#include "engine/engine.h"

namespace ss::engine {

Route choose_route(const RouteSignals& s) {
  const bool seat = s.fallback_seats <= 0 || s.fallback_live < s.fallback_seats;
  return s.has_fallback && s.primary_level >= 3 && s.fallback_level < 3 && seat ? Route::Fallback : Route::Primary;
}

Route EngineRouter::route() const {
  RouteSignals s;
  s.has_fallback = fallback_ != nullptr;
  s.primary_level = primary_.stats().pressure_level;
  if (fallback_) {
    s.fallback_level = fallback_->stats().pressure_level;
    s.fallback_live = fallback_live_->load(std::memory_order_relaxed);
    s.fallback_seats = fallback_seats_;
  }
  return choose_route(s);
}

Expected<EngineRouter::Placed> EngineRouter::add_request(Request req, std::atomic<Engine*>* where) {
  Placed p;
  // The fallback's seat is taken (compare-and-swap: two callers never take the last one both)
  // before the request is queued, and given back by its finishing event.
  auto take_seat = [&] {
    int live = fallback_live_->load(std::memory_order_relaxed);
    while (fallback_seats_ <= 0 || live < fallback_seats_)
      if (fallback_live_->compare_exchange_weak(live, live + 1, std::memory_order_relaxed)) return true;
    return false;
  };
  if (route() == Route::Fallback && take_seat()) {
    Request fr = req;  // a copy: the primary takes the original if the fallback refuses
    fr.on_event = [inner = std::move(fr.on_event), live = fallback_live_](const TokenEvent& e) {
      if (inner) inner(e);
      if (e.finish != FinishReason::None) live->fetch_sub(1, std::memory_order_relaxed);
    };
    if (where) where->store(fallback_);
    auto id = fallback_->add_request(std::move(fr));
    if (id.ok()) {
      fallback_requests_.fetch_add(1, std::memory_order_relaxed);
      p.engine = fallback_;
      p.id = *id;
      p.route = Route::Fallback;
      return p;
    }
    fallback_live_->fetch_sub(1, std::memory_order_relaxed);
  }
  if (where) where->store(&primary_);
  auto id = primary_.add_request(std::move(req));
  if (!id.ok()) return id.error();
  p.engine = &primary_;
  p.id = *id;
  return p;
}

}  // namespace ss::engine
