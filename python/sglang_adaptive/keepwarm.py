"""Draft keep-warm: what a plain decode step does for the EAGLE-3 draft.

A plain step at position S decodes the bonus token ``tok[S]`` and samples
``tok[S+1]``; the target hands over its aux hidden states ``aux[S]`` (the plain
graphs capture them). The draft's K/V at S encode ``(embed(tok[S+1]), fc(aux[S]))``
at position S, written to the draft pool at the slot the target used
(``req_to_token[req, S]``; the draft pool shares the index space). Left unwritten,
that slot is a hole the draft attends over for the rest of the request (and, through
the radix cache, for requests that share the prefix), and the next speculative step
drafts from a top-k and hidden state that never saw the plain tokens.

Strategies (``--speculative-draft-keep-warm``), each one object with the same four
calls, so the worker has no ``if enabled:``:

- ``none``: nothing (``NoKeepWarm``).
- ``kv``: per plain step, the K/V of the new position only: embedding, ``fc`` and
  the draft layer's two input norms and K/V projection (rope on K), then the pool
  write. No draft attention, MLP, lm_head or top-k: in EAGLE-3 the K/V at a position
  depend on that position's inputs alone (at TP 1 one CUDA graph per plain batch
  size). The ``fc`` output is stashed per request slot; when speculation resumes,
  one width-1 draft pass per request that ended on a plain step (from the stash and
  its bonus token) produces the top-k and hidden state the first speculative step
  drafts from, as if the draft had never stopped.
- ``full``: per plain step, the draft's whole width-1 extend (upstream's
  ``prepare_for_draft_extend`` + an eager draft forward), whose top-k and hidden
  state ride on the plain result.

Where the ``kv`` writer's graphs replay (``SameStream``, ``SideStream``): on a stream of
their own by default, so a step's write overlaps the next target step instead of adding
to it; everything else that touches the draft pool or the stash (a speculative step,
a prefill, an eager write) first makes the forward stream wait for the writes in flight.

The K/V writer knows the Llama EAGLE-3 draft (one layer) on an unquantized MHA pool.
Any other draft (the MLA draft of Kimi K2.5, an FP8 or sliding-window draft pool)
takes ``none`` by default (see ``resolve``) and refuses an explicit ``kv`` at start-up.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import time

import torch
import torch.nn.functional as F

from sglang_adaptive.args import ConfigError
from sglang_adaptive.policy import KEEP_WARM_FULL, KEEP_WARM_KV, KEEP_WARM_NONE
from sglang_adaptive.upstream import sglang_symbols as up

logger = logging.getLogger(__name__)

# Testing only: after each K/V write, run the full width-1 draft extend at the same
# position too and log how far the K/V it writes differ from the writer's (a host
# sync per plain step). The GPU test reads the last line (CHECK_LOG_PATTERN).
CHECK_ENV = "SGLANG_ADAPTIVE_KEEP_WARM_CHECK"
CHECK_LOG_PATTERN = (r"AdaptiveEAGLE keep-warm check: (\d+) plain steps, max \|kv - draft extend\| "
                     r"K ([\d.e+-]+) V ([\d.e+-]+), max \|K\| ([\d.e+-]+) \|V\| ([\d.e+-]+)")
CHECK_LOG_EVERY = 20
# "0" replays the writer's graphs on the forward stream, after the target step, as
# before the side stream: a way back, and the measurement's other half.
STREAM_ENV = "SGLANG_ADAPTIVE_KEEP_WARM_STREAM"
# N > 1: the writes of up to N plain steps wait and are computed together
# (``DeferredWrites``), so the writer's weights are read once per N steps; 1 writes
# every step through the per-step graphs.
DEFER_ENV = "SGLANG_ADAPTIVE_KEEP_WARM_DEFER"
# 8B pair, H200, always plain: the writer's share of a steady plain step fell from 0.7%
# (per step) to 0.25-0.4% at 8, with the same tokens and acceptance on the tiny pair
# (benchmark/results/2026-12-01-h200-deferral-plain-prefill).
DEFAULT_DEFER_STEPS = 8
# Each flush of the deferred writes replays a CUDA graph captured per row count
# (``DeferredWrites.capture``) instead of launching its ~30 kernels eagerly: on the
# H200's host 0.17 ms a plain step less on the tiny pair, where the host sets the pace,
# for 41 MB and 0.1 s of capture (benchmark/results/2026-12-02-h200-flush-graphs).
# "0" keeps the eager flush.
FLUSH_GRAPHS_ENV = "SGLANG_ADAPTIVE_KEEP_WARM_FLUSH_GRAPHS"

# Draft model classes the K/V writer knows, and the one pool class it writes.
KV_DRAFT_CLASSES = ("LlamaForCausalLMEagle3",)
KV_POOL_CLASS = "MHATokenToKVPool"


class NoKeepWarm:
    """``none``: plain steps leave the draft alone."""

    name = KEEP_WARM_NONE
    stash_bytes = 0
    # True where the plain step reads scheduler buffers (req_to_token) after its target
    # graph: the scheduler's WAR barrier must then wait for the whole step.
    reads_after_forward = False
    # Whether ``prefill`` (kv's) can stand in for the draft's extend of a prefill.
    writes_prefill = False

    def before_plain(self, batch, new_seq_lens, loc):
        """Called before the plain forward is enqueued; returns what ``after_plain`` needs.
        ``new_seq_lens`` (S + 1) and ``loc`` (the slots of position S) are this step's
        own tensors, not the scheduler's."""
        return None

    def after_plain(self, state, batch, result):
        """Called after sampling. Returns the fresh draft state (topk_p, topk_index,
        hidden_states, draft_probs) for the next step, or None to pass the old one on."""
        return None

    def before_spec(self, batch) -> None:
        """Called before a speculative decode step; may refresh ``batch.spec_info``."""

    def on_prefill(self, batch) -> None:
        """Called before a prefill (extend) batch."""

    def describe_graphs(self) -> str:
        return "eager"


