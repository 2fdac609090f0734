"""Draft keep-warm (keepwarm.py) on CPU: the flag, the choice of strategy per draft,
the K/V writer's arithmetic against the draft layer's own, and the bookkeeping
that decides which requests get a draft pass when speculation resumes.

The GPU side (test/gpu/test_keep_warm.py) checks the writer's K/V against what
the draft's extend writes, tokens against a no-spec server, and acceptance.
"""

from types import SimpleNamespace as NS

import pytest
import torch
from conftest import eagle3_argv

from sglang_adaptive import keepwarm
from sglang_adaptive.args import ConfigError, get_config

# Every keep-warm path these tests drive runs on the scheduler's hot path.
pytestmark = pytest.mark.usefixtures("no_number_through_an_index")


# -- flags --------------------------------------------------------------------


def test_the_flag_reaches_the_config(parse):
    args = parse(eagle3_argv("--speculative-disable-batch-threshold", "4", "--speculative-draft-keep-warm", "full"))
    assert get_config(args).keep_warm == "full"
    assert get_config(parse(eagle3_argv("--speculative-disable-batch-threshold", "4"))).keep_warm is None


def test_the_flag_needs_a_switching_policy(parse):
    with pytest.raises(ConfigError, match="--speculative-draft-keep-warm needs a switching policy"):
        parse(eagle3_argv("--speculative-switch-policy", "off", "--speculative-draft-keep-warm", "kv"))


def test_an_eagle_draft_cannot_be_kept_warm(parse):
    argv = [a if a != "EAGLE3" else "EAGLE" for a in eagle3_argv(
        "--speculative-disable-batch-threshold", "4", "--speculative-draft-keep-warm", "kv")]
    with pytest.raises(ConfigError, match="--speculative-draft-keep-warm kv needs --speculative-algorithm EAGLE3"):
        parse(argv)


# -- which strategy runs ----------------------------------------------------------


def draft_model(name="LlamaForCausalLMEagle3", layers=1, k_scale=None, dtype=torch.bfloat16, window=None):
    attn = NS(attn=NS(k_scale=k_scale), qkv_proj=NS(weight=torch.zeros(1, dtype=dtype)))
    model = type(name, (), {})()
    model.model = NS(layers=[NS(self_attn=attn)] * layers)
    model._draft_window_size = window
    return model


MHA = type("MHATokenToKVPool", (), {})()


def test_kv_is_the_default_where_the_writer_fits():
    assert keepwarm.resolve(None, draft_model(), MHA) == "kv"


@pytest.mark.parametrize("model, pool, reason", [
    (draft_model("Eagle3DeepseekV2ForCausalLM"), MHA, "the draft model Eagle3DeepseekV2ForCausalLM has no K/V writer"),
    (draft_model(layers=2), MHA, "the draft has 2 layers"),
    (draft_model(), type("MHATokenToKVPoolFP4", (), {})(), "the draft KV pool is MHATokenToKVPoolFP4"),
    (draft_model(k_scale=0.5), MHA, "quantized"),
    (draft_model(dtype=torch.float8_e4m3fn), MHA, "quantized"),
    (draft_model(window=128), MHA, "sliding window"),
])
def test_other_drafts_default_to_none_and_refuse_an_explicit_kv(model, pool, reason):
    assert keepwarm.resolve(None, model, pool) == "none"
    assert keepwarm.resolve("full", model, pool) == "full"
    with pytest.raises(ConfigError, match=f"--speculative-draft-keep-warm kv cannot serve this draft: .*{reason}"):
        keepwarm.resolve("kv", model, pool)


# -- the K/V writer ---------------------------------------------------------------

H_T, H_D, NUM_AUX, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 6, 8, 3, 4, 2, 2, 50


class Rope:
    """A stand-in rope that depends on the position (so a wrong one shows)."""

    def __call__(self, positions, q, k):
        shape = k.shape
        k = k.reshape(k.shape[0], -1) * (1 + positions.to(k.dtype)).unsqueeze(1)
        return q, k.reshape(shape)


class Pool:
    def __init__(self):
        self.k = torch.zeros(32, KV_HEADS, HEAD_DIM)
        self.v = torch.zeros(32, KV_HEADS, HEAD_DIM)

    def set_kv_buffer(self, layer, loc, k, v):
        self.k[loc], self.v[loc] = k, v


def rms(n):
    norm = torch.nn.RMSNorm(n)
    torch.nn.init.uniform_(norm.weight, 0.5, 1.5)
    return norm


@pytest.fixture()
def llama_draft():
    torch.manual_seed(0)
    q_size, kv_size = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    attn = NS(rotary_emb=Rope(), attn=NS(layer_id=0), head_dim=HEAD_DIM, num_kv_heads=KV_HEADS,
              q_size=q_size, kv_size=kv_size,
              qkv_proj=NS(weight=torch.randn(q_size + 2 * kv_size, 2 * H_D)))
    layer = NS(input_layernorm=rms(H_D), hidden_norm=rms(H_D), self_attn=attn)
    fc_norm = torch.nn.ModuleList([rms(H_T) for _ in range(NUM_AUX)])
    inner = NS(embed_tokens=torch.nn.Embedding(VOCAB, H_D), input_norm=None, fc_norm=fc_norm,
               fc=torch.nn.Linear(NUM_AUX * H_T, H_D), num_aux_hidden_states=NUM_AUX, layers=[layer])
    return NS(model=inner)


def reference_kv(model, token_ids, aux, positions):
    """layer 0 of llama_eagle3 up to its attention: full QKV, split q | k | v."""
    inner = model.model
    layer = inner.layers[0]
    attn = layer.self_attn
    chunks = aux.chunk(NUM_AUX, dim=-1)
    h = inner.fc(torch.cat([n(c) for n, c in zip(inner.fc_norm, chunks)], dim=-1))
    x = torch.cat([layer.input_layernorm(inner.embed_tokens(token_ids)), layer.hidden_norm(h)], dim=-1)
    q, k, v = (x @ attn.qkv_proj.weight.T).split([attn.q_size, attn.kv_size, attn.kv_size], dim=-1)
    _, k = attn.rotary_emb(positions, q, k)
    return k.reshape(-1, KV_HEADS, HEAD_DIM), v.reshape(-1, KV_HEADS, HEAD_DIM), h


