"""nmt.model.load_model, the one function that builds a model from a checkpoint's state (decoding,
export, curriculum scoring): the saved weights, eval mode, the device's attention backend, and one
line for an option this nmt does not know or weights that do not fit."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from nmt.config import ModelConfig, to_dict
from nmt.model import build_model, load_model

from ..helpers import tiny_model_config

# attention: a GPU training kernel, the loaded model must still run on this CPU
CFG = tiny_model_config(40, layers=1, dim=16, heads=2, attention="varlen")


def _state(cfg: ModelConfig = CFG, **extra: object) -> dict:
    torch.manual_seed(0)
    model = build_model(dataclasses.replace(cfg, attention="auto"))
    return {"model_config": {**to_dict(cfg), **extra}, "model": model.state_dict()}


def test_the_saved_weights_in_eval_mode_with_the_devices_attention():
    state = _state()
    model = load_model(state, name="a.pt")
    assert not model.training and model.cfg.attention == "auto"
    assert model.cfg == dataclasses.replace(CFG, attention="auto")
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, state["model"][name]), name


def test_an_unknown_option_is_refused_naming_the_checkpoint_and_the_reader():
    state = _state(rotary_positions=True)
    with pytest.raises(
        ValueError, match=r"^a\.pt: model option --rotary-positions is not supported by this nmt$"
    ):
        load_model(state, name="a.pt")
    with pytest.raises(ValueError, match="is not supported by CTranslate2$"):
        load_model(state, name="a.pt", target="CTranslate2")


def test_weights_of_another_shape_are_one_line():
    state = _state()
    state["model_config"]["encoder_ffn_embed_dim"] = 64
    with pytest.raises(
        ValueError, match=r"^a\.pt: weights do not match the checkpoint's model config \("
    ):
        load_model(state, name="a.pt")