class DraftPass:
    """One width-1 draft extend: the draft forward at one position per request, its
    K/V write included, through upstream's own preparation (eager: the draft-extend
    graphs are captured at the start-up width)."""

    def __init__(self, draft_worker, topk: int):
        self.worker = draft_worker
        self.runner = draft_worker.draft_runner
        self.topk = topk

    def __call__(self, batch, token_ids, hidden, prefix_lens, prefix_lens_cpu, loc):
        """Draft position ``prefix_lens`` of each request: input ``token_ids`` (the
        token after it), ``hidden`` (the target's aux hidden at it, or their ``fc``
        output), K/V written to ``loc``. Returns (topk_p, topk_index, hidden, probs)."""
        bs = token_ids.shape[0]
        ones = torch.ones(bs, dtype=torch.int32, device=token_ids.device)
        extend_input = up.EagleDraftExtendInput(
            hidden_states=hidden,
            num_correct_drafts=ones - 1,
            num_accept_tokens=ones,
            num_tokens_per_req=1,
            num_tokens_for_logprob_per_req=1,
        )
        # prepare_for_draft_extend rewrites the batch it is given; the scheduler's stays.
        view = copy.copy(batch)
        view.seq_lens = prefix_lens
        view.seq_lens_cpu = prefix_lens_cpu
        view.out_cache_loc = loc
        with self.contexts():
            forward_batch = up.prepare_for_draft_extend(
                extend_input, view, token_ids, 1, self.runner, None,
                return_hidden_states_before_norm=False,
            )
            out = self.runner.forward(forward_batch).logits_output
        logits = out.next_token_logits
        # The same choice as upstream's draft extend after verify.
        probs = None
        if up.get_spec().speculative_use_rejection_sampling:
            probs, topk_p, topk_index = up.sample_draft_proposal(logits, batch.sampling_info.temperatures)
        elif self.topk == 1:
            topk_index = torch.argmax(logits, dim=-1, keepdim=True)
            topk_p = torch.ones_like(topk_index, dtype=torch.float32)
        else:
            p = up.renorm_draft_probs(logits, batch.sampling_info,
                                      up.get_spec().speculative_use_rejection_sampling)
            topk_p, topk_index = up.fast_topk(p, self.topk, dim=-1)
        return topk_p, topk_index, out.hidden_states, probs

    def contexts(self):
        stack = contextlib.ExitStack()
        stack.enter_context(self.worker.draft_tp_context(self.runner.tp_group))
        stack.enter_context(up.speculative_moe_backend_context())
        stack.enter_context(up.speculative_moe_a2a_backend_context())
        return stack


class FullKeepWarm(NoKeepWarm):
    """``full``: the draft's width-1 extend at every plain step."""

    name = KEEP_WARM_FULL
    # The draft pass builds attention metadata from req_to_token after the target
    # graph: the scheduler must fence its next writes on the whole step.
    reads_after_forward = True

    def __init__(self, draft_pass: DraftPass):
        self.draft_pass = draft_pass

    def before_plain(self, batch, new_seq_lens, loc):
        return new_seq_lens - 1, loc

    def after_plain(self, state, batch, result):
        positions, loc = state
        return self.draft_pass(
            batch, result.next_token_ids.to(torch.int64), result.logits_output.hidden_states,
            positions, batch.seq_lens_cpu, loc,
        )