@torch.no_grad()
def test_the_writer_writes_the_draft_layers_k_v_at_the_given_slots(llama_draft):
    pool = Pool()
    writer = keepwarm.LlamaKVWriter(llama_draft, pool)
    tokens, aux = torch.tensor([3, 17, 42]), torch.randn(3, NUM_AUX * H_T)
    positions, loc = torch.tensor([5, 9, 2]), torch.tensor([11, 4, 20])
    hidden = writer.write(tokens, aux, positions, loc)
    k, v, h = reference_kv(llama_draft, tokens, aux, positions)
    torch.testing.assert_close(pool.k[loc], k)
    torch.testing.assert_close(pool.v[loc], v)
    torch.testing.assert_close(hidden, h)
    untouched = torch.ones(32, dtype=torch.bool)
    untouched[loc] = False
    assert not pool.k[untouched].any() and not pool.v[untouched].any()


# -- kv: the stash and the pass at the transition -----------------------------------


class FakeWriter:
    hidden_size = 4
    w_kv = torch.zeros(1, dtype=torch.float32)

    def __init__(self):
        self.calls = []

    def write(self, token_ids, aux, positions, loc):
        self.calls.append((token_ids.tolist(), positions.tolist(), loc.tolist()))
        return aux[:, :4] + 100  # the fc output, recognisable


class FakePass:
    topk = 1

    def __init__(self):
        self.calls = []

    def __call__(self, batch, token_ids, hidden, prefix_lens, prefix_lens_cpu, loc):
        self.calls.append(dict(ids=token_ids.tolist(), hidden=hidden.clone(), prefix=prefix_lens.tolist(),
                               prefix_cpu=None if prefix_lens_cpu is None else prefix_lens_cpu.tolist(),
                               loc=loc.tolist()))
        n = token_ids.shape[0]
        return (torch.full((n, 1), 0.5), token_ids.view(n, 1) + 1000, hidden * 2, None)


def kv_keep_warm(graphs=None, lane=None):
    req_to_token = torch.arange(8 * 64).reshape(8, 64)
    kw = keepwarm.KVKeepWarm(FakeWriter(), FakePass(), req_to_token, "cpu")
    if graphs:
        kw.lane = lane or keepwarm.SameStream()
        kw.graph_sets = [cpu_graphs(kw, graphs) for _ in range(kw.lane.depth)]
    return kw, req_to_token


class DeferredLane(keepwarm.SameStream):
    """The side stream on CPU: a replay runs only when the forward stream waits for
    it (``reuse`` of its set, or a fence), reading its set's inputs as they are then,
    the way another stream's kernels run whenever they like until something waits."""

    depth = 2

    def __init__(self):
        self.queue = []

    def reuse(self, graphs):
        last = max((i for i, (g, _) in enumerate(self.queue) if g is graphs), default=-1)
        self._run(last + 1)

    def replay(self, graphs, graph):
        self.queue.append((graphs, graph))

    def fence(self):
        self._run(len(self.queue))

    def _run(self, n):
        done, self.queue = self.queue[:n], self.queue[n:]
        for _, graph in done:
            graph.replay()


class Replay:
    """A captured graph on CPU: replaying runs the captured body."""

    def __init__(self, body, bs):
        self.replay = lambda: body(bs)


def cpu_graphs(kw, batch_sizes):
    """WriterGraphs as captured, minus CUDA: the same static buffers and body."""
    g = keepwarm.WriterGraphs.__new__(keepwarm.WriterGraphs)
    g.keep, g.batch_sizes = kw, batch_sizes
    max_bs = batch_sizes[-1]
    g.tokens, g.positions, g.loc = (torch.zeros(max_bs, dtype=torch.int64) for _ in range(3))
    g.aux = torch.zeros(max_bs, 12)
    g.slots = torch.full((max_bs,), kw.dump_slot, dtype=torch.int64)
    g.graphs = {bs: Replay(g._body, bs) for bs in batch_sizes}
    return g


def plain_step(kw, slots, seq_lens, tokens):
    batch = NS(req_pool_indices=torch.tensor(slots), seq_lens=torch.tensor(seq_lens), seq_lens_cpu=None)
    new = batch.seq_lens + 1
    loc = kw.req_to_token[batch.req_pool_indices, batch.seq_lens]
    state = kw.before_plain(batch, new, loc)
    batch.req_pool_indices.fill_(-7)  # the scheduler reuses its buffer after the graph read it
    n = len(slots)
    result = NS(next_token_ids=torch.tensor(tokens, dtype=torch.int32),
                logits_output=NS(hidden_states=torch.arange(n * 12, dtype=torch.float32).reshape(n, 12)))
    return kw.after_plain(state, batch, result), result


def spec_batch(slots, seq_lens, bonus, old=0.0):
    n = len(slots)
    info = NS(bonus_tokens=torch.tensor(bonus, dtype=torch.int32), topk_p=torch.full((n, 1), old),
              topk_index=torch.full((n, 1), -1), hidden_states=torch.full((n, 4), old), draft_probs=None)
    return NS(req_pool_indices=torch.tensor(slots), seq_lens=torch.tensor(seq_lens), seq_lens_cpu=None,
              spec_info=info)


@pytest.mark.parametrize("graphs", [None, [1, 4]])
def test_a_plain_step_writes_k_v_and_stashes_per_request_slot(graphs):
    kw, req_to_token = kv_keep_warm(graphs)
    fresh, result = plain_step(kw, [2, 5], [10, 3], [7, 8])
    assert fresh is None, "kv hands no draft state to the plain result"
    (ids, positions, loc), = kw.writer.calls
    want_loc = [req_to_token[2, 10].item(), req_to_token[5, 3].item()]
    if graphs:  # replayed at batch size 4: two padding rows write to slot 0 and the dump row
        assert loc[2:] == [0, 0]
        ids, positions, loc = ids[:2], positions[:2], loc[:2]
    assert ids == [7, 8] and positions == [10, 3], "the sampled token, at the position it follows"
    assert loc == want_loc
    assert kw.position[[2, 5]].tolist() == [10, 3], "stashed under the slots copied before the reuse"
    torch.testing.assert_close(kw.hidden[[2, 5]], result.logits_output.hidden_states[:, :4] + 100)
    assert (kw.position[[0, 1, 3, 4, 6, 7]] == -1).all()
    assert kw.pending


