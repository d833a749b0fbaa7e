// libFuzzer target: GGUF bytes -> parse, metadata getters, config, tensor binding, value checks.
// The readers work on memory, so no temp file is needed.
#include <cstddef>
#include <cstdint>

#include "model/gguf.h"
#include "model/loader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ss::model;
  auto g = gguf::parse(data, size, "fuzz.gguf");
  if (!g) return 0;
  (void)tokenizer_spec_from_gguf(*g);  // every tokenizer.ggml.* getter
  Model m;
  LoadOptions opts;
  opts.load_tokenizer = false;
  opts.check_values = true;
  (void)build_from_gguf(m, *g, data, opts);
  return 0;
}
