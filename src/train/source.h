// train/source.h — a run's training data, and how step s's batch is drawn from it:
// deterministically, from (seed, step) alone, so an interrupted run resumes exactly.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/backend.h"
#include "data/idx.h"
#include "data/text.h"
#include "train/config.h"

namespace loom::train {

// Token data for a text run: random tokens, a Megatron indexed corpus (its ids; the
// tokenizer, when given, sets the vocabulary, else the largest id does), or a UTF-8 file
// (tokenized by `tokenizer_path`, else by characters).
data::TextDataset text_data(const std::string& data, const std::string& tokenizer_path,
                            std::int64_t random_vocab, std::uint64_t seed);

class Source {
 public:
  explicit Source(const TrainConfig& cfg);

  bool text() const { return cfg_.text(); }
  const data::TextDataset& dataset() const { return text_; }
  std::int64_t vocab() const { return text() ? text_.vocab() : 10; }
  // Tokens (text) or images per step: the unit of the throughput figures.
  std::int64_t items_per_step() const { return text() ? cfg_.batch * cfg_.context : cfg_.batch; }
  const char* unit() const { return text() ? "tok" : "img"; }
  // The whole batch of step `step` (every process draws the same one).
  data::Batch batch(std::int64_t step, Backend& backend);
  const data::ImageSet& test_set() const { return test_; }

 private:
  const TrainConfig& cfg_;
  data::TextDataset text_;
  data::ImageSet train_, test_;
  std::vector<std::int64_t> order_;
  std::int64_t epoch_ = -1;
};

}  // namespace loom::train
