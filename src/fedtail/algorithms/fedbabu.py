"""FedBABU: Toward Enhanced Representation for Federated Image Classification.

Oh, Kim and Yun, ICLR 2022 (Algorithm 1). The model is a body (extractor) θ_ext and a head
(classifier) θ_cls. The head is the common random initialisation θ_cls^0 and is never updated
during federated training: in round t a sampled client i loads the global body with θ_cls^0 and
runs the run's E epochs of SGD on the body alone (the head frozen), and the server averages
the bodies like FedAvg,

    θ_ext^{t+1} = Σ_{i∈S_t} (n_i / n_S) · θ_ext,i^{t+1}.

The global model is (θ_ext^t, θ_cls^0); it is what the global test split sees. Personalised
accuracy: every client fine-tunes a copy of the global model on its own training data for
τ_f epochs of SGD and is evaluated with the result. That is the engine's fine-tuning before
evaluation (``--finetune-epochs``, :class:`fedtail.config.FinetuneConfig`), which FedBABU gets from
its reference settings: it changes no client state, never reaches the server, and draws its
batches from the evaluation task's own random stream, so results are deterministic and
independent of how often one evaluates.

Only bodies travel, in both directions: every client already holds θ_cls^0 (the run's common
initial model, ``ctx.init_weights``) and never changes it, so sending or uploading the head would
carry the same tensors every time.

Defaults and *interpretations*:

- τ_f = 5 (reference ``finetune.epochs``): the paper fine-tunes for several numbers of epochs (its figures go up
  to 20); 5 is the value of its main personalisation tables. FedReMa's Table 1 runs 320, chosen on
  validation data: on ``cnn2fc`` with 480 samples a client, the last-10 mean rose with every
  doubling from 1 to 320 epochs, and the grid stopped at 320 for the tuning budget
  (``benchmarks/fedrema/README.md``, "Validation"; ``docs/defaults.md``). The cost is paid by
  every client at every evaluation: 320 epochs took 10-14 min of one core per evaluation there
  (AVX-512; CPUs without it take up to twice as long), about 3 h for a 200-round run.
- ``--finetune-params all`` (the paper's default: body and head are fine-tuned together); ``head``
  fine-tunes the head alone, the body frozen (the paper's head-only ablation).
- fine-tuning uses the local update's settings (``--finetune-optimizer run``): the run's learning
  rate (at the evaluated round), batch size, momentum, weight decay and clipping.
- clients that hold no training data are evaluated with the global model unchanged.
- configs stored when τ_f was the option ``finetune_epochs`` (and the part, ``finetune``
  full/head) are read as the engine setting (:func:`migrate`).

Missing replies (``--dropout``, rejected replies): the body is the sample-weighted mean of the
bodies that arrived (the head never changes); evaluation does not depend on who replied.

Model split and reference settings (``fedtail list``; a run gets them unless it sets them):
the head is the last linear layer, as in the paper (its "head" is the final linear classifier)
and in PFLlib (``model.fc``), whose implementation stands for FedReMa's baseline; plain SGD
(momentum 0), no clipping. On ``cnn2fc`` that freezes 5,130 of 582,026 parameters and trains FC
512 with the convolutions; ``--head all-fc`` (the model's own split, what runs made before the
reference split used) freezes both FC layers, 529,930 parameters, at their random values.
PFLlib fine-tunes (10 epochs, whole model) once, after the last round, and reports the best
un-fine-tuned accuracy during training; here every evaluation fine-tunes (``--finetune-epochs``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fedtail.algorithms.base import PFLLIB, Algorithm, ClientHalf, Message, Reference, Tensors
from fedtail.algorithms.fedrep import BodyServer, train_only

if TYPE_CHECKING:
    from fedtail.engine.context import ClientContext
    from fedtail.models import SplitModel


def migrate(config: dict[str, Any]) -> dict[str, Any]:
    """A config stored when fine-tuning was FedBABU's own options (``finetune_epochs``, default 5;
    ``finetune`` full/head) as the engine's ``finetune`` setting; today's configs unchanged."""
    options = dict(config.get("options") or {})
    if "finetune_epochs" not in options and "finetune" not in options:
        return config
    from fedtail.config import FinetuneConfig

    epochs = options.pop("finetune_epochs", 5)
    params = "head" if options.pop("finetune", "full") == "head" else "all"
    out = {k: v for k, v in config.items() if k != "finetune"} | {"options": options}
    if epochs:
        out["finetune"] = FinetuneConfig(epochs=epochs, params=params).model_dump(mode="json")
    return out


class FedBABUServer(BodyServer):
    """FedRep's server (sample-weighted mean of the bodies; bodies out, bodies in) plus a global model."""

    def global_weights(self) -> Tensors:
        init = self.ctx.init_weights
        return self.body | {k: init[k] for k in init if k not in self.body}


def load_with_initial_head(body: Tensors, ctx: ClientContext) -> SplitModel:
    """The main model with the global ``body`` and the run's initial head θ_cls^0."""
    model = ctx.model()
    head = {k: ctx.init_weights[k] for k in model.head_keys()}
    return ctx.load(body | head)


class FedBABUClient(ClientHalf):
    def fit(self, msg: Message, ctx: ClientContext) -> Message:
        model = load_with_initial_head(msg.tensors, ctx)
        train_only(ctx, model.body, model.head, None)  # None: the run's local epochs
        return ctx.reply(ctx.weights(keys=model.body_keys()))

    def evaluate(self, msg: Message, ctx: ClientContext) -> Message:
        load_with_initial_head(msg.tensors, ctx)
        return ctx.evaluate()  # fine-tuned first by the engine (--finetune-*)


FEDBABU = Algorithm(
    name="fedbabu",
    summary="FedBABU (Oh et al. 2022): body-only FedAvg with a fixed random head; fine-tuned before evaluation",
    server=FedBABUServer,
    client=FedBABUClient,
    reference=Reference(PFLLIB, head="last", finetune={"epochs": 5}),
    migrate=migrate,
    tasks=("classification", "segmentation"),
    robust=True,
    dp=True,
)