class LlamaKVWriter:
    """The draft K/V of one position per request for ``LlamaForCausalLMEagle3``,
    computed as its layer 0 computes them (``llama_eagle3.LlamaModel.forward`` and
    ``LlamaDecoderLayer.forward``), minus everything the K/V do not depend on."""

    def __init__(self, model, pool):
        inner = model.model
        self.embed = inner.embed_tokens
        self.input_norm, self.fc_norm, self.fc = inner.input_norm, inner.fc_norm, inner.fc
        self.num_aux = inner.num_aux_hidden_states
        layer = inner.layers[0]
        self.input_layernorm, self.hidden_norm = layer.input_layernorm, layer.hidden_norm
        attn = layer.self_attn
        self.rotary, self.radix = attn.rotary_emb, attn.attn
        self.head_dim, self.num_kv_heads = attn.head_dim, attn.num_kv_heads
        self.q_size, self.kv_size = attn.q_size, attn.kv_size
        # The K/V rows of this rank's fused QKV weight (q rows first): a view, no copy.
        self.w_kv = attn.qkv_proj.weight[self.q_size:self.q_size + 2 * self.kv_size]
        self.pool = pool
        self.hidden_size = inner.fc.out_features
        self.aux_width = inner.fc.in_features

    def fc_hidden(self, aux):
        h = aux
        if self.input_norm is not None:
            h = self.input_norm(h)
        if self.fc_norm is not None:
            h = torch.cat([norm(c) for norm, c in zip(self.fc_norm, h.chunk(self.num_aux, dim=-1))], dim=-1)
        return self.fc(h)

    def write(self, token_ids, aux, positions, loc):
        """Write the K/V; returns the ``fc`` output (the draft's input hidden state)."""
        h, k, v = self.compute(token_ids, aux, positions)
        self.store(loc, k, v)
        return h

    def compute(self, token_ids, aux, positions):
        """The ``fc`` output, K and V of these rows; nothing written."""
        h = self.fc_hidden(aux)
        x = torch.cat([self.input_layernorm(self.embed(token_ids)), self.hidden_norm(h)], dim=-1)
        k, v = F.linear(x, self.w_kv).split([self.kv_size, self.kv_size], dim=-1)
        # The rope kernels want a query with a multiple of the K heads: scratch.
        _, k = self.rotary(positions, torch.empty_like(k), k)
        return h, k, v

    def store(self, loc, k, v) -> None:
        self.pool.set_kv_buffer(
            self.radix, loc,
            k.reshape(-1, self.num_kv_heads, self.head_dim), v.reshape(-1, self.num_kv_heads, self.head_dim),
        )


class KVCheck:
    """Compares the writer's K/V with what the draft's own extend writes at the same
    slots (``CHECK_ENV``): the writer must reproduce the draft layer's K/V."""

    def __init__(self, writer: LlamaKVWriter):
        self.writer = writer
        self.steps = 0
        self.max_diff = [0.0, 0.0]
        self.max_abs = [0.0, 0.0]

    def __call__(self, run_draft_pass, loc) -> None:
        layer_id = self.writer.radix.layer_id
        buffers = (self.writer.pool.get_key_buffer(layer_id), self.writer.pool.get_value_buffer(layer_id))
        written = [b[loc].float() for b in buffers]
        run_draft_pass()
        for i, (b, w) in enumerate(zip(buffers, written)):
            ref = b[loc].float()
            self.max_diff[i] = max(self.max_diff[i], (ref - w).abs().max().item())
            self.max_abs[i] = max(self.max_abs[i], ref.abs().max().item())
        self.steps += 1
        if self.steps % CHECK_LOG_EVERY == 1:
            logger.info(
                "AdaptiveEAGLE keep-warm check: %d plain steps, max |kv - draft extend| K %.3e V %.3e, "
                "max |K| %.3e |V| %.3e", self.steps, *self.max_diff, *self.max_abs)


class SameStream:
    """The writer's graphs replay on the forward stream, right after the target step
    (and add to it): stream order is all the ordering needed."""

    name = "forward stream"
    depth = 1  # graph sets: one, its inputs are rewritten after its replay ran

    def new_events(self) -> tuple:
        """The (ready, done) events of one set of inputs (none on one stream)."""
        return None, None

    def reuse(self, graphs) -> None:
        """Before ``graphs``' static inputs are rewritten for a new step."""

    def replay(self, graphs, graph) -> None:
        graph.replay()

    def fence(self) -> None:
        """Before the forward stream reads or writes the draft pool or the stash."""


