// train/run_checkpoints.cpp — a run's checkpoints (training_run.h's Checkpoints): whole,
// gathered to rank 0; or sharded, each process writing its pieces (sharded_checkpoint.h),
// in the background or not.
#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>

#include "core/error.h"
#include "data/tokenizer.h"
#include "dispatch/devices.h"
#include "io/atomic_file.h"
#include "train/training_run.h"

namespace loom::train {

std::vector<ShardPiece> TrainingRun::checkpoint_pieces() const {
  std::vector<nn::Parameter>& params = model->parameters();
  const int tp_rank = cfg.tp > 1 ? grid_->at().tp : 0, dp_rank = data_comm_->rank();
  std::vector<const nn::ShardedParameter*> shard_of(params.size(), nullptr);
  for (const nn::ShardedParameter& s : sharded_)
    shard_of[s.index] = &s;
  std::vector<ShardPiece> pieces;
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (pipeline && !(pipeline->uses(i) && pipeline->owns(i)))
      continue;  // another stage's
    const Tensor& value = params[i].var.value();
    ShardPiece piece;
    piece.shape = value.shape();
    piece.start.assign(value.shape().size(), 0);
    if (const nn::ShardedParameter* s = shard_of[i]) {
      if (!s->first_holder(tp_rank, static_cast<int>(cfg.tp)))
        continue;  // the slice's first holder writes it
      const auto d = static_cast<std::size_t>(s->dim);
      piece.start[d] = s->slice * value.dim(s->dim);
      piece.shape[d] = value.dim(s->dim) * s->slices(static_cast<int>(cfg.tp));
    } else if (tp_rank != 0) {
      continue;  // replicated over the tensor-parallel group: its rank 0 writes it
    }
    if (dp_rank == 0) {
      piece.name = params[i].name;
      piece.value = value;
      pieces.push_back(piece);
    }
    const int moments_by = sharding && sharding->owner(i) >= 0 ? sharding->owner(i) : 0;
    if (dp_rank != moments_by)
      continue;
    for (auto [prefix, moments] : {std::pair{"optimizer.m.", &optimizer->first_moments()},
                                   std::pair{"optimizer.v.", &optimizer->second_moments()}}) {
      check(i < moments->size() && (*moments)[i].defined(),
            params[i].name + ": no optimizer moment to checkpoint on this process");
      piece.name = prefix + params[i].name;
      piece.value = (*moments)[i];
      pieces.push_back(piece);
    }
  }
  return pieces;
}

// ---------------------------------------------------------------------------
// Checkpoints
// ---------------------------------------------------------------------------

Checkpoints::Checkpoints(TrainingRun& run)
    : run_(run),
      vocab_utf8_(run.source.text() && run.cfg.data != "random"
                      ? run.source.dataset().tokenizer().alphabet_utf8()
                      : ""),
      config_json_(run.cfg.to_json()) {}

bool Checkpoints::due(std::int64_t step, std::int64_t end) const {
  const TrainConfig& cfg = run_.cfg;
  return cfg.save && cfg.ckpt_every > 0 && (step + 1) % cfg.ckpt_every == 0 && step + 1 < end;
}

void Checkpoints::write(std::int64_t steps_done) {
  run_.checkpoints().publish(steps_done, [&](const std::string& folder) {
    save_checkpoint(folder, *run_.model, run_.spec, vocab_utf8_, *run_.optimizer, steps_done,
                    config_json_);
    copy_tokenizer(folder);
  });
}

void Checkpoints::copy_tokenizer(const std::string& folder) const {
  if (run_.cfg.tokenizer.empty())
    return;  // sample, eval and export read it from the checkpoint
  const std::string file = data::tokenizer_file_path(run_.cfg.tokenizer);
  io::write_file_atomically(folder + "/" + std::filesystem::path(file).filename().string(),
                            io::read_whole_file(file));
}