def test_the_first_speculative_step_drafts_from_the_last_plain_position():
    kw, req_to_token = kv_keep_warm()
    plain_step(kw, [2, 5], [10, 3], [7, 8])
    stash = kw.hidden[[2, 5]].clone()
    # Request in slot 6 joined by a prefill meanwhile: its draft state is fresh.
    kw.on_prefill(NS(req_pool_indices=torch.tensor([6])))
    batch = spec_batch([5, 6, 2], [4, 30, 11], [8, 55, 7])
    kw.before_spec(batch)
    (call,) = kw.draft_pass.calls
    assert call["ids"] == [8, 55, 7] and call["prefix"] == [3, 29, 10]
    assert call["loc"] == [req_to_token[5, 3].item(), 0, req_to_token[2, 10].item()], \
        "a request that did not end on a plain step writes to the padding slot"
    torch.testing.assert_close(call["hidden"][[0, 2]], stash[[1, 0]])
    info = batch.spec_info
    assert info.topk_index[:, 0].tolist() == [1008, -1, 1007]
    assert info.topk_p[:, 0].tolist() == [0.5, 0.0, 0.5]
    torch.testing.assert_close(info.hidden_states[[0, 2]], stash[[1, 0]] * 2)
    assert not info.hidden_states[1].any(), "the prefilled request keeps its draft state"
    assert (kw.position[[5, 2]] == -1).all() and not kw.pending
    kw.before_spec(spec_batch([5, 2], [6, 13], [1, 2]))
    assert len(kw.draft_pass.calls) == 1, "one pass per return to speculation"


def test_a_slot_reused_by_a_new_request_does_not_inherit_the_pending_position():
    kw, _ = kv_keep_warm()
    plain_step(kw, [3], [20], [9])
    kw.on_prefill(NS(req_pool_indices=torch.tensor([3])))
    batch = spec_batch([3], [21], [4])
    kw.before_spec(batch)
    assert batch.spec_info.topk_index.tolist() == [[-1]]


def test_clearing_stash_positions_copies_no_number_to_the_device(monkeypatch):
    """The two places that clear pending positions (a prefill's slots, a speculative
    step's after its pass) fill them in a kernel; ``position[idx] = -1`` would make the
    host wait for the forward stream at every speculative prefill."""
    calls = []
    original = torch.Tensor.index_fill_
    monkeypatch.setattr(torch.Tensor, "index_fill_",
                        lambda self, *a: calls.append(a[1:]) or original(self, *a))
    kw, _ = kv_keep_warm()
    plain_step(kw, [2, 5], [10, 3], [7, 8])
    kw.on_prefill(NS(req_pool_indices=torch.tensor([5])))
    kw.before_spec(spec_batch([2, 5], [11, 4], [1, 2]))
    assert (kw.position == -1).all()
    assert [(idx.tolist(), v) for idx, v in calls] == [([5], -1), ([2, 5], -1)]


def test_host_lengths_reach_the_pass_one_position_back():
    kw, _ = kv_keep_warm()
    plain_step(kw, [1], [4], [9])
    batch = spec_batch([1], [5], [9])
    batch.seq_lens_cpu = torch.tensor([5])
    kw.before_spec(batch)
    assert kw.draft_pass.calls[0]["prefix_cpu"] == [4]


def test_full_runs_the_draft_pass_on_the_plain_step_itself():
    calls = FakePass()
    kw = keepwarm.FullKeepWarm(calls)
    assert kw.reads_after_forward, "its pass reads req_to_token after the target graph"
    batch = NS(req_pool_indices=torch.tensor([1, 4]), seq_lens=torch.tensor([6, 2]),
               seq_lens_cpu=torch.tensor([6, 2]))
    state = kw.before_plain(batch, batch.seq_lens + 1, torch.tensor([40, 41]))
    result = NS(next_token_ids=torch.tensor([5, 6], dtype=torch.int32),
                logits_output=NS(hidden_states=torch.ones(2, 12)))
    topk_p, topk_index, hidden, probs = kw.after_plain(state, batch, result)
    (call,) = calls.calls
    assert call["ids"] == [5, 6] and call["prefix"] == [6, 2] and call["loc"] == [40, 41]
    assert call["prefix_cpu"] == [6, 2]
    assert topk_index[:, 0].tolist() == [1005, 1006]


def test_none_does_nothing():
    kw = keepwarm.NoKeepWarm()
    assert kw.before_plain(None, None, None) is None
    assert kw.after_plain(None, None, None) is None
    assert kw.before_spec(None) is None and kw.on_prefill(None) is None
    assert not kw.reads_after_forward and kw.stash_bytes == 0


def test_a_stash_from_another_position_is_not_used():
    """Only a request whose last step was plain at S - 1 is refreshed, whatever the
    slot's history (e.g. a prefill that took a path without the hook)."""
    kw, _ = kv_keep_warm()
    plain_step(kw, [3], [20], [9])
    batch = spec_batch([3], [31], [4])
    kw.before_spec(batch)
    assert batch.spec_info.topk_index.tolist() == [[-1]]


def test_graph_padding_rows_never_reach_an_earlier_steps_slots():
    kw, req_to_token = kv_keep_warm([1, 4])
    plain_step(kw, [1, 2, 3], [5, 6, 7], [1, 2, 3])
    plain_step(kw, [4, 5], [9, 10], [4, 5])
    (_, _, first), (_, _, second) = kw.writer.calls
    assert first[3] == 0 and second[2:] == [0, 0], "row 2 held the first step's third slot"
    assert kw.position[:8].tolist() == [-1, 5, 6, 7, 9, 10, -1, -1]


