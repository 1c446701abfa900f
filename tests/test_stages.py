"""Stage tasks (GLDP's STHFL setting): the round schedule, stage-restricted client views,
evaluation on the seen stages, A_local / A_global / A_part, the CLI and the report."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import tiny_config, tiny_raw
from fedtail.algorithms.base import ClientHalf, Message
from fedtail.components import build_config
from fedtail.engine import prepare
from fedtail.engine.executors import Task
from fedtail.engine.simulation import EVAL_CALL
from fedtail.errors import ConfigError
from fedtail.metrics import stage_metrics
from helpers import (
    STAGE_SMOKE,
    assert_fails_in_one_line,
    assert_serial_and_parallel_agree,
    invoke,
    invoke_run,
    run,
    run_cli,
    runtime,
    staged,
    staged_raw,
)

# --- the schedule ------------------------------------------------------------------------------


def test_rounds_form_equal_consecutive_stage_blocks():
    config = staged()
    assert (config.num_stages, config.stage_rounds) == (3, 2)
    assert [config.stage_of(r) for r in range(1, 7)] == [0, 0, 1, 1, 2, 2]
    assert [r for r in range(1, 7) if config.is_stage_end(r)] == [2, 4, 6]
    explicit = staged(rounds=9, rounds_per_stage=3)
    assert [explicit.stage_of(r) for r in range(1, 10)] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    plain = tiny_config()  # without stages: one stage, the whole run
    assert plain.num_stages == 1 and {plain.stage_of(r) for r in range(1, 4)} == {0}


@pytest.mark.parametrize(
    "overrides, needle",
    [
        (dict(rounds=7), "--rounds 7 must be a multiple of --stages 3"),
        (dict(rounds=6, rounds_per_stage=3), "--rounds-per-stage 3 × --stages 3 = 9 must equal --rounds 6"),
        (dict(rounds=6, rounds_per_stage=0), "--rounds-per-stage"),
    ],
)
def test_stage_schedule_errors(overrides, needle):
    with pytest.raises(ConfigError) as err:
        build_config(staged_raw(**overrides))
    assert needle in str(err.value)


def test_rounds_per_stage_needs_the_stages_partition():
    with pytest.raises(ConfigError, match="--rounds-per-stage only applies to --partition stages"):
        build_config(tiny_raw(rounds_per_stage=1))
    # and it is reachable with --set, as a top-level key
    assert build_config(staged_raw(), ["rounds_per_stage=2"]).rounds_per_stage == 2


def test_config_json_of_runs_without_stages_is_unchanged():
    assert "rounds_per_stage" not in tiny_config().model_dump(mode="json")
    assert "rounds_per_stage" not in staged().model_dump(mode="json")
    assert staged(rounds_per_stage=2).model_dump(mode="json")["rounds_per_stage"] == 2


# --- what a client sees --------------------------------------------------------------------------


class Recorder(ClientHalf):
    """Records what the context offers, and trains like FedAvg (from the run's initial model)."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def fit(self, msg, ctx):
        ctx.load(ctx.init_weights)
        stats = ctx.train()
        self.calls.append(
            dict(
                stage=ctx.stage,
                train=ctx.data.train.clone(),
                eval_index=ctx.data.eval_index.clone(),
                stage_classes=ctx.data.stage_classes,
                seen_classes=ctx.data.seen_classes,
                old_classes=ctx.data.old_classes,
                samples=stats.samples,
            )
        )
        return ctx.reply()


def test_a_client_trains_on_its_current_stage_only_and_sees_its_stage_classes():
    config = staged()
    rt = runtime(config)
    rt.client = Recorder()
    _, partition = prepare(config)
    train_y = rt.workspace.dataset.train.y
    for cid in (0, 3):
        stages = partition.clients[cid].stages
        for rnd, m in ((1, 0), (2, 0), (3, 1), (6, 2)):
            rt.run(Task(cid, rnd, 0, Message("fit"), {}))
            call = rt.client.calls[-1]
            assert call["stage"] == m
            # training data: exactly stage m's samples, and ctx.train() goes over them (1 epoch)
            assert torch.equal(call["train"], torch.as_tensor(stages[m].train))
            assert call["samples"] == len(stages[m].train)
            assert set(train_y[call["train"]].tolist()) <= set(stages[m].classes.tolist())
            # the classes: current stage, all seen stages, the earlier ones
            assert call["stage_classes"].tolist() == sorted(stages[m].classes.tolist())
            seen = sorted(c for s in stages[: m + 1] for c in s.classes.tolist())
            assert call["seen_classes"].tolist() == seen
            assert call["old_classes"].tolist() == sorted(c for s in stages[:m] for c in s.classes.tolist())
            # evaluation data: the test samples of the stages 0..m, exactly
            expected = np.sort(np.concatenate([s.test for s in stages[: m + 1]]))
            assert np.array_equal(call["eval_index"].numpy(), expected)


def test_evaluation_counts_exactly_the_seen_stages_test_samples():
    config = staged()
    rt = runtime(config)
    _, partition = prepare(config)
    test_y = rt.workspace.dataset.test.y.numpy()
    for cid in range(6):
        stages = partition.clients[cid].stages
        for rnd, m in ((2, 0), (3, 1), (5, 2)):
            msg = Message("evaluate", rt.workspace.init_weights)
            reply = rt.run(Task(cid, rnd, EVAL_CALL, msg, {}, read_only=True)).reply
            seen = np.concatenate([s.test for s in stages[: m + 1]])
            assert reply.tensors["total"].tolist() == np.bincount(test_y[seen], minlength=6).tolist()
            # every seen class is tested (the local-test rule is applied per stage)
            assert set(np.flatnonzero(reply.tensors["total"].numpy())) == {
                int(c) for s in stages[: m + 1] for c in s.classes
            }


@pytest.mark.parametrize(
    "overrides, kind",
    [
        (dict(partition={"local_test": "holdout"}), "test"),
        (dict(partition={"val_fraction": 0.2}, eval_split="val"), "val"),
    ],
    ids=["holdout", "val"],
)
def test_holdout_and_validation_views_follow_the_stages(overrides, kind):
    config = staged(**overrides)
    rt = runtime(config)
    _, partition = prepare(config)
    for m, views in enumerate(rt.stage_views):
        for cid, view in enumerate(views):
            stages = partition.clients[cid].stages
            expected = np.sort(np.concatenate([getattr(s, kind) for s in stages[: m + 1]]))
            assert np.array_equal(view.eval_index.numpy(), expected)
            assert view.eval_split is rt.workspace.dataset.train  # both index the training split
            assert np.array_equal(view.train.numpy(), stages[m].train)
    rows, _ = run(config.model_copy(update={"eval_every": 3}))
    assert [r["stage"] for r in rows] == [0, 1, 1, 2]


def test_rounds_train_the_stage_sizes_and_the_server_knows_the_stage():
    config = staged()
    rows, sim = run(config)
    sizes = np.array([[len(s.train) for s in c.stages] for c in sim.partition.clients])  # clients × stages
    logs = [log for row in rows for log in row["rounds_log"]]
    for log in logs:
        m = config.stage_of(log["round"])
        assert log["samples"] == sizes[log["clients"], m].sum()  # FedAvg: one epoch each
    assert sim.server_ctx.stage == 2
    assert sim.server_ctx.client_train_sizes.tolist() == sizes[:, 2].tolist()
    assert sim.server_ctx.stage_of(3) == 1


# --- metrics -------------------------------------------------------------------------------------


def test_stage_metrics_on_a_hand_checked_case():
    # 4 clients, 4 classes, seen stages 0 and 1; client 3 has no test data
    classes = [[np.array([0]), np.array([1])], [np.array([2]), np.array([3])], [np.array([1]), np.array([0])],
               [np.array([2]), np.array([3])]]  # fmt: skip
    correct = np.array([[3, 1, 0, 0], [0, 0, 2, 0], [0, 1, 0, 0], [0, 0, 0, 0]])
    total = np.array([[4, 2, 0, 0], [0, 0, 2, 2], [3, 1, 0, 0], [0, 0, 0, 0]])
    g_correct = np.array([[4, 0, 0, 0], [0, 0, 1, 1], [3, 0, 0, 0], [0, 0, 0, 0]])
    out = stage_metrics(correct, total, classes, [0, 2], g_correct, total)
    assert out["a_local"] == pytest.approx((4 / 6 + 2 / 4 + 1 / 4) / 3)
    assert out["a_part"] == pytest.approx((4 / 6 + 1 / 4) / 2)
    assert out["a_local_by_stage"] == pytest.approx([(3 / 4 + 1 + 1) / 3, (1 / 2 + 0 + 0) / 3])
    assert out["a_global"] == pytest.approx(9 / 14)
    assert out["a_global_by_stage"] == pytest.approx([5 / 7, 4 / 7])  # c0 class 0, c1 class 2, c2 class 1; ...
    alone = stage_metrics(correct, total, classes, [3])  # no global model; a participant without data
    assert alone["a_part"] is None and alone["a_global"] is None and alone["a_global_by_stage"] is None


def test_rows_carry_the_stage_and_the_paper_metrics():
    config = staged(eval_every=3)
    rows, sim = run(config)
    # evaluated every 3 rounds and at the end of every stage
    assert [(r["round"], r["stage"]) for r in rows] == [(2, 0), (3, 1), (4, 1), (6, 2)]
    for row in rows:
        participants = row["rounds_log"][-1]["clients"]
        assert row["a_local"] == row["personalized_acc"]
        assert row["a_part"] == pytest.approx(np.mean([row["per_client_acc"][c] for c in participants]))
        # FedAvg evaluates the global model everywhere: pooled A_global = the sample-weighted accuracy
        assert row["a_global"] == pytest.approx(row["personalized_acc_weighted"])
        assert len(row["a_local_by_stage"]) == len(row["a_global_by_stage"]) == row["stage"] + 1
    summary = sim.record.summary(sim.meter, 1.0, config.rounds)
    assert summary["final"]["stage"] == 2 and summary["final"]["a_local"] == rows[-1]["a_local"]


def test_runs_without_stages_have_no_stage_keys_and_whole_client_views():
    config = tiny_config(eval_every=2)
    rows, sim = run(config)
    assert not {"stage", "a_local", "a_global", "a_part", "a_local_by_stage"} & set().union(*rows)
    summary = sim.record.summary(sim.meter, 1.0, config.rounds)
    assert "a_local" not in summary["final"] and "stage" not in summary["best"]
    rt = runtime(config)
    assert len(rt.stage_views) == 1 and rt.views is rt.stage_views[0]
    for cid, client in enumerate(sim.partition.clients):
        view = rt.views[cid]
        assert np.array_equal(view.train.numpy(), client.train) and np.array_equal(view.test.numpy(), client.test)
        assert view.stage == 0 and view.stage_classes is None and view.seen_classes is None


def test_methods_without_a_global_model_have_no_global_accuracy():
    rows, _ = run(staged(algorithm="local", eval_every=2))
    assert all(r["a_global"] is None and r["a_global_by_stage"] is None for r in rows)
    assert all(r["a_local"] == r["personalized_acc"] for r in rows)


def test_serial_and_parallel_agree_with_stages():
    assert_serial_and_parallel_agree(staged(algorithm="fedrep", rounds=3, partition={"stages": 3}, eval_every=2))


# --- the command line and the report -------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ["fedavg", "local", "fedrep"])
def test_cli_run_with_stages(tmp_path, algorithm):
    done = run_cli(tmp_path, algorithm, smoke=STAGE_SMOKE)
    assert [(r["round"], r["stage"]) for r in done.rows] == [(1, 0), (2, 0), (3, 1), (4, 1)]
    final = done.final
    assert final["stage"] == 1 and final["a_local"] == final["personalized_acc"]
    assert (final["a_global"] is None) == (algorithm != "fedavg")
    assert 0 <= final["a_part"] <= 1


def test_cli_stage_errors_are_one_line(tmp_path):
    res = invoke_run(tmp_path / "a", "fedavg", smoke=STAGE_SMOKE, flags=["--rounds", "5", "--rounds-per-stage", "2"])
    assert_fails_in_one_line(res, "--rounds-per-stage 2 × --stages 2 = 4 must equal --rounds 5")
    res = invoke_run(tmp_path / "b", "fedavg", flags=["--rounds-per-stage", "2"])
    assert_fails_in_one_line(res, "--rounds-per-stage only applies to --partition stages")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_partition_command_ignores_the_round_schedule(tmp_path):
    res = invoke("partition", "--dataset", "synthetic", "--partition", "stages", "--stages", "3",
                 "--classes-per-stage", "1", "--clients", "4", "--out", tmp_path / "p.json")  # fmt: skip
    assert res.exit_code == 0, res.output


def test_report_shows_the_stage_metrics(tmp_path):
    for algorithm in ("fedavg", "local"):
        res = invoke_run(tmp_path / "runs" / algorithm, algorithm, smoke=STAGE_SMOKE)
        assert res.exit_code == 0, res.output
        assert "A_local" in res.output
    md = tmp_path / "R.md"
    res = invoke("report", tmp_path / "runs", "--out", md)
    assert res.exit_code == 0, res.output
    text = md.read_text()
    assert "## Final-round stage-task accuracies (%)" in text
    setting = "synthetic-stages2x2-if1"
    assert f"| method | {setting} A_local | {setting} A_global | {setting} A_part |" in text
    local_row = next(line for line in text.splitlines() if line.startswith("| local |") and "—" in line)
    assert local_row.count("(1 seed)") == 2  # A_local and A_part; no A_global
