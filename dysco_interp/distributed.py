"""Data-parallel runs under torchrun: one process per GPU, each on its own share of the work.

`evaluate` (free or `--teacher-forced`) and `detect-heads` run data-parallel when launched by
PyTorch's own launcher, torchrun (the same as `python -m torch.distributed.run`):

    torchrun --standalone --nproc-per-node 4 -m dysco_interp.cli -- evaluate \
        --model qwen2.5-coder-0.5b --task path_traversal --data data/ --methods vanilla,dysco \
        --out results.jsonl
    torchrun --standalone --nproc-per-node 4 -m dysco_interp.cli -- detect-heads \
        --model qwen2.5-coder-0.5b --n 64 --length 8k --resume-dir runs/ --out heads.json
    # no GPU: the same with --device cpu (gloo), e.g. --nproc-per-node 2 to try it out

The `--` keeps torchrun from reading the command's flags as its own: it takes any unambiguous
prefix of its options, so without it detect-heads' `--n` stops torchrun ("ambiguous option").

Without torchrun (or with one process) nothing changes: no process group, the whole run in one
process. Under torchrun:

- Each rank runs on `cuda:LOCAL_RANK` (or the CPU when there is no GPU, or with `--device cpu`);
  the process group uses NCCL for GPU tensors and gloo for what the ranks tell each other.
- The work still to do (instances, or detection examples, missing from the store) is dealt out
  round-robin in data order: the same store and data give every rank the same share. An
  evaluation keeps every method of an instance on one rank, so methods still share prefills.
- Each rank writes its records to its own shard beside the store (results.rank1.jsonl beside
  results.jsonl), a store with the same settings header, marked as a shard of that store, and
  its own lock; a file of that name that is no such shard stops the run untouched. Rank 0 holds the
  store's lock for the whole run, so a second run on the same store is refused (rank 0 alone
  checks the lock before the model loads: the check takes it for a moment). When every rank
  is done, rank 0 folds the shards into the store in the order one process would have written
  them (instance by instance, methods in the order given), then deletes them.
- A rank that dies ends the whole run (torchrun stops the others). Every record written so far is
  in the store or in a shard; the same command (with any number of processes, or none) folds
  the shards in first, then does only the work that is missing.
- Only rank 0 prints: progress bars (of its share), tables, files. Bad input is refused on every
  rank before the model loads, one line each (torchrun then adds its own failure summary).
- Detection gathers every rank's per-example scores, so each rank ends with the same result as
  one process would (the mean over examples is taken in example order).

From Python, `evaluate` and `detect` shard their work whenever a default process group is
initialised (`torch.distributed.init_process_group`): call them on every rank with the same
arguments, each rank with its model on its own device.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import torch

from dysco_interp.errors import ConfigError, DyscoError
from dysco_interp.stores.store import (
    ResultStore,
    StoreError,
    StoreMismatchError,
    create_shard,
    differences,
    read_store,
)

T = TypeVar("T")

# Ranks wait for the slowest share at the end of a run. A rank that dies ends the run through
# torchrun, so this bounds only a rank that hangs.
WAIT = timedelta(days=7)


class OtherRankError(DyscoError):
    """Another rank of a data-parallel run stopped on an error; this one stops with it."""


@dataclass(frozen=True)
class World:
    """This process's place in a data-parallel run: rank `rank` of `size` (rank 0 of 1 alone)."""

    rank: int = 0
    size: int = 1

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that prints and writes the outputs."""
        return self.rank == 0

    def share(self, items: Sequence[T]) -> list[T]:
        """This rank's items: every size-th, from position rank (round-robin, in order)."""
        return list(items[self.rank :: self.size])