def eagle_worker(draft_model, world_size: int, slots: int):
    """What make_keep_warm reads of an EAGLEWorkerV2: the draft runner and its pool, the
    request slots."""
    runner = NS(model=draft_model, token_to_kv_pool=Pool(), tp_group=NS(world_size=world_size))
    return NS(_draft_worker=NS(draft_runner=runner), topk=1, device="cpu",
              req_to_token_pool=NS(req_to_token=torch.zeros(slots, 8, dtype=torch.int32)))


@pytest.mark.parametrize("world_size, env, captured", [(1, None, [([1, 2, 4], "side")]),
                                                        (1, "0", [([1, 2, 4], "forward stream")]),
                                                        (2, None, [])])
def test_kv_captures_its_graphs_at_tp_1_only(llama_draft, monkeypatch, world_size, env, captured):
    """Under TP the embedding all-reduces: capturing it needs SGLang's capture context.
    At TP 1 the graphs replay on a side stream unless the environment says 0."""
    calls = []
    monkeypatch.setattr(keepwarm.KVKeepWarm, "capture",
                        lambda self, sizes, lane: calls.append((sizes, getattr(lane, "name", lane))))
    monkeypatch.setattr(keepwarm, "SideStream", lambda device: "side")
    monkeypatch.setenv(keepwarm.DEFER_ENV, "1")  # per-step writes: the graphs
    if env is None:
        monkeypatch.delenv(keepwarm.STREAM_ENV, raising=False)
    else:
        monkeypatch.setenv(keepwarm.STREAM_ENV, env)
    monkeypatch.setattr(keepwarm, "kv_writer_unsupported_reason", lambda model, pool: None)
    worker = eagle_worker(llama_draft, world_size=world_size, slots=4)
    kw = keepwarm.make_keep_warm(None, worker, [1, 2, 4])
    assert kw.name == "kv" and calls == captured
    assert keepwarm.make_keep_warm("none", worker, [1]).name == "none"
    assert keepwarm.make_keep_warm("full", worker, [1]).name == "full"


# -- the side stream: writes land late, ordering comes from the waits ---------------


def test_the_side_stream_hands_over_through_events_only(monkeypatch):
    """SideStream's CUDA calls, recorded: the replay waits for the step's inputs, runs on
    its own stream, and the forward stream waits for it only where told (no host sync)."""
    log = []

    class Event:
        def __init__(self, name):
            self.name = name

        def record(self, stream):
            log.append(("record", self.name, stream.name))

    class Stream:
        def __init__(self, name):
            self.name = name

        def wait_event(self, event):
            log.append(("wait", self.name, event.name))

    forward, current = Stream("forward"), []

    class Ctx:
        def __init__(self, stream):
            self.stream = stream

        def __enter__(self):
            current.append(self.stream)

        def __exit__(self, *exc):
            current.pop()

    monkeypatch.setattr(torch.cuda, "Stream", lambda device: Stream("side"))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: current[-1] if current else forward)
    monkeypatch.setattr(torch.cuda, "stream", Ctx)
    lane = keepwarm.SideStream("cuda")
    sets = [NS(ready=Event(f"ready{i}"), done=Event(f"done{i}")) for i in range(2)]
    graph = NS(replay=lambda: log.append(("replay", torch.cuda.current_stream().name)))
    lane.fence()
    assert log == [], "nothing in flight, nothing to wait for"
    lane.reuse(sets[0])
    lane.replay(sets[0], graph)
    lane.replay(sets[1], graph)
    lane.fence()
    lane.fence()
    assert log == [("wait", "forward", "done0"),
                   ("record", "ready0", "forward"), ("wait", "side", "ready0"), ("replay", "side"),
                   ("record", "done0", "side"),
                   ("record", "ready1", "forward"), ("wait", "side", "ready1"), ("replay", "side"),
                   ("record", "done1", "side"),
                   ("wait", "forward", "done1")]


def test_writes_on_the_side_stream_stay_in_flight_until_waited_for():
    kw, req_to_token = kv_keep_warm([1, 4], DeferredLane())
    plain_step(kw, [2], [10], [7])
    plain_step(kw, [2], [11], [8])
    assert kw.writer.calls == [], "two steps in flight: the sets take turns, nothing waits"
    plain_step(kw, [5], [3], [9])  # set 0 again: its first write must read its own inputs first
    assert len(kw.writer.calls) == 1
    kw.lane.fence()
    got = [(ids[:1], positions[:1], loc[:1]) for ids, positions, loc in kw.writer.calls]
    assert got == [([7], [10], [req_to_token[2, 10].item()]), ([8], [11], [req_to_token[2, 11].item()]),
                   ([9], [3], [req_to_token[5, 3].item()])]


def test_the_speculative_step_waits_for_the_writes_in_flight():
    kw, req_to_token = kv_keep_warm([1, 4], DeferredLane())
    plain_step(kw, [2], [10], [7])
    batch = spec_batch([2], [11], [7])
    kw.before_spec(batch)
    (call,) = kw.draft_pass.calls
    assert call["loc"] == [req_to_token[2, 10].item()], "the pass found the last plain position stashed"
    assert batch.spec_info.topk_index.tolist() == [[1007]]
    assert kw.lane.queue == []


def test_a_prefill_waits_before_it_clears_a_reused_slot():
    kw, _ = kv_keep_warm([1, 4], DeferredLane())
    plain_step(kw, [3], [20], [9])
    kw.on_prefill(NS(req_pool_indices=torch.tensor([3])))
    assert kw.lane.queue == [], "the prefill's draft extend may write slots the write targets"
    batch = spec_batch([3], [21], [4])
    kw.before_spec(batch)
    assert batch.spec_info.topk_index.tolist() == [[-1]], "the old request's write landed after the clear"


