"""Seeded random streams for randomised rules (Clip-Cov's keys): one factory, used two ways.

- Our trainer (`training.rule_trainer`) makes a fresh stream for each micro-batch, a function of
  (seed, optimizer step, micro-batch, process) only: a resumed run draws what an uninterrupted one would.
- The verl plugin (`integrations.verl`) makes one stream per rule and process, seeded from
  (actor.data_loader_seed, data-parallel rank), and advances it with every policy-loss call.

Both hash their parts to a 32-bit seed: torch's CPU generator (mt19937) keeps only the low 32 bits of a seed.
"""

from __future__ import annotations

import hashlib

import torch


def seeded_stream(*parts: int) -> torch.Generator:
    """A CPU generator seeded from the SHA-256 of 'p0:p1:...': equal parts, equal draws."""
    digest = hashlib.sha256(":".join(str(part) for part in parts).encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:4], "little"))


def micro_batch_stream(seed: int, global_step: int, micro_step: int, process: int = 0) -> torch.Generator:
    """The trainer's stream for one micro-batch; each process draws its own (process 0 is left out of the hash, so
    a one-process run draws what it did before processes were counted)."""
    return seeded_stream(seed, global_step, micro_step, *((process,) if process else ()))


def process_stream(seed: int, rank: int) -> torch.Generator:
    """The start of a rule's stream in one verl process; the plugin keeps it and advances it by every draw."""
    return seeded_stream(seed, rank)
