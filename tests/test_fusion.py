"""`tuner.fuse`: sibling linears answered by one stacked GEMM, with each member's output as
before; where it steps aside (more rows than its cap, autograd, a replaced parameter,
torch.compile) or recomputes (another input, an input changed in place), and which groups
it refuses."""
import threading
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import tuner
from tests.factories import captured_and_replayed
from tuner import fusion
from tuner.fusion import SIBLINGS, unfuse
from tuner.shapes import load_shapes


class Block(nn.Module):
    """Attention's projections and a gated MLP, as Hugging Face's Llama names them."""

    def __init__(self, width=16, bias=False):
        super().__init__()
        self.q_proj = nn.Linear(width, 32, bias=bias)
        self.k_proj = nn.Linear(width, 8, bias=bias)
        self.v_proj = nn.Linear(width, 8, bias=bias)
        self.gate_proj = nn.Linear(width, 20, bias=bias)
        self.up_proj = nn.Linear(width, 20, bias=bias)

    def forward(self, x, context=None):
        kv_input = x if context is None else context
        attention = torch.cat([self.q_proj(x), self.k_proj(kv_input), self.v_proj(kv_input)], -1)
        return attention, torch.relu(self.gate_proj(x)) * self.up_proj(x)


def stock_outputs(block, *args):
    with torch.no_grad():
        return block(*args)


@pytest.fixture
def block():
    torch.manual_seed(0)
    return Block(bias=True)


def assert_same(got, want):
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_each_group_runs_one_stacked_gemm_with_each_members_output(block, tmp_path):
    x = torch.randn(3, 5, 16)
    expected = stock_outputs(block, x)
    state = {k: v.clone() for k, v in block.state_dict().items()}
    with torch.no_grad(), tuner.fuse(block) as fused, tuner.record(tmp_path / "s.csv"):
        got = block(x)
    assert len(fused.groups) == 2
    assert_same(got, expected)
    # One addmm per group over its stacked rows: 20 + 20, and 32 + 8 + 8.
    assert sorted((s.M, s.N, s.K, s.weight) for s in load_shapes(tmp_path / "s.csv")) == [
        (15, 40, 16, 1), (15, 48, 16, 1)]
    for key, value in block.state_dict().items():
        assert torch.equal(value, state[key]), key


def test_the_members_weights_become_views_of_one_buffer_and_fusing_again_copies_nothing(block):
    with tuner.fuse(block) as first:
        buffer = first.groups[0].weight
    storages = {block.q_proj.weight.untyped_storage().data_ptr(),
                block.k_proj.weight.untyped_storage().data_ptr(),
                block.v_proj.weight.untyped_storage().data_ptr()}
    assert storages == {buffer.untyped_storage().data_ptr()}
    assert block.k_proj.weight.data_ptr() == buffer[32:].data_ptr()
    with tuner.fuse(block) as again:
        assert again.groups[0].weight.data_ptr() == buffer.data_ptr()
    assert "forward" not in vars(block.q_proj)


def test_patch_leaves_fused_members_alone_and_fuse_leaves_patched_ones(block):
    with tuner.fuse(block):
        assert tuner.patch(block, ("cpu",)).modules == []
    with tuner.patch(block, ("cpu",)) as patched:
        assert len(patched.modules) == 5
        assert tuner.fuse(block).groups == []


def test_unfuse_gives_every_member_its_class_forward(block):
    tuner.fuse(block)
    assert "forward" in vars(block.up_proj)
    unfuse(block)
    assert not any("forward" in vars(m) for m in block.modules())


def test_inputs_of_more_rows_than_max_rows_run_each_member_alone(block, tmp_path):
    x = torch.randn(3, 5, 16)  # 15 rows
    expected = stock_outputs(block, x)
    with torch.no_grad(), tuner.fuse(block, max_rows=14), tuner.record(tmp_path / "s.csv"):
        got = block(x)
    assert_same(got, expected)
    assert sorted(s.N for s in load_shapes(tmp_path / "s.csv")) == [8, 20, 32]
    with torch.no_grad(), tuner.fuse(block, max_rows=15), tuner.record(tmp_path / "t.csv"):
        block(x)
    assert sorted(s.N for s in load_shapes(tmp_path / "t.csv")) == [40, 48]


@pytest.mark.parametrize("max_rows", [0, -1, 1.5, True, "8"])
def test_a_bad_max_rows_is_refused_in_one_line(block, max_rows):
    with pytest.raises(ValueError, match="max_rows must be a positive int"):
        tuner.fuse(block, max_rows=max_rows)


def test_a_member_called_with_another_input_gets_its_own_product(block):
    x, context = torch.randn(2, 16), torch.randn(2, 16)
    expected = stock_outputs(block, x, context)
    with torch.no_grad(), tuner.fuse(block):
        assert_same(block(x, context), expected)