class SideStream(SameStream):
    """The writer's graphs replay on a stream of their own, after the step's sampling,
    overlapping the next target step (both read weights; the writer's fill the target's
    gaps). Two graph sets take turns, so a step's inputs never overwrite those the
    previous step's write may still be reading. No host sync: only stream waits."""

    name = "side stream"
    depth = 2

    def __init__(self, device):
        self.stream = torch.cuda.Stream(device)
        self.last = None  # the done event of the latest write not yet fenced

    def new_events(self) -> tuple:
        return torch.cuda.Event(), torch.cuda.Event()

    def reuse(self, graphs) -> None:
        torch.cuda.current_stream().wait_event(graphs.done)

    def replay(self, graphs, graph) -> None:
        graphs.ready.record(torch.cuda.current_stream())
        self.stream.wait_event(graphs.ready)
        with torch.cuda.stream(self.stream):
            graph.replay()
        graphs.done.record(self.stream)
        self.last = graphs.done

    def fence(self) -> None:
        if self.last is not None:  # the side stream runs in order: the latest covers all
            torch.cuda.current_stream().wait_event(self.last)
            self.last = None


def capture_graphs(bodies: dict, pool) -> dict:
    """A CUDA graph of each body (key -> callable), in one memory pool: every body runs
    once first (kernels compile on first use, not under capture), then each is captured,
    the last key first (the largest, where keys grow). The graphs keep the bodies' order."""
    for body in bodies.values():
        body()
    torch.cuda.synchronize()
    graphs = {}
    for key in reversed(list(bodies)):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            bodies[key]()
        graphs[key] = graph
    torch.cuda.synchronize()
    return {key: graphs[key] for key in bodies}


class WriterGraphs:
    """The K/V write and the stash of one plain step, captured per batch size over
    static inputs; padding rows write to the draft pool's padding slot 0 and the
    stash's dump row. Captured before serving, so those writes are harmless."""

    def __init__(self, keep: KVKeepWarm, batch_sizes: list[int], pool):
        tic = time.perf_counter()
        free_before = torch.cuda.mem_get_info()[0]
        self.keep, self.batch_sizes = keep, batch_sizes
        # The side stream's hand-over: inputs in place (ready), write done (done).
        self.ready, self.done = keep.lane.new_events()
        device, max_bs = keep.hidden.device, batch_sizes[-1]
        writer = keep.writer
        self.tokens = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.aux = torch.zeros(max_bs, writer.aux_width, dtype=keep.hidden.dtype, device=device)
        self.positions = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.loc = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.slots = torch.full((max_bs,), keep.dump_slot, dtype=torch.int64, device=device)
        self.graphs = capture_graphs({bs: (lambda bs=bs: self._body(bs)) for bs in batch_sizes}, pool)
        self.memory_gib = (free_before - torch.cuda.mem_get_info()[0]) / 2**30
        self.seconds = time.perf_counter() - tic

    def _body(self, bs: int) -> None:
        self.keep._write(self.tokens[:bs], self.aux[:bs], self.positions[:bs], self.loc[:bs], self.slots[:bs])

    def bucket(self, n: int) -> int | None:
        return next((b for b in self.batch_sizes if b >= n), None)

    def load_indices(self, n, slots, new_seq_lens, loc) -> None:
        b = self.bucket(n)
        if b > n:  # padding rows: the padding slot, the dump row
            self.loc[n:b].zero_()
            self.slots[n:b].fill_(self.keep.dump_slot)
        self.slots[:n].copy_(slots)
        torch.sub(new_seq_lens, 1, out=self.positions[:n])
        self.loc[:n].copy_(loc)

    def run(self, n, token_ids, aux, lane):
        """Replay for ``n`` requests; returns this step's positions and slots (views)."""
        self.tokens[:n].copy_(token_ids)
        self.aux[:n].copy_(aux)
        lane.replay(self, self.graphs[self.bucket(n)])
        return self.positions[:n], self.loc[:n]


class DeferredRows:
    """The inputs of the plain steps whose writes wait, one step after another."""

    def __init__(self, rows: int, aux_width: int, dtype, device, events):
        self.tokens = torch.zeros(rows, dtype=torch.int64, device=device)
        self.aux = torch.zeros(rows, aux_width, dtype=dtype, device=device)
        self.positions, self.loc, self.slots = (torch.zeros(rows, dtype=torch.int64, device=device)
                                                for _ in range(3))
        self.ready, self.done = events
        self.spans: list[tuple[int, int]] = []  # (first row, rows) per step, in step order
        self.graphs: dict = {}  # row count (ascending) -> captured flush (DeferredWrites.capture); none: eager
        self.bytes = sum(t.numel() * t.element_size() for t in (self.tokens, self.aux, self.positions,
                                                                 self.loc, self.slots))

    @property
    def used(self) -> int:
        return self.spans[-1][0] + self.spans[-1][1] if self.spans else 0


