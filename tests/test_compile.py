"""torch.compile works for every encoding as one graph (no graph breaks), forward and backward."""

from __future__ import annotations

import pytest
import timm
import torch

import pape_hub

pytestmark = pytest.mark.export  # `make test-fast` leaves these out; `make test` (CI) runs them


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()  # every encoding compiles the same code objects; do not share guards across tests
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("encoding", pape_hub.list_encodings())
def test_compile_full_graph(encoding):
    torch.manual_seed(0)
    model = timm.create_model(f"vit_t4_{encoding}", embed_dim=32, depth=2, num_heads=2)
    x = torch.randn(2, 3, 16, 16)
    compiled = torch.compile(model, fullgraph=True, backend="eager")  # graph capture: no breaks anywhere
    out = compiled(x)
    torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-5)
    out.sum().backward()
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize("encoding", ["sape2", "sape2_ape"])
def test_compiled_inference_is_one_graph(encoding):
    """Without gradients SaPE² writes its bias in place on eager CPU (an ``out=`` that would break a graph)."""
    torch.manual_seed(0)
    model = timm.create_model(f"vit_t4_{encoding}", embed_dim=32, depth=2, num_heads=2).eval()
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(model, fullgraph=True, backend="eager")(x), model(x))


#: one encoding of each mechanism: tokens and q/k (pape_ri), rotations (liere8), a bias (alibi)
MECHANISMS = ["pape_ri", "liere8", "alibi"]


@pytest.mark.parametrize("encoding", MECHANISMS)
def test_aot_autograd_forward_and_backward(encoding):
    """What inductor is handed, without its C++ compile: AOTAutograd traces the joint forward and backward graph
    with inductor's decompositions and partitioner and runs it; outputs and gradients equal eager's. (Plain
    ``aot_eager`` fails PaPE-RI's backward in torch 2.14 on a ``view`` of softplus's gradient, a stride its graph
    assumes and eager's kernel does not give: pytorch/pytorch#120035, open; inductor's decompositions, and inductor,
    run it.)"""
    torch.manual_seed(0)
    model = timm.create_model(f"vit_t4_{encoding}", embed_dim=32, depth=2, num_heads=2)
    x = torch.randn(2, 3, 16, 16)
    model(x).sum().backward()
    eager = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    out = torch.compile(model, backend="aot_eager_decomp_partition")(x)
    torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-5)
    out.sum().backward()
    for name, param in model.named_parameters():
        torch.testing.assert_close(param.grad, eager[name], rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.extended  # inductor compiles C++ on CPU: with a cold cache, as on a fresh CI machine, the first compile
# in a process pays some 35 s of setup, and pape_ri took 47 s, liere8 26 s; ``make test-all`` runs these
@pytest.mark.parametrize("encoding", MECHANISMS)
def test_inductor_forward_and_backward(encoding):
    """The default backend end to end (slow to compile on CPU, so one encoding of each mechanism)."""
    torch.manual_seed(0)
    model = timm.create_model(f"vit_t4_{encoding}", embed_dim=32, depth=2, num_heads=2)
    x = torch.randn(2, 3, 16, 16)
    out = torch.compile(model)(x)
    torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-5)
    out.sum().backward()


def test_compiled_liere_inference_has_no_graph_break():
    """Compiled LieRE inference runs as one graph (its rotations are part of it; the Python cache is for eager)."""
    torch.manual_seed(0)
    model = timm.create_model("vit_t4_liere8", embed_dim=32, depth=2, num_heads=2).eval()
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
        torch.testing.assert_close(compiled(x), model(x))
