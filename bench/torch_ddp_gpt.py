#!/usr/bin/python3
"""PyTorch DistributedDataParallel on the CPU: the GPT of bench/torch_gpt_bench.py
(imported, so the model is the reference's own) trained by N processes over gloo, each
on batch/N rows, one thread each. The mark for `mpirun -np N loom train`.

Prints one JSON line (rank 0): step_ms_median over the timed steps, tokens_per_s of the
whole batch, loss_first/last (of rank 0's rows), peak_rss_bytes summed over the ranks
(the launcher process is not counted, as mpirun is not for Loom).

Usage: /usr/bin/python3 bench/torch_ddp_gpt.py [--procs 2] [--layers --dim --heads --seq
       --batch --vocab --steps --warmup] [--anchors DIR]
  --anchors (or LOOM_ANCHORS): a folder holding another torch_gpt_bench.py (default: this
  script's folder, bench/).
"""
import argparse
import importlib.util
import json
import os
import resource
import statistics
import sys
import time


def load_anchor(anchors):
    saved = sys.argv
    sys.argv = [saved[0], "--threads", "1"]  # torch_gpt_bench.py parses its flags at import
    try:
        spec = importlib.util.spec_from_file_location("torch_gpt_bench", os.path.join(anchors, "torch_gpt_bench.py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.argv = saved
    return module


def rank_main(rank, a):
    os.environ["OMP_NUM_THREADS"] = "1"
    anchor = load_anchor(a.anchors)
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{a.port}", rank=rank, world_size=a.procs)
    torch.manual_seed(1234)  # the same initial weights on every rank (DDP also broadcasts them)
    net = anchor.GPT(a.vocab, a.seq, a.layers, a.dim, a.heads)
    # The causal masks are constant bool buffers, which gloo cannot broadcast.
    DDP = torch.nn.parallel.DistributedDataParallel
    DDP._set_params_and_buffers_to_ignore_for_model(net, [name for name, _ in net.named_buffers()])
    model = DDP(net)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    gen = torch.Generator().manual_seed(1235)
    rows = a.batch // a.procs
    times, losses = [], []
    for i in range(a.warmup + a.steps):
        data = torch.randint(0, a.vocab, (a.batch, a.seq + 1), generator=gen)  # the same batch everywhere
        mine = data[rank * rows:(rank + 1) * rows]
        x, y = mine[:, :a.seq].contiguous(), mine[:, 1:].contiguous()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        _, loss = model(x, y)
        loss.backward()
        opt.step()
        dt = time.perf_counter() - t0
        losses.append(loss.item())
        if i >= a.warmup:
            times.append(dt)
    rss = torch.tensor([float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)])  # KiB
    dist.all_reduce(rss)
    if rank == 0:
        med = statistics.median(times)
        print(json.dumps({"impl": "torch-ddp-gloo", "procs": a.procs, "step_ms_median": med * 1e3,
                          "tokens_per_s": a.batch * a.seq / med, "loss_first": losses[0],
                          "loss_last": losses[-1], "peak_rss_bytes": int(rss.item()) * 1024,
                          "torch": torch.__version__}), flush=True)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--anchors", default=os.environ.get("LOOM_ANCHORS", os.path.dirname(os.path.abspath(__file__))),
                   help="folder holding torch_gpt_bench.py (default: bench/)")
    p.add_argument("--procs", type=int, default=2)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--vocab", type=int, default=65)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--port", type=int, default=29533)
    a = p.parse_args()
    import torch.multiprocessing as mp
    mp.spawn(rank_main, args=(a,), nprocs=a.procs, join=True)


if __name__ == "__main__":
    main()
