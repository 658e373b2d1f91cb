#include "autograd/tensor_parallel.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>

#include "autograd/functions.h"
#include "core/error.h"

namespace loom::autograd {
namespace {

thread_local TensorGroup* current_group = nullptr;
thread_local bool inside_rule = false;  // a rule calls the plain functions on local tensors

// While it lives, functions run on local tensors without looking at placements.
struct LocalOnly {
  bool previous = inside_rule;
  LocalOnly() { inside_rule = true; }
  ~LocalOnly() { inside_rule = previous; }
};

TensorGroup& group(const char* op) {
  check(current_group != nullptr, std::string(op) +
                                      ": a tensor is sharded or partial, but this thread has no "
                                      "tensor-parallel group (TensorGroupScope)");
  return *current_group;
}

// The sum over the group of a tensor's local values, on its device.
Tensor all_reduce(const Tensor& t, const char* op) {
  std::vector<float> values = t.to_floats();
  group(op).all_reduce_sum(values);
  return Tensor::from_floats(t.shape(), values, t.backend());
}

Var placed(Var v, const Placement& p) {
  v.set_placement(p);
  return v;
}

Placement shard(int dim, int parts = 0) {
  Placement p;
  p.shard = dim;
  p.parts = parts;
  return p;
}

// How many distinct slices a sharded placement cuts its dimension into on group `g`.
int slices(const Placement& p, const TensorGroup& g) {
  return p.parts > 0 ? p.parts : g.size();
}

[[noreturn]] void no_rule(const std::string& op, std::initializer_list<const Var*> inputs) {
  std::string text;
  for (const Var* v : inputs)
    text += (text.empty() ? "" : ", ") + describe(v->placement());
  throw Error(op + ": no tensor-parallel rule for inputs placed " + text +
              " (docs/parallel.md lists the rules)");
}

// Megatron's f: identity forward; the gradient, a partial sum on each rank (each used its own
// slice of the weight), all-reduced once all of its summands are in (Tape).
Var copy_to_group(Tape& tape, const Var& x) {
  group("tensor-parallel rule");
  return tape.record_partial_gradient(x);
}

// A parameter whose slices are each held by several ranks (Placement::parts; replicated
// key/value heads): each rank's gradient is the summand from its own use of the slice (its
// query heads); the slice's gradient is the sum over the ranks holding it. One all-reduce over
// the group of `parts` slots, each rank writing its slice's slot (zeros elsewhere).
Var summed_over_holders(Tape& tape, const Var& w) {
  if (w.placement().parts == 0 || !w.defined())
    return w;
  TensorGroup& g = group("replicated slices");
  if (w.placement().parts == g.size())
    return w;
  TensorGroup* gp = &g;
  const int parts = w.placement().parts;
  Var out = tape.record({w}, w.value(), [gp, parts](const Tensor& grad) {
    const std::vector<float> mine = grad.to_floats();
    const std::size_t n = mine.size(),
                      slot = static_cast<std::size_t>(gp->rank() * parts / gp->size());
    std::vector<float> slots(n * static_cast<std::size_t>(parts), 0.0f);
    std::copy(mine.begin(), mine.end(), slots.begin() + static_cast<std::ptrdiff_t>(slot * n));
    gp->all_reduce_sum(slots);
    return std::vector<Tensor>{Tensor::from_floats(
        grad.shape(),
        std::vector<float>(slots.begin() + static_cast<std::ptrdiff_t>(slot * n),
                           slots.begin() + static_cast<std::ptrdiff_t>((slot + 1) * n)),
        grad.backend())};
  });
  return placed(out, w.placement());
}

int last(const Var& x) {
  return static_cast<int>(x.shape().size()) - 1;
}

// Sequence parallelism: the residual stream [N, C] sharded on its rows.
bool sequence_parallel() {
  return current_group != nullptr && current_group->sequence_parallel();
}

bool row_sharded(const Var& x) {
  return x.placement().shard == 0 && x.shape().size() == 2;
}

// The floats of rank `rank`'s block of rows of `t` ([N, ...], N divisible by `parts`).
std::vector<float> own_rows(const std::vector<float>& whole, int rank, int parts) {
  const std::size_t n = whole.size() / static_cast<std::size_t>(parts);
  return {whole.begin() + static_cast<std::ptrdiff_t>(n * static_cast<std::size_t>(rank)),
          whole.begin() + static_cast<std::ptrdiff_t>(n * static_cast<std::size_t>(rank + 1))};
}

std::vector<float> gathered_rows(TensorGroup& g, const std::vector<float>& mine) {
  std::vector<float> all(mine.size() * static_cast<std::size_t>(g.size()));
  g.all_gather(mine, all);
  return all;
}

void check_rows_divide(const Shape& whole, TensorGroup& g) {
  check(whole[0] % g.size() == 0, [&] {
    return "sequence parallelism: the " + std::to_string(whole[0]) +
           " rows of the residual stream (batch x sequence) do not divide among " +
           std::to_string(g.size()) + " tensor-parallel ranks";
  });
}

// The last gather, reused by the next column-parallel product of the same input (q, k and v
// of one norm's output; gate and up): one all-gather forward and one reduce-scatter backward
// however many slices use it.
struct LastGather {
  std::weak_ptr<VarState> input;
  const Tape* tape = nullptr;
  Var output;
};
thread_local LastGather last_gather;

// Row shards -> the whole [N, C] (all-gather). Backward, a partial gradient (summands from
// the column-parallel products) is reduce-scattered; a whole one keeps this rank's rows.
Var gather_rows(Tape& tape, const Var& x) {
  if (last_gather.tape == &tape && last_gather.input.lock() == x.state())
    return last_gather.output;
  TensorGroup& g = group("sequence-parallel gather");
  Shape whole = x.shape();
  whole[0] *= g.size();
  Tensor out =
      Tensor::from_floats(whole, gathered_rows(g, x.value().to_floats()), x.value().backend());
  const Shape local = x.shape();
  TensorGroup* gp = &g;
  Var gathered = tape.record_gather(x, out, [gp, local](const Tensor& grad, bool partial) {
    const std::vector<float> all = grad.to_floats();
    std::vector<float> mine(all.size() / static_cast<std::size_t>(gp->size()));
    if (partial)
      gp->reduce_scatter_sum(all, mine);
    else
      mine = own_rows(all, gp->rank(), gp->size());
    return std::vector<Tensor>{Tensor::from_floats(local, mine, grad.backend())};
  });
  last_gather = {x.state(), &tape, gathered};
  return gathered;
}

// The backward of a split into row shards: the rows' gradients all-gathered to `whole`.
BackwardFn rows_gathered(TensorGroup* gp, const Shape& whole) {
  return [gp, whole](const Tensor& grad) {
    return std::vector<Tensor>{
        Tensor::from_floats(whole, gathered_rows(*gp, grad.to_floats()), grad.backend())};
  };
}

// A replicated [N, C] -> this rank's rows; backward, the rows' gradients all-gathered.
Var scatter_rows(Tape& tape, const Var& x) {
  TensorGroup& g = group("sequence-parallel scatter");
  check_rows_divide(x.shape(), g);
  Shape local = x.shape();
  local[0] /= g.size();
  Tensor mine = Tensor::from_floats(local, own_rows(x.value().to_floats(), g.rank(), g.size()),
                                    x.value().backend());
  TensorGroup* gp = &g;
  const Shape whole = x.shape();
  return placed(tape.record({x}, mine, rows_gathered(gp, whole)), shard(0));
}

// A partial [N, C] -> the sum's rows of this rank (reduce-scatter); backward, every summand's
// gradient is the sum's: the rows' gradients all-gathered.
Var reduce_scatter_rows(Tape& tape, const Var& x) {
  TensorGroup& g = group("sequence-parallel reduce-scatter");
  check_rows_divide(x.shape(), g);
  Shape local = x.shape();
  local[0] /= g.size();
  std::vector<float> mine(static_cast<std::size_t>(x.value().numel() / g.size()));
  g.reduce_scatter_sum(x.value().to_floats(), mine);
  TensorGroup* gp = &g;
  const Shape whole = x.shape();
  return placed(tape.record({x}, Tensor::from_floats(local, mine, x.value().backend()),
                            rows_gathered(gp, whole)),
                shard(0));
}

// Any [N, C] operand of the residual stream as row shards.
Var to_rows(Tape& tape, const Var& x) {
  if (row_sharded(x))
    return x;
  return x.placement().partial ? reduce_scatter_rows(tape, x) : scatter_rows(tape, x);
}

}  // namespace

TensorGroupScope::TensorGroupScope(TensorGroup& g) : previous_(current_group) {
  current_group = &g;
}

TensorGroupScope::~TensorGroupScope() {
  current_group = previous_;
}

Tensor all_reduce_over_group(const Tensor& t) {
  return all_reduce(t, "tensor-parallel backward");
}

std::string describe(const Placement& p) {
  if (p.partial)
    return "partial";
  if (p.shard < 0)
    return "replicated";
  return "sharded on " + std::to_string(p.shard) +
         (p.parts > 0 ? " in " + std::to_string(p.parts) + " parts" : "");
}

bool distributed(std::initializer_list<const Var*> inputs) {
  if (inside_rule)
    return false;
  for (const Var* v : inputs)
    if (v->defined() && !v->placement().replicated())
      return true;
  return false;
}

namespace tp {

Var reduce(Tape& tape, const Var& x) {
  if (!x.placement().partial)
    return x;
  // Megatron's g: the sum forward; each summand's gradient is the sum's, unchanged.
  return tape.record({x}, all_reduce(x.value(), "tensor-parallel reduce"),
                     [](const Tensor& g) { return std::vector<Tensor>{g}; });
}

Var replicated_input(Tape& tape, const Var& x, const char* op) {
  if (x.placement().shard >= 0)
    no_rule(op, {&x});
  return reduce(tape, x);
}

Var add(Tape& tape, const Var& a_in, const Var& b_in) {
  // Sequence parallelism: the residual stream's add runs on row shards.
  const bool stream = a_in.shape().size() == 2 && b_in.shape().size() == 2 &&
                      a_in.shape()[1] == b_in.shape()[1] &&
                      (row_sharded(a_in) || row_sharded(b_in) || a_in.placement().partial ||
                       b_in.placement().partial);
  if (sequence_parallel() && stream) {
    Var a = to_rows(tape, a_in), b = to_rows(tape, b_in);
    LocalOnly local;
    return placed(autograd::add(tape, a, b), shard(0));
  }
  Var a = reduce(tape, a_in), b = reduce(tape, b_in);
  if (a.placement() != b.placement() || a.shape().size() != b.shape().size())
    no_rule("add", {&a, &b});
  LocalOnly local;
  return placed(autograd::add(tape, a, b), a.placement());
}

Var matmul(Tape& tape, const Var& a_in, const Var& b, bool trans_a, bool trans_b) {
  Var a = reduce(tape, a_in);
  // W's output dimension is its rows when transposed ([out, in]), else its columns.
  const int w_out = trans_b ? 0 : 1, w_in = trans_b ? 1 : 0;
  if (!trans_a && row_sharded(a) && sequence_parallel() &&
      (b.placement().shard == w_out || b.placement().replicated()))
    a = gather_rows(tape, a);  // a column-parallel product, or the replicated LM head
  if (a.placement().replicated() && b.placement().replicated()) {
    LocalOnly local;
    return autograd::matmul(tape, a, b, trans_a, trans_b);
  }
  if (!trans_a && b.shape().size() == 2 && a.placement().replicated() &&
      b.placement().shard == w_out) {  // column-parallel
    Var x = copy_to_group(tape, a), w = summed_over_holders(tape, b);
    LocalOnly local;
    Var out = autograd::matmul(tape, x, w, false, trans_b);
    return placed(out, shard(last(out), b.placement().parts));
  }
  if (!trans_a && b.shape().size() == 2 && a.placement().shard == last(a) &&
      b.placement().shard == w_in) {  // row-parallel: each rank's product is a summand
    LocalOnly local;
    Placement partial;
    partial.partial = true;
    return placed(autograd::matmul(tape, a, b, false, trans_b), partial);
  }
  no_rule("matmul", {&a, &b});
}

Var linear(Tape& tape, const Var& x_in, const Var& weight, const Var& bias, bool trans_b) {
  Var x = reduce(tape, x_in);
  const int w_out = trans_b ? 0 : 1;
  if (row_sharded(x) && sequence_parallel() && weight.placement().shard == w_out)
    x = gather_rows(tape, x);  // column-parallel
  if (x.placement().replicated() && weight.placement().shard == w_out &&
      bias.placement().shard == 0 &&
      bias.placement().parts == weight.placement().parts) {  // column-parallel, each rank its
                                                             // slice of the bias
    Var copied = copy_to_group(tape, x);
    Var w = summed_over_holders(tape, weight), b = summed_over_holders(tape, bias);
    LocalOnly local;
    Var out = autograd::linear(tape, copied, w, b, trans_b);
    return placed(out, shard(last(out), weight.placement().parts));
  }
  if (bias.placement().replicated() && sequence_parallel() && x.shape().size() == 2 &&
      x.placement().shard == 1) {
    // Row-parallel under sequence parallelism: the products reduce-scattered to row shards,
    // the bias added to each rank's rows (its gradient summed over them).
    Var rows = reduce_scatter_rows(tape, tp::matmul(tape, x, weight, false, trans_b));
    Var b = copy_to_group(tape, bias);
    LocalOnly local;
    return placed(autograd::add(tape, rows, b), shard(0));
  }
  if (bias.placement().replicated()) {  // row-parallel: reduce the products, add the bias once
    Var summed = reduce(tape, tp::matmul(tape, x, weight, false, trans_b));
    LocalOnly local;
    return autograd::add(tape, summed, bias);
  }
  no_rule("linear", {&x, &weight, &bias});
}

Var reshape(Tape& tape, const Var& x_in, const Shape& shape) {
  Var x = reduce(tape, x_in);
  if (x.placement().replicated()) {
    LocalOnly local;
    return autograd::reshape(tape, x, shape);
  }
  // `shape` is the whole tensor's, as one process would write it. The sharded dimension s of
  // x becomes the outer factor it splits into, or the dimension it merges into: the first
  // output dimension with as many elements before it as s has, whose whole size the group
  // divides. That dimension holds 1/T of its size here (1/parts for slices several ranks hold).
  const int parts = slices(x.placement(), group("reshape"));
  const Shape& in = x.shape();
  std::int64_t before = 1;
  for (int d = 0; d < x.placement().shard; ++d)
    before *= in[static_cast<std::size_t>(d)];
  Shape local = shape;
  std::int64_t out_before = 1;
  int found = -1;
  for (std::size_t d = 0; d < shape.size() && found < 0; ++d) {
    check(shape[d] >= 0, "reshape of a sharded tensor: give every size (no -1)");
    if (out_before == before && shape[d] % parts == 0) {
      found = static_cast<int>(d);
      local[d] /= parts;
    }
    out_before *= shape[d];
  }
  if ((found < 0 || shape_numel(local) != x.value().numel()) && row_sharded(x) &&
      sequence_parallel()) {  // rows that map onto no dimension: the whole stream
    Var whole = gather_rows(tape, x);
    LocalOnly local_only;
    return autograd::reshape(tape, whole, shape);
  }
  if (found < 0 || shape_numel(local) != x.value().numel())
    no_rule("reshape", {&x});
  LocalOnly local_only;
  return placed(autograd::reshape(tape, x, local), shard(found, x.placement().parts));
}

Var rms_norm(Tape& tape, const Var& x_in, const Var& weight, double eps) {
  Var x = reduce(tape, x_in);
  if (x.placement().shard == last(x) || !weight.placement().replicated())
    no_rule("rms_norm", {&x, &weight});
  // Each rank normalises its own slices: the replicated weight's gradient is their sum.
  Var w = copy_to_group(tape, weight);
  LocalOnly local;
  return placed(autograd::rms_norm(tape, x, w, eps), x.placement());
}

Var swiglu(Tape& tape, const Var& gate_in, const Var& up_in) {
  Var gate = reduce(tape, gate_in), up = reduce(tape, up_in);
  if (gate.placement() != up.placement())
    no_rule("swiglu", {&gate, &up});
  LocalOnly local;
  return placed(autograd::swiglu(tape, gate, up), gate.placement());
}

Var rope(Tape& tape, const Var& x_in, const Tensor& cos, const Tensor& sin, const Tensor& neg_sin) {
  Var x = reduce(tape, x_in);
  const int rank = static_cast<int>(x.shape().size());
  // The rotation works along positions (rank - 3) and the head's features (rank - 1).
  if (x.placement().shard == rank - 1 || x.placement().shard == rank - 3)
    no_rule("rope", {&x});
  LocalOnly local;
  return placed(autograd::rope(tape, x, cos, sin, neg_sin), x.placement());
}

Var attention(Tape& tape, const Var& q_in, const Var& k_in, const Var& v_in) {
  Var q = reduce(tape, q_in), k = reduce(tape, k_in), v = reduce(tape, v_in);
  // Key/value heads fewer than the ranks are replicated slices (Placement::parts): each rank
  // holds the one its query heads use, and attends as grouped-query attention does.
  if (q.placement().shard != 2 || q.placement().parts != 0 || k.placement().shard != 2 ||
      v.placement() != k.placement() || q.placement().partial || k.placement().partial)
    no_rule("attention", {&q, &k, &v});
  LocalOnly local;
  return placed(autograd::attention(tape, q, k, v), q.placement());
}

Var embedding(Tape& tape, const Var& weight, const Tensor& ids) {
  if (weight.placement().shard != 0)
    no_rule("embedding", {&weight});
  // Vocab-parallel: this rank holds rows [first, first + rows) of the table. Its ids look up
  // their rows; the others give zeros, so the output is partial (exactly one rank holds each
  // id's row).
  const std::int64_t rows = weight.dim(0), first = rows * group("embedding").rank();
  std::vector<std::int32_t> local = ids.to_ints();
  std::vector<float> here(local.size());
  for (std::size_t i = 0; i < local.size(); ++i) {
    const std::int64_t row = local[i] - first;
    here[i] = row >= 0 && row < rows ? 1.0f : 0.0f;
    local[i] = here[i] != 0.0f ? static_cast<std::int32_t>(row) : 0;
  }
  Shape mask_shape = ids.shape();
  mask_shape.push_back(1);
  const Var mask(Tensor::from_floats(mask_shape, here, weight.value().backend()), false);
  LocalOnly local_only;
  Var looked =
      autograd::embedding(tape, weight, Tensor::from_ints(ids.shape(), local, ids.backend()));
  Placement partial;
  partial.partial = true;
  return placed(autograd::mul(tape, looked, mask), partial);
}

Var cross_entropy(Tape& tape, const Var& logits_in, const Tensor& targets) {
  Var logits = reduce(tape, logits_in);
  if (logits.placement().replicated()) {
    LocalOnly local;
    return autograd::cross_entropy(tape, logits, targets);
  }
  if (logits.placement().shard != 1 || logits.shape().size() != 2)
    no_rule("cross_entropy", {&logits});
  // Vocab-parallel: each rank holds columns [first, first + V/T) of every row. The whole
  // row's log-sum-exp from each rank's (gathered by summing disjoint slots), the target's
  // logit from the rank holding it: B S numbers cross the group, never the logits. Computed
  // on the host for now (the rows' floats are read once).
  TensorGroup& g = group("cross_entropy");
  const std::size_t n = static_cast<std::size_t>(logits.dim(0)),
                    v = static_cast<std::size_t>(logits.dim(1)),
                    parts = static_cast<std::size_t>(g.size()),
                    me = static_cast<std::size_t>(g.rank());
  const std::int64_t first = static_cast<std::int64_t>(v * me);
  const std::vector<float> z = logits.value().to_floats();
  const std::vector<std::int32_t> t = targets.to_ints();
  check(t.size() == n, "cross_entropy: " + std::to_string(t.size()) + " targets for " +
                           std::to_string(n) + " rows");
  std::vector<float> lses(n * parts, 0.0f), picked(n, 0.0f);
  for (std::size_t r = 0; r < n; ++r) {
    const float* row = z.data() + r * v;
    double m = -std::numeric_limits<double>::infinity(), sum = 0.0;
    for (std::size_t j = 0; j < v; ++j)
      m = std::max(m, static_cast<double>(row[j]));
    for (std::size_t j = 0; j < v; ++j)
      sum += std::exp(row[j] - m);
    lses[me * n + r] = static_cast<float>(m + std::log(sum));
    const std::int64_t col = t[r] - first;
    if (col >= 0 && col < static_cast<std::int64_t>(v))
      picked[r] = row[col];
  }
  g.all_reduce_sum(lses);
  g.all_reduce_sum(picked);
  auto lse = std::make_shared<std::vector<double>>(n);
  double total = 0.0;
  for (std::size_t r = 0; r < n; ++r) {
    double m = -std::numeric_limits<double>::infinity(), sum = 0.0;
    for (std::size_t k = 0; k < parts; ++k)
      m = std::max(m, static_cast<double>(lses[k * n + r]));
    for (std::size_t k = 0; k < parts; ++k)
      sum += std::exp(lses[k * n + r] - m);
    (*lse)[r] = m + std::log(sum);
    total += (*lse)[r] - picked[r];
  }
  const float loss = static_cast<float>(n > 0 ? total / static_cast<double>(n) : 0.0);
  const Tensor lv = logits.value();
  return tape.record(
      {logits}, Tensor::from_floats({}, std::vector<float>{loss}, lv.backend()),
      [lv, t, lse, first, n, v](const Tensor& grad) {
        const double scale =
            static_cast<double>(grad.item()) / static_cast<double>(std::max<std::size_t>(n, 1));
        std::vector<float> z = lv.to_floats(), dz(n * v);
        for (std::size_t r = 0; r < n; ++r)
          for (std::size_t j = 0; j < v; ++j) {
            const double p = std::exp(static_cast<double>(z[r * v + j]) - (*lse)[r]);
            const bool target = t[r] - first == static_cast<std::int64_t>(j);
            dz[r * v + j] = static_cast<float>(scale * (p - (target ? 1.0 : 0.0)));
          }
        return std::vector<Tensor>{Tensor::from_floats(lv.shape(), dz, lv.backend())};
      });
}

}  // namespace tp

}  // namespace loom::autograd
