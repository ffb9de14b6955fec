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


#: inductor compiles C++ on CPU: with a cold cache, as on a fresh CI machine, pape_ri took 47 s and liere8 26 s, alibi
#: 12 s; CI (``make test``) compiles alibi, ``make test-all`` the three (every encoding's graph capture is
#: test_compile_full_graph's)
INDUCTOR_ENCODINGS = [pytest.param("pape_ri", marks=pytest.mark.extended),
                      pytest.param("liere8", marks=pytest.mark.extended), "alibi"]


@pytest.mark.parametrize("encoding", INDUCTOR_ENCODINGS)
def test_inductor_forward_and_backward(encoding):
    """The default backend end to end (slow to compile on CPU, so one encoding of each mechanism: tokens and q/k,
    rotations, a bias)."""
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
