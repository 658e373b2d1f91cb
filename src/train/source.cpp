#include "train/source.h"

#include <numeric>
#include <string>
#include <utility>

#include "core/error.h"
#include "data/indexed.h"
#include "data/tokenizer.h"
#include "io/atomic_file.h"
#include "nn/init.h"

namespace loom::train {

data::TextDataset text_data(const std::string& data, const std::string& tokenizer_path,
                            std::int64_t random_vocab, std::uint64_t seed) {
  if (data == "random")
    return data::TextDataset::random(random_vocab, 1'000'000, seed);
  std::unique_ptr<data::Tokenizer> tokenizer;
  if (!tokenizer_path.empty())
    tokenizer = data::load_tokenizer(tokenizer_path);
  if (data::is_indexed_corpus(data)) {
    data::IndexedCorpus corpus = data::read_indexed(data);
    std::int64_t vocab = 0;
    if (tokenizer) {
      vocab = tokenizer->vocab_size();
    } else {  // the corpus alone: its largest id decides
      for (std::int32_t id : corpus.tokens)
        vocab = std::max<std::int64_t>(vocab, std::int64_t{id} + 1);
    }
    return data::TextDataset::from_ids(std::move(corpus.tokens), vocab, corpus.prefix);
  }
  if (!tokenizer)
    return data::TextDataset::load(data);
  return data::TextDataset::from_ids(tokenizer->encode(io::read_whole_file(data)),
                                     tokenizer->vocab_size(), data);
}

Source::Source(const TrainConfig& cfg) : cfg_(cfg) {
  if (cfg.text()) {
    text_ = text_data(cfg.data, cfg.tokenizer, cfg.vocab, static_cast<std::uint64_t>(cfg.seed));
    return;
  }
  const std::string& dir = cfg.mnist_dir;
  train_ = data::load_idx(dir + "/train10k-images-idx3-ubyte.gz",
                          dir + "/train10k-labels-idx1-ubyte.gz");
  test_ = data::load_idx(dir + "/t10k-images-idx3-ubyte.gz", dir + "/t10k-labels-idx1-ubyte.gz");
  data::normalize_mnist(train_);
  data::normalize_mnist(test_);
}

data::Batch Source::batch(std::int64_t step, Backend& backend) {
  auto seed = static_cast<std::uint64_t>(cfg_.seed);
  if (text())
    return text_.sample(text_.train(), cfg_.batch, cfg_.context, nn::mix_seed(seed, step), backend);
  // Images: shuffled epochs; the permutation depends only on (seed, epoch).
  std::int64_t per_epoch = train_.count / cfg_.batch;
  check(per_epoch > 0, "batch = " + std::to_string(cfg_.batch) + " exceeds the " +
                           std::to_string(train_.count) + " training images");
  std::int64_t epoch = step / per_epoch;
  if (epoch != epoch_) {
    order_.resize(train_.count);
    std::iota(order_.begin(), order_.end(), 0);
    nn::Rng rng(nn::mix_seed(seed ^ 0x5eed, epoch));
    for (std::int64_t i = train_.count - 1; i > 0; --i)
      std::swap(order_[i], order_[rng.next() % static_cast<std::uint64_t>(i + 1)]);
    epoch_ = epoch;
  }
  return data::image_batch(train_, order_, (step % per_epoch) * cfg_.batch, cfg_.batch, backend);
}

}  // namespace loom::train
