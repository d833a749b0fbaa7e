// SHA-256 of a file (OpenSSL EVP), streamed in chunks, as lowercase hex.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include "common/status.h"

namespace ss {

// progress(done_bytes, total_bytes) is called after each chunk, from the calling thread.
Expected<std::string> sha256_file(const std::string& path,
                                  const std::function<void(uint64_t, uint64_t)>& progress = {});

}  // namespace ss
