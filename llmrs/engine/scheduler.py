"""Continuous batching with one rule (vLLM V1): each step gives each running sequence tokens until its
computed count catches up with its length, within a token budget (`max_num_batched_tokens`) and a sequence
cap (`max_num_seqs`). Prefill, chunked prefill, decode and prefix-cache hits are all the same thing: a
sequence with `num_computed_tokens < num_tokens`.

Running sequences are served first, oldest first; then waiting ones are admitted first come, first served.
When blocks run out, the most recently admitted running sequence is preempted: its blocks are freed and it
goes back to the front of the waiting queue, to be recomputed (prompt + what it generated so far) later.
A step that preempted admits nobody new, so the freed blocks go to the sequences already running.

Planning runs one step ahead of the results when the engine asks it to (async scheduling, vLLM V1's): a planned
step advances its sequences' computed counts at once, and each token it will sample counts as pending
(`Sequence.num_pending`). The next plan can then be made before those tokens are known: a decode row whose input
is a pending token gets a placeholder id and `StepBatch.feed` names the sample of the previous step that the
runner puts there on the device. `update` fills the pending tokens in later, skipping sequences that ended
(stop token, abort) while the step ran ahead: their extra token is thrown away. Sequences whose outputs in flight
reach max_tokens are not planned again.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from llmrs.engine.batch import StepBatch, build_step_batch_arrays
from llmrs.engine.kv_cache import KVCacheManager
from llmrs.engine.sampling import SampleResult
from llmrs.engine.sequence import FINISHED, RUNNING, WAITING, Sequence, StepOutput


@dataclass(slots=True)
class SchedulerOutput:
    batch: StepBatch
    seqs: list[Sequence]  # in batch order
    num_new_tokens: list[int]
    sample_seqs: list[Sequence]  # sequences whose last new token is sampled, in sample_rows order
    preempted: list[Sequence] = field(default_factory=list)
    computed_after: list[int] = field(default_factory=list)  # each sequence's computed tokens after the step


class Scheduler:
    def __init__(self, kv: KVCacheManager, max_num_seqs: int, max_num_batched_tokens: int, max_model_len: int):
        self.kv = kv
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # admission order
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        seq.status = WAITING
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # ------------------------------------------------------------------ planning
    def schedule(self) -> SchedulerOutput | None:
        budget = self.max_num_batched_tokens
        planned: list[tuple[Sequence, int]] = []
        preempted: list[Sequence] = []

        for seq in list(self.running):
            if budget == 0:
                break
            if seq.status is not RUNNING:  # preempted earlier in this loop
                continue
            if seq.num_pending and seq.at_length_limit:  # ends with the tokens in flight
                continue
            n = min(seq.num_tokens - seq.num_computed_tokens, budget)
            while not self.kv.allocate_slots(seq, seq.num_computed_tokens + n):
                victim = self.running.pop()
                self._preempt(victim)
                preempted.append(victim)
                if victim is seq:
                    break
            else:
                planned.append((seq, n))
                budget -= n

        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs and not preempted:
            seq = self.waiting[0]
            if seq.num_pending:  # preempted while its last step ran ahead: back once that step's token is in
                break
            hits = self.kv.get_computed_blocks(seq.all_ids)
            computed = len(hits) * self.kv.block_size
            n = min(seq.num_tokens - computed, budget)
            if not self.kv.allocate_slots(seq, computed + n, hits):
                break
            self.waiting.popleft()
            seq.num_computed_tokens = computed
            seq.status = RUNNING
            self.running.append(seq)
            planned.append((seq, n))
            budget -= n

        if not planned:
            return None
        return self._build(planned, preempted)

    def _preempt(self, seq: Sequence) -> None:
        self.kv.free(seq)
        seq.num_computed_tokens = 0
        seq.status = WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def _build(self, planned: list[tuple[Sequence, int]], preempted: list[Sequence]) -> SchedulerOutput:
        seqs = [s for s, _ in planned]
        nums = [n for _, n in planned]
        token_ids: list[int] = []
        cached: list[int] = []
        sample: list[bool] = []
        sample_seqs = []
        after: list[int] = []
        feed: list[tuple[int, int]] = []  # (row, sample of the previous step) for inputs still in flight
        for seq, n in planned:
            start = seq.num_computed_tokens
            end = start + n
            caught_up = end == seq.num_tokens  # the last token's logits give the next token
            if n == 1 and caught_up:  # decode: the one new token is the last one
                if seq.num_pending:
                    feed.append((len(token_ids), seq.pending_index))
                    token_ids.append(0)
                else:
                    token_ids.append(seq.output_ids[-1] if seq.output_ids else seq.prompt_ids[-1])
            else:
                assert not seq.num_pending, "a multi-token step over a token in flight"
                token_ids.extend(seq.token_slice(start, end))
            cached.append(start)
            sample.append(caught_up)
            seq.num_computed_tokens = end
            after.append(end)
            if caught_up:
                seq.num_pending += 1
                seq.pending_index = len(sample_seqs)
                sample_seqs.append(seq)
        batch = build_step_batch_arrays(token_ids, cached, nums, self.kv.block_tables(seqs), sample,
                                        self.kv.block_size)
        if feed:
            batch.feed = np.full(len(token_ids), -1, dtype=np.int32)
            rows, src = zip(*feed)
            batch.feed[list(rows)] = src
        return SchedulerOutput(batch, seqs, nums, sample_seqs, preempted, after)

    # ------------------------------------------------------------------ after the step
    def update(self, out: SchedulerOutput, results: list[SampleResult]) -> list[StepOutput]:
        """Apply a step's sampled tokens (in sample_seqs order); returns the outputs of the sequences still on."""
        assert len(results) == len(out.sample_seqs)
        kv = self.kv
        if kv.pool.enable_prefix_caching:
            bs = kv.block_size
            for seq, computed in zip(out.seqs, out.computed_after):
                # a sequence preempted or finished since the step was planned has no blocks to register
                if seq.status is RUNNING and computed // bs > kv.num_hashed_blocks(seq):  # a block just filled
                    kv.cache_full_blocks(seq, seq.all_ids, computed)
        outputs = []
        finished = []
        for seq, res in zip(out.sample_seqs, results):
            seq.num_pending -= 1
            if seq.status is FINISHED:  # ended (stop token, abort) while this step ran ahead: its token is dropped
                continue
            outputs.append(seq.append(res))
            if seq.status is FINISHED:
                finished.append(seq)
        if finished:
            gone = set(finished)
            self.running = [s for s in self.running if s not in gone]  # one pass, not a list.remove each
            for seq in finished:
                self.finish(seq)
        return outputs

    def finish(self, seq: Sequence) -> None:
        """Remove a finished (or aborted) sequence and free its blocks at once."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.kv.free(seq)
