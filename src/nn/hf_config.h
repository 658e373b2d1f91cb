// nn/hf_config.h — a Hugging Face model folder's config.json as a DecoderConfig, and back.
// Reads both spellings transformers has used for the rotary settings (rope_theta with
// rope_scaling, and rope_parameters). A field that changes the model's math and that Loom
// does not implement, an unknown model_type, or a value of the wrong type is an error
// naming the file, the field, the value and what was expected; fields that only describe
// (token ids, dtype, cache use, the transformers version) are read past.
#pragma once

#include <string>

#include "nn/decoder.h"

namespace loom::nn {

// `where` names the source in errors (the file's path).
DecoderConfig decoder_config_from_hf_json(const std::string& json_text, const std::string& where);
DecoderConfig read_hf_config(const std::string& path);  // a config.json file
// config.json text for the configuration, as transformers writes it (rope_parameters).
std::string hf_config_json(const DecoderConfig& config);

}  // namespace loom::nn
