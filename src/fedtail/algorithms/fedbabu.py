"""FedBABU: Toward Enhanced Representation for Federated Image Classification.

Oh, Kim and Yun, ICLR 2022 (Algorithm 1). The model is a body (extractor) θ_ext and a head
(classifier) θ_cls. The head is the common random initialisation θ_cls^0 and is never updated
during federated training: in round t a sampled client i loads the global body with θ_cls^0 and
runs the run's E epochs of SGD on the body alone (the head frozen), and the server averages
the bodies like FedAvg,

    θ_ext^{t+1} = Σ_{i∈S_t} (n_i / n_S) · θ_ext,i^{t+1}.

The global model is (θ_ext^t, θ_cls^0); it is what the global test split sees. Personalised
accuracy: every client fine-tunes a copy of the global model on its own training data for
τ_f = ``finetune_epochs`` epochs of SGD and is evaluated with the result. Fine-tuning lives
only in the evaluation: it changes no client state and never reaches the server, and it draws
its batches from the evaluation task's own random stream, so results are deterministic and
independent of how often one evaluates.

Only bodies travel, in both directions: every client already holds θ_cls^0 (the run's common
initial model, ``ctx.init_weights``) and never changes it, so sending or uploading the head would
carry the same tensors every time.

Defaults and *interpretations*:

- ``finetune_epochs`` = 5: the paper fine-tunes for several numbers of epochs (its figures go up
  to 20); 5 is the value of its main personalisation tables. FedReMa's Table 1 runs 320, chosen on
  validation data: on ``cnn2fc`` with 480 samples a client, the last-10 mean rose with every
  doubling from 1 to 320 epochs, and the grid stopped at 320 for the tuning budget
  (``benchmarks/fedrema/README.md``, "Validation"; ``docs/defaults.md``). The cost is paid by
  every client at every evaluation: 320 epochs took 10-14 min of one core per evaluation there
  (AVX-512; CPUs without it take up to twice as long), about 3 h for a 200-round run.
- ``finetune`` = "full" (the paper's default: body and head are fine-tuned together); "head"
  fine-tunes the head alone, the body frozen (the paper's head-only ablation).
- fine-tuning uses the local update's settings: the run's learning rate (at the evaluated
  round), batch size, momentum and weight decay.
- clients that hold no training data are evaluated with the global model unchanged.

Missing replies (``--dropout``, rejected replies): the body is the sample-weighted mean of the
bodies that arrived (the head never changes); evaluation does not depend on who replied.

Model split and reference settings (``fedtail list``; a run gets them unless it sets them):
the head is the last linear layer, as in the paper (its "head" is the final linear classifier)
and in PFLlib (``model.fc``), whose implementation stands for FedReMa's baseline; plain SGD
(momentum 0), no clipping. On ``cnn2fc`` that freezes 5,130 of 582,026 parameters and trains FC
512 with the convolutions; ``--head all-fc`` (the model's own split, what runs made before the
reference split used) freezes both FC layers, 529,930 parameters, at their random values.
PFLlib fine-tunes (10 epochs, whole model) once, after the last round, and reports the best
un-fine-tuned accuracy during training; here every evaluation fine-tunes (``finetune_epochs``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from fedtail.algorithms.base import PFLLIB, Algorithm, AlgorithmConfig, ClientHalf, Message, Reference, Tensors
from fedtail.algorithms.fedrep import BodyServer, train_only

if TYPE_CHECKING:
    from fedtail.engine.context import ClientContext
    from fedtail.models import SplitModel


class FedBABUConfig(AlgorithmConfig):
    finetune_epochs: int = Field(
        5, ge=0, description="τ_f: epochs of fine-tuning before evaluation (0: the global model as it is)"
    )
    finetune: Literal["full", "head"] = Field(
        "full", description="what evaluation fine-tunes: the whole model (paper's default) or the head alone"
    )


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
        opts: FedBABUConfig = ctx.options
        model = load_with_initial_head(msg.tensors, ctx)
        if opts.finetune_epochs > 0:
            if opts.finetune == "head":
                train_only(ctx, model.head, model.body, opts.finetune_epochs)
            else:
                ctx.train(epochs=opts.finetune_epochs)
        return ctx.evaluate()


FEDBABU = Algorithm(
    name="fedbabu",
    summary="FedBABU (Oh et al. 2022): body-only FedAvg with a fixed random head; fine-tuned before evaluation",
    server=FedBABUServer,
    client=FedBABUClient,
    config=FedBABUConfig,
    reference=Reference(PFLLIB, head="last"),
)
