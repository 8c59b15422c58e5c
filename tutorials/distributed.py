# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Data-parallel training with sparse and masked gradients
#
# A recommender looks up a few rows of a large embedding table per sample, so its gradient
# is sparse: `nn.Embedding(sparse=True)` stores only the rows the batch touched, and a lazy
# optimizer (`ms.optim.Adagrad`) updates only those rows. Trained on several processes, the
# gradient of each process stores *its* rows; combining them must give the gradient of the
# whole batch -- the union of the rows, each the sum over processes divided by their number
# (DDP's convention) -- and stay sparse. `masked_sparse.distributed` does that with dense
# collectives of `torch.distributed` only, so it runs on gloo (CPU) and NCCL (GPUs) alike.
#
# Launch it on 2 processes with
#
# ```bash
# torchrun --nproc-per-node 2 tutorials/distributed.py
# ```
#
# Run as a plain script (`python tutorials/distributed.py`, as the tests do), it trains the
# same model in one process on the whole batch, launches itself under `torchrun` with 2
# processes, and compares the parameters.

# %%
import os
import subprocess
import sys
import tempfile

import torch
import torch.distributed as dist
from torch import nn

import masked_sparse as ms
import masked_sparse.distributed as msd

ITEMS, DIM, BATCH, STEPS = 1000, 16, 64, 5
LAUNCHED = "LOCAL_RANK" in os.environ  # set by torchrun

# %% [markdown]
# ## The model and the data
# Each sample is a bag of 4 item ids and a rating; the model averages the items'
# embeddings (sparse gradient) and scores them with a small MLP (dense gradients).


# %%
class Recommender(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)  # the same initial parameters in every process
        self.items = nn.EmbeddingBag(ITEMS, DIM, mode="mean", sparse=True)
        self.mlp = nn.Sequential(nn.Linear(DIM, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, ids: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.items(ids, offsets)).squeeze(1)


def batch(step: int, lo: int = 0, hi: int = BATCH):
    """Samples lo:hi of the batch of ``step``: (flat ids, offsets, ratings)."""
    g = torch.Generator().manual_seed(step)
    ids = torch.randint(0, ITEMS, (BATCH, 4), generator=g)[lo:hi]
    ratings = torch.rand(BATCH, generator=g)[lo:hi] * 5
    return ids.reshape(-1), torch.arange(0, ids.numel(), 4), ratings


def train(model: nn.Module, forward, rank: int = 0, world: int = 1) -> nn.Module:
    """STEPS steps of Adagrad; this process takes its 1/world slice of every batch."""
    opt = ms.optim.Adagrad(model.parameters(), lr=0.1)
    per = BATCH // world
    for step in range(STEPS):
        ids, offsets, ratings = batch(step, rank * per, (rank + 1) * per)
        opt.zero_grad()
        nn.functional.mse_loss(forward(ids, offsets), ratings).backward()
        opt.step()
    return model


# %% [markdown]
# ## Masked collectives
# Under `torchrun`, every process holds its own masked tensor; `msd.all_reduce` combines
# them with masked semantics: an element is specified iff some process specifies it, and
# `"mean"` divides by the number of processes that specify it. The result keeps the
# input's layout (COO here). `torch.distributed.all_reduce(mt)` works too, in place.


# %%
def masked_collectives(rank: int) -> None:
    data = torch.tensor([1.0, 2.0, 3.0, 4.0]) * (1 + 9 * rank)   # rank 1: [10, 20, 30, 40]
    mask = torch.tensor([[True, True, False, False], [False, True, True, False]])[rank]
    mt = ms.masked_tensor(data, mask).to_sparse_coo()
    total, mean = msd.all_reduce(mt, "sum"), msd.all_reduce(mt, "mean")
    dist.all_reduce(mt, op=dist.ReduceOp.MAX)                     # in place
    if rank == 0:
        print("masked sum over ranks: ", total.to_tensor(float("nan")).to_dense())
        print("masked mean over ranks:", mean.to_tensor(float("nan")).to_dense())
        print("dist.all_reduce MAX:   ", mt.to_tensor(float("nan")).to_dense(), mt.layout)


# %% [markdown]
# ## Data-parallel training
# `msd.DistributedDataParallel` is torch's DDP for models with sparse or masked
# parameters: the MLP goes through DDP's buckets; the embedding is left to
# `msd.sync_grads`, which runs at the end of every backward and leaves a sparse gradient
# holding the union of the processes' rows (torch's DDP would need its sparse all-reduce,
# which NCCL lacks). By hand, the same recipe is `msd.split_for_ddp(model)` before
# `torch.nn.parallel.DistributedDataParallel(model)` and `msd.sync_grads(...)` after
# `backward()`.


# %%
def data_parallel(out_path: str) -> None:
    dist.init_process_group("gloo")   # "nccl" on GPUs, with the model and batches on cuda
    rank, world = dist.get_rank(), dist.get_world_size()
    masked_collectives(rank)
    model = Recommender()
    ddp = msd.DistributedDataParallel(model)
    ids, offsets, ratings = batch(0, rank * BATCH // world, (rank + 1) * BATCH // world)
    nn.functional.mse_loss(ddp(ids, offsets), ratings).backward()
    local_rows = ids.unique().numel()
    synced_rows = model.items.weight.grad.coalesce().indices().shape[1]
    if rank == 0:
        print(f"rows in this rank's slice: {local_rows}; in the synchronized gradient: "
              f"{synced_rows}")
    # Free every DDP wrapper while the process group is alive: a DDP reducer that outlives
    # destroy_process_group() destroys the gloo group itself and can deadlock at exit.
    del ddp
    model = Recommender()
    train(model, msd.DistributedDataParallel(model), rank, world)
    if rank == 0:
        torch.save(model.state_dict(), out_path)
    dist.destroy_process_group()


# %% [markdown]
# ## One process on the whole batch, then two processes, compared
# Each process takes half of every batch; with DDP's convention (sum over processes / 2)
# and a mean loss, the gradients -- hence the parameters -- equal one process's on the
# whole batch, up to float rounding.

# %%
if LAUNCHED:
    data_parallel(os.environ["TUTORIAL_OUT"])
else:
    single = Recommender()
    train(single, single)
    ids = batch(0)[0]
    print("rows in the whole batch:", ids.unique().numel())
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "params.pt")
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc-per-node", "2", __file__],
                       env=dict(os.environ, TUTORIAL_OUT=out, OMP_NUM_THREADS="1"),
                       check=True, timeout=240)
        parallel = torch.load(out)
    diff = max((parallel[k] - v).abs().max().item() for k, v in single.state_dict().items())
    moved = (single.items.weight - Recommender().items.weight).abs().amax(1).gt(0).sum()
    print(f"embedding rows changed by training: {int(moved)} of {ITEMS}")
    print(f"max |2 processes - 1 process| over all parameters: {diff:.1e}")
