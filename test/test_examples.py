"""The examples run end to end at a small size and their training loss falls."""
import importlib.util
import math
import os
import sys

import pytest

import tensorplay as tp

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "examples")


def load_example(name):
    spec = importlib.util.spec_from_file_location(f"example_{name}", os.path.join(EXAMPLES, f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def _mean(xs):
    return sum(xs) / len(xs)


def test_train_mlp_loss_falls(capsys):
    losses = load_example("train_mlp").main(["--small"])
    assert len(losses) == 200 and all(math.isfinite(v) for v in losses)
    assert losses[0] == pytest.approx(math.log(2), abs=0.1)      # starts at chance
    assert _mean(losses[-20:]) < 0.6 * _mean(losses[:20])
    out = capsys.readouterr().out
    assert "train accuracy" in out and "loss" in out


def test_gpt_loss_falls(capsys):
    gpt = load_example("gpt")
    losses = gpt.main(["--small"])
    assert len(losses) == 40 and all(math.isfinite(v) for v in losses)
    assert losses[0] == pytest.approx(math.log(32), abs=0.3)     # uniform over the vocabulary
    assert _mean(losses[-5:]) < _mean(losses[:5]) - 0.6
    assert "sample continuation" in capsys.readouterr().out


def test_gpt_model_structure():
    gpt = load_example("gpt")
    cfg = gpt.GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=16)
    model = gpt.GPT(cfg)
    # the LM head is the token embedding: one Parameter, counted once, two state_dict keys
    assert model.lm_head.weight is model.wte.weight
    names = [n for n, _ in model.named_parameters()]
    assert "lm_head.weight" not in names and "wte.weight" in names
    assert {"wte.weight", "lm_head.weight"} <= set(model.state_dict())
    idx = tp.randint(0, 11, (3, 8))
    logits, loss = model(idx, idx)
    assert logits.shape == (3, 8, 11) and loss.dim() == 0
    # causality: changing a later token does not change earlier logits
    idx2 = idx.clone()
    idx2[:, -1] = (idx[:, -1] + 1) % 11
    logits2, _ = model(idx2)
    assert bool((logits2[:, :-1] - logits[:, :-1]).abs().max() < 1e-5)
    out = model.generate(idx[:1, :2], max_new_tokens=5)
    assert out.shape == (1, 7)


@pytest.mark.gpu
def test_gpt_on_cuda():
    if not tp.cuda.is_available():
        pytest.skip("no CUDA device")
    losses = load_example("gpt").main(["--small", "--device", "cuda"])
    assert _mean(losses[-5:]) < _mean(losses[:5]) - 0.6