void Checkpoints::write_sharded(std::int64_t steps_done, bool background) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  writer_.synchronize();  // the previous background save is complete (its failure rethrown)
  const double waited = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  dist::Communicator& world = run_.world;
  float ready = 0.0f;  // rank 0 has made the folder
  if (run_.lead)
    run_.checkpoints().prepare(steps_done);
  world.all_reduce_sum(std::span<float>(&ready, 1));
  std::vector<ShardPiece> pieces = run_.checkpoint_pieces();
  if (background)  // copies: the step goes on changing the parameters and moments
    snapshot(pieces);
  const std::map<std::string, std::string> metadata{
      {"step", std::to_string(steps_done)},
      {"optimizer_steps", std::to_string(run_.optimizer->steps_taken())},
      {"loom_model", run_.spec.to_json()},
      {"loom_vocab", vocab_utf8_},
      {"loom_config", config_json_}};
  SaveTiming& timing = timings_.emplace_back();
  timing.step = steps_done;
  timing.background = background;
  timing.wait_ms = waited;
  // Each process writes its shard; rank 0 then waits for every shard's manifest (no
  // collective: the writer may run beside the training thread's), writes the index and
  // publishes.
  auto job = [this, steps_done, metadata, &timing, pieces = std::move(pieces),
              folder = run_.checkpoints().writing_folder(steps_done), rank = world.rank(),
              ranks = world.size(), lead = run_.lead] {
    const auto w0 = Clock::now();
    write_shard(folder, rank, pieces);
    if (lead) {
      wait_for_shards(folder, ranks, steps_done);
      write_index(folder, ranks, metadata);
      copy_tokenizer(folder);
      run_.checkpoints().commit(steps_done);
    }
    timing.write_ms = std::chrono::duration<double, std::milli>(Clock::now() - w0).count();
  };
  if (background)
    writer_.submit(std::move(job));
  else
    job();
  timing.stall_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

void Checkpoints::snapshot(std::vector<ShardPiece>& pieces) {
  // Into host buffers kept from the previous save (the writer is done with them): a fresh
  // allocation would fault in every page again, which for gigabytes is most of the copy.
  snapshot_.resize(pieces.size());
  for (std::size_t k = 0; k < pieces.size(); ++k) {
    const Tensor& value = pieces[k].value;
    Tensor& copy = snapshot_[k];
    if (!copy.defined() || copy.shape() != value.shape())
      copy = Tensor::empty(value.shape(), DType::f32, dispatch::host());
    if (value.backend().host_accessible() && value.is_contiguous() && value.numel() > 0)
      std::memcpy(copy.data<float>(), value.data<float>(),
                  static_cast<std::size_t>(value.numel()) * sizeof(float));
    else
      copy = value.to(dispatch::host());
    pieces[k].value = copy;
  }
}

void Checkpoints::wait_for_shards(const std::string& folder, int ranks, std::int64_t step) {
  // Every rank's manifest appears once its shard is complete (write_shard); a rank that
  // fails ends the job (MPI_Abort), so the wait is bounded by the slowest writer.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(30);
  for (int r = 0; r < ranks; ++r) {
    char name[40];
    std::snprintf(name, sizeof name, "/shard-%05d.json", r);
    std::error_code ec;
    while (!std::filesystem::exists(folder + name, ec)) {
      check(std::chrono::steady_clock::now() < deadline,
            "checkpoint of step " + std::to_string(step) + ": rank " + std::to_string(r) +
                " has not written its shard into " + folder + " after 30 minutes");
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
}

void Checkpoints::summarize(Summary& summary) {
  writer_.synchronize();
  for (const SaveTiming& t : timings_)
    summary.checkpoint_saves.push_back({t.step, t.background, t.stall_ms, t.wait_ms, t.write_ms});
}

void Checkpoints::save(std::int64_t steps_done) {
  if (run_.cfg.sharded_checkpoints(run_.world.size())) {  // no gathering: each process its pieces
    write_sharded(steps_done, run_.cfg.checkpoint_background);
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  run_.gather_full_state(true);
  if (run_.lead)
    write(steps_done);
  run_.release_full_state();
  SaveTiming& timing = timings_.emplace_back();
  timing.step = steps_done;
  timing.stall_ms = timing.write_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

void Checkpoints::save_final(std::int64_t steps_done) {
  writer_.synchronize();  // a background save still running finishes first
  if (run_.cfg.save && run_.cfg.sharded_checkpoints(run_.world.size())) {
    // The run ends once its last checkpoint is published (unless that step's is already:
    // a run stopped right after a checkpoint).
    if (timings_.empty() || timings_.back().step != steps_done)
      write_sharded(steps_done, false);
    run_.gather_full_state(false);  // the whole model, for the final evaluation
    return;
  }
  run_.gather_full_state(run_.cfg.save);
  if (run_.lead && run_.cfg.save)
    write(steps_done);
}

}  // namespace loom::train