def test_an_eager_write_lands_after_the_graph_writes_before_it():
    """A batch larger than the captured sizes writes eagerly on the forward stream: the
    stash row of the same request must end with the newer step."""
    kw, req_to_token = kv_keep_warm([1, 4], DeferredLane())
    plain_step(kw, [2], [10], [7])
    plain_step(kw, [2, 0, 1, 3, 4], [11, 1, 1, 1, 1], [8, 1, 1, 1, 1])
    kw.lane.fence()
    assert kw.position[2].item() == 11
    kw.before_spec(spec_batch([2], [12], [8]))
    assert kw.draft_pass.calls[0]["loc"] == [req_to_token[2, 11].item()]


def test_the_check_compares_after_the_write_landed():
    kw, _ = kv_keep_warm([1, 4], DeferredLane())
    seen = []
    kw.check = lambda run_pass, loc: seen.append((list(kw.lane.queue), loc.tolist()))
    plain_step(kw, [2], [10], [7])
    assert seen == [([], [kw.req_to_token[2, 10].item()])]


# -- deferred writes: several plain steps written at once ---------------------------


class DeferWriter(FakeWriter):
    """Computes rows recognisably (K = token * 1000 + position) and records each call."""

    aux_width = 12

    def __init__(self):
        super().__init__()
        self.computed, self.stores, self.pool = [], [], {}

    def compute(self, token_ids, aux, positions):
        self.computed.append((token_ids.tolist(), positions.tolist()))
        k = (token_ids * 1000 + positions).float().unsqueeze(1)
        return aux[:, :4] + 100, k, k + 0.5

    def store(self, loc, k, v):
        real = [slot for slot in loc.tolist() if slot != 0]
        assert len(set(real)) == len(real), "a slot twice in one store: the GPU keeps either row"
        self.stores.append(real)  # slot 0: the padding slot, written by rows that land nowhere
        self.pool.update((slot, key) for slot, key in zip(loc.tolist(), k[:, 0].tolist()) if slot != 0)


class StashRows:
    """A stash tensor whose row writes, like the GPU's, keep either row where an index
    repeats: the test fails instead (the dump row excepted)."""

    def __init__(self, tensor, dump):
        self.tensor, self.dump = tensor, dump

    def __getitem__(self, index):
        return self.tensor[index]

    def __setitem__(self, index, value):
        if isinstance(index, torch.Tensor):
            real = [i for i in index.tolist() if i != self.dump]
            assert len(set(real)) == len(real), "a stash row twice in one write: the GPU keeps either"
        self.tensor[index] = value

    def __getattr__(self, name):
        return getattr(self.tensor, name)


def deferred(steps, rows=16, lane=None):
    req_to_token = torch.arange(8 * 64).reshape(8, 64)
    kw = keepwarm.KVKeepWarm(DeferWriter(), FakePass(), req_to_token, "cpu")
    kw.defer(steps, rows, lane or keepwarm.SameStream())
    kw.hidden, kw.position = StashRows(kw.hidden, kw.dump_slot), StashRows(kw.position, kw.dump_slot)
    return kw


def captured_flushes(kw):
    """DeferredWrites.capture minus CUDA: each buffer's flush per row count replays the
    captured body over the buffer's first rows."""
    d = kw.deferred
    for buf in d.buffers:
        buf.graphs = {n: Replay(lambda n, buf=buf: d._write(buf, n), n) for n in keepwarm.flush_row_counts(d.rows)}
    return kw


def step_at(kw, slots, seq_lens, tokens, loc=None):
    """One plain step, with the KV slots ``loc`` if given (else req_to_token's)."""
    batch = NS(req_pool_indices=torch.tensor(slots), seq_lens=torch.tensor(seq_lens), seq_lens_cpu=None)
    loc = kw.req_to_token[batch.req_pool_indices, batch.seq_lens] if loc is None else torch.tensor(loc)
    state = kw.before_plain(batch, batch.seq_lens + 1, loc)
    batch.req_pool_indices.fill_(-7)  # the scheduler reuses its buffer after the step read it
    n = len(slots)
    result = NS(next_token_ids=torch.tensor(tokens, dtype=torch.int32),
                logits_output=NS(hidden_states=torch.arange(n * 12, dtype=torch.float32).reshape(n, 12)))
    assert kw.after_plain(state, batch, result) is None


def test_deferred_writes_wait_for_their_steps_then_land_in_step_order():
    kw = deferred(steps=3)
    step_at(kw, [2, 5], [10, 3], [7, 8])
    step_at(kw, [2, 5], [11, 4], [9, 1])
    assert kw.writer.computed == [] and kw.pending, "two steps wait"
    step_at(kw, [2], [12], [6])
    assert kw.writer.computed == [([7, 8, 9, 1, 6], [10, 3, 11, 4, 12])], "one computation for the three steps"
    r = kw.req_to_token
    assert kw.writer.stores == [[r[2, 10].item(), r[5, 3].item(), r[2, 11].item(), r[5, 4].item(),
                                 r[2, 12].item()]], "stored at once"
    assert kw.writer.pool[r[2, 12].item()] == 6012
    assert kw.position[[2, 5]].tolist() == [12, 4], "each stash row holds its request's latest step"
    step_at(kw, [2], [13], [5])
    assert len(kw.writer.computed) == 1, "the next window waits again"


def test_a_kv_slot_reused_inside_the_window_ends_with_its_later_row():
    kw = deferred(steps=2)
    step_at(kw, [2], [10], [7], loc=[40])
    step_at(kw, [5], [3], [8], loc=[40])  # slot 40 freed by the first request, given to the second
    assert kw.writer.pool[40] == 8003


