#include "cli/engine/data_command.h"

#include <cstdio>

#include "core/job_contract.h"
#include "data/tokenizer.h"

namespace loom::cli {

CLI::App* add_data_command(CLI::App& app, DataOptions& o) {
  CLI::App* data = app.add_subcommand("data", "prepare training corpora");
  data->require_subcommand(1);
  o.prepare = data->add_subcommand(
      "prepare",
      "tokenize text files (each a document) or JSONL files (each line a document) into a "
      "Megatron indexed corpus, OUT.bin + OUT.idx, which loom train --data OUT reads");
  o.prepare->add_option("--tokenizer", o.tokenizer, "tokenizer.json or tokenizer.model, or a folder holding one")
      ->required();
  o.prepare->add_option("--out", o.out, "the corpus prefix: writes OUT.bin and OUT.idx")
      ->required();
  o.prepare->add_option("--json-key", o.json_key, "JSONL inputs: the field holding the text");
  o.prepare->add_flag("--no-eos", o.no_eos,
                      "do not put the tokenizer's end-of-document token after each document");
  o.prepare->add_option("inputs", o.inputs, "text (.txt, any name) or .jsonl files")->required();
  return data;
}

int run_data(const DataOptions& o) {
  const data::PreparedCorpus corpus =
      data::prepare_corpus(o.tokenizer, o.inputs, o.json_key, !o.no_eos, o.out);
  std::printf("wrote %s.bin and %s.idx: %lld documents, %lld tokens\n", o.out.c_str(),
              o.out.c_str(), static_cast<long long>(corpus.documents),
              static_cast<long long>(corpus.tokens));
  return contract::code(contract::ExitCode::ok);
}

}  // namespace loom::cli
