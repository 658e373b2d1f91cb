// train/hf_folder.h — Hugging Face model folders in and out: config.json with the weights in
// model.safetensors, or in shards model-0000i-of-0000n.safetensors named by
// model.safetensors.index.json (f32, bf16 or f16 tensors; Loom computes in f32).
#pragma once

#include <string>

#include "nn/decoder.h"
#include "nn/model.h"
#include "train/checkpoint.h"

namespace loom::train {

// A directory holding config.json.
bool is_hf_folder(const std::string& path);

// The model a folder's config.json describes, as a ModelSpec (decoder families; GPT-2
// folders are read by their own config's sizes). Errors name the file and field.
ModelSpec hf_model_spec(const std::string& dir);

// A decoder configuration as a ModelSpec: its config.json, and the sizes the spec repeats.
ModelSpec decoder_model_spec(const nn::DecoderConfig& config);

// Loads every parameter of `model` from the folder's weights: each must be present with its
// shape, and every tensor there must be a parameter (or a known extra); named errors.
void load_hf_weights(const std::string& dir, nn::Model& model);

// Writes a folder that transformers' AutoModelForCausalLM.from_pretrained loads:
// config.json and model.safetensors (f32), each written atomically.
void export_hf(const ModelSpec& spec, nn::Model& model, const std::string& out);
// The same for a Loom checkpoint (a folder or its model.safetensors).
void export_checkpoint_hf(const std::string& checkpoint, const std::string& out);

}  // namespace loom::train
