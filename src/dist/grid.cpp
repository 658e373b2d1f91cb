#include "dist/grid.h"

#include "core/error.h"

namespace loom::dist {

std::string GridShape::describe() const {
  return "tp " + std::to_string(tp) + " x dp " + std::to_string(dp) + " x pp " + std::to_string(pp);
}

GridCoordinates grid_coordinates(int rank, const GridShape& s) {
  return {rank % s.tp, (rank / s.tp) % s.dp, rank / (s.tp * s.dp)};
}

int grid_rank(const GridCoordinates& at, const GridShape& s) {
  return at.tp + s.tp * (at.dp + s.dp * at.pp);
}

ProcessGrid::ProcessGrid(Communicator& world, const GridShape& shape) : shape_(shape) {
  check(shape.tp >= 1 && shape.dp >= 1 && shape.pp >= 1,
        "layout " + shape.describe() + ": every size must be at least 1");
  check(shape.size() == world.size(),
        "layout " + shape.describe() + " needs " + std::to_string(shape.size()) +
            " processes, this job has " + std::to_string(world.size()));
  at_ = grid_coordinates(world.rank(), shape);
  // Each group: the ranks that agree on the other two coordinates (the color), ranked by
  // their own coordinate (the key).
  tp_ = world.split(at_.dp + shape.dp * at_.pp, at_.tp);
  dp_ = world.split(at_.tp + shape.tp * at_.pp, at_.dp);
  pp_ = world.split(at_.tp + shape.tp * at_.dp, at_.pp);
}

}  // namespace loom::dist
