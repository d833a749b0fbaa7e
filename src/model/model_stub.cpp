// Placeholder so the tree links while the loader is being written; removed when model.cpp lands.
#include "model/model.h"
#include "tokenizer/tokenizer.h"
namespace ss::model {
class MappedFile {};
}
namespace ss::model {
Model::Model() = default;
Model::~Model() = default;
}  // namespace ss::model