@torch.no_grad()
@pytest.mark.parametrize("captured", [False, True])
def test_deferred_writes_leave_the_pool_and_the_stash_as_the_per_step_writes(llama_draft, captured):
    """The draft layer's own K/V arithmetic (the writer over a real draft layer), written
    per step and deferred (eager or through captured flushes over padded row counts),
    across windows, with a KV slot freed and reused inside a window."""
    steps = [([2, 5], [10, 3], [20, 21]), ([2, 5], [11, 4], [22, 23]), ([2], [12], [21]),  # 21 reused
             ([2, 5], [13, 5], [24, 25]), ([5], [6], [26])]
    gen = torch.Generator().manual_seed(1)
    inputs = [(torch.randint(0, VOCAB, (len(s),), generator=gen), torch.randn(len(s), NUM_AUX * H_T, generator=gen))
              for s, _, _ in steps]

    def served(defer):
        pool = Pool()
        kw = keepwarm.KVKeepWarm(keepwarm.LlamaKVWriter(llama_draft, pool), FakePass(),
                                 torch.arange(8 * 64).reshape(8, 64), "cpu")
        if defer:
            kw.defer(defer, 16, keepwarm.SameStream())
            if captured:
                captured_flushes(kw)
        for (slots, seq_lens, loc), (tokens, aux) in zip(steps, inputs):
            batch = NS(req_pool_indices=torch.tensor(slots), seq_lens=torch.tensor(seq_lens), seq_lens_cpu=None)
            state = kw.before_plain(batch, batch.seq_lens + 1, torch.tensor(loc))
            kw.after_plain(state, batch, NS(next_token_ids=tokens, logits_output=NS(hidden_states=aux)))
        kw._fence()
        return pool, kw

    (pool, kw), (ref_pool, ref) = served(3), served(None)
    assert kw.deferred.buffers[0].graphs or not captured
    for got, want in ((pool.k, ref_pool.k), (pool.v, ref_pool.v), (kw.hidden[:8], ref.hidden[:8]),
                      (kw.position[:8], ref.position[:8])):
        torch.testing.assert_close(got[1:], want[1:])  # slot / row 0: padding
    assert kw.position[[2, 5]].tolist() == [13, 6], "each request's latest plain position"


def test_only_the_latest_row_of_a_key_is_kept():
    keys = torch.tensor([4, 9, 4, 0, 9, 4, 7])
    assert keepwarm.superseded(keys).tolist() == [True, True, True, False, False, False, False]


def test_a_captured_flush_aims_its_padding_rows_at_the_padding_slot_and_the_dump_row():
    """The rows past this window's hold an older window's steps: replayed over 16 rows,
    they would write again, after this window's rows, and win."""
    kw = captured_flushes(deferred(steps=3, rows=64))
    step_at(kw, [2, 5], [10, 3], [7, 8], loc=[40, 41])
    step_at(kw, [2, 5], [11, 4], [9, 1], loc=[42, 43])
    step_at(kw, [2, 5], [12, 5], [6, 2], loc=[44, 45])  # flushed over 16 rows
    step_at(kw, [2], [13], [5], loc=[41])  # slot 41 freed by request 5, given to request 2
    kw.before_spec(spec_batch([2], [14], [5]))  # flushed over 16 rows, rows 1-15 from the first window
    assert kw.writer.computed[1] == ([5] + [8, 9, 1, 6, 2] + [0] * 10, [13] + [3, 11, 4, 12, 5] + [0] * 10)
    assert kw.writer.pool[41] == 5013, "the newer row kept its slot"
    assert kw.draft_pass.calls[0]["loc"] == [kw.req_to_token[2, 13].item()], "the pass found the latest position"


def test_graphs_are_captured_after_every_warm_up_the_largest_first(monkeypatch):
    events = []

    class Graph:
        pass

    class Capture:
        def __init__(self, graph, pool):
            events.append(("pool", pool))

        def __enter__(self):
            events.append("begin")

        def __exit__(self, *exc):
            events.append("end")

    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(torch.cuda, "graph", Capture)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: events.append("sync"))
    graphs = keepwarm.capture_graphs({n: (lambda n=n: events.append(n)) for n in (16, 32, 64)}, "p")
    assert events == [16, 32, 64, "sync"] + [("pool", "p"), "begin", 64, "end", ("pool", "p"), "begin", 32, "end",
                                             ("pool", "p"), "begin", 16, "end", "sync"]
    assert list(graphs) == [16, 32, 64] and all(isinstance(g, Graph) for g in graphs.values())


def test_flush_row_counts():
    assert keepwarm.flush_row_counts(1024) == [16, 32, 64, 128, 256, 512, 1024]
    assert keepwarm.flush_row_counts(40) == [16, 32, 40]
    assert keepwarm.flush_row_counts(16) == [16]


def test_a_step_that_would_not_fit_flushes_the_steps_before_it():
    kw = deferred(steps=8, rows=4)
    step_at(kw, [1, 2, 3], [5, 5, 5], [1, 2, 3])
    step_at(kw, [1, 2], [6, 6], [4, 5])
    assert kw.writer.computed == [([1, 2, 3], [5, 5, 5])]


def test_the_speculative_step_writes_the_waiting_steps_first():
    kw = deferred(steps=8)
    step_at(kw, [2], [10], [7])
    step_at(kw, [2], [11], [9])
    batch = spec_batch([2], [12], [9])
    kw.before_spec(batch)
    assert len(kw.writer.computed) == 1
    (call,) = kw.draft_pass.calls
    assert call["loc"] == [kw.req_to_token[2, 11].item()], "the pass drafts from the last plain position"
    assert batch.spec_info.topk_index.tolist() == [[1009]]


def test_a_prefill_writes_the_waiting_steps_before_it_clears_a_slot():
    kw = deferred(steps=8)
    step_at(kw, [3], [20], [9])
    kw.on_prefill(NS(req_pool_indices=torch.tensor([3])))
    assert len(kw.writer.computed) == 1
    batch = spec_batch([3], [21], [4])
    kw.before_spec(batch)
    assert batch.spec_info.topk_index.tolist() == [[-1]], "the old request's rows landed before the clear"


