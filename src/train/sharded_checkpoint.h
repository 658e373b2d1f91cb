// train/sharded_checkpoint.h — checkpoints every rank writes in parallel, each only the
// pieces it holds, readable at any layout (docs/distributed.md, "Checkpoints that move"):
//
//   step-N/shard-00003.safetensors  rank 3's pieces: each one slice of one logical tensor (a
//                                   parameter, optimizer.m.<name>, optimizer.v.<name>), under
//                                   the logical tensor's name
//   step-N/shard-00003.json         its manifest: for each piece the logical tensor's whole
//                                   shape and the slice's first index per dimension; the
//                                   shard file's size and CRC-32. Written after the shard, so
//                                   its presence means the shard is complete
//   step-N/index.json               written last, by rank 0, from every manifest: the format
//                                   and its version, the checkpoint's metadata (step,
//                                   optimizer steps, model, vocabulary, run settings), each
//                                   file with its size and CRC-32, and for each logical tensor
//                                   its shape, dtype and the pieces that tile it
//
// A rank writes a piece only where it is the one copy kept: a replicated tensor by the first
// rank of its tensor-parallel and data-parallel groups, a slice by the first rank holding it,
// an optimizer moment sharded by the distributed optimizer by its owner. Loading assembles each
// logical tensor whole from its pieces, so a checkpoint written at one layout (tp, pipeline,
// dp, zero, process count) loads at any other; the run then keeps its own slices.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <set>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/safetensors.h"

namespace loom::train {

inline constexpr const char* kShardedFormat = "loom-sharded-checkpoint";
inline constexpr int kShardedFormatVersion = 1;

struct ShardPiece {
  std::string name;                 // the logical tensor
  Shape shape;                      // the logical tensor's whole shape
  std::vector<std::int64_t> start;  // the piece's first index in each dimension
  Tensor value;                     // the piece: its shape is the slice's
};

// Writes `pieces` as shard-RRRRR.safetensors, then its manifest, into `folder` (each file
// atomically).
void write_shard(const std::string& folder, int rank, const std::vector<ShardPiece>& pieces);

// Rank 0, once the manifests of ranks 0 .. writers - 1 are in `folder`: index.json from them,
// with `metadata` (string values: step, optimizer_steps, loom_model, loom_vocab, loom_config).
void write_index(const std::string& folder, int writers,
                 const std::map<std::string, std::string>& metadata);

bool is_sharded_checkpoint(const std::string& folder);  // the folder holds index.json

class ShardedCheckpoint {
 public:
  // Reads index.json and checks it against its files before any tensor is used: the format
  // and a version this Loom reads; every file present with its size and CRC-32; every piece in
  // its file under its name with the shape and dtype the index gives, inside its tensor; the
  // pieces of each tensor tiling it exactly (no gap, no overlap); no tensor in a file that the
  // index does not name. Errors name the file, the tensor or field, the value and what was
  // expected.
  static ShardedCheckpoint open(const std::string& folder);

  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& index_path() const { return index_path_; }
  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }
  const Shape& shape(const std::string& name) const;
  std::vector<std::string> names() const;
  // The whole logical tensor, assembled from its pieces, on `backend` (f32).
  Tensor load(const std::string& name, Backend& backend) const;

 private:
  struct Piece {
    std::size_t file = 0;
    std::vector<std::int64_t> start;
    Shape shape;
  };
  struct Logical {
    Shape shape;
    std::vector<Piece> pieces;
  };
  // Tensor `name` of the index (its entry `t`), checked against files_; each file's tensors
  // it names are added to named[file].
  Logical read_tensor(const std::string& name, const nlohmann::json& t,
                      std::vector<std::set<std::string>>& named) const;
  std::string folder_, index_path_;
  std::map<std::string, std::string> metadata_;
  std::vector<io::SafetensorsFile> files_;
  std::map<std::string, Logical> tensors_;
};

}  // namespace loom::train