class DeferredWrites:
    """``kv``'s writes of up to ``steps`` plain steps computed at once.

    Per plain step only the inputs are copied (the token, the aux hidden state, the
    position, slot and request slot of each row). A flush computes ``fc`` and the K/V
    of all waiting rows together, so the writer's weights (116 MB a step on the 8B
    pair: most of what it still costs on the side stream) are read once per flush, and
    stores them at once, each KV slot and stash row from its latest row only
    (``superseded``): a KV slot freed and reused inside the window, or a request's stash
    row, ends with its latest step. A flush runs when ``steps`` steps wait, before a step
    that would not fit, and wherever the forward stream must see the writes
    (``KVKeepWarm._fence``). It goes through the lane: on the side stream two buffers
    take turns. Its kernels do not depend on how the rows split into steps, so it can
    replay as a graph per row count (``capture``)."""

    def __init__(self, keep: KVKeepWarm, steps: int, rows: int, lane: SameStream):
        self.keep, self.steps, self.rows, self.lane = keep, steps, rows, lane
        dtype, device = keep.hidden.dtype, keep.hidden.device
        self.buffers = [DeferredRows(rows, keep.writer.aux_width, dtype, device, lane.new_events())
                        for _ in range(lane.depth)]
        self.turn = 0
        self.graph_gib = self.graph_seconds = 0.0

    @property
    def bytes(self) -> int:
        return sum(b.bytes for b in self.buffers)

    def begin(self, slots, new_seq_lens, loc):
        n = new_seq_lens.shape[0]
        if self.buffers[self.turn].used + n > self.rows:
            self.flush()
        buf = self.buffers[self.turn]
        rows = slice(buf.used, buf.used + n)
        buf.slots[rows].copy_(slots)
        torch.sub(new_seq_lens, 1, out=buf.positions[rows])
        buf.loc[rows].copy_(loc)
        buf.spans.append((rows.start, n))
        return buf, rows

    def finish(self, state, token_ids, aux) -> None:
        buf, rows = state
        buf.tokens[rows].copy_(token_ids)
        buf.aux[rows].copy_(aux)
        if len(buf.spans) >= self.steps:
            self.flush()

    def flush(self) -> None:
        buf = self.buffers[self.turn]
        if not buf.spans:
            return
        rows = buf.used
        buf.spans = []
        self.lane.replay(buf, self._flush_of(buf, rows))
        self.turn = (self.turn + 1) % len(self.buffers)
        # The next buffer's inputs are rewritten from now on: its last flush must have read them.
        self.lane.reuse(self.buffers[self.turn])

    def _flush_of(self, buf: DeferredRows, rows: int):
        """What writes the first ``rows`` rows: the captured graph of the smallest row
        count that holds them, its padding rows aimed at the draft pool's padding slot
        0 and the stash's dump row; else the eager write."""
        size = next((n for n in buf.graphs if n >= rows), None)
        if size is None:
            return _Call(lambda: self._write(buf, rows))
        if size > rows:
            buf.loc[rows:size].zero_()
            buf.slots[rows:size].fill_(self.keep.dump_slot)
        return buf.graphs[size]

    def _write(self, buf: DeferredRows, rows: int) -> None:
        keep = self.keep
        h, k, v = keep.writer.compute(buf.tokens[:rows], buf.aux[:rows], buf.positions[:rows])
        loc, slots = buf.loc[:rows], buf.slots[:rows]
        # Rows a later row supersedes write to the padding slot and the dump row instead.
        keep.writer.store(torch.where(superseded(loc), 0, loc), k, v)
        slots = torch.where(superseded(slots), keep.dump_slot, slots)
        keep.hidden[slots] = h
        keep.position[slots] = buf.positions[:rows]

    def capture(self) -> tuple[float, float]:
        """A graph of the flush per row count (powers of two up to the buffer's rows,
        and the rows), per buffer, over the buffers as static inputs. Returns (GiB,
        seconds). The capture's writes go to the padding slot and the dump row."""
        tic = time.perf_counter()
        free_before = torch.cuda.mem_get_info()[0]
        pool = torch.cuda.graph_pool_handle()  # one for all: the flushes replay in order on one stream
        for buf in self.buffers:
            buf.loc.zero_()
            buf.slots.fill_(self.keep.dump_slot)
            buf.graphs = capture_graphs(
                {n: (lambda n=n, buf=buf: self._write(buf, n)) for n in flush_row_counts(self.rows)}, pool)
        return (free_before - torch.cuda.mem_get_info()[0]) / 2**30, time.perf_counter() - tic


def superseded(keys):
    """Which rows a later row with the same key overwrites: where a KV slot or a stash
    row appears twice in one store, the GPU keeps either, and the later step must win.
    A rows x rows comparison (1 MB at 1024 rows), no sort and no host sync, so the
    flush can be captured as a graph."""
    order = torch.arange(keys.shape[0], device=keys.device)
    return ((keys[:, None] == keys[None, :]) & (order[:, None] < order[None, :])).any(dim=1)


def flush_row_counts(rows: int) -> list[int]:
    """The row counts a flush is captured for: powers of two from 16, and ``rows``."""
    sizes, n = [], 16
    while n < rows:
        sizes.append(n)
        n *= 2
    return sizes + [rows]