def test_deferred_buffers_take_turns_on_the_side_stream():
    lane = DeferredLane()
    kw = deferred(steps=2, lane=lane)
    step_at(kw, [2], [10], [7])
    step_at(kw, [2], [11], [8])  # buffer 0 full: its flush is queued, not run
    step_at(kw, [2], [12], [9])
    assert kw.writer.computed == [] and len(lane.queue) == 1
    step_at(kw, [2], [13], [1])  # buffer 1 full: queued; buffer 0 is rewritten next, so its flush runs
    assert kw.writer.computed == [([7, 8], [10, 11])]
    step_at(kw, [2], [14], [2])
    kw.before_spec(spec_batch([2], [15], [2]))
    assert kw.writer.computed[1:] == [([9, 1], [12, 13]), ([2], [14])]
    assert kw.draft_pass.calls[0]["loc"] == [kw.req_to_token[2, 14].item()], "every row landed before the pass"


@pytest.mark.parametrize("value, steps", [(None, 8), ("", 8), ("1", 1), ("4", 4)])
def test_the_deferral_setting(value, steps):
    assert keepwarm.deferred_steps(value) == steps


@pytest.mark.parametrize("value", ["0", "-2", "eight", "2.5"])
def test_a_bad_deferral_setting_stops_start_up_in_one_sentence(value):
    with pytest.raises(keepwarm.ConfigError, match=f"SGLANG_ADAPTIVE_KEEP_WARM_DEFER must be a whole number "
                                                   f"of plain steps, at least 1, got '{value}'"):
        keepwarm.deferred_steps(value)


@pytest.mark.parametrize("check", [False, True])
def test_deferral_replaces_the_per_step_graphs_unless_checked(llama_draft, monkeypatch, check):
    calls = []
    monkeypatch.setattr(keepwarm.KVKeepWarm, "capture", lambda self, sizes, lane: calls.append("graphs"))
    monkeypatch.setattr(keepwarm.KVKeepWarm, "defer",
                        lambda self, steps, rows, lane: calls.append(("defer", steps, rows)))
    monkeypatch.setattr(keepwarm, "SideStream", lambda device: keepwarm.SameStream())
    monkeypatch.setattr(keepwarm, "kv_writer_unsupported_reason", lambda model, pool: None)
    monkeypatch.setenv(keepwarm.DEFER_ENV, "4")
    monkeypatch.setenv(keepwarm.CHECK_ENV, "1" if check else "0")
    monkeypatch.setenv(keepwarm.FLUSH_GRAPHS_ENV, "0")  # defer is stubbed: nothing to capture
    keepwarm.make_keep_warm(None, eagle_worker(llama_draft, world_size=1, slots=40), [1, 2, 8])
    assert calls == (["graphs"] if check else [("defer", 4, 40)]), "rows: 4 x 8, or the 40 request slots"


@pytest.mark.parametrize("env, captured", [(None, True), ("0", False), ("1", True)])
def test_the_flush_is_captured_unless_turned_off(llama_draft, monkeypatch, env, captured):
    calls = []
    monkeypatch.setattr(keepwarm.DeferredWrites, "capture", lambda self: calls.append(self.rows) or (0.5, 2.0))
    monkeypatch.setattr(keepwarm, "SideStream", lambda device: keepwarm.SameStream())
    monkeypatch.setattr(keepwarm, "kv_writer_unsupported_reason", lambda model, pool: None)
    monkeypatch.delenv(keepwarm.DEFER_ENV, raising=False)
    monkeypatch.delenv(keepwarm.CHECK_ENV, raising=False)
    if env is None:
        monkeypatch.delenv(keepwarm.FLUSH_GRAPHS_ENV, raising=False)
    else:
        monkeypatch.setenv(keepwarm.FLUSH_GRAPHS_ENV, env)
    kw = keepwarm.make_keep_warm(None, eagle_worker(llama_draft, world_size=1, slots=40), [1, 2, 8])
    assert calls == ([64] if captured else []), "rows: 8 x 8"
    assert (kw.deferred.graph_gib, kw.deferred.graph_seconds) == ((0.5, 2.0) if captured else (0.0, 0.0))


# -- the width-1 draft pass (upstream's preparation and forward stubbed) -----------


def draft_pass_with(monkeypatch, logits, topk=1, rejection=False):
    from sglang_adaptive.upstream import sglang_symbols as up

    calls = []

    def prepare(extend_input, batch, predict, num_draft_tokens, runner, graph_runner, *,
                return_hidden_states_before_norm):
        calls.append(dict(input=extend_input, batch=batch, predict=predict.tolist(),
                          width=num_draft_tokens, graph_runner=graph_runner))
        return "forward-batch"

    entered = []

    class Ctx:
        def __init__(self, name):
            self.name = name

        def __enter__(self):
            entered.append(self.name)

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(up, "prepare_for_draft_extend", prepare)
    monkeypatch.setattr(up, "speculative_moe_backend_context", lambda: Ctx("moe"))
    monkeypatch.setattr(up, "speculative_moe_a2a_backend_context", lambda: Ctx("a2a"))
    monkeypatch.setattr(up, "get_spec", lambda: NS(speculative_use_rejection_sampling=rejection))
    hidden_out = torch.randn(logits.shape[0], 4)
    runner = NS(tp_group="tp", forward=lambda fb: NS(logits_output=NS(
        next_token_logits=logits, hidden_states=hidden_out)) if fb == "forward-batch" else None)
    worker = NS(draft_runner=runner, draft_tp_context=lambda group: Ctx("tp:" + group))
    return keepwarm.DraftPass(worker, topk), calls, entered, hidden_out


def test_the_draft_pass_is_a_width_1_extend_on_a_copy_of_the_batch(monkeypatch):
    logits = torch.tensor([[0.1, 2.0, 0.3], [5.0, 0.0, 1.0]])
    draft_pass, calls, entered, hidden_out = draft_pass_with(monkeypatch, logits)
    batch = NS(seq_lens=torch.tensor([9, 9]), seq_lens_cpu=None, out_cache_loc=None, sampling_info=None)
    aux = torch.randn(2, 12)
    topk_p, topk_index, hidden, probs = draft_pass(
        batch, torch.tensor([4, 5]), aux, torch.tensor([6, 2]), torch.tensor([6, 2]), torch.tensor([30, 31]))
    (call,) = calls
    assert call["width"] == 1 and call["graph_runner"] is None and call["predict"] == [4, 5]
    view = call["batch"]
    assert view is not batch and batch.seq_lens.tolist() == [9, 9], "the scheduler's batch stays"
    assert view.seq_lens.tolist() == [6, 2] and view.seq_lens_cpu.tolist() == [6, 2]
    assert view.out_cache_loc.tolist() == [30, 31]
    ext = call["input"]
    assert ext.hidden_states is aux and ext.num_tokens_per_req == 1
    assert ext.num_accept_tokens.tolist() == [1, 1] and ext.num_correct_drafts.tolist() == [0, 0]
    assert entered == ["tp:tp", "moe", "a2a"]
    assert topk_index.tolist() == [[1], [0]] and topk_p.tolist() == [[1.0], [1.0]]
    assert hidden is hidden_out and probs is None