def current_world() -> World:
    """The default process group's world, or a world of one when none is initialised."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return World(dist.get_rank(), dist.get_world_size())
    return World()


@dataclass(frozen=True)
class Launch:
    """What torchrun tells a process through its environment."""

    rank: int
    local_rank: int
    size: int

    @property
    def world(self) -> World:
        return World(self.rank, self.size)


def torchrun_launch(environ: dict[str, str] | None = None) -> Launch | None:
    """The torchrun launch this process belongs to, or None when run alone (or as torchrun's
    only process); a ConfigError for an environment torchrun would not have set."""
    env = os.environ if environ is None else environ
    if "WORLD_SIZE" not in env:
        return None
    try:
        size, rank, local_rank = (int(env.get(k, "")) for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK"))
    except ValueError:
        raise ConfigError("WORLD_SIZE is set but RANK or LOCAL_RANK is missing or not a number: launch the command "
                          "with torchrun (`torchrun --nproc-per-node N -m dysco_interp.cli ...`)") from None
    if size < 1 or not 0 <= rank < size or local_rank < 0:
        raise ConfigError(f"RANK {rank} and LOCAL_RANK {local_rank} do not fit WORLD_SIZE {size}: launch the command "
                          "with torchrun")
    if size == 1:
        return None
    missing = [k for k in ("MASTER_ADDR", "MASTER_PORT") if not env.get(k)]
    if missing:
        raise ConfigError(f"WORLD_SIZE is {size} but {' and '.join(missing)} is not set: launch the command with "
                          "torchrun, which sets them")
    return Launch(rank, local_rank, size)


def rank_device(launch: Launch | None, requested: str | None) -> str | None:
    """The device a rank runs on: cuda:LOCAL_RANK (CUDA present, or --device cuda), else the CPU;
    `requested` as it is without torchrun."""
    if launch is None:
        return requested
    if requested is not None and requested.strip().lower() == "cpu":
        return "cpu"
    if requested is not None and requested.strip().lower() != "cuda":
        raise ConfigError(f"--device {requested}: under torchrun each rank runs on cuda:LOCAL_RANK; "
                          "pass --device cuda or cpu, or leave it out")
    if not torch.cuda.is_available():
        if requested is not None:
            raise ConfigError("--device cuda requested but CUDA is not available on this machine")
        return "cpu"
    if launch.local_rank >= torch.cuda.device_count():
        raise ConfigError(f"local rank {launch.local_rank} has no GPU: this machine has {torch.cuda.device_count()}; "
                          "start at most that many processes per node (--nproc-per-node)")
    return f"cuda:{launch.local_rank}"


@contextlib.contextmanager
def process_group(launch: Launch | None, device: str | None) -> Iterator[World]:
    """The default process group of a torchrun launch for the block (nothing without one):
    NCCL for tensors on the GPU and gloo on the CPU, where the ranks exchange what they report."""
    if launch is None:
        yield World()
        return
    import torch.distributed as dist

    if not dist.is_available():
        raise ConfigError("this PyTorch build has no torch.distributed: run without torchrun")
    gpu = device is not None and device.startswith("cuda")
    if gpu:
        torch.cuda.set_device(torch.device(device))
    dist.init_process_group("cpu:gloo,cuda:nccl" if gpu else "gloo", timeout=WAIT)
    try:
        yield launch.world
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def quiet_unless_main(world: World) -> Iterator[None]:
    """Status lines and bars of ranks other than 0 go nowhere; errors still reach the caller."""
    if world.is_main:
        yield
        return
    with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull), contextlib.redirect_stderr(devnull):
        yield


def gather(world: World, value: Any) -> list[Any]:
    """Every rank's `value`, by rank, on every rank (a world of one: [value])."""
    if world.size == 1:
        return [value]
    import torch.distributed as dist

    out: list[Any] = [None] * world.size
    dist.all_gather_object(out, value)
    return out


def agree(world: World, step: Callable[[], T]) -> T:
    """`step()` on every rank, returning this rank's result once all have run it; when it raised
    a DyscoError on any rank, every rank stops: that rank with its own error, the others with an
    OtherRankError naming it."""
    try:
        result = step()
    except DyscoError as e:
        gather(world, str(e))
        raise
    for rank, message in enumerate(gather(world, None)):
        if message is not None:
            raise OtherRankError(f"rank {rank} stopped: {message}")
    return result


@dataclass
class Shard:
    """This rank's part of a sharded store: what the store held at the start, and the rank's
    own shard, which takes its new records."""

    path: Path  # the store
    store: ResultStore  # this rank's shard (a writer)
    done: dict[tuple, dict] = field(default_factory=dict)  # the store's records, by key

    def __contains__(self, record: Mapping) -> bool:
        """Whether the store held a record of this key at the start, or the shard holds one now."""
        return self.store.key(record) in self.done or record in self.store


@contextlib.contextmanager
def sharded_store(
    world: World,
    open_main: Callable[[], ResultStore],
    open_shard: Callable[[Path], ResultStore],
    order: Callable[[dict], Any] | None = None,
) -> Iterator[Shard]:
    """The store of a data-parallel run, and this rank's shard of it, for the block.

    Rank 0 opens the store with `open_main` (a writer, which folds in what a killed run left in
    shards) and keeps it for the run; every rank then reads it and opens its shard with
    `open_shard(path)`. When the block ends without an error, rank 0 folds every shard into the
    store (sorted by `order`) once all ranks are done. Errors while opening stop every rank.
    """
    main: ResultStore | None = None
    shard: ResultStore | None = None

    def open_store() -> str | None:
        nonlocal main
        if world.is_main:
            main = open_main()
            return str(main.path)
        return None

    try:
        path = Path(gather(world, agree(world, open_store))[0])

        def open_own_shard() -> Shard:
            nonlocal shard
            contents = read_store(path)
            if contents is None or contents.header is None:
                raise StoreError(f"{path} lost its header while the run started; start again")
            try:
                shard = open_shard(create_shard(path, world.rank, contents.header))
            except StoreMismatchError as e:  # the shard starts with the store's header
                raise StoreMismatchError(f"rank {world.rank} computes other settings than the store {path} holds: "
                                         f"{e}") from None
            stored = contents.settings or {}
            if stored != shard.settings:
                raise StoreMismatchError(f"rank {world.rank} computes other settings than the store {path} holds "
                                         f"({'; '.join(differences(stored, shard.settings or {}))})")
            return Shard(path, shard, {shard.key(r): r for r in reversed(contents.records)})

        own = agree(world, open_own_shard)
        yield own
        own.store.close()
        agree(world, lambda: None)  # every rank's records are in its shard

        def fold() -> None:
            if main is not None:
                main.fold_shards(order)
                main.close()

        agree(world, fold)
    finally:
        for store in (shard, main):
            if store is not None:
                store.close()


def note_world(world: World) -> str:
    """' (rank 0 of 4: its share)' for a progress bar's label; '' alone."""
    return "" if world.size == 1 else f" (rank {world.rank} of {world.size}: its share)"


__all__ = [
    "WAIT",
    "Launch",
    "OtherRankError",
    "Shard",
    "World",
    "agree",
    "current_world",
    "gather",
    "note_world",
    "process_group",
    "quiet_unless_main",
    "rank_device",
    "sharded_store",
    "torchrun_launch",
]
