// A read-only memory mapping of a whole file (private to the model folder). Weights are views into
// it, so the Model keeps it alive; nothing is copied.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"

namespace ss::model {

class MappedFile {
 public:
  static Expected<std::unique_ptr<MappedFile>> open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Drops this process's copy of the whole pages inside [p, p + n) (which must lie in the mapping):
  // the data stays readable (pages fault back in from the file), resident memory shrinks. For data
  // used once, e.g. weights a backend has copied into another layout.
  void release(const void* p, size_t n) const;

 private:
  MappedFile() = default;
  std::string path_;
  const uint8_t* data_ = nullptr;  // null for an empty file
  size_t size_ = 0;
};

// A small text file (config.json, tokenizer_config.json) read whole.
Expected<std::string> read_text_file(const std::string& path);

}  // namespace ss::model