def test_the_draft_pass_samples_its_proposal_under_rejection_sampling(monkeypatch):
    from sglang_adaptive.upstream import sglang_symbols as up

    logits = torch.randn(2, 3)
    draft_pass, _, _, _ = draft_pass_with(monkeypatch, logits, rejection=True)
    monkeypatch.setattr(up, "sample_draft_proposal",
                        lambda lg, temps: ("probs", "p", "index") if lg is logits and temps == "t" else None)
    batch = NS(seq_lens=None, seq_lens_cpu=None, out_cache_loc=None, sampling_info=NS(temperatures="t"))
    got = draft_pass(batch, torch.tensor([1, 2]), torch.zeros(2, 4), torch.tensor([1, 1]), None,
                     torch.tensor([3, 4]))
    assert got[:2] == ("p", "index") and got[3] == "probs"


# -- the K/V check ------------------------------------------------------------------


class CheckedPool(Pool):
    def get_key_buffer(self, layer_id):
        return self.k

    def get_value_buffer(self, layer_id):
        return self.v


def test_the_check_reports_how_far_the_draft_extend_rewrote_the_rows(caplog):
    import logging
    import re

    pool = CheckedPool()
    check = keepwarm.KVCheck(NS(radix=NS(layer_id=0), pool=pool))
    loc = torch.tensor([3, 7])
    pool.k[loc], pool.v[loc] = 1.0, 2.0

    def draft_extend():  # writes the same V, a K off by 0.5 in one row
        pool.k[3] += 0.5

    with caplog.at_level(logging.INFO):
        check(draft_extend, loc)
    assert check.max_diff == [0.5, 0.0] and check.max_abs == [1.5, 2.0]
    line = caplog.records[-1].getMessage()
    m = re.search(keepwarm.CHECK_LOG_PATTERN, line)
    assert m and m.groups() == ("1", "5.000e-01", "0.000e+00", "1.500e+00", "2.000e+00")


# -- kv: a prefill without the draft's extend ---------------------------------------


def prefill_batch(chunked_next=None):
    """Slot 2: 3 cached tokens + 4 new (10-13); slot 5: 2 new (20, 21). KV slots 100-105."""
    reqs = [object(), object()]
    return NS(extend_lens=[4, 2], prefix_lens=[3, 0], extend_num_tokens=6,
              input_ids=torch.tensor([10, 11, 12, 13, 20, 21]), out_cache_loc=torch.arange(100, 106),
              req_pool_indices=torch.tensor([2, 5]), reqs=reqs,
              chunked_req=reqs[0] if chunked_next is not None else None,
              chunked_req_next_prompt_token=chunked_next)


@pytest.mark.parametrize("chunked_next", [None, 77])
def test_a_prefill_writes_every_prompt_position_and_stashes_the_last(chunked_next):
    kw, _ = kv_keep_warm()
    aux = torch.arange(6 * 12, dtype=torch.float32).reshape(6, 12)
    topk_p, topk_index, hidden = kw.prefill(prefill_batch(chunked_next), aux, torch.tensor([50, 60]))
    (ids, positions, loc), = kw.writer.calls
    # Position i takes the token after it; a prompt's last takes the sampled token, or,
    # for a chunk with more prompt to come, the chunk's next prompt token.
    assert ids == [11, 12, 13, 50 if chunked_next is None else 77, 21, 60]
    assert positions == [3, 4, 5, 6, 0, 1] and loc == [100, 101, 102, 103, 104, 105]
    assert kw.position[[2, 5]].tolist() == [6, 1]
    torch.testing.assert_close(kw.hidden[[2, 5]], aux[[3, 5], :4] + 100)
    assert kw.pending
    assert topk_p.shape == (2, 1) and topk_p.dtype == torch.float32
    assert topk_index.shape == (2, 1) and topk_index.dtype == torch.int64
    assert hidden.shape == (2, 4) and hidden.dtype == kw.hidden.dtype


def test_the_first_speculative_step_after_a_plain_prefill_drafts_from_its_last_position():
    kw, req_to_token = kv_keep_warm()
    aux = torch.arange(6 * 12, dtype=torch.float32).reshape(6, 12)
    kw.prefill(prefill_batch(), aux, torch.tensor([50, 60]))
    batch = spec_batch([5, 2], [2, 7], [60, 50])
    kw.before_spec(batch)
    (call,) = kw.draft_pass.calls
    assert call["ids"] == [60, 50] and call["prefix"] == [1, 6]
    assert call["loc"] == [req_to_token[5, 1].item(), req_to_token[2, 6].item()]
    torch.testing.assert_close(call["hidden"], aux[[5, 3], :4] + 100)
    assert batch.spec_info.topk_index[:, 0].tolist() == [1060, 1050]


def test_a_plain_prefill_writes_after_the_writes_in_flight():
    """A finished request's last write may target the slot this prefill reuses: the
    prefill's row and stash must land after it."""
    kw, _ = kv_keep_warm([1, 4], DeferredLane())
    plain_step(kw, [2], [20], [9])
    assert kw.lane.queue, "the plain step's write is in flight"
    kw.prefill(prefill_batch(), torch.zeros(6, 12), torch.tensor([50, 60]))
    assert kw.lane.queue == []
    assert kw.position[2].item() == 6, "the prefill's stash, not the old request's"
