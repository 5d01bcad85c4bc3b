"""One objective contract (issue 62, item 1): the spec's choices, sections and checks, the model
class the trainer builds and its FLOPs all come from xylent.objectives.OBJECTIVES and
xylent.models.objective.ObjectiveModel; a new objective plugs in with an entry and its class alone."""

from __future__ import annotations

import typing

import pytest
import torch
import torch.nn.functional as F

from xylent.models.config import preset
from xylent.models.encoder import Embeddings, Encoder
from xylent.models.objective import ObjectiveModel
from xylent.models.objectives import build_model, model_class
from xylent.models.training.optim import flops_per_token, make_optimizer
from xylent.models.stats import Norms, Stats
from xylent.objectives import OBJECTIVES, Objective, with_section
from xylent.spec import PretrainConfig

SPECIALS = dict(zip(("unk", "bos", "eos", "pad", "mask"), range(5)))


class BigramObjective(ObjectiveModel):
    """A toy: each token predicts the next one from a one-layer encoder that sees only itself. What a
    new objective must write is here: the constructor from the run's options, forward's sums and
    counts, the loss and the exported weights; every other hook keeps ObjectiveModel's default."""

    objective = "bigram"
    loss_weights = {"generator_loss": 1.0}

    def __init__(self, cfg, width: int):
        super().__init__()
        self.cfg = cfg
        self.embeddings = Embeddings(cfg)
        self.discriminator = Encoder(cfg, 1, dropout=0.0)
        self.out = torch.nn.Linear(cfg.hidden, cfg.vocab_size)
        self.width = width

    @classmethod
    def from_options(cls, cfg, disc_weight, mask_prob, options):
        return cls(cfg, options["width"])

    def forward(self, ids, pad, segments, noise, per_row=False, **host_counts):
        x = self.embeddings(ids)
        logits = self.out(self.discriminator(x, pad))[:, :-1]
        keep = ~pad[:, 1:]
        loss = F.cross_entropy(logits[keep], ids[:, 1:][keep], reduction="sum")
        z = loss.new_zeros(())
        return Stats(loss, z, keep.sum(), z, z, z, z, z, z, (~pad).sum())

    def loss(self, st: Stats, norms: Norms) -> torch.Tensor:
        return st.g_loss / norms.g

    def encoder_state_dict(self):
        return {k: v for k, v in self.state_dict().items() if k.startswith(("embeddings.", "discriminator."))}


@pytest.fixture
def bigram(monkeypatch):
    entry = Objective("bigram", "a toy bigram predictor", f"{__name__}:BigramObjective", has_section=True)
    monkeypatch.setitem(OBJECTIVES, "bigram", entry)
    return entry


def test_a_new_objective_trains_through_the_registry_alone(bigram):
    cfg = preset("tiny", vocab_size=40, max_position=32, dropout=0.0, specials=SPECIALS)
    torch.manual_seed(0)
    with pytest.raises(ValueError, match="objective bigram needs its options"):
        build_model("bigram", cfg)
    model = build_model("bigram", cfg, options={"width": 3})
    assert type(model).__name__ == "BigramObjective" and model.width == 3
    ids = torch.randint(5, 40, (4, 16), generator=torch.Generator().manual_seed(1))
    pad = torch.zeros_like(ids, dtype=torch.bool)
    pad[0, 12:] = True
    ids[pad] = SPECIALS["pad"]
    opt = make_optimizer(model, lr=1e-2)
    model.attach(torch.device("cpu"))  # the trainer's calls, in its order, every default hook included
    losses = []
    for step in range(30):
        counts = model.host_counts(ids.numpy(), None, (~pad).numpy())
        st = model(ids, pad, None, torch.rand(4, *ids.shape), **counts)
        loss = model.loss(st, Norms(float(st.g_count)))
        opt.zero_grad()
        loss.backward()
        opt.step()
        model.after_step()
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.5 * losses[0], "it learns the repeated batch"
    assert model.objective_state() is None and model.generated_input() is None and not model.freezes_body()
    with pytest.raises(ValueError, match="keeps no state"):
        model.load_objective_state({"x": 1})
    assert flops_per_token(cfg, 16, "bigram") < flops_per_token(cfg, 16, "mlm") + 1, "its own layer count"
    assert set(model.encoder_state_dict()) and all(k.startswith(("embeddings.", "discriminator."))
                                                    for k in model.encoder_state_dict())


def test_the_spec_offers_exactly_the_declared_objectives_and_their_sections():
    assert typing.get_args(PretrainConfig.model_fields["objective"].annotation) == tuple(OBJECTIVES)
    sections = {n for n, f in PretrainConfig.model_fields.items() if n in OBJECTIVES}
    assert sections == set(with_section()), "each section is the field named as its objective, and no other"
    for name in sections:
        assert PretrainConfig(objective=name).objective_options() == getattr(PretrainConfig(), name).model_dump()
    for name, declared in OBJECTIVES.items():
        cls = model_class(name)
        assert cls.objective == name and issubclass(cls, ObjectiveModel)
        assert (PretrainConfig(objective=name).objective_options() == {}) == (not declared.has_section)
        if declared.needs_pairs:
            with pytest.raises(ValueError, match=f"objective {name} learns from translation pairs"):
                PretrainConfig(objective=name, tasks=["mrtd"])
        if declared.no_zero3:
            with pytest.raises(ValueError, match="ZeRO-3"):
                PretrainConfig(objective=name, zero_stage=3)
        else:
            PretrainConfig(objective=name, zero_stage=3)


def test_an_unknown_objective_names_the_choices():
    with pytest.raises(ValueError, match="unknown objective 'nope'; choose one of electra, mlm, infoxlm, veco, transformers-electra"):
        model_class("nope")
