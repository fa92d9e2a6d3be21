"""Document masking through FlexAttention (`Kernels.attention = "flex"`) equals the dense-mask SDPA
reference. FlexAttention runs forward only on a CPU (torch 2.13 has no CPU backward), so the
gradients are compared on CUDA by benchmarks/gpu_check.py; here the logits and losses, in fp32."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from oreline.model.kernels.select import kernels_for, resolve_attention
from oreline.model.llama import REFERENCE, Llama, ModelArgs, doc_block_mask

pytest.importorskip("torch.nn.attention.flex_attention")

FLEX = dataclasses.replace(REFERENCE, attention="flex")


def _pair(**kw) -> tuple[Llama, Llama]:
    args = ModelArgs(
        **(
            dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=211, ffn_dim=96, max_seq_len=512)
            | kw
        )
    )
    torch.manual_seed(0)
    dense = Llama(args)
    flex = Llama(args, FLEX)
    flex.load_state_dict(dense.state_dict())
    return dense.eval(), flex.eval()


def _docs(batch: int, seq: int, p: float, seed: int) -> torch.Tensor:
    """Packed-document ids as the loader makes them: a cumulative count of document starts."""
    g = torch.Generator().manual_seed(seed)
    return torch.cumsum((torch.rand(batch, seq, generator=g) < p).int(), dim=1).int()


@pytest.mark.parametrize(
    ("n_kv_heads", "seq", "p"),
    [(2, 200, 0.02), (4, 128, 0.1), (1, 300, 0.005), (2, 256, 0.0)],
    ids=["gqa-200", "mha-128", "mqa-300", "one-doc-256"],
)
def test_flex_doc_mask_equals_the_dense_mask(n_kv_heads, seq, p):
    dense, flex = _pair(n_kv_heads=n_kv_heads)
    ids = torch.randint(0, 211, (3, seq), generator=torch.Generator().manual_seed(1))
    doc_ids = _docs(3, seq, p, seed=seq)
    labels = torch.roll(ids, -1, dims=1)
    with torch.no_grad():
        want, got = dense(ids, doc_ids), flex(ids, doc_ids)
        torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)
        torch.testing.assert_close(flex(ids, doc_ids, labels=labels), dense(ids, doc_ids, labels=labels))
        # and the mask really matters: without it the logits differ (unless there is one document)
        if p > 0:
            assert not torch.allclose(dense(ids), want, atol=1e-3)


def test_block_mask_is_causal_and_within_documents():
    doc_ids = torch.tensor([[0] * 70 + [1] * 100 + [2] * 30, [0] * 200])
    mask = doc_block_mask(doc_ids)
    dense = mask.to_dense()  # (B, 1, blocks, blocks) of 128×128 tiles that are computed
    # batch 0: query tile 1 (tokens 128-199) sees tile 0 only through document 1 (tokens 70-127);
    # batch 1: one document, plain causal
    assert dense.shape == (2, 1, 2, 2)
    assert dense[0, 0].tolist() == [[1, 0], [1, 1]] and dense[1, 0].tolist() == [[1, 0], [1, 1]]
    doc_ids = torch.tensor([[0] * 128 + [1] * 128])
    assert doc_block_mask(doc_ids).to_dense()[0, 0].tolist() == [[1, 0], [0, 1]]  # tile skipped


def test_auto_takes_flex_on_cuda_with_doc_mask_only():
    assert resolve_attention("auto", "cuda", doc_mask=True) == "flex"
    assert resolve_attention("auto", "cuda", doc_mask=False) == "sdpa"
    assert resolve_attention("auto", "cpu", doc_mask=True) == "sdpa"
    assert resolve_attention("flex", "cpu", doc_mask=True) == "flex"
    assert kernels_for("reference", "cpu", attention="flex").attention == "flex"
    assert kernels_for("cpu", "cpu", attention="flex").rope is not REFERENCE.rope  # the CPU set, with flex
