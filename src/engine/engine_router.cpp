// EngineRouter (engine.h): level 3's action, a CPU engine below the primary for new requests.
#include "engine/engine.h"

namespace ss::engine {

Route choose_route(const RouteSignals& s) {
  return s.has_fallback && s.primary_level >= 3 && s.fallback_level < 3 ? Route::Fallback : Route::Primary;
}

Route EngineRouter::route() const {
  RouteSignals s;
  s.has_fallback = fallback_ != nullptr;
  s.primary_level = primary_.stats().pressure_level;
  if (fallback_) s.fallback_level = fallback_->stats().pressure_level;
  return choose_route(s);
}

Expected<EngineRouter::Placed> EngineRouter::add_request(Request req, std::atomic<Engine*>* where) {
  Placed p;
  if (route() == Route::Fallback) {
    if (where) where->store(fallback_);
    auto id = fallback_->add_request(req);  // a copy: the primary takes it if the fallback refuses
    if (id.ok()) {
      fallback_requests_.fetch_add(1, std::memory_order_relaxed);
      p.engine = fallback_;
      p.id = *id;
      p.route = Route::Fallback;
      return p;
    }
  }
  if (where) where->store(&primary_);
  auto id = primary_.add_request(std::move(req));
  if (!id.ok()) return id.error();
  p.engine = &primary_;
  p.id = *id;
  return p;
}

}  // namespace ss::engine