def test_an_input_changed_in_place_between_the_calls_is_not_served_stale(block):
    x = torch.randn(4, 16)
    with torch.no_grad():
        q_expected = block.q_proj(x)
        k_expected = block.k_proj(x * 2)
        with tuner.fuse(block):
            q = block.q_proj(x)
            x.mul_(2)
            k = block.k_proj(x)
    assert_same((q, k), (q_expected, k_expected))


def test_under_autograd_each_member_computes_alone_and_gets_its_gradient(block):
    x = torch.randn(4, 16)
    with tuner.fuse(block):
        attention, mlp = block(x)
        (attention.sum() + mlp.square().sum()).backward()
    grads = {name: p.grad.clone() for name, p in block.named_parameters()}
    block.zero_grad()
    attention, mlp = block(x)
    (attention.sum() + mlp.square().sum()).backward()
    for name, p in block.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, msg=name)


def test_a_replaced_parameter_is_used_not_the_stale_buffer(block):
    x = torch.randn(4, 16)
    with torch.no_grad(), tuner.fuse(block):
        block.k_proj.weight = nn.Parameter(torch.randn(8, 16))
        got = block(x)
    assert_same(got, stock_outputs(block, x))


def test_each_thread_keeps_its_own_pending_outputs(block, monkeypatch):
    """Threads interleaving their siblings' calls each run one stacked GEMM, not one per
    call, and get their own outputs."""
    inputs = [torch.randn(6, 16) for _ in range(4)]
    expected = [stock_outputs(block, x) for x in inputs]
    stacked_calls = []
    real_linear = F.linear

    def counting_linear(input, weight, bias=None):
        stacked_calls.append(weight.shape[0])  # list.append is atomic under the GIL
        return real_linear(input, weight, bias)

    monkeypatch.setattr(fusion, "F", SimpleNamespace(linear=counting_linear))
    results = {}
    barrier = threading.Barrier(len(inputs))

    def run(i):
        with torch.no_grad():
            q = block.q_proj(inputs[i])
            barrier.wait()  # every thread's siblings pending at once
            results[i] = torch.cat([q, block.k_proj(inputs[i]), block.v_proj(inputs[i])], -1)

    with tuner.fuse(block):
        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(inputs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert stacked_calls == [48] * len(inputs)
    for i, (attention, _) in enumerate(expected):
        torch.testing.assert_close(results[i], attention)


def test_a_fused_model_compiles_without_a_graph_break(block):
    x = torch.randn(4, 16)
    expected = stock_outputs(block, x)
    with torch.no_grad(), tuner.fuse(block):
        assert_same(torch.compile(block, backend="eager", fullgraph=True)(x), expected)


@pytest.mark.parametrize("spoil", ["width", "bias", "dtype", "patched", "missing", "shared"])
def test_groups_whose_members_cannot_share_a_weight_are_left_alone(spoil):
    block = Block()
    if spoil == "width":
        block.k_proj = nn.Linear(12, 8, bias=False)
    elif spoil == "bias":
        block.k_proj = nn.Linear(16, 8, bias=True)
    elif spoil == "dtype":
        block.k_proj.to(torch.float64)
    elif spoil == "patched":
        tuner.patch(block.k_proj, ("cpu",))
    elif spoil == "missing":
        del block.k_proj
    else:
        block.v_proj = block.k_proj
    fused = tuner.fuse(block)
    assert [len(g.members) for g in fused.groups] == [2]  # gate and up only


@pytest.mark.parametrize("groups", [[("q_proj",)], [("q_proj", "")], ["qk"], [(1, 2)]])
def test_groups_that_name_no_siblings_are_refused_in_one_line(block, groups):
    with pytest.raises(ValueError, match="two or more sibling modules"):
        tuner.fuse(block, groups)


def test_the_default_groups_are_llamas_projections():
    assert SIBLINGS == (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def test_an_enabled_fused_block_matches_stock_through_our_kernels(block, triton_answers):
    x = torch.randn(8, 16)
    expected = stock_outputs(block, x)
    with torch.no_grad(), tuner.fuse(block), tuner.enabled(("cpu",)):
        got = block(x)
    for g, w in zip(got, expected):
        torch.testing.assert_close(g, w, rtol=1e-2, atol=1e-2)


@pytest.mark.gpu
def test_a_fused_enabled_block_on_the_gpu_matches_stock_and_replays_in_a_cuda_graph(
        triton_answers):
    torch.manual_seed(1)
    block = Block(width=4096).to("cuda", torch.bfloat16)
    x = torch.randn(8, 4096, device="cuda", dtype=torch.bfloat16)
    expected = stock_outputs(block, x)
    with torch.no_grad(), tuner.fuse(block), tuner.enabled():
        eager = block(x)
        captured = captured_and_replayed(lambda: block(x))
    for g, w in zip(eager, expected):
        torch.testing.assert_close(g, w, rtol=2e-2, atol=2e-2)
    for g, w in zip(captured, eager):
        torch.testing.assert_close(g, w, rtol=0, atol=0)