class _Call:
    """A lane replays ``.replay()``: a flush looks like a graph to it."""

    def __init__(self, fn):
        self.replay = fn


def kv_writer_unsupported_reason(model, pool) -> str | None:
    """Why the K/V writer cannot serve this draft, or None."""
    name = type(model).__name__
    if name not in KV_DRAFT_CLASSES:
        return f"the draft model {name} has no K/V writer (it knows {', '.join(KV_DRAFT_CLASSES)})"
    if len(model.model.layers) != 1:
        return (f"the draft has {len(model.model.layers)} layers "
                f"(the K/V of layers after the first need the full forward)")
    if type(pool).__name__ != KV_POOL_CLASS:
        return f"the draft KV pool is {type(pool).__name__} (the writer handles {KV_POOL_CLASS} only)"
    attn = model.model.layers[0].self_attn
    unquantized = (torch.float16, torch.bfloat16, torch.float32)
    if attn.attn.k_scale is not None or attn.qkv_proj.weight.dtype not in unquantized:
        return "the draft's K/V projection or cache is quantized"
    if getattr(model, "_draft_window_size", None) is not None:
        return "the draft attends over a sliding window"
    return None


class KVKeepWarm(NoKeepWarm):
    """``kv``: the K/V of each plain position, one draft pass when speculation resumes."""

    name = KEEP_WARM_KV
    writes_prefill = True

    def __init__(self, writer: LlamaKVWriter, draft_pass: DraftPass, req_to_token, device, check=False):
        self.writer, self.draft_pass, self.req_to_token = writer, draft_pass, req_to_token
        self.check = KVCheck(writer) if check else None
        # The check's draft pass reads req_to_token after the target graph.
        self.reads_after_forward = check
        slots = req_to_token.shape[0]
        dtype = writer.w_kv.dtype
        # Per request slot: the fc output of its last plain position, and that position
        # (-1: none pending). A spec step refreshes the slots whose position is S - 1.
        # One row more: the graphs' padding rows write there.
        self.dump_slot = slots
        self.hidden = torch.zeros(slots + 1, writer.hidden_size, dtype=dtype, device=device)
        self.position = torch.full((slots + 1,), -1, dtype=torch.int64, device=device)
        self.stash_bytes = self.hidden.numel() * self.hidden.element_size() + self.position.numel() * 8
        # A host flag, no sync: whether a plain step ran since the last spec step.
        self.pending = False
        self.lane: SameStream = SameStream()
        self.graph_sets: list[WriterGraphs] = []  # lane.depth sets, taking turns
        self.turn = 0
        self.deferred: DeferredWrites | None = None

    def defer(self, steps: int, rows: int, lane: SameStream) -> None:
        """Write ``steps`` plain steps at a time (``DeferredWrites``) instead of per step."""
        self.lane = lane
        self.deferred = DeferredWrites(self, steps, rows, lane)
        self.stash_bytes += self.deferred.bytes

    def _fence(self) -> None:
        """Before the forward stream reads or writes the draft pool or the stash: the
        waiting rows written, and the writes in flight landed."""
        if self.deferred is not None:
            self.deferred.flush()
        self.lane.fence()

    def capture(self, batch_sizes, lane: SameStream) -> tuple[float, float]:
        """CUDA graphs of the write and the stash for these batch sizes (the plain
        set's), one set per turn of ``lane``. Returns (GiB, seconds). Eager launches
        cost the host ~12 kernel launches per plain step, about 1% of a step at 128
        requests on an 8B model."""
        # One pool: the sets' replays never overlap (one stream, in order).
        pool = torch.cuda.graph_pool_handle()
        self.lane = lane  # before the sets: they take their events from it
        self.graph_sets = [WriterGraphs(self, sorted(batch_sizes), pool) for _ in range(lane.depth)]
        return sum(g.memory_gib for g in self.graph_sets), sum(g.seconds for g in self.graph_sets)

    def describe_graphs(self) -> str:
        if self.deferred is not None:
            d = self.deferred
            sizes = list(d.buffers[0].graphs)
            flush = (f"flush graphs for {len(sizes)} row counts {sizes[0]}-{sizes[-1]}: mem={d.graph_gib:.3f} GB, "
                     f"time={d.graph_seconds:.1f} s" if sizes else "eager flush")
            return (f"deferred: up to {d.steps} plain steps per write on the {self.lane.name} "
                    f"({len(d.buffers)} buffer(s) of {d.rows} rows, {flush})")
        if not self.graph_sets:
            return "eager"
        g = self.graph_sets[0]
        return (f"graphs for batch sizes {g.batch_sizes[0]}-{g.batch_sizes[-1]} on the {self.lane.name} "
                f"({len(self.graph_sets)} set(s)): mem={sum(s.memory_gib for s in self.graph_sets):.3f} GB, "
                f"time={sum(s.seconds for s in self.graph_sets):.1f} s")

    def _write(self, token_ids, aux, positions, loc, slots):
        hidden = self.writer.write(token_ids, aux, positions, loc)
        self.hidden[slots] = hidden
        self.position[slots] = positions

    def before_plain(self, batch, new_seq_lens, loc):
        if self.deferred is not None:
            return self.deferred, self.deferred.begin(batch.req_pool_indices, new_seq_lens, loc)
        n = new_seq_lens.shape[0]
        if self.graph_sets and self.graph_sets[0].bucket(n) is not None:
            graphs = self.graph_sets[self.turn]
            self.turn = (self.turn + 1) % len(self.graph_sets)
            self.lane.reuse(graphs)
            graphs.load_indices(n, batch.req_pool_indices, new_seq_lens, loc)
            return graphs, n
        # Copied before the target graph's read-done event: the scheduler may rewrite
        # the batch's index tensors once the graph has read them.
        return None, (batch.req_pool_indices.clone(), new_seq_lens - 1, loc)

    def after_plain(self, state, batch, result):
        token_ids, aux = result.next_token_ids, result.logits_output.hidden_states
        owner, arg = state
        if owner is not None and owner is self.deferred:
            owner.finish(arg, token_ids, aux)  # no check: make_keep_warm defers only without it
            self.pending = True
            return None
        if owner is not None:
            positions, loc = owner.run(arg, token_ids, aux, self.lane)
        else:
            # After the writes in flight: their stash rows are older than this step's.
            self._fence()
            slots, positions, loc = arg
            self._write(token_ids.to(torch.int64), aux, positions, loc, slots)
        if self.check is not None:
            self._fence()
            ids = token_ids.to(torch.int64)
            self.check(lambda: self.draft_pass(batch, ids, aux, positions, batch.seq_lens_cpu, loc), loc)
        self.pending = True
        return None

    def before_spec(self, batch) -> None:
        # The draft reads the pool the writes fill (and the pass below the stash).
        self._fence()
        info = batch.spec_info
        if not self.pending or info is None:  # None: an idle batch, upstream builds its input
            return
        self.pending = False
        slots = batch.req_pool_indices
        last = (batch.seq_lens - 1).to(torch.int64)
        fresh = self.position[slots] == last
        # Requests that did not end on a plain step (new since a prefill) keep their
        # draft state; their pass writes to the padding slot 0.
        loc = torch.where(fresh, self.req_to_token[slots, last], 0).to(torch.int64)
        last_cpu = None if batch.seq_lens_cpu is None else batch.seq_lens_cpu - 1
        topk_p, topk_index, hidden, probs = self.draft_pass(
            batch, info.bonus_tokens.to(torch.int64), self.hidden[slots], last, last_cpu, loc)
        keep = fresh.unsqueeze(1)
        info.topk_p = torch.where(keep, topk_p, info.topk_p)
        info.topk_index = torch.where(keep, topk_index, info.topk_index)
        info.hidden_states = torch.where(keep, hidden.to(info.hidden_states.dtype), info.hidden_states)
        if probs is not None and info.draft_probs is not None:
            info.draft_probs = torch.where(keep, probs, info.draft_probs)
        self.position.index_fill_(0, slots, -1)  # not `[slots] = -1`: see on_prefill

    def on_prefill(self, batch) -> None:
        # The prefill's draft extend may write slots a write in flight still targets
        # (freed by a finished request), and the stash row below.
        self._fence()
        # A slot's new request must not inherit its old request's pending position.
        # index_fill_, not `position[idx] = -1`: assigning a Python number through an
        # index copies it to the GPU with a blocking copy (index_put_ moves a CPU
        # scalar to the device), which waits for the forward stream: the host then
        # stalled at every speculative prefill until the decode step in flight ended
        # (about 12 ms a prefill on the 8B pair at c=64, 0.93x static EAGLE-3).
        self.position.index_fill_(0, batch.req_pool_indices, -1)

    def prefill(self, batch, aux, next_token_ids):
        """A prefill without the draft's extend: the draft K/V of every prompt position
        written as a plain step writes one (position i: the token after it, the target's
        aux hidden at i), and each request's last position stashed, so the first
        speculative step drafts from it (``before_spec``) as from a plain step's. Returns
        (topk_p, topk_index, hidden) of upstream's shapes for the FutureMap: the draft
        state those steps replace (zeros; a plain step passes it on unread)."""
        # After the writes in flight and the waiting rows: a reused slot ends with this
        # prefill's row.
        self._fence()
        device = aux.device
        bs = len(batch.extend_lens)
        # One host-to-device copy, as upstream's ForwardBatch takes the same lists.
        lens = torch.tensor(batch.extend_lens + batch.prefix_lens, dtype=torch.int64).to(device, non_blocking=True)
        extend_lens, prefix_lens = lens[:bs], lens[bs:]
        ends = torch.cumsum(extend_lens, 0) - 1
        row_req = torch.repeat_interleave(torch.arange(bs, device=device), extend_lens,
                                          output_size=batch.extend_num_tokens)
        # A row's position: its request's prefix length plus the row's place in the request.
        offsets = (prefix_lens - ends - 1 + extend_lens)[row_req]
        positions = torch.arange(batch.extend_num_tokens, device=device) + offsets
        # Each row's input token is the next one: the prompt shifted left within its
        # request, then the sampled token (for a chunk that is not a prompt's last, the
        # chunk's next prompt token, as upstream's draft extend takes it).
        ids = torch.empty_like(batch.input_ids, dtype=torch.int64)
        ids[:-1] = batch.input_ids[1:]
        ids[ends] = up.eagle_prefill_tail_tokens(batch, next_token_ids).to(torch.int64)
        hidden = self.writer.write(ids, aux, positions, batch.out_cache_loc)
        slots = batch.req_pool_indices
        self.hidden[slots] = hidden[ends].to(self.hidden.dtype)
        self.position[slots] = positions[ends]
        self.pending = True
        topk = self.draft_pass.topk
        # The Llama EAGLE-3 draft carries its hidden size (fc's output) between steps.
        return (torch.zeros(bs, topk, dtype=torch.float32, device=device),
                torch.zeros(bs, topk, dtype=torch.int64, device=device),
                torch.zeros(bs, self.hidden.shape[1], dtype=self.hidden.dtype, device=device))


