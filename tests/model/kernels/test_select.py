"""train.kernels picks a Kernels value for the model: the CPU set equals the reference model.

Whole-model tolerances, fp32 on CPU: logits, per-token losses and every parameter gradient within
rtol 1e-4 / atol 1e-5 (four blocks of reordered fp32 sums; measured differences ~1e-6).
"""

import ast
from pathlib import Path

import pytest
import torch

import oreline.model.llama as llama
from oreline.errors import ConfigError
from oreline.model.kernels import matmul
from oreline.model.kernels.select import kernels_for, matmul_backend, resolve_choice, use_matmul_backend
from oreline.model.llama import REFERENCE, Llama, ModelArgs

ARGS = ModelArgs(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=96, ffn_dim=160, max_seq_len=32)
MODEL = {"rtol": 1e-4, "atol": 1e-5}


def _pair(backend: str, tie: bool = True) -> tuple[Llama, Llama]:
    args = ModelArgs(**{**ARGS.to_dict(), "tie_embeddings": tie})
    torch.manual_seed(0)
    ref = Llama(args)
    fast = Llama(args, kernels_for("cpu", "cpu", backend))
    fast.load_state_dict(ref.state_dict(), strict=True)
    return ref, fast


def _run(model: Llama, ids, labels, doc_ids=None):
    model.zero_grad(set_to_none=True)
    logits = model(ids, doc_ids)
    loss = model(ids, doc_ids, labels=labels)
    (loss.sum() + logits.square().mean()).backward()
    return logits.detach(), loss.detach(), {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("backend", matmul.available_backends())
@pytest.mark.parametrize("tie", [True, False])
def test_cpu_kernels_equal_the_reference_model(backend, tie):
    ref, fast = _pair(backend, tie)
    assert list(fast.state_dict()) == list(ref.state_dict())  # checkpoints and HF exports unchanged
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, ARGS.vocab_size, (2, 24), generator=gen)
    labels = torch.randint(0, ARGS.vocab_size, (2, 24), generator=gen)
    labels[:, ::5] = -100
    doc_ids = torch.tensor([[0] * 10 + [1] * 14, [0] * 24])
    for docs in (None, doc_ids):
        a, b = _run(fast, ids, labels, docs), _run(ref, ids, labels, docs)
        torch.testing.assert_close(a[0], b[0], **MODEL)
        torch.testing.assert_close(a[1], b[1], **MODEL)
        assert a[2].keys() == b[2].keys()
        for name in a[2]:
            torch.testing.assert_close(a[2][name], b[2][name], **MODEL, msg=name)


def test_auto_is_cpu_kernels_on_cpu_and_the_measured_choice_on_cuda():
    assert resolve_choice("auto", "cpu") == "cpu"
    assert resolve_choice("auto", torch.device("cuda", 0)) == "cuda"
    assert kernels_for("auto", "cuda:0") is REFERENCE  # no measurement recorded: the reference
    # a run passes rank 0's record to every rank (nodes whose caches differ compute alike)
    from oreline.model.kernels import cuda_choice

    picked = {"rms_norm": "torch", "rope": "complex"}
    chosen = kernels_for("auto", "cuda:0", cuda_picked=picked)
    assert (chosen.rms_norm, chosen.rope) == (cuda_choice.RMS_NORMS["torch"], cuda_choice.ROPES["complex"])
    assert kernels_for("reference", "cpu") is REFERENCE
    with pytest.raises(ConfigError, match="auto, reference, cpu"):
        resolve_choice("fast", "cpu")


def test_the_backend_belongs_to_the_model_not_the_process():
    backend = matmul.available_backends()[-1]
    ref, fast = _pair(backend)
    other = _pair("blas")[1]
    assert matmul_backend(ref) is None and matmul_backend(fast) == backend and matmul_backend(other) == "blas"
    use_matmul_backend(fast, "blas")
    assert matmul_backend(fast) == "blas" and fast.kernels.name.endswith("blas matmuls)")
    use_matmul_backend(ref, "onednn")  # a reference model has plain nn.Linear: nothing to switch
    assert matmul_backend(ref) is None and ref.kernels is REFERENCE


def test_llama_py_is_the_plain_reference():
    """llama.py imports no kernel, no CPU-specific library, and holds no process-wide state."""
    tree = ast.parse(Path(llama.__file__).read_text())
    imported = {
        (node.module if isinstance(node, ast.ImportFrom) else alias.name)
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    assert all(not m.startswith("oreline.model.kernels") for m in imported), imported
    assert not any(isinstance(node, ast.Global) for node in ast.walk(tree))
    source = Path(llama.__file__).read_text()
    assert "mkldnn" not in source and "torch.ops" not in source and "autograd.Function" not in source
    modules = {type(m) for m in Llama(ARGS).modules()}
    assert torch.nn.Linear in modules and matmul.Linear not in modules