def resolve(requested: str | None, model, pool) -> str:
    """The strategy to run: the requested one, or the default for this draft: kv where
    the writer knows the draft, else none. Not full: run eagerly at every plain step it
    cost 9-26% of an always-plain server's throughput (8B pair, H200), which would make
    the plain side slower than plain decode; none costs acceptance only after a switch."""
    reason = kv_writer_unsupported_reason(model, pool)
    if requested is None:
        return KEEP_WARM_KV if reason is None else KEEP_WARM_NONE
    if requested == KEEP_WARM_KV and reason is not None:
        raise ConfigError(f"sglang_adaptive: --speculative-draft-keep-warm kv cannot serve this draft: {reason}; "
                          f"use full or none.")
    return requested


def make_keep_warm(requested: str | None, eagle_worker, batch_sizes=None) -> NoKeepWarm:
    """The keep-warm object of an ``EAGLEWorkerV2`` (after its models are loaded).
    ``batch_sizes``: the plain graph set's; the K/V write is captured at each (at
    TP 1: under TP the embedding's all-reduce would need SGLang's capture context)."""
    draft_worker = eagle_worker._draft_worker
    runner = draft_worker.draft_runner
    strategy = resolve(requested, runner.model, runner.token_to_kv_pool)
    if strategy == KEEP_WARM_NONE:
        return NoKeepWarm()
    draft_pass = DraftPass(draft_worker, eagle_worker.topk)
    if strategy == KEEP_WARM_FULL:
        return FullKeepWarm(draft_pass)
    writer = LlamaKVWriter(runner.model, runner.token_to_kv_pool)
    keep = KVKeepWarm(writer, draft_pass, eagle_worker.req_to_token_pool.req_to_token, eagle_worker.device,
                      check=os.environ.get(CHECK_ENV, "0") == "1")
    defer = deferred_steps(os.environ.get(DEFER_ENV))
    if batch_sizes and runner.tp_group.world_size == 1:
        side = os.environ.get(STREAM_ENV, "1") != "0"
        lane = SideStream(eagle_worker.device) if side else SameStream()
        if defer > 1 and keep.check is None:  # the check compares each step's rows at once
            # Room for `defer` steps of the largest graph batch, and for any one batch
            # (at most one row per request slot).
            keep.defer(defer, max(defer * max(batch_sizes), keep.req_to_token.shape[0]), lane)
            if os.environ.get(FLUSH_GRAPHS_ENV, "1") != "0":
                keep.deferred.graph_gib, keep.deferred.graph_seconds = keep.deferred.capture()
        else:
            keep.capture(batch_sizes, lane)
    return keep


def deferred_steps(value: str | None) -> int:
    """``DEFER_ENV``'s value: plain steps per deferred write (1: write every step)."""
    if value is None or value == "":
        return DEFAULT_DEFER_STEPS
    if not value.isdigit() or int(value) < 1:
        raise ConfigError(f"sglang_adaptive: {DEFER_ENV} must be a whole number of plain steps, at least 1, "
                          f"got {value!r}.")
    return int(value)
